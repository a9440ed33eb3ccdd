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

#include "ops/host/float_formats.inc"
#include "ops/host/half_f16c.inc"
#include "ops/host/reduce_kernels.inc"

}  // namespace

bool ReduceAvx2F16c(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int nsrc, std::size_t count) {
  return Reduce<F16cHalf>(dtype, op, dst, srcs, nsrc, count);
}

}  // namespace hp::shmem::ops
