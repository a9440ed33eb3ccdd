"""Teams that span nodes: every collective as node-local phases in the runtime's engine and one phase across nodes.

Symmetric memory is node-local on the host device: each node maps its own ranks' heaps only. A team whose members
live on several nodes therefore runs each collective in phases. The node-local phases are single calls into the
runtime's engine, on the team's *node team*: the members on this node. The phase across nodes runs point to point
(over a *link*, below), on *lanes*. Lane i is the i-th member of every node (members ordered by group rank): each
member exchanges only with its lane, so every member of a node carries its share of the traffic in parallel, as
NCCL's and DeepEP's hierarchical algorithms do:

====================  =====================================================================================
all_reduce            node reduce_scatter -> lane exchange of this member's part, reduced -> node all_gather
reduce_scatter        node reduce_scatter of the parts regrouped by lane -> lane exchange, reduced
all_gather            lane exchange -> node all_gather -> regrouped into group-rank order
all_to_all            node all_to_all (each part to the member in its receiver's lane) -> lane exchange; over the
                      runtime's link: node all_to_all of this node's parts -> one message each way with every
                      member of the other nodes, straight between the caller's tensors
barrier               node barrier -> lane exchange -> node barrier
send / recv           the engine within a node; point to point over the link across nodes
====================  =====================================================================================

Every collective first agrees on the call within the node (a fingerprinted sync of the engine). The lane exchange
then carries the call's fingerprint in a header before each payload. Members that disagree, within a node or across
nodes, all raise :class:`ShmemMismatchError`. A member whose node-local phase fails still joins the lane exchange,
so that the other nodes raise at once instead of waiting. Each receive across nodes is bounded by
``HYPER_PARALLEL_SHMEM_TIMEOUT_SEC`` and names the ranks that did not answer: a dead node is named, not waited
for. Reductions across nodes add the lane's parts in node order on every member of the lane, so every member ends
with the same bits. Low precision encodes the parts that cross nodes too (``codec``), where it saves the most.

The traffic across nodes is point to point, under two tags the members agree on when the team is made (one for
the lanes, one for send/recv), over one of two links:

- the runtime's own transport to other nodes (the host device's UCX, ``debug_state()["transports"]``), when it
  reaches every member of the other nodes: two-sided messages (``exchange_messages``) on the connections the
  one-sided calls use, which see a dead node at once;
- otherwise the team's own ProcessGroup (gloo's point to point): gloo connects every pair of a group once, so lanes
  need no groups of their own. (torch 2.13's ``new_group(use_local_synchronization=True)`` names a group after the
  number of groups each member has made so far, so groups made by the members of different teams would not meet.)

Every member of a team picks the same link: the runtime's transport connects every rank or none (agreed at init).

A team that spans nodes needs the same number of members on every node (lanes pair them up), and runs its
collectives on the calling thread: the current stream's work is waited for first.
"""

from __future__ import annotations

import time
import zlib
from datetime import timedelta
from typing import NamedTuple, Optional, Sequence, Union

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore.shmem import codec
from hyper_parallel.core.multicore.shmem._binding import C
from hyper_parallel.core.multicore.shmem._lifecycle import _bootstrap, _Root
from hyper_parallel.core.multicore.shmem._streams import DEFAULT_HANDLE, current_handle
from hyper_parallel.core.multicore.errors import (
    CLASSES_BY_CODE,
    ShmemMismatchError,
    ShmemStateError,
    ShmemTimeoutError,
    project_code,
)

_COLLECTIVES = dict(C.collectives())
_REDUCE_OPS = dict(C.reduce_ops())
_WIRE_FORMATS = dict(C.wire_formats())
_ROLES = dict(C.call_roles())
_STATUS_CODES = dict(C.status_codes())
_SUM = _REDUCE_OPS["sum"]
_AVG = _REDUCE_OPS["avg"]
_MAX = _REDUCE_OPS["max"]

# What a member says before each payload across nodes: its status, the call (collective, reduce op + 1, wire, peer,
# element count, dtype id, role), and the payload's byte count. A member whose part of the call failed says _FAILED
# and sends its error instead of a payload: its status code's name, a newline, the message.
_HEADER_WORDS = 9
_OK, _FAILED = 0, 2
_ROLE = 6   # the role's index in a call's fingerprint
# A payload up to this many bytes travels in its header's message (one message per lane peer instead of two).
_EAGER_BYTES = 64 << 10
# The tags of a team's point-to-point traffic across nodes, two per team (lanes, then send/recv), picked at random by
# the team's first member: far from the tags users give their own point-to-point calls on the group (0 by default).
_TAG_BASE = 1 << 30
_TAG_TEAMS = 1 << 28
_DTYPE_NAMES = {zlib.crc32(name.encode()): name for name in (
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int64", "int32", "int16", "int8",
    "uint8", "bool", "complex64", "complex128")}


def _dtype_id(dtype: Optional[torch.dtype]) -> int:
    return 0 if dtype is None else zlib.crc32(str(dtype).replace("torch.", "").encode())


