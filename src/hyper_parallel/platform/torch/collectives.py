"""torch's calls of the collectives (the user API checked the arguments first), over the runtime face's teams.

Every collective is one call into the runtime's collective engine (``shmem.Team``), which picks the path (one step
for small messages, copy-free when every rank passes the same symmetric tensor, staged otherwise), checks what needs
the tensors' addresses (overlaps, sizes against the group) and checks with the call's first sync that every rank of
the group runs the same call: ranks that disagree (another collective, count, dtype, op or wire format) all raise
``ShmemMismatchError`` and the group stays usable. Low-precision communication runs in the engine too (the wire
format is part of the call); :mod:`.low_precision` resolves which format a call travels in and documents the error
bound.

A call goes down once: an eager call on plain tensors that nothing tracks goes from here straight to the group's
team; any other call (autograd, torch.compile, a dispatch mode) goes through its operator (:mod:`.ops`), whose
implementation below (``_*_op``) finds the group by name and calls the same team.

Every call is enqueued on the current SHMEM stream; the engine waits for that stream where it reads what peers
published. A group's collectives must not run on two streams at once.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.multicore.errors import ShmemValueError
from hyper_parallel.core.multicore.shmem import codec
from hyper_parallel.core.symmetric_memory import checks
from hyper_parallel.platform.torch import context, groups, low_precision, tensors

# Bound once: these run on every eager call. torch.compile recognises is_compiling by the function itself, whatever
# name calls it.
_is_compiling = torch.compiler.is_compiling
_plain_eager = shmem.plain_eager
_cached_team = context.cached_team
_team = context.team


def _ops():
    return torch.ops.hyper_parallel_shmem


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The flat bytes of a contiguous tensor."""
    return t.reshape(-1).view(torch.uint8)


def _is_part(part: torch.Tensor, whole: torch.Tensor, index: int) -> bool:
    """Whether the non-empty ``part`` is exactly part ``index`` of ``whole`` (contiguous tensors), judged from their
    views' metadata alone (torch.compile traces it; the engine checks addresses)."""
    def root(t: torch.Tensor) -> torch.Tensor:
        return t if t._base is None else t._base

    if not part.numel() or root(part) is not root(whole):
        return False
    offset = part.storage_offset() * part.element_size() - whole.storage_offset() * whole.element_size()
    return offset == index * part.numel() * part.element_size()


def _fast_team(group: Optional[dist.ProcessGroup], *tensors: object) -> Optional[shmem.Team]:
    """The group's team when the call may go straight to the engine: eager, plain tensors, no grad tracked, and
    the group already has a team; None otherwise (the call then takes the full checks)."""
    if _is_compiling() or not _plain_eager(*tensors):
        return None
    return _cached_team(group)


# The reductions an eager call may hand straight to the engine (others take the checks that name them).
_FAST_OPS = frozenset(checks.REDUCE_OPS)


class Fast:
    """Eager calls the engine can take before the user API's checks (the handler's ``fast``): the group already
    has a team (and is live), nothing is traced or tracked, and the arguments are of the plain kinds the engine
    checks itself. Each method returns whether it ran the call (False: not taken, the checks run it). A call the
    engine refuses is refused on every rank of the group (collectively) and raises here; the user API then makes its
    checked call on every rank, which names the argument as the API does (``Api._again``). The engine's call is
    written out in each method rather than through a helper: a frame less on the small-message path."""

    @staticmethod
    def all_gather(output_tensor: object, input_tensor: object, group: Optional[dist.ProcessGroup]) -> bool:
        team = _fast_team(group, output_tensor, input_tensor)
        if team is None or output_tensor.dtype is not input_tensor.dtype:
            return False
        team.all_gather(output_tensor, input_tensor)
        return True

    @staticmethod
    def all_reduce(tensor: object, op: object, group: Optional[dist.ProcessGroup], low_precision_dtype: object,
                   backward: object) -> bool:
        if low_precision_dtype is not None or backward not in checks.BACKWARD_MODES or op not in _FAST_OPS:
            return False
        team = _fast_team(group, tensor)
        if team is None or low_precision.default(tensor.dtype, op) is not None:
            return False
        team.all_reduce(tensor, op)
        return True

    @staticmethod
    def reduce_scatter(output_tensor: object, input_tensor: object, op: object, group: Optional[dist.ProcessGroup],
                       low_precision_dtype: object) -> bool:
        if low_precision_dtype is not None or op not in _FAST_OPS:
            return False
        team = _fast_team(group, output_tensor, input_tensor)
        if team is None or low_precision.default(input_tensor.dtype, op) is not None:
            return False
        team.reduce_scatter(output_tensor, input_tensor, op)
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
        team.all_to_all(send_tensor_list, receive_tensor, receive_list)
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


