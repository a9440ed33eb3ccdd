"""Unit tests of the host codec (``shmem.codec``): bit identity with torch's casts, and its argument checks.

The fp8 reference is the codec low precision used before the C++ kernels, in torch ops: a block absmax, ``frexp``
of ``absmax / fp8_max`` for the scale, torch's cast of ``x * (1 / scale)`` to fp8; decoding through float16 bit
patterns times the scale, with torch's ``mul``/``addcmul_``. The float16 and bfloat16 reference is torch's cast of
the float32-rounded values, and decoding is torch's cast of the codes (or their sum with ``out`` in the
accumulator, rounded once). Scales and codes must be bit-identical, and so must the decoded and accumulated values
(NaN compares equal to NaN: its payload is no part of the format).

Single process, no runtime: the codec needs none.
"""

from __future__ import annotations

import pytest
import torch

from hyper_parallel.core.multicore.shmem import codec

BLOCK = 128
LOWS = [torch.float8_e4m3fn, torch.float8_e5m2]
PLAIN = [torch.float16, torch.bfloat16]  # the wire formats without scales: the plain cast
SOURCES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
OUTS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
COUNTS = [1, 7, 127, 128, 129, 5 * BLOCK + 3, 65536 + 5]
_FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
_MAX_EXPONENT = {torch.float8_e4m3fn: 119, torch.float8_e5m2: 127}


# --------------------------------------------------------------------------
# The torch reference.
# --------------------------------------------------------------------------


