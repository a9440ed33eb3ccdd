"""The framework handler protocol: what the user API asks of a framework, written down once.

The user API (:class:`~hyper_parallel.core.symmetric_memory._api.Api`) is framework-neutral. Everything that
differs per framework comes from the *handler* of the framework chosen at import
(:mod:`~hyper_parallel.core.symmetric_memory._framework`): ``hyper_parallel.platform.<framework>.handler.HANDLER``,
an object with the members of :class:`Handler`. Two handlers implement it, siblings under
``hyper_parallel/platform/``:

* torch's (:mod:`hyper_parallel.platform.torch`): the C++ binding ``hyper_parallel._shmem_torch`` and the runtime
  face :mod:`hyper_parallel.core.multicore.shmem`; the calls run as ``torch.library`` operators (torch.compile,
  autograd, streams) and may take an eager call before the checks (``fast``);
* MindSpore's (:mod:`hyper_parallel.platform.mindspore`): the runtime's C ABI through ctypes, tensors over heap
  memory, ``nn.Cell`` bprop.

A handler provides, in five parts:

* **tensor facts** (:class:`TensorFacts`): what the shared checks ask about tensors and dtypes, and the arithmetic
  the gradient table needs;
* **calls** (:class:`Calls`): the runtime's calls on checked arguments: the lifecycle, the primitives, the
  collectives (with the framework's autograd), the fused ops, the setup calls and the debug snapshot;
* **groups**, through the calls: ``group_key(group)`` turns ``group=`` into the key every other call takes, and
  ``group_size(key)`` counts its ranks;
* **autograd**, through the calls: the collectives join the framework's autograd graph, and ``*_into`` run them
  below it for the gradient table (:mod:`~hyper_parallel.core.symmetric_memory.gradients`);
* **operator registration** (:meth:`Handler.register_operators`): what the framework must know of the calls before
  the first one (torch: the ``hyper_parallel_shmem`` operators; MindSpore: nothing).

Dependencies point one way: a handler imports the neutral modules of the user API (checks, gradients) and the
runtime below it; the user API reaches a handler only through the object it is given. ``tests/unit`` and
``tests/on_mindspore`` check both handlers against these classes.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, Optional, Protocol, runtime_checkable


@runtime_checkable
class TensorFacts(Protocol):
    """A framework's answers about tensors and dtypes (the shared checks'), and its tensor arithmetic (the gradient
    table's)."""

    tensor_type_name: str           # the tensor class as messages name it
    signal_dtype_names: str         # the dtypes a signal may have, as messages name them

    def is_tensor(self, value: object) -> bool: ...
    def numel(self, tensor: Any) -> int: ...
    def ndim(self, tensor: Any) -> int: ...
    def tolist(self, tensor: Any) -> list: ...
    def check_tensor(self, tensor: Any, name: str) -> None: ...
    def readable_numel(self, value: object) -> Optional[int]: ...
    def is_integer_dtype(self, dtype: Any) -> bool: ...
    def is_floating_dtype(self, dtype: Any) -> bool: ...
    def is_reducible_dtype(self, dtype: Any) -> bool: ...
    def reducible_dtype_names(self) -> list: ...
    def is_signal_dtype(self, dtype: Any) -> bool: ...
    def itemsize(self, dtype: Any) -> int: ...
    def is_matmul_dtype(self, dtype: Any) -> bool: ...
    def matmul_dtype_names(self) -> list: ...

    def new_empty(self, shape: Sequence[int], like: Any) -> Any: ...
    def new_zeros(self, shape: Sequence[int], like: Any) -> Any: ...
    def contiguous(self, tensor: Any) -> Any: ...
    def copy(self, tensor: Any) -> Any: ...
    def reshape(self, tensor: Any, shape: Sequence[int]) -> Any: ...
    def divide(self, tensor: Any, n: int) -> Any: ...


@runtime_checkable
class FastCalls(Protocol):
    """Eager collectives a handler can take before the checks: each returns True when it ran the call, False to
    leave it to the checks (which then name what was wrong). A handler without them gives ``fast = None``."""

    def all_gather(self, output_tensor: Any, input_tensor: Any, group: Any) -> bool: ...
    def all_reduce(self, tensor: Any, op: Any, group: Any, low_precision_dtype: Any, backward: Any) -> bool: ...
    def reduce_scatter(self, output_tensor: Any, input_tensor: Any, op: Any, group: Any,
                       low_precision_dtype: Any) -> bool: ...
    def all_to_all(self, send_tensor_list: Any, receive_tensor: Any, receive_list: Any, group: Any) -> bool: ...
    def send(self, tensor: Any, dst_rank: Any, group: Any) -> bool: ...
    def recv(self, tensor: Any, src_rank: Any, group: Any) -> bool: ...


@runtime_checkable
class Calls(Protocol):
    """The runtime's calls on checked arguments. ``key`` is what :meth:`group_key` made of ``group=``; ranks are
    group ranks (the calls check them against the group); offsets count elements.

    ``group_size(key)`` raises ShmemValueError for a group this process no longer knows (destroyed): the user API
    asks it first after ``group_key``, so that the refusal goes through the group's team. ``refuse(key, operation,
    error)`` refuses this rank's call of the public function ``operation`` (``"shmem_allreduce"``) for ``error``, a
    check that failed once the group was known: it enters the call's first sync with the refusal (the group's team is
    made if it is the group's first collective), and every rank of the group raises ``error``'s class with its
    message, naming this rank; where no team can carry it (a group never used and no longer known), ``error`` is
    raised here. It always raises. A ``role`` is what a call is for, in its fingerprint: "forward", "backward" (the
    gradient table's collectives), "fused_gather", "fused_scatter" (a fused op's own calls).
    """

    # groups
    def group_key(self, group: Optional[Any]) -> Any: ...
    def group_size(self, key: Any) -> int: ...
    def refuse(self, key: Any, operation: str, error: BaseException) -> None: ...

    # lifecycle
    def empty(self, dims: tuple, dtype: Any) -> Any: ...
    def free(self, tensor: Any) -> None: ...
    def shutdown(self) -> None: ...

    # primitives, on checked windows
    def put(self, target: Any, target_at: int, src: Any, src_at: int, n: int, rank: int, key: Any) -> None: ...
    def get(self, target: Any, target_at: int, src: Any, src_at: int, n: int, rank: int, key: Any) -> None: ...
    def signal(self, signal: Any, offset: int, value: int, op: str, rank: int, key: Any) -> None: ...
    def wait_signal(self, depend_tensor: Optional[Any], signal: Any, offset: int, value: int, cmp: str) -> None: ...
    def put_with_signal(self, target: Any, target_at: int, src: Any, src_at: int, n: int, signal: Any, offset: int,
                        value: int, op: str, rank: int, key: Any) -> None: ...
    def barrier(self, key: Any) -> None: ...

    # collectives, with the framework's autograd
    def wire(self, low_precision_dtype: Any, dtype: Any, op: str) -> Any: ...
    def all_gather(self, output: Any, data: Any, key: Any) -> Any: ...
    def all_reduce(self, tensor: Any, op: str, key: Any, wire: Any, mode: str) -> Any: ...
    def reduce_scatter(self, output: Any, data: Any, op: str, key: Any, wire: Any) -> Any: ...
    def all_to_all(self, sends: list, receive: Any, counts: list, key: Any) -> Any: ...
    def moe(self, direction: str, output: Any, data: Any, in_splits: Any, in_offsets: Optional[Any], out_table: Any,
            key: Any, major_align: int, wire: Any) -> Any: ...
    def send(self, tensor: Any, dst: int, key: Any) -> Optional[Any]: ...
    def recv(self, tensor: Any, src: int, key: Any) -> Any: ...

    # the collectives below autograd, in full precision (the gradient table's, role "backward")
    def all_gather_into(self, output: Any, data: Any, key: Any, role: str) -> Any: ...
    def reduce_scatter_into(self, output: Any, data: Any, op: str, key: Any, role: str) -> Any: ...
    def all_reduce_into(self, tensor: Any, op: str, key: Any, role: str) -> Any: ...
    def all_to_all_into(self, sends: Sequence[Any], receive: Any, counts: Sequence[int], key: Any,
                        role: str) -> Any: ...
    def moe_into(self, output: Any, data: Any, in_splits: Any, in_offsets: Optional[Any], out_table: Any,
                 direction: str, major_align: int, key: Any, role: str) -> Any: ...

    # fused ops, on checked shapes (dims: the shapes the checks found)
    def all_gather_matmul(self, a: Any, b: Any, c: Optional[Any], gather_out: Any, signal: Optional[Any],
                          block_size: Optional[int], key: Any, dims: tuple) -> tuple: ...
    def matmul_reduce_scatter(self, x1: Any, x2: Any, symm_tensor: Any, signal: Optional[Any], reduce_op: str,
                              key: Any, dims: tuple) -> Any: ...

    # setup and diagnosis
    def available(self) -> bool: ...
    def rendezvous(self, tensor: Any, key: Any) -> tuple: ...
    def debug_state(self) -> dict: ...


@runtime_checkable
class Handler(Protocol):
    """One framework's handler: the object ``hyper_parallel.platform.<framework>.handler.HANDLER``."""

    name: str                       # the framework: "torch" or "mindspore"
    facts: TensorFacts
    calls: Calls
    fast: Optional[FastCalls]

    def register_operators(self) -> None: ...


_PARTS = (("facts", TensorFacts), ("calls", Calls), ("fast", FastCalls))


def mismatches(handler: object) -> list:
    """What ``handler`` lacks of :class:`Handler`, its parts included: every member it does not have, and every
    method it cannot call with the protocol's arguments (a ``fast`` of None has nothing to lack).

    Returns:
        One line per mismatch (``"calls.put: missing"``), empty when the handler implements the protocol.
    """
    found = _mismatches(handler, Handler, "handler")
    for attribute, protocol in _PARTS:
        part = getattr(handler, attribute, None)
        if part is not None:
            found += _mismatches(part, protocol, attribute)
    return found


def _mismatches(obj: object, protocol: type, where: str) -> list:
    found = []
    names = [n for n in vars(protocol) if not n.startswith("_")] + list(getattr(protocol, "__annotations__", {}))
    for name in dict.fromkeys(names):
        if not hasattr(obj, name):
            found.append(f"{where}.{name}: missing")
            continue
        expected = vars(protocol).get(name)
        if not inspect.isfunction(expected):
            continue
        passed = len(inspect.signature(expected).parameters) - 1   # the protocol's arguments, self excluded
        signature = inspect.signature(getattr(obj, name))
        if not _accepts(signature, passed):
            found.append(f"{where}.{name}: takes {signature}, but the protocol passes {passed} arguments")
    return found


def _accepts(signature: inspect.Signature, count: int) -> bool:
    """Whether a callable of ``signature`` takes ``count`` positional arguments."""
    positional = [p for p in signature.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values()):
        return True
    required = [p for p in positional if p.default is p.empty]
    return len(required) <= count <= len(positional)
