"""Teams that span nodes, for every framework: each collective as node-local phases in the runtime's engine and one
phase across nodes.

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
with the same bits. Low precision encodes the parts that cross nodes too, where it saves the most.

This module imports no framework: a handler gives it a :class:`NodeEngine` (its tensors as byte arrays, and its
face's calls of the node team) and a link. The traffic across nodes is point to point, under two tags the members
agree on when the team is made (one for the lanes, one for send/recv), over one of two links:

- the runtime's own transport to other nodes (the host device's UCX, ``debug_state()["transports"]``), when it
  reaches every member of the other nodes: two-sided messages (``exchange_messages``) on the connections the
  one-sided calls use, which see a dead node at once (:class:`RuntimeLink`, for every handler);
- otherwise the team's own process group (torch's handler: gloo's point to point).

Every member of a team picks the same link: the runtime's transport connects every rank or none (agreed at init).
A team that spans nodes needs the same number of members on every node (lanes pair them up), and runs its
collectives on the calling thread, after the current stream's work.
"""

from __future__ import annotations

import time
import zlib
from typing import Any, Callable, NamedTuple, Optional, Protocol, Sequence

import numpy as np

from hyper_parallel.core.multicore.errors import (
    CLASSES_BY_CODE,
    ShmemMismatchError,
    ShmemStateError,
    ShmemTimeoutError,
    project_code,
)

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
# The dtypes reductions across nodes add, as numpy holds them (bfloat16 as its bits: numpy has no bfloat16).
_NUMPY_DTYPES = {"float64": np.float64, "float32": np.float32, "float16": np.float16, "bfloat16": np.uint16,
                 "int64": np.int64, "int32": np.int32, "int16": np.int16, "int8": np.int8, "uint8": np.uint8}


class Buffer(NamedTuple):
    """A tensor's memory as the phases see it: a flat uint8 array over its bytes, and its dtype."""

    data: np.ndarray   # flat, uint8, over the tensor's own memory
    dtype: str         # "float32", as the engine names it
    itemsize: int

    @property
    def count(self) -> int:
        """Elements."""
        return self.data.size // self.itemsize if self.itemsize else 0


class Transfer(NamedTuple):
    """One member's part of a link's transfer: ``send`` to group rank ``member`` and its message into ``receive``
    (flat uint8 arrays, either may be None); a failure is reported under ``key``. ``send_first``: whether a link that
    takes the transfers one at a time sends before it receives (None: both posted at once)."""

    key: int
    member: int
    send: Optional[np.ndarray]
    receive: Optional[np.ndarray]
    send_first: Optional[bool] = None


class Link(Protocol):
    """What carries the phase across nodes."""

    name: str

    def transfer(self, tag: int, transfers: Sequence[Transfer], deadline: float) -> dict:
        """Every transfer of one round, each completed or failed by ``deadline`` (``time.monotonic()``).

        Returns:
            The failures: the first line of each failed transfer's message, by its key.
        """


class NodeEngine(Protocol):
    """What a handler gives the phases: its tensors as :class:`Buffer` s, and its face's calls of the node team (a
    runtime team of this node's members of the team). Collectives take names (collective, reduce op, wire format,
    role) as the runtime's numberings spell them; their failures raise the runtime's exceptions."""

    #: The runtime's numberings (``c_runtime.numberings()``'s shape): collectives, reduce_ops, wire_formats, ...
    numberings: dict

    def buffer(self, tensor: Any, name: str) -> Buffer:
        """``tensor``'s bytes, in place. Raises TypeError or ValueError (naming ``name``) for one the phases cannot
        take (not the framework's tensor, not contiguous, not in host memory)."""

    def wait_for_stream(self) -> None:
        """Waits for the work enqueued on the current stream (the phases run on the calling thread)."""

    def agree(self, collective: str, dtype: str, element_bytes: int, count: int, reduce_op: Optional[str],
              wire: Optional[str], peer: int, values: list, role: str) -> list:
        """The node team's fingerprinted sync on a call: every node member's ``values``."""

    def refuse(self, collective: str, error: BaseException, role: str) -> None:
        """Refuses the call on every node member (raises the refusal)."""

    def barrier(self, role: str) -> None:
        """The node team's barrier."""

    def reduce_scatter(self, output: Buffer, input: Buffer, op: str, wire: Optional[str], role: str) -> None:
        """The node team's reduce_scatter."""

    def all_gather(self, output: np.ndarray, input: np.ndarray, role: str) -> None:
        """The node team's all_gather of bytes."""

    def all_to_all(self, sends: Sequence[np.ndarray], receive: np.ndarray, counts: Sequence[int], dtype: str,
                   itemsize: int, role: str) -> None:
        """The node team's all_to_all of ``dtype`` elements (``counts`` in elements)."""

    def send(self, data: Buffer, local_peer: int) -> None:
        """The engine's send to node member ``local_peer``."""

    def recv(self, data: Buffer, local_peer: int) -> None:
        """The engine's receive from node member ``local_peer``."""

    def give_up(self, message: str) -> None:
        """Gives up the node team's next sync (local)."""

    def release(self) -> None:
        """Lets go of the node team (local, never waits)."""

    def exchange_messages(self, tag: int, exchanges: Sequence[tuple]) -> list:
        """The runtime's two-sided messages: ``(pe, send, receive)`` arrays each, all posted at once; each
        exchange's ``(received bytes, failure message or "")``. Raises RuntimeError when refused (nothing sent)."""

    def moe_row(self, direction: str, experts: int, members: int, in_splits: list, in_offsets: Optional[list],
                input_rows: int, output_rows: int) -> list:
        """What this member publishes of an MoE exchange (the engine's step, ``runtime/collectives/moe.h``)."""

    def moe_plan(self, direction: str, experts: int, major_align: int, rows: list, me: int) -> tuple:
        """Member ``me``'s MoE layout from every member's published row: ``(splits, offsets, from)``; raises the
        error every member raises (the engine's step)."""

    def encode(self, values: Buffer, wire: str) -> np.ndarray:
        """``values`` in the low-precision wire format ``wire``: the bytes that travel."""

    def decode(self, payload: np.ndarray, count: int, wire: str, dtype: str) -> np.ndarray:
        """A payload of :meth:`encode` (``count`` values), decoded exactly: to float64 for a ``dtype`` of float64,
        to float32 otherwise."""


