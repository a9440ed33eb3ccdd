"""Teams: ranks of the root that run collectives together, each collective one call into the runtime's engine.

A :class:`Team` is made collectively from a ProcessGroup inside the root (every member calls ``Team(group)`` in the
same order). It owns a slot of the runtime's team pool (a workspace laid out once) and the epoch protocol that keeps
its members in step. Every collective's first sync carries a fingerprint of the call (collective, dtype, element
count, reduce op, wire format, peer): members that disagree all raise :class:`ShmemMismatchError` naming both calls,
before any data moves, and the team stays usable. Creation is bounded by ``HYPER_PARALLEL_SHMEM_TIMEOUT_SEC`` and
names the ranks that did not arrive. :meth:`Team.release` is local and never waits; its slot is reused once every
member has released it (64 teams may live at once besides the root's).

A team whose members live on several nodes (machines that do not share memory) runs each collective hierarchically:
node-local phases in the engine, one phase across nodes over the runtime's transport to other nodes, or over
torch.distributed where the runtime has none (``_hierarchy``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Optional

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore.shmem._binding import C
from hyper_parallel.core.multicore.shmem._lifecycle import _bootstrap, _local_bootstrap, require_root
from hyper_parallel.core.multicore.shmem._streams import current_handle
from hyper_parallel.core.multicore.errors import (
    ShmemStateError,
    ShmemTimeoutError,
    attach_fields,
    project_code,
)

if TYPE_CHECKING:
    from hyper_parallel.core.multicore.hierarchy import Hierarchy

# The numberings are the runtime's (runtime/team.h, ops/reduce_op.h, runtime/status.h): exported once, never retyped.
COLLECTIVES: dict = dict(C.collectives())
REDUCE_OPS: dict = dict(C.reduce_ops())
#: A fingerprint's wire format: "full", or a low-precision dtype's name.
WIRE_FORMATS: dict = dict(C.wire_formats())
_STATUS_CODES: dict = dict(C.status_codes())


class _Roles(dict):
    """The call roles by name (runtime/team.h's CallRole); an unknown name is a broken contract, not a KeyError."""

    def __missing__(self, role: object) -> int:
        raise ValueError(f"`role` must be one of {', '.join(map(repr, self))}, but got {role!r}")


#: What a call is for, in its fingerprint: "forward", "backward" (a gradient's collective), "fused_gather" and
#: "fused_scatter" (a fused op's own syncs). Calls of different roles never pair: every member raises
#: ShmemMismatchError naming the role.
CALL_ROLES: dict = _Roles(C.call_roles())


class Team:
    """A team of PEs over a ProcessGroup inside the root (collective over the group to make).

    Every collective takes a ``role`` (a name of :data:`CALL_ROLES`, "forward" by default) that enters its
    fingerprint: a gradient's collective ("backward") never pairs with a forward one. A check of the caller's that
    fails once the team is known is refused through the team (:meth:`refuse`), so that every member fails the call
    alike.

    Args:
        group: a ProcessGroup whose ranks all lie in the root, or None for the root itself.

    Raises:
        ValueError: the group does not contain this rank, has ranks outside the root, or spans nodes with different
            numbers of its ranks on them.
        ShmemStateError: no runtime, every team slot is taken, or the root team was not made first.
        ShmemTimeoutError: a member did not arrive in time (the message names it).
    """

    def __init__(self, group: Optional[dist.ProcessGroup] = None) -> None:
        root = require_root("team_create")
        if group is None or group is dist.group.WORLD and root.group is dist.group.WORLD:
            pes = tuple(range(len(root.ranks)))
            me = root.rank
            group = root.group
            bootstrap = _local_bootstrap() if root.group is None else _bootstrap(root.group, "team_create")
        else:
            if group is dist.GroupMember.NON_GROUP_MEMBER or not isinstance(group, dist.ProcessGroup):
                raise ValueError(f"`group` must be a ProcessGroup containing this rank, but got {group!r}")
            ranks = dist.get_process_group_ranks(group)
            outside = [r for r in ranks if r not in root.ranks]
            if outside:
                raise ValueError(f"`group` must lie inside the SHMEM root {list(root.ranks)}, but got ranks {list(ranks)}")
            pes = tuple(root.ranks.index(r) for r in ranks)
            me = dist.get_rank(group)
            bootstrap = _bootstrap(group, "team_create")
        #: The node of each member (numbered by its lowest PE): a team on several nodes runs hierarchically.
        self.nodes = tuple(root.nodes[pe] for pe in pes)
        self._hierarchy: Optional[Hierarchy] = None
        try:
            # Every member arrives (bounded, naming who does not come) and learns the first member's random word.
            offers = bootstrap[0](os.urandom(4))
            if isinstance(offers, str):
                raise ShmemTimeoutError(offers)
            if len(set(self.nodes)) > 1:
                # numpy, which the phases across nodes work on, is imported only by a team that spans nodes.
                from hyper_parallel.core.multicore.shmem._hierarchy import make_hierarchy

                self._hierarchy = make_hierarchy(group, pes, me, root, int.from_bytes(offers[:4], "little"))
                self._id = self._hierarchy.engine.node_team
            else:
                self._id = C.team_create(list(pes), me, *bootstrap)
        except Exception as error:
            attach_fields(error, "team_create")
            raise
        self.pes = pes
        self.rank = me
        self.size = len(pes)
        self._released = False

    @property
    def id(self) -> int:
        """The runtime's number of the team (of this node's part, for a team that spans nodes), which native
        handlers pass to the runtime's team calls (torch's symm_mem backend)."""
        return self._id

    @property
    def spans_nodes(self) -> bool:
        """Whether the members live on more than one node (the collectives then run hierarchically)."""
        return self._hierarchy is not None

    @property
    def link_across_nodes(self) -> Optional[str]:
        """What carries the phase across nodes of a team that spans nodes: the runtime's transport to other nodes
        (``"ucx"``, as ``debug_state()["transports"]`` names it) or the team's ProcessGroup (``"gloo"``); None for a
        team within one node."""
        return None if self._hierarchy is None else self._hierarchy.link.name

    def __repr__(self) -> str:
        return f"Team(pes={list(self.pes)}, rank={self.rank}{', released' if self._released else ''})"

    def release(self) -> None:
        """Lets go of the team on this rank (local, never waits; idempotent). Later calls on it raise."""
        if self._released:
            return
        self._released = True
        if self._hierarchy is not None:
            self._hierarchy.release()
            return
        if C.state() == "initialized":
            try:
                C.team_release(self._id)
            except Exception:  # its lifecycle already ended: nothing of it is left to release
                pass

    def _call(self, name: str, fn, *args, role: int):
        """The binding's ``fn(team, *args, stream, role)`` on the current stream; its errors get upstream's fields."""
        try:
            return fn(self._id, *args, current_handle(), role)
        except Exception as error:
            attach_fields(error, name)
            raise

    def barrier(self, role: str = "forward") -> None:
        """Every member arrives; everything enqueued before it is visible to every member (``role``: what the
        barrier is for, a name of :data:`CALL_ROLES`)."""
        if self._hierarchy is not None:
            return self._spanning("team_barrier", self._hierarchy.barrier, _role(role))
        self._call("team_barrier", C.team_barrier, role=CALL_ROLES[role])

    def _spanning(self, name: str, fn, *args):
        """Runs a collective of a team that spans nodes (its phases call the runtime and torch.distributed)."""
        try:
            if self._released:
                raise ShmemStateError(f"team is not live: op={name} team_ranks={list(self.pes)} (it was released)")
            return fn(*args)
        except Exception as error:
            attach_fields(error, name)
            raise

    # The collectives and send/recv call the binding directly (not through _call): they sit on the small-message
    # path.

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, role: str = "forward") -> None:
        """``output`` (size x input's bytes) receives member r's ``input`` at r x its bytes.

        ``input`` may be this member's part of ``output``. The same symmetric ``output`` (or ``input``) on every
        member takes the copy-free path. ``role``: what the call is for (:data:`CALL_ROLES`).
        """
        if self._hierarchy is not None:
            return self._spanning("all_gather", self._hierarchy.all_gather, output, input, _role(role))
        try:
            C.all_gather(self._id, output, input, current_handle(), CALL_ROLES[role])
        except Exception as error:
            attach_fields(error, "all_gather")
            raise

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", wire: Optional[torch.dtype | str] = None, *,
                   input: Optional[torch.Tensor] = None, role: str = "forward") -> None:
        """Reduces ``tensor`` in place ('sum', 'avg', 'max', 'min'), or ``input`` into ``tensor``; every member ends
        with bit-identical values.

        Out of place, nothing is copied first: each member reduces its part straight out of the members' inputs
        (like ``torch.ops.symm_mem.two_shot_all_reduce_out``), and ``input`` is left as it was.

        Args:
            tensor: the tensor to reduce in place, or the output.
            op: the reduction.
            wire: a low-precision dtype of :data:`WIRE_FORMATS` (or its name) that the values travel in ('sum' and
                'avg' of a floating-point tensor wider than it; summed in the tensor's precision), or None for its own
                dtype.
            input: None (in place), or a tensor of ``tensor``'s dtype and size, not overlapping it, whose values are
                reduced into ``tensor``.
            role: what the call is for, a name of :data:`CALL_ROLES` ("backward" for a gradient's all_reduce).

        Raises:
            ShmemMismatchError: members disagree on the call (wire format and role included).
            ShmemTimeoutError: a member did not arrive in time.
            ValueError: a wire format that cannot carry the reduction; an ``input`` of another size, or one that
                overlaps ``tensor``.
            TypeError: an ``input`` of another dtype.
            ShmemDeviceError: a wire format the device cannot encode.
        """
        number = REDUCE_OPS.get(op) if type(op) is str else None
        if self._hierarchy is not None:
            return self._spanning("all_reduce", self._hierarchy.all_reduce, tensor, _op_name(op), _wire_name(wire),
                                  input, _role(role))
        try:
            C.all_reduce(self._id, tensor, input, _reduce_op(op) if number is None else number, current_handle(),
                         0 if wire is None else _wire(wire), CALL_ROLES[role])
        except Exception as error:
            attach_fields(error, "all_reduce")
            raise

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: str = "sum",
                       wire: Optional[torch.dtype | str] = None, role: str = "forward") -> None:
        """``output`` receives part ``rank`` of ``input`` reduced across the members (``wire`` and ``role`` as in
        :meth:`all_reduce`)."""
        number = REDUCE_OPS.get(op) if type(op) is str else None
        if self._hierarchy is not None:
            return self._spanning("reduce_scatter", self._hierarchy.reduce_scatter, output, input, _op_name(op),
                                  _wire_name(wire), _role(role))
        try:
            C.reduce_scatter(self._id, output, input, _reduce_op(op) if number is None else number, current_handle(),
                             0 if wire is None else _wire(wire), CALL_ROLES[role])
        except Exception as error:
            attach_fields(error, "reduce_scatter")
            raise

    def all_to_all(self, sends: Sequence[torch.Tensor], receive: torch.Tensor, receive_counts: Sequence[int],
                   role: str = "forward") -> None:
        """``sends[j]`` goes to member j; ``receive`` gets member i's part after the counts of members < i
        (elements of ``receive``'s dtype). The counts are checked across members before anything is written.
        ``role``: what the call is for (:data:`CALL_ROLES`)."""
        # The binding takes lists and tuples as they are.
        sends = sends if type(sends) in (list, tuple) else list(sends)
        receive_counts = receive_counts if type(receive_counts) in (list, tuple) else list(receive_counts)
        if self._hierarchy is not None:
            return self._spanning("all_to_all", self._hierarchy.all_to_all, sends, receive, receive_counts,
                                  _role(role))
        try:
            C.all_to_all(self._id, sends, receive, receive_counts, current_handle(), CALL_ROLES[role])
        except Exception as error:
            attach_fields(error, "all_to_all")
            raise

    def moe_exchange(self, direction: str, input: torch.Tensor, output: torch.Tensor, in_splits: torch.Tensor,
                     in_offsets: Optional[torch.Tensor], out_splits_offsets: torch.Tensor, experts: int,
                     major_align: int = 0, role: str = "forward") -> None:
        """MoE dispatch or combine of ``input``'s rows (dim 0) into ``output`` (``runtime/collectives/moe.h``).

        Args:
            direction: "dispatch" (rank-major ``input`` to expert-major ``output``) or "combine" (the reverse).
            input: the rows to send; output: the rows received, laid out as the direction says.
            in_splits: the member-by-expert int64 split table (group size x ``experts`` values).
            in_offsets: where each chunk starts in ``input`` (int64, like ``in_splits``), or None: packed in order.
            out_splits_offsets: 2 x (group size x ``experts``) int64, receiving the splits and offsets of ``output``.
            experts: experts per member.
            major_align: dispatch: each expert's region starts at a multiple of this many rows (0: packed).
            role: what the call is for (:data:`CALL_ROLES`).

        Raises:
            ValueError: on every member, the same, before anything is written: bad splits, or an ``output`` too
                small for what the peers send (naming the rank, the expert and both sizes).
        """
        if direction not in ("dispatch", "combine"):
            raise ValueError(f"`direction` must be 'dispatch' or 'combine', but got {direction!r}")
        if self._hierarchy is not None:
            return self._spanning("moe_" + direction, self._hierarchy.moe, direction, input, _rows(input), output,
                                  _rows(output), in_splits, in_offsets, out_splits_offsets, experts, major_align,
                                  _role(role))
        try:
            C.moe_exchange(self._id, 0 if direction == "dispatch" else 1, input, output, in_splits, in_offsets,
                           out_splits_offsets, experts, major_align, current_handle(), CALL_ROLES[role])
        except Exception as error:
            attach_fields(error, "moe_" + direction)
            raise

    def send(self, tensor: torch.Tensor, peer: int) -> None:
        """Sends ``tensor`` to member ``peer`` (point to point; messages arrive in order)."""
        if self._hierarchy is not None:
            return self._spanning("send", self._hierarchy.send, tensor, _member(peer, self.size, self.rank))
        try:
            C.send(self._id, tensor, peer, current_handle())
        except Exception as error:
            attach_fields(error, "send")
            raise

    def recv(self, tensor: torch.Tensor, peer: int) -> None:
        """Receives the next message of member ``peer`` into ``tensor`` (of the message's byte size)."""
        if self._hierarchy is not None:
            return self._spanning("recv", self._hierarchy.recv, tensor, _member(peer, self.size, self.rank))
        try:
            C.recv(self._id, tensor, peer, current_handle())
        except Exception as error:
            attach_fields(error, "recv")
            raise

    def agree(self, collective: str, values: Sequence[int] = (), dtype: Optional[torch.dtype] = None, count: int = 0,
              op: Optional[str] = None, wire: Optional[torch.dtype] = None, peer: int = -1,
              role: str = "forward") -> list:
        """A fingerprinted sync for algorithms written over the primitives: every member's ``values`` (at most
        2 x the largest node's size + 1 ints), after checking that every member makes the same call.

        Args:
            collective: a name of :data:`COLLECTIVES`.
            values: what this member publishes.
            dtype, count, op: the call's element type, element count and reduce op ('sum', 'avg', 'max', 'min').
            wire: the low-precision dtype the data travels in (None: the tensor's own).
            peer: the call's root or peer, -1 for none.
            role: what the call is for, a name of :data:`CALL_ROLES` (a fused op's phase: "fused_gather",
                "fused_scatter").

        Returns:
            Every member's ``values``, in group-rank order.

        Raises:
            ShmemMismatchError: members disagree on the call (every member raises).
            ShmemTimeoutError: a member did not arrive in time.
        """
        dtype_name = "" if dtype is None else str(dtype).replace("torch.", "")
        if self._hierarchy is not None:
            return self._spanning("agree", self._hierarchy.agree, _collective(collective), dtype_name,
                                  0 if dtype is None else dtype.itemsize, count, None if op is None else _op_name(op),
                                  _wire_name(wire), peer, list(values), _role(role))
        return self._call("agree", C.agree, COLLECTIVES[collective], dtype_name,
                          0 if dtype is None else dtype.itemsize, count, 0 if op is None else REDUCE_OPS[op] + 1,
                          _wire(wire), peer, list(values), role=CALL_ROLES[role])

    def refuse(self, collective: str, error: BaseException, role: str = "forward") -> None:
        """Refuses this member's call of ``collective`` for ``error``, a check of the caller's that failed once the
        team was known (a rank-local fact: an address, an overlap, a freed tensor, a destroyed group): the member
        still enters the call's first sync, with the refusal, and every member fails the call alike.

        Args:
            collective: the call refused, a name of :data:`COLLECTIVES`.
            error: the failed check (a ShmemValueError, ShmemTypeError or ShmemStateError, or a ValueError or
                TypeError); its class and message are what every member raises.
            role: the call's role (:data:`CALL_ROLES`).

        Raises:
            The class of ``error``'s status on every member (ShmemValueError, ShmemTypeError, ShmemStateError),
            with ``error``'s message and the refusing rank: "... (refused by rank R: op=... team_ranks=[...]; every
            member fails this call)"; on a team that spans nodes, its node team's words, naming the whole team and
            then the refusing node's members ("team_ranks=[0,1,2,3] node_team_ranks=[0,1]"). ``error`` itself when
            the team runs no call any more (nobody waits for it).
        """
        if self._hierarchy is not None:
            return self._spanning(collective, self._hierarchy.refuse, _collective(collective), error, _role(role))
        if self._released:
            raise error
        self._call(collective, C.refuse, COLLECTIVES[collective], _STATUS_CODES[project_code(error)], str(error),
                   role=CALL_ROLES[role])
        raise error   # not reached: a refusal always raises


