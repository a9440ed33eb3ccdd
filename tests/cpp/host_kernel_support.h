// Shared by the googletest units of the host kernels (ops/host): the instruction-set variants to run, and
// reference float16 and bfloat16 conversions written from the formats' definitions (bit patterns to exact values,
// round to nearest even by search), independent of the kernels under test.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/host/isa.h"

namespace hp::shmem::testutil {

// Every variant this build has and this CPU runs.
inline std::vector<ops::HostIsa> AvailableIsas() {
  std::vector<ops::HostIsa> isas;
  for (ops::HostIsa isa : {ops::HostIsa::kPortable, ops::HostIsa::kAvx2F16c}) {
    if (ops::HostIsaAvailable(isa)) isas.push_back(isa);
  }
  return isas;
}

inline double HalfValue(std::uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  double magnitude;
  if (exponent == 0x1F) {
    magnitude = mantissa != 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -24);
  } else {
    magnitude = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return (bits & 0x8000) ? -magnitude : magnitude;
}

inline double BFloat16Value(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

// The code in [0, top] nearest to `magnitude` (non-negative, below step(top)), ties to the even code. step(code)
// is the value of each positive code, growing with it; step(top) is the first step past the largest finite value.
template <class Step>
std::uint32_t NearestCode(double magnitude, std::uint32_t top, Step step) {
  std::uint32_t low = 0, high = top;   // step(low) <= magnitude < step(high)
  while (high - low > 1) {
    const std::uint32_t mid = (low + high) / 2;
    (step(mid) <= magnitude ? low : high) = mid;
  }
  const double below = magnitude - step(low);
  const double above = step(high) - magnitude;
  return below < above ? low : above < below ? high : (low % 2 == 0 ? low : high);
}

// The nearest value of a 16-bit format to `value`, ties to the even bit pattern. Positive finite patterns
// 0..infinity_bits-1 grow with their value; `overflow` is where the next (unrepresentable) step would be, so that
// values from halfway to it round to infinity like IEEE does.
inline std::uint16_t RoundTo16(double value, double (*to_value)(std::uint16_t), std::uint16_t infinity_bits,
                               double overflow) {
  if (std::isnan(value)) return static_cast<std::uint16_t>(infinity_bits | 0x1);   // some NaN
  const std::uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  const double magnitude = std::fabs(value);
  auto step_value = [&](std::uint32_t bits) {
    return bits == infinity_bits ? overflow : to_value(static_cast<std::uint16_t>(bits));
  };
  if (magnitude >= overflow) return sign | infinity_bits;
  return static_cast<std::uint16_t>(sign | NearestCode(magnitude, infinity_bits, step_value));
}

inline std::uint16_t RoundToHalf(double value) { return RoundTo16(value, HalfValue, 0x7C00, 65536.0); }
inline std::uint16_t RoundToBFloat16(double value) {
  return RoundTo16(value, BFloat16Value, 0x7F80, std::ldexp(1.0, 128));
}

}  // namespace hp::shmem::testutil
