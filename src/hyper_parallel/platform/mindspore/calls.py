"""MindSpore's calls into the runtime, over its C ABI (:class:`hyper_parallel.core.symmetric_memory.protocol.Calls`):
what the user API hands a checked call to on MindSpore.

They sit in MindSpore's handler, as torch's calls sit in torch's (:mod:`hyper_parallel.platform.torch.calls`): the
two handlers reach the runtime differently (torch through its C++ binding and the runtime face, MindSpore through
the C ABI with ctypes, since MindSpore's C++ extensions use another C++ library ABI), so each has its own calls.
A check that fails once a collective's group is known is refused through the group's team (:meth:`CAbiCalls.refuse`,
the C ABI's ``hp_shmem_refuse``): every rank of the group raises it. ``symm.free`` marks every tensor made over the
allocation freed (:func:`.tensors.invalidate`), so that no later call takes it or a view of it.
What they do needs little of MindSpore itself: the runtime's lifecycle and teams, group-local ranks and the calls of
:mod:`hyper_parallel.core.multicore.c_runtime`, over this handler's tensors (:mod:`.tensors`: addresses, tensors
over heap memory, synchronisation), groups (:mod:`.groups`) and autograd (:mod:`.autograd`). A second framework on
the C ABI would move them to a neutral module. Every call drains MindSpore's queue first (``tensors.synchronize``);
the runtime's calls complete before they return.
"""

from __future__ import annotations

import ctypes
import struct
import threading
import weakref
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from hyper_parallel.core.multicore import c_runtime, call_site, snapshot
from hyper_parallel.core.multicore.errors import (AGREED, ShmemError, ShmemMismatchError, ShmemStateError,
                                                 ShmemTimeoutError, ShmemValueError, failure_class, failure_kind)
from hyper_parallel.core.symmetric_memory import checks
from hyper_parallel.core.symmetric_memory.checks import Checks
from hyper_parallel.core.multicore.hierarchy import Hierarchy
from hyper_parallel.platform.mindspore import across_nodes, autograd, groups, tensors

# The checks this handler runs itself (free's tensor, before the runtime is asked).
_CHECKS = Checks(tensors)

_ALIGNMENT = 64   # bytes, the runtime face's default: a cache line
_LOG_DEBUG = 0   # the runtime's debug log level: allocations are logged with the user's call site

