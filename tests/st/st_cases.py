"""Helpers shared by the SHMEM system tests: running a case in a world, and what the cases use in the ranks.

In the test process:

* :func:`run_case` runs a case in a :class:`harness.World` and closes the world when the case fails.

In the ranks (this module is imported there through the test modules, which import it from ``tests/st`` on
``sys.path``):

* :func:`session` acquires the runtime for a case and leaves it clean;
* :func:`assert_clean` checks that no runtime is left over from an earlier case;
* :func:`expect_error` checks the type and message of an exception;
* :func:`allocation_info` finds a tensor's active allocation in ``debug_state()``;
* :func:`restored_env` puts an environment variable back once a case has changed it.

Unlike :mod:`harness`, which knows nothing of SHMEM, this module imports torch and ``shmem`` at module level:
import it only from test modules, never from the harness.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from harness import World
from hyper_parallel.core.multicore import shmem

__all__ = ["allocation_info", "assert_clean", "expect_error", "restored_env", "run_case", "session"]


# --------------------------------------------------------------------------
# In the test process.
# --------------------------------------------------------------------------


def run_case(world: World, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
    """``world.run``, but any failure of the case takes its world down, so that the next test gets fresh ranks.

    Args:
        world: The world to run the case in.
        fn: The case; a module-level function of an importable module.
        *args: Positional arguments for ``fn``.
        **kwargs: Keyword arguments for ``fn`` and :meth:`World.run` (``timeout``, ``capture_stderr``).

    Returns:
        What :meth:`World.run` returns: one value (or :class:`harness.CaseOutput`) per rank, in rank order.

    Raises:
        BaseException: Whatever :meth:`World.run` raised, after the world was closed.
    """
    try:
        return world.run(fn, *args, **kwargs)
    except BaseException:
        world.close()
        raise


# --------------------------------------------------------------------------
# In the ranks.
# --------------------------------------------------------------------------


@contextlib.contextmanager
def session(zero: bool = False) -> Iterator[Callable[..., torch.Tensor]]:
    """Acquires the runtime, hands out an ``empty`` that remembers what to free, and leaves the runtime clean.

    The ranks are lined up with a gloo barrier first: init is collective and some worlds have a short SHMEM
    timeout. After a failure on any rank the SHMEM clean-up is skipped on every rank (its collectives would only
    fail in turn); the parent then throws the world away (:func:`run_case`).

    Args:
        zero: Whether ``empty`` zeroes each tensor it hands out.

    Yields:
        ``empty(*size, **kwargs)``: :func:`shmem.empty`, remembering the tensor (zeroed if ``zero``).
    """
    dist.barrier()
    handle = shmem.acquire_shmem()
    allocations = []

    def empty(*size: Any, **kwargs: Any) -> torch.Tensor:
        tensor = shmem.empty(*size, **kwargs)
        if zero:
            tensor.zero_()
        allocations.append(tensor)
        return tensor

    failed = torch.ones(1, dtype=torch.int32)
    try:
        yield empty
        failed.zero_()
    finally:
        dist.all_reduce(failed)  # also: every rank is done with every copy before anything is freed
        if failed.item() == 0:
            try:
                for tensor in allocations:
                    shmem.free(tensor)
            finally:
                handle.close()
            state = shmem.debug_state()
            assert state["state"] == "uninitialized" and not state["active_allocations"], state


def assert_clean() -> None:
    """Every case starts without a runtime, so that a leftover of an earlier case shows up here and not later."""
    state = shmem.debug_state()
    assert state["state"] == "uninitialized" and state["reference_count"] == 0, repr(state)


def expect_error(exc: type[BaseException], fn: Callable[[], Any], *needles: str) -> str:
    """Runs ``fn``, which must raise ``exc`` with every needle in its message; returns the message."""
    with pytest.raises(exc) as info:
        fn()
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"{needle!r} not in {type(info.value).__name__}: {message!r}"
    return message


def allocation_info(tensor: torch.Tensor) -> dict:
    """The active allocation that starts at ``tensor``'s data, from ``debug_state()``."""
    base = tensor.data_ptr()
    found = [a for a in shmem.debug_state()["active_allocations"] if a["base"] == base]
    assert len(found) == 1, f"no single active allocation at {hex(base)}: {shmem.debug_state()!r}"
    return found[0]


@contextlib.contextmanager
def restored_env(name: str) -> Iterator[None]:
    """Puts environment variable ``name`` back as it was (set or unset) when the block is left."""
    saved = os.environ.get(name)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
