"""Seed 000's primitives: symmetric allocation, put/get, signals and the barrier.

Offsets and sizes count elements of the tensor's dtype; each may be a Python int or a one-element integer
tensor. With ``group``, ranks are ranks inside that group. Every call is enqueued on the current SHMEM stream
(on the default stream it is complete when it returns).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.symmetric_memory import _args, _autograd, _context, _groups, _rules
from hyper_parallel.core.symmetric_memory._args import Count

def empty(shape: Union[int, Sequence[int], torch.Size], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Allocates a tensor in symmetric memory (collective over WORLD: every rank, same order, same shape).

    The first call acquires the SHMEM runtime over the WORLD group (``torch.distributed`` must be initialised).
    The heap has ``HYPER_PARALLEL_SHMEM_HEAP_SIZE`` bytes per rank (alias ``SYMMETRIC_MEMORY_HEAP_SIZE``,
    default 1 GiB). The contents are uninitialised.

    Args:
        shape: the tensor's shape, an int or a sequence of ints.
        dtype: its dtype.

    Returns:
        A CPU tensor whose storage lies in the symmetric heap.

    Raises:
        TypeError, ValueError: a bad shape or dtype.
        ShmemMismatchError: ranks disagree on the allocation.
        ShmemOutOfMemoryError: the heap is full.
        ShmemStateError: torch.distributed is not initialised.
    """
    _context.state()
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    return shmem.empty(*dims, dtype=dtype)


def free(tensor: torch.Tensor) -> None:
    """Frees a tensor from :func:`empty` (collective over WORLD); its views raise on any later use.

    Args:
        tensor: the tensor :func:`empty` returned.

    Raises:
        ValueError: the tensor is not a symmetric allocation.
        ShmemMismatchError: ranks free different allocations.
    """
    shmem.free(tensor)


def shutdown() -> None:
    """Frees the API's workspace and releases its runtime reference (collective over WORLD).

    Every tensor from :func:`empty` must be freed first. A later :func:`empty` starts afresh.

    Raises:
        ShmemStateError: symmetric tensors are still allocated on some rank (nothing is released).
    """
    _context.shutdown()


def _pe(target_rank: object, group: Optional[dist.ProcessGroup]) -> int:
    pes = _context.group_pes(group)
    return pes[_args.rank_in_group(target_rank, "target_rank", len(pes))]


def _windows(target: torch.Tensor, target_offset: Count, src: torch.Tensor, src_offset: Count,
             size: Count) -> tuple:
    target, target_at, src, src_at, n = _args.CHECKS.windows(target, target_offset, src, src_offset, size)
    return target.view(-1)[target_at:target_at + n], src.view(-1)[src_at:src_at + n]


def shmem_put(target: torch.Tensor, target_offset: Count, src: torch.Tensor, src_offset: Count, size: Count,
              target_rank: int, group: Optional[dist.ProcessGroup] = None) -> None:
    """Writes ``src[src_offset : +size]`` into ``target[target_offset : +size]`` on ``target_rank`` (push).

    Args:
        target: a symmetric tensor; its copy on ``target_rank`` is written.
        target_offset: first element of ``target`` written.
        src: any contiguous CPU tensor of ``target``'s dtype.
        src_offset: first element of ``src`` read.
        size: number of elements.
        target_rank: the destination, a rank of ``group``.
        group: a ProcessGroup inside the root (None: WORLD).

    Raises:
        TypeError: wrong types or differing dtypes.
        ValueError: ranges past a tensor's end, a rank outside the group, ``target`` not symmetric.
    """
    dst, source = _windows(target, target_offset, src, src_offset, size)
    rank = _args.integer(target_rank, "target_rank")
    _autograd.call("put_", _put_op, (), dst, source, rank, _groups.name(group))


