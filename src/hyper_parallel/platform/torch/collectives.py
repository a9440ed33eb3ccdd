"""torch's calls of the collectives (seeds 000 and 004; :class:`._api.Api` checks the arguments first), over the
runtime's teams.

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

from typing import Optional

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.symmetric_memory import _rules
from hyper_parallel.platform.torch import args as _args, autograd as _autograd, context as _context, groups as _groups, low_precision as _low_precision
from hyper_parallel.platform.torch.context import GroupChannel



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


def wire(low_precision_dtype: object, dtype: torch.dtype, op: str) -> str:
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


class Fast:
    """Eager calls the engine can take before the user API's checks (:class:`._api.Api`'s ``fast``): the group
    already has a team, nothing is traced or tracked, and the arguments are of the plain kinds the engine checks
    itself. Each method returns whether it ran the call; a call the engine refuses before any rank moved falls
    back to the checks, which name the argument as the API does (every rank refuses alike). The engine's call is
    written out in each method rather than through a helper: a frame less on the small-message path."""

    @staticmethod
    def all_gather(output_tensor: object, input_tensor: object, group: Optional[dist.ProcessGroup]) -> bool:
        team = _fast_team(group, output_tensor, input_tensor)
        if team is None or output_tensor.dtype is not input_tensor.dtype:
            return False
        try:
            team.all_gather(output_tensor, input_tensor)
        except (ValueError, TypeError):
            return False
        return True

    @staticmethod
    def all_reduce(tensor: object, op: object, group: Optional[dist.ProcessGroup], low_precision_dtype: object,
                   backward: object) -> bool:
        if low_precision_dtype is not None or backward not in _rules.BACKWARD_MODES or op not in _FAST_OPS:
            return False
        team = _fast_team(group, tensor)
        if team is None or _low_precision.resolve(None, tensor.dtype, op) is not None:
            return False
        try:
            team.all_reduce(tensor, op)
        except (ValueError, TypeError):
            return False
        return True

    @staticmethod
    def reduce_scatter(output_tensor: object, input_tensor: object, op: object, group: Optional[dist.ProcessGroup],
                       low_precision_dtype: object) -> bool:
        if low_precision_dtype is not None or op not in _FAST_OPS:
            return False
        team = _fast_team(group, output_tensor, input_tensor)
        if team is None or _low_precision.resolve(None, input_tensor.dtype, op) is not None:
            return False
        try:
            team.reduce_scatter(output_tensor, input_tensor, op)
        except (ValueError, TypeError):
            return False
        return True

    @staticmethod
    def all_to_all(send_tensor_list: object, receive_tensor: object, receive_list: object,
                   group: Optional[dist.ProcessGroup]) -> bool:
        if type(send_tensor_list) not in (list, tuple) or type(receive_list) not in (list, tuple):
            return False
        team = _fast_team(group, receive_tensor, *send_tensor_list)
        if team is None:
            return False
        dtype = receive_tensor.dtype
        for t in send_tensor_list:  # a loop, not all(): no generator on the small-message path
            if t.dtype is not dtype:
                return False
        try:
            team.all_to_all(send_tensor_list, receive_tensor, receive_list)
        except (ValueError, TypeError):
            return False
        return True

    @staticmethod
    def send(tensor: object, dst_rank: object, group: Optional[dist.ProcessGroup]) -> bool:
        team = _fast_team(group, tensor)
        if team is None or type(dst_rank) is not int or not 0 <= dst_rank < team.size or dst_rank == team.rank:
            return False
        team.send(tensor, dst_rank)  # the engine checks the tensor as the API does (its errors name `tensor`)
        return True

    @staticmethod
    def recv(tensor: object, src_rank: object, group: Optional[dist.ProcessGroup]) -> bool:
        team = _fast_team(group, tensor)
        if team is None or type(src_rank) is not int or not 0 <= src_rank < team.size or src_rank == team.rank:
            return False
        team.recv(tensor, src_rank)  # the engine checks the tensor and the message's size as the API does
        return True


# --------------------------------------------------------------------------
# torch's calls of the collectives on checked arguments (:class:`._api.Api`): the torch-only checks, then the
# operators (through autograd where a tensor requires grad).
# --------------------------------------------------------------------------


def all_gather(output: torch.Tensor, data: torch.Tensor, group_name: str) -> torch.Tensor:
    """``shmem_allgather`` on checked arguments."""
    if _autograd.tracks(data) and _is_part(data, output, _groups.rank(_groups.resolve(group_name))):
        raise ValueError("`input_tensor` must not be a view of `output_tensor` when it requires grad, but got "
                         "this rank's part of it (autograd cannot differentiate an in-place all_gather)")
    _autograd.call("all_gather_", _all_gather_op, (data,), output, data, group_name)
    return output


def all_reduce(tensor: torch.Tensor, op: str, group_name: str, precision: str, mode: str) -> torch.Tensor:
    """``shmem_allreduce`` on checked arguments."""
    _autograd.call("all_reduce_", _all_reduce_op, (tensor,), tensor, op, group_name, precision, mode)
    return tensor


def reduce_scatter(output: torch.Tensor, data: torch.Tensor, op: str, group_name: str,
                   precision: str) -> torch.Tensor:
    """``shmem_reduce_scatter`` on checked arguments."""
    _autograd.call("reduce_scatter_", _reduce_scatter_op, (data,), output, data, op, group_name, precision)
    return output


def all_to_all(sends: list, receive: torch.Tensor, counts: list, group_name: str) -> torch.Tensor:
    """``shmem_alltoall`` on checked arguments."""
    _autograd.call("all_to_all_", _all_to_all_op, sends, receive, sends, counts, group_name)
    return receive


def send(tensor: torch.Tensor, dst: int, group_name: str) -> Optional[torch.Tensor]:
    """``shmem_send`` on checked arguments: None, or the gradient's token when ``tensor`` requires grad."""
    token = _autograd.call("send", _send_op, (tensor,), tensor, dst, group_name)
    return token if _autograd.tracks(tensor) else None