def _member(peer: object, size: int, me: int) -> int:
    """A send's or recv's peer: another member's group rank."""
    if type(peer) is not int or not 0 <= peer < size or peer == me:
        raise ValueError(f"`peer` must be another group rank in [0, {size}) than this one ({me}), but got {peer!r}")
    return peer


def _reduce_op(op: object) -> int:
    number = REDUCE_OPS.get(op) if isinstance(op, str) else None
    if number is None:
        raise ValueError(f"`op` must be one of {', '.join(REDUCE_OPS)}, but got {op!r}")
    return number


def _wire(wire: Optional[object]) -> int:
    """A wire format as the runtime numbers it (0: the tensor's own dtype), from a low-precision dtype or its name."""
    if wire is None:
        return 0
    name = wire if type(wire) is str else str(wire).replace("torch.", "") if isinstance(wire, torch.dtype) else None
    number = WIRE_FORMATS.get(name) if name else None
    if not number:
        names = ", ".join(name for name in WIRE_FORMATS if name != "full")
        raise ValueError(f"`wire` must be one of {names} or None, but got {wire!r}")
    return number


def _wire_name(wire: Optional[object]) -> Optional[str]:
    """A wire format's name (None: the tensor's own dtype), from a low-precision dtype or its name."""
    number = _wire(wire)
    return None if number == 0 else next(name for name, n in WIRE_FORMATS.items() if n == number)


