// reduce_scatter in full precision: one step, copy-free, peer memory, staged (collectives/engine.h).

#include <algorithm>

#include "runtime/collectives/engine.h"
#include "runtime/collectives/paths.h"

namespace hp::shmem {

using namespace collectives;   // paths.h: what every family shares

Status CollectiveEngine::ReduceScatter(const Buffer& output, const Buffer& input, const ElementType& type, ReduceOp op) {
  const std::size_t es = type.bytes;
  const std::size_t c = output.bytes / es;
  HP_ASSIGN_OR_RETURN(Fingerprint f, Begin(Collective::kReduceScatter, &type, c, static_cast<std::uint32_t>(op) + 1, -1));
  f.where[0] = input.heap_offset;
  f.address[0] = Published(input.address);
  const int n = team_.size();
  const int me = team_.me;
  char* out = static_cast<char*>(output.address);
  const char* in = static_cast<const char*>(input.address);
  if (c > 0 && input.bytes <= OneStepBytes(true)) {   // one sync, as in all_reduce
    char* stage = team_.StagingHalf(Parity());
    HP_RETURN_IF_ERROR(BeforeOpen(Put(stage, in, input.bytes, me)));
    HP_RETURN_IF_ERROR(Open(f).status());
    return Broken(Reduce(out, stage + static_cast<std::size_t>(me) * c * es, c, type, op), "reduce", Next::kCallEnd);
  }
  HP_ASSIGN_OR_RETURN(std::vector<Fingerprint> rows, Open(f));
  if (c == 0) return Status::Ok();
  if (SameSymmetric(rows, 0)) {   // reduce straight from the peers' inputs
    HP_RETURN_IF_ERROR(Broken(Reduce(out, in + static_cast<std::size_t>(me) * c * es, c, type, op), "reduce"));
    return Sync();
  }
  if (EveryAddress(rows, 0)) {   // reduce straight from the peers' inputs wherever they lie
    HP_RETURN_IF_ERROR(Broken(ReducePeerMemory(out, rows, 0, static_cast<std::size_t>(me) * c * es, c, type, op), "reduce"));
    return Sync();
  }
  const std::size_t region = RoundDown(team_.staging_bytes() / static_cast<std::size_t>(n), 64);
  const std::size_t piece = region / es;
  char* stage = team_.Staging();
  for (std::size_t off = 0; off < c; off += piece) {
    const std::size_t length = std::min(piece, c - off);
    for (int j = 0; j < n; ++j) {
      HP_RETURN_IF_ERROR(Broken(Put(stage + static_cast<std::size_t>(j) * region,
                                    in + (static_cast<std::size_t>(j) * c + off) * es, length * es, me), "stage"));
    }
    HP_RETURN_IF_ERROR(Sync());
    HP_RETURN_IF_ERROR(Broken(Reduce(out + off * es, stage + static_cast<std::size_t>(me) * region, length, type, op),
                              "reduce"));
    HP_RETURN_IF_ERROR(Sync());
  }
  return Status::Ok();
}

}  // namespace hp::shmem
