// Reading another process's memory with one copy: the kernel's cross-memory attach (process_vm_readv).
//
// The kernel allows it to a process of the same user unless a ptrace restriction (Yama's ptrace_scope, a seccomp
// profile, a container without the capability) refuses it; the host device probes it once at Init.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/status.h"

namespace hp::shmem::host {

// Copies `bytes` from `address` in process `pid` into `dst` (this process), all of it or nothing that the caller
// may use: a refused or unmapped range fails with kDeviceError naming pid, address, bytes and errno.
Status ReadProcessMemory(std::int64_t pid, void* dst, std::uint64_t address, std::size_t bytes);

}  // namespace hp::shmem::host
