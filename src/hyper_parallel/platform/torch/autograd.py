"""torch's autograd for the collectives and fused ops, registered on their operators.

Each differentiable operator of :mod:`.ops` has a kernel here for the ``Autograd`` dispatch key (:data:`KERNELS`).
When nothing requires grad it runs the operator below autograd; else it runs an ``autograd.Function`` whose forward
is the operator below autograd and whose backward is its dual collective, on the same group, again through the
operators (so that a compiled backward traces them). The collectives' gradients are the shared table's
(:mod:`hyper_parallel.core.symmetric_memory.gradients`, over torch's tensor facts and the collectives below autograd
of :mod:`.collectives`), which MindSpore's handler runs too:

=====================================  ==============================================================
forward                                backward
=====================================  ==============================================================
all_gather(x) -> y                     grad_x = reduce_scatter(grad_y)
reduce_scatter(x) -> y ('sum'/'avg')   grad_x = all_gather(grad_y) (/ n for 'avg')
all_reduce(x) -> y ('sum'/'avg')       identity (/ n for 'avg'), or all_reduce(grad_y) on request
all_to_all(xs) -> y                    all_to_all of grad_y's parts back to their senders
moe dispatch(x) -> y                   grad_x = combine(grad_y) with the layout dispatch wrote
moe combine(x) -> y                    grad_x = dispatch(grad_y) into the layout combine read
send(x, dst)                           grad_x = the gradient dst's recv sends back
recv(buf, src) -> y                    send(grad_y, src)
fused_all_gather_matmul(a, b)          grad_a = reduce_scatter(grad_c @ b^T + grad_gather_out),
                                       grad_b = gather_out^T @ grad_c
fused_matmul_reduce_scatter(x1, x2)    grad_x1 = all_gather(grad_y) @ x2^T, grad_x2 = x1^T @ all_gather(grad_y)
=====================================  ==============================================================

Every backward collective runs with the role "backward" (:data:`gradients.ROLE`), which the engine's fingerprint
carries: a rank's gradient collective that meets another rank's forward call makes both raise ShmemMismatchError
naming the role, instead of pairing. A forward call keeps the role its operator was given.

The collectives write into caller-provided outputs, so the forward marks them dirty: the output tensor itself
joins the graph (in-place ops in torch behave the same way). ``torch.library.register_autograd`` cannot express
that: it takes only operators that write nothing. Backward passes are collectives too: every rank of the group
must run them, in the same order, as with ``torch.distributed.nn``. Their gradients travel in full precision
through the staged paths (gradients are ordinary tensors).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.autograd import Function

from hyper_parallel.core.symmetric_memory import gradients
from hyper_parallel.core.symmetric_memory.checks import Checks
from hyper_parallel.platform.torch import collectives, groups, tensors

differentiable = Checks.differentiable


def _ops():
    return torch.ops.hyper_parallel_shmem


def _group(group_name: str) -> Optional[torch.distributed.ProcessGroup]:
    """The calls' key of the group an operator names (the gradient table's collectives take it)."""
    return groups.resolve(group_name)


class _Below:
    """Runs operators below the autograd kernels (their implementations, or torch.compile's fake kernels)."""

    def __enter__(self) -> None:
        self._guard = torch._C._AutoDispatchBelowAutograd()
        self._guard.__enter__()

    def __exit__(self, *exc) -> None:
        self._guard.__exit__(*exc)


class AllGather(Function):
    """all_gather into ``output``; backward: reduce_scatter of the output's gradient."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, data: torch.Tensor, group_name: str, role: str) -> torch.Tensor:
        ctx.group_name, ctx.shape = group_name, data.shape
        with _Below():
            _ops().all_gather_(output, data, group_name, role)
        ctx.mark_dirty(output)
        return output

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, gradients.all_gather(tensors, collectives, _group(ctx.group_name), ctx.shape, grad), None, None


class ReduceScatter(Function):
    """reduce_scatter into ``output``; backward: all_gather of the output's gradient."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, data: torch.Tensor, op: str, group_name: str, precision: str, role: str):
        ctx.group_name, ctx.op, ctx.shape = group_name, op, data.shape
        with _Below():
            _ops().reduce_scatter_(output, data, op, group_name, precision, role)
        ctx.mark_dirty(output)
        return output

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad_input = gradients.reduce_scatter(tensors, collectives, _group(ctx.group_name), ctx.op, ctx.shape, grad)
        return None, grad_input, None, None, None, None


class AllReduce(Function):
    """all_reduce in place; backward: identity, or all_reduce of the gradient (``mode``)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, op: str, group_name: str, precision: str, mode: str, role: str):
        ctx.group_name, ctx.op, ctx.mode = group_name, op, mode
        with _Below():
            _ops().all_reduce_(tensor, op, group_name, precision, mode, role)
        ctx.mark_dirty(tensor)
        return tensor

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad_input = gradients.all_reduce(tensors, collectives, _group(ctx.group_name), ctx.op, ctx.mode, grad)
        return grad_input, None, None, None, None, None


class AllToAll(Function):
    """all_to_all into ``receive``; backward: every part of the gradient goes back to the rank that sent it."""

    @staticmethod
    def forward(ctx, receive: torch.Tensor, receives: list, group_name: str, role: str,
                *sends: torch.Tensor) -> torch.Tensor:
        ctx.group_name, ctx.receives = group_name, list(receives)
        ctx.send_shapes = [t.shape for t in sends]
        with _Below():
            _ops().all_to_all_(receive, list(sends), list(receives), group_name, role)
        ctx.mark_dirty(receive)
        return receive

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grads = gradients.all_to_all(tensors, collectives, _group(ctx.group_name), ctx.receives, ctx.send_shapes, grad)
        return (None, None, None, None, *grads)


class MoeExchange(Function):
    """MoE dispatch or combine into ``output``; backward: the other direction, on the layout the forward wrote (a copy
    of ``out_splits_offsets``, so that the caller may reuse the table)."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, out_table: torch.Tensor, data: torch.Tensor, in_splits: torch.Tensor,
                in_offsets: Optional[torch.Tensor], direction: str, major_align: int, group_name: str,
                precision: str, role: str) -> torch.Tensor:
        ctx.group_name, ctx.direction, ctx.major_align, ctx.shape = group_name, direction, major_align, data.shape
        with _Below():
            _ops().moe_exchange_(output, out_table, data, in_splits, in_offsets, direction, major_align, group_name,
                                 precision, role)
        ctx.save_for_backward(out_table.clone())
        ctx.mark_dirty(output)
        return output

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (layout,) = ctx.saved_tensors
        grad_input = gradients.moe(tensors, collectives, _group(ctx.group_name), ctx.direction, ctx.major_align,
                                   ctx.shape, layout, grad)
        return None, None, grad_input, None, None, None, None, None, None, None