def _blocks(count: int) -> int:
    return -(-count // BLOCK)


def _padded(values: torch.Tensor, fill: float) -> torch.Tensor:
    padded = values.new_full((_blocks(values.numel()) * BLOCK,), fill)
    padded[:values.numel()] = values
    return padded.view(-1, BLOCK)


def reference_encode(values: torch.Tensor, low: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales, fp8 values) as torch's casts give them."""
    count = values.numel()
    x = values.to(torch.float32)
    absmax = _padded(x.abs(), 0.0).amax(dim=1)
    exponent = torch.frexp(absmax / _FP8_MAX[low]).exponent
    finite = torch.isfinite(absmax) & (exponent <= _MAX_EXPONENT[low])
    exponent = exponent.clamp(min=-126)
    scales = torch.where(finite, torch.ldexp(torch.ones_like(absmax), exponent), torch.full_like(absmax, float("nan")))
    inverse = torch.reciprocal(scales)
    scaled = (_padded(x, 0.0) * inverse[:, None]).reshape(-1)[:count]
    return scales, scaled.to(low)


def reference_decode(scales: torch.Tensor, data: torch.Tensor, out: torch.Tensor, accumulate: bool) -> torch.Tensor:
    """What decoding ``data`` into a copy of ``out`` gave: fp8 read through float16 bit patterns (e5m2 is float16's
    upper byte; e4m3fn a shift and a mask, off by 2**-8, which the scale corrects), times the scale, with torch's
    ``mul``/``addcmul_`` into ``out``'s dtype."""
    out = out.clone()
    count = data.numel()
    full, tail = divmod(count, BLOCK)
    if data.dtype == torch.float8_e5m2:
        bits = data.view(torch.uint8).to(torch.int16).bitwise_left_shift(8)
        scale = scales
    else:
        bits = data.view(torch.int8).to(torch.int16).bitwise_left_shift(7).bitwise_and(-16385)  # 0xBFFF
        scale = scales * 256.0
    half = bits.view(torch.float16)
    if accumulate:
        if full:
            out[:full * BLOCK].view(full, BLOCK).addcmul_(half[:full * BLOCK].view(full, BLOCK), scale[:full, None])
        if tail:
            out[full * BLOCK:].addcmul_(half[full * BLOCK:], scale[full:])
    else:
        if full:
            torch.mul(half[:full * BLOCK].view(full, BLOCK), scale[:full, None],
                      out=out[:full * BLOCK].view(full, BLOCK))
        if tail:
            torch.mul(half[full * BLOCK:], scale[full:], out=out[full * BLOCK:])
    return out


# --------------------------------------------------------------------------
# Test data.
# --------------------------------------------------------------------------

_RANGE = {torch.float32: (-149, 128), torch.float64: (-160, 131), torch.float16: (-24, 16),
          torch.bfloat16: (-133, 128)}


def random_values(count: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Each 128-element block has its own magnitude (across the dtype's range, subnormals included; float64 past
    float32's) and its values spread over 40 binades below it, so that many become fp8 subnormals or zero. Some
    blocks hold only zeros, inf, NaN (of either sign), or values at the e4m3fn exponent limit."""
    g = torch.Generator().manual_seed(seed)
    blocks = _blocks(count)
    low, high = _RANGE[dtype]
    top = torch.randint(low, high, (blocks,), generator=g).repeat_interleave(BLOCK)[:count]
    spread = torch.randint(0, 41, (count,), generator=g)
    mantissa = torch.rand(count, generator=g, dtype=torch.float64) * 0.5 + 0.5
    sign = torch.where(torch.rand(count, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    x = sign * torch.ldexp(mantissa, (top - spread).to(torch.float64))
    kind = torch.randint(0, 16, (blocks,), generator=g)
    specials = {1: float("inf"), 2: float("-inf"), 3: float("nan"), 4: -float("nan")}
    if dtype != torch.float16:
        specials.update({5: 448.0 * 2.0**119, 6: 1.5 * 448.0 * 2.0**118})
    for b in range(blocks):
        lo, hi = b * BLOCK, min(count, (b + 1) * BLOCK)
        k = int(kind[b])
        if k == 0:
            x[lo:hi] = 0.0
        elif k in specials:
            x[lo + int(torch.randint(0, hi - lo, (1,), generator=g))] = specials[k]
    return x.to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(view)


def assert_same(expected: torch.Tensor, actual: torch.Tensor, what: str) -> None:
    """Bit for bit, NaN equal to NaN."""
    assert expected.dtype == actual.dtype and expected.shape == actual.shape, what
    nan = torch.isnan(expected.float())
    assert torch.equal(nan, torch.isnan(actual.float())), what
    keep = ~nan
    differ = (_bits(expected)[keep] != _bits(actual)[keep]).nonzero()
    assert differ.numel() == 0, f"{what}: {differ.numel()} elements differ, first at {int(differ[0])}"


def encode(values: torch.Tensor, low: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    scales = torch.full((codec.scale_count(values.numel()),), 12345.0)
    data = torch.empty(values.numel(), dtype=low)
    codec.encode(values, (scales, data))
    return scales, data


# --------------------------------------------------------------------------
# Bit identity.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("low", LOWS, ids=str)
@pytest.mark.parametrize("dtype", SOURCES, ids=str)
def test_encode_matches_torch_bit_for_bit(low: torch.dtype, dtype: torch.dtype) -> None:
    for i, count in enumerate(COUNTS):
        values = random_values(count, dtype, seed=100 * i + SOURCES.index(dtype))
        expected_scales, expected_data = reference_encode(values, low)
        scales, data = encode(values, low)
        what = f"{low} from {dtype} count={count}"
        # A NaN scale is torch's float("nan") in both, and every byte of its block the format's NaN 0x7F.
        assert torch.equal(_bits(expected_scales), _bits(scales)), what
        assert torch.equal(_bits(expected_data), _bits(data)), what


@pytest.mark.parametrize("low", LOWS, ids=str)
@pytest.mark.parametrize("dtype", OUTS, ids=str)
@pytest.mark.parametrize("accumulate", [False, True], ids=["overwrite", "accumulate"])
def test_decode_matches_torch(low: torch.dtype, dtype: torch.dtype, accumulate: bool) -> None:
    for i, count in enumerate(COUNTS):
        scales, data = reference_encode(random_values(count, torch.float32, seed=7 + i), low)
        out = random_values(count, dtype, seed=1000 + i)
        expected = reference_decode(scales, data, out, accumulate)
        codec.decode((scales, data), out, accumulate=accumulate)
        assert_same(expected, out, f"{low} into {dtype} count={count} accumulate={accumulate}")


@pytest.mark.parametrize("low", LOWS, ids=str)
def test_every_byte_decodes_like_torch_with_extreme_scales(low: torch.dtype) -> None:
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    if low == torch.float8_e4m3fn:  # the NaN byte with a finite scale: never written by the encoder (reads 480)
        codes = codes[(codes & 0x7F) != 0x7F]
    data = codes.view(low)
    for scale in (2.0**119, 2.0**-126, 1.0, float("nan")):
        scales = torch.full((codec.scale_count(data.numel()),), scale)
        for dtype in OUTS:
            out = torch.linspace(-3, 3, data.numel(), dtype=torch.float64).to(dtype)
            for accumulate in (False, True):
                expected = reference_decode(scales, data, out, accumulate)
                actual = out.clone()
                codec.decode((scales, data), actual, accumulate=accumulate)
                assert_same(expected, actual, f"{low} scale={scale} into {dtype} accumulate={accumulate}")


def test_edge_blocks_match_torch() -> None:
    """One block per case: zeros (scale 1), absmax / fp8_max subnormal or underflowing (exponent clamp), the
    e4m3fn exponent limit on both sides, fp8 ties and subnormals, inf/NaN, and a short tail."""
    tiny = 2.0**-149
    blocks = [[0.0, -0.0], [tiny, -tiny], [2.0**-126, 3 * tiny], [2.0**-130], [448.0, 1.0625, -1.1875, 0.0029296875],
              [57344.0, 1.125, 2.5, 3.5], [448.0 * 2.0**119], [448.0 * 2.0**118, -1.0], [3.4028234e38, 1.0],
              [1.0, float("inf")], [-float("inf")], [float("nan"), 1.0], [-float("nan")], [1.0, 2.0, 3.0]]
    blocks += [[448.0 * 2.0**k, 57344.0 * 2.0**k, 1.0] for k in range(-20, 21)]
    for low in LOWS:
        for values in blocks:
            x = torch.tensor(values, dtype=torch.float32)
            expected_scales, expected_data = reference_encode(x, low)
            scales, data = encode(x, low)
            assert torch.equal(_bits(expected_scales), _bits(scales)), (low, values)
            assert torch.equal(_bits(expected_data), _bits(data)), (low, values)


# --------------------------------------------------------------------------
# float16 and bfloat16: torch's cast of the float32-rounded values, and back.
# --------------------------------------------------------------------------

_CODE_GUARD = 0x5A5A  # fills 16-bit code buffers: the encoder writes nothing else


def plain_reference_encode(values: torch.Tensor, low: torch.dtype) -> torch.Tensor:
    """The codes: rounded to float32 first (float64 sources), then torch's cast."""
    return values.to(torch.float32).to(low)


def plain_reference_decode(codes: torch.Tensor, out: torch.Tensor, accumulate: bool) -> torch.Tensor:
    """What decoding ``codes`` into a copy of ``out`` gives: torch's cast of the codes (exact widening, one rounding
    into a 16-bit ``out``), or their sum with ``out`` in the accumulator (float64 for a float64 ``out``, float32
    otherwise) rounded once into ``out``'s dtype."""
    if not accumulate:
        return codes.to(out.dtype)
    acc = torch.float64 if out.dtype == torch.float64 else torch.float32
    return (out.to(acc) + codes.to(acc)).to(out.dtype)


def every_code(low: torch.dtype) -> torch.Tensor:
    """Every 16-bit pattern (zeros, subnormals, normals, infinities, NaN) as codes of ``low``."""
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(low)


def plain_values(count: int, dtype: torch.dtype, low: torch.dtype, seed: int) -> torch.Tensor:
    """``random_values`` with a quarter of the elements replaced by values on the rounding edges of ``low``:
    exact ties between neighbouring codes (subnormals included), the same nudged up or down by 2**-40 of
    themselves (less than half a float32 ulp: a float64 source rounds to the tie first, then to even), and
    float16's overflow threshold 65520 with its neighbours, bfloat16's largest finite value, the tie past it and
    float32's largest."""
    g = torch.Generator().manual_seed(seed)
    x = random_values(count, torch.float64 if dtype == torch.float64 else torch.float32, seed).to(torch.float64)
    largest = 0x7BFF if low == torch.float16 else 0x7F7F
    below = torch.randint(0, largest, (count,), generator=g, dtype=torch.int32)
    low_value = below.to(torch.int16).view(low).to(torch.float64)
    high_value = (below + 1).to(torch.int16).view(low).to(torch.float64)
    tie = (low_value + high_value) / 2
    nudge = torch.tensor([0.0, 2.0**-40, -(2.0**-40)], dtype=torch.float64)[torch.randint(0, 3, (count,), generator=g)]
    edge = torch.tensor([65504.0, 65519.0, 65520.0, 65536.0, 2.0**-25, 1.5 * 2.0**-25, 2.0**-133, 1.5 * 2.0**-133,
                         float.fromhex("0x1.fep127"), float.fromhex("0x1.ffp127"), float.fromhex("0x1.fffffep127")],
                        dtype=torch.float64)
    pick = torch.randint(0, 8, (count,), generator=g)
    sign = torch.where(torch.rand(count, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    x = torch.where(pick == 0, sign * tie * (1 + nudge), x)
    x = torch.where(pick == 1, sign * edge[torch.randint(0, edge.numel(), (count,), generator=g)], x)
    return x.to(dtype)


@pytest.mark.parametrize("low", PLAIN, ids=str)
@pytest.mark.parametrize("dtype", SOURCES, ids=str)
def test_plain_encode_matches_torch_cast(low: torch.dtype, dtype: torch.dtype) -> None:
    for i, count in enumerate(COUNTS):
        values = plain_values(count, dtype, low, seed=300 + 10 * i + SOURCES.index(dtype))
        codes = torch.full((count,), _CODE_GUARD, dtype=torch.int16).view(low)
        codec.encode(values, (None, codes))
        assert_same(plain_reference_encode(values, low), codes, f"{low} from {dtype} count={count}")


@pytest.mark.parametrize("low", PLAIN, ids=str)
@pytest.mark.parametrize("dtype", OUTS, ids=str)
@pytest.mark.parametrize("accumulate", [False, True], ids=["overwrite", "accumulate"])
def test_plain_decode_matches_torch_cast(low: torch.dtype, dtype: torch.dtype, accumulate: bool) -> None:
    for i, count in enumerate(COUNTS):
        codes = plain_reference_encode(random_values(count, torch.float32, seed=500 + i), low)
        out = random_values(count, dtype, seed=600 + i)
        expected = plain_reference_decode(codes, out, accumulate)
        codec.decode((None, codes), out, accumulate=accumulate)
        assert_same(expected, out, f"{low} into {dtype} count={count} accumulate={accumulate}")


@pytest.mark.parametrize("low", PLAIN, ids=str)
def test_every_plain_code_decodes_and_encodes_like_torch(low: torch.dtype) -> None:
    """Every 16-bit pattern: decoded into every out dtype (overwriting, and accumulating onto values across the
    out's range), and as a float16 or bfloat16 source encoded into ``low`` (its own format: the identity)."""
    codes = every_code(low)
    for dtype in OUTS:
        for accumulate in (False, True):
            out = random_values(codes.numel(), dtype, seed=700 + OUTS.index(dtype))
            expected = plain_reference_decode(codes, out, accumulate)
            codec.decode((None, codes), out, accumulate=accumulate)
            assert_same(expected, out, f"every {low} code into {dtype} accumulate={accumulate}")
    for source in PLAIN:
        values = every_code(source)
        actual = torch.empty(values.numel(), dtype=low)
        codec.encode(values, (None, actual))
        assert_same(plain_reference_encode(values, low), actual, f"every {source} pattern into {low}")


def test_plain_edges_encode_to_their_codes() -> None:
    """Ties to even, float16's overflow threshold, subnormals rounding to zero or up, and a float64 value just
    off a tie that rounds to the tie in float32 first (torch's double-to-half cast would round it up)."""
    f16, bf16, f32, f64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
    cases = [
        (f16, f32, 1 + 2.0**-11, 0x3C00),  # a tie: to even, down
        (f16, f32, 1 + 3 * 2.0**-11, 0x3C02),  # a tie: to even, up
        (f16, f64, 1 + 2.0**-11 + 2.0**-40, 0x3C00),  # the tie in float32, then down
        (f16, f64, 1 + 2.0**-11 + 2.0**-23, 0x3C01),  # still above the tie in float32
        (f16, f32, 65519.0, 0x7BFF),
        (f16, f32, 65520.0, 0x7C00),  # half an ulp past 65504: infinity
        (f16, f32, 2.0**-25, 0x0000),  # half the smallest subnormal: to even, zero
        (f16, f32, 3 * 2.0**-26, 0x0001),
        (f16, f64, -1e300, 0xFC00),
        (f16, bf16, 2.0**16, 0x7C00),
        (bf16, f32, 1 + 2.0**-8, 0x3F80),
        (bf16, f32, 1 + 3 * 2.0**-8, 0x3F82),
        (bf16, f64, 1 + 2.0**-8 + 2.0**-40, 0x3F80),
        (bf16, f32, float.fromhex("0x1.fep127"), 0x7F7F),  # the largest finite bfloat16
        (bf16, f32, float.fromhex("0x1.ffp127"), 0x7F80),  # the tie past it: to even, infinity
        (bf16, f32, 2.0**-149, 0x0000),
        (bf16, f32, 1.5 * 2.0**-133, 0x0002),  # a tie between bfloat16's two smallest subnormals: to even
        (bf16, f16, 65504.0, 0x4780),  # to 65536
    ]
    for low, dtype, value, bits in cases:
        codes = torch.zeros(1, dtype=low)
        source = torch.tensor([value], dtype=dtype)
        assert float(source) == value, (dtype, value)  # exact in the source dtype
        codec.encode(source, (None, codes))
        got = int(codes.view(torch.int16)) & 0xFFFF
        assert got == bits, f"{low} from {dtype} {value!r}: expected {bits:#06x}, got {got:#06x}"


@pytest.mark.parametrize("low", PLAIN, ids=str)
def test_plain_codes_at_every_offset_are_written_whole_and_alone(low: torch.dtype) -> None:
    """The codes are written with non-temporal stores, which need aligned addresses: at every element offset
    within 64 bytes, every code is written and nothing around it."""
    for count in (1, 7, 17, 129, 1000):
        values = plain_values(count, torch.float32, low, seed=count)
        expected = plain_reference_encode(values, low)
        for offset in range(34):
            buffer = torch.full((offset + count + 24,), _CODE_GUARD, dtype=torch.int16)
            codec.encode(values, (None, buffer[offset:offset + count].view(low)))
            what = f"{low} count={count} offset={offset}"
            assert_same(expected, buffer[offset:offset + count].view(low), what)
            assert bool((buffer[:offset] == _CODE_GUARD).all()), what
            assert bool((buffer[offset + count:] == _CODE_GUARD).all()), what


@pytest.mark.parametrize("low", LOWS, ids=str)
def test_fp8_codes_at_every_offset_are_written_whole_and_alone(low: torch.dtype) -> None:
    for count in (1, 17, 129, 1000):
        values = random_values(count, torch.float32, seed=count)
        expected_scales, expected_data = reference_encode(values, low)
        for offset in range(66):
            buffer = torch.full((offset + count + 24,), 0xA5, dtype=torch.uint8)
            scales = torch.full((codec.scale_count(count),), 12345.0)
            codec.encode(values, (scales, buffer[offset:offset + count].view(low)))
            what = f"{low} count={count} offset={offset}"
            assert torch.equal(_bits(expected_scales), _bits(scales)), what
            assert torch.equal(_bits(expected_data), buffer[offset:offset + count]), what
            assert bool((buffer[:offset] == 0xA5).all()), what
            assert bool((buffer[offset + count:] == 0xA5).all()), what


# --------------------------------------------------------------------------
# reduce_encoded: one pass of decoding, summing and re-encoding, against the references composed step by step.
# --------------------------------------------------------------------------

WIRES = LOWS + PLAIN


def encoded_run(values: torch.Tensor, low: torch.dtype) -> codec.EncodedRun:
    """``values`` encoded by the reference: fp8 with its scales, 16-bit as torch's cast (no scales)."""
    if low in LOWS:
        return reference_encode(values, low)
    return None, values.to(torch.float32).to(low)


def reference_reduce(out_dtype: torch.dtype, own, runs, op: str, reencode_low):
    """(out, reencoded run or None) as the reference steps give them: the decoded terms added in order in the
    accumulator (float64 for float64, float32 otherwise), divided for 'avg', then stored, or encoded and decoded."""
    acc_dtype = torch.float64 if out_dtype == torch.float64 else torch.float32
    count = runs[0][1].numel() if runs else own.numel()
    if own is not None:
        acc = own.to(acc_dtype)
    else:
        scales, codes = runs[0]
        zeros = torch.zeros(count, dtype=acc_dtype)
        acc = reference_decode(scales, codes, zeros, False) if scales is not None else codes.to(acc_dtype)
        runs = runs[1:]
    for scales, codes in runs:
        acc = reference_decode(scales, codes, acc, True) if scales is not None else acc + codes.to(acc_dtype)
    if op == "avg":
        acc = acc / (len(runs) + 1)
    if reencode_low is None:
        return acc.to(out_dtype), None
    scales, codes = encoded_run(acc, reencode_low)
    empty = torch.zeros(count, dtype=out_dtype)
    decoded = reference_decode(scales, codes, empty, False) if scales is not None else codes.to(out_dtype)
    return decoded, (scales, codes)


def _empty_run(low: torch.dtype, count: int) -> codec.EncodedRun:
    scales = torch.full((codec.scale_count(count),), 12345.0) if low in LOWS else None
    return scales, torch.zeros(count, dtype=low)


# The pairs low precision uses: a wire format narrower than the tensor.
_PAIRS = [(low, dtype) for low in WIRES for dtype in OUTS if low.itemsize < dtype.itemsize]


@pytest.mark.parametrize("low,dtype", _PAIRS, ids=str)
@pytest.mark.parametrize("own", ["none", "apart", "in_place"])
def test_reduce_encoded_matches_the_reference_steps(low: torch.dtype, dtype: torch.dtype, own: str) -> None:
    """Every wire format into every wider dtype, 'sum' and 'avg', 1 to 3 sources, with and without re-encoding:
    the result, and the re-encoded scales and codes, bit for bit (NaN equal to NaN)."""
    seed = 10
    for count in (1, 129, 5 * BLOCK + 3, 4096 + 7):
        for nsources in (1, 2, 3):
            for op in ("sum", "avg"):
                for reencode in (False, True):
                    seed += 1
                    runs = [encoded_run(random_values(count, dtype, seed + 100 * k), low) for k in range(nsources)]
                    mine = random_values(count, dtype, seed + 7) if own != "none" else None
                    expected, expected_run = reference_reduce(dtype, mine, runs, op, low if reencode else None)
                    out = mine if own == "in_place" else torch.full((count,), 3.0, dtype=dtype)
                    own_arg = None if mine is None else mine if own == "in_place" else mine.clone()
                    target = _empty_run(low, count) if reencode else None
                    codec.reduce_encoded(out, own_arg, runs, op=op, reencode=target)
                    what = f"{low} into {dtype} own={own} count={count} sources={nsources} {op} reencode={reencode}"
                    assert_same(expected, out, what)
                    if reencode:
                        if low in LOWS:
                            assert_same(expected_run[0], target[0], what + " scales")
                        assert_same(expected_run[1], target[1], what + " codes")


def test_reduce_encoded_of_zero_elements_writes_nothing() -> None:
    codec.reduce_encoded(torch.empty(0), None, [(torch.empty(0), torch.empty(0, dtype=torch.float8_e4m3fn))],
                         op="sum", reencode=(torch.empty(0), torch.empty(0, dtype=torch.float8_e4m3fn)))


# --------------------------------------------------------------------------
# Argument checks (in the binding), in the contract form.
# --------------------------------------------------------------------------


def test_zero_elements_write_nothing() -> None:
    codec.encode(torch.empty(0), (torch.empty(0), torch.empty(0, dtype=torch.float8_e5m2)))
    codec.decode((torch.empty(0), torch.empty(0, dtype=torch.float8_e5m2)), torch.empty(0), accumulate=True)
    for low in PLAIN:
        codec.encode(torch.empty(0), (None, torch.empty(0, dtype=low)))
        codec.decode((None, torch.empty(0, dtype=low)), torch.empty(0), accumulate=True)


def test_encode_checks_its_arguments() -> None:
    src, scales, dst = torch.zeros(130), torch.zeros(2), torch.zeros(130, dtype=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match=r"^`src` must be a torch.Tensor, but got list$"):
        codec.encode([1.0], (scales, dst))
    with pytest.raises(TypeError, match=r"^`src` must have one of dtypes torch.float32, torch.float64, torch.float16, "
                                        r"torch.bfloat16, but got torch.int32$"):
        codec.encode(src.int(), (scales, dst))
    with pytest.raises(TypeError, match=r"^`dst\[1\]` must have dtype torch.float8_e4m3fn, torch.float8_e5m2, "
                                        r"torch.float16 or torch.bfloat16, but got torch.uint8$"):
        codec.encode(src, (scales, dst.view(torch.uint8)))
    with pytest.raises(TypeError, match=r"^`dst\[0\]` must have dtype torch.float32, but got torch.float64$"):
        codec.encode(src, (scales.double(), dst))
    with pytest.raises(ValueError, match=r"^`dst\[0\]` must have 2 elements \(one per 128 values\), but got 3$"):
        codec.encode(src, (torch.zeros(3), dst))
    with pytest.raises(ValueError, match=r"^`dst\[1\]` must have as many elements as `src` \(129\), but got 130$"):
        codec.encode(src[:129], (scales, dst))
    with pytest.raises(ValueError, match=r"^`src` must be contiguous, but got a tensor of shape \[130\] and strides "
                                         r"\[2\]$"):
        codec.encode(torch.zeros(260)[::2], (scales, dst))
    with pytest.raises(ValueError, match=r"^`dst\[1\]` must be a CPU tensor, but got a tensor on meta$"):
        codec.encode(src, (scales, torch.empty(130, dtype=torch.float8_e4m3fn, device="meta")))
    whole = torch.zeros(1024, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"^`dst\[0\]` must not overlap `dst\[1\]`, but got overlapping memory$"):
        codec.encode(src, (whole[:8].view(torch.float32), whole[4:134].view(torch.float8_e4m3fn)))
    assert torch.equal(scales, torch.zeros(2))
    assert torch.equal(dst.view(torch.uint8), torch.zeros(130, dtype=torch.uint8))


def test_encode_checks_its_run() -> None:
    """The run ``dst``: a (scales, codes) tuple whose codes name the format; scales only for fp8; as many codes as
    ``src`` has values; nothing overlapping ``src``. Nothing is written when a check fails."""
    src = torch.ones(130)
    scales = torch.full((2,), 7.0)
    fp8 = torch.full((130,), 3.0).to(torch.float8_e4m3fn)
    half = torch.full((130,), 3.0, dtype=torch.float16)
    bf16 = torch.full((130,), 3.0, dtype=torch.bfloat16)
    originals = [t.clone() for t in (src, scales, fp8, half, bf16)]
    with pytest.raises(TypeError, match=r"^`dst` must be a \(scales, codes\) tuple, but got list$"):
        codec.encode(src, [scales, fp8])
    with pytest.raises(TypeError, match=r"^`dst` must be a \(scales, codes\) tuple, but got a tuple of 3 items$"):
        codec.encode(src, (scales, fp8, fp8))
    with pytest.raises(TypeError, match=r"^`dst\[1\]` must have dtype torch.float8_e4m3fn, torch.float8_e5m2, "
                                        r"torch.float16 or torch.bfloat16, but got torch.float32$"):
        codec.encode(src, (scales, src.clone()))
    with pytest.raises(TypeError, match=r"^`dst\[0\]` must be None for float16 codes \(they have no scales\), but "
                                        r"got Tensor$"):
        codec.encode(src, (scales, half))
    with pytest.raises(TypeError, match=r"^`dst\[0\]` must be None for bfloat16 codes \(they have no scales\), "
                                        r"but got Tensor$"):
        codec.encode(src, (scales, bf16))
    with pytest.raises(TypeError, match=r"^`dst\[0\]` must be a torch.Tensor, but got NoneType$"):
        codec.encode(src, (None, fp8))
    with pytest.raises(ValueError, match=r"^`dst\[1\]` must have as many elements as `src` \(130\), but got "
                                         r"129$"):
        codec.encode(src, (None, half[:129]))
    with pytest.raises(ValueError, match=r"^`dst\[1\]` must have as many elements as `src` \(130\), but got "
                                         r"129$"):
        codec.encode(src, (scales, fp8[:129]))
    with pytest.raises(ValueError, match=r"^`dst\[1\]` must be contiguous, but got a tensor of shape \[130\] and "
                                         r"strides \[2\]$"):
        codec.encode(src, (None, torch.zeros(260, dtype=torch.float16)[::2]))
    whole = torch.ones(1024)
    with pytest.raises(ValueError, match=r"^`dst\[1\]` must not overlap `src`, but got overlapping memory$"):
        codec.encode(whole[:130], (None, whole[1:66].view(torch.float16)))
    with pytest.raises(ValueError, match=r"^`dst\[1\]` must not overlap `src`, but got overlapping memory$"):
        codec.encode(whole[:130], (scales, whole[100:].view(torch.uint8)[:130].view(torch.float8_e4m3fn)))
    with pytest.raises(ValueError, match=r"^`dst\[0\]` must not overlap `src`, but got overlapping memory$"):
        codec.encode(whole[:130], (whole[129:131], fp8))
    assert torch.equal(whole, torch.ones(1024))
    for original, now in zip(originals, (src, scales, fp8, half, bf16)):
        assert torch.equal(_bits(original), _bits(now))


def test_decode_checks_its_arguments() -> None:
    scales, src, out = torch.ones(2), torch.zeros(130, dtype=torch.float8_e5m2), torch.full((130,), 5.0)
    with pytest.raises(TypeError, match=r"^`accumulate` must be a bool, but got int$"):
        codec.decode((scales, src), out, accumulate=1)
    with pytest.raises(TypeError, match=r"^`src\[1\]` must have dtype torch.float8_e4m3fn, torch.float8_e5m2, "
                                        r"torch.float16 or torch.bfloat16, but got torch.float32$"):
        codec.decode((scales, out), out.clone(), accumulate=False)
    with pytest.raises(TypeError, match=r"^`out` must have one of dtypes torch.float32, torch.float64, torch.float16, "
                                        r"torch.bfloat16, but got torch.int64$"):
        codec.decode((scales, src), out.long(), accumulate=False)
    with pytest.raises(ValueError, match=r"^`src\[1\]` must have as many elements as `out` \(128\), but got 130$"):
        codec.decode((scales, src), out[:128], accumulate=False)
    with pytest.raises(ValueError, match=r"^`out` must not overlap `src\[0\]`, but got overlapping memory$"):
        codec.decode((out[:2], src), out, accumulate=False)
    assert torch.equal(out, torch.full((130,), 5.0))


def test_decode_checks_its_run() -> None:
    """The run ``src``, as ``encode``'s ``dst``; ``accumulate`` a keyword bool. Nothing is written when a check
    fails."""
    out = torch.full((130,), 5.0)
    half = torch.ones(130, dtype=torch.float16)
    fp8 = (torch.ones(2), torch.ones(130).to(torch.float8_e4m3fn))
    with pytest.raises(TypeError, match=r"^`accumulate` must be a bool, but got NoneType$"):
        codec.decode((None, half), out, accumulate=None)
    with pytest.raises(TypeError):
        codec.decode((None, half), out, False)  # keyword-only
    with pytest.raises(TypeError, match=r"^`src` must be a \(scales, codes\) tuple, but got list$"):
        codec.decode([None, half], out, accumulate=False)
    with pytest.raises(TypeError, match=r"^`src\[0\]` must be None for float16 codes \(they have no scales\), but "
                                        r"got Tensor$"):
        codec.decode((torch.ones(2), half), out, accumulate=False)
    with pytest.raises(TypeError, match=r"^`src\[0\]` must be None for bfloat16 codes \(they have no scales\), "
                                        r"but got Tensor$"):
        codec.decode((torch.ones(2), half.to(torch.bfloat16)), out, accumulate=True)
    with pytest.raises(TypeError, match=r"^`src\[0\]` must be a torch.Tensor, but got NoneType$"):
        codec.decode((None, fp8[1]), out, accumulate=False)
    with pytest.raises(ValueError, match=r"^`src\[1\]` must have as many elements as `out` \(130\), but got 129$"):
        codec.decode((None, half[:129]), out, accumulate=False)
    with pytest.raises(ValueError, match=r"^`src\[0\]` must have 2 elements \(one per 128 values\), but got 3$"):
        codec.decode((torch.ones(3), fp8[1]), out, accumulate=False)
    with pytest.raises(ValueError, match=r"^`out` must be contiguous, but got a tensor of shape \[65\] and strides "
                                         r"\[2\]$"):
        codec.decode((None, half[:65]), out[::2], accumulate=False)
    with pytest.raises(ValueError, match=r"^`out` must not overlap `src\[1\]`, but got overlapping memory$"):
        codec.decode((None, out.view(torch.float16)[:130]), out, accumulate=True)
    with pytest.raises(ValueError, match=r"^`out` must not overlap `src\[1\]`, but got overlapping memory$"):
        codec.decode((fp8[0], out.view(torch.float8_e4m3fn)[8:138]), out, accumulate=False)
    assert torch.equal(out, torch.full((130,), 5.0))


def test_reduce_encoded_checks_its_arguments() -> None:
    out = torch.full((130,), 5.0)
    half = torch.zeros(130, dtype=torch.float16)
    fp8 = (torch.ones(2), torch.zeros(130, dtype=torch.float8_e4m3fn))
    target = (torch.full((2,), 7.0), torch.zeros(130, dtype=torch.float8_e4m3fn))
    with pytest.raises(ValueError, match=r"^`op` must be one of 'sum', 'avg', but got 'max'$"):
        codec.reduce_encoded(out, None, [fp8], op="max")
    with pytest.raises(ValueError, match=r"^`sources` must hold a run when `own` is None, but got an empty "
                                         r"sequence$"):
        codec.reduce_encoded(out, None, [], op="sum")
    with pytest.raises(ValueError, match=r"^`sources` or `reencode` must hold a run \(their codes name the format\), "
                                         r"but got neither$"):
        codec.reduce_encoded(out, out.clone(), [], op="sum")
    with pytest.raises(TypeError, match=r"^`sources` must be a list or tuple of \(scales, codes\) tuples, but got "
                                        r"dict$"):
        codec.reduce_encoded(out, None, {}, op="sum")
    with pytest.raises(TypeError, match=r"^`sources\[0\]` must be a \(scales, codes\) tuple, but got list$"):
        codec.reduce_encoded(out, None, [list(fp8)], op="sum")
    with pytest.raises(TypeError, match=r"^`sources\[1\]\[1\]` must have the dtype of the first run's codes "
                                        r"\(torch.float8_e4m3fn\), but got torch.float16$"):
        codec.reduce_encoded(out, None, [fp8, (None, half)], op="sum")
    with pytest.raises(TypeError, match=r"^`sources\[0\]\[1\]` must have dtype torch.float8_e4m3fn, "
                                        r"torch.float8_e5m2, torch.float16 or torch.bfloat16, but got torch.int8$"):
        codec.reduce_encoded(out, None, [(None, half.to(torch.int8))], op="sum")
    with pytest.raises(TypeError, match=r"^`sources\[0\]\[0\]` must be None for float16 codes \(they have no "
                                        r"scales\), but got Tensor$"):
        codec.reduce_encoded(out, None, [(torch.ones(2), half)], op="sum")
    with pytest.raises(ValueError, match=r"^`sources\[0\]\[1\]` must have as many elements as `out` \(130\), "
                                         r"but got 129$"):
        codec.reduce_encoded(out, None, [(None, half[:129])], op="sum")
    with pytest.raises(ValueError, match=r"^`sources\[0\]\[0\]` must have 2 elements \(one per 128 values\), but "
                                         r"got 3$"):
        codec.reduce_encoded(out, None, [(torch.ones(3), fp8[1])], op="sum")
    with pytest.raises(TypeError, match=r"^`out` must have one of dtypes torch.float32, torch.float64, "
                                        r"torch.float16, torch.bfloat16, but got torch.int64$"):
        codec.reduce_encoded(out.long(), None, [fp8], op="sum")
    with pytest.raises(ValueError, match=r"^`own` must have the dtype and element count of `out` \(torch.float32, "
                                         r"130\), but got torch.float64, 130$"):
        codec.reduce_encoded(out, out.double(), [fp8], op="sum")
    whole = torch.zeros(1024)
    with pytest.raises(ValueError, match=r"^`own` must not overlap `out`, but got overlapping memory$"):
        codec.reduce_encoded(whole[:130], whole[1:131], [fp8], op="sum")
    with pytest.raises(ValueError, match=r"^`sources\[0\]\[1\]` must not overlap `out`, but got overlapping "
                                         r"memory$"):
        codec.reduce_encoded(out, None, [(None, out.view(torch.float16)[:130])], op="sum")
    with pytest.raises(ValueError, match=r"^`reencode\[1\]` must not overlap `sources\[0\]\[1\]`, but got "
                                         r"overlapping memory$"):
        codec.reduce_encoded(out, None, [fp8], op="sum", reencode=(target[0], fp8[1]))
    with pytest.raises(ValueError, match=r"^`reencode\[0\]` must not overlap `own`, but got overlapping memory$"):
        own = torch.zeros(130)
        codec.reduce_encoded(out, own, [fp8], op="sum", reencode=(own[:2], target[1]))
    assert torch.equal(out, torch.full((130,), 5.0))
    assert torch.equal(target[0], torch.full((2,), 7.0))
