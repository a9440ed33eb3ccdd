#include "fake_heap.h"

#include <iterator>

namespace hp::fakes {

FakeHeap::FakeHeap(std::size_t capacity) : capacity_(capacity) {
  if (capacity > 0) free_.emplace(0, capacity);
}

std::optional<std::size_t> FakeHeap::Allocate(std::size_t size, std::size_t alignment) {
  if (size == 0 || alignment == 0 || (alignment & (alignment - 1)) != 0 || size > capacity_) return std::nullopt;
  const std::size_t bytes = (size + kGranule - 1) / kGranule * kGranule;
  auto best = free_.end();
  std::size_t best_start = 0;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const std::size_t start = (it->first + alignment - 1) / alignment * alignment;
    const std::size_t head = start - it->first;
    if (head > it->second || it->second - head < bytes) continue;
    if (best == free_.end() || it->second < best->second) {
      best = it;
      best_start = start;
    }
  }
  if (best == free_.end()) return std::nullopt;
  const std::size_t block_offset = best->first;
  const std::size_t block_bytes = best->second;
  free_.erase(best);
  if (best_start > block_offset) free_.emplace(block_offset, best_start - block_offset);
  const std::size_t tail = block_offset + block_bytes - (best_start + bytes);
  if (tail > 0) free_.emplace(best_start + bytes, tail);
  allocated_.emplace(best_start, bytes);
  used_ += bytes;
  return best_start;
}

bool FakeHeap::Free(std::size_t offset) {
  auto it = allocated_.find(offset);
  if (it == allocated_.end()) return false;
  std::size_t start = it->first;
  std::size_t bytes = it->second;
  used_ -= bytes;
  allocated_.erase(it);
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + bytes) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(start, bytes);
  return true;
}

}  // namespace hp::fakes
