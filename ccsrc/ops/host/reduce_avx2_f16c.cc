// The AVX2 + F16C variant of the host reduction kernels. This file alone is compiled with -mavx2 -mf16c;
// reduce.cc calls it only on a CPU that has both.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops/host/reduce_variants.h"

namespace hp::shmem::ops {
namespace {

#include "ops/host/reduce_kernels.inc"

constexpr int kToNearestEven = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;

struct F16cHalf {
  static void ToFloat(float* __restrict out, const std::uint16_t* __restrict in, std::size_t n) {
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
    }
    for (; i < n; ++i) out[i] = _cvtsh_ss(in[i]);
  }
  static void FromFloat(std::uint16_t* __restrict out, const float* __restrict in, std::size_t n) {
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(in + i), kToNearestEven));
    }
    for (; i < n; ++i) out[i] = _cvtss_sh(in[i], kToNearestEven);
  }
};

}  // namespace

bool ReduceAvx2F16c(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int nsrc, std::size_t count) {
  return Reduce<F16cHalf>(dtype, op, dst, srcs, nsrc, count);
}

}  // namespace hp::shmem::ops