def recv(tensor: torch.Tensor, src: int, group_name: str) -> torch.Tensor:
    """``shmem_recv`` on checked arguments: ``tensor``, or a new tensor in the graph when ``tensor`` requires grad."""
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


def _all_reduce_op(tensor: torch.Tensor, op: str, group_name: str, low_precision_dtype: str, backward: str) -> None:
    """The operator ``all_reduce_`` (``backward`` is autograd's): the environment's low-precision default, the
    channel, then :func:`_all_reduce`."""
    precision = _low_precision.resolve(low_precision_dtype or None, tensor.dtype, op)
    _all_reduce(tensor, op, _channel(group_name, "shmem_allreduce"), precision)


def _all_reduce(t: torch.Tensor, op: str, ch: GroupChannel, precision: Optional[torch.dtype] = None) -> None:
    """all_reduce on checked arguments (``precision``: the low-precision dtype to travel in, or None)."""
    ch.team.all_reduce(t, op, wire=precision)


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


def _all_to_all_op(receive: torch.Tensor, sends: list, receive_counts: list, group_name: str) -> None:
    """The operator ``all_to_all_``: the channel, then :func:`_all_to_all`."""
    ch = _channel(group_name, "shmem_alltoall")
    _all_to_all([_bytes(t) for t in sends], receive, list(receive_counts), ch)


def _all_to_all(sends: list, receive: torch.Tensor, receives: list, ch: GroupChannel) -> None:
    """all_to_all on checked arguments: ``sends`` as flat bytes, ``receives`` as element counts."""
    ch.team.all_to_all(sends, receive, receives)


def _send_op(tensor: torch.Tensor, dst: int, group_name: str) -> torch.Tensor:
    """The operator ``send``: the group's channel (it must exist), the peer check, :func:`_send`; returns the
    gradient's token, a zero scalar."""
    ch = _context.registered_channel(_groups.resolve(group_name), "shmem_send")
    _send(tensor, _peer_rank(dst, "dst_rank", ch), ch)
    return tensor.new_zeros(())


def _send(tensor: torch.Tensor, dst: int, ch: GroupChannel) -> None:
    """send on checked arguments (``dst``: a group rank)."""
    ch.team.send(_bytes(tensor), dst)


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
