// Splitting a transfer into pieces that one device call can carry.
#pragma once

#include <cstddef>

namespace hp::shmem {

struct Chunk {
  std::size_t offset;   // from the start of the transfer
  std::size_t bytes;
};

// Calls fn(chunk) for consecutive chunks of at most `max_chunk_bytes` (the last one may be shorter; 0 means no
// limit: one chunk) covering `total_bytes`; zero bytes give no call. Stops at and returns the first non-OK
// Status fn returns.
template <typename Fn>
auto ForEachChunk(std::size_t total_bytes, std::size_t max_chunk_bytes, Fn&& fn) -> decltype(fn(Chunk{})) {
  const std::size_t step = max_chunk_bytes == 0 ? total_bytes : max_chunk_bytes;
  // Counts the bytes left rather than adding to the offset, which could wrap past SIZE_MAX.
  for (std::size_t offset = 0, left = total_bytes; left > 0;) {
    const std::size_t bytes = left < step ? left : step;
    auto status = fn(Chunk{offset, bytes});
    if (!status.ok()) return status;
    offset += bytes;
    left -= bytes;
  }
  return decltype(fn(Chunk{}))();
}

}  // namespace hp::shmem
