// all_gather: one step, copy-free push or pull, peer memory, staged (collectives/engine.h).

#include <algorithm>

#include "runtime/collectives/engine.h"
#include "runtime/collectives/paths.h"

namespace hp::shmem {

using namespace collectives;   // paths.h: what every family shares

Status CollectiveEngine::AllGather(const Buffer& output, const Buffer& input, const ElementType& type) {
  const std::size_t c = input.bytes;
  HP_ASSIGN_OR_RETURN(Fingerprint f, Begin(Collective::kAllGather, &type, c / type.bytes, 0, -1));
  f.where[0] = output.heap_offset;
  f.where[1] = input.heap_offset;
  f.address[1] = Published(input.address);
  const int n = team_.size();
  const int me = team_.me;
  char* out = static_cast<char*>(output.address);
  const char* in = static_cast<const char*>(input.address);
  char* mine = out + static_cast<std::size_t>(me) * c;
  const bool in_place = in == mine;
  auto part = [&](int r) { return out + static_cast<std::size_t>(r) * c; };
  if (c > 0 && c <= OneStepBytes(false)) {   // one sync: stage in this call's half, peers pull from it
    char* stage = team_.StagingHalf(Parity());
    HP_RETURN_IF_ERROR(BeforeOpen(Put(stage, in, c, me)));
    HP_RETURN_IF_ERROR(Open(f).status());
    for (int r = 1; r <= n; ++r) {
      const int p = (me + r) % n;
      if (p == me && in_place) continue;
      HP_RETURN_IF_ERROR(Broken(Get(part(p), stage, c, p), "pull", Next::kCallEnd));
    }
    return Status::Ok();
  }
  HP_ASSIGN_OR_RETURN(std::vector<Fingerprint> rows, Open(f));
  if (c == 0) return Status::Ok();
  if (SameSymmetric(rows, 0)) {   // push into the peers' outputs
    for (int r = 1; r < n; ++r) HP_RETURN_IF_ERROR(Broken(Put(mine, in, c, (me + r) % n), "push"));
    if (!in_place) HP_RETURN_IF_ERROR(Broken(Put(mine, in, c, me), "copy"));
    return Sync();
  }
  if (SameSymmetric(rows, 1)) {   // pull from the peers' inputs
    for (int r = 1; r <= n; ++r) {
      const int p = (me + r) % n;
      if (p == me && in_place) continue;
      HP_RETURN_IF_ERROR(Broken(Get(part(p), in, c, p), "pull"));
    }
    return Sync();
  }
  if (EveryAddress(rows, 1)) {   // pull from the peers' inputs wherever they lie: one copy of each byte
    for (int r = 1; r < n; ++r) {
      const int p = (me + r) % n;
      HP_RETURN_IF_ERROR(Broken(GetPeerMemory(part(p), rows[static_cast<std::size_t>(p)].address[1], c, p), "pull"));
    }
    if (!in_place) HP_RETURN_IF_ERROR(Broken(device_.Copy(mine, in, c, stream_, keep_), "copy"));
    return Sync();
  }
  const std::size_t piece = team_.staging_bytes();
  for (std::size_t off = 0; off < c; off += piece) {
    const std::size_t length = std::min(piece, c - off);
    HP_RETURN_IF_ERROR(Broken(Put(team_.Staging(), in + off, length, me), "stage"));
    HP_RETURN_IF_ERROR(Sync());
    for (int r = 1; r <= n; ++r) {
      const int p = (me + r) % n;
      if (p == me && in_place) continue;
      HP_RETURN_IF_ERROR(Broken(Get(part(p) + off, team_.Staging(), length, p), "pull"));
    }
    HP_RETURN_IF_ERROR(Sync());
  }
  return Status::Ok();
}

}  // namespace hp::shmem