def dtype_id(dtype: Optional[str]) -> int:
    """A dtype's number in a call's fingerprint across nodes (0: none)."""
    return 0 if not dtype else zlib.crc32(dtype.encode())


def _numpy_view(raw: np.ndarray, dtype: str) -> np.ndarray:
    kind = _NUMPY_DTYPES.get(dtype)
    if kind is None:
        raise TypeError(f"`dtype` must be one of {', '.join(_NUMPY_DTYPES)} for a reduction across nodes, but got "
                        f"{dtype}")
    return raw.view(kind)


def _widened(raw: np.ndarray, dtype: str) -> np.ndarray:
    """The values of ``raw`` (bytes of ``dtype``) as the reduction adds them: float16 and bfloat16 in float32."""
    values = _numpy_view(raw, dtype)
    if dtype == "bfloat16":
        return (values.astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32) if dtype == "float16" else values


def _narrowed(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded once to ``dtype`` (to nearest even, NaN kept), as bytes."""
    if dtype == "bfloat16":
        bits = values.astype(np.float32).view(np.uint32)
        rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
        rounded[np.isnan(values)] = 0x7FC0
        return rounded.view(np.uint8)
    if dtype == "float16":
        return values.astype(np.float16).view(np.uint8)
    return np.ascontiguousarray(values).view(np.uint8)


def reduce_in_order(parts: Sequence[np.ndarray], dtype: str, op: str, divisor: int = 1) -> np.ndarray:
    """``op`` over ``parts`` (bytes of ``dtype`` each), combined in their order (float16 and bfloat16 in float32,
    rounded once; ``avg`` sums, then divides by ``divisor``): the same bits on every rank that reduces the same parts.

    Returns:
        A new flat uint8 array.

    Raises:
        TypeError: a dtype the runtime does not reduce.
    """
    acc = _widened(parts[0], dtype).copy()
    with np.errstate(all="ignore"):  # inf - inf is NaN, and integers wrap, as the engine's reductions do
        if op in ("sum", "avg"):
            for part in parts[1:]:
                acc += _widened(part, dtype)
            if op == "avg":
                acc /= acc.dtype.type(divisor)
        else:
            combine = np.maximum if op == "max" else np.minimum
            for part in parts[1:]:
                combine(acc, _widened(part, dtype), out=acc)
        return _narrowed(acc, dtype)


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


def first_line(error: BaseException) -> str:
    """An error's first line (its class name when it has no message)."""
    return str(error).splitlines()[0] if str(error) else type(error).__name__


class RuntimeLink:
    """Transfers across nodes over the runtime's own transport (the engine's ``exchange_messages``), between PEs:
    every transfer of a round posted at once (they overlap on the wire), all completed within the runtime's timeout;
    a member whose connection broke fails at once."""

    def __init__(self, name: str, pes: Sequence[int], exchange: Callable[[int, Sequence[tuple]], list]) -> None:
        self.name = name
        self._pes = pes
        self._exchange = exchange

    def transfer(self, tag: int, transfers: Sequence[Transfer], deadline: float) -> dict:
        """:meth:`Link.transfer`, all at once; the deadline is the transport's own (one timeout)."""
        del deadline
        if not transfers:
            return {}
        try:
            outcomes = self._exchange(tag, [(self._pes[item.member], item.send, item.receive) for item in transfers])
        except RuntimeError as error:  # refused before anything was sent: every transfer failed
            return {item.key: first_line(error) for item in transfers}
        return {item.key: failure.splitlines()[0] for item, (_, failure) in zip(transfers, outcomes) if failure}


def _int64_bytes(values: Sequence[int]) -> np.ndarray:
    return np.array(values, dtype=np.int64).view(np.uint8)


def _error_payload(error: BaseException) -> np.ndarray:
    """What a member whose part of a call failed sends its lane: the error's status code name and message."""
    return np.frombuffer(bytearray(f"{project_code(error)}\n{error}".encode()), dtype=np.uint8)


def _lane_error(raw: np.ndarray) -> BaseException:
    """The error a lane member sent (:func:`_error_payload`), to raise here as it was raised there."""
    code, _, message = raw.tobytes().decode(errors="replace").partition("\n")
    return CLASSES_BY_CODE.get(code, ShmemStateError)(message)


class Hierarchy:
    """The phases of a team that spans nodes, over its node team (``engine``) and a link.

    Args:
        engine: the handler's calls of the node team.
        link: what carries the phase across nodes.
        layout: where the members live.
        global_ranks: the job's rank of every group rank (for messages).
        word: a random word every member received from the first (it picks the team's tags).
        timeout_sec: the runtime's timeout (every receive across nodes is bounded by it).
    """

    def __init__(self, engine: NodeEngine, link: Link, layout: NodeLayout, global_ranks: Sequence[int], word: int,
                 timeout_sec: float) -> None:
        self.engine = engine
        self.link = link
        self.layout = layout
        self.size = sum(len(members) for members in layout.members)
        self._global = tuple(global_ranks)
        self._tag = _TAG_BASE + 2 * (word % _TAG_TEAMS)
        self._timeout_sec = timeout_sec
        numbers = engine.numberings
        self._collectives = numbers["collectives"]
        self._reduce_ops = numbers["reduce_ops"]
        self._wires = numbers["wire_formats"]
        self._roles = numbers["call_roles"]
        self.broken = ""

    def release(self) -> None:
        """Lets go of the node team (local, never waits)."""
        self.broken = self.broken or "the team was released"
        self.engine.release()

    # ---- the phase across nodes ----------------------------------------------------------------------------------

    def _call(self, collective: str, role: str, op: Optional[str] = None, wire: Optional[str] = None, peer: int = -1,
              count: int = 0, dtype: Optional[str] = None) -> tuple:
        """A call's fingerprint across nodes."""
        return (self._collectives[collective], 0 if op is None else self._reduce_ops[op] + 1,
                self._wires["full" if wire is None else wire], peer, count, dtype_id(dtype), self._roles[role])

    def _describe(self, call: Sequence[int]) -> str:
        """A call's fingerprint as a message names it: "collective=all_reduce op=sum wire=full count=8 dtype=float32"
        (and "role=backward" for a call that is not a forward one)."""
        collective, op, wire, peer, count, dtype, role = call
        names = {number: name for name, number in self._collectives.items()}
        ops = {number + 1: name for name, number in self._reduce_ops.items()}
        wires = {number: name for name, number in self._wires.items()}
        roles = {number: name for name, number in self._roles.items()}
        text = f"collective={names.get(collective, collective)}"
        if op:
            text += f" op={ops.get(op, op)} wire={wires.get(wire, wire)}"
        if peer >= 0:
            text += f" peer={peer}"
        text += f" count={count} dtype={_DTYPE_NAMES.get(dtype, dtype) if dtype else 'none'}"
        return text + (f" role={roles.get(role, role)}" if role != self._roles["forward"] else "")

    def _role_name(self, call: Sequence[int]) -> str:
        return {number: name for name, number in self._roles.items()}[call[_ROLE]]

    def _begin(self, op: str) -> None:
        if self.broken:
            raise ShmemStateError(f"team cannot be used after a failure across nodes: op={op} cause={self.broken}")
        self.engine.wait_for_stream()

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
                self.engine.give_up(self.broken)
            raise ShmemTimeoutError(self.broken)

    def exchange(self, op: str, call: tuple, sends: Sequence[Optional[np.ndarray]], status: int = _OK,
                 into: Optional[Sequence[Optional[np.ndarray]]] = None,
                 peers: Optional[Sequence[int]] = None) -> list:
        """Sends ``sends[k]`` to this lane's member on node k and receives one payload from each of them (or, with
        ``peers``, to and from member ``peers[k]``).

        Args:
            op: the operation, for messages.
            call: the call's fingerprint (collective, reduce op + 1, wire, peer, element count, dtype id, role).
            sends: per node (per entry of ``peers``), a flat uint8 array (its bytes travel) or None (nothing); the
                entries of this node's members are unused.
            status: _OK, or _FAILED: this member's part of the call failed, and ``sends`` holds its error
                (:func:`_error_payload`).
            into: per node (per entry of ``peers``), a flat uint8 array for its payload where the caller knows its
                size (a payload of that size lands there), or None.
            peers: group ranks, ascending: the members to exchange with, those of this node skipped (every member of
                the other nodes: each pair meets once, in the same order on both sides). None: this lane.

        Returns:
            Per node (per entry of ``peers``), the received bytes (a flat uint8 array: ``into``'s where the payload
            fit it), None at the entries of this node's members.

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
        # transfers all at once. A link that takes them one at a time goes pair by pair in ascending order of the
        # lower node, the lower node's header first: every pair meets in the same order on both sides (no cycle of
        # waits), and a send that finds its receive already posted is a single hand-off.
        inboxes, firsts = {}, []
        for k in others:
            member = members[k]
            payload = sends[k]
            nbytes = 0 if payload is None else payload.size
            header = _int64_bytes([status, *call, nbytes])
            first = np.concatenate([header, payload]) if 0 < nbytes <= _EAGER_BYTES else header
            # Room for a header and an eager payload: the links take a message shorter than the buffer (gloo aborts
            # the process on a longer one); the header says how long the payload is.
            inboxes[k] = np.empty(header_bytes + _EAGER_BYTES, dtype=np.uint8)
            firsts.append(Transfer(k, member, first, inboxes[k], layout.node < layout.position[member][0]))
        missing = self.link.transfer(self._tag, firsts, deadline)
        longs = []
        for k in others:
            if k in missing:
                continue
            inbox = inboxes[k]
            headers[k] = inbox[:header_bytes].view(np.int64)
            theirs = int(headers[k][-1])
            target = None if into is None else into[k]
            if target is not None and target.size != theirs:
                target = None  # the call differs: raised below, once every payload is in
            if theirs <= _EAGER_BYTES:
                received[k] = inbox[header_bytes:header_bytes + theirs]
                if target is not None:
                    target[...] = received[k]
                    received[k] = target
            else:
                received[k] = np.empty(theirs, dtype=np.uint8) if target is None else target
            payload = sends[k]
            long_send = payload if payload is not None and payload.size > _EAGER_BYTES else None
            long_receive = received[k] if theirs > _EAGER_BYTES else None
            if long_send is not None or long_receive is not None:
                longs.append(Transfer(k, members[k], long_send, long_receive))
        missing.update(self.link.transfer(self._tag, longs, deadline))
        self._raise_missing(missing, members, op, give_up=status == _OK)
        for k in others:  # every payload is in: the channels stay aligned whatever is raised now
            theirs = headers[k].tolist()
            if theirs[0] != _OK:
                raise _lane_error(received[k])
            if status == _OK and tuple(theirs[1:8]) != tuple(call):
                raise ShmemMismatchError(f"ranks disagree on a collective across nodes: "
                                         f"rank={self._global[self._me_group()]} {self._describe(call)}, "
                                         f"rank={self._global[members[k]]} {self._describe(theirs[1:8])}")
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

    def _node_phase(self, op: str, call: tuple, fn: Callable, *args: Any, lane_follows: bool = True,
                    peers: Optional[Sequence[int]] = None) -> None:
        """One node-local engine call ``fn(*args, role)`` (the role is the call's). On failure the lane (or
        ``peers``, as :meth:`exchange` takes them) hears of it before the error propagates, when the exchange of the
        call is still to come (``lane_follows``); after it, the other nodes have passed their exchange, and this
        node's members fail alike in the engine."""
        try:
            fn(*args, self._role_name(call))
        except Exception as error:
            if lane_follows:
                self._fail_lane(op, call, error, peers)
            raise

    def _agree_on_node(self, op: str, call: tuple, collective: str, dtype: Optional[str], itemsize: int, count: int,
                       reduce_op: Optional[str] = None, wire: Optional[str] = None, peer: int = -1,
                       peers: Optional[Sequence[int]] = None) -> None:
        """A fingerprinted sync of the node team on the whole call: members of a node that disagree all raise."""
        self._node_phase(op, call, self.engine.agree, collective, dtype or "", itemsize if dtype else 0, count,
                         reduce_op, wire, peer, [], peers=peers)

    def refuse(self, collective: str, error: BaseException, role: str) -> None:
        """Refuses this member's call of ``collective`` for ``error`` (a check that failed on this member) on every
        member of every node: its node-mates fail in the call's first node-local sync, the other nodes in the lane
        exchange, all with the refusal's class and message (Team.refuse).

        Raises:
            The refusal.
        """
        self._begin(collective)
        call = self._call(collective, role)
        try:
            self.engine.refuse(collective, error, role)
        except Exception as refused:
            self._fail_lane(collective, call, refused)
            raise
        raise error   # not reached: the node team raises the refusal

    def _buffers(self, collective: str, role: str, **tensors: Any) -> list:
        """The tensors' buffers; one the phases cannot take is refused on every member (:meth:`refuse`)."""
        try:
            return [self.engine.buffer(tensor, name) for name, tensor in tensors.items()]
        except (ValueError, TypeError) as error:
            self.refuse(collective, error, role)
            raise   # not reached

    def _check(self, collective: str, role: str, condition: bool, message: str) -> None:
        """Refuses the call on every member with ``ValueError(message)`` unless ``condition`` holds."""
        if not condition:
            self.refuse(collective, ValueError(message), role)

    def _check_avg(self, collective: str, role: str, op: str, dtype: str) -> None:
        self._check(collective, role, op != "avg" or dtype in ("float64", "float32", "float16", "bfloat16"),
                    f"`op` must be sum, max or min for {dtype}, but got avg")

    # ---- the collectives -----------------------------------------------------------------------------------------

    def barrier(self, role: str) -> None:
        """Every member of every node arrives."""
        call = self._call("barrier", role)
        self._begin("team_barrier")
        self._node_phase("team_barrier", call, self.engine.barrier)
        self.exchange("team_barrier", call, [None] * self.layout.count)
        self._node_phase("team_barrier", call, self.engine.barrier, lane_follows=False)

    def all_reduce(self, tensor: Any, op: str, wire: Optional[str], input: Optional[Any], role: str) -> None:
        """Reduces ``input`` (or ``tensor``) across every member into ``tensor``; bit-identical on every member.
        Arguments that fail the checks are refused on every member (:meth:`refuse`)."""
        out, = self._buffers("all_reduce", role, tensor=tensor)
        source = out if input is None else self._buffers("all_reduce", role, input=input)[0]
        self._check("all_reduce", role, source.dtype == out.dtype and source.count == out.count,
                    f"`input` must have the dtype and size of `tensor` ({out.dtype}, {out.count}), but got "
                    f"{source.dtype}, {source.count}")
        self._check_avg("all_reduce", role, op, out.dtype)
        layout = self.layout
        count, itemsize = out.count, out.itemsize
        call = self._call("all_reduce", role, op, wire, count=count, dtype=out.dtype)
        self._begin("all_reduce")
        self._agree_on_node("all_reduce", call, "all_reduce", out.dtype, itemsize, count, op, wire)
        chunk = -(-count // layout.per_node)
        padded = chunk * layout.per_node
        flat = source.data
        if padded != count:
            flat = np.concatenate([flat, np.zeros((padded - count) * itemsize, dtype=np.uint8)])
        part = Buffer(np.empty(chunk * itemsize, dtype=np.uint8), out.dtype, itemsize)
        node_op = "sum" if op == "avg" else op
        self._node_phase("all_reduce", call, self.engine.reduce_scatter, part, Buffer(flat, out.dtype, itemsize),
                         node_op, wire)
        if wire:
            total = self._reduce_encoded_across("all_reduce", call, part, wire, own_included=False)
            if op == "avg":
                total = reduce_in_order([total], out.dtype, "avg", self.size)
        else:
            received = self.exchange("all_reduce", call, [part.data] * layout.count)
            parts = [part.data if k == layout.node else received[k] for k in range(layout.count)]
            total = reduce_in_order(parts, out.dtype, op, self.size)
        gathered = out.data if padded == count else np.empty(padded * itemsize, dtype=np.uint8)
        self._node_phase("all_reduce", call, self.engine.all_gather, gathered, total, lane_follows=False)
        if padded != count:
            out.data[...] = gathered[:count * itemsize]

    def _reduce_encoded_across(self, op: str, call: tuple, part: Buffer, wire: str, own_included: bool,
                               payloads: Optional[Sequence[np.ndarray]] = None) -> np.ndarray:
        """The sum of every node's part (this lane's), each crossing nodes encoded, decoded and added in node order,
        in float32, rounded once to ``part``'s dtype. ``own_included`` adds this member's own ``part`` at full
        precision first; otherwise its own encoding is decoded too, so every lane member gets the same bits.
        ``payloads``: what goes to each node (default: ``part`` encoded, to every node)."""
        layout = self.layout
        count = part.count
        if payloads is None:
            payloads = [self.engine.encode(part, wire)] * layout.count
        received = self.exchange(op, call, payloads)
        decoded = [None if k == layout.node else self.engine.decode(received[k], count, wire, part.dtype)
                   for k in range(layout.count)]
        if own_included:
            parts = [_widened(part.data, part.dtype)]
            parts += [decoded[k] for k in range(layout.count) if k != layout.node]
        else:
            decoded[layout.node] = self.engine.decode(payloads[layout.node], count, wire, part.dtype)
            parts = decoded
        wide = np.float64 if part.dtype == "float64" else np.float32
        total = parts[0].astype(wide, copy=True)
        with np.errstate(all="ignore"):
            for values in parts[1:]:
                total += values
            return _narrowed(total, part.dtype)

    def reduce_scatter(self, output: Any, input: Any, op: str, wire: Optional[str], role: str) -> None:
        """``output`` receives part ``rank`` of ``input`` reduced across every member."""
        layout = self.layout
        out, inp = self._buffers("reduce_scatter", role, output=output, input=input)
        chunk, itemsize = out.count, out.itemsize
        self._check("reduce_scatter", role, inp.dtype == out.dtype and inp.count == chunk * self.size,
                    f"`input` must hold {self.size} x output's {chunk} elements of {out.dtype}, but got {inp.count} "
                    f"of {inp.dtype}")
        self._check_avg("reduce_scatter", role, op, out.dtype)
        call = self._call("reduce_scatter", role, op, wire, count=chunk, dtype=out.dtype)
        self._begin("reduce_scatter")
        self._agree_on_node("reduce_scatter", call, "reduce_scatter", out.dtype, itemsize, chunk, op, wire)
        # Member i of this node reduces the parts of lane i, in node order.
        parts = inp.data.reshape(self.size, chunk * itemsize)
        regrouped = np.concatenate([parts[g] for g in layout.lane_major])
        mine = np.empty((layout.count, chunk * itemsize), dtype=np.uint8)
        node_op = "sum" if op == "avg" else op
        self._node_phase("reduce_scatter", call, self.engine.reduce_scatter, Buffer(mine.reshape(-1), out.dtype,
                         itemsize), Buffer(regrouped, out.dtype, itemsize), node_op, wire)
        if wire:
            own = Buffer(mine[layout.node], out.dtype, itemsize)
            payloads = [self.engine.encode(Buffer(mine[k], out.dtype, itemsize), wire) for k in range(layout.count)]
            total = self._reduce_encoded_across("reduce_scatter", call, own, wire, own_included=True,
                                                payloads=payloads)
            if op == "avg":
                total = reduce_in_order([total], out.dtype, "avg", self.size)
        else:
            received = self.exchange("reduce_scatter", call, [mine[k] for k in range(layout.count)])
            total = reduce_in_order([mine[k] if k == layout.node else received[k] for k in range(layout.count)],
                                    out.dtype, op, self.size)
        out.data[...] = total

    def all_gather(self, output: Any, input: Any, role: str) -> None:
        """``output`` receives member r's ``input`` at r x its bytes."""
        layout = self.layout
        out, inp = self._buffers("all_gather", role, output=output, input=input)
        nbytes = inp.data.size
        self._check("all_gather", role, out.data.size == nbytes * self.size,
                    f"`output` must hold {self.size} x input's {nbytes} bytes, but got {out.data.size} bytes")
        call = self._call("all_gather", role, count=inp.count, dtype=inp.dtype)
        self._begin("all_gather")
        self._agree_on_node("all_gather", call, "all_gather", inp.dtype, inp.itemsize, inp.count)
        # Node k's input lands in row k of `lane` (this member's own too), then the node gathers every lane.
        lane = np.empty((layout.count, nbytes), dtype=np.uint8)
        lane[layout.node] = inp.data
        self.exchange("all_gather", call, [lane[layout.node]] * layout.count, into=list(lane))
        gathered = np.empty((layout.per_node * layout.count, nbytes), dtype=np.uint8)
        self._node_phase("all_gather", call, self.engine.all_gather, gathered.reshape(-1), lane.reshape(-1),
                         lane_follows=False)
        rows = out.data.reshape(self.size, nbytes)
        rows[list(layout.lane_major)] = gathered

    def all_to_all(self, sends: Sequence[Any], receive: Any, receive_counts: Sequence[int], role: str) -> None:
        """``sends[j]`` goes to member j; ``receive`` gets member i's part after the counts of members < i."""
        rec, = self._buffers("all_to_all", role, receive=receive)
        self._check("all_to_all", role, len(sends) == self.size and len(receive_counts) == self.size,
                    f"`sends` and `receive_counts` must have one entry per member ({self.size}), but got "
                    f"{len(sends)} and {len(receive_counts)}")
        parts = self._buffers("all_to_all", role, **{f"sends[{j}]": s for j, s in enumerate(sends)})
        counts = [int(c) for c in receive_counts]
        self._check("all_to_all", role, all(c >= 0 for c in counts) and sum(counts) == rec.count,
                    f"`receive_counts` must be non-negative and sum to receive's {rec.count} elements, but got "
                    f"{counts}")
        self._all_to_all_arrays([p.data for p in parts], rec, counts, role)

    def _all_to_all_arrays(self, sends: Sequence[np.ndarray], rec: Buffer, counts: Sequence[int], role: str) -> None:
        """all_to_all of checked arrays: ``sends[j]`` to member j, ``rec`` gets member i's part after the counts (in
        ``rec``'s elements) of members < i."""
        call = self._call("all_to_all", role, dtype=rec.dtype)  # counts differ by member
        self._begin("all_to_all")
        if isinstance(self.link, RuntimeLink):
            self._all_to_all_direct(call, sends, rec, counts)
        else:
            self._all_to_all_lanes(call, sends, rec, counts)

    def _mismatched_counts(self, sender: int, expected: int, sent: int) -> ShmemMismatchError:
        return ShmemMismatchError(
            f"ranks disagree on an all_to_all's counts: rank={self._global[self._me_group()]} expects {expected} "
            f"elements from rank={self._global[sender]}, which sends {sent}")

    def _all_to_all_lanes(self, call: tuple, sends: Sequence[np.ndarray], rec: Buffer, counts: Sequence[int]) -> None:
        """all_to_all over lanes: each part to the member of its receiver's lane on this node, then the lane
        exchange."""
        layout = self.layout
        itemsize = rec.itemsize
        self._agree_on_node("all_to_all", call, "all_to_all", rec.dtype, itemsize, 0)
        # 1. Every node member's send counts, then each part to the member of its receiver's lane.
        send_counts = _int64_bytes([s.size // itemsize for s in sends])
        table_bytes = np.empty(layout.per_node * self.size * 8, dtype=np.uint8)
        self._node_phase("all_to_all", call, self.engine.all_gather, table_bytes, send_counts)
        table = table_bytes.view(np.int64).reshape(layout.per_node, self.size).tolist()
        lanes = [[layout.members[k][i] for k in range(layout.count)] for i in range(layout.per_node)]
        node_sends = [np.concatenate([sends[g] for g in lanes[i]]) for i in range(layout.per_node)]
        mine = lanes[layout.local]  # my lane's member on each node
        node_counts = [sum(table[s][g] for g in mine) for s in range(layout.per_node)]
        landed = np.empty(sum(node_counts) * itemsize, dtype=np.uint8)
        self._node_phase("all_to_all", call, self.engine.all_to_all, node_sends, landed, node_counts, rec.dtype,
                         itemsize)
        # `landed`: per node sender s, its blocks for my lane's member on each node k.
        blocks, at = {}, 0
        for s in range(layout.per_node):
            for k in range(layout.count):
                n = table[s][mine[k]] * itemsize
                blocks[s, k] = landed[at:at + n]
                at += n
        # 2. Across nodes: to node k, every node sender's block for my lane's member there, after their counts.
        payloads = [np.concatenate([_int64_bytes([table[s][mine[k]] for s in range(layout.per_node)])]
                                   + [blocks[s, k] for s in range(layout.per_node)])
                    for k in range(layout.count)]
        received = self.exchange("all_to_all", call, payloads)
        offsets = np.concatenate([[0], np.cumsum(counts)]).tolist()
        header = layout.per_node * 8
        for k in range(layout.count):
            if k == layout.node:
                sizes = [table[s][self._me_group()] for s in range(layout.per_node)]
                pieces = [blocks[s, k] for s in range(layout.per_node)]
            else:
                raw = received[k]
                sizes = raw[:header].view(np.int64).tolist()
                pieces, at = [], header
                for n in sizes:
                    pieces.append(raw[at:at + n * itemsize])
                    at += n * itemsize
            for s, (n, piece) in enumerate(zip(sizes, pieces)):
                sender = layout.members[k][s]
                if n != counts[sender]:
                    raise self._mismatched_counts(sender, counts[sender], n)
                rec.data[offsets[sender] * itemsize:(offsets[sender] + n) * itemsize] = piece

    def _all_to_all_direct(self, call: tuple, sends: Sequence[np.ndarray], rec: Buffer,
                           counts: Sequence[int]) -> None:
        """all_to_all where the link reaches every member of the other nodes (the runtime's transport): the parts
        for this node's members through the engine, then one message each way with every member of the other nodes,
        straight from its part of ``sends`` into its slice of ``receive``: none of the lanes' regrouping, which copies
        each byte three more times."""
        layout = self.layout
        everyone = range(self.size)
        itemsize = rec.itemsize
        self._agree_on_node("all_to_all", call, "all_to_all", rec.dtype, itemsize, 0, peers=everyone)
        # A part that lies in `receive` (an all_to_all in place) is taken first: the slices of `receive` fill while
        # the parts for the other nodes are still to be sent.
        sends = [part.copy() if part.size and np.shares_memory(part, rec.data) else part for part in sends]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64).tolist()
        slices = [rec.data[offsets[g] * itemsize:(offsets[g] + counts[g]) * itemsize] for g in everyone]
        node_members = layout.members[layout.node]
        # The node's parts land straight in `receive` where its members' slices follow each other there (members of a
        # node with consecutive group ranks, the usual layout); elsewhere they land apart and are copied to theirs.
        consecutive = all(b == a + 1 for a, b in zip(node_members, node_members[1:]))
        landed = (rec.data[offsets[node_members[0]] * itemsize:offsets[node_members[-1] + 1] * itemsize] if consecutive
                  else np.empty(sum(counts[g] for g in node_members) * itemsize, dtype=np.uint8))
        self._node_phase("all_to_all", call, self.engine.all_to_all, [sends[g] for g in node_members], landed,
                         [counts[g] for g in node_members], rec.dtype, itemsize, peers=everyone)
        if not consecutive:
            at = 0
            for g in node_members:
                slices[g][...] = landed[at:at + counts[g] * itemsize]
                at += counts[g] * itemsize
        received = self.exchange("all_to_all", call, list(sends), into=slices, peers=everyone)
        for g in everyone:
            if layout.position[g][0] != layout.node and received[g].size != slices[g].size:
                raise self._mismatched_counts(g, counts[g], received[g].size // itemsize)

    def moe(self, direction: str, input: Any, input_rows: int, output: Any, output_rows: int, in_splits: Any,
            in_offsets: Optional[Any], out_table: Any, experts: int, major_align: int, role: str) -> None:
        """MoE dispatch or combine of ``input``'s rows (dim 0) into ``output`` (``runtime/collectives/moe.h``'s
        layouts) across nodes: every member's published row agreed on by every member, each member's layout planned
        alike by the engine's own steps (a bad split table or an output too small raises the same error on every
        member before anything moves), then one all_to_all of the rows and the receiver's placement.

        Args:
            direction: "dispatch" or "combine".
            input, output: the rows sent and received (``input_rows`` and ``output_rows`` of them, along dim 0), of
                one dtype and row size.
            in_splits, in_offsets: the int64 split table (members x ``experts``) and where each chunk starts in
                ``input`` (None: packed in split order).
            out_table: 2 x members x ``experts`` int64, receiving the layout's splits and offsets.
            experts: experts per member; major_align: dispatch's alignment of each expert's region in rows.
            role: the call's role.
        """
        op = "moe_" + direction
        n, nsplits = self.size, self.size * experts
        inp, out, splits, table = self._buffers(op, role, input=input, output=output, in_splits=in_splits,
                                                out_splits_offsets=out_table)
        offsets = None if in_offsets is None else self._buffers(op, role, in_offsets=in_offsets)[0]
        row_bytes = (inp.data.size // input_rows if input_rows else out.data.size // output_rows if output_rows
                     else 0)
        self._check(op, role, inp.dtype == out.dtype and inp.data.size == input_rows * row_bytes and
                    out.data.size == output_rows * row_bytes,
                    f"`output` must have the dtype and row size of `input` (rows along dim 0), but got input "
                    f"{inp.dtype} ({input_rows} rows of {row_bytes} bytes) and output {out.dtype} ({output_rows} rows "
                    f"of {out.data.size // output_rows if output_rows else 0} bytes)")
        for name, buffer, count in (("in_splits", splits, nsplits), ("in_offsets", offsets, nsplits),
                                    ("out_splits_offsets", table, 2 * nsplits)):
            if buffer is not None:
                self._check(op, role, buffer.dtype == "int64" and buffer.count == count,
                            f"`{name}` must be {count} int64 values (group size x experts), but got {buffer.count} "
                            f"{buffer.dtype} values")
        self._begin(op)
        mine = self.engine.moe_row(direction, experts, n, splits.data.view(np.int64).tolist(),
                                   None if offsets is None else offsets.data.view(np.int64).tolist(), input_rows,
                                   output_rows)
        # Every member's call, agreed within the node and across nodes, as the engine's exchange agrees on it.
        rows = self.agree(op, "moe_rows", row_bytes, len(mine), None, None, -1, mine, role)
        # Where each chunk this member receives lands (where it starts on its source concerns only its source).
        landing, places, _ = self.engine.moe_plan(direction, experts, major_align, rows, self._me_group())
        dispatch = direction == "dispatch"
        # To each receiver, its chunks expert after expert; from each source, its chunks for this member likewise.
        header = len(mine) - 2 * nsplits
        sizes, starts = mine[header:header + nsplits], mine[header + nsplits:]
        sends = []
        for r in range(n):
            chunks = [r * experts + e if dispatch else e * n + r for e in range(experts)]
            pieces = [inp.data[starts[t] * row_bytes:(starts[t] + sizes[t]) * row_bytes] for t in chunks]
            sends.append(pieces[0] if len(pieces) == 1 else np.concatenate(pieces))
        received = [[e * n + s if dispatch else s * experts + e for e in range(experts)] for s in range(n)]
        counts = [sum(landing[i] for i in chunks) * row_bytes for chunks in received]
        total = sum(counts)
        # Combine's output is rank-major and packed: the all_to_all's own order.
        target = out.data[:total] if not dispatch else np.empty(total, dtype=np.uint8)
        self._all_to_all_arrays(sends, Buffer(target, "uint8", 1), counts, role)
        if dispatch:
            at = 0
            for chunks in received:
                for i in chunks:
                    size = landing[i] * row_bytes
                    out.data[places[i] * row_bytes:places[i] * row_bytes + size] = target[at:at + size]
                    at += size
        layout = table.data.view(np.int64)
        layout[:nsplits] = landing
        layout[nsplits:] = places

    def _me_group(self) -> int:
        return self.layout.members[self.layout.node][self.layout.local]

    # ---- point to point ------------------------------------------------------------------------------------------

    def _point_to_point(self, op: str, tensor: Any, peer: int, on_node: Callable) -> tuple:
        """Runs ``on_node`` (the engine's send or recv) when ``peer`` is on this node (returns None); otherwise
        returns the tensor's buffer and the deadline of the transfer across nodes."""
        data = self.engine.buffer(tensor, "tensor")
        self._begin(op)
        node, local = self.layout.position[peer]
        if node == self.layout.node:
            on_node(data, local)
            return None, 0.0
        return data, time.monotonic() + self._timeout_sec

    def send(self, tensor: Any, peer: int) -> None:
        """Sends ``tensor`` to member ``peer``: through the engine on this node, point to point across nodes."""
        data, deadline = self._point_to_point("send", tensor, peer, self.engine.send)
        if data is None:
            return
        self._transfer("send", peer, deadline, _int64_bytes([data.data.size, dtype_id(data.dtype)]), None)
        if data.data.size:
            self._transfer("send", peer, deadline, data.data, None)

    def recv(self, tensor: Any, peer: int) -> None:
        """Receives the next message of member ``peer`` into ``tensor`` (of the message's byte size)."""
        data, deadline = self._point_to_point("recv", tensor, peer, self.engine.recv)
        if data is None:
            return
        header = np.empty(16, dtype=np.uint8)
        self._transfer("recv", peer, deadline, None, header)
        nbytes = int(header.view(np.int64)[0])
        expected = data.data.size
        target = data.data if nbytes == expected else np.empty(nbytes, dtype=np.uint8)
        if nbytes:
            self._transfer("recv", peer, deadline, None, target)
        if nbytes != expected:
            raise ValueError(f"`tensor` must have the message's size ({nbytes} bytes from rank {self._global[peer]}), "
                             f"but got {expected} bytes")

    def _transfer(self, op: str, peer: int, deadline: float, send: Optional[np.ndarray],
                  receive: Optional[np.ndarray]) -> None:
        """One message to or from member ``peer`` of another node, under the team's send/recv tag."""
        failures = self.link.transfer(self._tag + 1, [Transfer(0, peer, send, receive)], deadline)
        if failures:
            raise ShmemTimeoutError(f"cross-node {op} failed: missing_ranks=[{self._global[peer]}] "
                                    f"timeout_sec={self._timeout_sec:g} ({self.link.name}: {failures[0]})")

    # ---- agreement -----------------------------------------------------------------------------------------------

    def agree(self, collective: str, dtype: str, element_bytes: int, count: int, reduce_op: Optional[str],
              wire: Optional[str], peer: int, values: list, role: str) -> list:
        """Every member's ``values`` after checking that every member makes the same call (Team.agree)."""
        layout = self.layout
        call = self._call(collective, role, reduce_op, wire, peer, count, dtype)
        self._begin("agree")
        try:
            rows = self.engine.agree(collective, dtype, element_bytes, count, reduce_op, wire, peer, list(values), role)
        except Exception as error:
            self._fail_lane("agree", call, error)
            raise
        mine = _int64_bytes([layout.per_node] + [len(row) for row in rows] + [v for row in rows for v in row])
        received = self.exchange("agree", call, [mine] * layout.count)
        result: list = [None] * self.size
        for k in range(layout.count):
            if k == layout.node:
                node_rows = [list(row) for row in rows]
            else:
                words = received[k].view(np.int64).tolist()
                lengths = words[1:1 + words[0]]
                node_rows, at = [], 1 + words[0]
                for n in lengths:
                    node_rows.append(words[at:at + n])
                    at += n
            for s, row in enumerate(node_rows):
                result[layout.members[k][s]] = row
        return result
