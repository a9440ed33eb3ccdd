"""What the system tests of the user API (``hyper_parallel.core.symmetric_memory``) share, in the ranks.

* :func:`symm_session` lines the ranks up, hands out a ``symm.empty`` that remembers what to free, and leaves
  the runtime uninitialised;
* :func:`rank_input` builds a rank's deterministic input, which every rank can rebuild for any other rank;
* :func:`gathered` gathers a tensor from every rank of a group over gloo (the independent reference path).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Optional

import torch
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.core.multicore import shmem

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64]


@contextlib.contextmanager
def symm_session() -> Iterator[Callable[..., torch.Tensor]]:
    """Yields ``empty(shape, dtype)`` (``symm.empty``, remembered; ``empty.free(t)`` frees one early); at the end
    frees the rest and shuts the API down.

    After a failure on any rank the clean-up is skipped on every rank; the harness then replaces the world.
    """
    dist.barrier()
    allocations = []

    def empty(shape: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        tensor = symm.empty(shape, dtype)
        allocations.append(tensor)
        return tensor

    def free(tensor: torch.Tensor) -> None:
        allocations[:] = [t for t in allocations if t is not tensor]  # by identity: == on tensors is elementwise
        symm.free(tensor)

    empty.free = free  # type: ignore[attr-defined]
    failed = torch.ones(1, dtype=torch.int32)
    try:
        yield empty
        failed.zero_()
    finally:
        dist.all_reduce(failed)
        if failed.item() == 0:
            for tensor in allocations:
                symm.free(tensor)
            symm.shutdown()
            state = shmem.debug_state()
            assert state["state"] == "uninitialized" and not state["active_allocations"], state


def rank_input(rank: int, numel: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input: random values that are exact in ``dtype`` (small integers for floats, so that
    sums of a few ranks are exact too, and fractional values where exactness does not matter)."""
    generator = torch.Generator().manual_seed(1009 * rank + 17 * numel + salt)
    if dtype.is_floating_point:
        return (torch.randint(-64, 64, (numel,), generator=generator).to(torch.float64) / 8).to(dtype)
    return torch.randint(-1000, 1000, (numel,), generator=generator).to(dtype)


def gathered(t: torch.Tensor, group: Optional[dist.ProcessGroup] = None) -> list:
    """Every group rank's copy of ``t``, over gloo."""
    out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, t.contiguous(), group=group)
    return out
