// Shared by the googletest units of the low-precision codec (ops/host/codec.h): the fp8 formats from their
// definitions, a scalar reference of the block-scaled encoder and of one decoded element, the same for the plain
// float16/bfloat16 formats, raw buffers of any float dtype (read, store, random test data) and float comparison.
// Independent of the kernels under test.
//
// The reference rounds by searching the format's codes for the nearest value (ties to the even code) and takes
// frexp from the C library: it shares none of the kernels' bit tricks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "host_kernel_support.h"
#include "ops/host/codec.h"
#include "ops/reduce_op.h"

namespace hp::shmem::testutil {

inline constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();

// Every wire format, and every dtype the codec encodes from and decodes into.
inline constexpr ops::LowFormat kEveryLowFormat[] = {ops::LowFormat::kFloat8E4M3Fn, ops::LowFormat::kFloat8E5M2,
                                                     ops::LowFormat::kFloat16, ops::LowFormat::kBFloat16};
inline constexpr DataType kCodecDtypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                                            DataType::kBFloat16};

inline std::uint32_t Bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline std::uint64_t Bits(double value) {
  std::uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

// Bits equal, or both NaN (NaN payloads are not part of the format).
inline bool SameFloat(double expected, double actual) {
  return (std::isnan(expected) && std::isnan(actual)) || Bits(expected) == Bits(actual);
}

// ---------------------------------------------------------------------------------------------------------------
// The fp8 formats, from their definitions.

// e4m3fn: bias 7, no infinity, s.1111.111 is NaN. e5m2: bias 15, IEEE-like (infinities, NaN).
inline double Fp8Value(ops::LowFormat format, std::uint8_t byte) {
  double magnitude;
  if (format == ops::LowFormat::kFloat8E4M3Fn) {
    const int exponent = (byte >> 3) & 0xF;
    const int mantissa = byte & 0x7;
    if (exponent == 0xF && mantissa == 0x7) return kNan;
    magnitude = exponent == 0 ? std::ldexp(mantissa, -9) : std::ldexp(8 + mantissa, exponent - 10);
  } else {
    const int exponent = (byte >> 2) & 0x1F;
    const int mantissa = byte & 0x3;
    if (exponent == 0x1F) return mantissa != 0 ? kNan : ((byte & 0x80) ? -kInf : kInf);
    magnitude = exponent == 0 ? std::ldexp(mantissa, -16) : std::ldexp(4 + mantissa, exponent - 17);
  }
  return (byte & 0x80) ? -magnitude : magnitude;
}

// What the decoders multiply by the scale: the code's value, except the e4m3fn NaN byte, documented to read as 480
// (times a NaN scale wherever the encoder writes it).
inline double Fp8DecodedValue(ops::LowFormat format, std::uint8_t byte) {
  const bool e4m3_nan = format == ops::LowFormat::kFloat8E4M3Fn && (byte & 0x7F) == 0x7F;
  return e4m3_nan ? ((byte & 0x80) ? -480.0 : 480.0) : Fp8Value(format, byte);
}

inline double Fp8Max(ops::LowFormat format) { return format == ops::LowFormat::kFloat8E4M3Fn ? 448.0 : 57344.0; }
inline int Fp8MaxExponent(ops::LowFormat format) { return format == ops::LowFormat::kFloat8E4M3Fn ? 119 : 127; }

// The nearest fp8 code to a finite `value`, ties to the even code; like torch's cast, what rounds past the largest
// finite value becomes NaN (e4m3fn, code 0x7F) or infinity (e5m2, 0x7C). The ladder of positive codes ends with the
// first code past the largest finite value, read as the next step of the ladder (480 and 65536).
inline std::uint8_t RoundToFp8(ops::LowFormat format, double value) {
  const bool e4m3 = format == ops::LowFormat::kFloat8E4M3Fn;
  const std::uint32_t top = e4m3 ? 0x7F : 0x7C;
  auto step = [&](std::uint32_t code) {
    if (code == top) return e4m3 ? 480.0 : 65536.0;
    return Fp8Value(format, static_cast<std::uint8_t>(code));
  };
  const std::uint8_t sign = std::signbit(value) ? 0x80 : 0;
  const double magnitude = std::fabs(value);
  if (magnitude >= step(top)) return static_cast<std::uint8_t>(sign | top);
  return static_cast<std::uint8_t>(sign | NearestCode(magnitude, top, step));
}

// ---------------------------------------------------------------------------------------------------------------
// Raw buffers of float32, float64, float16 or bfloat16.

inline std::size_t DtypeSize(DataType dtype) {
  return dtype == DataType::kFloat64 ? 8 : dtype == DataType::kFloat32 ? 4 : 2;
}

// Element i of a raw buffer of `dtype`, as a double (exact: every dtype here widens exactly).
inline double ValueAt(DataType dtype, const std::vector<unsigned char>& bytes, std::size_t i) {
  const unsigned char* at = bytes.data() + i * DtypeSize(dtype);
  switch (dtype) {
    case DataType::kFloat32: {
      float value;
      std::memcpy(&value, at, sizeof(value));
      return value;
    }
    case DataType::kFloat64: {
      double value;
      std::memcpy(&value, at, sizeof(value));
      return value;
    }
    default: {
      std::uint16_t bits;
      std::memcpy(&bits, at, sizeof(bits));
      return dtype == DataType::kFloat16 ? HalfValue(bits) : BFloat16Value(bits);
    }
  }
}

// Stores `value` as element i, rounded once to nearest even (float32 by the C++ conversion, float16 and bfloat16
// by the reference rounding).
inline void Store(DataType dtype, std::vector<unsigned char>& bytes, std::size_t i, double value) {
  unsigned char* at = bytes.data() + i * DtypeSize(dtype);
  switch (dtype) {
    case DataType::kFloat32: {
      const auto narrow = static_cast<float>(value);
      std::memcpy(at, &narrow, sizeof(narrow));
      return;
    }
    case DataType::kFloat64:
      std::memcpy(at, &value, sizeof(value));
      return;
    default: {
      const std::uint16_t bits = dtype == DataType::kFloat16 ? RoundToHalf(value) : RoundToBFloat16(value);
      std::memcpy(at, &bits, sizeof(bits));
      return;
    }
  }
}

// Random values: each block has its own magnitude (across the dtype's whole range, subnormals included) and its
// values spread over 40 binades below it, so that many land on fp8 subnormals or round to zero. Some blocks hold
// zeros only, inf or NaN, or values on the e4m3fn exponent limit; float64 blocks may overflow float32.
inline std::vector<unsigned char> RandomValues(DataType dtype, std::size_t count, std::mt19937_64& rng) {
  std::vector<unsigned char> bytes(count * DtypeSize(dtype));
  std::uniform_real_distribution<double> mantissa(0.5, 1.0);
  std::uniform_int_distribution<int> spread(0, 40);
  std::uniform_int_distribution<int> kind(0, 15);
  const int low = dtype == DataType::kFloat16 ? -24 : -149;
  const int high = dtype == DataType::kFloat16 ? 16 : dtype == DataType::kFloat64 ? 130 : 128;
  std::uniform_int_distribution<int> top(low, high);
  for (std::size_t start = 0; start < count; start += ops::kScaleBlock) {
    const std::size_t end = std::min(count, start + ops::kScaleBlock);
    const int block_kind = kind(rng);
    const int block_top = top(rng);
    for (std::size_t i = start; i < end; ++i) {
      double value = std::ldexp(mantissa(rng), block_top - spread(rng));
      if (rng() & 1) value = -value;
      if (block_kind == 0) value = (rng() & 1) ? 0.0 : -0.0;
      Store(dtype, bytes, i, value);
    }
    const std::size_t pick = start + rng() % (end - start);
    if (block_kind == 1) Store(dtype, bytes, pick, kInf);
    if (block_kind == 2) Store(dtype, bytes, pick, -kInf);
    if (block_kind == 3) Store(dtype, bytes, pick, kNan);
    if (block_kind == 4 && dtype != DataType::kFloat16) Store(dtype, bytes, pick, 448.0 * std::ldexp(1.0, 119));
    if (block_kind == 5 && dtype != DataType::kFloat16) Store(dtype, bytes, pick, 448.0 * std::ldexp(1.5, 118));
  }
  return bytes;
}

// ---------------------------------------------------------------------------------------------------------------
// The reference codec.

struct Encoded {
  std::vector<float> scales;
  std::vector<std::uint8_t> bytes;
};

// Every value is rounded to float32 first; the scale comes from a float32 division and frexp. One scale per
// `block_values` values (the collectives' kScaleBlock; a MoE row's length for HostEncodeRows).
inline Encoded ReferenceEncode(ops::LowFormat format, DataType dtype, const std::vector<unsigned char>& src,
                               std::size_t count, std::size_t block_values = ops::kScaleBlock) {
  Encoded encoded{std::vector<float>((count + block_values - 1) / block_values), std::vector<std::uint8_t>(count)};
  for (std::size_t block = 0; block * block_values < count; ++block) {
    const std::size_t start = block * block_values;
    const std::size_t end = std::min(count, start + block_values);
    float absmax = 0.0f;
    bool finite = true;
    for (std::size_t i = start; i < end; ++i) {
      const float value = static_cast<float>(ValueAt(dtype, src, i));
      finite = finite && std::isfinite(value);
      absmax = std::max(absmax, std::fabs(value));
    }
    int exponent = 0;
    std::frexp(absmax / static_cast<float>(Fp8Max(format)), &exponent);
    float scale = std::numeric_limits<float>::quiet_NaN();
    if (finite && exponent <= Fp8MaxExponent(format)) scale = std::ldexp(1.0f, std::max(exponent, -126));
    encoded.scales[block] = scale;
    for (std::size_t i = start; i < end; ++i) {
      const double value = static_cast<float>(ValueAt(dtype, src, i));
      encoded.bytes[i] = std::isnan(scale) ? 0x7F : RoundToFp8(format, value / scale);
    }
  }
  return encoded;
}

// A decoded value `value` (exact) as a `dtype` out stores it, over `old` or added to it: the sum in float64 for a
// float64 out, in float32 otherwise, rounded once to a float16 or bfloat16 out. Overwriting takes the value in
// float32: past float32's range it is infinite, even for a float64 out (only an fp8 product can be).
inline double DecodedAs(DataType dtype, double value, double old, bool accumulate) {
  if (dtype == DataType::kFloat64) return accumulate ? old + value : static_cast<float>(value);
  const float sum = accumulate ? static_cast<float>(old) + static_cast<float>(value) : static_cast<float>(value);
  if (dtype == DataType::kFloat32) return sum;
  if (dtype == DataType::kFloat16) return HalfValue(RoundToHalf(sum));
  return BFloat16Value(RoundToBFloat16(sum));
}

// One decoded element as `dtype` would store it (a double holding the stored value), NaN for NaN.
inline double ReferenceDecodeOne(ops::LowFormat format, std::uint8_t byte, float scale, DataType dtype, double old,
                                 bool accumulate) {
  return DecodedAs(dtype, Fp8DecodedValue(format, byte) * scale, old, accumulate);   // the product is exact
}

// ---------------------------------------------------------------------------------------------------------------
// The plain formats (float16, bfloat16): the cast, without scales; the codes are the 16-bit patterns.

// The dtype whose bit patterns a plain format's codes are.
inline DataType PlainCodeDtype(ops::LowFormat format) {
  return format == ops::LowFormat::kFloat16 ? DataType::kFloat16 : DataType::kBFloat16;
}

// The exact value of a code (NaN for the NaN patterns).
inline double PlainValue(ops::LowFormat format, std::uint16_t code) {
  return format == ops::LowFormat::kFloat16 ? HalfValue(code) : BFloat16Value(code);
}

inline bool PlainCodeIsNan(ops::LowFormat format, std::uint16_t code) { return std::isnan(PlainValue(format, code)); }

// The code of a value of any source dtype (a double holding it exactly): rounded to float32 first (exact but for
// float64), then to the format's nearest value, ties to even (float16 overflows to infinity from 65520).
inline std::uint16_t ReferenceEncodePlainOne(ops::LowFormat format, double value) {
  const float narrow = static_cast<float>(value);
  return format == ops::LowFormat::kFloat16 ? RoundToHalf(narrow) : RoundToBFloat16(narrow);
}

// One decoded element as `dtype` would store it: the code's exact value, over `old` or added to it.
inline double ReferenceDecodePlainOne(ops::LowFormat format, std::uint16_t code, DataType dtype, double old,
                                      bool accumulate) {
  return DecodedAs(dtype, PlainValue(format, code), old, accumulate);
}

}  // namespace hp::shmem::testutil
