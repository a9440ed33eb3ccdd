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
from hyper_parallel.core.symmetric_memory import _args, _context, _rules


def available() -> bool:
    """Whether the binding loaded and the configured device is built into it (never raises, starts nothing; a
    malformed ``HYPER_PARALLEL_SHMEM_*`` variable answers False, and the first allocation raises the error naming
    it)."""
    return shmem.device_available()


class SymmetricMemory:
    """What :func:`rendezvous` returns: the group's view of one symmetric tensor.

    Attributes:
        rank: this process's rank inside the group.
        world_size: the group's size.
        buffer_size: the tensor's bytes (the same on every rank).
        buffer_ptrs: the address, in this process, of every group rank's copy (index = group rank).
    """

    def __init__(self, tensor: torch.Tensor, ch: _context.GroupChannel, group: Optional[dist.ProcessGroup]) -> None:
        self._flat = tensor.reshape(-1).view(torch.uint8)
        self._copies = [shmem.peer_tensor(self._flat, pe) for pe in ch.pes]
        self._group = group
        self.rank = ch.me
        self.world_size = ch.size
        self.buffer_size = self._flat.numel()
        self.buffer_ptrs = [copy.data_ptr() for copy in self._copies]

    def get_buffer(self, rank: int, sizes, dtype: torch.dtype, storage_offset: int = 0) -> torch.Tensor:
        """Group rank ``rank``'s copy of the tensor as a tensor of ``sizes`` and ``dtype`` (torch's signature).

        Reads and writes go to that rank's memory in place; order them with signals or :meth:`barrier`.

        Args:
            rank: a rank inside the group.
            sizes: the shape of the view.
            dtype: its element type.
            storage_offset: where it starts, in elements of ``dtype``.

        Returns:
            The view. It dies with the allocation (after ``symm.free``, any use raises).

        Raises:
            TypeError: ``dtype`` is not a torch.dtype, or ``rank``/``storage_offset`` not an int.
            ValueError: ``rank`` outside the group, a negative offset, or a view past the tensor's end.
        """
        rank = _args.rank_in_group(rank, "rank", self.world_size)
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"`dtype` must be a torch.dtype, but got {type(dtype).__name__}")
        offset = _args.count(storage_offset, "storage_offset")
        shape = torch.Size(sizes if isinstance(sizes, (tuple, list, torch.Size)) else (sizes,))
        begin, end = _rules.view_bytes(offset, shape.numel(), dtype.itemsize, self.buffer_size)
        return self._copies[rank][begin:end].view(dtype).view(shape)

    def barrier(self) -> None:
        """A barrier of the group (``symm.barrier(group)``): writes before it are visible to every rank after it.

        Raises:
            ShmemTimeoutError: a rank did not arrive in time.
        """
        _context.channel(self._group).sync()

    def __repr__(self) -> str:
        return f"SymmetricMemory(rank={self.rank}, world_size={self.world_size}, buffer_size={self.buffer_size})"


def rendezvous(t: torch.Tensor, group: Optional[dist.ProcessGroup] = None) -> SymmetricMemory:
    """``rendezvous`` of a checked tensor: every rank of ``group`` compares the tensor's heap offset and byte count
    through symmetric memory (collective over the group).

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
    return SymmetricMemory(t, ch, group)
