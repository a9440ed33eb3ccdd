"""The MindSpore handler as the user API sees it (:class:`hyper_parallel.core.symmetric_memory._over_c_abi.Api`):
tensors, groups, synchronisation and autograd, each in MindSpore's terms.

Autograd: while MindSpore records a gradient graph, each collective runs inside an ``nn.Cell`` whose ``bprop`` gives
seed 004's gradients (the shared table of ``symmetric_memory._gradients``), so that ``mindspore.grad``/
``value_and_grad`` differentiate through it (an operation MindSpore cannot see would otherwise get a silently wrong
gradient). The Cells are made once per collective and parameters, and reused.

The tensor facts (``numel``, ``is_integer_dtype``, ``check_tensor``, ...) answer the shared argument checks
(``symmetric_memory._checks``), as torch's do in :mod:`hyper_parallel.platform.torch.tensors`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import mindspore as ms
from mindspore import nn, ops
# Whether MindSpore is recording a gradient graph now (inside grad/value_and_grad): public APIs do not say.
from mindspore.common.api import _pynative_executor

from hyper_parallel.platform.mindspore import groups, tensors


_CELLS_KEPT = 256
# The dtypes the fused ops' matmuls take (as on torch).
_MATMUL_DTYPES = (ms.float32, ms.float16, ms.bfloat16, ms.float64)


class _Collective(nn.Cell):
    """One collective as MindSpore's autograd sees it: forward on the runtime, backward by seed 004's table."""

    def __init__(self, forward: Any, backward: Any) -> None:
        super().__init__()
        self._forward = forward
        self._backward = backward
        self.call: tuple = ()   # (api, op, params), fixed per Cell: bprop may run after later calls

    def construct(self, *inputs: Any) -> Any:
        api, op, params = self.call
        return self._forward(api, op, params, inputs)

    def bprop(self, *args: Any) -> tuple:
        *inputs, _out, dout = args
        api, op, params = self.call
        return tuple(self._backward(api, op, params, tuple(inputs), dout))


class Handler:
    """MindSpore's side of the user API."""

    name = "mindspore"
    tensor_type_name = "mindspore.Tensor"
    signal_dtype_names = "mindspore.int32 or mindspore.int64"

    def __init__(self, forward: Any, backward: Any) -> None:
        self._forward = forward
        self._backward = backward
        self._cells: OrderedDict = OrderedDict()

    # groups
    require_initialized = staticmethod(groups.require_initialized)
    group_name = staticmethod(groups.name)
    group_ranks = staticmethod(groups.ranks)
    world_rank = staticmethod(groups.world_rank)
    bootstrap = staticmethod(groups.bootstrap)

    @staticmethod
    def world_group() -> str:
        """The world group's name."""
        return groups.WORLD

    # tensors
    is_tensor = staticmethod(tensors.is_tensor)
    dtype_info = staticmethod(tensors.dtype_info)
    wrap = staticmethod(tensors.wrap)
    address = staticmethod(tensors.address)
    nbytes = staticmethod(tensors.nbytes)
    synchronize = staticmethod(tensors.synchronize)

    @staticmethod
    def element_type(tensor: ms.Tensor) -> tuple:
        """The tensor's element type as the engine names it."""
        return tensors.element_type(tensor)

    @staticmethod
    def default_dtype() -> Any:
        """The dtype of ``symm.empty`` without one."""
        return ms.float32

    @staticmethod
    def is_integer_dtype(dtype: Any) -> bool:
        """Whether ``dtype`` holds integers."""
        return dtype in (ms.int8, ms.uint8, ms.int16, ms.int32, ms.int64)

    @staticmethod
    def is_signal_dtype(dtype: Any) -> bool:
        """Whether a signal may have ``dtype``."""
        return dtype in (ms.int32, ms.int64)

    @staticmethod
    def numel(tensor: ms.Tensor) -> int:
        """The tensor's element count."""
        return int(tensor.size)

    @staticmethod
    def ndim(tensor: ms.Tensor) -> int:
        """The tensor's number of dimensions."""
        return int(tensor.ndim)

    @staticmethod
    def tolist(tensor: ms.Tensor) -> list:
        """The tensor's elements as Python values."""
        return tensor.asnumpy().tolist()

    @staticmethod
    def check_tensor(tensor: ms.Tensor, name: str) -> None:
        """A tensor the runtime reads must have a dtype it carries.

        Raises:
            TypeError: a dtype outside :data:`tensors.DTYPES`.
        """
        del name   # the dtype is the argument named in the message
        tensors.dtype_info(tensor.dtype)

    @staticmethod
    def is_floating_dtype(dtype: Any) -> bool:
        """Whether ``dtype`` is floating point."""
        info = tensors.DTYPES.get(dtype)
        return info is not None and info.floating

    @staticmethod
    def is_reducible_dtype(dtype: Any) -> bool:
        """Whether the reduction kernels take ``dtype``."""
        info = tensors.DTYPES.get(dtype)
        return info is not None and info.reduce is not None

    @staticmethod
    def itemsize(dtype: Any) -> int:
        """Bytes per element of ``dtype``."""
        return tensors.dtype_info(dtype).itemsize

    @staticmethod
    def is_matmul_dtype(dtype: Any) -> bool:
        """Whether the fused ops' matmuls take ``dtype``."""
        return dtype in _MATMUL_DTYPES

    @staticmethod
    def matmul_dtype_names() -> list:
        """The dtypes the fused ops' matmuls take, as messages name them."""
        return [str(d) for d in _MATMUL_DTYPES]

    @staticmethod
    def reducible_dtype_names() -> list:
        """The dtypes reductions take, as messages name them."""
        return [str(d) for d, info in tensors.DTYPES.items() if info.reduce is not None]

    @staticmethod
    def dtype_name(dtype: Any) -> Any:
        """A MindSpore dtype's engine name (for ``low_precision_dtype=mindspore.float16``); other values as given."""
        info = tensors.DTYPES.get(dtype)
        return info.name if info is not None else dtype

    # tensor arithmetic the backward passes need
    @staticmethod
    def new_flat(count: int, dtype: Any) -> ms.Tensor:
        """A new 1-D tensor of ``count`` elements."""
        return ops.zeros((count,), dtype)

    @staticmethod
    def zeros_like(tensor: ms.Tensor) -> ms.Tensor:
        """Zeros of ``tensor``'s shape and dtype."""
        return ops.zeros_like(tensor)

    @staticmethod
    def contiguous(tensor: ms.Tensor) -> ms.Tensor:
        """``tensor`` itself when contiguous, else a contiguous copy."""
        return tensor if tensor.is_contiguous() else tensor.contiguous()

    @staticmethod
    def copy(tensor: ms.Tensor) -> ms.Tensor:
        """A new tensor with ``tensor``'s values."""
        return tensor.copy()

    @staticmethod
    def copy_into(dst: ms.Tensor, src: ms.Tensor) -> None:
        """Writes ``src``'s values into ``dst`` in place."""
        dst.copy_(src.reshape(dst.shape))

    @staticmethod
    def divide(tensor: ms.Tensor, n: int) -> ms.Tensor:
        """``tensor / n`` in a new tensor."""
        return tensor / n

    @staticmethod
    def matmul(a: ms.Tensor, b: ms.Tensor) -> ms.Tensor:
        """``a @ b``."""
        return ops.matmul(a, b)

    # autograd
    @staticmethod
    def recording() -> bool:
        """Whether MindSpore records a gradient graph now (inside grad/value_and_grad)."""
        return bool(_pynative_executor.requires_grad())

    def differentiable(self, op: str, api: Any, inputs: tuple, params: dict) -> Any:
        """Runs collective ``op`` on ``inputs`` inside its Cell, so that its bprop gives the gradients, when MindSpore
        records a gradient graph; directly otherwise (a Cell call costs more than the runtime's call).

        One Cell per distinct (op, parameters): a bprop runs after the whole forward, so a Cell's parameters must
        not change between calls. The most recently used ones are kept (all_to_all's counts change from call to
        call in MoE dispatch); an evicted Cell lives on in any graph that still holds it.
        """
        if not self.recording():
            return self._forward(api, op, params, inputs)
        key = (id(api), op, tuple(sorted(params.items())))
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = _Collective(self._forward, self._backward)
            cell.call = (api, op, params)
            if len(self._cells) > _CELLS_KEPT:
                self._cells.popitem(last=False)
        else:
            self._cells.move_to_end(key)
        return cell(*inputs)