def _rows(tensor: object) -> int:
    """A tensor's rows (dim 0), 0 for what has none (the phases refuse its size then)."""
    return tensor.size(0) if isinstance(tensor, torch.Tensor) and tensor.dim() > 0 else 0


def _op_name(op: object) -> str:
    """A checked reduce op's name."""
    _reduce_op(op)
    return str(op)


def _role(role: str) -> str:
    """A checked call role's name."""
    CALL_ROLES[role]
    return role


def _collective(collective: str) -> str:
    """A checked collective's name."""
    if collective not in COLLECTIVES:
        raise ValueError(f"`collective` must be one of {', '.join(COLLECTIVES)}, but got {collective!r}")
    return collective


#: Whether a call on these tensors may skip torch's dispatcher: plain tensors (no subclass), nothing autograd
#: would record, no dispatch mode (fake tensors) and no torch.func transform active (one C++ call).
plain_eager = C.plain_eager

_root_team: Optional[Team] = None
_root_team_lifecycle = -1


def root_team() -> Team:
    """The team of every PE of the root, made on first use in each lifecycle (collective over the root then).

    Raises:
        ShmemStateError: no runtime is active.
    """
    global _root_team, _root_team_lifecycle
    root = require_root("team_create")
    if _root_team is None or _root_team_lifecycle != root.lifecycle:
        _root_team = Team(None)
        _root_team_lifecycle = root.lifecycle
    return _root_team
