"""MindSpore tensors over memory the runtime owns, the synchronisation the runtime needs around them, and MindSpore's
tensor facts: what the user API's shared checks ask about tensors and dtypes, and the tensor arithmetic of the
gradient table (:class:`hyper_parallel.core.symmetric_memory.protocol.TensorFacts` names them; torch's handler answers
the same questions in :mod:`hyper_parallel.platform.torch.tensors`).

MindSpore runs CPU operators asynchronously: memory an operator writes may not hold its result until the executor
is synchronised, and a buffer the runtime writes must not be overwritten by an operator still queued. Every call
into the runtime therefore first drains MindSpore's queue (:func:`synchronize`); whatever the runtime wrote is in
memory when it returns, since its calls complete before they return.

**Freed tensors.** MindSpore cannot take memory away from a tensor, as libtorch invalidates a freed storage; and after
``symm.free`` the same heap range may be handed to a new ``symm.empty``, so an address cannot tell a freed tensor
from a live one. What a freed tensor and all its views share is their *storage* (MindSpore 2.10: a slice, a reshape,
a transpose or a ``view(dtype)`` of a tensor shares the C++ storage its ``untyped_storage()`` wraps, and a new
``from_numpy`` tensor over the same memory gets a storage of its own). :func:`invalidate` marks the storage of every
tensor the handler made over the freed allocation with ``untyped_storage().resize_(0)``: on memory MindSpore does not
own (``from_numpy``'s), that sets the storage's byte count to 0 and keeps its address and the memory, for every view
at once. A tensor with elements whose storage holds no bytes, over a range of a freed allocation, is freed
(:func:`freed`): :func:`check_tensor` refuses it in every call, naming the allocation. Each view keeps the numpy array
it lies over alive, so an allocation is remembered exactly as long as some tensor over it lives.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import mindspore as ms
import numpy as np
from mindspore import ops
# The executor's synchronisation. mindspore.runtime.synchronize() returns without synchronising on CPU (2.10: it
# checks for an Ascend or GPU device first); this is the function it would call.
from mindspore._c_expression import synchronize as _synchronize_executor

from hyper_parallel.core.multicore.errors import ShmemStateError, ShmemTypeError

tensor_type_name = "mindspore.Tensor"
signal_dtype_names = "mindspore.int32 or mindspore.int64"


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
        raise ShmemTypeError(f"`dtype` must be one of {names}, but got {dtype}")
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


def wrap(base: int, shape: Sequence[int], dtype: object) -> tuple:
    """A tensor over ``prod(shape)`` elements of ``dtype`` at ``base``, sharing that memory (no copy), and the numpy
    array it lies over (alive as long as the tensor or any view of it is).

    The memory must outlive the tensor: here it is the symmetric heap, mapped for the whole lifecycle.

    Returns:
        ``(tensor, array)``.
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
    return (tensor.view(ms.bfloat16) if dtype == ms.bfloat16 else tensor), array


@dataclass(frozen=True)
class _Freed:
    """A freed allocation, as long as some tensor over it lives: its name in messages, the address ranges of the
    tensors the handler made over it (this rank's copy, and peers' copies viewed through ``rendezvous``), and weak
    references to the arrays they lie over."""

    name: str
    ranges: tuple
    arrays: tuple

    def viewed(self) -> bool:
        """Whether some tensor over the allocation still lives."""
        return any(array() is not None for array in self.arrays)

    def holds(self, at: int) -> bool:
        """Whether address ``at`` lies in one of the ranges."""
        return any(begin <= at < end for begin, end in self.ranges)


_freed: list = []


def invalidate(made: Sequence[tuple], allocation_id: int, lifecycle: int) -> None:
    """Marks every tensor the handler made over a freed allocation, and every view of them, freed (:func:`freed`).

    Args:
        made: ``(tensor, array)`` of each tensor :func:`wrap` made over the allocation (array None: a tensor of the
            caller's over it, whose storage is marked too).
        allocation_id: the allocation's id (never reused).
        lifecycle: the runtime's lifecycle it was made in.
    """
    ranges, arrays = [], []
    for tensor, array in made:
        if numel(tensor):
            if array is not None:
                ranges.append((address(tensor), address(tensor) + nbytes(tensor)))
                arrays.append(weakref.ref(array))
            tensor.untyped_storage().resize_(0)   # memory MindSpore does not own: only the byte count goes to 0
    _freed[:] = [f for f in _freed if f.viewed()]
    _freed.append(_Freed(f"allocation_id={allocation_id} lifecycle={lifecycle}", tuple(ranges), tuple(arrays)))


def freed(tensor: ms.Tensor) -> Optional[str]:
    """The allocation a tensor with elements lay over when it was freed (``"allocation_id=3 lifecycle=1"``; several,
    joined by " or ", where views of more than one freed allocation of its range live), else None.

    Costs nothing until something is freed; then a look at the storage of a tensor whose address lies in a freed
    range.
    """
    if not _freed or not numel(tensor):
        return None
    at = address(tensor)
    names = [f.name for f in _freed if f.holds(at) and f.viewed()]
    if not names or tensor.untyped_storage().nbytes():
        return None
    return " or ".join(names)


def readable_numel(value: object) -> Optional[int]:
    """The element count of a tensor the runtime reads as it is (a MindSpore tensor of a dtype it carries, not over a
    freed allocation, contiguous: what :func:`check_tensor` and the shared checks ask), else None; never raises (the
    full checks then say why).

    Returns:
        The element count, or None.
    """
    try:
        if isinstance(value, ms.Tensor) and value.dtype in DTYPES and value.is_contiguous() and freed(value) is None:
            return numel(value)
    except Exception:   # noqa: BLE001  (a tensor that refuses a question: the full checks report it)
        pass
    return None