def group_size(group: Optional[dist.ProcessGroup]) -> int:
    """The number of ranks of the group ``group`` (a key of :func:`.groups.key`).

    Raises:
        ShmemStateError: torch.distributed is not initialised.
        ShmemValueError: torch.distributed no longer knows the group (this process destroyed it).
    """
    team = _cached_team(group)
    if team is not None:
        return team.size
    groups.require_initialized()
    groups.require_live(group)
    return dist.get_world_size(group)


def refuse(group: Optional[dist.ProcessGroup], operation: str, error: BaseException) -> None:
    """Refuses this rank's call of the public function ``operation`` on ``group`` for ``error`` (a check that failed
    once the group was known), through the group's team: every rank of the group raises ``error``'s class and
    message, naming this rank. The team is made if this is the group's first collective (collective over the group,
    as the other ranks' calls make it); a group that has no team and that torch.distributed no longer knows cannot
    carry the refusal: ``error`` is raised here.

    Raises:
        The refusal, always.
    """
    team = context.refusing_team(group)
    if team is None:
        raise error
    team.refuse(_ENGINE_CALLS[operation], error)


# The engine's call each public collective begins with (the refusal stands for it; its name is in every rank's
# message).
_ENGINE_CALLS = {"shmem_allgather": "all_gather", "shmem_allreduce": "all_reduce",
                 "shmem_reduce_scatter": "reduce_scatter", "shmem_alltoall": "all_to_all", "barrier": "barrier",
                 "fused_all_gather_matmul": "fused_all_gather_matmul",
                 "fused_matmul_reduce_scatter": "fused_matmul_reduce_scatter", "rendezvous": "barrier",
                 "shmem_moe_dispatch": "moe_dispatch", "shmem_moe_combine": "moe_combine"}


# --------------------------------------------------------------------------
# The calls on checked arguments (``group``: the key groups.key made). Eager calls on plain tensors that nothing
# tracks go straight to the team; the others through their operators.
# --------------------------------------------------------------------------


