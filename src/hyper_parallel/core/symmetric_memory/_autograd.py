"""Autograd for the collectives and fused ops (seed 004 §1.5.3).

Each differentiable call is an ``autograd.Function`` whose forward is the non-differentiable implementation
and whose backward is its dual collective, on the same group channel:

=====================================  ==============================================================
forward                                backward
=====================================  ==============================================================
all_gather(x) -> y                     grad_x = reduce_scatter(grad_y)
reduce_scatter(x) -> y ('sum'/'avg')   grad_x = all_gather(grad_y) (/ n for 'avg')
all_reduce(x) -> y ('sum'/'avg')       identity (/ n for 'avg'), or all_reduce(grad_y) on request
all_to_all(xs) -> y                    all_to_all of grad_y's parts back to their senders
send(x, dst)                           grad_x = the gradient dst's recv sends back
recv(buf, src) -> y                    send(grad_y, src)
fused_all_gather_matmul(a, b)          grad_a = reduce_scatter(grad_c @ b^T + grad_gather_out),
                                       grad_b = gather_out^T @ grad_c
fused_matmul_reduce_scatter(x1, x2)    grad_x1 = all_gather(grad_y) @ x2^T, grad_x2 = x1^T @ all_gather(grad_y)
=====================================  ==============================================================

The collectives write into caller-provided outputs, so the forward marks them dirty: the output tensor itself
joins the graph (in-place ops in torch behave the same way). Backward passes are collectives too: every rank of
the group must run them, in the same order, as with ``torch.distributed.nn``. Their gradients travel through the
staged paths (gradients are ordinary tensors).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.autograd import Function

from hyper_parallel.core.symmetric_memory import _collectives, _fused

BACKWARD_MODES = ("identity", "allreduce")
_DIFFERENTIABLE_OPS = ("sum", "avg")


def tracks(*tensors: object) -> bool:
    """Whether autograd records a call on these inputs (grad mode on and one of them requires grad)."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def backward_mode(value: object) -> str:
    """``shmem_allreduce``'s ``backward`` argument, checked.

    Raises:
        ValueError: not one of :data:`BACKWARD_MODES`.
    """
    if value not in BACKWARD_MODES:
        raise ValueError(f"`backward` must be one of {', '.join(map(repr, BACKWARD_MODES))}, but got {value!r}")
    return value


def _differentiable(op: str, name: str) -> None:
    if op not in _DIFFERENTIABLE_OPS:
        raise ValueError(f"`op` must be 'sum' or 'avg' when `{name}` requires grad, but got {op!r}")


def _scaled(grad: torch.Tensor, op: str, n: int) -> torch.Tensor:
    return grad / n if op == "avg" else grad


def _gathered(grad: torch.Tensor, ch) -> torch.Tensor:
    """all_gather of a gradient along dim 0, into a new tensor."""
    grad = grad.contiguous()
    full = grad.new_empty((ch.size * grad.shape[0], *grad.shape[1:]))
    _collectives._all_gather(full, grad, ch)
    return full


def _scattered(grad: torch.Tensor, shape: torch.Size, ch) -> torch.Tensor:
    """reduce_scatter (sum) of a gradient into a new tensor of ``shape``."""
    part = grad.new_empty(shape)
    _collectives._reduce_scatter(part, grad.contiguous(), "sum", ch)
    return part


class AllGather(Function):
    """all_gather into ``output``; backward: reduce_scatter of the output's gradient."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, data: torch.Tensor, ch) -> torch.Tensor:
        ctx.ch, ctx.shape = ch, data.shape
        _collectives._all_gather(output, data, ch)
        ctx.mark_dirty(output)
        return output

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return None, _scattered(grad, ctx.shape, ctx.ch), None


class ReduceScatter(Function):
    """reduce_scatter into ``output``; backward: all_gather of the output's gradient."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, data: torch.Tensor, op: str, ch, precision: Optional[torch.dtype]):
        _differentiable(op, "input_tensor")
        ctx.ch, ctx.op, ctx.shape = ch, op, data.shape
        _collectives._reduce_scatter(output, data, op, ch, precision)
        ctx.mark_dirty(output)
        return output

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        full = _gathered(grad.reshape(-1), ctx.ch).view(ctx.shape)
        return None, _scaled(full, ctx.op, ctx.ch.size), None, None, None


