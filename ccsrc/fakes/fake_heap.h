// The fake's symmetric-heap allocator, modelled on CANN SHMEM's memory manager: sizes round up to 16 bytes, best
// fit over the free blocks, neighbours coalesce, so a block freed and asked for again comes back at the same offset.
#pragma once

#include <cstddef>
#include <map>
#include <optional>

namespace hp::fakes {

class FakeHeap {
 public:
  static constexpr std::size_t kGranule = 16;

  FakeHeap() = default;
  explicit FakeHeap(std::size_t capacity);

  // The offset of a block of `size` bytes aligned to `alignment` (a power of two), or nullopt.
  std::optional<std::size_t> Allocate(std::size_t size, std::size_t alignment);
  bool Free(std::size_t offset);   // false when no block starts there
  std::size_t used() const { return used_; }

 private:
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
  std::map<std::size_t, std::size_t> free_;        // offset -> bytes
  std::map<std::size_t, std::size_t> allocated_;   // offset -> bytes
};

}  // namespace hp::fakes
