"""The user API bound as torch operators: namespace ``hyper_parallel_shmem`` (``torch.ops.hyper_parallel_shmem``).

The public functions check their arguments, then call these operators; so does autograd. Torch sees each call
as one operator with a schema, the way it sees its own ``symm_mem`` and ``_c10d_functional`` ops:

* **schemas** say which tensors an op writes (``Tensor(a!)``): torch.compile keeps the writes, in order, and
  never reads a written tensor before the op. Groups travel as ``str group_name`` ("" is WORLD), resolved inside
  the op (:mod:`~hyper_parallel.core.symmetric_memory._groups`). Low-precision dtypes travel by name ("": the
  environment's default, resolved inside the op; "none": full precision).
* **implementations** (``CompositeExplicitAutograd``; the ``_*_op`` functions beside the algorithms, in
  ``_collectives``, ``_primitives`` and ``_fused``) resolve the group's channel (registering the group on its
  first collective), run the checks that need the runtime or the tensors' addresses (symmetric or not,
  overlaps), then call the algorithms: ``_collectives._all_reduce`` and its siblings, ``_fused._all_gather_matmul``
  and ``_fused._matmul_reduce_scatter``, the runtime's put/get/signal/wait. An eager call with nothing to dispatch
  (no grad, no tracing, no dispatch mode) goes straight to the implementation (``_autograd.call``).
* **written arguments are the caller's.** Ops that write a symmetric tensor (the fused ops, ``put_``,
  ``signal_``, ``put_with_signal_``) check it when they run: where AOTAutograd's functionalization hands them a
  copy (``aot_eager``; inductor writes in place where it can) they raise ``ValueError`` instead of computing on
  the copy. The collectives are correct on copies (the staged path).
* **fake kernels** give torch.compile the outputs' shapes without running anything.
* **autograd kernels** (dispatch key ``Autograd``) run the differentiable ops through the functions of
  :mod:`~hyper_parallel.core.symmetric_memory._autograd`, whose backward passes call these operators again, so
  that a compiled backward traces them too. ``torch.library.register_autograd`` takes only functional schemas
  (no written inputs), and these ops write into the caller's tensors (symmetric ones, where peers write too).

Operators with no tensor result and nothing written locally (send, recv of a new tensor, barrier, the signal
wait) are registered as side effects, so that no graph pass drops them.

Operators (schemas in :data:`SCHEMAS`; ``*``: an autograd kernel, :data:`_autograd.KERNELS`):

* collectives: ``all_reduce_`` *, ``all_gather_`` *, ``reduce_scatter_`` *, ``all_to_all_`` *, ``barrier``;
* point to point: ``send`` * (returns the gradient's token, a zero scalar), ``recv_`` (into the caller's
  tensor), ``recv`` * (into a new tensor, the differentiable form);
* primitives: ``put_``, ``get_``, ``signal_``, ``put_with_signal_``, ``wait_for_signal``;
* fused: ``fused_all_gather_matmul_`` * (writes ``c`` and ``gather_out``), ``fused_matmul_reduce_scatter`` *
  (returns the new result).

The primitives take the windows the public functions cut (``target[target_offset : +size]``), one element for
a signal. ``wait_for_signal`` marks ``depend_tensor`` written: the data a signal guards is read after the wait.
"""

from __future__ import annotations

import torch
import torch.fx

from hyper_parallel.platform.torch import autograd as _autograd, collectives as _collectives, fused as _fused, groups as _groups, primitives as _primitives

NAMESPACE = "hyper_parallel_shmem"

_lib = torch.library.Library(NAMESPACE, "DEF")