class Send(Function):
    """send; its output (a zero scalar) receives the tensor's gradient from the destination in backward."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, dst: int, group_name: str) -> torch.Tensor:
        ctx.group_name, ctx.dst, ctx.shape, ctx.dtype = group_name, dst, tensor.shape, tensor.dtype
        with _Below():
            return _ops().send(tensor, dst, group_name)

    @staticmethod
    def backward(ctx, token_grad: torch.Tensor):
        grad = torch.empty(ctx.shape, dtype=ctx.dtype, device=token_grad.device)
        _ops().recv_(grad, ctx.dst, ctx.group_name)
        return grad, None, None


class Recv(Function):
    """recv into a new tensor like a leaf that requires grad; backward sends the gradient back to the source."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, src: int, group_name: str) -> torch.Tensor:
        ctx.group_name, ctx.src = group_name, src
        with _Below():
            return _ops().recv(tensor, src, group_name)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        _ops().send(grad, ctx.src, ctx.group_name)
        return grad, None, None


class FusedAllGatherMatmul(Function):
    """fused_all_gather_matmul; backward as all_gather then matmul would have it."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, gather_out: torch.Tensor,
                signal: torch.Tensor, block_size: int, group_name: str):
        with _Below():
            _ops().fused_all_gather_matmul_(a, b, c, gather_out, signal, block_size, group_name)
        ctx.group_name, ctx.a_shape = group_name, a.shape
        ctx.mark_dirty(c, gather_out)
        ctx.save_for_backward(gather_out, b)
        return gather_out, c

    @staticmethod
    def backward(ctx, grad_gather_out: Optional[torch.Tensor], grad_c: Optional[torch.Tensor]):
        gather_out, b = ctx.saved_tensors
        grad_rows = None if grad_c is None else grad_c @ b.t()
        if grad_gather_out is not None:
            grad_rows = grad_gather_out if grad_rows is None else grad_rows + grad_gather_out
        grad_a = None
        if ctx.needs_input_grad[0] and grad_rows is not None:
            grad_a = gradients.all_gather(tensors, collectives, _group(ctx.group_name), ctx.a_shape, grad_rows)
        grad_b = None
        if ctx.needs_input_grad[1] and grad_c is not None:
            grad_b = gather_out.t() @ grad_c
        return grad_a, grad_b, None, None, None, None, None


class FusedMatmulReduceScatter(Function):
    """fused_matmul_reduce_scatter; backward as matmul then reduce_scatter would have it."""

    @staticmethod
    def forward(ctx, x1: torch.Tensor, x2: torch.Tensor, symm_tensor: torch.Tensor, signal: torch.Tensor,
                op: str, group_name: str) -> torch.Tensor:
        with _Below():
            out = _ops().fused_matmul_reduce_scatter(x1, x2, symm_tensor, signal, op, group_name)
        ctx.group_name, ctx.op = group_name, op
        ctx.save_for_backward(x1, x2)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x1, x2 = ctx.saved_tensors
        group = _group(ctx.group_name)
        full = gradients.reduce_scatter(tensors, collectives, group, ctx.op,
                                        (collectives.group_size(group) * grad.shape[0], *grad.shape[1:]), grad)
        grad_x1 = full @ x2.t() if ctx.needs_input_grad[0] else None
        grad_x2 = x1.t() @ full if ctx.needs_input_grad[1] else None
        return grad_x1, grad_x2, None, None, None, None


# --------------------------------------------------------------------------
# The Autograd kernels: the operator below autograd when nothing requires grad, else its Function.
# --------------------------------------------------------------------------


def _all_reduce_kernel(tensor, op, group_name, low_precision_dtype, backward, role="forward") -> None:
    if tensors.tracks(tensor):
        differentiable(op, "tensor")
        AllReduce.apply(tensor, op, group_name, low_precision_dtype, backward, role)
        return
    with _Below():
        _ops().all_reduce_(tensor, op, group_name, low_precision_dtype, backward, role)


def _all_gather_kernel(output, input, group_name, role="forward") -> None:
    if tensors.tracks(input):
        AllGather.apply(output, input, group_name, role)
        return
    with _Below():
        _ops().all_gather_(output, input, group_name, role)


def _reduce_scatter_kernel(output, input, op, group_name, low_precision_dtype, role="forward") -> None:
    if tensors.tracks(input):
        differentiable(op, "input_tensor")
        ReduceScatter.apply(output, input, op, group_name, low_precision_dtype, role)
        return
    with _Below():
        _ops().reduce_scatter_(output, input, op, group_name, low_precision_dtype, role)


def _all_to_all_kernel(receive, sends, receive_counts, group_name, role="forward") -> None:
    if tensors.tracks(*sends):
        AllToAll.apply(receive, list(receive_counts), group_name, role, *sends)
        return
    with _Below():
        _ops().all_to_all_(receive, sends, receive_counts, group_name, role)


def _moe_exchange_kernel(output, out_table, input, in_splits, in_offsets, direction, major_align, group_name,
                         low_precision_dtype, role="forward") -> None:
    if tensors.tracks(input):
        MoeExchange.apply(output, out_table, input, in_splits, in_offsets, direction, major_align, group_name,
                          low_precision_dtype, role)
        return
    with _Below():
        _ops().moe_exchange_(output, out_table, input, in_splits, in_offsets, direction, major_align, group_name,
                             low_precision_dtype, role)


def _send_kernel(tensor, dst, group_name) -> torch.Tensor:
    if tensors.tracks(tensor):
        return Send.apply(tensor, dst, group_name)
    with _Below():
        return _ops().send(tensor, dst, group_name)


def _recv_kernel(tensor, src, group_name) -> torch.Tensor:
    if tensors.tracks(tensor):
        return Recv.apply(tensor, src, group_name)
    with _Below():
        return _ops().recv(tensor, src, group_name)


def _all_gather_matmul_kernel(a, b, c, gather_out, signal, block_size, group_name) -> None:
    if tensors.tracks(a, b):
        FusedAllGatherMatmul.apply(a, b, c, gather_out, signal, block_size, group_name)
        return
    with _Below():
        _ops().fused_all_gather_matmul_(a, b, c, gather_out, signal, block_size, group_name)


def _matmul_reduce_scatter_kernel(x1, x2, symm_tensor, signal, reduce_op, group_name) -> torch.Tensor:
    if tensors.tracks(x1, x2):
        return FusedMatmulReduceScatter.apply(x1, x2, symm_tensor, signal, reduce_op, group_name)
    with _Below():
        return _ops().fused_matmul_reduce_scatter(x1, x2, symm_tensor, signal, reduce_op, group_name)


KERNELS = {
    "all_reduce_": _all_reduce_kernel,
    "all_gather_": _all_gather_kernel,
    "reduce_scatter_": _reduce_scatter_kernel,
    "all_to_all_": _all_to_all_kernel,
    "moe_exchange_": _moe_exchange_kernel,
    "send": _send_kernel,
    "recv": _recv_kernel,
    "fused_all_gather_matmul_": _all_gather_matmul_kernel,
    "fused_matmul_reduce_scatter": _matmul_reduce_scatter_kernel,
}
