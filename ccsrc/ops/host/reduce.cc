#include "ops/host/reduce.h"

#include "ops/host/reduce_variants.h"

namespace hp::shmem::ops {

const char* HostIsaName(HostIsa isa) {
  switch (isa) {
    case HostIsa::kPortable: return "portable";
    case HostIsa::kAvx2F16c: return "avx2+f16c";
  }
  return "?";
}

bool HostIsaAvailable(HostIsa isa) {
  switch (isa) {
    case HostIsa::kPortable: return true;
    case HostIsa::kAvx2F16c: {
#if defined(HP_OPS_HAVE_AVX2_F16C)
      static const bool supported = [] {
        __builtin_cpu_init();   // may run before the constructors that would initialise it
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
      }();
      return supported;
#else
      return false;
#endif
    }
  }
  return false;
}

HostIsa BestHostIsa() {
  static const HostIsa best = HostIsaAvailable(HostIsa::kAvx2F16c) ? HostIsa::kAvx2F16c : HostIsa::kPortable;
  return best;
}

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
