"""MindSpore tensors over memory the runtime owns, and the synchronisation the runtime needs around them.

MindSpore runs CPU operators asynchronously: memory an operator writes may not hold its result until the executor
is synchronised, and a buffer the runtime writes must not be overwritten by an operator still queued. Every call
into the runtime therefore first drains MindSpore's queue (:func:`synchronize`); whatever the runtime wrote is in
memory when it returns, since its calls complete before they return.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import mindspore as ms
import numpy as np
# The executor's synchronisation. mindspore.runtime.synchronize() returns without synchronising on CPU (2.10: it
# checks for an Ascend or GPU device first); this is the function it would call.
from mindspore._c_expression import synchronize as _synchronize_executor



@dataclass(frozen=True)
class DtypeInfo:
    """How one MindSpore dtype is laid out and handled: its engine name, the numpy dtype of its bytes (bfloat16
    travels as uint16), and the runtime's reduction type (None: moved, never reduced)."""

    name: str
    numpy: type
    reduce: Optional[str]
    floating: bool = False

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return np.dtype(self.numpy).itemsize


DTYPES = {
    ms.float32: DtypeInfo("float32", np.float32, "float32", True),
    ms.float64: DtypeInfo("float64", np.float64, "float64", True),
    ms.float16: DtypeInfo("float16", np.float16, "float16", True),
    ms.bfloat16: DtypeInfo("bfloat16", np.uint16, "bfloat16", True),
    ms.int8: DtypeInfo("int8", np.int8, "int8"),
    ms.uint8: DtypeInfo("uint8", np.uint8, "uint8"),
    ms.int16: DtypeInfo("int16", np.int16, None),
    ms.int32: DtypeInfo("int32", np.int32, "int32"),
    ms.int64: DtypeInfo("int64", np.int64, "int64"),
    ms.bool_: DtypeInfo("bool", np.bool_, None),
}


def synchronize() -> None:
    """Waits until every MindSpore operator queued so far has run (their results are in memory)."""
    _synchronize_executor()


def is_tensor(value: object) -> bool:
    """Whether ``value`` is a MindSpore tensor (a Parameter counts)."""
    return isinstance(value, ms.Tensor)


def dtype_info(dtype: object) -> DtypeInfo:
    """The layout of a MindSpore dtype.

    Raises:
        TypeError: a dtype the runtime does not carry.
    """
    info = DTYPES.get(dtype)
    if info is None:
        names = ", ".join(str(d) for d in DTYPES)
        raise TypeError(f"`dtype` must be one of {names}, but got {dtype}")
    return info


def element_type(tensor: ms.Tensor) -> tuple:
    """The tensor's element type as the engine names it."""
    info = dtype_info(tensor.dtype)
    return info.name, int(tensor.itemsize), info.reduce


def address(tensor: ms.Tensor) -> int:
    """The address of the tensor's first element (views included)."""
    return int(tensor.data_ptr())


def nbytes(tensor: ms.Tensor) -> int:
    """Bytes of the tensor's elements."""
    return int(tensor.size) * int(tensor.itemsize)


def wrap(base: int, shape: Sequence[int], dtype: object) -> ms.Tensor:
    """A tensor over ``prod(shape)`` elements of ``dtype`` at ``base``, sharing that memory (no copy).

    The memory must outlive the tensor: here it is the symmetric heap, mapped for the whole lifecycle.
    """
    info = dtype_info(dtype)
    count = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    itemsize = np.dtype(info.numpy).itemsize
    if count == 0:
        array = np.empty(tuple(shape), dtype=info.numpy)
    else:
        raw = (ctypes.c_byte * (count * itemsize)).from_address(base)
        array = np.frombuffer(raw, dtype=info.numpy).reshape(tuple(shape))
    tensor = ms.from_numpy(array)
    return tensor.view(ms.bfloat16) if dtype == ms.bfloat16 else tensor
