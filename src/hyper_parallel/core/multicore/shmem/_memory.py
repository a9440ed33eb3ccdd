"""Symmetric allocation: ``empty`` and ``free``, both collective over the root."""

from __future__ import annotations

from typing import Optional

import torch

from hyper_parallel.core.multicore import call_site
from hyper_parallel.core.multicore.shmem import _across_nodes
from hyper_parallel.core.multicore.shmem._binding import C
from hyper_parallel.core.multicore.shmem._lifecycle import root_info
from hyper_parallel.core.multicore.errors import ShmemTypeError, ShmemValueError, attach_fields, type_name

_LOG_DEBUG = 0


def user_call_site() -> str:
    """The user's call site, only when HYPER_PARALLEL_SHMEM_LOG_LEVEL=0 asks for allocation logs."""
    return call_site.user_call_site(C.log_level() == _LOG_DEBUG)


def _parse_size(size: tuple) -> list:
    dims = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise ShmemTypeError(f"`size` must be ints or one sequence of ints, but got {tuple(size)!r}")
    if any(d >= 2**63 for d in dims):  # the binding takes int64 dimensions (and checks signs and their product)
        raise ShmemValueError(f"`size` must describe at most 2**63 - 1 bytes, but got {list(dims)}")
    return list(dims)


def empty(*size, dtype: Optional[torch.dtype] = None, alignment: Optional[int] = None) -> torch.Tensor:
    """Allocates an uninitialised CPU tensor in the symmetric heap (collective over the root).

    Every rank must call ``empty`` in the same order with the same size, dtype and alignment: the runtime
    verifies the byte count, alignment and heap offset on every rank and fails on all of them with each side's
    values instead of corrupting memory (a different shape of the same byte count is not detected).

    Args:
        *size: the shape, torch-style: ``empty(2, 3)`` or ``empty((2, 3))``.
        dtype: the element type (default: ``torch.get_default_dtype()``).
        alignment: byte alignment of the allocation inside the heap, a power of two (default 64).

    Returns:
        A tensor living at the same heap offset on every rank.

    Raises:
        TypeError: a dimension is not an int, or ``dtype`` is not a torch.dtype.
        ValueError: a negative dimension, a shape of 2**63 bytes or more, or an alignment that is not a power of
            two up to 2 MiB.
        ShmemStateError: no runtime is active.
        ShmemMismatchError: ranks disagree on the allocation.
        ShmemOutOfMemoryError: the heap cannot hold it (on any rank).
        ShmemTimeoutError: a rank did not reach the allocation in time.
    """
    try:
        dims = _parse_size(size)
        if dtype is None:
            dtype = torch.get_default_dtype()
        if not isinstance(dtype, torch.dtype):
            raise ShmemTypeError(f"`dtype` must be a torch.dtype, but got {type_name(dtype)}")
        if alignment is None:
            alignment = 0  # the runtime's default
        elif isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0:
            # the runtime checks the rest
            raise ShmemValueError(f"`alignment` must be a power of two, but got {alignment!r}")
        call_site = user_call_site()
        root = root_info()
        if root is not None and root.spans_nodes:
            return _across_nodes.empty(root, lambda: C.empty(dims, dtype, alignment, call_site))
        return C.empty(dims, dtype, alignment, call_site)
    except Exception as error:
        attach_fields(error, "allocate")
        raise


def free(tensor: torch.Tensor) -> None:
    """Frees the whole allocation of a tensor returned by :func:`empty` (collective over the root).

    Afterwards the tensor and every view of it raise a RuntimeError naming the allocation on any use.

    Args:
        tensor: the very tensor ``empty`` returned (not a view of it).

    Raises:
        TypeError: not a tensor.
        ValueError: a view, or a tensor that ``empty`` did not return.
        ShmemStateError: already freed, from an earlier lifecycle, or no runtime is active.
        ShmemMismatchError: ranks disagree on the free.
    """
    try:
        call_site = user_call_site()
        root = root_info()
        if root is not None and root.spans_nodes:
            _across_nodes.free(root, tensor, lambda: C.free(tensor, call_site))
            return
        C.free(tensor, call_site)
    except Exception as error:
        attach_fields(error, "free")
        raise


def peer_tensor(tensor: torch.Tensor, pe: int) -> torch.Tensor:
    """The copy of a symmetric tensor that rank ``pe`` holds, as a tensor of this process (``aclshmem_ptr``).

    The result has ``tensor``'s shape, strides and dtype, and lies at the same offset of ``pe``'s heap: torch ops
    on it read and write ``pe``'s memory directly, without a copy (a matmul can read a peer's partial product in
    place, for instance). Nothing orders those accesses with ``pe``'s own: order them with signals or barriers,
    as for :func:`put` and :func:`get`. ``peer_tensor(t, my_pe)`` views ``t``'s own memory.

    The result is not itself a symmetric tensor (it cannot be the symmetric side of ``put``, ``get`` or
    ``signal``), and it dies with the allocation: after :func:`free` of the allocation, or after the runtime
    shuts down, it raises a RuntimeError on any use.

    Args:
        tensor: a symmetric tensor from :func:`empty`, or any view of one.
        pe: a rank inside the root.

    Returns:
        The tensor over ``pe``'s copy.

    Raises:
        TypeError: ``tensor`` is not a tensor, or ``pe`` is not an int.
        ValueError: ``tensor`` does not live in the symmetric heap, or ``pe`` is out of range.
        ShmemStateError: a freed tensor, or no runtime.
    """
    try:
        return C.peer_tensor(tensor, pe)
    except Exception as error:
        attach_fields(error, "peer_tensor")
        raise