SCHEMAS = {
    "all_reduce_": "(Tensor(a!) tensor, str op, str group_name, str low_precision_dtype, str backward) -> ()",
    "all_gather_": "(Tensor(a!) output, Tensor input, str group_name) -> ()",
    "reduce_scatter_": "(Tensor(a!) output, Tensor input, str op, str group_name, str low_precision_dtype) -> ()",
    "all_to_all_": "(Tensor(a!) receive, Tensor[] sends, int[] receive_counts, str group_name) -> ()",
    "send": "(Tensor tensor, int dst, str group_name) -> Tensor",
    "recv_": "(Tensor(a!) tensor, int src, str group_name) -> ()",
    "recv": "(Tensor tensor, int src, str group_name) -> Tensor",
    "barrier": "(str group_name) -> ()",
    "put_": "(Tensor(a!) target, Tensor src, int target_rank, str group_name) -> ()",
    "get_": "(Tensor(a!) target, Tensor src, int target_rank, str group_name) -> ()",
    "signal_": "(Tensor(a!) signal, int value, str op, int target_rank, str group_name) -> ()",
    "put_with_signal_": "(Tensor(a!) target, Tensor src, Tensor(b!) signal, int value, str op, int target_rank, "
                        "str group_name) -> ()",
    "wait_for_signal": "(Tensor(a!)? depend_tensor, Tensor signal, int compare_value, str compare_op) -> ()",
    "fused_all_gather_matmul_": "(Tensor a, Tensor b, Tensor(a!) c, Tensor(b!) gather_out, Tensor(c!) signal, "
                                "int block_size, str group_name) -> ()",
    "fused_matmul_reduce_scatter": "(Tensor x1, Tensor x2, Tensor(a!) symm_tensor, Tensor(b!) signal, str reduce_op, "
                                   "str group_name) -> Tensor",
}
for _name, _schema in SCHEMAS.items():
    _lib.define(_name + _schema)

ops = getattr(torch.ops, NAMESPACE)

# The implementations live beside the algorithms they call; the public functions call them straight where no
# dispatch is needed (``_autograd.call``).
IMPLEMENTATIONS = {
    "all_reduce_": _collectives._all_reduce_op,
    "all_gather_": _collectives._all_gather_op,
    "reduce_scatter_": _collectives._reduce_scatter_op,
    "all_to_all_": _collectives._all_to_all_op,
    "send": _collectives._send_op,
    "recv_": _collectives._recv_op,
    "recv": _collectives._recv_new_op,
    "barrier": _primitives._barrier_op,
    "put_": _primitives._put_op,
    "get_": _primitives._get_op,
    "signal_": _primitives._signal_op,
    "put_with_signal_": _primitives._put_with_signal_op,
    "wait_for_signal": _primitives._wait_for_signal_op,
    "fused_all_gather_matmul_": _fused._all_gather_matmul_op,
    "fused_matmul_reduce_scatter": _fused._matmul_reduce_scatter_op,
}
for _name, _implementation in IMPLEMENTATIONS.items():
    _lib.impl(_name, _implementation, "CompositeExplicitAutograd")


# --------------------------------------------------------------------------
# Fake kernels: the outputs' shapes; ops that only write their arguments return nothing.
# --------------------------------------------------------------------------


def _nothing(*args) -> None:
    return None


def _send_fake(tensor: torch.Tensor, dst: int, group_name: str) -> torch.Tensor:
    return tensor.new_zeros(())


def _recv_fake(like: torch.Tensor, src: int, group_name: str) -> torch.Tensor:
    return torch.empty_like(like)


def _matmul_reduce_scatter_fake(x1: torch.Tensor, x2: torch.Tensor, symm_tensor: torch.Tensor, signal: torch.Tensor,
                                reduce_op: str, group_name: str) -> torch.Tensor:
    n = _groups.size(_groups.resolve(group_name))
    return x1.new_empty((x1.shape[0] // n, x2.shape[1]))


_FAKES = {"send": _send_fake, "recv": _recv_fake, "fused_matmul_reduce_scatter": _matmul_reduce_scatter_fake}
for _name in SCHEMAS:
    torch.library.register_fake(f"{NAMESPACE}::{_name}", _FAKES.get(_name, _nothing), lib=_lib)


# --------------------------------------------------------------------------
# Autograd and side effects.
# --------------------------------------------------------------------------

for _name, _kernel in _autograd.KERNELS.items():
    _lib.impl(_name, _kernel, "Autograd")

# Ops with no tensor result that carry data elsewhere (or wait for it): no graph pass may drop them. The ops that
# write a tensor of the schema are kept by their mutation annotations.
for _name in ("send", "recv", "barrier", "wait_for_signal"):
    torch.fx.node.has_side_effect(getattr(ops, _name).default)