def _describe(call: Sequence[int]) -> str:
    """A call's fingerprint as a message names it: "collective=all_reduce op=sum wire=full count=8 dtype=float32"
    (and "role=backward" for a call that is not a forward one)."""
    collective, op, wire, peer, count, dtype, role = call
    names = {number: name for name, number in _COLLECTIVES.items()}
    ops = {number + 1: name for name, number in _REDUCE_OPS.items()}
    wires = {number: name for name, number in _WIRE_FORMATS.items()}
    roles = {number: name for name, number in _ROLES.items()}
    text = f"collective={names.get(collective, collective)}"
    if op:
        text += f" op={ops.get(op, op)} wire={wires.get(wire, wire)}"
    if peer >= 0:
        text += f" peer={peer}"
    text += f" count={count} dtype={_DTYPE_NAMES.get(dtype, dtype) if dtype else 'none'}"
    return text + (f" role={roles.get(role, role)}" if role != _ROLES["forward"] else "")


def _error_payload(error: BaseException) -> torch.Tensor:
    """What a member whose part of a call failed sends its lane: the error's status code name and message."""
    return torch.frombuffer(bytearray(f"{project_code(error)}\n{error}".encode()), dtype=torch.uint8)


def _lane_error(raw: torch.Tensor) -> BaseException:
    """The error a lane member sent (:func:`_error_payload`), to raise here as it was raised there."""
    code, _, message = bytes(raw.tolist()).decode(errors="replace").partition("\n")
    return CLASSES_BY_CODE.get(code, ShmemStateError)(message)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes, as a flat uint8 view."""
    return t.reshape(-1).view(torch.uint8)


def _as(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bytes received across nodes, as a flat tensor of ``dtype``."""
    return raw.view(dtype) if raw.numel() else torch.empty(0, dtype=dtype)