def shmem_get(target: torch.Tensor, target_offset: Count, src: torch.Tensor, src_offset: Count, size: Count,
              target_rank: int, group: Optional[dist.ProcessGroup] = None) -> None:
    """Reads ``src[src_offset : +size]`` as it is on ``target_rank`` into the local ``target`` (pull).

    The parameters are those of :func:`shmem_put`; the data flows the other way: from ``target_rank``'s copy
    of the symmetric ``src`` into the local ``target``.

    Args:
        target: any contiguous CPU tensor, written locally.
        target_offset: first element of ``target`` written.
        src: a symmetric tensor; its copy on ``target_rank`` is read.
        src_offset: first element of ``src`` read.
        size: number of elements.
        target_rank: the rank read from, a rank of ``group``.
        group: a ProcessGroup inside the root (None: WORLD).

    Raises:
        TypeError, ValueError: as :func:`shmem_put`, with ``src`` the symmetric side.
    """
    dst, source = _windows(target, target_offset, src, src_offset, size)
    rank = _args.integer(target_rank, "target_rank")
    _autograd.call("get_", _get_op, (), dst, source, rank, _groups.name(group))


def _require_symmetric(t: torch.Tensor, name: str) -> None:
    if not _context.is_symmetric(t):
        raise ValueError(f"`{name}` must be a symmetric tensor from symm.empty, but got an ordinary tensor at "
                         f"{t.data_ptr():#x}")


def _signal_element(signal: torch.Tensor, signal_offset: Count) -> torch.Tensor:
    """The element ``signal[signal_offset]`` of an int32/int64 tensor (the operators check that it is symmetric)."""
    signal, offset = _args.CHECKS.signal(signal, signal_offset)
    return signal.view(-1)[offset:offset + 1]


def shmem_signal_op(signal: torch.Tensor, signal_offset: Count, signal_value: Count, signal_op: int,
                    target_rank: int, group: Optional[dist.ProcessGroup] = None) -> None:
    """Atomically SETs or ADDs ``signal_value`` to ``signal[signal_offset]`` on ``target_rank``.

    Everything this rank enqueued before the call is visible on ``target_rank`` before the new signal value.

    Args:
        signal: a symmetric int32 or int64 tensor.
        signal_offset: the element updated.
        signal_value: the value (int or one-element tensor); it must fit the signal's dtype.
        signal_op: 0 = SET, 1 = ADD.
        target_rank: a rank of ``group``.
        group: a ProcessGroup inside the root (None: WORLD).

    Raises:
        TypeError, ValueError: a bad argument; nothing is written.
    """
    element = _signal_element(signal, signal_offset)
    op = _rules.choice(signal_op, "signal_op", _rules.SIGNAL_OPS)
    value = _args.integer(signal_value, "signal_value")
    rank = _args.integer(target_rank, "target_rank")
    _autograd.call("signal_", _signal_op, (), element, value, op, rank, _groups.name(group))


def shmem_wait_for_signal(depend_tensor: Optional[torch.Tensor], signal: torch.Tensor, signal_offset: Count,
                          compare_value: Count, compare_op: int) -> None:
    """Waits until the local ``signal[signal_offset]`` compares true against ``compare_value``.

    Spins briefly, then sleeps in the kernel; gives up after ``HYPER_PARALLEL_SHMEM_TIMEOUT_SEC``.

    Args:
        depend_tensor: the data the signal guards (orders graph-mode frameworks; unused on the host device).
        signal: a symmetric int32 or int64 tensor.
        signal_offset: the element waited on.
        compare_value: the value compared with (int or one-element tensor).
        compare_op: 0 = EQ, 1 = GT, 2 = LT, 3 = NE, 4 = GE, 5 = LE (signal ``op`` value).

    Raises:
        TypeError, ValueError: a bad argument.
        ShmemTimeoutError: the condition did not hold in time (the message has the observed value).
    """
    _args.CHECKS.optional_tensor(depend_tensor, "depend_tensor")
    element = _signal_element(signal, signal_offset)
    cmp = _rules.choice(compare_op, "compare_op", _rules.COMPARE_OPS)
    value = _args.integer(compare_value, "compare_value")
    _autograd.call("wait_for_signal", _wait_for_signal_op, (), depend_tensor, element, value, cmp)


