"""The wire formats of low-precision communication on the host: block-scaled fp8 encoding and decoding, and the
reduction of encoded runs (any of fp8, float16, bfloat16) into full precision.

A run of ``count`` values travels as ``count`` fp8 values (float8_e4m3fn or float8_e5m2) and one float32 scale per
:data:`BLOCK` values (the last block may be short): value ``i`` is ``fp8[i] * scales[i // BLOCK]``. A block's scale
is the power of two ``2**e`` with ``e`` the exponent of ``frexp(absmax / fp8_max)`` in float32 (448 for e4m3fn,
57344 for e5m2), at least -126; a block holding inf or NaN, or (e4m3fn) with ``e`` above 119, has a NaN scale and
decodes to NaN. The bytes and scales are those of torch's casts on the same definition, bit for bit.

The kernels are vectorised C++ (``ccsrc/ops/host/codec.h``) that run on the calling thread; the binding checks the
tensors (in C++: this sits on the hot path of every low-precision piece).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from hyper_parallel.core.multicore.shmem._binding import C
from hyper_parallel.core.multicore.shmem._checks import check_choice, type_name

#: Values per scale.
BLOCK: int = C.scale_block


def scale_count(count: int) -> int:
    """The scales a run of ``count`` values has (one per started block)."""
    return -(-count // BLOCK)


def encode_block_scaled(src: torch.Tensor, scales: torch.Tensor, dst: torch.Tensor) -> None:
    """Casts ``src`` down to ``dst``'s fp8 dtype, one scale per block of :data:`BLOCK` values into ``scales``.

    Args:
        src: the values: a contiguous CPU tensor of dtype float32, float64, float16 or bfloat16 (rounded to float32
            first, as torch's cast does).
        scales: a contiguous CPU float32 tensor of :func:`scale_count` ``(src.numel())`` elements.
        dst: a contiguous CPU tensor of dtype float8_e4m3fn or float8_e5m2 (the format), ``src.numel()`` elements.

    Returns:
        None: ``scales`` and ``dst`` hold the encoding.

    Raises:
        TypeError: an argument that is not a tensor, or of another dtype.
        ValueError: a tensor not on the CPU or not contiguous, element counts that do not match, overlapping
            tensors. Nothing is written.
        ShmemStateError: a tensor of a freed symmetric allocation.
    """
    C.encode_block_scaled(src, scales, dst)


def decode_block_scaled(scales: torch.Tensor, src: torch.Tensor, out: torch.Tensor, *, accumulate: bool) -> None:
    """Decodes ``src`` (fp8) with its ``scales`` into ``out``, or adds the decoded values to ``out``.

    The product of an fp8 value and its scale is exact; it is added in float64 for a float64 ``out``, in float32
    otherwise, and a float16 or bfloat16 ``out`` is rounded once, to nearest even.

    Args:
        scales: a contiguous CPU float32 tensor of :func:`scale_count` ``(src.numel())`` elements.
        src: a contiguous CPU tensor of dtype float8_e4m3fn or float8_e5m2.
        out: a contiguous CPU tensor of dtype float32, float64, float16 or bfloat16, ``src.numel()`` elements, that
            overlaps neither ``src`` nor ``scales``.
        accumulate: add to ``out`` (True) or overwrite it (False).

    Returns:
        None: ``out`` holds the result.

    Raises:
        TypeError: an argument of the wrong type or dtype.
        ValueError: a tensor not on the CPU or not contiguous, element counts that do not match, overlapping
            tensors. Nothing is written.
        ShmemStateError: a tensor of a freed symmetric allocation.
    """
    if accumulate is not True and accumulate is not False:
        raise TypeError(f"`accumulate` must be a bool, but got {type_name(accumulate)}")
    C.decode_block_scaled(scales, src, out, accumulate)


#: An encoded run: ``(scales, codes)``. ``codes`` is a contiguous CPU tensor of float8_e4m3fn, float8_e5m2,
#: float16 or bfloat16 (its dtype names the format); ``scales`` is the float32 tensor of its
#: :func:`scale_count` block scales for the fp8 formats, None for float16 and bfloat16 (the plain cast).
EncodedRun = Tuple[Optional[torch.Tensor], torch.Tensor]

_REDUCE_OPS = {"sum": 0, "avg": 1}


def reduce_encoded(out: torch.Tensor, own: Optional[torch.Tensor], sources: Sequence[EncodedRun], *, op: str,
                   reencode: Optional[EncodedRun] = None) -> None:
    """The reduction step of low-precision communication, in one pass: ``own`` plus the decoded ``sources``.

    Element by element, ``own`` (if given) and then each decoded source are added in order, in float64 for a
    float64 ``out`` and in float32 otherwise; ``"avg"`` divides by the number of terms. A decoded fp8 value is the
    exact product of its code and its scale (as :func:`decode_block_scaled` computes it), a float16 or bfloat16 one
    its exact widening. Without ``reencode``, ``out`` receives the result (rounded once, to nearest even, into a
    float16 or bfloat16 ``out``). With it, the result is encoded into ``reencode`` (as :func:`encode_block_scaled`
    encodes it, or torch's cast for float16 and bfloat16; a float64 result is rounded to float32 first, like
    torch's casts) and ``out`` receives the decoding of those very codes: what every rank decoding them gets.

    Args:
        out: a contiguous CPU tensor of float32, float64, float16 or bfloat16.
        own: None, or ``out``'s dtype and element count: ``out`` itself (in place) or memory apart from it.
        sources: the encoded runs (:data:`EncodedRun`), ``out.numel()`` values each, all of one format, apart
            from ``out``; at least one when ``own`` is None.
        op: ``"sum"`` or ``"avg"``.
        reencode: None, or a run of the sources' format (or any format when there are none) to encode the result
            into, apart from every other operand.

    Returns:
        None: ``out`` (and ``reencode``) hold the result.

    Raises:
        TypeError: an argument of the wrong type or dtype, runs of different formats, scales given for float16 or
            bfloat16 codes.
        ValueError: an unknown op, element counts that do not match, no term, a tensor not on the CPU or not
            contiguous, overlapping operands. Nothing is written.
        ShmemStateError: a tensor of a freed symmetric allocation.
    """
    C.reduce_encoded(out, own, sources, check_choice("op", op, _REDUCE_OPS), reencode)