def all_gather(output: torch.Tensor, data: torch.Tensor, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """``shmem_allgather`` on checked arguments."""
    if _is_compiling() or not _plain_eager(data):
        if tensors.tracks(data) and _is_part(data, output, dist.get_rank(group)):
            refuse(group, "shmem_allgather", ShmemValueError(
                "`input_tensor` must not be a view of `output_tensor` when it requires grad, but got this rank's "
                "part of it (autograd cannot differentiate an in-place all_gather)"))
        _ops().all_gather_(output, data, groups.name(group))
    else:
        _team(group).all_gather(output, data)
    return output


def all_reduce(tensor: torch.Tensor, op: str, group: Optional[dist.ProcessGroup], wire: str,
               mode: str) -> torch.Tensor:
    """``shmem_allreduce`` on checked arguments (``wire`` as :func:`.low_precision.wire` made it)."""
    if _is_compiling() or not _plain_eager(tensor):
        _ops().all_reduce_(tensor, op, groups.name(group), wire, mode)
    else:
        _team(group).all_reduce(tensor, op, low_precision.chosen(wire, tensor.dtype, op))
    return tensor


def reduce_scatter(output: torch.Tensor, data: torch.Tensor, op: str, group: Optional[dist.ProcessGroup],
                   wire: str) -> torch.Tensor:
    """``shmem_reduce_scatter`` on checked arguments."""
    if _is_compiling() or not _plain_eager(data):
        _ops().reduce_scatter_(output, data, op, groups.name(group), wire)
    else:
        _team(group).reduce_scatter(output, data, op, low_precision.chosen(wire, data.dtype, op))
    return output


def all_to_all(sends: list, receive: torch.Tensor, counts: list, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """``shmem_alltoall`` on checked arguments."""
    if _is_compiling() or not _plain_eager(*sends):
        _ops().all_to_all_(receive, sends, counts, groups.name(group))
    else:
        _team(group).all_to_all([_bytes(t) for t in sends], receive, counts)
    return receive


def moe(direction: str, output: torch.Tensor, data: torch.Tensor, in_splits: torch.Tensor,
        in_offsets: Optional[torch.Tensor], out_table: torch.Tensor, group: Optional[dist.ProcessGroup],
        major_align: int, wire: str) -> torch.Tensor:
    """``shmem_moe_dispatch`` / ``shmem_moe_combine`` on checked arguments (``wire``: :data:`.low_precision.FULL`
    or a wire format's name)."""
    if _is_compiling() or not _plain_eager(data, in_splits, out_table):
        _ops().moe_exchange_(output, out_table, data, in_splits, in_offsets, direction, major_align,
                             groups.name(group), wire)
    else:
        _moe(_team(group), direction, output, data, in_splits, in_offsets, out_table, major_align, wire, "forward")
    return output


def send(tensor: torch.Tensor, dst: int, group: Optional[dist.ProcessGroup]) -> Optional[torch.Tensor]:
    """``shmem_send`` on checked arguments: None, or the gradient's token when ``tensor`` requires grad."""
    if _is_compiling() or not _plain_eager(tensor):
        token = _ops().send(tensor, dst, groups.name(group))
        return token if tensors.tracks(tensor) else None
    _send(tensor, dst, group)
    return None


def recv(tensor: torch.Tensor, src: int, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """``shmem_recv`` on checked arguments: ``tensor``, or a new tensor in the graph when ``tensor`` requires grad."""
    if tensors.tracks(tensor):
        if not tensor.is_leaf:
            raise ShmemValueError("`tensor` must be a leaf (a receive buffer made with requires_grad=True) when it "
                                  f"requires grad, but got the output of {type(tensor.grad_fn).__name__}")
        received = _ops().recv(tensor, src, groups.name(group))
        with torch.no_grad():
            tensor.copy_(received)
        return received
    if _is_compiling() or not _plain_eager(tensor):
        _ops().recv_(tensor, src, groups.name(group))
    else:
        _recv(tensor, src, group)
    return tensor


# --------------------------------------------------------------------------
# The collectives below autograd, in full precision: the gradient table's (they run through the operators, so that
# a compiled backward traces them).
# --------------------------------------------------------------------------


def all_gather_into(output: torch.Tensor, data: torch.Tensor, group: Optional[dist.ProcessGroup],
                    role: str) -> torch.Tensor:
    """all_gather of ``data`` into ``output``, below autograd, with ``role`` (the gradient table's: "backward")."""
    _ops().all_gather_(output, data, groups.name(group), role)
    return output


def reduce_scatter_into(output: torch.Tensor, data: torch.Tensor, op: str, group: Optional[dist.ProcessGroup],
                        role: str) -> torch.Tensor:
    """reduce_scatter of ``data`` into ``output`` with ``op``, below autograd, in full precision."""
    _ops().reduce_scatter_(output, data, op, groups.name(group), low_precision.FULL, role)
    return output


def all_reduce_into(tensor: torch.Tensor, op: str, group: Optional[dist.ProcessGroup], role: str) -> torch.Tensor:
    """all_reduce of ``tensor`` in place with ``op``, below autograd, in full precision."""
    _ops().all_reduce_(tensor, op, groups.name(group), low_precision.FULL, "allreduce", role)
    return tensor


def all_to_all_into(sends: list, receive: torch.Tensor, counts: list, group: Optional[dist.ProcessGroup],
                    role: str) -> torch.Tensor:
    """all_to_all of ``sends`` into ``receive``, below autograd."""
    _ops().all_to_all_(receive, list(sends), list(counts), groups.name(group), role)
    return receive


def moe_into(output: torch.Tensor, data: torch.Tensor, in_splits: torch.Tensor, in_offsets: Optional[torch.Tensor],
             out_table: torch.Tensor, direction: str, major_align: int, group: Optional[dist.ProcessGroup],
             role: str) -> torch.Tensor:
    """MoE dispatch or combine of ``data`` into ``output``, below autograd, in full precision."""
    _ops().moe_exchange_(output, out_table, data, in_splits, in_offsets, direction, major_align, groups.name(group),
                         low_precision.FULL, role)
    return output


# --------------------------------------------------------------------------
# The operators' implementations (:mod:`.ops`): the group by name, then the team. Their arguments were checked by
# the user API (or come from a backward pass, whose arguments the forward's were).
# --------------------------------------------------------------------------


def _all_gather_op(output: torch.Tensor, input: torch.Tensor, group_name: str, role: str = "forward") -> None:
    _team(groups.resolve(group_name)).all_gather(output, input, role)


def _all_reduce_op(tensor: torch.Tensor, op: str, group_name: str, low_precision_dtype: str, backward: str,
                   role: str = "forward") -> None:
    del backward  # autograd's (the kernel in .autograd)
    _team(groups.resolve(group_name)).all_reduce(tensor, op, low_precision.chosen(low_precision_dtype, tensor.dtype,
                                                                                  op), role=role)


def _reduce_scatter_op(output: torch.Tensor, input: torch.Tensor, op: str, group_name: str,
                       low_precision_dtype: str, role: str = "forward") -> None:
    _team(groups.resolve(group_name)).reduce_scatter(output, input, op,
                                                     low_precision.chosen(low_precision_dtype, input.dtype, op), role)


def _all_to_all_op(receive: torch.Tensor, sends: list, receive_counts: list, group_name: str,
                   role: str = "forward") -> None:
    _team(groups.resolve(group_name)).all_to_all([_bytes(t) for t in sends], receive, list(receive_counts), role)


def _moe_exchange_op(output: torch.Tensor, out_table: torch.Tensor, input: torch.Tensor, in_splits: torch.Tensor,
                     in_offsets: Optional[torch.Tensor], direction: str, major_align: int, group_name: str,
                     low_precision_dtype: str, role: str = "forward") -> None:
    _moe(_team(groups.resolve(group_name)), direction, output, input, in_splits, in_offsets, out_table, major_align,
         low_precision_dtype, role)


def _moe(team: shmem.Team, direction: str, output: torch.Tensor, data: torch.Tensor, in_splits: torch.Tensor,
         in_offsets: Optional[torch.Tensor], out_table: torch.Tensor, major_align: int, wire: str, role: str) -> None:
    """One exchange on ``team``: the rows as they are, or encoded in the wire format ``wire`` (a name; the runtime
    raises before anything is written, so ``output`` keeps its values when the exchange fails)."""
    experts = in_splits.numel() // team.size
    if wire in (low_precision.FULL, low_precision.DEFAULT) or team.size == 1:
        team.moe_exchange(direction, data, output, in_splits, in_offsets, out_table, experts, major_align, role)
        return
    # Encoded and decoded by the runtime's device on the current stream, where the rows are (an NPU's stay on it).
    # Rows no chunk lands in (dispatch's alignment padding) decode to zeros.
    rows = data.detach().contiguous()
    row_bytes = codec.wire_row_bytes(wire, rows.shape[1:].numel())
    send = torch.empty((rows.shape[0], row_bytes), dtype=torch.uint8, device=rows.device)
    codec.encode_rows_on_device(rows, send, wire)
    receive = torch.zeros((output.shape[0], row_bytes), dtype=torch.uint8, device=output.device)
    team.moe_exchange(direction, send, receive, in_splits, in_offsets, out_table, experts, major_align, role)
    decoded = output if output.is_contiguous() else torch.empty(output.shape, dtype=output.dtype, device=output.device)
    codec.decode_rows_on_device(receive, wire, decoded)
    if decoded is not output:
        output.copy_(decoded)


def _send_op(tensor: torch.Tensor, dst: int, group_name: str) -> torch.Tensor:
    """The operator ``send``; returns the gradient's token, a zero scalar."""
    _send(tensor, dst, groups.resolve(group_name))
    return tensor.new_zeros(())


def _recv_op(tensor: torch.Tensor, src: int, group_name: str) -> None:
    _recv(tensor, src, groups.resolve(group_name))


def _recv_new_op(like: torch.Tensor, src: int, group_name: str) -> torch.Tensor:
    """The operator ``recv``: the message in a new tensor like ``like``."""
    out = torch.empty_like(like)
    _recv(out, src, groups.resolve(group_name))
    return out


def _send(tensor: torch.Tensor, dst: int, group: Optional[dist.ProcessGroup]) -> None:
    """send to group rank ``dst`` over the group's team (it must exist: point to point cannot make one)."""
    team = context.registered_team(group, "shmem_send")
    team.send(_bytes(tensor), checks.peer(dst, "dst_rank", team.size, team.rank))


def _recv(tensor: torch.Tensor, src: int, group: Optional[dist.ProcessGroup]) -> None:
    """recv from group rank ``src`` over the group's team (it must exist)."""
    team = context.registered_team(group, "shmem_recv")
    team.recv(_bytes(tensor), checks.peer(src, "src_rank", team.size, team.rank))
