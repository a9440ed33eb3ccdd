#include "runtime/host/process_memory.h"

#include <sys/types.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "runtime/logging.h"

namespace hp::shmem::host {

Status ReadProcessMemory(std::int64_t pid, void* dst, std::uint64_t address, std::size_t bytes) {
  auto* to = static_cast<char*>(dst);
  std::size_t done = 0;
  // The kernel may copy less than asked (it stops at the first page it cannot map): go on from there, so that a short
  // read either completes or fails on the page that is missing.
  while (done < bytes) {
    iovec local{to + done, bytes - done};
    iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(address + done)), bytes - done};
    const ssize_t copied = process_vm_readv(static_cast<pid_t>(pid), &local, 1, &remote, 1, 0);
    if (copied > 0) {
      done += static_cast<std::size_t>(copied);
      continue;
    }
    if (copied < 0 && errno == EINTR) continue;
    const int error = copied < 0 ? errno : 0;
    return DeviceError("cross-memory read failed: pid=" + std::to_string(pid) + " address=" + Hex(address) +
                       " bytes=" + std::to_string(bytes) + " copied=" + std::to_string(done) +
                       " errno=" + std::to_string(error) + " (" + (error != 0 ? std::strerror(error) : "no progress") +
                       ")");
  }
  return Status::Ok();
}

}  // namespace hp::shmem::host
