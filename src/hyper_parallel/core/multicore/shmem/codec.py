"""The wire formats of low-precision communication on the host: encoding, decoding, and the reduction of encoded
runs into full precision.

float16 and bfloat16 travel as the plain cast. A run of ``count`` fp8 values (float8_e4m3fn or float8_e5m2)
travels with one float32 scale per :data:`BLOCK` values (the last block may be short): value ``i`` is
``fp8[i] * scales[i // BLOCK]``. A block's scale is the power of two ``2**e`` with ``e`` the exponent of
``frexp(absmax / fp8_max)`` in float32 (448 for e4m3fn, 57344 for e5m2), at least -126; a block holding inf or
NaN, or (e4m3fn) with ``e`` above 119, has a NaN scale and decodes to NaN. The bytes and scales are those of
torch's casts on the same definition, bit for bit.

The kernels are vectorised C++ (``ccsrc/ops/host/codec.h``) that run on the calling thread; the binding checks the
tensors (in C++: this sits on the hot path of every low-precision piece). MoE's rows have a second entry,
:func:`encode_rows_on_device` / :func:`decode_rows_on_device`: the same rows, by the runtime's device on the current
stream (the host device runs these kernels there; an NPU casts its rows itself).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from hyper_parallel.core.multicore.shmem._binding import C
from hyper_parallel.core.multicore.errors import type_name
from hyper_parallel.core.multicore.shmem._checks import check_choice
from hyper_parallel.core.multicore.shmem._streams import current_handle

#: Values per scale.
BLOCK: int = C.scale_block


def scale_count(count: int) -> int:
    """The scales a run of ``count`` values has (one per started block)."""
    return -(-count // BLOCK)


#: An encoded run: ``(scales, codes)``. ``codes`` is a contiguous CPU tensor of float8_e4m3fn, float8_e5m2,
#: float16 or bfloat16 (its dtype names the format); ``scales`` is the float32 tensor of its
#: :func:`scale_count` block scales for the fp8 formats, None for float16 and bfloat16 (the plain cast).
EncodedRun = Tuple[Optional[torch.Tensor], torch.Tensor]


def encode(src: torch.Tensor, dst: EncodedRun) -> None:
    """Casts ``src`` down into the run ``dst``, in ``dst``'s format (its codes' dtype).

    float16 and bfloat16 are torch's cast (round to nearest even); fp8 computes one scale per block of
    :data:`BLOCK` values into ``dst``'s scales first (module docstring). The codes are for another rank to read:
    they are written past the cache (non-temporal stores, where the CPU has them).

    Args:
        src: the values: a contiguous CPU tensor of dtype float32, float64, float16 or bfloat16 (rounded to float32
            first, as torch's cast does).
        dst: an :data:`EncodedRun` of ``src.numel()`` codes apart from ``src``.

    Returns:
        None: ``dst`` holds the encoding.

    Raises:
        TypeError: an argument of the wrong type or dtype, scales given for float16 or bfloat16 codes.
        ValueError: a tensor not on the CPU or not contiguous, element counts that do not match, overlapping
            tensors. Nothing is written.
        ShmemStateError: a tensor of a freed symmetric allocation.
    """
    C.encode(src, dst)


def decode(src: EncodedRun, out: torch.Tensor, *, accumulate: bool) -> None:
    """Decodes the run ``src`` into ``out``, or adds the decoded values to ``out``.

    A decoded value is exact: a float16 or bfloat16 code widened, an fp8 code times its block's scale. It is added
    in float64 for a float64 ``out``, in float32 otherwise, and a float16 or bfloat16 ``out`` is rounded once, to
    nearest even.

    Args:
        src: an :data:`EncodedRun` of ``out.numel()`` codes.
        out: a contiguous CPU tensor of dtype float32, float64, float16 or bfloat16 that overlaps no part of
            ``src``.
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
    C.decode(src, out, accumulate)


_REDUCE_OPS = {name: number for name, number in C.reduce_ops().items() if name in ("sum", "avg")}


def reduce_encoded(out: torch.Tensor, own: Optional[torch.Tensor], sources: Sequence[EncodedRun], *, op: str,
                   reencode: Optional[EncodedRun] = None) -> None:
    """The reduction step of low-precision communication, in one pass: ``own`` plus the decoded ``sources``.

    Element by element, ``own`` (if given) and then each decoded source are added in order, in float64 for a
    float64 ``out`` and in float32 otherwise; ``"avg"`` divides by the number of terms. A decoded fp8 value is the
    exact product of its code and its scale (as :func:`decode` computes it), a float16 or bfloat16 one
    its exact widening. Without ``reencode``, ``out`` receives the result (rounded once, to nearest even, into a
    float16 or bfloat16 ``out``). With it, the result is encoded into ``reencode`` (as :func:`encode`
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


def wire_row_bytes(name: str, row_elems: int) -> int:
    """Bytes of one MoE wire row of ``row_elems`` values in the wire format ``name``.

    Args:
        name: float16, bfloat16, float8_e4m3fn or float8_e5m2.
        row_elems: values per row.

    Returns:
        ``2 * row_elems`` for float16 and bfloat16; ``4 + row_elems`` for the fp8 formats (the row's scale, then
        its codes).

    Raises:
        ValueError: an unknown format.
    """
    return int(C.wire_row_bytes(name, row_elems))


def encode_rows(src: torch.Tensor, name: str) -> torch.Tensor:
    """The rows of ``src`` (its first dimension) in the MoE wire format ``name``: one uint8 wire row each.

    The runtime's row codec (``ccsrc/ops/host/codec.h``, ``HostEncodeRows``; MindSpore's handler calls the same
    through the C ABI). float16 and bfloat16 rows are the plain cast (round to nearest even); an fp8 row is its
    float32 scale, then its codes: the scale is a block's (module docstring) with the whole row as the block, and
    the codes are torch's cast of the values divided by it. A row holding inf or NaN decodes to NaN.

    Args:
        src: a contiguous CPU tensor of at least one dimension, of float32, float64, float16 or bfloat16.
        name: float16, bfloat16, float8_e4m3fn or float8_e5m2.

    Returns:
        A new uint8 tensor of ``(src.shape[0], wire_row_bytes(name, row_elems))``.

    Raises:
        TypeError: ``src`` of another dtype.
        ValueError: an unknown format, ``src`` 0-d, not on the CPU or not contiguous.
    """
    rows = src.shape[0] if src.dim() else 0
    row_elems = src.numel() // rows if rows else int(torch.Size(src.shape[1:]).numel())
    wire = torch.empty((rows, wire_row_bytes(name, row_elems)), dtype=torch.uint8)
    C.encode_rows(src, wire, name)
    return wire


def decode_rows(wire: torch.Tensor, name: str, out: torch.Tensor) -> torch.Tensor:
    """:func:`encode_rows` undone: the wire rows ``wire`` decoded into the rows of ``out`` (each value exact: a
    16-bit code widened, an fp8 code times its row's scale in float32, then rounded once into ``out``'s dtype).

    Args:
        wire: a contiguous uint8 CPU tensor of ``out.shape[0]`` wire rows.
        name: the format ``wire`` is in.
        out: a contiguous CPU tensor of at least one dimension, of float32, float64, float16 or bfloat16, apart
            from ``wire``.

    Returns:
        ``out``.

    Raises:
        TypeError: a tensor of the wrong dtype.
        ValueError: an unknown format, sizes that do not match, a tensor not on the CPU or not contiguous,
            overlapping tensors. Nothing is written.
    """
    C.decode_rows(wire, out, name)
    return out


def encode_rows_on_device(src: torch.Tensor, dst: torch.Tensor, name: str) -> None:
    """:func:`encode_rows` by the runtime's device, on the current stream (``Runtime::EncodeRows``): the tensors
    stay where they are, an NPU's rows are encoded on the NPU. The same codes as :func:`encode_rows` on the host
    device; the ascend device carries float16 and bfloat16 only (no fp8 cast kernel), and refuses the fp8 formats.

    Args:
        src: a contiguous tensor of the active tensor device, of at least one dimension, of float32, float64,
            float16 or bfloat16.
        dst: a contiguous uint8 tensor of the same device, ``(src.shape[0], wire_row_bytes(name, row_elems))``,
            apart from ``src``.
        name: float16, bfloat16, float8_e4m3fn or float8_e5m2.

    Raises:
        TypeError: a tensor of the wrong dtype.
        ValueError: an unknown format, sizes that do not match, a tensor on another device, overlapping tensors.
        ShmemStateError: no runtime. ShmemDeviceError: a format the device does not carry.
    """
    C.encode_rows(src, dst, name, current_handle())


def decode_rows_on_device(wire: torch.Tensor, name: str, out: torch.Tensor) -> torch.Tensor:
    """:func:`encode_rows_on_device` undone (:func:`decode_rows` by the runtime's device, on the current stream).

    Args:
        wire: a contiguous uint8 tensor of the active tensor device, ``out.shape[0]`` wire rows.
        name: the format ``wire`` is in.
        out: a contiguous tensor of the same device, of float32, float64, float16 or bfloat16, apart from ``wire``.

    Returns:
        ``out``.

    Raises:
        As :func:`encode_rows_on_device`.
    """
    C.decode_rows(wire, out, name, current_handle())
    return out
