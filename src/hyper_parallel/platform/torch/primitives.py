"""torch's calls of seed 000's primitives (:class:`._api.Api` checks the arguments first): symmetric allocation,
put/get, signals and the barrier, through the operators of :mod:`._ops`.

Every call is enqueued on the current SHMEM stream (on the default stream it is complete when it returns).
"""

from __future__ import annotations

from typing import Optional

import torch

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.symmetric_memory import _rules
from hyper_parallel.platform.torch import args as _args, autograd as _autograd, context as _context, groups as _groups


def empty(dims: tuple, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A CPU tensor of checked ``dims`` in the symmetric heap (collective over WORLD); the first call acquires the
    runtime over WORLD.

    Raises:
        TypeError: a bad dtype.
        ShmemStateError: torch.distributed is not initialised.
    """
    _context.state()
    return shmem.empty(*dims, dtype=torch.float32 if dtype is None else dtype)


def free(tensor: torch.Tensor) -> None:
    """Frees a tensor from :func:`empty` (collective over WORLD); its views raise on any later use."""
    shmem.free(tensor)


def shutdown() -> None:
    """Frees the API's workspace and releases its runtime reference (collective over WORLD)."""
    _context.shutdown()


def _pe(target_rank: object, group: Optional[object]) -> int:
    pes = _context.group_pes(group)
    return pes[_args.CHECKS.rank_in_group(target_rank, "target_rank", len(pes))]


def _require_symmetric(t: torch.Tensor, name: str) -> None:
    _rules.require_symmetric(_context.is_symmetric(t), name, t.data_ptr())


def _flat(t: torch.Tensor, at: int, n: int) -> torch.Tensor:
    return t.view(-1)[at:at + n]


def put(target: torch.Tensor, target_at: int, src: torch.Tensor, src_at: int, n: int, rank: int,
        group_name: str) -> None:
    """``shmem_put`` on checked windows."""
    _autograd.call("put_", _put_op, (), _flat(target, target_at, n), _flat(src, src_at, n), rank, group_name)


def get(target: torch.Tensor, target_at: int, src: torch.Tensor, src_at: int, n: int, rank: int,
        group_name: str) -> None:
    """``shmem_get`` on checked windows."""
    _autograd.call("get_", _get_op, (), _flat(target, target_at, n), _flat(src, src_at, n), rank, group_name)


def signal(signal: torch.Tensor, offset: int, value: int, op: str, rank: int, group_name: str) -> None:
    """``shmem_signal_op`` on a checked element."""
    _autograd.call("signal_", _signal_op, (), _flat(signal, offset, 1), value, op, rank, group_name)


def wait_signal(depend_tensor: Optional[torch.Tensor], signal: torch.Tensor, offset: int, value: int,
                cmp: str) -> None:
    """``shmem_wait_for_signal`` on a checked element."""
    _autograd.call("wait_for_signal", _wait_for_signal_op, (), depend_tensor, _flat(signal, offset, 1), value, cmp)


def put_with_signal(target: torch.Tensor, target_at: int, src: torch.Tensor, src_at: int, n: int,
                    signal: torch.Tensor, offset: int, value: int, op: str, rank: int, group_name: str) -> None:
    """``shmem_put_with_signal`` on checked windows."""
    _autograd.call("put_with_signal_", _put_with_signal_op, (), _flat(target, target_at, n), _flat(src, src_at, n),
                   _flat(signal, offset, 1), value, op, rank, group_name)


def barrier(group_name: str) -> None:
    """``barrier`` of a group given by name (registering it on its first collective)."""
    _autograd.call("barrier", _barrier_op, (), group_name)


# --------------------------------------------------------------------------
# The operators' implementations (:mod:`~hyper_parallel.core.symmetric_memory._ops`): the checks that need the
# runtime or the tensors' addresses, then the runtime's calls. The calls above cut the windows.
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
