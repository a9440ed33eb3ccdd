"""torch's calls of upstream hyper-parallel's setup calls (:class:`._api.Api`): ``is_shmem_available`` and
``rendezvous``.

Upstream's torch platform answers ``is_shmem_available()`` by trying to load its native adapter and raises
NotImplementedError from the other three ("not needed in CANN SHMEM"). Here ``rendezvous`` works: it checks,
collectively over the group, that every rank passes the same symmetric tensor, and returns a handle over every
rank's copy (torch's ``_SymmetricMemory`` in small: ``rank``, ``world_size``, ``buffer_ptrs``, ``get_buffer``,
``barrier``). Signal pads stay as upstream has them: this library allocates signals like any symmetric tensor.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.symmetric_memory import _context, _rules
from hyper_parallel.core.symmetric_memory._api import SymmetricMemory
from hyper_parallel.core.symmetric_memory._checks import Checks


def available() -> bool:
    """Whether the binding loaded and the configured device is built into it (never raises, starts nothing; a
    malformed ``HYPER_PARALLEL_SHMEM_*`` variable answers False, and the first allocation raises the error naming
    it)."""
    return shmem.device_available()


def rendezvous(t: torch.Tensor, group: Optional[dist.ProcessGroup], checks: Checks) -> SymmetricMemory:
    """``rendezvous`` of a checked tensor: every rank of ``group`` compares the tensor's heap offset and byte count
    through symmetric memory (collective over the group); the handle views each rank's copy through a peer tensor
    (it dies with the allocation).

    Raises:
        ValueError: not symmetric, or not the same allocation range on every rank.
        ShmemStateError: symmetric memory is not initialised (no ``symm.empty`` yet).
    """
    if _context.active() is None:
        raise shmem.ShmemStateError(
            "symmetric memory is not initialised: op=rendezvous (call symm.empty() on every rank first)"
        )
    ch = _context.channel(group)
    mine = [_context.heap_offset(t), t.numel() * t.element_size()]
    rows = ch.publish(ch.flip(), mine)
    mismatch = _rules.rendezvous_mismatch(rows)
    if mismatch is not None:
        raise ValueError(mismatch)
    flat = t.reshape(-1).view(torch.uint8)
    copies = [shmem.peer_tensor(flat, pe) for pe in ch.pes]

    def view(rank: int, begin: int, end: int, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        return copies[rank][begin:end].view(dtype).view(shape)

    return SymmetricMemory(checks, ch.me, [c.data_ptr() for c in copies], flat.numel(), view,
                           lambda: _context.channel(group).sync())
