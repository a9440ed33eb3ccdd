#include "fake_memory.h"

#include <sys/mman.h>

#include <cstdint>
#include <map>
#include <mutex>

namespace hp::fakes::internal {
namespace {

// Every live DeviceMemory by device address. A lock of its own, taken last: a DeviceMemory may die anywhere, under
// World::mu too (a stream task that held the last reference).
struct Registry {
  std::mutex mu;
  std::map<std::uintptr_t, std::weak_ptr<DeviceMemory>> by_base;
};

Registry& TheRegistry() {
  static Registry* registry = new Registry();   // never destroyed: thread-local PEs die after static destruction
  return *registry;
}

}  // namespace

std::shared_ptr<DeviceMemory> DeviceMemory::Create(std::size_t bytes, std::size_t alignment, int device) {
  if (bytes == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0) return nullptr;
  // Reserve bytes + alignment, keep the aligned part: inaccessible addresses that nothing else can be mapped at.
  const std::size_t reservation = bytes + alignment;
  void* reserved = mmap(nullptr, reservation, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) return nullptr;
  void* host = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (host == MAP_FAILED) {
    munmap(reserved, reservation);
    return nullptr;
  }
  std::shared_ptr<DeviceMemory> memory(new DeviceMemory());
  const auto start = reinterpret_cast<std::uintptr_t>(reserved);
  memory->device_base_ = reinterpret_cast<char*>((start + alignment - 1) / alignment * alignment);
  memory->host_ = static_cast<char*>(host);
  memory->size_ = bytes;
  memory->reservation_ = reservation;
  memory->reservation_base_ = reserved;
  memory->device_ = device;
  Registry& registry = TheRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  registry.by_base[reinterpret_cast<std::uintptr_t>(memory->device_base_)] = memory;
  return memory;
}

DeviceMemory::~DeviceMemory() {
  {
    Registry& registry = TheRegistry();
    std::lock_guard<std::mutex> lock(registry.mu);
    registry.by_base.erase(reinterpret_cast<std::uintptr_t>(device_base_));
  }
  munmap(host_, size_);
  munmap(reservation_base_, reservation_);
}

HostView HostView::Of(const void* address, std::size_t bytes) {
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  Registry& registry = TheRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  auto it = registry.by_base.upper_bound(at);
  if (it == registry.by_base.begin()) return {};
  --it;
  std::shared_ptr<DeviceMemory> memory = it->second.lock();
  if (!memory) return {};
  const std::size_t offset = at - it->first;
  if (offset >= memory->size_ || bytes > memory->size_ - offset) return {};
  HostView view;
  view.host = memory->host_ + offset;
  view.memory = std::move(memory);
  return view;
}

}  // namespace hp::fakes::internal
