// The engine's transfers: the device's data plane addressed by group rank, chunked to the device's limit.

#include "runtime/collectives/engine.h"
#include "runtime/collectives/paths.h"
#include "runtime/transfer.h"

namespace hp::shmem {

namespace {

// Where the device reaches peers' memory, a message above these sizes moves faster read once out of the peers'
// tensors (one copy, a closing sync) than in one step (two copies, one sync); a reduction's peer-memory path costs
// more syncs, so it pays off later. Measured in docs/perf.md ("The peer-memory path").
constexpr std::size_t kPeerMemoryMovesFromBytes = 16 << 10;
constexpr std::size_t kPeerMemoryReducesFromBytes = 64 << 10;

}  // namespace

std::size_t CollectiveEngine::OneStepBytes(bool reduces) const {
  if (!device_.reaches_peer_memory()) return team_.one_step_bytes();
  return std::min(team_.one_step_bytes(), reduces ? kPeerMemoryReducesFromBytes : kPeerMemoryMovesFromBytes);
}

// ---- transfers ----------------------------------------------------------------------------------------------------

Status CollectiveEngine::Put(void* symmetric_dst, const void* src, std::size_t bytes, int group_rank) {
  auto* to = static_cast<char*>(symmetric_dst);
  const auto* from = static_cast<const char*>(src);
  const int pe = team_.pes[static_cast<std::size_t>(group_rank)];
  return ForEachChunk(bytes, device_.max_transfer_bytes(), [&](const Chunk& chunk) {
    return device_.Put(to + chunk.offset, from + chunk.offset, chunk.bytes, pe, stream_, keep_);
  });
}

Status CollectiveEngine::Get(void* dst, const void* symmetric_src, std::size_t bytes, int group_rank) {
  auto* to = static_cast<char*>(dst);
  const auto* from = static_cast<const char*>(symmetric_src);
  const int pe = team_.pes[static_cast<std::size_t>(group_rank)];
  return ForEachChunk(bytes, device_.max_transfer_bytes(), [&](const Chunk& chunk) {
    return device_.Get(to + chunk.offset, from + chunk.offset, chunk.bytes, pe, stream_, keep_);
  });
}

std::uint64_t CollectiveEngine::Published(const void* address) const {
  return device_.reaches_peer_memory() ? reinterpret_cast<std::uintptr_t>(address) : 0;
}

Status CollectiveEngine::GetPeerMemory(void* dst, std::uint64_t peer_address, std::size_t bytes, int group_rank) {
  return device_.GetPeerMemory(dst, peer_address, bytes, team_.pes[static_cast<std::size_t>(group_rank)], stream_, keep_);
}

Status CollectiveEngine::ReducePeerMemory(void* dst, const std::vector<Fingerprint>& rows, int column,
                                          std::size_t offset, std::size_t count, const ElementType& type, ReduceOp op) {
  if (count == 0) return Status::Ok();
  std::vector<std::uint64_t> sources;
  sources.reserve(rows.size());
  for (const Fingerprint& row : rows) sources.push_back(row.address[column] + offset);
  return device_.ReducePeerMemory(dst, sources, team_.pes, count, type.reduce_type, op, stream_, keep_);
}

Status CollectiveEngine::Reduce(void* dst, const void* symmetric_src, std::size_t count, const ElementType& type,
                                ReduceOp op) {
  if (count == 0) return Status::Ok();
  return device_.Reduce(dst, symmetric_src, count, type.reduce_type, op, team_.pes, stream_, keep_);
}

}  // namespace hp::shmem