# The dtypes the fused ops' matmuls take (as on torch).
_MATMUL_DTYPES = (ms.float32, ms.float16, ms.bfloat16, ms.float64)


def default_dtype() -> Any:
    """The dtype of ``symm.empty`` without one."""
    return ms.float32


def dtype_name(dtype: Any) -> Any:
    """A MindSpore dtype's engine name (for ``low_precision_dtype=mindspore.float16``); other values as given."""
    info = DTYPES.get(dtype)
    return info.name if info is not None else dtype


# --------------------------------------------------------------------------
# The tensor facts the shared checks ask for.
# --------------------------------------------------------------------------


def numel(tensor: ms.Tensor) -> int:
    """The tensor's element count."""
    return int(tensor.size)


def ndim(tensor: ms.Tensor) -> int:
    """The tensor's number of dimensions."""
    return int(tensor.ndim)


def tolist(tensor: ms.Tensor) -> list:
    """The tensor's elements as Python values."""
    return tensor.asnumpy().tolist()


def check_tensor(tensor: ms.Tensor, name: str) -> None:
    """A tensor the runtime reads must have a dtype it carries, and must not lie over a freed allocation.

    Raises:
        ShmemTypeError: a dtype outside :data:`DTYPES`.
        ShmemStateError: the tensor (or the tensor it is a view of) was freed (``symm.free``), in the torch binding's
            words (``ccsrc/bindings/torch/allocations.cc``).
    """
    dtype_info(tensor.dtype)
    allocation = freed(tensor)
    if allocation is not None:
        raise ShmemStateError(f"tensor of a freed symmetric allocation: argument={name} (symmetric allocation was "
                              f"freed: {allocation} (this tensor and every view of it are invalid after symm.free))")


def is_integer_dtype(dtype: Any) -> bool:
    """Whether ``dtype`` holds integers."""
    return dtype in (ms.int8, ms.uint8, ms.int16, ms.int32, ms.int64)


def is_floating_dtype(dtype: Any) -> bool:
    """Whether ``dtype`` is floating point."""
    info = DTYPES.get(dtype)
    return info is not None and info.floating


def is_reducible_dtype(dtype: Any) -> bool:
    """Whether the reduction kernels take ``dtype``."""
    info = DTYPES.get(dtype)
    return info is not None and info.reduce is not None


def reducible_dtype_names() -> list:
    """The dtypes reductions take, as messages name them."""
    return [str(d) for d, info in DTYPES.items() if info.reduce is not None]


def is_signal_dtype(dtype: Any) -> bool:
    """Whether a signal may have ``dtype``."""
    return dtype in (ms.int32, ms.int64)


def itemsize(dtype: Any) -> int:
    """Bytes per element of ``dtype``."""
    return dtype_info(dtype).itemsize


def is_matmul_dtype(dtype: Any) -> bool:
    """Whether the fused ops' matmuls take ``dtype``."""
    return dtype in _MATMUL_DTYPES


def matmul_dtype_names() -> list:
    """The dtypes the fused ops' matmuls take, as messages name them."""
    return [str(d) for d in _MATMUL_DTYPES]


# --------------------------------------------------------------------------
# Tensor arithmetic: the gradient table's and the unpipelined fused ops'.
# --------------------------------------------------------------------------


def new_flat(count: int, dtype: Any) -> ms.Tensor:
    """A new 1-D tensor of ``count`` elements (zeros)."""
    return ops.zeros((count,), dtype)


def new_bytes(count: int) -> ms.Tensor:
    """A new 1-D uint8 tensor of ``count`` bytes (zeros): a buffer of the runtime's encoded rows."""
    return new_flat(count, ms.uint8)


def new_empty(shape: Sequence[int], like: ms.Tensor) -> ms.Tensor:
    """A new contiguous tensor of ``shape`` with ``like``'s dtype."""
    count = 1
    for d in shape:
        count *= int(d)
    return new_flat(count, like.dtype).reshape(tuple(shape))


def new_zeros(shape: Sequence[int], like: ms.Tensor) -> ms.Tensor:
    """A new contiguous tensor of zeros of ``shape`` with ``like``'s dtype."""
    return new_empty(shape, like)   # new_flat's tensors are zeros


def zeros_like(tensor: ms.Tensor) -> ms.Tensor:
    """Zeros of ``tensor``'s shape and dtype."""
    return ops.zeros_like(tensor)


def contiguous(tensor: ms.Tensor) -> ms.Tensor:
    """``tensor`` itself when contiguous, else a contiguous copy."""
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def copy(tensor: ms.Tensor) -> ms.Tensor:
    """A new tensor with ``tensor``'s values."""
    return tensor.copy()


def reshape(tensor: ms.Tensor, shape: Sequence[int]) -> ms.Tensor:
    """``tensor`` with another shape."""
    return tensor.reshape(tuple(shape))


def copy_into(dst: ms.Tensor, src: ms.Tensor) -> None:
    """Writes ``src``'s values into ``dst`` in place."""
    dst.copy_(src.reshape(dst.shape))


def divide(tensor: ms.Tensor, n: int) -> ms.Tensor:
    """``tensor / n`` in a new tensor."""
    return tensor / n


def matmul(a: ms.Tensor, b: ms.Tensor) -> ms.Tensor:
    """``a @ b``."""
    return ops.matmul(a, b)
