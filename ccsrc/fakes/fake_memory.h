// Fake NPU memory (internal to ccsrc/fakes): what the symmetric heaps and aclrtMalloc hand out.
//
// The host must not be able to touch NPU memory, so the address a caller gets (the "device" range) is a PROT_NONE
// reservation: any host load or store there faults, and a test that forgets a copy fails loudly. The bytes live in
// a separate read-write mapping that only the fakes' data plane (stream tasks, aclrtMemcpy) reaches, through
// HostView.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace hp::fakes::internal {

class DeviceMemory {
 public:
  // `bytes` of zeroed memory of NPU `device`, its device range aligned to `alignment` (a power of two); null when
  // the host is out of address space.
  static std::shared_ptr<DeviceMemory> Create(std::size_t bytes, std::size_t alignment, int device);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  char* device_base() const { return device_base_; }
  std::size_t size() const { return size_; }
  int device() const { return device_; }
  // A symmetric heap knows whose it is (session id, PE), so that a kernel touching it can be checked against the
  // PEs its NPU maps; session 0 means not a heap (aclrtMalloc).
  void MarkHeapOf(std::uint64_t session, int pe) {
    heap_session_ = session;
    heap_pe_ = pe;
  }
  std::uint64_t heap_session() const { return heap_session_; }
  int heap_pe() const { return heap_pe_; }

 private:
  DeviceMemory() = default;
  friend struct HostView;

  char* device_base_ = nullptr;   // PROT_NONE
  char* host_ = nullptr;          // the bytes, read-write
  std::size_t size_ = 0;
  std::size_t reservation_ = 0;
  void* reservation_base_ = nullptr;
  int device_ = -1;
  std::uint64_t heap_session_ = 0;
  int heap_pe_ = -1;
};

// Where the fakes' data plane reads and writes the device range [address, address + bytes): null `host` when the
// range is not inside one live DeviceMemory (host memory, freed memory, or a range running off the end). `memory`
// keeps the allocation alive while the view is used.
struct HostView {
  std::shared_ptr<DeviceMemory> memory;
  char* host = nullptr;

  static HostView Of(const void* address, std::size_t bytes);
  explicit operator bool() const { return host != nullptr; }
};

}  // namespace hp::fakes::internal
