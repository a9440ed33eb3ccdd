#include "ops/host/isa.h"

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

}  // namespace hp::shmem::ops