class AllReduce(Function):
    """all_reduce in place; backward: identity, or all_reduce of the gradient (``mode``)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, op: str, ch, precision: Optional[torch.dtype], mode: str):
        _differentiable(op, "tensor")
        ctx.ch, ctx.op, ctx.mode = ch, op, mode
        _collectives._all_reduce(tensor, op, ch, precision)
        ctx.mark_dirty(tensor)
        return tensor

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.mode == "allreduce":
            grad = grad.contiguous().clone()
            _collectives._all_reduce(grad, ctx.op, ctx.ch)
        else:
            grad = _scaled(grad, ctx.op, ctx.ch.size)
        return grad, None, None, None, None


class AllToAll(Function):
    """all_to_all into ``receive``; backward: every part of the gradient goes back to the rank that sent it."""

    @staticmethod
    def forward(ctx, receive: torch.Tensor, receives: list, ch, *sends: torch.Tensor) -> torch.Tensor:
        ctx.ch, ctx.receives = ch, receives
        ctx.send_shapes = [t.shape for t in sends]
        _collectives._all_to_all([_collectives._bytes(t) for t in sends], receive, receives, ch)
        ctx.mark_dirty(receive)
        return receive

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        flat = grad.contiguous().view(-1)
        starts = [sum(ctx.receives[:i]) for i in range(ctx.ch.size)]
        parts = [_collectives._bytes(flat[s:s + count]) for s, count in zip(starts, ctx.receives)]
        sizes = [shape.numel() for shape in ctx.send_shapes]
        back = flat.new_empty(sum(sizes))
        _collectives._all_to_all(parts, back, sizes, ctx.ch)
        grads = [piece.view(shape) for piece, shape in zip(back.split(sizes), ctx.send_shapes)]
        return (None, None, None, *grads)


class Send(Function):
    """send; its output (a zero scalar) receives the tensor's gradient from the destination in backward."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, dst: int, ch) -> torch.Tensor:
        ctx.ch, ctx.dst, ctx.shape, ctx.dtype = ch, dst, tensor.shape, tensor.dtype
        _collectives._send(tensor, dst, ch)
        return tensor.new_zeros(())

    @staticmethod
    def backward(ctx, _token_grad: torch.Tensor):
        grad = torch.empty(ctx.shape, dtype=ctx.dtype, device=_token_grad.device)
        _collectives._recv(grad, ctx.dst, ctx.ch)
        return grad, None, None


class Recv(Function):
    """recv into a leaf that requires grad; backward sends the gradient back to the source."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, src: int, ch) -> torch.Tensor:
        ctx.ch, ctx.src = ch, src
        _collectives._recv(tensor, src, ch)
        return tensor

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        _collectives._send(grad, ctx.src, ctx.ch)
        return grad, None, None


class FusedAllGatherMatmul(Function):
    """fused_all_gather_matmul; backward as all_gather then matmul would have it."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, gather_out: torch.Tensor,
                signal: torch.Tensor, block_size: int, ch):
        _fused._all_gather_matmul(a, b, c, gather_out, signal, block_size, ch)
        ctx.ch, ctx.a_shape = ch, a.shape
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
            grad_a = _scattered(grad_rows, ctx.a_shape, ctx.ch)
        grad_b = None
        if ctx.needs_input_grad[1] and grad_c is not None:
            grad_b = gather_out.t() @ grad_c
        return grad_a, grad_b, None, None, None, None, None


class FusedMatmulReduceScatter(Function):
    """fused_matmul_reduce_scatter; backward as matmul then reduce_scatter would have it."""

    @staticmethod
    def forward(ctx, x1: torch.Tensor, x2: torch.Tensor, symm_tensor: torch.Tensor, signal: torch.Tensor,
                op: str, ch) -> torch.Tensor:
        out = _fused._matmul_reduce_scatter(x1, x2, symm_tensor, signal, op, ch)
        ctx.ch, ctx.op = ch, op
        ctx.save_for_backward(x1, x2)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x1, x2 = ctx.saved_tensors
        full = _scaled(_gathered(grad, ctx.ch), ctx.op, ctx.ch.size)
        grad_x1 = full @ x2.t() if ctx.needs_input_grad[0] else None
        grad_x2 = x1.t() @ full if ctx.needs_input_grad[1] else None
        return grad_x1, grad_x2, None, None, None, None
