// Block-scaled fp8 encoding and decoding of host memory: the wire format of low-precision communication.
//
// A run of `count` values travels as fp8 bytes plus one float32 scale per kScaleBlock values (the last block may
// be short): value i is fp8[i] * scales[i / kScaleBlock]. A block's scale is the power of two 2**e closest above
// absmax / fp8_max, so that scaling is exact and no value overflows. The kernels reproduce, bit for bit, what
// torch's casts produce for the same definition (hyper_parallel/core/symmetric_memory/_low_precision.py), so that
// every rank decodes the same bytes to the same values.
//
// The kernels are compiled once portably and, on x86-64, once more for AVX2 + F16C (which converts e5m2 through
// float16, rounding to odd first so that it rounds once: the same bytes and values); the entries without an
// explicit HostIsa use the best variant the CPU supports (isa.h).
#pragma once

#include <cstddef>

#include "ops/host/isa.h"
#include "ops/reduce_op.h"

namespace hp::shmem::ops {

// The fp8 formats (with torch's names): e4m3fn has no infinity and one NaN per sign (largest finite 448); e5m2
// is float16's upper byte (largest finite 57344, with infinities and NaN).
enum class LowFormat : int { kFloat8E4M3Fn = 0, kFloat8E5M2 = 1 };
const char* LowFormatName(LowFormat format);

// Values per scale.
constexpr std::size_t kScaleBlock = 128;
// The scales a run of `count` values has.
constexpr std::size_t ScaleCount(std::size_t count) { return (count + kScaleBlock - 1) / kScaleBlock; }

// Encodes `count` values of `src_dtype` (float32, float64, float16 or bfloat16) into ScaleCount(count) scales and
// `count` fp8 bytes at `dst`. Values are first rounded to float32 (float64; the others widen exactly), then:
//   * scale = 2**e with e the exponent of frexp(absmax / fp8_max) (a float32 division), at least -126 (an
//     all-zero block: e = 0, frexp's exponent of zero);
//   * a block holding inf or NaN, or with e above 119 for e4m3fn (127 for e5m2, never reached), gets a NaN scale
//     and every byte of it is 0x7F (a NaN in both formats);
//   * otherwise byte i is value i times 1/scale (a power of two) in float32, rounded to the fp8 format to nearest even
//     like torch's cast (subnormals kept; out of range, never reached after scaling: e4m3fn NaN above 464, e5m2
//     infinity from 61440).
// `src`, `scales` and `dst` must not overlap. Returns false, writing nothing, for another dtype, an unknown format
// or a variant the CPU lacks.
bool HostEncodeBlockScaled(LowFormat format, DataType src_dtype, const void* src, std::size_t count, float* scales,
                           void* dst);
bool HostEncodeBlockScaled(HostIsa isa, LowFormat format, DataType src_dtype, const void* src, std::size_t count,
                           float* scales, void* dst);

// Decodes `count` fp8 bytes at `src` with their ScaleCount(count) `scales` into `out` of `out_dtype` (float32,
// float64, float16 or bfloat16): out[i] = fp8[i] * scale, or out[i] + fp8[i] * scale when `accumulate`. The
// product is exact in float32 (an fp8 value times a power of two at least 2**-126) unless it overflows, which only a
// value rounded up next to float32's largest can. Like torch's mul and addcmul_ of float16 by float32 values into
// `out`, the product is taken in float32 when overwriting (inf past float32's range, then widened) and the sum in
// float64 for a float64 `out` (float32 otherwise); a float16/bfloat16 `out` is rounded once, to nearest even.
// A NaN scale makes its whole block NaN. The e4m3fn NaN byte reads as 480 (times a NaN scale wherever the encoder
// writes it). `src`, `scales` and `out` must not overlap. Returns false, writing nothing, for another dtype, an
// unknown format or a variant the CPU lacks.
bool HostDecodeBlockScaled(LowFormat format, const float* scales, const void* src, std::size_t count,
                           DataType out_dtype, void* out, bool accumulate);
bool HostDecodeBlockScaled(HostIsa isa, LowFormat format, const float* scales, const void* src, std::size_t count,
                           DataType out_dtype, void* out, bool accumulate);

}  // namespace hp::shmem::ops
