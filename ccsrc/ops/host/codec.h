// The wire formats of low-precision communication on host memory: encoding, decoding, and the reduction of encoded
// runs into full precision (HostReduceEncoded).
//
// float16 and bfloat16 travel as the plain cast. fp8 is block-scaled: a run of `count` values travels as fp8
// bytes plus one float32 scale per kScaleBlock values (the last block may be short): value i is
// fp8[i] * scales[i / kScaleBlock]. A block's scale is the power of two 2**e closest above
// absmax / fp8_max, so that scaling is exact and no value overflows. The kernels reproduce, bit for bit, what
// torch's casts produce for the same definition (hyper_parallel/platform/torch/low_precision.py), so that
// every rank decodes the same bytes to the same values.
//
// The kernels are compiled once portably and, on x86-64, once more for AVX2 + F16C (which converts e5m2 through
// float16, rounding to odd first so that it rounds once: the same bytes and values); the entries without an
// explicit HostIsa use the best variant the CPU supports (isa.h).
#pragma once

#include <cstddef>

#include "ops/host/isa.h"
#include "ops/reduce_op.h"
#include "ops/wire_format.h"

namespace hp::shmem::ops {

// A run of `count` encoded values: ScaleCount(count) scales for the block-scaled formats (unused, and may be null,
// for float16 and bfloat16), then the values.
struct EncodedRun {
  const float* scales;
  const void* values;
};
struct MutableEncodedRun {
  float* scales;
  void* values;
};

// Encodes `count` values of `src_dtype` (float32, float64, float16 or bfloat16) into `dst`. Values are first
// rounded to float32 (float64; the others widen exactly), then, for float16 and bfloat16, rounded to nearest even
// like torch's cast (float16 saturates to infinity past 65504); for the fp8 formats, per block:
//   * scale = 2**e with e the exponent of frexp(absmax / fp8_max) (a float32 division), at least -126 (an
//     all-zero block: e = 0, frexp's exponent of zero);
//   * a block holding inf or NaN, or with e above 119 for e4m3fn (127 for e5m2, never reached), gets a NaN scale
//     and every byte of it is 0x7F (a NaN in both formats);
//   * otherwise byte i is value i times 1/scale (a power of two) in float32, rounded to the fp8 format to nearest even
//     like torch's cast (subnormals kept; out of range, never reached after scaling: e4m3fn NaN above 464, e5m2
//     infinity from 61440).
// The codes are for another rank to read: they are written with non-temporal stores where the CPU has them (past
// the cache, see "Hand-offs" in docs/perf.md), and fenced before the call returns. `src` and `dst`'s scales and
// codes must not overlap. Returns false, writing nothing, for another dtype, an unknown format or a variant the CPU
// lacks.
bool HostEncode(LowFormat format, DataType src_dtype, const void* src, std::size_t count, MutableEncodedRun dst);
bool HostEncode(HostIsa isa, LowFormat format, DataType src_dtype, const void* src, std::size_t count,
                MutableEncodedRun dst);

// Decodes `count` codes of `src` into `out` of `out_dtype` (float32, float64, float16 or bfloat16): out[i] = v[i],
// or out[i] + v[i] when `accumulate`, v[i] being the code's exact value (float16, bfloat16: widened; fp8: the code
// times its block's scale, exact in float32 unless it overflows, which only a value rounded up next to float32's
// largest can). Like torch's mul and addcmul_ of float16 by float32 values into `out`, an fp8 product is taken in
// float32 when overwriting (inf past float32's range, then widened); sums are taken in float64 for a float64 `out`
// (float32 otherwise), and a float16/bfloat16 `out` is rounded once, to nearest even. A NaN scale makes its whole
// block NaN. The e4m3fn NaN byte reads as 480 (times a NaN scale wherever the encoder writes it). `src`'s scales
// and codes and `out` must not overlap. Returns false, writing nothing, for another dtype, an unknown format or a
// variant the CPU lacks.
bool HostDecode(LowFormat format, EncodedRun src, std::size_t count, DataType out_dtype, void* out, bool accumulate);
bool HostDecode(HostIsa isa, LowFormat format, EncodedRun src, std::size_t count, DataType out_dtype, void* out,
                bool accumulate);

// The reduction step of low-precision communication, in one pass over memory: sums `own` (the rank's values in full
// precision, or null) and the decoded `sources` (in `format`), element by element, and writes the result.
//   * Terms are added in order, `own` first, in the accumulator: float64 for a float64 `out_dtype`, float32
//     otherwise (float32, float16, bfloat16). Each decoded term is the exact product of its code and its scale, as
//     HostDecode computes it; without `own`, the first source is taken as HostDecode overwriting
//     would (so that the sum equals decoding the first source, then accumulating the others).
//   * kAvg divides the sum by the number of terms (sources, plus one with `own`), in the accumulator.
//   * Without `reencode` (null values): `out` receives the result, rounded once (to nearest even) to a float16 or
//     bfloat16 `out_dtype`.
//   * With `reencode`: the result is encoded into it as HostEncode encodes values of the accumulator's type (a
//     float64 result is rounded to float32 first), with non-temporal stores like HostEncode's, and `out` receives
//     the decoding of those very codes: the values every rank that decodes them gets.
// `own` has `out_dtype` and may be `out` exactly; nothing else may overlap. Returns false, writing nothing, for
// what it does not compute: no term, an `out_dtype` other than float32, float64, float16 or bfloat16, an op other
// than kSum and kAvg, an unknown format or a variant the CPU lacks.
bool HostReduceEncoded(LowFormat format, DataType out_dtype, ReduceOp op, const void* own, const EncodedRun* sources,
                       int nsources, std::size_t count, void* out, MutableEncodedRun reencode);
bool HostReduceEncoded(HostIsa isa, LowFormat format, DataType out_dtype, ReduceOp op, const void* own,
                       const EncodedRun* sources, int nsources, std::size_t count, void* out,
                       MutableEncodedRun reencode);

// MoE rows (the wire of dispatch and combine, whose chunks are whole rows): `rows` rows of `row_elems` values of
// `src_dtype` (as HostEncode takes), contiguous, into `rows` wire rows of WireRowBytes(format, row_elems) bytes
// each. float16 and bfloat16 rows are HostEncode's plain cast. An fp8 row is its float32 scale (native byte order,
// at the row's first byte, unaligned), then its codes: the row is encoded as one block of HostEncode (its scale is
// BlockScale's rule over the whole row; a row holding inf or NaN is all NaN bytes with a NaN scale), however long.
// An empty row (row_elems 0) is its scale alone, 1. The codes are written like HostEncode's (non-temporal stores,
// fenced). `src` and `dst` must not overlap. Returns false, writing nothing, for another dtype, an unknown format or
// a variant the CPU lacks.
bool HostEncodeRows(LowFormat format, DataType src_dtype, const void* src, std::size_t rows, std::size_t row_elems,
                    void* dst);
bool HostEncodeRows(HostIsa isa, LowFormat format, DataType src_dtype, const void* src, std::size_t rows,
                    std::size_t row_elems, void* dst);
// HostEncodeRows undone: each value of `out` (`rows` x `row_elems` of `out_dtype`, contiguous) is its code's exact
// value, as HostDecode overwriting computes it (fp8: the code times its row's scale, in float32). `src` and `out`
// must not overlap. Returns false, writing nothing, for another dtype, an unknown format or a variant the CPU lacks.
bool HostDecodeRows(LowFormat format, const void* src, std::size_t rows, std::size_t row_elems, DataType out_dtype,
                    void* out);
bool HostDecodeRows(HostIsa isa, LowFormat format, const void* src, std::size_t rows, std::size_t row_elems,
                    DataType out_dtype, void* out);

}  // namespace hp::shmem::ops
