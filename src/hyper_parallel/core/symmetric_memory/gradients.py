"""The gradients of the collectives, written once for every framework.

Each framework runs them inside its own autograd mechanism (torch: an ``autograd.Function`` per collective in
:mod:`hyper_parallel.platform.torch.autograd`; MindSpore: an ``nn.Cell`` bprop in
:mod:`hyper_parallel.platform.mindspore.autograd`) over two parts of its handler
(:mod:`~hyper_parallel.core.symmetric_memory.protocol`): the tensor facts' arithmetic and the calls' collectives
below autograd, in full precision (gradients are ordinary tensors):

==============================================  ==================================================================
``facts.new_empty(shape, like)``                a new contiguous tensor of ``shape`` and ``like``'s dtype
``facts.new_zeros(shape, like)``                the same, of zeros
``facts.contiguous(t)``, ``facts.copy(t)``      ``t`` contiguous; a new tensor with ``t``'s values
``facts.reshape(t, shape)``                     ``t`` (contiguous) with another shape
``facts.divide(t, n)``                          ``t / n`` in a new tensor
``calls.group_size(group)``                     the number of ranks of ``group``
``calls.all_gather_into(output, data, group,    the collectives on the forward's group, without autograd, with
role)``, ``calls.reduce_scatter_into(out,       the role "backward": reduce_scatter with ``op``, all_reduce in
data, op, group, role)``,                       place with the forward's op, all_to_all of ``sends`` into
``calls.all_reduce_into(t, op, group, role)``,  ``receive``
``calls.all_to_all_into(sends, receive,        MoE dispatch or combine with ``moe_into``
counts, group, role)``, ``calls.moe_into(...)``
==============================================  ==================================================================

=====================================  ==============================================================
forward                                gradient of the input
=====================================  ==============================================================
all_gather(x) -> y                     reduce_scatter(grad_y)
reduce_scatter(x) -> y ('sum'/'avg')   all_gather(grad_y) (/ n for 'avg')
all_reduce(x) -> y ('sum'/'avg')       grad_y (/ n for 'avg'), or all_reduce(grad_y) with backward='allreduce'
all_to_all(xs) -> y                    all_to_all of grad_y's parts back to their senders
moe dispatch(x) -> y                   combine of grad_y with the layout dispatch wrote (rows it did not
                                       send: zero)
moe combine(x) -> y                    dispatch of grad_y (with the forward's major_align) into the
                                       layout combine read: the one a dispatch with it wrote
=====================================  ==============================================================

Backward passes are collectives too: every rank of the group must run them, in the same order. They run with the
role "backward" (:data:`ROLE`): a gradient's collective never pairs with another rank's forward call (every rank
raises ShmemMismatchError naming the role), however the ranks' calls interleave.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: The role of every collective the gradient table runs (the engine's fingerprint field).
ROLE = "backward"


def scaled(facts: Any, calls: Any, grad: Any, op: str, group: Any) -> Any:
    """``grad`` divided by the group's size for 'avg', as is otherwise."""
    return facts.divide(grad, calls.group_size(group)) if op == "avg" else grad


def all_gather(facts: Any, calls: Any, group: Any, data_shape: Sequence[int], grad: Any) -> Any:
    """The gradient of all_gather's input (of ``data_shape``): the reduce_scatter (sum) of the output's."""
    part = facts.new_empty(data_shape, grad)
    calls.reduce_scatter_into(part, facts.contiguous(grad), "sum", group, ROLE)
    return part


def reduce_scatter(facts: Any, calls: Any, group: Any, op: str, data_shape: Sequence[int], grad: Any) -> Any:
    """The gradient of reduce_scatter's input (of ``data_shape``): the all_gather of the output's (/ n for 'avg')."""
    whole = facts.new_empty(data_shape, grad)
    calls.all_gather_into(whole, facts.contiguous(grad), group, ROLE)
    return scaled(facts, calls, whole, op, group)


def all_reduce(facts: Any, calls: Any, group: Any, op: str, mode: str, grad: Any) -> Any:
    """The gradient of all_reduce's tensor: the output's (/ n for 'avg'), or its all_reduce for
    ``mode='allreduce'``."""
    if mode == "allreduce":
        reduced = facts.copy(facts.contiguous(grad))
        calls.all_reduce_into(reduced, op, group, ROLE)
        return reduced
    return scaled(facts, calls, grad, op, group)


def all_to_all(facts: Any, calls: Any, group: Any, receive_counts: Sequence[int],
               send_shapes: Sequence[Sequence[int]], grad: Any) -> list:
    """The gradients of all_to_all's send tensors (of ``send_shapes``): each part of the receive buffer's gradient
    (``receive_counts`` elements from each rank) goes back to the rank that sent it."""
    flat = facts.reshape(facts.contiguous(grad), (-1,))
    parts, start = [], 0
    for count in receive_counts:
        parts.append(facts.contiguous(flat[start:start + count]))
        start += count
    sizes = [_numel(shape) for shape in send_shapes]
    back = facts.new_empty((sum(sizes),), grad)
    calls.all_to_all_into(parts, back, sizes, group, ROLE)
    grads, start = [], 0
    for size, shape in zip(sizes, send_shapes):
        grads.append(facts.reshape(back[start:start + size], shape))
        start += size
    return grads


def moe(facts: Any, calls: Any, group: Any, direction: str, major_align: int, data_shape: Sequence[int],
        layout: Any, grad: Any) -> Any:
    """The gradient of MoE dispatch's or combine's input (of ``data_shape``): the other direction of the output's
    gradient, on ``layout`` (the 2 x n*experts splits and offsets the forward wrote). Dispatch's gradient is the
    combine of each expert's rows back to their senders (the rows dispatch did not send get zero); combine's is the
    dispatch of each row back to its expert, laid out as a dispatch with ``major_align`` lays it out (the layout
    combine's input must have had)."""
    back = facts.new_zeros(data_shape, grad)
    table = facts.new_empty((2, _numel(layout.shape) // 2), layout)   # the gradient's own layout, not needed
    if direction == "dispatch":
        calls.moe_into(back, facts.contiguous(grad), facts.contiguous(layout[0]), facts.contiguous(layout[1]), table,
                       "combine", 0, group, ROLE)
    else:
        calls.moe_into(back, facts.contiguous(grad), facts.contiguous(layout[0]), None, table, "dispatch",
                       major_align, group, ROLE)
    return back


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