_WIRE_WIDTH = {"float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}

# A rank's part of an allocation's or a free's check across nodes: what happened on its node (AGREED, or the failure's
# kind: errors.failure_kind), then the heap offset and the bytes.
_ACROSS_NODES = struct.Struct("<qqq")
# The world barrier's messages across nodes on the runtime's transport (its exchanges' tag: MindSpore's handler runs
# no other exchange across nodes).
_BARRIER_TAG = 1


def _call_site() -> str:
    """The user's call site, only when the runtime logs allocations (HYPER_PARALLEL_SHMEM_LOG_LEVEL=0)."""
    return call_site.user_call_site(c_runtime.log_level() == _LOG_DEBUG)


@dataclass
class _Team:
    """A runtime team over the C ABI: its id, its members' world ranks (PEs, in group-rank order), this rank's
    group rank; for a group that spans nodes, its phases (the id is then its node team's)."""

    id: int
    pes: list
    me: int
    hierarchy: Optional[Hierarchy] = None


@dataclass
class _Allocation:
    """A live symmetric allocation and the tensors the handler made over it (``(tensor, array)`` from
    :func:`.tensors.wrap`: the one ``symm.empty`` returned, and ``rendezvous`` views), which its free marks freed.
    ``rendezvous`` views are held weakly (a program may make many)."""

    info: c_runtime.Allocation
    made: list
    views: list = field(default_factory=list)

    def tensors(self) -> list:
        """``(tensor, array)`` of every tensor made over the allocation that still lives."""
        alive = [(tensor(), array()) for tensor, array in self.views]
        return self.made + [pair for pair in alive if pair[0] is not None and pair[1] is not None]


# What a group that spans nodes does not take on this handler: rendezvous maps the members' heaps, which only a node
# shares.
_WITHIN_A_NODE = ("rendezvous",)

# The engine's call each public collective begins with on this handler (a refusal stands for it; its name is in
# every rank's message).
_ENGINE_CALLS = {"shmem_allgather": "all_gather", "shmem_allreduce": "all_reduce",
                 "shmem_reduce_scatter": "reduce_scatter", "shmem_alltoall": "all_to_all", "barrier": "barrier",
                 "fused_all_gather_matmul": "all_gather", "fused_matmul_reduce_scatter": "reduce_scatter",
                 "rendezvous": "all_gather", "shmem_moe_dispatch": "moe_dispatch",
                 "shmem_moe_combine": "moe_combine"}


def _row_numel(t: Any) -> int:
    """Elements of one row (dim 0) of ``t``."""
    count = 1
    for d in t.shape[1:]:
        count *= int(d)
    return count


class CAbiCalls:
    """The runtime's calls over its C ABI for one framework handler; one instance per process and framework."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._allocations: dict = {}   # address -> _Allocation, for free
        self._teams: dict = {}         # group name -> _Team
        self._spanning: dict = {}      # group name -> whether its ranks lie on more than one node (per lifecycle)
        self._across: Optional[tuple] = None   # the other nodes' PEs and the transport to them (per lifecycle)
        # Where the world spans nodes: this node's team of the world, made when the runtime starts, until the world's
        # team takes it (per lifecycle).
        self._world_node_team: Optional[int] = None

    # ------------------------------------------------------------------ groups and lifecycle
    def group_key(self, group: Optional[object]) -> str:
        """The group's name (None: the world group)."""
        return groups.name(group)

    def group_size(self, name: str) -> int:
        """The number of ranks of the group ``name``.

        Raises:
            ShmemValueError: MindSpore knows no group of that name.
        """
        groups.require_initialized(None)
        return len(groups.ranks(name))

    def refuse(self, name: str, operation: str, error: BaseException) -> None:
        """Refuses this rank's call of the public function ``operation`` on group ``name`` for ``error`` (a check
        that failed once the group was known), through the group's team: every rank of the group raises ``error``'s
        class and message, naming this rank. The team is made on the group's first collective; a group MindSpore
        does not know cannot carry the refusal: ``error`` is raised here.

        Raises:
            The refusal, always.
        """
        team = self._teams.get(name)
        if team is None:
            try:
                team = self._team(name, operation)
            except (ValueError, TypeError, ShmemError):   # no team for this rank to meet its peers in
                raise error from None
        tensors.synchronize()
        if team.hierarchy is not None:
            team.hierarchy.refuse(_ENGINE_CALLS[operation], error, "forward")
        c_runtime.refuse(team.id, _ENGINE_CALLS[operation], error)
        raise error   # not reached: the runtime raises the refusal

    def acquire(self, heap_size_bytes: Optional[int] = None) -> None:
        """Starts the runtime over WORLD with a heap of ``heap_size_bytes`` instead of the configuration's, unless a
        lifecycle is active (collective over WORLD): for a tool that knows the heap it needs, as upstream's
        ``acquire(heap_size_bytes=...)``. The user API's calls then run on it, and ``shutdown()`` ends it.

        Args:
            heap_size_bytes: bytes of each rank's heap (the runtime's limits apply); None: the configuration's.

        Raises:
            ShmemStateError: MindSpore's communication is not initialised.
            ValueError: a heap size outside the runtime's limits.
        """
        self._ensure_runtime("acquire", heap_size_bytes or 0)

    def _ensure_runtime(self, op: str, heap_size_bytes: int = 0) -> None:
        groups.require_initialized(op)
        if c_runtime.state() == "initialized":
            return
        with self._lock:
            if c_runtime.state() == "initialized":   # another thread started it meanwhile
                return
            c_runtime.init(self._bootstrap(groups.WORLD), heap_size_bytes)
            if self._spans_nodes(groups.WORLD, op):
                # The runtime makes a team of some of a node's ranks only once the team of all of them holds the team
                # pool (collective over the node). A group that spans nodes gathers only its own ranks when its first
                # call makes its team, so this node's team of the world is made now, with the runtime (collective
                # over the world), before any other; the world's team takes it as its node team.
                pes = groups.ranks(groups.WORLD)
                try:
                    self._world_node_team = across_nodes.make_node_team(groups.WORLD, pes,
                                                                        pes.index(groups.world_rank()), op)
                except ShmemValueError:
                    pass   # nodes of different sizes: no team spans them (every rank sees it alike, before exchanging)

    def _bootstrap(self, group: str) -> c_runtime.Bootstrap:
        """The runtime's bootstrap over the handler's exchange of ``group``."""
        exchange = groups.bootstrap(group)
        return c_runtime.Bootstrap(exchange.rank, exchange.size, exchange.all_gather, exchange.barrier)

    def _element(self, tensor: Any) -> c_runtime.ElementType:
        """``tensor``'s element type as the engine names it."""
        return c_runtime.ElementType(*tensors.element_type(tensor))

    def _spans_nodes(self, name: str, op: str) -> bool:
        """Whether the ranks of group ``name`` lie on more than one node (as the runtime found the nodes when it
        started: the ranks that map each other's shared memory)."""
        with self._lock:
            self._ensure_runtime(op)
            spans = self._spanning.get(name)
            if spans is None:
                nodes = c_runtime.debug_state()["nodes"]
                spans = len({nodes[pe] for pe in groups.ranks(name)}) > 1
                self._spanning[name] = spans
            return spans

    def _other_nodes(self) -> tuple:
        """The PEs of the other nodes, and the runtime's transport to them ("ucx") where it reaches every one (the
        runtime connects every rank of the other nodes or none, agreed at init), else None: as the runtime said when
        this lifecycle's first barrier asked (a rank found gone since fails the exchange at once)."""
        with self._lock:
            if self._across is None:
                state = c_runtime.debug_state()
                node = state["nodes"][state["rank"]]
                others = [pe for pe, pe_node in enumerate(state["nodes"]) if pe_node != node]
                names = {state["transports"][pe] for pe in others} - {"lost"}
                transport = next(iter(names), None) if len(names) <= 1 and "none" not in names else None
                self._across = (others, transport)
            return self._across

    def _meet_other_nodes(self, others: list, transport: str) -> None:
        """One message each way with every rank of the other nodes (``others``) over the runtime's transport, all
        posted at once.

        Raises:
            ShmemTimeoutError: some did not answer within the runtime's timeout, or their node is gone (each named).
        """
        mine = ctypes.create_string_buffer(1)
        rooms = ctypes.create_string_buffer(len(others))
        base = ctypes.addressof(rooms)
        _, failed, first = c_runtime.exchange_messages(
            _BARRIER_TAG, [(pe, ctypes.addressof(mine), 1, base + i, 1) for i, pe in enumerate(others)])
        if failed:
            raise ShmemTimeoutError(
                f"barrier across nodes failed: op=barrier missing_ranks={[others[i] for i in failed]} "
                f"timeout_sec={c_runtime.read_config()['timeout_sec']:g} ({transport}: "
                f"{first.splitlines()[0] if first else 'failed'})")

    def _team(self, name: str, op: str) -> _Team:
        """The team of group ``name`` (created on its first collective: collective over the group). A group that
        spans nodes runs its collectives in phases (:mod:`.across_nodes`).

        Raises:
            ShmemValueError: the group spans nodes, for an operation that stays within a node here (rendezvous, MoE
                dispatch and combine), or where the runtime does not reach the other nodes.
        """
        with self._lock:
            self._ensure_runtime(op)
            team = self._teams.get(name)
            spans = team.hierarchy is not None if team is not None else self._spans_nodes(name, op)
            if spans and op in _WITHIN_A_NODE:
                pes, nodes = groups.ranks(name), c_runtime.debug_state()["nodes"]
                raise ShmemValueError(
                    f"`group` must lie on one node for {op} on MindSpore, but got ranks {pes} on nodes "
                    f"{sorted({nodes[pe] for pe in pes})} (a group that spans nodes takes one-sided calls, barrier, "
                    f"the collectives and send/recv here): op={op} group={name}")
            if team is None:
                pes = groups.ranks(name)
                me = pes.index(groups.world_rank())
                if spans:
                    made = self._world_node_team if name == groups.WORLD else None
                    hierarchy = across_nodes.make_hierarchy(name, pes, me, self._other_nodes()[1], op, made)
                    if made is not None:
                        self._world_node_team = None   # the world's hierarchy owns it now
                    team = _Team(hierarchy.engine.node_team, pes, me, hierarchy)
                else:
                    team = _Team(c_runtime.team_create(pes, self._bootstrap(name)), pes, me)
                self._teams[name] = team
            return team

    def _pe(self, rank: int, name: str, op: str) -> int:
        """The world rank of group rank ``rank`` (checked against the group)."""
        self._ensure_runtime(op)
        pes = groups.ranks(name)
        return pes[checks.rank_in_group(rank, "target_rank", len(pes))]

    def empty(self, dims: tuple, dtype: object = None) -> Any:
        """A tensor of checked ``dims`` over a new allocation of the symmetric heap (collective over the world; where
        the world spans nodes, checked against every rank of the job: :meth:`_check_across_nodes`)."""
        dtype = tensors.default_dtype() if dtype is None else dtype
        info = tensors.dtype_info(dtype)
        numel = 1
        for d in dims:
            numel *= d
        with self._lock:
            self._ensure_runtime("empty")
            across = self._spans_nodes(groups.WORLD, "empty")
            try:
                allocation = c_runtime.allocate(numel * info.itemsize, _ALIGNMENT, _call_site())
            except ShmemError as error:
                if across:   # the other nodes' ranks learn of it instead of waiting for this rank
                    self._check_across_nodes("allocation", failure_kind(error), -1, -1)
                raise
            if across:
                try:
                    self._check_across_nodes("allocation", AGREED, allocation.heap_offset, allocation.bytes)
                except ShmemError:
                    # Every rank of this node saw the same records: they all free it again.
                    c_runtime.free(allocation.id, _call_site())
                    raise
            made = tensors.wrap(allocation.address, dims, dtype)
            self._allocations[allocation.address] = _Allocation(allocation, [made])
        return made[0]

    def free(self, tensor: Any) -> None:
        """Frees the allocation a tensor from :meth:`empty` starts (collective over the world; where the world spans
        nodes, checked against every rank of the job first), and marks every tensor made over it, and every view of
        them, freed."""
        _CHECKS.tensor(tensor, "tensor")
        address = tensors.address(tensor)
        with self._lock:
            allocation = self._allocations.get(address)
            if allocation is None:
                raise ShmemValueError(f"`tensor` must be a tensor from symm.empty (not freed yet), but got one at "
                                      f"{address:#x}")
            tensors.synchronize()
            if self._spans_nodes(groups.WORLD, "free"):
                self._check_across_nodes("free", AGREED, allocation.info.heap_offset, allocation.info.bytes)
            c_runtime.free(allocation.info.id, _call_site())
            del self._allocations[address]
            tensors.invalidate(allocation.tensors() + [(tensor, None)], allocation.info.id,
                               c_runtime.debug_state()["lifecycle"])

    def _check_across_nodes(self, what: str, status: int, offset: int, nbytes: int) -> None:
        """Checks an allocation or a free against every rank of the job (the world spans nodes): the runtime checks
        each against the ranks of this node only (each node maps its own ranks' heaps), but a symmetric tensor must lie
        at the same heap offset on every rank of the job for the one-sided calls across nodes to reach it. Over
        MindSpore's world group, bounded by the runtime's timeout.

        Args:
            what: ``"allocation"`` or ``"free"``, as the messages name it.
            status: what happened on this rank's node: ``AGREED``, or the kind of its failure.
            offset: the allocation's heap offset on this rank (-1 after a failure).
            nbytes: its bytes (-1 after a failure).

        Raises:
            ShmemMismatchError: a rank of another node allocated or frees elsewhere (both named).
            ShmemOutOfMemoryError, ShmemMismatchError, ShmemStateError: a rank of another node failed (named; that
                rank raised the cause).
            ShmemTimeoutError: a rank did not come in time.
        """
        exchange = groups.bootstrap(groups.WORLD)
        gathered = exchange.all_gather(_ACROSS_NODES.pack(status, offset, nbytes))
        if status != AGREED:
            return   # the caller raises its own failure
        records = [_ACROSS_NODES.unpack_from(gathered, r * _ACROSS_NODES.size) for r in range(exchange.size)]
        for rank, (their_status, _offset, _bytes) in enumerate(records):
            if their_status != AGREED:
                raise failure_class(their_status)(f"symmetric {what} failed on another node's rank: rank={rank} "
                                                     f"this_rank={exchange.rank} (that rank raised the cause)")
        for rank, (_status, their_offset, their_bytes) in enumerate(records):
            if (their_offset, their_bytes) != (offset, nbytes):
                raise ShmemMismatchError(f"ranks disagree on a symmetric {what} across nodes: rank={exchange.rank} "
                                         f"bytes={nbytes} offset={offset:#x}, rank={rank} bytes={their_bytes} "
                                         f"offset={their_offset:#x}")

    def shutdown(self) -> None:
        """Releases the runtime (collective over the world); nothing to do when it is not running."""
        with self._lock:
            if c_runtime.state() != "initialized":
                return
            tensors.synchronize()
            c_runtime.shutdown(self._bootstrap(groups.WORLD))
            self._teams.clear()
            self._spanning.clear()
            self._across = None
            self._world_node_team = None   # released with the lifecycle

    def rendezvous(self, t: Any, name: str) -> tuple:
        """Every group rank's copy of one symmetric tensor, checked to be the same range on every rank (collective
        over the group ``name``).

        Returns:
            ``(rank, buffer_ptrs, buffer_size, view, barrier)`` of the user API's ``SymmetricMemory``: ``view``
            views a rank's copy as a tensor over that rank's memory.
        """
        if c_runtime.state() != "initialized":
            raise ShmemStateError("symmetric memory is not initialised: op=rendezvous (call symm.empty() on every "
                                  "rank first)")
        address, nbytes = tensors.address(t), tensors.nbytes(t)
        offset, holder = -1, None
        for allocation in self._allocations.values():
            info = allocation.info
            if info.address <= address and address + nbytes <= info.address + info.bytes:
                offset, holder = info.heap_offset + (address - info.address), allocation
        team = self._team(name, "rendezvous")
        rows = self._exchange(team, [offset, nbytes])
        mismatch = checks.rendezvous_mismatch(rows)
        if mismatch is not None:
            raise ShmemValueError(mismatch)
        pointers = [c_runtime.peer_address(address, nbytes, pe) for pe in team.pes]

        def view(rank: int, begin: int, end: int, shape: tuple, dtype: Any) -> Any:
            del end   # the shape says how far the view reaches
            made, array = tensors.wrap(pointers[rank] + begin, shape, dtype)
            holder.views.append((weakref.ref(made), weakref.ref(array)))   # the allocation's free marks it too
            return made

        return team.me, pointers, nbytes, view, lambda: self.barrier(name)

    def _exchange(self, team: _Team, values: list) -> list:
        """Every member's ``values`` (int64s, as many on every rank), in group-rank order, through the engine."""
        mine = array("q", values)
        every = array("q", bytes(8 * len(values) * len(team.pes)))
        c_runtime.all_gather(team.id, every.buffer_info()[0], len(every) * 8, mine.buffer_info()[0], len(mine) * 8,
                             c_runtime.ElementType("int64", 8, "int64"))
        n = len(values)
        return [list(every[i * n:(i + 1) * n]) for i in range(len(team.pes))]

    def debug_state(self) -> dict:
        """The runtime's snapshot with the runtime face's keys, upstream's included (:func:`snapshot.project`): the
        runtime's root is the world group, and the API holds the one reference of a live lifecycle."""
        raw = c_runtime.debug_state()
        live = raw["state"] != "uninitialized"
        return snapshot.project(raw, list(range(raw["world_size"])) if live else [], 1 if live else 0)

    def available(self) -> bool:
        """Whether the runtime's C ABI library loads in this installation."""
        try:
            c_runtime.library()
        except ShmemStateError:
            return False
        return True

    # ------------------------------------------------------------------ primitives
    def _require_symmetric(self, t: Any, name: str) -> None:
        """Raises ValueError unless ``t`` lies inside a symmetric allocation of this process."""
        address, end = tensors.address(t), tensors.address(t) + tensors.nbytes(t)
        inside = any(a.info.address <= address and end <= a.info.address + a.info.bytes
                     for a in self._allocations.values())
        checks.require_symmetric(inside, name, address)

    def _address(self, t: Any, at: int) -> int:
        """The address of element ``at`` of a checked tensor."""
        return tensors.address(t) + at * int(t.itemsize)

    def put(self, target: Any, target_at: int, src: Any, src_at: int, n: int, rank: int, name: str) -> None:
        """``shmem_put`` on checked windows."""
        self._require_symmetric(target, "target")
        pe = self._pe(rank, name, "shmem_put")
        nbytes = n * int(target.itemsize)
        tensors.synchronize()
        c_runtime.put(self._address(target, target_at), self._address(src, src_at), nbytes, nbytes, pe)

    def get(self, target: Any, target_at: int, src: Any, src_at: int, n: int, rank: int, name: str) -> None:
        """``shmem_get`` on checked windows."""
        self._require_symmetric(src, "src")
        pe = self._pe(rank, name, "shmem_get")
        nbytes = n * int(target.itemsize)
        tensors.synchronize()
        c_runtime.get(self._address(target, target_at), self._address(src, src_at), nbytes, nbytes, pe)

    def signal(self, signal: Any, offset: int, value: int, op: str, rank: int, name: str) -> None:
        """``shmem_signal_op`` on a checked element."""
        self._require_symmetric(signal, "signal")
        pe = self._pe(rank, name, "shmem_signal_op")
        tensors.synchronize()
        c_runtime.signal(self._address(signal, offset), int(signal.itemsize), value, op, pe)

    def wait_signal(self, depend_tensor: Optional[Any], signal: Any, offset: int, value: int, cmp: str) -> None:
        """``shmem_wait_for_signal`` on a checked element (``depend_tensor`` orders nothing here)."""
        del depend_tensor
        self._ensure_runtime("shmem_wait_for_signal")
        self._require_symmetric(signal, "signal")
        tensors.synchronize()
        c_runtime.wait_signal(self._address(signal, offset), int(signal.itemsize), cmp, value)

    def put_with_signal(self, target: Any, target_at: int, src: Any, src_at: int, n: int, signal: Any, offset: int,
                        value: int, op: str, rank: int, name: str) -> None:
        """``shmem_put_with_signal`` on checked windows."""
        self._require_symmetric(target, "target")
        self._require_symmetric(signal, "signal")
        pe = self._pe(rank, name, "shmem_put_with_signal")
        nbytes = n * int(target.itemsize)
        tensors.synchronize()
        c_runtime.put_with_signal(self._address(target, target_at), self._address(src, src_at), nbytes,
                                  self._address(signal, offset), int(signal.itemsize), value, op, pe)

    def barrier(self, name: str) -> None:
        """A barrier of group ``name``.

        Over a group that spans nodes, where the runtime reaches every rank of the other nodes: its team's barrier
        across nodes (the node team's barrier, one message each way with the lane, the node team's barrier again),
        the team made first where the group has none yet, as its first collective would make it (collective over the
        group: every member calls barrier). The world without a team yet meets the other nodes without making one:
        this node's barrier, one message each way with every rank of the other nodes over the runtime's transport,
        this node's barrier again (:meth:`_meet_other_nodes`). Where the runtime reaches no other node, a group that
        spans nodes has no team (the handler refuses one): MindSpore's own barrier of the group, bounded by the
        runtime's timeout. Over a group within one node: its team's barrier (made on the first call).

        Every one-sided call, across nodes too, completes before it returns, so a barrier that orders the ranks makes
        the writes before it visible after it.

        Args:
            name: the group's name.

        Raises:
            ShmemTimeoutError: a rank did not arrive in time, or the runtime found its node gone (named).
            ShmemValueError: a group that spans nodes with different numbers of its ranks on them (its team cannot be
                made; every member raises it).
        """
        team = self._teams.get(name)
        if team is None and self._spans_nodes(name, "barrier"):
            others, transport = self._other_nodes()
            if transport is None:
                tensors.synchronize()
                groups.bootstrap(name).barrier()
                return
            if name == groups.WORLD:
                tensors.synchronize()
                c_runtime.barrier()
                self._meet_other_nodes(others, transport)
                c_runtime.barrier()
                return
        team = team or self._team(name, "barrier")
        tensors.synchronize()
        if team.hierarchy is not None:
            team.hierarchy.barrier("forward")
            return
        c_runtime.team_barrier(team.id)

    # ------------------------------------------------------------------ collectives
    def wire(self, value: object, dtype: object, op: str) -> Optional[str]:
        """The wire format a reduction travels in (None: the tensor's own dtype): an explicit ``value`` that cannot
        apply raises; the environment's default applies where it can."""
        explicit = value is not None
        if explicit:
            wire = checks.low_precision_name(tensors.dtype_name(value) if not isinstance(value, str) else value,
                                             "low_precision_dtype")
        else:
            wire = c_runtime.low_precision_default()   # read by the runtime once per lifecycle
        if wire is None:
            return None
        rule = checks.low_precision_rule(tensors, _WIRE_WIDTH[wire], dtype, op)
        if rule is None:
            return wire
        if explicit:
            raise ShmemValueError(f"`low_precision_dtype` must be {rule}, but got {wire}")
        return None

    def all_gather(self, output: Any, data: Any, name: str, role: str = "forward") -> Any:
        """``shmem_allgather`` on checked arguments, through the handler's autograd (``role``: the call's, the fused
        op's "fused_gather")."""
        return autograd.differentiable("all_gather", self, (output, data), {"group": name, "role": role})

    def all_reduce(self, t: Any, op: str, name: str, wire: Optional[str], backward: str) -> Any:
        """``shmem_allreduce`` on checked arguments, through the handler's autograd."""
        return autograd.differentiable("all_reduce", self, (t,), {"op": op, "group": name, "wire": wire,
                                                                 "backward": backward, "role": "forward"})

    def reduce_scatter(self, output: Any, data: Any, op: str, name: str, wire: Optional[str],
                       role: str = "forward") -> Any:
        """``shmem_reduce_scatter`` on checked arguments, through the handler's autograd (``role``: the call's, the
        fused op's "fused_scatter")."""
        return autograd.differentiable("reduce_scatter", self, (output, data), {"op": op, "group": name, "wire": wire,
                                                                                "role": role})

    def all_to_all(self, sends: list, receive: Any, counts: list, name: str) -> Any:
        """``shmem_alltoall`` on checked arguments, through the handler's autograd."""
        return autograd.differentiable("all_to_all", self, (receive, *sends),
                                     {"group": name, "receive_counts": tuple(counts), "role": "forward"})

    def moe(self, direction: str, output: Any, data: Any, in_splits: Any, in_offsets: Optional[Any], out_table: Any,
            name: str, major_align: int, wire: Optional[str]) -> Any:
        """``shmem_moe_dispatch`` / ``shmem_moe_combine`` on checked arguments, through the handler's autograd."""
        splits = (in_splits,) if in_offsets is None else (in_splits, in_offsets)
        return autograd.differentiable("moe", self, (output, data, out_table, *splits),
                                       {"group": name, "direction": direction, "major_align": major_align,
                                        "wire": wire, "role": "forward"})

    def moe_into(self, output: Any, data: Any, in_splits: Any, in_offsets: Optional[Any], out_table: Any,
                 direction: str, major_align: int, name: str, role: str, wire: Optional[str] = None) -> Any:
        """MoE dispatch or combine on checked arguments (no autograd); ``wire``: a low-precision wire format the rows
        travel in (the runtime's row codec encodes them before the exchange and decodes them after it, as on
        torch), or None."""
        team = self._team(name, "shmem_moe_" + direction)
        experts = tensors.numel(in_splits) // len(team.pes)
        rows_in, rows_out = int(data.shape[0]), int(output.shape[0])
        row_elems = _row_numel(data)
        low = wire is not None and len(team.pes) > 1
        if low:
            source = tensors.contiguous(data)
            row_bytes = c_runtime.wire_row_bytes(wire, row_elems)
            send, receive = tensors.new_bytes(rows_in * row_bytes), tensors.new_bytes(rows_out * row_bytes)
            decoded = tensors.new_empty(tuple(output.shape), output)
            tensors.synchronize()
            c_runtime.encode_rows(wire, tensors.dtype_info(source.dtype).name, tensors.address(source), rows_in,
                                  row_elems, tensors.address(send))
        else:
            send, receive = data, output
            row_bytes = int(data.itemsize) * row_elems
            tensors.synchronize()
        if team.hierarchy is not None:
            team.hierarchy.moe(direction, send, rows_in, receive, rows_out, in_splits, in_offsets, out_table, experts,
                               major_align, role)
        else:
            c_runtime.moe_exchange(team.id, direction, experts, tensors.address(send), rows_in,
                                   tensors.address(receive), rows_out, row_bytes, tensors.address(in_splits),
                                   None if in_offsets is None else tensors.address(in_offsets), major_align,
                                   tensors.address(out_table),
                                   tensors.address(out_table) + 8 * tensors.numel(in_splits), role)
        if low:
            c_runtime.decode_rows(wire, tensors.address(receive), rows_out, row_elems,
                                  tensors.dtype_info(output.dtype).name, tensors.address(decoded))
            tensors.copy_into(output, decoded)
        return output

    def all_gather_into(self, output: Any, data: Any, name: str, role: str) -> Any:
        """all_gather on checked arguments (no autograd): ``output`` receives every member's ``data``."""
        team = self._team(name, "shmem_allgather")
        tensors.synchronize()
        if team.hierarchy is not None:
            team.hierarchy.all_gather(output, data, role)
            return output
        c_runtime.all_gather(team.id, tensors.address(output), tensors.nbytes(output), tensors.address(data),
                             tensors.nbytes(data), self._element(data), role)
        return output

    def all_reduce_into(self, tensor: Any, op: str, name: str, role: str, wire: Optional[str] = None) -> Any:
        """all_reduce in place on checked arguments (no autograd)."""
        team = self._team(name, "shmem_allreduce")
        tensors.synchronize()
        if team.hierarchy is not None:
            team.hierarchy.all_reduce(tensor, op, wire, None, role)
            return tensor
        c_runtime.all_reduce(team.id, tensors.address(tensor), None, tensors.nbytes(tensor),
                             tensors.dtype_info(tensor.dtype).reduce, op, wire, role)
        return tensor

    def reduce_scatter_into(self, output: Any, data: Any, op: str, name: str, role: str,
                            wire: Optional[str] = None) -> Any:
        """reduce_scatter on checked arguments (no autograd)."""
        team = self._team(name, "shmem_reduce_scatter")
        tensors.synchronize()
        if team.hierarchy is not None:
            team.hierarchy.reduce_scatter(output, data, op, wire, role)
            return output
        c_runtime.reduce_scatter(team.id, tensors.address(output), tensors.nbytes(output), tensors.address(data),
                                 tensors.nbytes(data), tensors.dtype_info(data.dtype).reduce, op, wire, role)
        return output

    def all_to_all_into(self, sends: Sequence[Any], receive: Any, receive_counts: Sequence[int], name: str,
                        role: str) -> Any:
        """all_to_all on checked arguments (no autograd)."""
        team = self._team(name, "shmem_alltoall")
        tensors.synchronize()
        if team.hierarchy is not None:
            team.hierarchy.all_to_all(sends, receive, receive_counts, role)
            return receive
        c_runtime.all_to_all(team.id, [(tensors.address(t), tensors.nbytes(t)) for t in sends],
                             tensors.address(receive), tensors.nbytes(receive), list(receive_counts),
                             self._element(receive), role)
        return receive

    def _registered_team(self, name: str, op: str) -> _Team:
        """The team of a group that already ran a collective: point to point cannot create one (that is collective
        over the whole group, and only two of its ranks take part)."""
        self._ensure_runtime(op)
        team = self._teams.get(name)
        if team is None:
            raise ShmemStateError(f"group has no channel yet (run a collective or symm.barrier on it first): op={op} "
                                  f"group={name}")
        return team

    def _refuse_recording(self, op: str) -> None:
        if autograd.recording():
            raise ShmemStateError(f"{op} cannot be differentiated on mindspore (a Cell's bprop runs only when one "
                                  f"of its inputs is differentiated, and a receive buffer never is, so the gradient "
                                  f"would never travel back; call it outside grad/value_and_grad): op={op}")

    def send(self, t: Any, dst: int, name: str) -> None:
        """``shmem_send`` on checked arguments (not while a gradient graph is recorded)."""
        self._refuse_recording("shmem_send")
        team = self._registered_team(name, "shmem_send")
        peer = checks.peer(dst, "dst_rank", len(team.pes), team.me)
        tensors.synchronize()
        if team.hierarchy is not None:
            team.hierarchy.send(t, peer)
            return
        c_runtime.send(team.id, tensors.address(t), tensors.nbytes(t), self._element(t), peer)

    def recv(self, t: Any, src: int, name: str) -> Any:
        """``shmem_recv`` on checked arguments (not while a gradient graph is recorded)."""
        self._refuse_recording("shmem_recv")
        team = self._registered_team(name, "shmem_recv")
        peer = checks.peer(src, "src_rank", len(team.pes), team.me)
        tensors.synchronize()
        if team.hierarchy is not None:
            team.hierarchy.recv(t, peer)
            return t
        c_runtime.recv(team.id, tensors.address(t), tensors.nbytes(t), self._element(t), peer)
        return t

    # ------------------------------------------------------------------ fused ops
    def all_gather_matmul(self, a: Any, b: Any, c: Optional[Any], gather_out: Any, signal: Optional[Any],
                          block_size: Optional[int], name: str, dims: tuple) -> tuple:
        """``fused_all_gather_matmul`` on checked shapes: one all_gather, then one matmul (not pipelined; ``c``
        None: the product is a new tensor)."""
        del signal, block_size, dims   # the pipeline's scratch and block (checked alike); this path runs one gather
        self.all_gather(gather_out, a, name, "fused_gather")
        product = tensors.matmul(gather_out, b)
        if c is not None:
            tensors.copy_into(c, product)
            return gather_out, c
        return gather_out, product

    def matmul_reduce_scatter(self, x1: Any, x2: Any, symm_tensor: Any, signal: Optional[Any], reduce_op: str,
                              name: str, dims: tuple) -> Any:
        """``fused_matmul_reduce_scatter`` on checked shapes: one matmul, then one reduce_scatter (not pipelined;
        ``symm_tensor`` is not used)."""
        del symm_tensor, signal   # the pipeline's scratch (checked alike); this path runs one reduce_scatter
        n = self.group_size(name)
        rows, _, columns = dims
        product = tensors.matmul(x1, x2)
        output = tensors.new_flat(rows // n * columns, product.dtype).reshape((rows // n, columns))
        return self.reduce_scatter(output, product, reduce_op, name, None, "fused_scatter")
