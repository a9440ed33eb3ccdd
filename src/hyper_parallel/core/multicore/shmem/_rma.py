"""The data plane: one-sided put/get, signals, reduce, barrier and all_gather over the root.

Each call is enqueued on the current stream (:mod:`._streams`); on the default stream it is complete when it
returns. PEs are ranks inside the root group. The binding checks tensors, PEs and signal values (in C++: on
this hot path the checks would otherwise cost more than a small put).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch

from hyper_parallel.core.multicore.shmem import _across_nodes
from hyper_parallel.core.multicore.shmem._binding import C
from hyper_parallel.core.multicore.shmem._checks import check_choice, keyword_alias
from hyper_parallel.core.multicore.shmem._lifecycle import require_root, root_info
from hyper_parallel.core.multicore.shmem._streams import DEFAULT_HANDLE, current_handle
from hyper_parallel.core.multicore.shmem._teams import root_team
from hyper_parallel.core.multicore.errors import ShmemTimeoutError, ShmemTypeError, attach_fields

# The runtime's numberings (ops/reduce_op.h, runtime/device.h), read once from the binding.
_SIGNAL_OPS = dict(C.signal_ops())
_COMPARE_OPS = dict(C.compare_ops())
_REDUCE_OPS = dict(C.reduce_ops())


def put(dst: Optional[torch.Tensor] = None, src: Optional[torch.Tensor] = None, pe: Optional[int] = None, *,
        remote_dst: Optional[torch.Tensor] = None, local_src: Optional[torch.Tensor] = None,
        target_pe: Optional[int] = None) -> None:
    """Writes ``src`` into the copy of the symmetric tensor ``dst`` that lives on ``pe``.

    Args:
        dst: a symmetric tensor (from ``empty``, or a contiguous view of one); the same location on ``pe``
            is written.
        src: any contiguous CPU tensor with as many bytes as ``dst``.
        pe: the target rank inside the root.
        remote_dst, local_src, target_pe: upstream hyper-parallel's names of ``dst``, ``src`` and ``pe``; give
            one name of each.

    Raises:
        TypeError: an argument of the wrong type, or given under both names.
        ValueError: ``pe`` out of range, byte counts that differ, a non-contiguous tensor, a ``dst`` outside the
            symmetric heap or running past its allocation. Nothing is written.
        ShmemStateError: a freed tensor, or no runtime.
    """
    try:
        if dst is None or src is None or pe is None or remote_dst is not None or local_src is not None \
                or target_pe is not None:  # not the common call: an argument missing, or under upstream's name
            dst, src, pe = _upstream_names((("dst", dst, "remote_dst", remote_dst),
                                            ("src", src, "local_src", local_src),
                                            ("pe", pe, "target_pe", target_pe)))
        C.put(dst, src, pe, current_handle())
    except Exception as error:
        attach_fields(error, "put")
        raise


def get(dst: Optional[torch.Tensor] = None, src: Optional[torch.Tensor] = None, pe: Optional[int] = None, *,
        local_dst: Optional[torch.Tensor] = None, remote_src: Optional[torch.Tensor] = None,
        source_pe: Optional[int] = None) -> None:
    """Reads the copy of the symmetric tensor ``src`` that lives on ``pe`` into ``dst``.

    Args:
        dst: any contiguous CPU tensor with as many bytes as ``src``.
        src: a symmetric tensor; the same location on ``pe`` is read.
        pe: the source rank inside the root.
        local_dst, remote_src, source_pe: upstream hyper-parallel's names of ``dst``, ``src`` and ``pe``.

    Raises:
        TypeError, ValueError, ShmemStateError: as :func:`put`, with the roles of ``dst`` and ``src`` swapped.
    """
    try:
        if dst is None or src is None or pe is None or local_dst is not None or remote_src is not None \
                or source_pe is not None:
            dst, src, pe = _upstream_names((("dst", dst, "local_dst", local_dst),
                                            ("src", src, "remote_src", remote_src),
                                            ("pe", pe, "source_pe", source_pe)))
        C.get(dst, src, pe, current_handle())
    except Exception as error:
        attach_fields(error, "get")
        raise


def _upstream_names(arguments: tuple) -> list:
    """The values of arguments that upstream hyper-parallel names otherwise (None where neither name was given:
    the binding then says what the argument must be).

    Args:
        arguments: ``(name, value, upstream name, upstream value)`` for each argument, None where not given.

    Returns:
        The values, in order.

    Raises:
        ShmemTypeError: an argument given under both names.
    """
    return [keyword_alias(name, value, alias, alias_value, None)[1] for name, value, alias, alias_value in arguments]


def signal(signal_tensor: Optional[torch.Tensor] = None, value: Optional[int] = None, pe: Optional[int] = None, *,
           op: Optional[str] = None, operation: Optional[str] = None, remote_signal: Optional[torch.Tensor] = None,
           target_pe: Optional[int] = None) -> None:
    """Atomically sets or adds ``value`` to the signal on ``pe``, after everything enqueued before it is visible.

    Args:
        signal_tensor: a one-element int32 (or int64) symmetric tensor.
        value: the value to set or add; it must fit the signal's dtype.
        pe: the target rank inside the root.
        op: ``"set"`` (the default) or ``"add"``.
        operation, remote_signal, target_pe: upstream hyper-parallel's names of ``op``, ``signal_tensor`` and
            ``pe``; give one name of each.

    Raises:
        TypeError: a signal of another dtype, a non-int value or pe; an argument under both names.
        ValueError: a signal of another size or misaligned, an unknown op, ``pe`` out of range.
        ShmemStateError: a freed signal, or no runtime.
    """
    try:
        # The common call names neither or `op`: no helper call on this hot path.
        name, chosen = ("op", "set" if op is None else op) if operation is None else keyword_alias(
            "op", op, "operation", operation, "set")
        if signal_tensor is None or value is None or pe is None or remote_signal is not None or target_pe is not None:
            signal_tensor, value, pe = _upstream_names((
                ("signal_tensor", signal_tensor, "remote_signal", remote_signal), ("value", value, "value", None),
                ("pe", pe, "target_pe", target_pe)))
        C.signal(signal_tensor, value, pe, check_choice(name, chosen, _SIGNAL_OPS), current_handle())
    except Exception as error:
        attach_fields(error, "signal")
        raise


def put_with_signal(dst: torch.Tensor, src: torch.Tensor, signal_tensor: torch.Tensor, value: int, pe: int, *,
                    op: str = "set") -> None:
    """:func:`put`, then :func:`signal` on the same ``pe``, as one runtime operation: the data is visible on ``pe``
    before the signal is, and to a PE of another node the call waits once for both (one round trip).

    The frameworks' handlers of the user API's ``shmem_put_with_signal`` call it.

    Args:
        dst: as :func:`put`.
        src: as :func:`put`.
        signal_tensor: as :func:`signal`.
        value: as :func:`signal`.
        pe: the target rank inside the root.
        op: ``"set"`` (the default) or ``"add"``.

    Raises:
        TypeError, ValueError, ShmemStateError: as :func:`put` and :func:`signal`; every check of both passes before
            anything is written.
        ShmemDeviceError, ShmemTimeoutError: the target of another node is gone, or did not complete in time.
    """
    try:
        C.put_with_signal(dst, src, signal_tensor, value, pe, check_choice("op", op, _SIGNAL_OPS), current_handle())
    except Exception as error:
        attach_fields(error, "put_with_signal")
        raise


def wait_signal(signal_tensor: torch.Tensor, value: int, *, cmp: Optional[str] = None,
                comparison: Optional[str] = None) -> None:
    """Waits until the local signal compares true against ``value``.

    Spins briefly, then sleeps in the kernel; gives up after ``HYPER_PARALLEL_SHMEM_TIMEOUT_SEC``.

    Args:
        signal_tensor: a one-element int32 (or int64) symmetric tensor.
        value: the value to compare with.
        cmp: one of ``"eq"`` (the default), ``"ne"``, ``"gt"``, ``"ge"``, ``"lt"``, ``"le"`` (signal ``cmp``
            value).
        comparison: upstream hyper-parallel's name of ``cmp``; give one of the two.

    Raises:
        ShmemTimeoutError: the condition did not hold in time (the message has the expected and observed value).
        ShmemDeviceError: a PE of another node is gone (its process exited or its node died) and the condition
            does not hold: the message names the lost PEs and their nodes.
        TypeError, ValueError: as :func:`signal`.
    """
    try:
        name, chosen = ("cmp", "eq" if cmp is None else cmp) if comparison is None else keyword_alias(
            "cmp", cmp, "comparison", comparison, "eq")
        C.wait_signal(signal_tensor, value, check_choice(name, chosen, _COMPARE_OPS), current_handle())
    except Exception as error:
        attach_fields(error, "wait_signal")
        raise


def reduce(dst: torch.Tensor, src: torch.Tensor, pes: Sequence[int], *, op: str = "sum") -> None:
    """Reduces the copies of the symmetric tensor ``src`` on ``pes`` into ``dst``, reading the peers directly.

    ``dst[i] = op over pe in pes of src[i] as it is on pe``, combining the PEs in the order given (which matters
    to floating-point sums). float16 and bfloat16 accumulate in float32 and are rounded once; ``"avg"`` is the sum
    divided by ``len(pes)``; integer sums wrap like torch's; ``"max"`` and ``"min"`` propagate NaN like
    ``torch.maximum``/``torch.minimum``. Nothing is synchronised: order it after the peers' writes (a barrier or
    a signal), and in place, keep peers from reading this rank's ``src`` while it is overwritten.

    Args:
        dst: a contiguous CPU tensor of ``src``'s dtype and byte size; ``src`` itself (in place) or a tensor that
            does not overlap it.
        src: a symmetric tensor (from ``empty``, or a contiguous view of one) of dtype float32, float64, float16,
            bfloat16, int8, uint8, int32 or int64.
        pes: distinct ranks inside the root, at least one (a list or tuple of ints).
        op: one of ``"sum"``, ``"avg"``, ``"max"``, ``"min"``; ``"avg"`` only for floating-point dtypes.

    Returns:
        None. On the default stream ``dst`` holds the result when the call returns.

    Raises:
        TypeError: an argument of the wrong type, an unsupported dtype, or dtypes of ``dst`` and ``src`` that
            differ.
        ValueError: an unknown op, ``"avg"`` of integers, empty, repeated or out-of-range ``pes``, byte counts that
            differ, a non-contiguous tensor, a ``src`` outside the symmetric heap or running past its allocation,
            a ``dst`` that overlaps ``src`` other than as ``src`` itself. Nothing is written.
        ShmemStateError: a freed tensor, or no runtime.
    """
    try:
        C.reduce(dst, src, check_choice("op", op, _REDUCE_OPS), pes, current_handle())
    except Exception as error:
        attach_fields(error, "reduce")
        raise


def barrier(*, blocking: bool = False) -> None:
    """Waits until every rank of the root reaches the barrier; earlier writes are then visible everywhere.

    Like every data-plane call the barrier is enqueued on the current stream. On the default stream of
    the host device that is the calling thread, so it is complete when it returns; on a :class:`Stream` (and on
    the ascend device's NPU stream) it is complete once the stream reaches it. When the root spans nodes, the
    barrier waits for the current stream first and runs on the calling thread (its step across nodes runs over the
    runtime's transport to other nodes, or over the root ProcessGroup where the runtime has none).

    Args:
        blocking: also wait, before returning, until the current stream has run the barrier and everything
            enqueued on it before (upstream hyper-parallel's default is True; this runtime face's is False:
            enqueue only, as for every other data-plane call). On the default stream of the host device both are the same.

    Raises:
        TypeError: ``blocking`` is not a bool.
        ShmemTimeoutError: a rank did not arrive in time (the message names the missing ranks).
        ShmemStateError: no runtime.
    """
    try:
        if not isinstance(blocking, bool):
            raise ShmemTypeError(f"`blocking` must be a bool, but got {type(blocking).__name__}")
        handle = current_handle()
        root = root_info()
        if root is not None and root.spans_nodes:
            # The step across nodes runs on this thread: after the stream's work.
            C.synchronize_stream(handle)
            timed_out = _across_nodes.barrier(root, lambda: C.barrier(DEFAULT_HANDLE))
            if timed_out:
                raise ShmemTimeoutError(timed_out)
            return
        C.barrier(handle)
        if blocking:
            C.synchronize_stream(handle)
    except Exception as error:
        attach_fields(error, "barrier")
        raise


def _numel(value: object) -> Optional[int]:
    return value.numel() if isinstance(value, torch.Tensor) else None


def all_gather(output: torch.Tensor, input: torch.Tensor) -> None:
    """Gathers every rank's ``input`` into ``output`` in rank order (collective over the root).

    One call of the runtime's collective engine on the root team (:func:`root_team`): the call is checked against
    every rank's (a rank calling another collective, or another size or dtype, makes every rank raise
    :class:`ShmemMismatchError`). A zero-byte call (an input and an output without elements) is a validated no-op:
    it checks the types and that a runtime is active, moves nothing and waits for no rank.

    Args:
        output: world_size times the input's bytes: a symmetric tensor (peers write into it directly) or any
            contiguous tensor of the device (filled straight from the peers' inputs where the device reaches their
            memory, through the engine's staging area otherwise).
        input: any contiguous tensor of the device (it may be this rank's slice of ``output``).

    Raises:
        TypeError: an argument that is not a tensor.
        ValueError: ``output`` is not world_size times the input's bytes, or is overlapped by ``input`` other than
            at this rank's own slot.
        ShmemMismatchError: the ranks do not all call all_gather with the same size and dtype.
        ShmemTimeoutError: a rank did not arrive in time.
        ShmemStateError: a freed tensor, or no runtime.
    """
    try:
        if _numel(input) == 0 and _numel(output) == 0:
            # 0 == world_size * 0 bytes: with no byte to place, the output need not be symmetric.
            require_root("all_gather")
            return
        if root_info() is None:
            # Raises: the binding checks the arguments first, then finds no runtime (team 0 is never a team).
            C.all_gather(0, output, input, current_handle())
        root_team().all_gather(output, input)
    except Exception as error:
        attach_fields(error, "all_gather")
        raise
