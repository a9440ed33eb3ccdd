"""The user API on torch: the shared :class:`._api.Api` over torch's tensor facts and torch's calls.

torch's calls are the functions of :mod:`._primitives`, :mod:`._collectives`, :mod:`._fused` and :mod:`._setup`:
they run the operators of :mod:`._ops` (torch.compile, autograd, streams) over the C++ binding
``hyper_parallel._shmem_torch`` (tensors from allocations, storage invalidation on free). Groups are
``torch.distributed`` ProcessGroups, passed to the operators by name (:mod:`._groups`).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.symmetric_memory import _rules
from hyper_parallel.core.symmetric_memory._api import Api, SymmetricMemory
from hyper_parallel.core.symmetric_memory._checks import Checks
from hyper_parallel.platform.torch import collectives as _collectives, context as _context, fused as _fused
from hyper_parallel.platform.torch import groups as _groups, primitives as _primitives
from hyper_parallel.platform.torch import tensors as torch_tensors


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


def _group_size(group_name: str) -> int:
    return _groups.size(_groups.resolve(group_name))


class TorchCalls:
    """torch's calls into the runtime, as :class:`._api.Api` takes them (its module docstring lists them)."""

    fast = _collectives.Fast

    group_key = staticmethod(_groups.name)
    group_size = staticmethod(_group_size)

    empty = staticmethod(_primitives.empty)
    free = staticmethod(_primitives.free)
    shutdown = staticmethod(_primitives.shutdown)
    put = staticmethod(_primitives.put)
    get = staticmethod(_primitives.get)
    signal = staticmethod(_primitives.signal)
    wait_signal = staticmethod(_primitives.wait_signal)
    put_with_signal = staticmethod(_primitives.put_with_signal)
    barrier = staticmethod(_primitives.barrier)

    wire = staticmethod(_collectives.wire)
    all_gather = staticmethod(_collectives.all_gather)
    all_reduce = staticmethod(_collectives.all_reduce)
    reduce_scatter = staticmethod(_collectives.reduce_scatter)
    all_to_all = staticmethod(_collectives.all_to_all)
    send = staticmethod(_collectives.send)
    recv = staticmethod(_collectives.recv)

    all_gather_matmul = staticmethod(_fused.all_gather_matmul)
    matmul_reduce_scatter = staticmethod(_fused.matmul_reduce_scatter)

    available = staticmethod(available)
    rendezvous = staticmethod(rendezvous)


API = Api(torch_tensors, TorchCalls)