def shmem_put_with_signal(target: torch.Tensor, target_offset: Count, src: torch.Tensor, src_offset: Count,
                          size: Count, signal: torch.Tensor, signal_offset: Count, signal_value: Count,
                          signal_op: int, target_rank: int, group: Optional[dist.ProcessGroup] = None) -> None:
    """:func:`shmem_put`, then :func:`shmem_signal_op` on the same rank: the data is visible before the signal.

    Args:
        target, target_offset, src, src_offset, size: as :func:`shmem_put`.
        signal, signal_offset, signal_value, signal_op: as :func:`shmem_signal_op`.
        target_rank: a rank of ``group``.
        group: a ProcessGroup inside the root (None: WORLD).

    Raises:
        TypeError, ValueError: a bad argument; every argument is checked before anything is written.
    """
    dst, source = _windows(target, target_offset, src, src_offset, size)
    element = _signal_element(signal, signal_offset)
    op = _rules.choice(signal_op, "signal_op", _rules.SIGNAL_OPS)
    value = _args.integer(signal_value, "signal_value")
    rank = _args.integer(target_rank, "target_rank")
    _autograd.call("put_with_signal_", _put_with_signal_op, (), dst, source, element, value, op, rank,
                   _groups.name(group))


def barrier(group: Optional[dist.ProcessGroup] = None) -> None:
    """Waits until every rank of ``group`` arrives; writes before it are then visible to all of them.

    Args:
        group: a ProcessGroup inside the root (None: WORLD). The first collective on a group registers it
            (collective over the group).

    Raises:
        ShmemTimeoutError: a rank did not arrive within ``HYPER_PARALLEL_SHMEM_TIMEOUT_SEC``.
    """
    _autograd.call("barrier", _barrier_op, (), _groups.name(group))


# --------------------------------------------------------------------------
# The operators' implementations (:mod:`~hyper_parallel.core.symmetric_memory._ops`): the checks that need the
# runtime or the tensors' addresses, then the runtime's calls. The public functions cut the windows.
# --------------------------------------------------------------------------


def _put_op(target: torch.Tensor, src: torch.Tensor, target_rank: int, group_name: str) -> None:
    _require_symmetric(target, "target")
    shmem.put(target, src, _pe(target_rank, _groups.resolve(group_name)))


def _get_op(target: torch.Tensor, src: torch.Tensor, target_rank: int, group_name: str) -> None:
    _require_symmetric(src, "src")
    shmem.get(target, src, _pe(target_rank, _groups.resolve(group_name)))


def _signal_op(signal: torch.Tensor, value: int, op: str, target_rank: int, group_name: str) -> None:
    _require_symmetric(signal, "signal")
    shmem.signal(signal, value, _pe(target_rank, _groups.resolve(group_name)), op=op)


def _put_with_signal_op(target: torch.Tensor, src: torch.Tensor, signal: torch.Tensor, value: int, op: str,
                        target_rank: int, group_name: str) -> None:
    _require_symmetric(target, "target")
    _require_symmetric(signal, "signal")
    pe = _pe(target_rank, _groups.resolve(group_name))  # every check before anything is written
    shmem.put(target, src, pe)
    shmem.signal(signal, value, pe, op=op)


def _wait_for_signal_op(depend_tensor: Optional[torch.Tensor], signal: torch.Tensor, compare_value: int,
                        compare_op: str) -> None:
    _require_symmetric(signal, "signal")
    shmem.wait_signal(signal, compare_value, cmp=compare_op)


def _barrier_op(group_name: str) -> None:
    _context.channel(_groups.resolve(group_name)).sync()
