"""Upstream hyper-parallel's setup calls of the user API: ``is_shmem_available``, ``rendezvous`` and signal pads.

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

_SIGNAL_PADS = ("signal pads are not part of this library: a signal is a symmetric tensor like any other "
                "(symm.empty(n, dtype=torch.int32), raised with shmem_signal_op and waited for with "
                "shmem_wait_for_signal)")


def is_shmem_available() -> bool:
    """Whether symmetric memory can run here: the binding loaded and the configured device is built into it.

    Never raises and starts nothing. ``HYPER_PARALLEL_SHMEM_DEVICE`` names the device (``host`` by default, built
    into every wheel; ``ascend`` only in a build against CANN). A malformed ``HYPER_PARALLEL_SHMEM_*`` variable
    answers False (the first allocation raises the error naming it).

    Returns:
        True when the first ``symm.empty`` can start the runtime, as far as this process can tell alone.
    """
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


def rendezvous(tensor: torch.Tensor, group: Optional[dist.ProcessGroup] = None) -> SymmetricMemory:
    """Establishes a symmetric tensor among the ranks of ``group`` (collective over the group).

    Every rank passes its copy of the same ``symm.empty`` tensor (or the same view of it): the ranks compare the
    tensor's heap offset and byte count through symmetric memory, and all of them raise alike when they differ.

    Args:
        tensor: a tensor from ``symm.empty`` (or a contiguous view of one), the same on every rank.
        group: a ProcessGroup inside the root (None: WORLD). Its first collective registers it.

    Returns:
        A :class:`SymmetricMemory` over every rank's copy.

    Raises:
        TypeError: ``tensor`` is not a tensor.
        ValueError: ``tensor`` is not symmetric, not contiguous, or not the same allocation range on every rank.
        ShmemStateError: symmetric memory is not initialised (no ``symm.empty`` yet).
        ShmemTimeoutError: a rank did not take part in time.
    """
    t = _args.tensor(tensor, "tensor")
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


def set_signal_pad_size(size: int) -> None:
    """Upstream's call, with upstream's behaviour: there are no signal pads to size.

    Args:
        size: the pad size upstream would set.

    Raises:
        NotImplementedError: always; the message says how signals are made here.
    """
    raise NotImplementedError(f"set_signal_pad_size is not supported: size={size!r} ({_SIGNAL_PADS})")


def get_signal_pad_size() -> int:
    """Upstream's call, with upstream's behaviour: there are no signal pads to size.

    Raises:
        NotImplementedError: always; the message says how signals are made here.
    """
    raise NotImplementedError(f"get_signal_pad_size is not supported ({_SIGNAL_PADS})")
