"""Collectives (seeds 000 and 004): argument translation over the runtime's teams.

Every collective is one call into the runtime's collective engine (``shmem.Team``), which picks the path (one step
for small messages, copy-free when every rank passes the same symmetric tensor, staged otherwise) and checks with
the call's first sync that every rank of the group runs the same call: ranks that disagree (another collective, count,
dtype, op or wire format) all raise ``ShmemMismatchError`` and the group stays usable. Low-precision communication
runs in the engine too (the wire format is part of the call); :mod:`._low_precision` resolves which dtype a call
travels in and documents the error bound.

Every call is enqueued on the current SHMEM stream; the engine waits for that stream where it reads what peers
published. A group's collectives must not run on two streams at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.symmetric_memory import _args, _autograd, _context, _groups, _low_precision, _rules
from hyper_parallel.core.symmetric_memory._context import GroupChannel



def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The flat bytes of a contiguous tensor."""
    return t.reshape(-1).view(torch.uint8)


def _is_part(part: torch.Tensor, whole: torch.Tensor, index: int) -> bool:
    """Whether the non-empty ``part`` is exactly part ``index`` of ``whole`` (contiguous tensors), judged from their
    views' metadata alone (torch.compile traces it; the operators check addresses)."""
    def root(t: torch.Tensor) -> torch.Tensor:
        return t if t._base is None else t._base

    if not part.numel() or root(part) is not root(whole):
        return False
    offset = part.storage_offset() * part.element_size() - whole.storage_offset() * whole.element_size()
    return offset == index * part.numel() * part.element_size()


def _precision_name(low_precision_dtype: object, dtype: torch.dtype, op: str) -> str:
    """``low_precision_dtype`` as the operators take it, checked: "" (None) leaves the environment's default to
    the operator, which reads it (environment reads stay out of traced code); an explicit value is checked here,
    before anything runs."""
    if low_precision_dtype is None:
        return ""
    precision = _low_precision.resolve(low_precision_dtype, dtype, op)
    return "none" if precision is None else str(precision).removeprefix("torch.")


# Bound once: the fast path below runs on every eager call. torch.compile recognises is_compiling by the function
# itself, whatever name calls it.
_is_compiling = torch.compiler.is_compiling
_plain_eager = shmem.plain_eager


def _fast_team(group: Optional[dist.ProcessGroup], *tensors: object) -> Optional["shmem.Team"]:
    """The group's team when the call may go straight to the engine: eager, plain tensors, no grad tracked, and
    the group already has a team; None otherwise (the call then takes the full checks and the operator).

    :func:`_autograd.direct`'s test, written out: a frame less on the small-message path."""
    if _is_compiling() or not _plain_eager(*tensors):
        return None
    return _context.cached_team(group)


# The reductions an eager call may hand straight to the engine (others take the checks that name them).
_FAST_OPS = frozenset(("sum", "avg", "max", "min"))


