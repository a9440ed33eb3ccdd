#include "runtime/heap.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "runtime/logging.h"

namespace hp::shmem {

HeapAllocator::HeapAllocator(std::size_t capacity)
    : capacity_(capacity / kMinAlignment * kMinAlignment) {   // floor: every block is whole granules
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

Result<std::size_t> HeapAllocator::Allocate(std::size_t bytes, std::size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return InvalidArgument("`alignment` must be a power of two, but got " + std::to_string(alignment));
  }
  alignment = std::max(alignment, kMinAlignment);
  auto exhausted = [&]() -> Status {
    return OutOfMemory("symmetric heap exhausted: requested=" + std::to_string(bytes) +
                       " alignment=" + std::to_string(alignment) +
                       " largest_free=" + std::to_string(largest_free_block()) +
                       " heap_size=" + std::to_string(capacity_));
  };
  if (bytes > capacity_) return exhausted();   // also keeps the rounding below from overflowing
  const std::size_t size = (std::max<std::size_t>(bytes, 1) + kMinAlignment - 1) / kMinAlignment * kMinAlignment;

  // Best fit: the smallest free block that holds the aligned request; the first (lowest offset) among equals.
  auto best = free_.end();
  std::size_t best_start = 0;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const std::size_t block_offset = it->first;
    const std::size_t block_size = it->second;
    if (block_size < size) continue;
    if (best != free_.end() && block_size >= best->second) continue;
    // Offsets stay below capacity_, so rounding up to `alignment` can only overflow for absurd alignments.
    const std::size_t misalign = block_offset % alignment;
    const std::size_t gap = misalign == 0 ? 0 : alignment - misalign;
    if (gap > block_size - size) continue;
    best = it;
    best_start = block_offset + gap;
  }
  if (best == free_.end()) return exhausted();

  const std::size_t block_offset = best->first;
  const std::size_t block_end = best->first + best->second;
  free_.erase(best);
  if (best_start > block_offset) free_.emplace(block_offset, best_start - block_offset);   // the front gap stays free
  if (best_start + size < block_end) free_.emplace(best_start + size, block_end - best_start - size);
  allocated_.emplace(best_start, size);
  used_ += size;
  return best_start;
}

Status HeapAllocator::Free(std::size_t offset) {
  auto it = allocated_.find(offset);
  if (it == allocated_.end()) {
    return InvalidArgument("`offset` must be the start of an allocated block, but got " + Hex(offset));
  }
  std::size_t start = offset;
  std::size_t end = offset + it->second;
  used_ -= it->second;
  allocated_.erase(it);

  // Coalesce with the free neighbour that ends where this block starts and the one that starts where it ends.
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == end) {
    end += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      free_.erase(prev);
    }
  }
  free_.emplace(start, end - start);
  return Status::Ok();
}

std::size_t HeapAllocator::ReservedBytes(std::size_t offset) const {
  auto it = allocated_.find(offset);
  return it == allocated_.end() ? 0 : it->second;
}

std::size_t HeapAllocator::largest_free_block() const {
  std::size_t largest = 0;
  for (const auto& [offset, size] : free_) largest = std::max(largest, size);
  return largest;
}

}  // namespace hp::shmem
