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
