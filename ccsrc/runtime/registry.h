// The allocation registry: which symmetric allocations exist, their ids, and what became of them.
//
// Ids come from a process-wide counter and are never reused, not across lifecycles either, even when the heap
// hands back an address it handed out before: a stale id can then never match a new allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/status.h"

namespace hp::shmem {

enum class AllocationState { kActive, kLeaked, kFreed };
const char* AllocationStateName(AllocationState state);

struct AllocationInfo {
  std::uint64_t id = 0;
  std::uint64_t lifecycle = 0;    // which Init..Shutdown lifecycle created it
  std::uintptr_t base = 0;        // local address of the first byte
  std::size_t offset = 0;         // offset inside the symmetric heap (the same on every rank)
  std::size_t bytes = 0;          // bytes the user asked for
  std::size_t reserved = 0;       // bytes the heap reserved (>= bytes; counts towards heap usage)
  AllocationState state = AllocationState::kActive;
  std::string call_site;          // the user's call site of empty(), when logging asked for it
};

// "allocation_id=3 base=0x7f00 bytes=4096": how messages and logs name an allocation.
std::string DescribeAllocation(const AllocationInfo& info);

class AllocationRegistry {
 public:
  // Records a new active allocation and returns its id (> 0, never returned before in this process).
  std::uint64_t Register(std::uint64_t lifecycle, std::uintptr_t base, std::size_t offset, std::size_t bytes,
                         std::size_t reserved, std::string call_site);

  // Marks an active allocation freed and returns its record. Fails (kStateError) for an unknown id, a second
  // free ("allocation was already freed: allocation_id=7") and a leaked allocation.
  Result<AllocationInfo> MarkFreed(std::uint64_t id);

  // The last storage of an allocation died. An active allocation becomes leaked (returns true: the caller logs);
  // a freed or unknown one is ignored (returns false).
  bool MarkStorageReleased(std::uint64_t id);

  // Undoes Register for an allocation that a collective check rejected: the record disappears, the id stays used.
  void Forget(std::uint64_t id);

  // The active allocation that contains [address, address + bytes), or kInvalidArgument naming the address
  // when none does (including the case where the range runs past the allocation's end).
  Result<AllocationInfo> FindActive(std::uintptr_t address, std::size_t bytes, const char* what = "tensor") const;
  // Whether an active allocation contains [address, address + bytes): FindActive's answer without building its
  // error (the collectives ask it for every ordinary tensor, on the small-message path).
  bool ContainsActive(std::uintptr_t address, std::size_t bytes) const;
  Result<AllocationInfo> Get(std::uint64_t id) const;

  std::vector<AllocationInfo> Active() const;   // ordered by id
  std::vector<AllocationInfo> Leaked() const;   // ordered by id

  std::size_t allocated_bytes() const;       // reserved bytes of active and leaked allocations
  std::size_t max_allocated_bytes() const;   // high-water mark of allocated_bytes() since the last Reset

  // Drops every record (end of a lifecycle). Ids keep counting.
  void Reset();

  // The id the next Register will return (for tests and logs).
  static std::uint64_t PeekNextId();

 private:
  // Why `id` has no record: freed since the last Reset, or never registered here (unknown, forgotten, older).
  // Needs mu_ held.
  Status MissingId(std::uint64_t id) const;

  mutable std::mutex mu_;
  std::map<std::uint64_t, AllocationInfo> by_id_;   // active and leaked (freed ones are dropped)
  // Active allocations only, keyed by (base, id) so that FindActive is O(log n). Active allocations never overlap
  // (the heap hands out disjoint blocks), so the last key at or below an address is the only candidate.
  std::map<std::pair<std::uintptr_t, std::uint64_t>, std::uint64_t> active_by_base_;
  // Ids this registry issued since the last Reset are [first_id_, PeekNextId()); one of them that is missing from
  // by_id_ was freed unless Forget dropped it. This tells a double free from an unknown id in O(1) memory per
  // freed allocation.
  std::uint64_t first_id_ = PeekNextId();
  std::set<std::uint64_t> forgotten_;
  std::size_t allocated_ = 0;
  std::size_t max_allocated_ = 0;
};

}  // namespace hp::shmem
