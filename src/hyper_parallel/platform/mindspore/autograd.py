"""MindSpore's autograd for the collectives: each runs inside an ``nn.Cell`` whose ``bprop`` gives their gradients.

While MindSpore records a gradient graph, :func:`differentiable` runs a collective inside a :class:`_Collective`
Cell, so that ``mindspore.grad``/``value_and_grad`` differentiate through it (an operation MindSpore cannot see
would otherwise get a silently wrong gradient); the bprop runs the shared gradient table
(:mod:`hyper_parallel.core.symmetric_memory.gradients`) over MindSpore's tensor facts and the calls' collectives
below autograd, with the role "backward" (a gradient's collective never pairs with another rank's forward one). The
Cells are made once per collective and parameters, and reused. Outside a gradient graph a
collective runs directly: a Cell call costs more than the runtime's call.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from mindspore import nn
# Whether MindSpore is recording a gradient graph now (inside grad/value_and_grad): public APIs do not say.
from mindspore.common.api import _pynative_executor

from hyper_parallel.core.multicore.errors import ShmemValueError
from hyper_parallel.core.symmetric_memory import gradients
from hyper_parallel.core.symmetric_memory.checks import Checks
from hyper_parallel.platform.mindspore import tensors

_CELLS_KEPT = 256
_cells: OrderedDict = OrderedDict()


def recording() -> bool:
    """Whether MindSpore records a gradient graph now (inside grad/value_and_grad)."""
    return bool(_pynative_executor.requires_grad())


def forward(calls: Any, op: str, params: dict, inputs: tuple) -> Any:
    """The forward of a collective on checked arguments: the calls' collective below autograd, with the call's role
    (``params["role"]``: "forward", or a fused op's phase).

    Raises:
        ShmemValueError: ``op`` is not a collective.
    """
    group, role = params["group"], params["role"]
    if op == "all_gather":
        return calls.all_gather_into(inputs[0], inputs[1], group, role)
    if op == "all_reduce":
        return calls.all_reduce_into(inputs[0], params["op"], group, role, params["wire"])
    if op == "reduce_scatter":
        return calls.reduce_scatter_into(inputs[0], inputs[1], params["op"], group, role, params["wire"])
    if op == "all_to_all":
        return calls.all_to_all_into(inputs[1:], inputs[0], params["receive_counts"], group, role)
    if op == "moe":
        output, data, table, splits, *offsets = inputs
        return calls.moe_into(output, data, splits, offsets[0] if offsets else None, table, params["direction"],
                              params["major_align"], group, role, params["wire"])
    raise ShmemValueError(f"`op` must be a collective, but got {op!r}")


def backward(calls: Any, op: str, params: dict, inputs: tuple, grad: Any) -> tuple:
    """The gradients of a collective's inputs from its output's gradient (the shared gradient table).

    Args:
        calls: the calls whose collectives compute the gradients.
        op: 'all_gather', 'all_reduce', 'reduce_scatter', 'all_to_all' or 'moe' (dispatch or combine).
        params: the call's parameters (group, op, receive_counts, backward).
        inputs: the forward's tensor inputs.
        grad: the gradient of the output.

    Returns:
        One gradient per input (zeros for the buffers the forward only wrote).

    Raises:
        ShmemValueError: a reduction without a gradient ('max', 'min'), or an unknown ``op``.
    """
    group = params["group"]
    if op == "all_gather":
        output, data = inputs
        return tensors.zeros_like(output), gradients.all_gather(tensors, calls, group, data.shape, grad)
    if op == "all_reduce":
        Checks.differentiable(params["op"], "tensor")
        return (gradients.all_reduce(tensors, calls, group, params["op"], params["backward"], grad),)
    if op == "reduce_scatter":
        output, data = inputs
        Checks.differentiable(params["op"], "input_tensor")
        return tensors.zeros_like(output), gradients.reduce_scatter(tensors, calls, group, params["op"], data.shape,
                                                                    grad)
    if op == "all_to_all":
        receive, *sends = inputs
        grads = gradients.all_to_all(tensors, calls, group, params["receive_counts"], [s.shape for s in sends], grad)
        return (tensors.zeros_like(receive), *grads)
    if op == "moe":
        output, data, table, *splits = inputs
        grad_data = gradients.moe(tensors, calls, group, params["direction"], params["major_align"], data.shape, table,
                                  grad)
        return (tensors.zeros_like(output), grad_data, tensors.zeros_like(table),
                *(tensors.zeros_like(s) for s in splits))
    raise ShmemValueError(f"`op` must be a differentiable collective, but got {op!r}")


class _Collective(nn.Cell):
    """One collective as MindSpore's autograd sees it: :func:`forward` on the runtime, :func:`backward` as bprop."""

    def __init__(self) -> None:
        super().__init__()
        self.call: tuple = ()   # (calls, op, params), fixed per Cell: bprop may run after later calls

    def construct(self, *inputs: Any) -> Any:
        calls, op, params = self.call
        return forward(calls, op, params, inputs)

    def bprop(self, *args: Any) -> tuple:
        *inputs, _out, dout = args
        calls, op, params = self.call
        return tuple(backward(calls, op, params, tuple(inputs), dout))


def differentiable(op: str, calls: Any, inputs: tuple, params: dict) -> Any:
    """Runs collective ``op`` on ``inputs`` inside its Cell, so that its bprop gives the gradients, when MindSpore
    records a gradient graph; directly otherwise.

    One Cell per distinct (op, parameters): a bprop runs after the whole forward, so a Cell's parameters must not
    change between calls. The most recently used ones are kept (all_to_all's counts change from call to call in MoE
    dispatch); an evicted Cell lives on in any graph that still holds it.
    """
    if not recording():
        return forward(calls, op, params, inputs)
    key = (id(calls), op, tuple(sorted(params.items())))
    cell = _cells.get(key)
    if cell is None:
        cell = _cells[key] = _Collective()
        cell.call = (calls, op, params)
        if len(_cells) > _CELLS_KEPT:
            _cells.popitem(last=False)
    else:
        _cells.move_to_end(key)
    return cell(*inputs)
