#include "runtime/transfer.h"

namespace hp::shmem {

std::vector<Chunk> PlanChunks(std::size_t total_bytes, std::size_t max_chunk_bytes) {
  std::vector<Chunk> chunks;
  if (total_bytes == 0) return chunks;
  const std::size_t step = max_chunk_bytes == 0 ? total_bytes : max_chunk_bytes;
  chunks.reserve(total_bytes / step + (total_bytes % step != 0 ? 1 : 0));
  for (std::size_t offset = 0, left = total_bytes; left > 0;) {
    const std::size_t bytes = left < step ? left : step;
    chunks.push_back(Chunk{offset, bytes});
    offset += bytes;
    left -= bytes;
  }
  return chunks;
}

}  // namespace hp::shmem