def shmem_allgather(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                    group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """Gathers every rank's ``input_tensor`` into ``output_tensor``, in group-rank order (collective).

    Args:
        output_tensor: group-size times the input's elements, same dtype. The same symmetric tensor on every
            rank: peers push into it directly (large messages); otherwise it is filled from staged copies.
        input_tensor: this rank's contribution. It may be this rank's part of ``output_tensor`` (in place).
        group: a ProcessGroup inside the root (None: WORLD).

    Returns:
        ``output_tensor``.

    Raises:
        TypeError: differing dtypes, a non-tensor.
        ValueError: sizes that do not match, or an input overlapping the output elsewhere than its own part.
        ShmemTimeoutError: a rank did not take part in time.
    """
    team = _fast_team(group, output_tensor, input_tensor)
    if team is not None and output_tensor.dtype is input_tensor.dtype:
        try:
            team.all_gather(output_tensor, input_tensor)
            return output_tensor
        except (ValueError, TypeError):
            pass  # refused before any rank moved: the checks below name the argument as this API does
    output = _args.tensor(output_tensor, "output_tensor")
    data = _args.tensor(input_tensor, "input_tensor")
    _args.same_dtype(data, "input_tensor", output, "output_tensor")
    group_name = _groups.name(group)
    _args.CHECKS.group_multiple(output, "output_tensor", data, "input_tensor", _groups.size(group))
    if _autograd.tracks(input_tensor) and _is_part(data, output, _groups.rank(group)):
        raise ValueError("`input_tensor` must not be a view of `output_tensor` when it requires grad, but got "
                         "this rank's part of it (autograd cannot differentiate an in-place all_gather)")
    _autograd.call("all_gather_", _all_gather_op, (input_tensor,), output_tensor, input_tensor, group_name)
    return output_tensor


def _channel(group_name: str, op: str) -> GroupChannel:
    """The channel of the group an operator was given by name, registering the group on its first collective."""
    return _context.channel(_groups.resolve(group_name), op)


def _all_gather_op(output: torch.Tensor, input: torch.Tensor, group_name: str) -> None:
    """The operator ``all_gather_``: the checks that need the runtime or addresses, then :func:`_all_gather`."""
    ch = _channel(group_name, "shmem_allgather")
    _check_all_gather_overlap(output, input, ch.me)
    _all_gather(output, input, ch)


def _check_all_gather_overlap(output: torch.Tensor, data: torch.Tensor, me: int) -> None:
    """Raises ValueError unless ``data`` is group rank ``me``'s part of ``output`` or lies outside it."""
    src, out = _bytes(data), _bytes(output)
    c = src.numel()
    mine = out[me * c:(me + 1) * c]
    if _args.overlaps(src, out) and src.data_ptr() != mine.data_ptr():
        raise ValueError("`input_tensor` must be this rank's part of `output_tensor` or not overlap it, but got "
                         f"an overlap at byte {src.data_ptr() - out.data_ptr()} of the output")


def _all_gather(output: torch.Tensor, data: torch.Tensor, ch: GroupChannel) -> None:
    """all_gather on checked arguments: one call of the engine."""
    ch.team.all_gather(output, data)


def shmem_allreduce(tensor: torch.Tensor, op: str = "sum", group: Optional[dist.ProcessGroup] = None,
                    low_precision_dtype: Optional[torch.dtype] = None, backward: str = "identity") -> torch.Tensor:
    """Reduces ``tensor`` across the group, in place: every rank ends with bit-identical values (collective).

    Small tensors (up to 256 KiB, or half the staging area if smaller) take one step: each rank reads every
    peer's staged copy. Larger ones reduce-scatter then all-gather: the same symmetric ``tensor`` on every rank
    is reduced in place with no copies; an ordinary tensor is read straight out of the peers' processes where the
    host device reaches them (cross-memory attach), through the staging area otherwise. float16/bfloat16
    accumulate in float32.

    Args:
        tensor: a contiguous CPU tensor of float32, float64, float16, bfloat16, int8, uint8, int32 or int64.
        op: 'sum', 'avg' (floating point only), 'max' or 'min'.
        group: a ProcessGroup inside the root (None: WORLD).
        low_precision_dtype: travel in this dtype (float16, bfloat16, float8_e4m3fn or float8_e5m2, or its name;
            fp8 with a power-of-two scale per 128-element block) and accumulate in the tensor's dtype (float32 at
            least). None: the default set by ``SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE``, which applies only where it
            can, else full precision; 'none': full precision whatever the environment says. It applies to 'sum'
            and 'avg' on floating-point tensors wider than it (an explicit dtype elsewhere is a ValueError); see
            :mod:`~hyper_parallel.core.symmetric_memory._low_precision` for the algorithm and the error bounds.
        backward: the gradient when ``tensor`` requires grad. 'identity' (default): ``grad_in = grad_out``
            (scaled by 1/n for 'avg'), right when the computation after the all-reduce is replicated on every
            rank, so every rank's ``grad_out`` is already the full gradient (tensor parallelism). 'allreduce':
            ``grad_in = all_reduce(grad_out)`` (same op), right when ranks go on to compute different losses.

    Returns:
        ``tensor`` (in the autograd graph when it requires grad).

    Raises:
        TypeError: an unsupported dtype.
        ValueError: an unknown op or backward, 'avg' on integers, a low-precision dtype that does not apply,
            'max'/'min' on a tensor that requires grad.
        ShmemTimeoutError: a rank did not take part in time.
    """
    if low_precision_dtype is None and backward in _rules.BACKWARD_MODES and op in _FAST_OPS:
        team = _fast_team(group, tensor)
        if team is not None and _low_precision.resolve(None, tensor.dtype, op) is None:
            try:
                team.all_reduce(tensor, op)
                return tensor
            except (ValueError, TypeError):
                pass  # refused before any rank moved: the checks below name the argument as this API does
    t = _args.tensor(tensor, "tensor")
    op = _args.reduce_op(op, t.dtype)
    precision = _precision_name(low_precision_dtype, t.dtype, op)
    mode = _autograd.backward_mode(backward)
    _autograd.call("all_reduce_", _all_reduce_op, (tensor,), tensor, op, _groups.name(group), precision, mode)
    return tensor


def _all_reduce_op(tensor: torch.Tensor, op: str, group_name: str, low_precision_dtype: str, backward: str) -> None:
    """The operator ``all_reduce_`` (``backward`` is autograd's): the environment's low-precision default, the
    channel, then :func:`_all_reduce`."""
    precision = _low_precision.resolve(low_precision_dtype or None, tensor.dtype, op)
    _all_reduce(tensor, op, _channel(group_name, "shmem_allreduce"), precision)


def _all_reduce(t: torch.Tensor, op: str, ch: GroupChannel, precision: Optional[torch.dtype] = None) -> None:
    """all_reduce on checked arguments (``precision``: the low-precision dtype to travel in, or None)."""
    ch.team.all_reduce(t, op, wire=precision)


def shmem_reduce_scatter(output_tensor: torch.Tensor, input_tensor: torch.Tensor, op: str = "sum",
                         group: Optional[dist.ProcessGroup] = None,
                         low_precision_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Reduces ``input_tensor`` across the group; rank r keeps part r of the result (collective).

    Args:
        output_tensor: 1/group-size of the input's elements, same dtype.
        input_tensor: group-size equal parts. The same symmetric tensor on every rank: peers reduce from it
            directly (large messages); otherwise it is staged.
        op: 'sum', 'avg' (floating point only), 'max' or 'min'.
        group: a ProcessGroup inside the root (None: WORLD).
        low_precision_dtype: as in :func:`shmem_allreduce`.

    Returns:
        ``output_tensor`` (in the autograd graph when the input requires grad: the gradient of the input is the
        all_gather of the output's, scaled by 1/n for 'avg').

    Raises:
        TypeError: differing or unsupported dtypes.
        ValueError: sizes that do not match, an unknown op, an output overlapping the input elsewhere than this
            rank's part, a low-precision dtype that does not apply, 'max'/'min' on an input that requires grad.
        ShmemTimeoutError: a rank did not take part in time.
    """
    if low_precision_dtype is None and op in _FAST_OPS:
        team = _fast_team(group, output_tensor, input_tensor)
        if team is not None and _low_precision.resolve(None, input_tensor.dtype, op) is None:
            try:
                team.reduce_scatter(output_tensor, input_tensor, op)
                return output_tensor
            except (ValueError, TypeError):
                pass  # refused before any rank moved: the checks below name the argument as this API does
    output = _args.tensor(output_tensor, "output_tensor")
    data = _args.tensor(input_tensor, "input_tensor")
    _args.same_dtype(output, "output_tensor", data, "input_tensor")
    op = _args.reduce_op(op, data.dtype)
    precision = _precision_name(low_precision_dtype, data.dtype, op)
    group_name = _groups.name(group)
    _args.CHECKS.group_multiple(data, "input_tensor", output, "output_tensor", _groups.size(group))
    _autograd.call("reduce_scatter_", _reduce_scatter_op, (input_tensor,), output_tensor, input_tensor, op,
                   group_name, precision)
    return output_tensor


def _reduce_scatter_op(output: torch.Tensor, input: torch.Tensor, op: str, group_name: str,
                       low_precision_dtype: str) -> None:
    """The operator ``reduce_scatter_``: the low-precision default, the channel, the overlap check, then
    :func:`_reduce_scatter`."""
    precision = _low_precision.resolve(low_precision_dtype or None, input.dtype, op)
    ch = _channel(group_name, "shmem_reduce_scatter")
    _check_reduce_scatter_overlap(output, input, ch.me)
    _reduce_scatter(output, input, op, ch, precision)


def _check_reduce_scatter_overlap(output: torch.Tensor, data: torch.Tensor, me: int) -> None:
    """Raises ValueError unless ``output`` is group rank ``me``'s part of ``data`` or lies outside it."""
    out, src = output.view(-1), data.view(-1)
    c = out.numel()
    mine = src[me * c:(me + 1) * c]
    if _args.overlaps(out, src) and out.data_ptr() != mine.data_ptr():
        raise ValueError("`output_tensor` must be this rank's part of `input_tensor` or not overlap it, but got an "
                         f"overlap at byte {out.data_ptr() - src.data_ptr()} of the input")


def _reduce_scatter(output: torch.Tensor, data: torch.Tensor, op: str, ch: GroupChannel,
                    precision: Optional[torch.dtype] = None) -> None:
    """reduce_scatter on checked arguments (``precision`` as in :func:`_all_reduce`)."""
    ch.team.reduce_scatter(output, data, op, wire=precision)


def shmem_alltoall(send_tensor_list: Sequence[torch.Tensor], receive_tensor: torch.Tensor, receive_list: Sequence[int],
                   group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """Sends ``send_tensor_list[j]`` to rank j; ``receive_tensor`` gets every rank's part in rank order (collective).

    The counts are exchanged through symmetric memory (no framework collective) and checked on every rank
    before any data moves: a mismatch raises the same error everywhere and writes nothing. Small parts travel
    with the counts. When every rank passes the same symmetric ``receive_tensor``, senders push into it; when
    the send tensors are, on every rank, the blocks of that tensor where the same peer's part lands (in place),
    each pair of ranks swaps its two blocks, moving half the bytes. Anything else is staged.

    Args:
        send_tensor_list: one contiguous tensor per group rank (any sizes, the dtype of ``receive_tensor``); they
            may be views of ``receive_tensor``.
        receive_tensor: the destination; the part from rank i starts after the counts from ranks < i. The
            same symmetric tensor on every rank: senders push into it directly (large messages); otherwise
            each rank reads its parts straight out of the senders' tensors where the host device reaches them, or
            through the staging area.
        receive_list: the element count expected from each rank (ints or a 1-D integer tensor); their sum must
            fit ``receive_tensor``. Elements, not bytes: upstream hyper-parallel's documentation writes bytes, but
            its code offsets ``receive_tensor`` by these counts as elements, and this follows the code.
        group: a ProcessGroup inside the root (None: WORLD).

    Returns:
        ``receive_tensor``.

    Raises:
        TypeError: differing dtypes, non-tensors.
        ValueError: a list of the wrong length, counts past ``receive_tensor``'s end, or counts that disagree
            with what the senders send.
        ShmemTimeoutError: a rank did not take part in time.
    """
    if type(send_tensor_list) in (list, tuple) and type(receive_list) in (list, tuple):
        team = _fast_team(group, receive_tensor, *send_tensor_list)
        if team is not None:
            dtype = receive_tensor.dtype
            for t in send_tensor_list:  # a loop, not all(): no generator on the small-message path
                if t.dtype is not dtype:
                    break
            else:
                try:
                    team.all_to_all(send_tensor_list, receive_tensor, receive_list)
                    return receive_tensor
                except (ValueError, TypeError):
                    pass  # every rank refused alike: the checks below name the argument as this API does
    group_name = _groups.name(group)
    sends, _, receives = _args.CHECKS.all_to_all(send_tensor_list, receive_tensor, receive_list, _groups.size(group))
    _autograd.call("all_to_all_", _all_to_all_op, sends, receive_tensor, sends, receives, group_name)
    return receive_tensor


def _all_to_all_op(receive: torch.Tensor, sends: list, receive_counts: list, group_name: str) -> None:
    """The operator ``all_to_all_``: the channel, then :func:`_all_to_all`."""
    ch = _channel(group_name, "shmem_alltoall")
    _all_to_all([_bytes(t) for t in sends], receive, list(receive_counts), ch)


def _all_to_all(sends: list, receive: torch.Tensor, receives: list, ch: GroupChannel) -> None:
    """all_to_all on checked arguments: ``sends`` as flat bytes, ``receives`` as element counts."""
    ch.team.all_to_all(sends, receive, receives)


def shmem_send(tensor: torch.Tensor, dst_rank: int,
               group: Optional[dist.ProcessGroup] = None) -> Optional[torch.Tensor]:
    """Sends ``tensor`` to ``dst_rank``, which receives it with :func:`shmem_recv` (point to point).

    Messages travel through the receiver's mailbox in pieces, up to four in flight: a small message returns
    at once (the tensor may be reused), a larger one waits while the receiver lags four pieces behind.
    Messages between two ranks arrive in the order they were sent.

    Args:
        tensor: a contiguous CPU tensor.
        dst_rank: a rank of ``group`` other than this one.
        group: a ProcessGroup inside the root (None: WORLD) that ran a collective (or ``barrier``) before.

    Returns:
        None; when ``tensor`` requires grad, a zero scalar in the autograd graph instead: its backward receives
        the gradient of ``tensor`` from ``dst_rank`` (whose :func:`shmem_recv` result sends it back in its own
        backward). Add it to the loss or call ``.backward()`` on it.

    Raises:
        ValueError: ``dst_rank`` outside the group or this rank itself.
        ShmemStateError: ``group`` never ran a collective, so it has no channel.
        ShmemTimeoutError: the receiver did not drain a piece in time.
    """
    team = _fast_team(group, tensor)
    if team is not None and type(dst_rank) is int and 0 <= dst_rank < team.size and dst_rank != team.rank:
        team.send(tensor, dst_rank)  # the engine checks the tensor as this API does (its errors name `tensor`)
        return None
    _args.tensor(tensor, "tensor")
    dst = _args.integer(dst_rank, "dst_rank")
    token = _autograd.call("send", _send_op, (tensor,), tensor, dst, _groups.name(group))
    return token if _autograd.tracks(tensor) else None


def _send_op(tensor: torch.Tensor, dst: int, group_name: str) -> torch.Tensor:
    """The operator ``send``: the group's channel (it must exist), the peer check, :func:`_send`; returns the
    gradient's token, a zero scalar."""
    ch = _context.registered_channel(_groups.resolve(group_name), "shmem_send")
    _send(tensor, _peer_rank(dst, "dst_rank", ch), ch)
    return tensor.new_zeros(())


def _send(tensor: torch.Tensor, dst: int, ch: GroupChannel) -> None:
    """send on checked arguments (``dst``: a group rank)."""
    ch.team.send(_bytes(tensor), dst)


def shmem_recv(tensor: torch.Tensor, src_rank: int, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """Receives the next message ``src_rank`` sent with :func:`shmem_send` into ``tensor``.

    Args:
        tensor: a contiguous CPU tensor of the message's byte size.
        src_rank: a rank of ``group`` other than this one.
        group: a ProcessGroup inside the root (None: WORLD) that ran a collective (or ``barrier``) before.

    Returns:
        ``tensor``. When ``tensor`` requires grad (a leaf made with ``requires_grad=True``), a new tensor with the
        message (``tensor`` holds it too) in the autograd graph instead: its backward sends the gradient back to
        ``src_rank`` (whose :func:`shmem_send` result receives it) and leaves it in ``tensor.grad`` as well.

    Raises:
        ValueError: ``src_rank`` outside the group or this rank, or a message of another size (the message is
            drained, so the sender is not left waiting, and ``tensor`` is left unchanged).
        ShmemStateError: ``group`` never ran a collective.
        ShmemTimeoutError: nothing arrived in time.
    """
    team = _fast_team(group, tensor)
    if team is not None and type(src_rank) is int and 0 <= src_rank < team.size and src_rank != team.rank:
        team.recv(tensor, src_rank)  # the engine checks the tensor and the message's size as this API does
        return tensor
    _args.tensor(tensor, "tensor")
    src = _args.integer(src_rank, "src_rank")
    group_name = _groups.name(group)
    if _autograd.tracks(tensor):
        if not tensor.is_leaf:
            raise ValueError("`tensor` must be a leaf (a receive buffer made with requires_grad=True) when it "
                             f"requires grad, but got the output of {type(tensor.grad_fn).__name__}")
        received = torch.ops.hyper_parallel_shmem.recv(tensor, src, group_name)
        with torch.no_grad():
            tensor.copy_(received)
        return received
    _autograd.call("recv_", _recv_op, (tensor,), tensor, src, group_name)
    return tensor


def _recv_op(tensor: torch.Tensor, src: int, group_name: str) -> None:
    """The operator ``recv_``: the group's channel (it must exist), the peer check, then :func:`_recv`."""
    ch = _context.registered_channel(_groups.resolve(group_name), "shmem_recv")
    _recv(tensor, _peer_rank(src, "src_rank", ch), ch)


def _recv_new_op(like: torch.Tensor, src: int, group_name: str) -> torch.Tensor:
    """The operator ``recv``: the message in a new tensor like ``like``."""
    out = torch.empty_like(like)
    _recv_op(out, src, group_name)
    return out


def _recv(tensor: torch.Tensor, src: int, ch: GroupChannel) -> None:
    """recv on checked arguments (``src``: a group rank)."""
    ch.team.recv(_bytes(tensor), src)


def _peer_rank(value: object, name: str, ch: GroupChannel) -> int:
    return _args.CHECKS.peer(value, name, ch.size, ch.me)
