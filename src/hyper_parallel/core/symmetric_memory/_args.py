"""Argument checks of the user API, with messages in the project's contract form.

Every check runs before anything is written, so that a bad argument changes nothing.
"""

from __future__ import annotations

from typing import Union

import torch

from hyper_parallel.core.symmetric_memory import _context
from hyper_parallel.core.symmetric_memory._rules import REDUCE_OPS

Count = Union[int, torch.Tensor]

# The dtypes the reduction kernels accept (what `op` may combine).
REDUCIBLE_DTYPES = (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64
)


def type_name(value: object) -> str:
    """The short type name used in error messages."""
    return type(value).__name__


def integer(value: Count, name: str) -> int:
    """An integer given as a Python int or a one-element integer tensor (seed 000's convention).

    Raises:
        TypeError: neither an int nor a one-element integer tensor.
    """
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise TypeError(
                f"`{name}` must be an int or a one-element integer tensor, "
                f"but got a tensor of {value.numel()} {value.dtype} elements"
            )
        return int(value.item())
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(f"`{name}` must be an int or a one-element integer tensor, but got {type_name(value)}")


def count(value: Count, name: str) -> int:
    """A non-negative element count or offset (see :func:`integer`).

    Raises:
        TypeError: neither an int nor a one-element integer tensor.
        ValueError: a negative value.
    """
    result = integer(value, name)
    if result < 0:
        raise ValueError(f"`{name}` must be non-negative, but got {result}")
    return result


def tensor(value: object, name: str) -> torch.Tensor:
    """A contiguous tensor on the SHMEM device (the CPU for the host device).

    Raises:
        TypeError: not a tensor.
        ValueError: not contiguous, or on another device.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, but got {type_name(value)}")
    device = _context.tensor_device()
    if value.device != device:
        raise ValueError(f"`{name}` must be a tensor on {device} (the SHMEM device), but got {value.device}")
    if not value.is_contiguous():
        raise ValueError(f"`{name}` must be contiguous, but got strides {tuple(value.stride())}")
    return value


def same_dtype(value: torch.Tensor, name: str, reference: torch.Tensor, reference_name: str) -> None:
    """Raises TypeError unless ``value`` has the dtype of ``reference``."""
    if value.dtype != reference.dtype:
        raise TypeError(
            f"`{name}` must have the dtype of `{reference_name}` ({reference.dtype}), but got {value.dtype}"
        )


def window(value: torch.Tensor, name: str, offset: int, size: int, offset_name: str) -> torch.Tensor:
    """The flat slice ``value[offset : offset + size]`` of a contiguous tensor.

    Raises:
        ValueError: the slice runs past the tensor's end.
    """
    numel = value.numel()
    if offset + size > numel:
        raise ValueError(
            f"`{offset_name} + size` must be at most {name}.numel() ({numel}), "
            f"but got {offset} + {size} = {offset + size}"
        )
    return value.view(-1)[offset:offset + size]


def reduce_op(op: object, dtype: torch.dtype) -> str:
    """Checks a reduction name against the dtype.

    Raises:
        ValueError: an unknown op, or 'avg' on an integer dtype.
        TypeError: a dtype the reduction kernels do not handle.
    """
    if op not in REDUCE_OPS:
        raise ValueError(f"`op` must be one of {', '.join(repr(o) for o in REDUCE_OPS)}, but got {op!r}")
    if dtype not in REDUCIBLE_DTYPES:
        names = ", ".join(str(d).replace("torch.", "") for d in REDUCIBLE_DTYPES)
        raise TypeError(f"`tensor` must have one of dtypes {names}, but got {dtype}")
    if op == "avg" and not dtype.is_floating_point:
        raise ValueError(f"`op` must be 'sum', 'max' or 'min' for the integer dtype {dtype}, but got 'avg'")
    return op


def rank_in_group(value: object, name: str, size: int) -> int:
    """A rank inside a group of ``size`` ranks (see :func:`integer`).

    Raises:
        TypeError: neither an int nor a one-element integer tensor.
        ValueError: outside [0, size).
    """
    value = integer(value, name)
    if not 0 <= value < size:
        raise ValueError(f"`{name}` must be in [0, {size}), but got {value}")
    return value


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory of two contiguous tensors overlaps."""
    a_lo, b_lo = a.data_ptr(), b.data_ptr()
    a_hi = a_lo + a.numel() * a.element_size()
    b_hi = b_lo + b.numel() * b.element_size()
    return a_lo < b_hi and b_lo < a_hi and a.numel() > 0 and b.numel() > 0
