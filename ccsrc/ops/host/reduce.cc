#include "ops/host/reduce.h"

#include "ops/host/reduce_variants.h"

namespace hp::shmem::ops {

bool HostReduce(HostIsa isa, DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int nsrc,
                std::size_t count) {
  if (!HostIsaAvailable(isa)) return false;
#if defined(HP_OPS_HAVE_AVX2_F16C)
  if (isa == HostIsa::kAvx2F16c) return ReduceAvx2F16c(dtype, op, dst, srcs, nsrc, count);
#endif
  return ReducePortable(dtype, op, dst, srcs, nsrc, count);
}

bool HostReduce(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int nsrc, std::size_t count) {
  return HostReduce(BestHostIsa(), dtype, op, dst, srcs, nsrc, count);
}

}  // namespace hp::shmem::ops
