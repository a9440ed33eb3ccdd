"""The runtime's calls over its C ABI for a framework handler: the path of frameworks other than torch.

:class:`CAbiCalls` is what :class:`._api.Api` hands a checked call to on MindSpore (its module docstring lists the
calls). What the framework does differently lives in its handler (:mod:`hyper_parallel.platform.mindspore`): what a
tensor is, its dtype and address, tensors over heap memory, synchronisation, groups and their bootstrap, and
autograd. What is here needs no framework: the runtime's lifecycle and teams, group-local ranks, and the calls of
:mod:`hyper_parallel.core.multicore.c_runtime`. Every call drains the framework's queue first
(``handler.synchronize``); the runtime's calls complete before they return.
"""

from __future__ import annotations

import os
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

from hyper_parallel.core.multicore import c_runtime
from hyper_parallel.core.multicore.errors import ShmemStateError
from hyper_parallel.core.symmetric_memory import _gradients, _rules
from hyper_parallel.core.symmetric_memory._api import SymmetricMemory
from hyper_parallel.core.symmetric_memory._checks import Checks

_ALIGNMENT = 64   # bytes, the runtime face's default: a cache line
_HEAP_ALIAS = "SYMMETRIC_MEMORY_HEAP_SIZE"
_HEAP_VARIABLE = "HYPER_PARALLEL_SHMEM_HEAP_SIZE"
_LOW_PRECISION_VARIABLE = "SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE"
_WIRE_WIDTH = {"float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


@dataclass
class _Team:
    id: int
    pes: list
    me: int


class CAbiCalls:
    """The runtime's calls over its C ABI for one framework handler; one instance per process and framework."""

    fast = None   # every call takes the checks: the C ABI's calls cost more than they do

    def __init__(self, handler: Any) -> None:
        self.h = handler
        self.checks = Checks(handler)
        self._lock = threading.RLock()
        self._allocations: dict = {}   # address -> c_runtime.Allocation, for free
        self._teams: dict = {}         # group name -> _Team

    # ------------------------------------------------------------------ groups and lifecycle
    def group_key(self, group: Optional[object]) -> str:
        """The group's name (None: the world group)."""
        return self.h.group_name(group)

    def group_size(self, name: str) -> int:
        """The number of ranks of the group ``name``."""
        self.h.require_initialized("symmetric_memory")
        return len(self.h.group_ranks(name))

    def _ensure_runtime(self, op: str) -> None:
        self.h.require_initialized(op)
        if c_runtime.state() == "initialized":
            return
        if _HEAP_ALIAS in os.environ and _HEAP_VARIABLE not in os.environ:
            os.environ[_HEAP_VARIABLE] = os.environ[_HEAP_ALIAS]
        c_runtime.init(self._bootstrap(self.h.world_group()))

    def _bootstrap(self, group: str) -> c_runtime.Bootstrap:
        """The runtime's bootstrap over the handler's exchange of ``group``."""
        exchange = self.h.bootstrap(group)
        return c_runtime.Bootstrap(exchange.rank, exchange.size, exchange.all_gather, exchange.barrier)

    def _element(self, tensor: Any) -> c_runtime.ElementType:
        """``tensor``'s element type as the engine names it."""
        return c_runtime.ElementType(*self.h.element_type(tensor))

    def _team(self, name: str, op: str) -> _Team:
        """The team of group ``name`` (created on its first collective: collective over the group)."""
        with self._lock:
            self._ensure_runtime(op)
            team = self._teams.get(name)
            if team is None:
                pes = self.h.group_ranks(name)
                me = pes.index(self.h.world_rank())
                team = _Team(c_runtime.team_create(pes, self._bootstrap(name)), pes, me)
                self._teams[name] = team
            return team

    def _pe(self, rank: int, name: str, op: str) -> int:
        """The world rank of group rank ``rank`` (checked against the group)."""
        self._ensure_runtime(op)
        pes = self.h.group_ranks(name)
        return pes[self.checks.rank_in_group(rank, "target_rank", len(pes))]

    def empty(self, dims: tuple, dtype: object = None) -> Any:
        """A tensor of checked ``dims`` over a new allocation of the symmetric heap (collective over the world)."""
        dtype = self.h.default_dtype() if dtype is None else dtype
        info = self.h.dtype_info(dtype)
        numel = 1
        for d in dims:
            numel *= d
        with self._lock:
            self._ensure_runtime("empty")
            allocation = c_runtime.allocate(numel * info.itemsize, _ALIGNMENT, _rules.call_site())
            self._allocations[allocation.address] = allocation
        return self.h.wrap(allocation.address, dims, dtype)

    def free(self, tensor: Any) -> None:
        """Frees the allocation a tensor from :meth:`empty` starts (collective over the world)."""
        self.checks.tensor(tensor, "tensor")
        address = self.h.address(tensor)
        with self._lock:
            allocation = self._allocations.get(address)
            if allocation is None:
                raise ValueError(f"`tensor` must be a tensor from symm.empty (not freed yet), but got one at "
                                 f"{address:#x}")
            self.h.synchronize()
            c_runtime.free(allocation.id, _rules.call_site())
            del self._allocations[address]

    def shutdown(self) -> None:
        """Releases the runtime (collective over the world); nothing to do when it is not running."""
        with self._lock:
            if c_runtime.state() != "initialized":
                return
            self.h.synchronize()
            c_runtime.shutdown(self._bootstrap(self.h.world_group()))
            self._teams.clear()

    def rendezvous(self, t: Any, group: Optional[object], checks: Checks) -> SymmetricMemory:
        """Every group rank's copy of one symmetric tensor, checked to be the same range on every rank (collective
        over the group); the handle views each copy as a tensor over that rank's memory."""
        if c_runtime.state() != "initialized":
            raise ShmemStateError("symmetric memory is not initialised: op=rendezvous (call symm.empty() on every "
                                  "rank first)")
        address, nbytes = self.h.address(t), self.h.nbytes(t)
        offset = -1
        for allocation in self._allocations.values():
            if allocation.address <= address and address + nbytes <= allocation.address + allocation.bytes:
                offset = allocation.heap_offset + (address - allocation.address)
        name = self.h.group_name(group)
        team = self._team(name, "rendezvous")
        rows = self._exchange(team, [offset, nbytes])
        mismatch = _rules.rendezvous_mismatch(rows)
        if mismatch is not None:
            raise ValueError(mismatch)
        pointers = [c_runtime.peer_address(address, nbytes, pe) for pe in team.pes]

        def view(rank: int, begin: int, end: int, shape: tuple, dtype: Any) -> Any:
            del end   # the shape says how far the view reaches
            return self.h.wrap(pointers[rank] + begin, shape, dtype)

        return SymmetricMemory(checks, team.me, pointers, nbytes, view, lambda: self.barrier(name))

    def _exchange(self, team: _Team, values: list) -> list:
        """Every member's ``values`` (int64s, as many on every rank), in group-rank order, through the engine."""
        mine = array("q", values)
        every = array("q", bytes(8 * len(values) * len(team.pes)))
        c_runtime.all_gather(team.id, every.buffer_info()[0], len(every) * 8, mine.buffer_info()[0], len(mine) * 8,
                             c_runtime.ElementType("int64", 8, "int64"))
        n = len(values)
        return [list(every[i * n:(i + 1) * n]) for i in range(len(team.pes))]

    def debug_state(self) -> dict:
        """The runtime's snapshot (keys as the torch runtime face's ``debug_state``)."""
        return c_runtime.debug_state()

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
        address, end = self.h.address(t), self.h.address(t) + self.h.nbytes(t)
        inside = any(a.address <= address and end <= a.address + a.bytes for a in self._allocations.values())
        _rules.require_symmetric(inside, name, address)

    def _address(self, t: Any, at: int) -> int:
        """The address of element ``at`` of a checked tensor."""
        return self.h.address(t) + at * int(t.itemsize)

    def put(self, target: Any, target_at: int, src: Any, src_at: int, n: int, rank: int, name: str) -> None:
        """``shmem_put`` on checked windows."""
        self._require_symmetric(target, "target")
        pe = self._pe(rank, name, "shmem_put")
        nbytes = n * int(target.itemsize)
        self.h.synchronize()
        c_runtime.put(self._address(target, target_at), self._address(src, src_at), nbytes, nbytes, pe)

    def get(self, target: Any, target_at: int, src: Any, src_at: int, n: int, rank: int, name: str) -> None:
        """``shmem_get`` on checked windows."""
        self._require_symmetric(src, "src")
        pe = self._pe(rank, name, "shmem_get")
        nbytes = n * int(target.itemsize)
        self.h.synchronize()
        c_runtime.get(self._address(target, target_at), self._address(src, src_at), nbytes, nbytes, pe)

    def signal(self, signal: Any, offset: int, value: int, op: str, rank: int, name: str) -> None:
        """``shmem_signal_op`` on a checked element."""
        self._require_symmetric(signal, "signal")
        pe = self._pe(rank, name, "shmem_signal_op")
        self.h.synchronize()
        c_runtime.signal(self._address(signal, offset), int(signal.itemsize), value, op, pe)

    def wait_signal(self, depend_tensor: Optional[Any], signal: Any, offset: int, value: int, cmp: str) -> None:
        """``shmem_wait_for_signal`` on a checked element (``depend_tensor`` orders nothing here)."""
        del depend_tensor
        self._ensure_runtime("shmem_wait_for_signal")
        self._require_symmetric(signal, "signal")
        self.h.synchronize()
        c_runtime.wait_signal(self._address(signal, offset), int(signal.itemsize), cmp, value)

    def put_with_signal(self, target: Any, target_at: int, src: Any, src_at: int, n: int, signal: Any, offset: int,
                        value: int, op: str, rank: int, name: str) -> None:
        """``shmem_put_with_signal`` on checked windows."""
        self._require_symmetric(target, "target")
        self._require_symmetric(signal, "signal")
        pe = self._pe(rank, name, "shmem_put_with_signal")
        nbytes = n * int(target.itemsize)
        self.h.synchronize()
        c_runtime.put(self._address(target, target_at), self._address(src, src_at), nbytes, nbytes, pe)
        c_runtime.signal(self._address(signal, offset), int(signal.itemsize), value, op, pe)

    def barrier(self, name: str) -> None:
        """A barrier of group ``name`` (creating its team on its first collective)."""
        team = self._team(name, "barrier")
        self.h.synchronize()
        c_runtime.team_barrier(team.id)

    # ------------------------------------------------------------------ collectives
    def wire(self, value: object, dtype: object, op: str) -> Optional[str]:
        """The wire format a reduction travels in (None: the tensor's own dtype): an explicit ``value`` that cannot
        apply raises; the environment's default applies where it can."""
        explicit = value is not None
        name = value if explicit else os.environ.get(_LOW_PRECISION_VARIABLE, "")
        wire = _rules.low_precision_name(self.h.dtype_name(name) if not isinstance(name, str) else name,
                                         "low_precision_dtype" if explicit else _LOW_PRECISION_VARIABLE)
        if wire is None:
            return None
        rule = self.checks.low_precision_rule(_WIRE_WIDTH[wire], dtype, op)
        if rule is None:
            return wire
        if explicit:
            raise ValueError(f"`low_precision_dtype` must be {rule}, but got {wire}")
        return None

    def all_gather(self, output: Any, data: Any, name: str) -> Any:
        """``shmem_allgather`` on checked arguments, through the handler's autograd."""
        return self.h.differentiable("all_gather", self, (output, data), {"group": name})

    def all_reduce(self, t: Any, op: str, name: str, wire: Optional[str], backward: str) -> Any:
        """``shmem_allreduce`` on checked arguments, through the handler's autograd."""
        return self.h.differentiable("all_reduce", self, (t,), {"op": op, "group": name, "wire": wire,
                                                                 "backward": backward})

    def reduce_scatter(self, output: Any, data: Any, op: str, name: str, wire: Optional[str]) -> Any:
        """``shmem_reduce_scatter`` on checked arguments, through the handler's autograd."""
        return self.h.differentiable("reduce_scatter", self, (output, data), {"op": op, "group": name, "wire": wire})

    def all_to_all(self, sends: list, receive: Any, counts: list, name: str) -> Any:
        """``shmem_alltoall`` on checked arguments, through the handler's autograd."""
        return self.h.differentiable("all_to_all", self, (receive, *sends),
                                     {"group": name, "receive_counts": tuple(counts)})

    def all_gather_into(self, output: Any, data: Any, name: str) -> Any:
        """all_gather on checked arguments (no autograd): ``output`` receives every member's ``data``."""
        team = self._team(name, "shmem_allgather")
        self.h.synchronize()
        c_runtime.all_gather(team.id, self.h.address(output), self.h.nbytes(output), self.h.address(data),
                             self.h.nbytes(data), self._element(data))
        return output

    def all_reduce_into(self, tensor: Any, op: str, name: str, wire: Optional[str] = None) -> Any:
        """all_reduce in place on checked arguments (no autograd)."""
        team = self._team(name, "shmem_allreduce")
        self.h.synchronize()
        c_runtime.all_reduce(team.id, self.h.address(tensor), None, self.h.nbytes(tensor),
                             self.h.dtype_info(tensor.dtype).reduce, op, wire)
        return tensor

    def reduce_scatter_into(self, output: Any, data: Any, op: str, name: str, wire: Optional[str] = None) -> Any:
        """reduce_scatter on checked arguments (no autograd)."""
        team = self._team(name, "shmem_reduce_scatter")
        self.h.synchronize()
        c_runtime.reduce_scatter(team.id, self.h.address(output), self.h.nbytes(output), self.h.address(data),
                                 self.h.nbytes(data), self.h.dtype_info(data.dtype).reduce, op, wire)
        return output

    def all_to_all_into(self, sends: Sequence[Any], receive: Any, receive_counts: Sequence[int], name: str) -> Any:
        """all_to_all on checked arguments (no autograd)."""
        team = self._team(name, "shmem_alltoall")
        self.h.synchronize()
        c_runtime.all_to_all(team.id, [(self.h.address(t), self.h.nbytes(t)) for t in sends], self.h.address(receive),
                             self.h.nbytes(receive), list(receive_counts), self._element(receive))
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
        if self.h.recording():
            raise ShmemStateError(f"{op} cannot be differentiated on {self.h.name} (a Cell's bprop runs only when one "
                                  f"of its inputs is differentiated, and a receive buffer never is, so the gradient "
                                  f"would never travel back; call it outside grad/value_and_grad): op={op}")

    def send(self, t: Any, dst: int, name: str) -> None:
        """``shmem_send`` on checked arguments (not while a gradient graph is recorded)."""
        self._refuse_recording("shmem_send")
        team = self._registered_team(name, "shmem_send")
        peer = self.checks.peer(dst, "dst_rank", len(team.pes), team.me)
        self.h.synchronize()
        c_runtime.send(team.id, self.h.address(t), self.h.nbytes(t), self._element(t), peer)

    def recv(self, t: Any, src: int, name: str) -> Any:
        """``shmem_recv`` on checked arguments (not while a gradient graph is recorded)."""
        self._refuse_recording("shmem_recv")
        team = self._registered_team(name, "shmem_recv")
        peer = self.checks.peer(src, "src_rank", len(team.pes), team.me)
        self.h.synchronize()
        c_runtime.recv(team.id, self.h.address(t), self.h.nbytes(t), self._element(t), peer)
        return t

    # ------------------------------------------------------------------ fused ops
    def all_gather_matmul(self, a: Any, b: Any, c: Optional[Any], gather_out: Any, signal: Optional[Any],
                          block_size: Optional[int], name: str, dims: tuple) -> tuple:
        """``fused_all_gather_matmul`` on checked shapes: one all_gather, then one matmul (not pipelined; ``c``
        None: the product is a new tensor)."""
        del block_size, dims   # the pipeline's block; this path runs one gather
        if signal is not None:
            self.checks.fused_signal(signal, self.group_size(name))   # torch's pipeline scratch: checked alike
        self.all_gather(gather_out, a, name)
        product = self.h.matmul(gather_out, b)
        if c is not None:
            self.h.copy_into(c, product)
            return gather_out, c
        return gather_out, product

    def matmul_reduce_scatter(self, x1: Any, x2: Any, symm_tensor: Any, signal: Optional[Any], reduce_op: str,
                              name: str, dims: tuple) -> Any:
        """``fused_matmul_reduce_scatter`` on checked shapes: one matmul, then one reduce_scatter (not pipelined;
        ``symm_tensor`` is not used)."""
        del symm_tensor
        n = self.group_size(name)
        if signal is not None:
            self.checks.fused_signal(signal, n)
        rows, _, columns = dims
        product = self.h.matmul(x1, x2)
        output = self.h.new_flat(rows // n * columns, product.dtype).reshape((rows // n, columns))
        return self.reduce_scatter(output, product, reduce_op, name, None)


class _GradientOps:
    """The gradient ops of :mod:`._gradients` on this path: the handler's tensors and the API's collectives."""

    def __init__(self, api: "CAbiCalls") -> None:
        self._api = api
        h = api.h
        self.contiguous, self.copy, self.divide = h.contiguous, h.copy, h.divide

    def empty(self, shape: Sequence[int], like: Any) -> Any:
        numel = 1
        for d in shape:
            numel *= int(d)
        return self._api.h.new_flat(numel, like.dtype).reshape(tuple(shape))

    @staticmethod
    def flat(t: Any) -> Any:
        return t.reshape(-1)

    @staticmethod
    def view(t: Any, shape: Sequence[int]) -> Any:
        return t.reshape(tuple(shape))

    def group_size(self, group: str) -> int:
        return len(self._api.h.group_ranks(group))

    def all_gather(self, output: Any, data: Any, group: str) -> None:
        self._api.all_gather_into(output, data, group)

    def reduce_scatter(self, output: Any, data: Any, group: str) -> None:
        self._api.reduce_scatter_into(output, data, "sum", group)

    def all_reduce(self, tensor: Any, op: str, group: str) -> None:
        self._api.all_reduce_into(tensor, op, group)

    def all_to_all(self, sends: list, receive: Any, counts: list, group: str) -> None:
        self._api.all_to_all_into(sends, receive, counts, group)


def differentiable_backward(api: "CAbiCalls", op: str, params: dict, inputs: tuple, grad: Any) -> tuple:
    """The gradients of a collective's inputs from its output's gradient (:mod:`._gradients`' table); the handler
    runs it as its autograd mechanism's backward.

    Args:
        api: the calls whose collectives compute the gradients.
        op: 'all_gather', 'all_reduce', 'reduce_scatter' or 'all_to_all'.
        params: the call's parameters (group, op, receive_counts, backward).
        inputs: the forward's tensor inputs.
        grad: the gradient of the output.

    Returns:
        One gradient per input (zeros for the buffers the forward only wrote).

    Raises:
        ValueError: a reduction without a gradient ('max', 'min'), or an unknown ``op``.
    """
    h, ops, group = api.h, _GradientOps(api), params["group"]
    if op == "all_gather":
        output, data = inputs
        return h.zeros_like(output), _gradients.all_gather(ops, group, data.shape, grad)
    if op == "all_reduce":
        Checks.differentiable(params["op"], "tensor")
        return (_gradients.all_reduce(ops, group, params["op"], params["backward"], grad),)
    if op == "reduce_scatter":
        output, data = inputs
        Checks.differentiable(params["op"], "input_tensor")
        return h.zeros_like(output), _gradients.reduce_scatter(ops, group, params["op"], data.shape, grad)
    if op == "all_to_all":
        receive, *sends = inputs
        grads = _gradients.all_to_all(ops, group, params["receive_counts"], [s.shape for s in sends], grad)
        return (h.zeros_like(receive), *grads)
    raise ValueError(f"`op` must be a differentiable collective, but got {op!r}")


def run_forward(api: "CAbiCalls", op: str, params: dict, inputs: tuple) -> Any:
    """The forward of a collective on checked arguments (the handler's autograd runs it)."""
    group = params["group"]
    if op == "all_gather":
        return api.all_gather_into(inputs[0], inputs[1], group)
    if op == "all_reduce":
        return api.all_reduce_into(inputs[0], params["op"], group, params["wire"])
    if op == "reduce_scatter":
        return api.reduce_scatter_into(inputs[0], inputs[1], params["op"], group, params["wire"])
    if op == "all_to_all":
        return api.all_to_all_into(inputs[1:], inputs[0], params["receive_counts"], group)
    raise ValueError(f"`op` must be a collective, but got {op!r}")
