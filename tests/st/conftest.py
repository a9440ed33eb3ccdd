"""Fixtures for the multi-process system tests.

Test modules in this directory are imported by pytest's default "prepend"
import mode, which puts this directory on ``sys.path``; multiprocessing
forwards ``sys.path`` to the ranks, so case functions defined in a test module
(and :mod:`harness`) resolve there by reference.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator

import pytest

# Keep `harness` and the test modules importable (here and in the ranks)
# even if pytest is run with another import mode or from another directory.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from harness import World  # noqa: E402

WorldFactory = Callable[..., World]

# Modules whose subject is the runtime's behaviour between processes, which no torch release changes: the agreement
# protocol, failures, lifecycle and shared-memory segments, the simulated nodes, the perf tool and the harness itself.
# They are marked `one_torch`: `make test` runs them on its first torch (test-py) and leaves them out of the second
# (test-torch214), which runs everything that reaches torch's interfaces (the binding, the symmetric-memory backend,
# the operators, autograd, torch.compile) again.
ONE_TORCH_MODULES = frozenset({
    "test_agreement", "test_harness", "test_host_heap", "test_host_segments", "test_lifecycle", "test_mismatch",
    "test_multinode", "test_perf", "test_reliability", "test_simulated_nodes",
})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "one_torch: the subject does not depend on torch's version (run on one torch)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and module.__name__ in ONE_TORCH_MODULES:
            item.add_marker(pytest.mark.one_torch)


@pytest.fixture(scope="module")
def world_factory() -> Iterator[WorldFactory]:
    """Hand out one cached :class:`World` per ``(nranks, env)`` for the module.

    Returns:
        ``get_world(nranks, env=None) -> World``. A world that died (a case
        timed out or killed a rank) is replaced by a fresh one on the next
        request. All worlds are closed when the module's tests are done.
    """
    worlds: dict[tuple[int, tuple[tuple[str, str], ...]], World] = {}

    def get_world(nranks: int, env: dict[str, str] | None = None) -> World:
        """Return the module's live world for ``(nranks, env)``, spawning it if needed.

        Args:
            nranks: Number of ranks.
            env: Environment variables applied in the ranks before torch is imported.

        Returns:
            A live :class:`World`.

        Raises:
            harness.WorldStartError: The ranks could not be started.
        """
        key = (nranks, tuple(sorted((env or {}).items())))
        world = worlds.get(key)
        if world is not None and not world.alive:
            world.close()
            world = None
        if world is None:
            world = World(nranks, env=env)
            worlds[key] = world
        return world

    yield get_world
    for world in worlds.values():
        world.close()
