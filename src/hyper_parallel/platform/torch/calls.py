"""torch's calls into the runtime, as the user API hands them its checked arguments
(:class:`hyper_parallel.core.symmetric_memory.protocol.Calls`).

They are the functions of :mod:`.primitives`, :mod:`.collectives` and :mod:`.fused` and the setup calls below:
eager calls go straight to the runtime face :mod:`hyper_parallel.core.multicore.shmem` (its teams, over the C++
binding ``hyper_parallel._shmem_torch``: tensors from allocations, storage invalidation on free); the others through
the operators of :mod:`.ops` (torch.compile, autograd, streams). Groups are ``torch.distributed`` ProcessGroups:
the key is the group itself (:mod:`.groups`).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.multicore.errors import ShmemStateError, ShmemValueError
from hyper_parallel.core.symmetric_memory import checks
from hyper_parallel.platform.torch import collectives, context, fused, groups, low_precision, primitives


def available() -> bool:
    """Whether the binding loaded and the configured device is built into it (never raises, starts nothing; a
    malformed ``HYPER_PARALLEL_SHMEM_*`` variable answers False, and the first allocation raises the error naming
    it)."""
    return shmem.device_available()


def rendezvous(t: torch.Tensor, group: Optional[dist.ProcessGroup]) -> tuple:
    """``rendezvous`` of a checked tensor: every rank of ``group`` compares the tensor's heap offset and byte count
    through symmetric memory (collective over the group).

    Returns:
        ``(rank, buffer_ptrs, buffer_size, view, barrier)`` of the user API's ``SymmetricMemory``: ``view`` views a
        rank's copy through a peer tensor (it dies with the allocation).

    Raises:
        ShmemValueError: not symmetric, or not the same allocation range on every rank.
        ShmemStateError: symmetric memory is not initialised (no ``symm.empty`` yet).
    """
    if context.active() is None:
        raise ShmemStateError(
            "symmetric memory is not initialised: op=rendezvous (call symm.empty() on every rank first)"
        )
    team = context.team(group)
    try:
        offset = context.heap_offset(t)
    except ShmemStateError as error:   # a freed tensor: refused on every rank
        team.refuse("barrier", error)
    rows = team.agree("barrier", [offset, t.numel() * t.element_size()])
    mismatch = checks.rendezvous_mismatch(rows)
    if mismatch is not None:
        raise ShmemValueError(mismatch)
    flat = t.reshape(-1).view(torch.uint8)
    copies = [shmem.peer_tensor(flat, pe) for pe in team.pes]

    def view(rank: int, begin: int, end: int, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        return copies[rank][begin:end].view(dtype).view(shape)

    return team.rank, [c.data_ptr() for c in copies], flat.numel(), view, team.barrier


class TorchCalls:
    """torch's calls into the runtime (the protocol's :class:`~hyper_parallel.core.symmetric_memory.protocol.Calls`
    lists what each takes)."""

    group_key = staticmethod(groups.key)
    group_size = staticmethod(collectives.group_size)
    refuse = staticmethod(collectives.refuse)

    empty = staticmethod(primitives.empty)
    free = staticmethod(primitives.free)
    shutdown = staticmethod(primitives.shutdown)
    put = staticmethod(primitives.put)
    get = staticmethod(primitives.get)
    signal = staticmethod(primitives.signal)
    wait_signal = staticmethod(primitives.wait_signal)
    put_with_signal = staticmethod(primitives.put_with_signal)
    barrier = staticmethod(primitives.barrier)

    wire = staticmethod(low_precision.wire)
    all_gather = staticmethod(collectives.all_gather)
    all_reduce = staticmethod(collectives.all_reduce)
    reduce_scatter = staticmethod(collectives.reduce_scatter)
    all_to_all = staticmethod(collectives.all_to_all)
    moe = staticmethod(collectives.moe)
    send = staticmethod(collectives.send)
    recv = staticmethod(collectives.recv)

    all_gather_into = staticmethod(collectives.all_gather_into)
    reduce_scatter_into = staticmethod(collectives.reduce_scatter_into)
    all_reduce_into = staticmethod(collectives.all_reduce_into)
    all_to_all_into = staticmethod(collectives.all_to_all_into)
    moe_into = staticmethod(collectives.moe_into)

    all_gather_matmul = staticmethod(fused.all_gather_matmul)
    matmul_reduce_scatter = staticmethod(fused.matmul_reduce_scatter)

    available = staticmethod(available)
    rendezvous = staticmethod(rendezvous)
    debug_state = staticmethod(shmem.debug_state)
