// The portable variant of the host reduction kernels: plain C++, vectorised for the baseline instruction set.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops/host/reduce_variants.h"

namespace hp::shmem::ops {
namespace {

#include "ops/host/reduce_kernels.inc"

struct PortableHalf {
  static void ToFloat(float* __restrict out, const std::uint16_t* __restrict in, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) out[i] = HalfToFloatScalar(in[i]);
  }
  static void FromFloat(std::uint16_t* __restrict out, const float* __restrict in, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) out[i] = FloatToHalfScalar(in[i]);
  }
};

}  // namespace

bool ReducePortable(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int nsrc, std::size_t count) {
  return Reduce<PortableHalf>(dtype, op, dst, srcs, nsrc, count);
}

}  // namespace hp::shmem::ops
