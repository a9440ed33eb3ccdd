// The instruction sets the host kernels are compiled for, and the run-time choice between them.
//
// Each family of host kernels (reduce.h, codec.h) is compiled once portably and, on x86-64, once more for
// AVX2 + F16C; its entry picks the best variant the CPU supports (checked once). No variant assumes AVX-512.
#pragma once

namespace hp::shmem::ops {

// Instruction sets a host kernel is compiled for.
enum class HostIsa : int { kPortable = 0, kAvx2F16c = 1 };
const char* HostIsaName(HostIsa isa);
// Whether this build has the variant and this CPU can run it.
bool HostIsaAvailable(HostIsa isa);
// The variant the kernels' default entries use: the widest available one.
HostIsa BestHostIsa();

}  // namespace hp::shmem::ops
