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
  std::uint32_t low = 0, high = infinity_bits;   // step_value(low) <= magnitude < step_value(high)
  while (high - low > 1) {
    const std::uint32_t mid = (low + high) / 2;
    (step_value(mid) <= magnitude ? low : high) = mid;
  }
  const double below = magnitude - step_value(low);
  const double above = step_value(high) - magnitude;
  const std::uint32_t nearest = below < above ? low : above < below ? high : (low % 2 == 0 ? low : high);
  return static_cast<std::uint16_t>(sign | nearest);
}

inline std::uint16_t RoundToHalf(double value) { return RoundTo16(value, HalfValue, 0x7C00, 65536.0); }
inline std::uint16_t RoundToBFloat16(double value) {
  return RoundTo16(value, BFloat16Value, 0x7F80, std::ldexp(1.0, 128));
}

}  // namespace hp::shmem::testutil
