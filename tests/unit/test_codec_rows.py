"""Unit tests of the runtime's MoE row codec (``shmem.codec.encode_rows`` / ``decode_rows``, the one both
frameworks' handlers call) against a torch reference of the row format, over a hypothesis sweep of shapes,
magnitudes and dtypes.

The reference: float16 and bfloat16 rows are torch's cast of the float32-rounded values; an fp8 row is its float32
scale (``2**e``, ``e`` the exponent of ``torch.frexp(absmax / fp8_max)``, at least -126; NaN for a row holding inf
or NaN, or past e4m3fn's exponent limit, with every code 0x7F), then torch's cast of ``x * (1 / scale)``. Decoding
is the code's float32 value times the scale, cast to the output's dtype. Bytes and decoded values must be
bit-identical (NaN equal to NaN).

Single process, no runtime: the codec needs none.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hyper_parallel.core.multicore.shmem import codec

FORMATS = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2, "float16": torch.float16,
           "bfloat16": torch.bfloat16}
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
_MAX_EXPONENT = {torch.float8_e4m3fn: 119, torch.float8_e5m2: 127}


def reference_rows(values: torch.Tensor, name: str) -> torch.Tensor:
    """The wire rows of ``values`` (rows, row_elems), in torch ops."""
    low = FORMATS[name]
    rows = values.shape[0]
    x = values.reshape(rows, values[0:0].flatten(1).shape[1]).to(torch.float32)
    if low.itemsize == 2:
        return x.to(low).flatten().view(torch.uint8).reshape(rows, 2 * x.shape[1])
    absmax = x.abs().amax(dim=1) if x.shape[1] else x.new_zeros(rows)
    exponent = torch.frexp(absmax / _FP8_MAX[low]).exponent
    finite = torch.isfinite(absmax) & (exponent <= _MAX_EXPONENT[low])
    scale = torch.where(finite, torch.ldexp(torch.ones_like(absmax), exponent.clamp(min=-126)),
                        torch.full_like(absmax, float("nan")))
    codes = (x * torch.reciprocal(scale)[:, None]).to(low).view(torch.uint8)
    codes = torch.where(finite[:, None], codes, torch.full_like(codes, 0x7F))
    return torch.cat([scale[:, None].view(torch.uint8), codes], dim=1)


def reference_decoded(wire: torch.Tensor, name: str, like: torch.Tensor) -> torch.Tensor:
    """The rows ``wire`` holds, in ``like``'s dtype and shape."""
    low = FORMATS[name]
    rows = like.shape[0]
    if low.itemsize == 2:
        return wire.flatten().view(low).to(like.dtype).reshape(like.shape)
    scale = wire[:, :4].flatten().clone().view(torch.float32)[:, None]
    codes = wire[:, 4:].flatten().clone().view(low).to(torch.float32).reshape(rows, -1 if rows else 0)
    return (codes * scale).to(like.dtype).reshape(rows, *like.shape[1:])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_same(expected: torch.Tensor, actual: torch.Tensor, what: str) -> None:
    """Bit for bit, NaN equal to NaN (its payload is no part of the format)."""
    assert expected.shape == actual.shape and expected.dtype == actual.dtype, what
    nan = torch.isnan(expected.float())
    assert torch.equal(nan, torch.isnan(actual.float())), what
    assert torch.equal(_bits(expected)[~nan], _bits(actual)[~nan]), what


def assert_same_wire(expected: torch.Tensor, actual: torch.Tensor, name: str, what: str) -> None:
    """Wire rows equal byte for byte; 16-bit codes equal as values (any NaN pattern stands for NaN)."""
    assert expected.shape == actual.shape, what
    if FORMATS[name].itemsize == 2:
        assert_same(expected.flatten().view(FORMATS[name]), actual.flatten().view(FORMATS[name]), what)
    else:
        assert torch.equal(expected, actual), what


