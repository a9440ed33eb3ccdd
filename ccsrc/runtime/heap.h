// The symmetric-heap allocator: hands out offsets inside a heap of fixed capacity.
//
// Deterministic: the same sequence of Allocate/Free calls yields the same offsets on every rank, which is what
// makes the heap symmetric. Best fit over a free list ordered by offset; neighbouring free blocks coalesce.
#pragma once

#include <cstddef>
#include <map>

#include "runtime/status.h"

namespace hp::shmem {

class HeapAllocator {
 public:
  static constexpr std::size_t kMinAlignment = 64;   // a cache line: signals never share one with data
  // The largest alignment a device guarantees for addresses (devices map heaps at multiples of it).
  static constexpr std::size_t kMaxAlignment = std::size_t{2} << 20;

  explicit HeapAllocator(std::size_t capacity);

  // Returns the offset of a block of at least max(bytes, 1) bytes (rounded up to kMinAlignment) whose offset is
  // a multiple of `alignment`. `alignment` must be a power of two (kInvalidArgument otherwise); values below
  // kMinAlignment are raised to it. kOutOfMemory ("symmetric heap exhausted: requested=... alignment=...
  // largest_free=... heap_size=...") when no free block fits.
  Result<std::size_t> Allocate(std::size_t bytes, std::size_t alignment);

  // Frees the block that starts at `offset`; kInvalidArgument when no allocated block starts there.
  Status Free(std::size_t offset);

  // Bytes reserved for the block at `offset` (0 when there is none).
  std::size_t ReservedBytes(std::size_t offset) const;

  std::size_t capacity() const { return capacity_; }
  std::size_t used() const { return used_; }
  std::size_t largest_free_block() const;
  std::size_t free_block_count() const { return free_.size(); }

 private:
  std::size_t capacity_;
  std::size_t used_ = 0;
  std::map<std::size_t, std::size_t> free_;        // offset -> size
  std::map<std::size_t, std::size_t> allocated_;   // offset -> size
};

}  // namespace hp::shmem
