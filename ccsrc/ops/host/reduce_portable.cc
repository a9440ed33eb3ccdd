// The portable variant of the host reduction kernels: plain C++, vectorised for the baseline instruction set.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops/host/reduce_variants.h"

namespace hp::shmem::ops {
namespace {

#include "ops/host/float_formats.inc"
#include "ops/host/reduce_kernels.inc"

}  // namespace

bool ReducePortable(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int nsrc, std::size_t count) {
  return Reduce<PortableHalf>(dtype, op, dst, srcs, nsrc, count);
}

}  // namespace hp::shmem::ops
