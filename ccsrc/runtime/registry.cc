#include "runtime/registry.h"

#include <algorithm>
#include <atomic>
#include <limits>

#include "runtime/logging.h"

namespace hp::shmem {

std::string DescribeAllocation(const AllocationInfo& info) {
  return "allocation_id=" + std::to_string(info.id) + " base=" + Hex(info.base) + " bytes=" + std::to_string(info.bytes);
}

namespace {

// Process-wide and never reset: an id is handed out at most once per process.
std::atomic<std::uint64_t> g_next_id{1};

std::string IdFact(const char* fact, std::uint64_t id) {
  return std::string(fact) + ": allocation_id=" + std::to_string(id);
}

}  // namespace

const char* AllocationStateName(AllocationState state) {
  switch (state) {
    case AllocationState::kActive: return "active";
    case AllocationState::kLeaked: return "leaked";
    case AllocationState::kFreed: return "freed";
  }
  return "unknown";
}

std::uint64_t AllocationRegistry::PeekNextId() { return g_next_id.load(); }

Status AllocationRegistry::MissingId(std::uint64_t id) const {
  const bool issued_here = id >= first_id_ && id < g_next_id.load();
  if (issued_here && forgotten_.count(id) == 0) return StateError(IdFact("allocation was already freed", id));
  return StateError(IdFact("allocation is not registered", id));
}

std::uint64_t AllocationRegistry::Register(std::uint64_t lifecycle, std::uintptr_t base, std::size_t offset,
                                           std::size_t bytes, std::size_t reserved, std::string call_site) {
  std::lock_guard<std::mutex> lock(mu_);
  // Taken under the lock so that a concurrent Reset cannot move first_id_ past an id it has not seen yet.
  const std::uint64_t id = g_next_id.fetch_add(1);
  AllocationInfo info;
  info.id = id;
  info.lifecycle = lifecycle;
  info.base = base;
  info.offset = offset;
  info.bytes = bytes;
  info.reserved = reserved;
  info.state = AllocationState::kActive;
  info.call_site = std::move(call_site);
  by_id_.emplace(id, std::move(info));
  active_by_base_.emplace(std::make_pair(base, id), id);
  allocated_ += reserved;
  max_allocated_ = std::max(max_allocated_, allocated_);
  return id;
}

Result<AllocationInfo> AllocationRegistry::MarkFreed(std::uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return MissingId(id);
  if (it->second.state == AllocationState::kLeaked) {
    return StateError(IdFact("allocation was leaked (its storage was released before free)", id));
  }
  AllocationInfo info = std::move(it->second);
  by_id_.erase(it);
  active_by_base_.erase(std::make_pair(info.base, id));
  allocated_ -= info.reserved;
  info.state = AllocationState::kFreed;
  return info;
}

bool AllocationRegistry::MarkStorageReleased(std::uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end() || it->second.state != AllocationState::kActive) return false;
  it->second.state = AllocationState::kLeaked;
  active_by_base_.erase(std::make_pair(it->second.base, id));
  return true;   // still counts towards allocated_: the heap block stays reserved
}

void AllocationRegistry::Forget(std::uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  active_by_base_.erase(std::make_pair(it->second.base, id));
  allocated_ -= it->second.reserved;
  by_id_.erase(it);
  forgotten_.insert(id);
}

Result<AllocationInfo> AllocationRegistry::FindActive(std::uintptr_t address, std::size_t bytes,
                                                       const char* what) const {
  std::lock_guard<std::mutex> lock(mu_);
  // The active allocation with the greatest base at or below `address` (ties: the newest id).
  auto it = active_by_base_.upper_bound(
      std::make_pair(address, std::numeric_limits<std::uint64_t>::max()));
  if (it != active_by_base_.begin()) {
    --it;
    const AllocationInfo& info = by_id_.at(it->second);
    const std::uintptr_t into = address - info.base;   // address >= info.base here
    // [address, address + bytes) within [base, base + info.bytes); written without overflow.
    if (into <= info.bytes && bytes <= info.bytes - into) return info;
    // The address lies in the allocation (or its reserved tail) but the range runs past the end.
    if (into == 0 || into < std::max(info.bytes, info.reserved)) {
      return InvalidArgument(std::string("`") + what + "` must lie inside its symmetric allocation, but got bytes [" + Hex(address) +
                             "," + Hex(address + bytes) + ") past the end of allocation_id=" +
                             std::to_string(info.id) + " (base=" + Hex(info.base) +
                             " bytes=" + std::to_string(info.bytes) + ")");
    }
  }
  return InvalidArgument(std::string("`") + what + "` must be a symmetric tensor allocated by shmem.empty, but got an address " +
                         Hex(address) + " outside every active allocation");
}

bool AllocationRegistry::ContainsActive(std::uintptr_t address, std::size_t bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = active_by_base_.upper_bound(std::make_pair(address, std::numeric_limits<std::uint64_t>::max()));
  if (it == active_by_base_.begin()) return false;
  --it;
  const AllocationInfo& info = by_id_.at(it->second);
  const std::uintptr_t into = address - info.base;   // address >= info.base here
  return into <= info.bytes && bytes <= info.bytes - into;
}

Result<AllocationInfo> AllocationRegistry::Get(std::uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return MissingId(id);
  return it->second;
}

std::vector<AllocationInfo> AllocationRegistry::Active() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<AllocationInfo> out;
  for (const auto& [id, info] : by_id_) {
    if (info.state == AllocationState::kActive) out.push_back(info);
  }
  return out;
}

std::vector<AllocationInfo> AllocationRegistry::Leaked() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<AllocationInfo> out;
  for (const auto& [id, info] : by_id_) {
    if (info.state == AllocationState::kLeaked) out.push_back(info);
  }
  return out;
}

std::size_t AllocationRegistry::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

std::size_t AllocationRegistry::max_allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return max_allocated_;
}

void AllocationRegistry::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  by_id_.clear();
  active_by_base_.clear();
  forgotten_.clear();
  first_id_ = g_next_id.load();
  allocated_ = 0;
  max_allocated_ = 0;
}

}  // namespace hp::shmem