def _check_tensor(value: object, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, but got {type(value).__name__}")
    if value.device.type != "cpu" or not value.is_contiguous():
        raise ValueError(f"`{name}` must be a contiguous CPU tensor, but got device={value.device} "
                         f"contiguous={value.is_contiguous()}")
    return value


def _check_avg(op: int, dtype: torch.dtype) -> None:
    if op == _AVG and not dtype.is_floating_point:
        raise ValueError(f"`op` must be sum, max or min for {str(dtype).replace('torch.', '')}, but got avg")


def reduce_in_order(parts: Sequence[torch.Tensor], op: int, divisor: int = 1) -> torch.Tensor:
    """``op`` over ``parts``, combined in their order (float16 and bfloat16 summed in float32 and rounded once;
    ``avg`` sums, then divides by ``divisor``): the same bits on every rank that reduces the same parts.

    Returns:
        A new tensor.
    """
    first = parts[0]
    if op in (_SUM, _AVG):
        widen = first.dtype in (torch.float16, torch.bfloat16)
        acc = first.float() if widen else first.clone()
        for part in parts[1:]:
            acc.add_(part.float() if widen else part)
        if op == _AVG:
            acc.div_(divisor)
        return acc.to(first.dtype) if widen else acc
    acc = first.clone()
    combine = torch.maximum if op == _MAX else torch.minimum
    for part in parts[1:]:
        combine(acc, part, out=acc)
    return acc


class NodeLayout:
    """Where a team's members live: its nodes in order, each node's members (group ranks, ascending), and this
    member's node and local index.

    Raises:
        ValueError: the nodes hold different numbers of the team's members.
    """

    def __init__(self, pes: Sequence[int], me: int, nodes_of_pes: Sequence[int]) -> None:
        by_node: dict = {}
        for group_rank, pe in enumerate(pes):
            by_node.setdefault(nodes_of_pes[pe], []).append(group_rank)
        self.members = tuple(tuple(by_node[node]) for node in sorted(by_node))
        sizes = {len(members) for members in self.members}
        if len(sizes) != 1:
            counts = {f"node{sorted(by_node)[k]}": len(m) for k, m in enumerate(self.members)}
            raise ValueError(f"`group` must have the same number of ranks on every node it spans, but got "
                             f"{counts} (group ranks by node: {[list(m) for m in self.members]})")
        self.count = len(self.members)  # nodes
        self.per_node = len(self.members[0])  # members of each node
        self.node, self.local = next((k, i) for k, members in enumerate(self.members)
                                     for i, g in enumerate(members) if g == me)
        self.lane = tuple(members[self.local] for members in self.members)  # group rank of this lane on each node
        # Group ranks in (local index, node) order: the order of the blocks a node-local phase moves.
        self.lane_major = tuple(self.members[k][i] for i in range(self.per_node) for k in range(self.count))
        self.position = {g: (k, i) for k, members in enumerate(self.members) for i, g in enumerate(members)}


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


class _Transfer(NamedTuple):
    """One member's part of a link's transfer: ``send`` to group rank ``member`` and its message into ``receive``
    (either may be None); a failure is reported under ``key``. ``send_first``: see :meth:`_GroupLink.transfer`."""

    key: int
    member: int
    send: Optional[torch.Tensor]
    receive: Optional[torch.Tensor]
    send_first: Optional[bool] = None


class _GroupLink:
    """Transfers across nodes over the team's ProcessGroup: gloo's point to point, between global ranks."""

    name = "gloo"

    def __init__(self, group: dist.ProcessGroup, global_ranks: Sequence[int]) -> None:
        self._group = group
        self._global = global_ranks

    def transfer(self, tag: int, transfers: Sequence[_Transfer], deadline: float) -> dict:
        """Each transfer in turn, in the given order: its send and receive posted at once, or one after the other
        (``send_first`` True or False: on gloo a send that finds its receive posted is a single hand-off), each waited
        for until the deadline.

        Returns:
            The failures: the first line of gloo's message (gloo refuses to post on a connection it saw close) or of
            the timeout, by the transfer's key.
        """
        failures = {}
        for item in transfers:
            rank = self._global[item.member]
            posts = []
            if item.send is not None:
                posts.append(lambda: dist.isend(item.send, dst=rank, group=self._group, tag=tag))
            if item.receive is not None:
                posts.append(lambda: dist.irecv(item.receive, src=rank, group=self._group, tag=tag))
            if item.send_first is False:
                posts.reverse()
            steps = [posts] if item.send_first is None else [[post] for post in posts]
            try:
                for step in steps:
                    for work in [post() for post in step]:
                        work.wait(timeout=timedelta(seconds=max(deadline - time.monotonic(), 0.05)))
            except RuntimeError as error:
                failures[item.key] = _first_line(error)
        return failures


class _RuntimeLink:
    """Transfers across nodes over the runtime's own transport (``C.exchange_messages``), between PEs: every
    transfer of a call posted at once (they overlap on the wire), all completed within the runtime's timeout; a
    member whose connection broke fails at once."""

    def __init__(self, name: str, pes: Sequence[int]) -> None:
        self.name = name
        self._pes = pes

    def transfer(self, tag: int, transfers: Sequence[_Transfer], deadline: float) -> dict:
        """As :meth:`_GroupLink.transfer`, but all at once; the deadline is the transport's own (one timeout)."""
        del deadline
        if not transfers:
            return {}
        try:
            outcomes = C.exchange_messages(tag, [(self._pes[item.member], item.send, item.receive)
                                                 for item in transfers])
        except RuntimeError as error:  # refused before anything was sent: every transfer failed
            return {item.key: _first_line(error) for item in transfers}
        return {item.key: failure.splitlines()[0] for item, (_, failure) in zip(transfers, outcomes) if failure}


def _link(group: dist.ProcessGroup, pes: Sequence[int], global_ranks: Sequence[int],
          root: _Root) -> Union[_GroupLink, _RuntimeLink]:
    """The runtime's transport where it reaches every member of the other nodes, else the ProcessGroup."""
    transport = root.remote_transport(pes)
    return _GroupLink(group, global_ranks) if transport is None else _RuntimeLink(transport, pes)


class Hierarchy:
    """The parts of a team that spans nodes: its node team (a runtime team of this node's members) and its lane.

    Collective over the team's members to make (they call it in the same order).

    Args:
        group: the team's ProcessGroup (the root's for the root team).
        pes: the PE of every group rank.
        me: this member's group rank.
        root: the active root.
        word: a random word every member received from the first (it picks the team's tags).

    Raises:
        ValueError: the nodes hold different numbers of the team's members.
        ShmemTimeoutError: a member did not arrive in time.
    """

    def __init__(self, group: dist.ProcessGroup, pes: Sequence[int], me: int, root: _Root, word: int) -> None:
        self.layout = layout = NodeLayout(pes, me, root.nodes)
        self.size = len(pes)
        self._timeout_sec = C.read_config()["timeout_sec"]
        self._tag = _TAG_BASE + 2 * (word % _TAG_TEAMS)
        node_members = layout.members[layout.node]
        all_gather, barrier = _bootstrap(group, "team_create", members=node_members)
        self.node_team = C.team_create([pes[g] for g in node_members], layout.local, all_gather, barrier)
        self._global = tuple(root.ranks[pe] for pe in pes)  # global rank of each group rank
        self.link = _link(group, tuple(pes), self._global, root)
        self.broken = ""

    def release(self) -> None:
        """Lets go of the node team (local, never waits)."""
        self.broken = self.broken or "the team was released"
        if C.state() == "initialized":
            try:
                C.team_release(self.node_team)
            except Exception:  # its lifecycle already ended: nothing of it is left to release
                pass

    # ---- the phase across nodes ----------------------------------------------------------------------------------

    def _begin(self, op: str) -> None:
        if self.broken:
            raise ShmemStateError(f"team cannot be used after a failure across nodes: op={op} cause={self.broken}")
        handle = current_handle()
        if handle != DEFAULT_HANDLE:
            C.synchronize_stream(handle)  # the phases run on this thread, after the stream's work

    def _raise_missing(self, missing: dict, members: Sequence[int], op: str, give_up: bool) -> None:
        """Raises, naming the members (``members[index]`` for each index ``missing``) that did not answer, if any;
        the team is broken from then on.

        With ``give_up``, this member also gives up its node team's next sync, naming them: a node-mate waiting there
        (or arriving there with its next call) fails at once with that message, instead of waiting the whole timeout
        for this member and then naming it.
        """
        if missing:
            ranks = sorted(self._global[members[index]] for index in missing)
            first = next(iter(missing.values()))
            self.broken = (f"cross-node phase failed: op={op} missing_ranks={ranks} "
                           f"timeout_sec={self._timeout_sec:g} ({self.link.name}: {first})")
            if give_up:
                C.give_up(self.node_team, self.broken)
            raise ShmemTimeoutError(self.broken)

    def exchange(self, op: str, call: tuple, sends: Sequence[Optional[torch.Tensor]], status: int = _OK,
                 into: Optional[Sequence[Optional[torch.Tensor]]] = None,
                 peers: Optional[Sequence[int]] = None) -> list:
        """Sends ``sends[k]`` to this lane's member on node k and receives one payload from each of them (or, with
        ``peers``, to and from member ``peers[k]``).

        Args:
            op: the operation, for messages.
            call: the call's fingerprint (collective, reduce op + 1, wire, peer, element count, dtype id, role).
            sends: per node (per entry of ``peers``), a contiguous tensor (its bytes travel) or None (nothing); the
                entries of this node's members are unused.
            status: _OK, or _FAILED: this member's part of the call failed, and ``sends`` holds its error
                (:func:`_error_payload`).
            into: per node (per entry of ``peers``), a flat uint8 tensor for its payload where the caller knows its
                size (a payload of that size lands there), or None.
            peers: group ranks, ascending: the members to exchange with, those of this node skipped (every member of
                the other nodes: each pair meets once, in the same order on both sides). None: this lane.

        Returns:
            Per node (per entry of ``peers``), the received bytes (a uint8 tensor: ``into``'s where the payload fit
            it), None at the entries of this node's members.

        Raises:
            ShmemTimeoutError: a lane member did not answer in time, or its connection failed (named); this member
                then gives up its node team's next sync (unless it was telling the lane of a failure of its own).
            ShmemMismatchError: a lane member made another call.
            The error of a lane member whose part of the call failed (a refusal, a mismatch on its node, ...), with
            its class and message.
        """
        layout = self.layout
        deadline = time.monotonic() + self._timeout_sec
        members = layout.lane if peers is None else peers
        others = [k for k, g in enumerate(members) if layout.position[g][0] != layout.node]
        header_bytes = _HEADER_WORDS * 8
        received: list = [None] * len(members)
        headers: dict = {}
        # Two rounds over the link: every header, then every longer payload. A payload up to _EAGER_BYTES rides in its
        # header's message; longer ones then cross in both directions at once. The runtime's link posts a round's
        # transfers all at once. gloo takes them pair by pair in ascending order of the lower node, the lower node's
        # header first: every pair meets in the same order on both sides (no cycle of waits), and a send that finds
        # its receive already posted is a single hand-off (posting both directions at once costs twice as much).
        payloads, inboxes, firsts = {}, {}, []
        for k in others:
            member = members[k]
            payloads[k] = None if sends[k] is None else _bytes(sends[k])
            nbytes = 0 if payloads[k] is None else payloads[k].numel()
            header = _bytes(torch.tensor([status, *call, nbytes], dtype=torch.int64))
            first = torch.cat([header, payloads[k]]) if 0 < nbytes <= _EAGER_BYTES else header
            # Room for a header and an eager payload: both links take a message shorter than the buffer (gloo aborts
            # the process on a longer one); the header says how long the payload is.
            inboxes[k] = torch.empty(header_bytes + _EAGER_BYTES, dtype=torch.uint8)
            firsts.append(_Transfer(k, member, first, inboxes[k], layout.node < layout.position[member][0]))
        missing = self.link.transfer(self._tag, firsts, deadline)
        longs = []
        for k in others:
            if k in missing:
                continue
            inbox = inboxes[k]
            headers[k] = inbox[:header_bytes].view(torch.int64)
            theirs = int(headers[k][-1])
            target = None if into is None else into[k]
            if target is not None and target.numel() != theirs:
                target = None  # the call differs: raised below, once every payload is in
            if theirs <= _EAGER_BYTES:
                received[k] = inbox[header_bytes:header_bytes + theirs]
                if target is not None:
                    received[k] = target.copy_(received[k])
            else:
                received[k] = torch.empty(theirs, dtype=torch.uint8) if target is None else target
            payload = payloads[k]
            long_send = payload if payload is not None and payload.numel() > _EAGER_BYTES else None
            long_receive = received[k] if theirs > _EAGER_BYTES else None
            if long_send is not None or long_receive is not None:
                longs.append(_Transfer(k, members[k], long_send, long_receive))
        missing.update(self.link.transfer(self._tag, longs, deadline))
        self._raise_missing(missing, members, op, give_up=status == _OK)
        for k in others:  # every payload is in: the channels stay aligned whatever is raised now
            theirs = headers[k].tolist()
            if theirs[0] != _OK:
                raise _lane_error(received[k])
            if status == _OK and tuple(theirs[1:8]) != tuple(call):
                raise ShmemMismatchError(f"ranks disagree on a collective across nodes: "
                                         f"rank={self._global[self._me_group()]} {_describe(call)}, "
                                         f"rank={self._global[members[k]]} {_describe(theirs[1:8])}")
        return received

    def _fail_lane(self, op: str, call: tuple, error: BaseException, peers: Optional[Sequence[int]] = None) -> None:
        """Tells the lane (or ``peers``, as :meth:`exchange` takes them) that this member's part of the call failed
        with ``error`` (they raise it too, with its class and message); never masks ``error``."""
        if self.broken:
            return
        size = self.layout.count if peers is None else len(peers)
        try:
            self.exchange(op, call, [_error_payload(error)] * size, _FAILED, peers=peers)
        except Exception:  # the lane's own failure: `error` is what this member reports
            pass

    def _node_phase(self, op: str, call: tuple, fn, *args, lane_follows: bool = True,
                    peers: Optional[Sequence[int]] = None) -> None:
        """One node-local engine call ``fn(node team, *args, role)`` (the role is the call's). On failure the lane
        (or ``peers``, as :meth:`exchange` takes them) hears of it before the error propagates, when the exchange
        of the call is still to come (``lane_follows``); after it, the other nodes have passed their exchange, and
        this node's members fail alike in the engine."""
        try:
            fn(self.node_team, *args, call[_ROLE])
        except Exception as error:
            if lane_follows:
                self._fail_lane(op, call, error, peers)
            raise

    def _agree_on_node(self, op: str, call: tuple, collective: str, dtype: Optional[torch.dtype], count: int,
                       reduce_op: int = 0, wire: int = 0, peer: int = -1,
                       peers: Optional[Sequence[int]] = None) -> None:
        """A fingerprinted sync of the node team on the whole call: members of a node that disagree all raise."""
        dtype_name = "" if dtype is None else str(dtype).replace("torch.", "")
        element = 0 if dtype is None else dtype.itemsize
        self._node_phase(op, call, C.agree, _COLLECTIVES[collective], dtype_name, element, count, reduce_op, wire,
                         peer, [], DEFAULT_HANDLE, peers=peers)

    def refuse(self, collective: int, error: BaseException, role: int) -> None:
        """Refuses this member's call of ``collective`` for ``error`` (a check that failed on this member) on every
        member of every node: its node-mates fail in the call's first node-local sync, the other nodes in the lane
        exchange, all with the refusal's class and message (Team.refuse).

        Raises:
            The refusal.
        """
        op = {number: name for name, number in _COLLECTIVES.items()}[collective]
        self._begin(op)
        call = (collective, 0, 0, -1, 0, 0, role)
        try:
            C.refuse(self.node_team, collective, _STATUS_CODES[project_code(error)], str(error), DEFAULT_HANDLE, role)
        except Exception as refused:
            self._fail_lane(op, call, refused)
            raise
        raise error   # not reached: the node team raises the refusal

    # ---- the collectives -----------------------------------------------------------------------------------------

    def barrier(self, role: int) -> None:
        """Every member of every node arrives."""
        call = (_COLLECTIVES["barrier"], 0, 0, -1, 0, 0, role)
        self._begin("team_barrier")
        self._node_phase("team_barrier", call, C.team_barrier, DEFAULT_HANDLE)
        self.exchange("team_barrier", call, [None] * self.layout.count)
        self._node_phase("team_barrier", call, C.team_barrier, DEFAULT_HANDLE, lane_follows=False)

    def all_reduce(self, tensor: torch.Tensor, op: int, wire: int, wire_dtype: Optional[torch.dtype],
                   input: Optional[torch.Tensor], role: int) -> None:
        """Reduces ``input`` (or ``tensor``) across every member into ``tensor``; bit-identical on every member.
        Arguments that fail the checks are refused on every member (:meth:`refuse`)."""
        try:
            _check_tensor(tensor, "tensor")
            source = tensor if input is None else _check_tensor(input, "input")
            if source.dtype != tensor.dtype or source.numel() != tensor.numel():
                raise ValueError(f"`input` must have the dtype and size of `tensor` ({tensor.dtype}, "
                                 f"{tensor.numel()}), but got {source.dtype}, {source.numel()}")
            _check_avg(op, tensor.dtype)
        except (ValueError, TypeError) as error:
            self.refuse(_COLLECTIVES["all_reduce"], error, role)
        layout = self.layout
        call = (_COLLECTIVES["all_reduce"], op + 1, wire, -1, tensor.numel(), _dtype_id(tensor.dtype), role)
        self._begin("all_reduce")
        self._agree_on_node("all_reduce", call, "all_reduce", tensor.dtype, tensor.numel(), op + 1, wire)
        count = tensor.numel()
        chunk = -(-count // layout.per_node)
        padded = chunk * layout.per_node
        flat = source.reshape(-1)
        if padded != count:
            flat = torch.cat([flat, torch.zeros(padded - count, dtype=tensor.dtype)])
        part = torch.empty(chunk, dtype=tensor.dtype)
        node_op = _SUM if op == _AVG else op
        self._node_phase("all_reduce", call, C.reduce_scatter, part, flat, node_op, DEFAULT_HANDLE, wire)
        if wire:
            total = self._reduce_encoded_across("all_reduce", call, part, wire_dtype, own_included=False)
            if op == _AVG:
                total.div_(self.size)
        else:
            received = self.exchange("all_reduce", call, [part] * layout.count)
            parts = [part if k == layout.node else _as(received[k], tensor.dtype) for k in range(layout.count)]
            total = reduce_in_order(parts, op, self.size)
        out = tensor.reshape(-1) if padded == count else torch.empty(padded, dtype=tensor.dtype)
        self._node_phase("all_reduce", call, C.all_gather, out, total, DEFAULT_HANDLE, lane_follows=False)
        if padded != count:
            tensor.reshape(-1).copy_(out[:count])

    def _encode(self, values: torch.Tensor, wire_dtype: torch.dtype) -> tuple:
        """``values`` in the wire format: (the run, its bytes as one tensor)."""
        count = values.numel()
        fp8 = wire_dtype not in (torch.float16, torch.bfloat16)
        scales = torch.empty(codec.scale_count(count), dtype=torch.float32) if fp8 else None
        codes = torch.empty(count, dtype=wire_dtype)
        codec.encode(values, (scales, codes))
        payload = torch.cat([_bytes(scales), _bytes(codes)]) if fp8 else _bytes(codes)
        return (scales, codes), payload

    @staticmethod
    def _decode_run(raw: torch.Tensor, count: int, wire_dtype: torch.dtype) -> tuple:
        if wire_dtype in (torch.float16, torch.bfloat16):
            return None, _as(raw, wire_dtype)
        split = codec.scale_count(count) * 4
        return _as(raw[:split], torch.float32), _as(raw[split:], wire_dtype)

    def _reduce_encoded_across(self, op: str, call: tuple, part: torch.Tensor, wire_dtype: torch.dtype,
                               own_included: bool) -> torch.Tensor:
        """The sum of every node's ``part`` (this lane's), each crossing nodes encoded, decoded and added in node
        order; ``own_included`` False decodes this member's own encoding too, so every lane member gets the same
        bits."""
        layout = self.layout
        run, payload = self._encode(part, wire_dtype)
        received = self.exchange(op, call, [payload] * layout.count)
        runs = [run if k == layout.node else self._decode_run(received[k], part.numel(), wire_dtype)
                for k in range(layout.count)]
        total = torch.empty_like(part)
        if own_included:
            codec.reduce_encoded(total, part, [r for k, r in enumerate(runs) if k != layout.node], op="sum")
        else:
            codec.reduce_encoded(total, None, runs, op="sum")
        return total

    def reduce_scatter(self, output: torch.Tensor, input: torch.Tensor, op: int, wire: int,
                       wire_dtype: Optional[torch.dtype], role: int) -> None:
        """``output`` receives part ``rank`` of ``input`` reduced across every member."""
        layout = self.layout
        try:
            _check_tensor(output, "output")
            _check_tensor(input, "input")
            chunk = output.numel()
            if input.dtype != output.dtype or input.numel() != chunk * self.size:
                raise ValueError(f"`input` must hold {self.size} x output's {chunk} elements of {output.dtype}, but "
                                 f"got {input.numel()} of {input.dtype}")
            _check_avg(op, output.dtype)
        except (ValueError, TypeError) as error:
            self.refuse(_COLLECTIVES["reduce_scatter"], error, role)
        call = (_COLLECTIVES["reduce_scatter"], op + 1, wire, -1, chunk, _dtype_id(output.dtype), role)
        self._begin("reduce_scatter")
        self._agree_on_node("reduce_scatter", call, "reduce_scatter", output.dtype, chunk, op + 1, wire)
        # Member i of this node reduces the parts of lane i, in node order.
        parts = input.reshape(self.size, chunk)
        regrouped = torch.cat([parts[g] for g in layout.lane_major])
        mine = torch.empty(layout.count, chunk, dtype=output.dtype)
        node_op = _SUM if op == _AVG else op
        self._node_phase("reduce_scatter", call, C.reduce_scatter, mine.reshape(-1), regrouped, node_op,
                         DEFAULT_HANDLE, wire)
        if wire:
            own = mine[layout.node]
            runs, payloads = [], []
            for k in range(layout.count):
                run, payload = self._encode(mine[k].contiguous(), wire_dtype)
                runs.append(run)
                payloads.append(payload)
            received = self.exchange("reduce_scatter", call, payloads)
            sources = [self._decode_run(received[k], chunk, wire_dtype) for k in range(layout.count)
                       if k != layout.node]
            total = torch.empty(chunk, dtype=output.dtype)
            codec.reduce_encoded(total, own.contiguous(), sources, op="sum")
            if op == _AVG:
                total.div_(self.size)
        else:
            received = self.exchange("reduce_scatter", call, [mine[k] for k in range(layout.count)])
            parts = [mine[k] if k == layout.node else _as(received[k], output.dtype) for k in range(layout.count)]
            total = reduce_in_order(parts, op, self.size)
        output.reshape(-1).copy_(total)

    def all_gather(self, output: torch.Tensor, input: torch.Tensor, role: int) -> None:
        """``output`` receives member r's ``input`` at r x its bytes."""
        layout = self.layout
        try:
            _check_tensor(output, "output")
            _check_tensor(input, "input")
            nbytes = input.numel() * input.element_size()
            if output.numel() * output.element_size() != nbytes * self.size:
                raise ValueError(f"`output` must hold {self.size} x input's {nbytes} bytes, but got "
                                 f"{output.numel() * output.element_size()} bytes")
        except (ValueError, TypeError) as error:
            self.refuse(_COLLECTIVES["all_gather"], error, role)
        call = (_COLLECTIVES["all_gather"], 0, 0, -1, input.numel(), _dtype_id(input.dtype), role)
        self._begin("all_gather")
        self._agree_on_node("all_gather", call, "all_gather", input.dtype, input.numel())
        # Node k's input lands in row k of `lane` (this member's own too), then the node gathers every lane.
        lane = torch.empty(layout.count, nbytes, dtype=torch.uint8)
        lane[layout.node].copy_(_bytes(input))
        self.exchange("all_gather", call, [lane[layout.node]] * layout.count, into=list(lane))
        gathered = torch.empty(layout.per_node * layout.count, nbytes, dtype=torch.uint8)
        self._node_phase("all_gather", call, C.all_gather, gathered.reshape(-1), lane.reshape(-1), DEFAULT_HANDLE,
                         lane_follows=False)
        rows = _bytes(output).view(self.size, nbytes)
        for block, group_rank in enumerate(layout.lane_major):  # row copies: index_copy_ of bytes is far slower
            rows[group_rank].copy_(gathered[block])

    def all_to_all(self, sends: Sequence[torch.Tensor], receive: torch.Tensor, receive_counts: Sequence[int],
                   role: int) -> None:
        """``sends[j]`` goes to member j; ``receive`` gets member i's part after the counts of members < i."""
        layout = self.layout
        try:
            _check_tensor(receive, "receive")
            if len(sends) != self.size or len(receive_counts) != self.size:
                raise ValueError(f"`sends` and `receive_counts` must have one entry per member ({self.size}), but "
                                 f"got {len(sends)} and {len(receive_counts)}")
            sends = [_check_tensor(s, f"sends[{j}]") for j, s in enumerate(sends)]
            counts = [int(c) for c in receive_counts]
            if any(c < 0 for c in counts) or sum(counts) != receive.numel():
                raise ValueError(f"`receive_counts` must be non-negative and sum to receive's {receive.numel()} "
                                 f"elements, but got {counts}")
        except (ValueError, TypeError) as error:
            self.refuse(_COLLECTIVES["all_to_all"], error, role)
        dtype = receive.dtype
        call = (_COLLECTIVES["all_to_all"], 0, 0, -1, 0, _dtype_id(dtype), role)  # counts differ by member
        self._begin("all_to_all")
        if isinstance(self.link, _RuntimeLink):
            self._all_to_all_direct(call, sends, receive, counts)
            return
        self._agree_on_node("all_to_all", call, "all_to_all", dtype, 0)
        # 1. Every node member's send counts, then each part to the member of its receiver's lane.
        send_counts = torch.tensor([s.numel() for s in sends], dtype=torch.int64)
        table = torch.empty(layout.per_node, self.size, dtype=torch.int64)
        self._node_phase("all_to_all", call, C.all_gather, table.reshape(-1), send_counts, DEFAULT_HANDLE)
        table = table.tolist()
        lanes = [[layout.members[k][i] for k in range(layout.count)] for i in range(layout.per_node)]
        node_sends = [torch.cat([sends[g].reshape(-1).view(dtype) for g in lanes[i]]) for i in range(layout.per_node)]
        mine = lanes[layout.local]  # my lane's member on each node
        node_counts = [sum(table[s][g] for g in mine) for s in range(layout.per_node)]
        landed = torch.empty(sum(node_counts), dtype=dtype)
        self._node_phase("all_to_all", call, C.all_to_all, node_sends, landed, node_counts, DEFAULT_HANDLE)
        # `landed`: per node sender s, its blocks for my lane's member on each node k.
        blocks, at = {}, 0
        for s in range(layout.per_node):
            for k in range(layout.count):
                n = table[s][mine[k]]
                blocks[s, k] = landed[at:at + n]
                at += n
        # 2. Across nodes: to node k, every node sender's block for my lane's member there, after their counts.
        payloads = [torch.cat([_bytes(torch.tensor([table[s][mine[k]] for s in range(layout.per_node)],
                                                   dtype=torch.int64))]
                              + [_bytes(blocks[s, k]) for s in range(layout.per_node)])
                    for k in range(layout.count)]
        received = self.exchange("all_to_all", call, payloads)
        offsets = [0]
        for c in counts:
            offsets.append(offsets[-1] + c)
        flat = receive.reshape(-1)
        header = layout.per_node * 8
        for k in range(layout.count):
            if k == layout.node:
                sizes = [table[s][self._me_group()] for s in range(layout.per_node)]
                pieces = [blocks[s, k] for s in range(layout.per_node)]
            else:
                raw = received[k]
                sizes = _as(raw[:header], torch.int64).tolist()
                data = _as(raw[header:], dtype)
                pieces, at = [], 0
                for n in sizes:
                    pieces.append(data[at:at + n])
                    at += n
            for s, (n, piece) in enumerate(zip(sizes, pieces)):
                sender = layout.members[k][s]
                if n != counts[sender]:
                    raise ShmemMismatchError(
                        f"ranks disagree on an all_to_all's counts: rank={self._global[self._me_group()]} "
                        f"expects {counts[sender]} elements from rank={self._global[sender]}, which sends {n}")
                flat[offsets[sender]:offsets[sender] + n].copy_(piece)

    def _all_to_all_direct(self, call: tuple, sends: Sequence[torch.Tensor], receive: torch.Tensor,
                           counts: Sequence[int]) -> None:
        """all_to_all where the link reaches every member of the other nodes (the runtime's transport): the parts
        for this node's members through the engine, then one message each way with every member of the other nodes,
        straight from its part of ``sends`` into its slice of ``receive``: none of the lanes' regrouping, which copies
        each byte three more times."""
        layout = self.layout
        everyone = range(self.size)
        dtype = receive.dtype
        self._agree_on_node("all_to_all", call, "all_to_all", dtype, 0, peers=everyone)
        # A part that lies in `receive` (an all_to_all in place) is taken first: the slices of `receive` fill while
        # the parts for the other nodes are still to be sent.
        start, end = receive.data_ptr(), receive.data_ptr() + receive.numel() * receive.element_size()
        sends = [part.clone() if part.numel() and part.data_ptr() < end and
                 start < part.data_ptr() + part.numel() * part.element_size() else part for part in sends]
        offsets = [0]
        for c in counts:
            offsets.append(offsets[-1] + c)
        flat = receive.reshape(-1)
        slices = [flat[offsets[g]:offsets[g] + counts[g]] for g in everyone]
        node_members = layout.members[layout.node]
        # The node's parts land straight in `receive` where its members' slices follow each other there (members of a
        # node with consecutive group ranks, the usual layout); elsewhere they land apart and are copied to theirs.
        consecutive = all(b == a + 1 for a, b in zip(node_members, node_members[1:]))
        landed = (flat[offsets[node_members[0]]:offsets[node_members[-1] + 1]] if consecutive else
                  torch.empty(sum(counts[g] for g in node_members), dtype=dtype))
        self._node_phase("all_to_all", call, C.all_to_all, [sends[g].reshape(-1).view(dtype) for g in node_members],
                         landed, [counts[g] for g in node_members], DEFAULT_HANDLE, peers=everyone)
        if not consecutive:
            at = 0
            for g in node_members:
                slices[g].copy_(landed[at:at + counts[g]])
                at += counts[g]
        received = self.exchange("all_to_all", call, list(sends), into=[_bytes(part) for part in slices],
                                 peers=everyone)
        for g in everyone:
            if layout.position[g][0] != layout.node and received[g].numel() != _bytes(slices[g]).numel():
                raise ShmemMismatchError(
                    f"ranks disagree on an all_to_all's counts: rank={self._global[self._me_group()]} expects "
                    f"{counts[g]} elements from rank={self._global[g]}, which sends "
                    f"{received[g].numel() // receive.element_size()}")

    def _me_group(self) -> int:
        return self.layout.members[self.layout.node][self.layout.local]

    # ---- point to point ------------------------------------------------------------------------------------------

    def _point_to_point(self, op: str, tensor: torch.Tensor, peer: int, on_node) -> Optional[float]:
        """Runs ``on_node`` (the engine's send or recv) when ``peer`` is on this node; otherwise returns the deadline
        of the transfer across nodes."""
        _check_tensor(tensor, "tensor")
        self._begin(op)
        node, local = self.layout.position[peer]
        if node == self.layout.node:
            on_node(self.node_team, tensor, local, DEFAULT_HANDLE)
            return None
        return time.monotonic() + self._timeout_sec

    def send(self, tensor: torch.Tensor, peer: int) -> None:
        """Sends ``tensor`` to member ``peer``: through the engine on this node, point to point across nodes."""
        deadline = self._point_to_point("send", tensor, peer, C.send)
        if deadline is None:
            return
        header = torch.tensor([tensor.numel() * tensor.element_size(), _dtype_id(tensor.dtype)], dtype=torch.int64)
        self._transfer("send", peer, deadline, header, None)
        if header[0]:
            self._transfer("send", peer, deadline, _bytes(tensor), None)

    def recv(self, tensor: torch.Tensor, peer: int) -> None:
        """Receives the next message of member ``peer`` into ``tensor`` (of the message's byte size)."""
        deadline = self._point_to_point("recv", tensor, peer, C.recv)
        if deadline is None:
            return
        header = torch.empty(2, dtype=torch.int64)
        self._transfer("recv", peer, deadline, None, header)
        nbytes = int(header[0])
        expected = tensor.numel() * tensor.element_size()
        target = _bytes(tensor) if nbytes == expected else torch.empty(nbytes, dtype=torch.uint8)
        if nbytes:
            self._transfer("recv", peer, deadline, None, target)
        if nbytes != expected:
            raise ValueError(f"`tensor` must have the message's size ({nbytes} bytes from rank {self._global[peer]}), "
                             f"but got {expected} bytes")

    def _transfer(self, op: str, peer: int, deadline: float, send: Optional[torch.Tensor],
                  receive: Optional[torch.Tensor]) -> None:
        """One message to or from member ``peer`` of another node, under the team's send/recv tag."""
        failures = self.link.transfer(self._tag + 1, [_Transfer(0, peer, send, receive)], deadline)
        if failures:
            raise ShmemTimeoutError(f"cross-node {op} failed: missing_ranks=[{self._global[peer]}] "
                                    f"timeout_sec={self._timeout_sec:g} ({self.link.name}: {failures[0]})")

    # ---- agreement -----------------------------------------------------------------------------------------------

    def agree(self, collective: int, dtype_name: str, element_bytes: int, count: int, reduce_op: int, wire: int,
              peer: int, values: list, role: int) -> list:
        """Every member's ``values`` after checking that every member makes the same call (Team.agree)."""
        layout = self.layout
        call = (collective, reduce_op, wire, peer, count, zlib.crc32(dtype_name.encode()) if dtype_name else 0, role)
        self._begin("agree")
        try:
            rows = C.agree(self.node_team, collective, dtype_name, element_bytes, count, reduce_op, wire, peer,
                           list(values), DEFAULT_HANDLE, role)
        except Exception as error:
            self._fail_lane("agree", call, error)
            raise
        flat = [layout.per_node] + [len(row) for row in rows] + [v for row in rows for v in row]
        mine = torch.tensor(flat, dtype=torch.int64)
        received = self.exchange("agree", call, [mine] * layout.count)
        result: list = [None] * self.size
        for k in range(layout.count):
            if k == layout.node:
                node_rows = [list(row) for row in rows]
            else:
                words = _as(received[k], torch.int64).tolist()
                lengths = words[1:1 + words[0]]
                node_rows, at = [], 1 + words[0]
                for n in lengths:
                    node_rows.append(words[at:at + n])
                    at += n
            for s, row in enumerate(node_rows):
                result[layout.members[k][s]] = row
        return result
