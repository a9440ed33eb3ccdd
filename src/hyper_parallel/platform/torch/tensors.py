"""torch's tensor facts: what the user API's shared checks ask about tensors and dtypes, and the tensor arithmetic
of the gradient table (:class:`hyper_parallel.core.symmetric_memory.protocol.TensorFacts` names them; MindSpore's
handler answers the same questions in :mod:`hyper_parallel.platform.mindspore.tensors`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch

from hyper_parallel.core.multicore.errors import ShmemTypeError, ShmemValueError

tensor_type_name = "torch.Tensor"
signal_dtype_names = "torch.int32 or torch.int64"

# Where the host device's tensors live.
DEVICE = torch.device("cpu")
# The dtypes the reduction kernels accept (what `op` may combine).
REDUCIBLE_DTYPES = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64
)
_SIGNAL_DTYPES = (torch.int32, torch.int64)
# The dtypes the fused ops' matmuls take.
MATMUL_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def is_tensor(value: object) -> bool:
    """Whether ``value`` is a torch tensor."""
    return isinstance(value, torch.Tensor)


def numel(tensor: torch.Tensor) -> int:
    """The tensor's element count."""
    return tensor.numel()


def ndim(tensor: torch.Tensor) -> int:
    """The tensor's number of dimensions."""
    return tensor.dim()


def tolist(tensor: torch.Tensor) -> list:
    """The tensor's elements as Python values."""
    return tensor.tolist()


def check_tensor(tensor: torch.Tensor, name: str) -> None:
    """A tensor the runtime reads must be on the SHMEM device.

    Raises:
        ValueError: on another device.
    """
    if tensor.device != DEVICE:
        raise ShmemValueError(f"`{name}` must be a tensor on {DEVICE} (the SHMEM device), but got {tensor.device}")


def readable_numel(value: object) -> Optional[int]:
    """The element count of a tensor the runtime reads as it is (a tensor on the SHMEM device, contiguous: what
    :func:`check_tensor` and the shared checks ask), else None; never raises (the full checks then say why).

    Returns:
        ``value.numel()``, or None.
    """
    try:
        if isinstance(value, torch.Tensor) and value.device == DEVICE and value.is_contiguous():
            return value.numel()
    except Exception:   # noqa: BLE001  (a tensor that refuses a question: the full checks report it)
        pass
    return None


def is_integer_dtype(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` holds integers (bool does not count)."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def is_floating_dtype(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` is floating point."""
    return dtype.is_floating_point


def is_reducible_dtype(dtype: torch.dtype) -> bool:
    """Whether the reduction kernels take ``dtype``."""
    return dtype in REDUCIBLE_DTYPES


def reducible_dtype_names() -> list:
    """The dtypes the reduction kernels take, as messages name them."""
    return [str(d).removeprefix("torch.") for d in REDUCIBLE_DTYPES]


def is_signal_dtype(dtype: torch.dtype) -> bool:
    """Whether a signal may have ``dtype``."""
    return dtype in _SIGNAL_DTYPES


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype``.

    Raises:
        TypeError: not a torch.dtype.
    """
    if not isinstance(dtype, torch.dtype):
        raise ShmemTypeError(f"`dtype` must be a torch.dtype, but got {type(dtype).__name__}")
    return dtype.itemsize


def is_matmul_dtype(dtype: torch.dtype) -> bool:
    """Whether the fused ops' matmuls take ``dtype``."""
    return dtype in MATMUL_DTYPES


def matmul_dtype_names() -> list:
    """The dtypes the fused ops' matmuls take, as messages name them."""
    return [str(d).removeprefix("torch.") for d in MATMUL_DTYPES]


def tracks(*tensors: object) -> bool:
    """Whether autograd records a call on these inputs (grad mode on and one of them requires grad)."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


# The arithmetic of the gradient table (hyper_parallel.core.symmetric_memory.gradients).


def new_empty(shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor of ``shape`` with ``like``'s dtype and device."""
    return like.new_empty(shape)


def new_zeros(shape: Sequence[int], like: torch.Tensor) -> torch.Tensor:
    """A new contiguous tensor of zeros of ``shape`` with ``like``'s dtype and device."""
    return like.new_zeros(shape)


def contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself when contiguous, else a contiguous copy."""
    return tensor.contiguous()


def copy(tensor: torch.Tensor) -> torch.Tensor:
    """A new tensor with ``tensor``'s values."""
    return tensor.clone()


def reshape(tensor: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """A contiguous ``tensor`` with another shape (a view of it)."""
    return tensor.view(shape)


def divide(tensor: torch.Tensor, n: int) -> torch.Tensor:
    """``tensor / n`` in a new tensor."""
    return tensor / n
