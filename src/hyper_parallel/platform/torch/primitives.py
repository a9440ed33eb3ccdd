"""torch's calls of the primitives (the user API checked the arguments first): symmetric allocation, put/get,
signals and the barrier.

An eager call goes from here straight to the runtime face; a traced one (torch.compile, a dispatch mode) through
its operator (:mod:`.ops`), whose implementation below (``_*_op``) finds the group by name. Both check what needs
the runtime or the tensors' addresses (symmetric or not, the rank against the group) before anything is written.

Every call is enqueued on the current SHMEM stream (on the default stream it is complete when it returns).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.symmetric_memory import checks
from hyper_parallel.platform.torch import context, groups

_is_compiling = torch.compiler.is_compiling
_plain_eager = shmem.plain_eager


def _ops():
    return torch.ops.hyper_parallel_shmem


def _direct() -> bool:
    """Whether a call may run its implementation without the dispatcher: eager, no dispatch mode (such as a
    fake-tensor mode) and no torch.func transform."""
    return not _is_compiling() and _plain_eager()


def empty(dims: tuple, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A CPU tensor of checked ``dims`` in the symmetric heap (collective over WORLD); the first call acquires the
    runtime over WORLD.

    Raises:
        TypeError: a bad dtype.
        ShmemStateError: torch.distributed is not initialised.
    """
    context.state()
    return shmem.empty(*dims, dtype=torch.float32 if dtype is None else dtype)


def free(tensor: torch.Tensor) -> None:
    """Frees a tensor from :func:`empty` (collective over WORLD); its views raise on any later use."""
    shmem.free(tensor)


def shutdown() -> None:
    """Frees the handler's teams and releases its runtime reference (collective over WORLD)."""
    context.shutdown()


def _flat(t: torch.Tensor, at: int, n: int) -> torch.Tensor:
    """Elements ``[at, at + n)`` of a contiguous tensor, as a 1-D view (what the operators take)."""
    return t.view(-1)[at:at + n]


def _window(t: torch.Tensor, at: int, n: int) -> torch.Tensor:
    """Elements ``[at, at + n)`` of a contiguous tensor as the runtime face takes them (it reads their address and
    byte count): the tensor itself when they are all of it, else one view where the tensor is 1-D (each view built
    is the costliest step of a small eager call)."""
    if at == 0 and n == t.numel():
        return t
    return t[at:at + n] if t.dim() == 1 else t.view(-1)[at:at + n]


def put(target: torch.Tensor, target_at: int, src: torch.Tensor, src_at: int, n: int, rank: int,
        group: Optional[dist.ProcessGroup]) -> None:
    """``shmem_put`` on checked windows."""
    if _direct():
        _put(_window(target, target_at, n), _window(src, src_at, n), rank, group)
    else:
        _ops().put_(_flat(target, target_at, n), _flat(src, src_at, n), rank, groups.name(group))


def get(target: torch.Tensor, target_at: int, src: torch.Tensor, src_at: int, n: int, rank: int,
        group: Optional[dist.ProcessGroup]) -> None:
    """``shmem_get`` on checked windows."""
    if _direct():
        _get(_window(target, target_at, n), _window(src, src_at, n), rank, group)
    else:
        _ops().get_(_flat(target, target_at, n), _flat(src, src_at, n), rank, groups.name(group))


def signal(signal: torch.Tensor, offset: int, value: int, op: str, rank: int,
           group: Optional[dist.ProcessGroup]) -> None:
    """``shmem_signal_op`` on a checked element."""
    if _direct():
        _signal(_window(signal, offset, 1), value, op, rank, group)
    else:
        _ops().signal_(_flat(signal, offset, 1), value, op, rank, groups.name(group))


def wait_signal(depend_tensor: Optional[torch.Tensor], signal: torch.Tensor, offset: int, value: int,
                cmp: str) -> None:
    """``shmem_wait_for_signal`` on a checked element."""
    if _direct():
        _wait_for_signal_op(depend_tensor, _window(signal, offset, 1), value, cmp)
    else:
        _ops().wait_for_signal(depend_tensor, _flat(signal, offset, 1), value, cmp)


