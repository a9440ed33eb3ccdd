"""The torch handler's calls as torch operators: namespace ``hyper_parallel_shmem``
(``torch.ops.hyper_parallel_shmem``), registered by :func:`register` when the user API binds the handler.

An eager call that nothing tracks goes from the handler's calls straight to the runtime face; a call that autograd,
torch.compile or a dispatch mode must see goes through these operators. Torch sees each such call as one operator
with a schema, the way it sees its own ``symm_mem`` and ``_c10d_functional`` ops:

* **schemas** say which tensors an op writes (``Tensor(a!)``): torch.compile keeps the writes, in order, and
  never reads a written tensor before the op. Groups travel as ``str group_name`` ("" is WORLD), resolved inside
  the op (:mod:`.groups`). A collective's ``role`` ("forward" by default; "backward" for the gradients' calls)
  enters the engine's fingerprint, so that a gradient's collective never pairs with a forward one. Low-precision formats travel by name ("": the environment's default, resolved inside the
  op; "none": full precision).
* **implementations** (``CompositeExplicitAutograd``; the ``_*_op`` functions beside the calls, in
  :mod:`.collectives`, :mod:`.primitives` and :mod:`.fused`) find the group's team by name (making it on the group's
  first collective) and run the same code as the eager calls: the checks that need the runtime or the tensors'
  addresses (symmetric or not; the collectives' overlaps are the engine's), then the runtime face.
* **written arguments are the caller's.** Ops that write a symmetric tensor (the fused ops, ``put_``,
  ``signal_``, ``put_with_signal_``) check it when they run: where AOTAutograd's functionalization hands them a
  copy (``aot_eager``; inductor writes in place where it can) they raise ``ValueError`` instead of computing on
  the copy. The collectives are correct on copies (the staged path).
* **fake kernels** give torch.compile the outputs' shapes without running anything.
* **autograd kernels** (dispatch key ``Autograd``) run the differentiable ops through the functions of
  :mod:`.autograd`, whose backward passes call these operators again, so
  that a compiled backward traces them too. ``torch.library.register_autograd`` takes only functional schemas
  (no written inputs), and these ops write into the caller's tensors (symmetric ones, where peers write too).

Operators with no tensor result and nothing written locally (send, recv of a new tensor, barrier, the signal
wait) are registered as side effects, so that no graph pass drops them.

Operators (schemas in :data:`SCHEMAS`; ``*``: an autograd kernel, :data:`autograd.KERNELS`):

* collectives: ``all_reduce_`` *, ``all_gather_`` *, ``reduce_scatter_`` *, ``all_to_all_`` *, ``moe_exchange_`` *
  (MoE dispatch or combine: writes ``output`` and ``out_splits_offsets``), ``barrier``;
* point to point: ``send`` * (returns the gradient's token, a zero scalar), ``recv_`` (into the caller's
  tensor), ``recv`` * (into a new tensor, the differentiable form);
* primitives: ``put_``, ``get_``, ``signal_``, ``put_with_signal_``, ``wait_for_signal``;
* fused: ``fused_all_gather_matmul_`` * (writes ``c`` and ``gather_out``), ``fused_matmul_reduce_scatter`` *
  (returns the new result).

The primitives take the windows the public functions cut (``target[target_offset : +size]``), one element for
a signal. ``wait_for_signal`` marks ``depend_tensor`` written: the data a signal guards is read after the wait.
"""

from __future__ import annotations

import threading
from typing import Optional

import torch
import torch.distributed as dist
import torch.fx

from hyper_parallel.platform.torch import autograd, collectives, fused, groups, primitives

NAMESPACE = "hyper_parallel_shmem"

SCHEMAS = {
    "all_reduce_": "(Tensor(a!) tensor, str op, str group_name, str low_precision_dtype, str backward, "
                   "str role=\"forward\") -> ()",
    "all_gather_": "(Tensor(a!) output, Tensor input, str group_name, str role=\"forward\") -> ()",
    "reduce_scatter_": "(Tensor(a!) output, Tensor input, str op, str group_name, str low_precision_dtype, "
                       "str role=\"forward\") -> ()",
    "all_to_all_": "(Tensor(a!) receive, Tensor[] sends, int[] receive_counts, str group_name, "
                   "str role=\"forward\") -> ()",
    "moe_exchange_": "(Tensor(a!) output, Tensor(b!) out_splits_offsets, Tensor input, Tensor in_splits, "
                     "Tensor? in_offsets, str direction, int major_align, str group_name, str low_precision_dtype, "
                     "str role=\"forward\") -> ()",
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

# The implementations live beside the calls that go straight to them when no dispatch is needed.
IMPLEMENTATIONS = {
    "all_reduce_": collectives._all_reduce_op,
    "all_gather_": collectives._all_gather_op,
    "reduce_scatter_": collectives._reduce_scatter_op,
    "all_to_all_": collectives._all_to_all_op,
    "moe_exchange_": collectives._moe_exchange_op,
    "send": collectives._send_op,
    "recv_": collectives._recv_op,
    "recv": collectives._recv_new_op,
    "barrier": primitives._barrier_op,
    "put_": primitives._put_op,
    "get_": primitives._get_op,
    "signal_": primitives._signal_op,
    "put_with_signal_": primitives._put_with_signal_op,
    "wait_for_signal": primitives._wait_for_signal_op,
    "fused_all_gather_matmul_": fused._all_gather_matmul_op,
    "fused_matmul_reduce_scatter": fused._matmul_reduce_scatter_op,
}


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
    n = dist.get_world_size(groups.resolve(group_name))
    return x1.new_empty((x1.shape[0] // n, x2.shape[1]))


_FAKES = {"send": _send_fake, "recv": _recv_fake, "fused_matmul_reduce_scatter": _matmul_reduce_scatter_fake}

# Ops with no tensor result that carry data elsewhere (or wait for it): no graph pass may drop them. The ops that
# write a tensor of the schema are kept by their mutation annotations.
_SIDE_EFFECTS = ("send", "recv", "barrier", "wait_for_signal")

_library: Optional[torch.library.Library] = None
_lock = threading.Lock()


def register() -> None:
    """Registers the operators with ``torch.library`` (once per process; later calls do nothing): the schemas,
    the implementations, the fake kernels, the autograd kernels of :mod:`.autograd`, and the side effects."""
    global _library
    with _lock:
        if _library is not None:
            return
        library = torch.library.Library(NAMESPACE, "DEF")
        for name, schema in SCHEMAS.items():
            library.define(name + schema)
        for name, implementation in IMPLEMENTATIONS.items():
            library.impl(name, implementation, "CompositeExplicitAutograd")
        for name in SCHEMAS:
            torch.library.register_fake(f"{NAMESPACE}::{name}", _FAKES.get(name, _nothing), lib=library)
        for name, kernel in autograd.KERNELS.items():
            library.impl(name, kernel, "Autograd")
        ops = getattr(torch.ops, NAMESPACE)
        for name in _SIDE_EFFECTS:
            torch.fx.node.has_side_effect(getattr(ops, name).default)
        _library = library