@st.composite
def row_cases(draw: st.DrawFn) -> tuple:
    """A shape, a source dtype, a wire format and values: each row has its own magnitude (subnormal to near the
    dtype's largest) with its values spread over 30 binades below it; some rows are zeros or hold inf or NaN."""
    rows = draw(st.integers(0, 6))
    row_elems = draw(st.sampled_from([0, 1, 3, 127, 128, 129, 300]))
    dtype = draw(st.sampled_from(DTYPES))
    name = draw(st.sampled_from(list(FORMATS)))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    top_range = {torch.float16: (-20, 16), torch.bfloat16: (-130, 127), torch.float32: (-140, 127),
                 torch.float64: (-150, 127)}[dtype]
    top = torch.randint(*top_range, (rows, 1), generator=g)
    spread = torch.randint(0, 31, (rows, row_elems), generator=g)
    mantissa = torch.rand(rows, row_elems, generator=g, dtype=torch.float64) + 0.5
    sign = torch.where(torch.rand(rows, row_elems, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    x = sign * torch.ldexp(mantissa, (top - spread).to(torch.float64))
    for r in range(rows):
        kind = draw(st.sampled_from(["plain", "plain", "zeros", "inf", "nan", "fp8 max"]))
        if row_elems == 0 or kind == "plain":
            continue
        at = draw(st.integers(0, row_elems - 1))
        if kind == "zeros":
            x[r] = 0.0
        elif kind == "fp8 max":
            x[r, at] = 448.0
        else:
            x[r, at] = float("inf") if kind == "inf" else float("nan")
    return name, x.to(dtype)


@settings(max_examples=150, deadline=None)
@given(row_cases(), st.sampled_from(DTYPES))
def test_rows_encode_and_decode_like_torchs_casts(case: tuple, out_dtype: torch.dtype) -> None:
    name, values = case
    what = f"{name} {values.dtype} {tuple(values.shape)} -> {out_dtype}"
    wire = codec.encode_rows(values, name)
    assert wire.shape == (values.shape[0], codec.wire_row_bytes(name, values.shape[1])), what
    assert_same_wire(reference_rows(values, name), wire, name, what)
    out = torch.full(values.shape, 5.0, dtype=out_dtype)
    assert codec.decode_rows(wire, name, out) is out
    assert_same(reference_decoded(wire, name, out), out, what)


def test_rows_of_more_dimensions_are_their_first_dimension() -> None:
    values = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 7
    wire = codec.encode_rows(values, "float8_e5m2")
    assert wire.shape == (2, 4 + 12)
    assert torch.equal(wire, reference_rows(values, "float8_e5m2"))
    out = torch.empty(2, 3, 4)
    codec.decode_rows(wire, "float8_e5m2", out)
    assert_same(reference_decoded(wire, "float8_e5m2", out), out, "3-d rows")


def test_bad_arguments_are_refused_and_nothing_is_written() -> None:
    values = torch.ones(2, 3)
    with pytest.raises(ValueError, match=r"^`format` must be one of float8_e4m3fn, float8_e5m2, float16, bfloat16, "
                                         r"but got int8$"):
        codec.encode_rows(values, "int8")
    with pytest.raises(TypeError, match=r"^`src` must have one of dtypes torch.float32, torch.float64, "
                                        r"torch.float16, torch.bfloat16, but got torch.int32$"):
        codec.encode_rows(values.int(), "float16")
    wire = codec.encode_rows(values, "float16")
    out = torch.full((2, 3), 9.0)
    with pytest.raises(ValueError, match=r"^`src` must have 18 bytes \(3 rows of `out` in float16\), but got 12$"):
        codec.decode_rows(wire, "float16", torch.full((3, 3), 9.0))
    with pytest.raises(TypeError, match=r"^`src` must have dtype torch.uint8, but got torch.float16$"):
        codec.decode_rows(wire.view(torch.float16), "float16", out)
    assert torch.equal(out, torch.full((2, 3), 9.0))