def put_with_signal(target: torch.Tensor, target_at: int, src: torch.Tensor, src_at: int, n: int,
                    signal: torch.Tensor, offset: int, value: int, op: str, rank: int,
                    group: Optional[dist.ProcessGroup]) -> None:
    """``shmem_put_with_signal`` on checked windows."""
    if _direct():
        _put_with_signal(_window(target, target_at, n), _window(src, src_at, n), _window(signal, offset, 1), value,
                         op, rank, group)
    else:
        _ops().put_with_signal_(_flat(target, target_at, n), _flat(src, src_at, n), _flat(signal, offset, 1), value,
                                op, rank, groups.name(group))


def barrier(group: Optional[dist.ProcessGroup]) -> None:
    """``barrier`` of a group (making its team on its first collective)."""
    if _direct():
        context.team(group).barrier()
    else:
        _ops().barrier(groups.name(group))


# --------------------------------------------------------------------------
# The checks that need the runtime or the tensors' addresses, then the runtime's calls; and the operators'
# implementations (:mod:`.ops`), which find the group by name.
# --------------------------------------------------------------------------


def _pe(target_rank: int, group: Optional[dist.ProcessGroup]) -> int:
    pes = context.group_pes(group)
    return pes[checks.rank_in_group(target_rank, "target_rank", len(pes))]


def _require_symmetric(t: torch.Tensor, name: str) -> None:
    address = context.address(t, name)
    checks.require_symmetric(context.in_heap(address), name, address)


def _put(target: torch.Tensor, src: torch.Tensor, rank: int, group: Optional[dist.ProcessGroup]) -> None:
    _require_symmetric(target, "target")
    shmem.put(target, src, _pe(rank, group))


def _get(target: torch.Tensor, src: torch.Tensor, rank: int, group: Optional[dist.ProcessGroup]) -> None:
    _require_symmetric(src, "src")
    shmem.get(target, src, _pe(rank, group))


def _signal(signal: torch.Tensor, value: int, op: str, rank: int, group: Optional[dist.ProcessGroup]) -> None:
    _require_symmetric(signal, "signal")
    shmem.signal(signal, value, _pe(rank, group), op=op)


def _put_with_signal(target: torch.Tensor, src: torch.Tensor, signal: torch.Tensor, value: int, op: str, rank: int,
                     group: Optional[dist.ProcessGroup]) -> None:
    _require_symmetric(target, "target")
    _require_symmetric(signal, "signal")
    # One runtime operation: every check of both halves before anything is written; across nodes one round trip.
    shmem.put_with_signal(target, src, signal, value, _pe(rank, group), op=op)


def _put_op(target: torch.Tensor, src: torch.Tensor, target_rank: int, group_name: str) -> None:
    _put(target, src, target_rank, groups.resolve(group_name))


def _get_op(target: torch.Tensor, src: torch.Tensor, target_rank: int, group_name: str) -> None:
    _get(target, src, target_rank, groups.resolve(group_name))


def _signal_op(signal: torch.Tensor, value: int, op: str, target_rank: int, group_name: str) -> None:
    _signal(signal, value, op, target_rank, groups.resolve(group_name))


def _put_with_signal_op(target: torch.Tensor, src: torch.Tensor, signal: torch.Tensor, value: int, op: str,
                        target_rank: int, group_name: str) -> None:
    _put_with_signal(target, src, signal, value, op, target_rank, groups.resolve(group_name))


def _wait_for_signal_op(depend_tensor: Optional[torch.Tensor], signal: torch.Tensor, compare_value: int,
                        compare_op: str) -> None:
    del depend_tensor  # orders graph-mode frameworks (the schema marks it written); the host device needs nothing
    _require_symmetric(signal, "signal")
    shmem.wait_signal(signal, compare_value, cmp=compare_op)


def _barrier_op(group_name: str) -> None:
    context.team(groups.resolve(group_name)).barrier()
