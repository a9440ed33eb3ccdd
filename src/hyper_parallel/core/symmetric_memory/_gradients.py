"""The gradients of the collectives (seed 004 §1.5.3), written once for every framework.

Each framework runs them inside its own autograd mechanism (torch: an ``autograd.Function`` per collective in
:mod:`._autograd`; MindSpore: an ``nn.Cell`` bprop in :mod:`hyper_parallel.platform.mindspore.handler`) and supplies
the few operations they need as *gradient ops*:

==========================================  ======================================================================
``empty(shape, like)``                      a new contiguous tensor of ``shape`` and ``like``'s dtype
``contiguous(t)``, ``copy(t)``              ``t`` contiguous; a new tensor with ``t``'s values
``flat(t)``, ``view(t, shape)``             ``t`` as 1-D; ``t`` (contiguous) with another shape
``divide(t, n)``                            ``t / n`` in a new tensor
``group_size(group)``                       the number of ranks of ``group``
``all_gather(output, data, group)``         the collectives, on the same group as the forward, in full
``reduce_scatter(output, data, group)``     precision (gradients are ordinary tensors): reduce_scatter sums,
``all_reduce(tensor, op, group)``           all_reduce reduces in place with the forward's op
``all_to_all(sends, receive, counts, grp)``
==========================================  ======================================================================

=====================================  ==============================================================
forward                                gradient of the input
=====================================  ==============================================================
all_gather(x) -> y                     reduce_scatter(grad_y)
reduce_scatter(x) -> y ('sum'/'avg')   all_gather(grad_y) (/ n for 'avg')
all_reduce(x) -> y ('sum'/'avg')       grad_y (/ n for 'avg'), or all_reduce(grad_y) with backward='allreduce'
all_to_all(xs) -> y                    all_to_all of grad_y's parts back to their senders
=====================================  ==============================================================

Backward passes are collectives too: every rank of the group must run them, in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def scaled(ops: Any, grad: Any, op: str, group: Any) -> Any:
    """``grad`` divided by the group's size for 'avg', as is otherwise."""
    return ops.divide(grad, ops.group_size(group)) if op == "avg" else grad


def all_gather(ops: Any, group: Any, data_shape: Sequence[int], grad: Any) -> Any:
    """The gradient of all_gather's input (of ``data_shape``): the reduce_scatter (sum) of the output's."""
    part = ops.empty(data_shape, grad)
    ops.reduce_scatter(part, ops.contiguous(grad), group)
    return part


def reduce_scatter(ops: Any, group: Any, op: str, data_shape: Sequence[int], grad: Any) -> Any:
    """The gradient of reduce_scatter's input (of ``data_shape``): the all_gather of the output's (/ n for 'avg')."""
    whole = ops.empty(data_shape, grad)
    ops.all_gather(whole, ops.contiguous(grad), group)
    return scaled(ops, whole, op, group)


def all_reduce(ops: Any, group: Any, op: str, mode: str, grad: Any) -> Any:
    """The gradient of all_reduce's tensor: the output's (/ n for 'avg'), or its all_reduce for
    ``mode='allreduce'``."""
    if mode == "allreduce":
        reduced = ops.copy(ops.contiguous(grad))
        ops.all_reduce(reduced, op, group)
        return reduced
    return scaled(ops, grad, op, group)


def all_to_all(ops: Any, group: Any, receive_counts: Sequence[int], send_shapes: Sequence[Sequence[int]],
               grad: Any) -> list:
    """The gradients of all_to_all's send tensors (of ``send_shapes``): each part of the receive buffer's gradient
    (``receive_counts`` elements from each rank) goes back to the rank that sent it."""
    flat = ops.flat(ops.contiguous(grad))
    parts, start = [], 0
    for count in receive_counts:
        parts.append(ops.contiguous(flat[start:start + count]))
        start += count
    sizes = [_numel(shape) for shape in send_shapes]
    back = ops.empty((sum(sizes),), grad)
    ops.all_to_all(parts, back, sizes, group)
    grads, start = [], 0
    for size, shape in zip(sizes, send_shapes):
        grads.append(ops.view(back[start:start + size], shape))
        start += size
    return grads


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
