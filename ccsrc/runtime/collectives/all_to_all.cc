// all_to_all with counts checked across ranks: eager parts with the counts, in-place swap, peer memory,
// copy-free push, staged (collectives/engine.h).

#include <algorithm>

#include "runtime/collectives/engine.h"
#include "runtime/collectives/paths.h"

namespace hp::shmem {

using namespace collectives;   // paths.h: what every family shares

namespace {

// Bytes one in-place swap step holds in the staging area: small enough to stay in cache between its two copies.
constexpr std::size_t kSwapChunkBytes = 256 << 10;

}  // namespace

Status CollectiveEngine::AllToAll(const std::vector<Buffer>& sends, const Buffer& receive,
                                  const std::vector<std::uint64_t>& receive_counts, const ElementType& type) {
  const int n = team_.size();
  const int me = team_.me;
  const std::size_t es = type.bytes;
  const auto un = static_cast<std::size_t>(n);
  char* out = static_cast<char*>(receive.address);
  std::vector<std::size_t> starts(un, 0);
  for (std::size_t i = 1; i < un; ++i) starts[i] = starts[i - 1] + receive_counts[i - 1] * es;
  const std::size_t received = starts[un - 1] + receive_counts[un - 1] * es;
  bool aliased = false;   // some send overlaps the receive buffer
  bool in_place = true;   // every send is the receive buffer's block for it
  for (std::size_t j = 0; j < un; ++j) {
    aliased = aliased || Overlaps(sends[j].address, sends[j].bytes, out, received);
    in_place = in_place && sends[j].bytes == receive_counts[j] * es && sends[j].address == out + starts[j];
  }
  // Where the receive buffer lies: -1 when peers must not address it (not symmetric, or the sends overlap it other
  // than block for block: peers' pushes would overwrite sends not read yet), else 2 x its heap offset, plus 1 in
  // place. Peers address it only if every rank's is the same.
  std::int64_t where = -1;
  if (receive.heap_offset >= 0 && (in_place || !aliased)) where = 2 * receive.heap_offset + (in_place ? 1 : 0);
  HP_ASSIGN_OR_RETURN(Fingerprint f, Begin(Collective::kAllToAll, &type, un, 0, -1));
  f.where[0] = where;
  const int parity = Parity();
  // This rank's own part never goes through staging: one local copy puts it in place, after the checks (none when
  // the call is in place). Only where the sends overlap the receive buffer some other way does it travel like a
  // peer's part, so that every send is read before its bytes can be overwritten. A local decision: no peer sees it.
  const Buffer& own = sends[static_cast<std::size_t>(me)];
  char* own_place = out + starts[static_cast<std::size_t>(me)];
  const bool own_in_place = own.address == own_place;
  const bool own_direct = own_in_place || !aliased;
  auto place_own = [&](Next next) -> Status {
    if (own_in_place) return Status::Ok();
    return Broken(device_.Copy(own_place, own.address, own.bytes, stream_, keep_), "copy the own part", next);
  };
  // Small parts travel with the counts (one sync in all), into the receiver's staging half of this call's parity,
  // a region per sender; they are used only if every rank staged them. A rank whose receive buffer peers may address,
  // or whose sends peers may read where they lie, stages only a message of one step: above it, the copy-free and
  // peer-memory paths move each byte once (push, pull) or swap blocks in place (each byte read and written once),
  // where staging copies every byte twice. Every rank tells from the count table which ranks staged.
  const std::size_t eager_region = RoundDown(team_.staging_bytes() / 2 / un, 64);
  const std::size_t one_step = OneStepBytes(false);
  auto stages = [&](std::size_t largest_part, std::size_t total, std::int64_t rank_where, bool sends_readable) {
    return largest_part <= eager_region && (total <= one_step || (rank_where < 0 && !sends_readable));
  };
  std::size_t largest_send = 0;
  std::size_t total_send = 0;
  for (const Buffer& s : sends) {
    largest_send = std::max(largest_send, s.bytes);
    total_send += s.bytes;
  }
  char* my_region = team_.StagingHalf(parity) + static_cast<std::size_t>(me) * eager_region;
  if (stages(largest_send, total_send, where, device_.reaches_peer_memory() && !aliased)) {
    for (int r = 1; r <= n; ++r) {
      const int p = (me + r) % n;
      if (p == me && own_direct) continue;
      HP_RETURN_IF_ERROR(BeforeOpen(
          Put(my_region, sends[static_cast<std::size_t>(p)].address, sends[static_cast<std::size_t>(p)].bytes, p)));
    }
  }
  // The row: send counts, receive counts, `where`, then the sends' addresses for peers that reach this rank's memory
  // (0 where the sends overlap the receive buffer: peers must not read what this rank is overwriting).
  std::vector<std::int64_t> row(3 * un + 1);
  for (std::size_t j = 0; j < un; ++j) {
    row[j] = static_cast<std::int64_t>(sends[j].bytes / es);
    row[un + j] = static_cast<std::int64_t>(receive_counts[j]);
    row[2 * un + 1 + j] = aliased ? 0 : static_cast<std::int64_t>(Published(sends[j].address));
  }
  row[2 * un] = where;
  HP_ASSIGN_OR_RETURN(std::vector<Fingerprint> rows, Open(f, &row));
  std::vector<std::vector<std::int64_t>> table(un, std::vector<std::int64_t>(row.size()));
  for (int r = 0; r < n; ++r) {
    HP_RETURN_IF_ERROR(Broken(device_.CopyFromHeap(table[static_cast<std::size_t>(r)].data(), team_.CountRow(parity, r),
                                                   row.size() * sizeof(std::int64_t)),
                              "read the counts", Next::kUnknown));
  }
  // table[i][j]: elements rank i sends to rank j; table[j][n + i]: elements rank j expects from rank i. Every rank
  // checks the same table, so all refuse alike, before anything is written.
  std::int64_t largest = 0;
  bool every_rank_staged = true;
  for (std::size_t i = 0; i < un; ++i) {
    std::size_t rank_largest = 0;
    std::size_t rank_total = 0;
    bool sends_readable = device_.reaches_peer_memory();   // rank i published the address of every send that moves
    for (std::size_t j = 0; j < un; ++j) {
      rank_largest = std::max(rank_largest, static_cast<std::size_t>(table[i][j]) * es);
      rank_total += static_cast<std::size_t>(table[i][j]) * es;
      sends_readable = sends_readable && (table[i][j] == 0 || table[i][2 * un + 1 + j] != 0);
    }
    every_rank_staged = every_rank_staged && stages(rank_largest, rank_total, table[i][2 * un], sends_readable);
    for (std::size_t j = 0; j < un; ++j) {
      if (table[i][j] != table[j][un + i]) {
        return InvalidArgument("`send_tensor_list[" + std::to_string(j) + "]` of rank " + std::to_string(i) +
                               " must have the " + std::to_string(table[j][un + i]) + " elements rank " +
                               std::to_string(j) + " expects in its receive_list[" + std::to_string(i) + "], but got " +
                               std::to_string(table[i][j]));
      }
      largest = std::max(largest, table[i][j]);
    }
  }
  const auto largest_bytes = static_cast<std::size_t>(largest) * es;
  if (every_rank_staged) {
    if (own_direct) HP_RETURN_IF_ERROR(place_own(Next::kCallEnd));
    for (int r = 1; r <= n; ++r) {
      const int i = (me + r) % n;
      if (i == me && own_direct) continue;
      const std::size_t length = static_cast<std::size_t>(table[static_cast<std::size_t>(i)][static_cast<std::size_t>(me)]) * es;
      if (length == 0) continue;
      HP_RETURN_IF_ERROR(Broken(Get(out + starts[static_cast<std::size_t>(i)],
                                    team_.StagingHalf(parity) + static_cast<std::size_t>(i) * eager_region, length, me),
                                "take the eager parts", Next::kCallEnd));
    }
    return Status::Ok();
  }
  bool same_tensor = true;
  bool all_in_place = true;
  bool none_in_place = true;
  for (const auto& r : table) {
    same_tensor = same_tensor && r[2 * un] >= 0 && (r[2 * un] >> 1) == (table[0][2 * un] >> 1);
    all_in_place = all_in_place && (r[2 * un] & 1) == 1;
    none_in_place = none_in_place && (r[2 * un] & 1) == 0;
  }
  if (same_tensor && all_in_place) {
    HP_RETURN_IF_ERROR(SwapBlocks(out, starts, table, es));
    return Sync();
  }
  bool every_send_published = true;   // every part that moves, the own ones too, can be read where it lies
  for (std::size_t i = 0; i < un; ++i) {
    for (std::size_t j = 0; j < un; ++j) {
      every_send_published = every_send_published && (table[i][j] == 0 || table[i][2 * un + 1 + j] != 0);
    }
  }
  if (!(same_tensor && none_in_place) && every_send_published) {   // pull from the peers' sends: one copy of each byte
    HP_RETURN_IF_ERROR(place_own(Next::kSync));
    for (int r = 1; r < n; ++r) {
      const int i = (me + r) % n;
      const auto ui = static_cast<std::size_t>(i);
      const std::size_t length = static_cast<std::size_t>(table[ui][static_cast<std::size_t>(me)]) * es;
      if (length == 0) continue;
      HP_RETURN_IF_ERROR(Broken(GetPeerMemory(out + starts[ui],
                                              static_cast<std::uint64_t>(table[ui][2 * un + 1 + static_cast<std::size_t>(me)]),
                                              length, i),
                                "pull"));
    }
    return Sync();
  }
  if (same_tensor && none_in_place) {   // push into the peers' receive buffers
    for (int r = 1; r <= n; ++r) {
      const int j = (me + r) % n;
      std::size_t start = 0;
      for (int i = 0; i < me; ++i) start += static_cast<std::size_t>(table[static_cast<std::size_t>(j)][un + static_cast<std::size_t>(i)]) * es;
      const Buffer& s = sends[static_cast<std::size_t>(j)];
      HP_RETURN_IF_ERROR(Broken(Put(out + start, s.address, s.bytes, j), "push"));
    }
    return Sync();
  }
  // Staged (also safe where the sends alias the receive buffer: parts are staged before use). A peer's part is copied
  // twice, into the receiver's staging and out of it: the receiver's buffer is not addressable.
  if (own_direct) HP_RETURN_IF_ERROR(place_own(Next::kSync));
  const std::size_t region = RoundDown(team_.staging_bytes() / un, 64);
  for (std::size_t off = 0; off < largest_bytes; off += region) {
    for (int r = 1; r <= n; ++r) {
      const int j = (me + r) % n;
      if (j == me && own_direct) continue;
      const Buffer& s = sends[static_cast<std::size_t>(j)];
      if (s.bytes <= off) continue;
      HP_RETURN_IF_ERROR(Broken(Put(team_.Staging() + static_cast<std::size_t>(me) * region,
                                    static_cast<const char*>(s.address) + off, std::min(region, s.bytes - off), j),
                                "stage"));
    }
    HP_RETURN_IF_ERROR(Sync());
    for (int r = 1; r <= n; ++r) {
      const int i = (me + r) % n;
      if (i == me && own_direct) continue;
      const std::size_t sent = static_cast<std::size_t>(table[static_cast<std::size_t>(i)][static_cast<std::size_t>(me)]) * es;
      if (sent <= off) continue;
      HP_RETURN_IF_ERROR(Broken(Get(out + starts[static_cast<std::size_t>(i)] + off,
                                    team_.Staging() + static_cast<std::size_t>(i) * region, std::min(region, sent - off), me),
                                "take"));
    }
    HP_RETURN_IF_ERROR(Sync());
  }
  return Status::Ok();
}

Status CollectiveEngine::SwapBlocks(char* out, const std::vector<std::size_t>& starts,
                                    const std::vector<std::vector<std::int64_t>>& table, std::size_t es) {
  // Block j of this rank and block `me` of rank j trade places. Each pair splits the work: the lower rank swaps the
  // first half of the two blocks, the higher one the second half, through a cache-sized chunk of its staging area.
  // Every byte is read once and written once, half the traffic of an out-of-place exchange.
  const int n = team_.size();
  const int me = team_.me;
  const auto un = static_cast<std::size_t>(n);
  const std::size_t chunk = std::min(kSwapChunkBytes, team_.staging_bytes());
  char* held = team_.Staging();
  for (int r = 1; r < n; ++r) {
    const int j = (me + r) % n;
    const std::size_t length = static_cast<std::size_t>(table[static_cast<std::size_t>(me)][static_cast<std::size_t>(j)]) * es;
    char* mine = out + starts[static_cast<std::size_t>(j)];
    std::size_t theirs_start = 0;   // this rank's block in rank j's copy
    for (int i = 0; i < me; ++i) theirs_start += static_cast<std::size_t>(table[static_cast<std::size_t>(j)][un + static_cast<std::size_t>(i)]) * es;
    char* theirs = out + theirs_start;
    const std::size_t half = length / 2;
    const std::size_t lo = me < j ? 0 : half;
    const std::size_t hi = me < j ? half : length;
    for (std::size_t a = lo; a < hi; a += chunk) {
      const std::size_t b = std::min(a + chunk, hi);
      HP_RETURN_IF_ERROR(Broken(device_.Copy(held, mine + a, b - a, stream_, keep_), "swap"));
      HP_RETURN_IF_ERROR(Broken(Get(mine + a, theirs + a, b - a, j), "swap"));
      HP_RETURN_IF_ERROR(Broken(Put(theirs + a, held, b - a, j), "swap"));
    }
  }
  return Status::Ok();
}

}  // namespace hp::shmem
