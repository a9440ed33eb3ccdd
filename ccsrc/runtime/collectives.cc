#include "runtime/collectives.h"

#include <algorithm>
#include <cstring>

#include "runtime/transfer.h"

namespace hp::shmem {

namespace {

std::size_t RoundDown(std::size_t value, std::size_t unit) { return value / unit * unit; }

// Bounds of part `index` when `count` elements are cut into `parts` near-equal parts.
std::pair<std::size_t, std::size_t> Part(std::size_t count, int parts, int index) {
  const std::size_t step = (count + static_cast<std::size_t>(parts) - 1) / static_cast<std::size_t>(parts);
  const std::size_t lo = std::min(static_cast<std::size_t>(index) * step, count);
  return {lo, std::min(lo + step, count)};
}

// Every member's `column` holds the same heap offset (not -1): peers may address each other's copies of it.
bool SameSymmetric(const std::vector<Fingerprint>& rows, int column) {
  const std::int64_t first = rows[0].where[column];
  if (first < 0) return false;
  for (const Fingerprint& row : rows) {
    if (row.where[column] != first) return false;
  }
  return true;
}

// Every member published the address of its `column` tensor: the device reaches their memory, every rank takes the
// path (the rows are the same on every rank).
bool EveryAddress(const std::vector<Fingerprint>& rows, int column) {
  for (const Fingerprint& row : rows) {
    if (row.address[column] == 0) return false;
  }
  return true;
}

// [a, a + a_bytes) and [b, b + b_bytes) share a byte.
bool Overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto lo_a = reinterpret_cast<std::uintptr_t>(a);
  const auto lo_b = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && lo_a < lo_b + b_bytes && lo_b < lo_a + a_bytes;
}

// Where the device reaches peers' memory, a message above these sizes moves faster read once out of the peers'
// tensors (one copy, a closing sync) than in one step (two copies, one sync); a reduction's peer-memory path costs
// more syncs, so it pays off later. Measured in docs/perf.md ("The peer-memory path").
constexpr std::size_t kPeerMemoryMovesFromBytes = 16 << 10;
constexpr std::size_t kPeerMemoryReducesFromBytes = 64 << 10;

// Bytes one in-place swap step holds in the staging area: small enough to stay in cache between its two copies.
constexpr std::size_t kSwapChunkBytes = 256 << 10;

}  // namespace

std::size_t CollectiveEngine::OneStepBytes(bool reduces) const {
  if (!device_.reaches_peer_memory()) return team_.one_step_bytes();
  return std::min(team_.one_step_bytes(), reduces ? kPeerMemoryReducesFromBytes : kPeerMemoryMovesFromBytes);
}

// ---- calls and syncs ----------------------------------------------------------------------------------------------

Fingerprint CollectiveEngine::Begin(Collective collective, const ElementType* type, std::uint64_t count,
                                    std::uint32_t reduce_op, std::int32_t peer) {
  op_name_ = CollectiveName(collective);
  Fingerprint f{};
  f.sequence = ++team_.sequence;
  f.collective = static_cast<std::uint32_t>(collective);
  f.reduce_op = reduce_op;
  f.wire = kWireFull;
  f.peer = peer;
  f.count = count;
  if (type != nullptr) {
    f.element_bytes = type->bytes;
    std::strncpy(f.dtype, type->name.c_str(), sizeof(f.dtype) - 1);
  }
  for (std::int64_t& w : f.where) w = -1;
  return f;
}

Status CollectiveEngine::Disseminate() {
  const int n = team_.size();
  const std::int64_t value = EpochValue();
  for (int distance = 1, round = 0; distance < n; distance *= 2, ++round) {
    const int to = (team_.me + distance) % n;
    HP_RETURN_IF_ERROR(device_.Signal(team_.Dissemination(round), device_.native_signal_width(), value, SignalOp::kSet,
                                      team_.pes[static_cast<std::size_t>(to)], stream_));
    HP_RETURN_IF_ERROR(device_.WaitSignal(team_.Dissemination(round), device_.native_signal_width(), CompareOp::kGe, value, stream_));
  }
  return Status::Ok();
}

std::string CollectiveEngine::MissingRanks(int parity, std::uint64_t epoch_value) {
  const int n = team_.size();
  std::vector<Fingerprint> rows(static_cast<std::size_t>(n));
  if (!device_.CopyFromHeap(rows.data(), team_.FingerprintRow(parity, 0), rows.size() * sizeof(Fingerprint)).ok()) {
    return "?";
  }
  std::string missing;
  for (int r = 0; r < n; ++r) {
    if (rows[static_cast<std::size_t>(r)].epoch < epoch_value) {
      missing += (missing.empty() ? "" : ",") + std::to_string(team_.pes[static_cast<std::size_t>(r)]);
    }
  }
  return missing;
}

Result<std::vector<Fingerprint>> CollectiveEngine::Open(Fingerprint fingerprint, const std::vector<std::int64_t>* counts) {
  if (!team_.broken.empty()) {
    --team_.sequence;
    return StateError("team cannot run collectives any more: op=" + std::string(op_name()) + " " + team_.Describe() +
                      " reason=" + team_.broken);
  }
  const int n = team_.size();
  ++team_.epoch;
  const int parity = static_cast<int>(team_.epoch & 1);
  fingerprint.epoch = static_cast<std::uint64_t>(EpochValue());
  current_ = fingerprint;
  auto rollback = [&](Status status) -> Status {
    --team_.epoch;
    --team_.sequence;
    return status;
  };
  // 1. This rank's row (and count row) enters its own table by a local copy, then every peer's (the heap may be
  //    device memory: rows travel heap to heap).
  Fingerprint* row = team_.FingerprintRow(parity, team_.me);
  Status published = device_.CopyToHeap(row, &fingerprint, sizeof(fingerprint));
  std::int64_t* count_row = team_.CountRow(Parity(), team_.me);
  if (published.ok() && counts != nullptr) {
    published = device_.CopyToHeap(count_row, counts->data(), counts->size() * sizeof(std::int64_t));
  }
  for (int r = 1; r < n && published.ok(); ++r) {
    const int peer = (team_.me + r) % n;
    published = Put(row, row, sizeof(Fingerprint), peer);
    if (published.ok() && counts != nullptr) published = Put(count_row, count_row, counts->size() * sizeof(std::int64_t), peer);
  }
  if (!published.ok()) return rollback(published);
  // 2. The dissemination barrier: once through, every member has published.
  Status arrived = Disseminate();
  if (arrived.ok() && stream_ != kDefaultStream) arrived = device_.SynchronizeStream(stream_);
  if (!arrived.ok()) {
    const std::string missing = MissingRanks(parity, fingerprint.epoch);
    return rollback(Status(arrived.code(), std::string(arrived.code() == StatusCode::kTimeout ? "team sync timed out"
                                                                                               : "team sync failed") +
                                               ": op=" + std::string(op_name()) + " " + team_.Describe() +
                                               " epoch=" + std::to_string(team_.epoch) + " missing_ranks=[" + missing +
                                               "] (" + arrived.message() + ")"));
  }
  // 3. Every member's call, compared with this one's: all ranks see the same table, so all decide alike.
  std::vector<Fingerprint> rows(static_cast<std::size_t>(n));
  HP_RETURN_IF_ERROR(Broken(device_.CopyFromHeap(rows.data(), team_.FingerprintRow(parity, 0), rows.size() * sizeof(Fingerprint)),
                            "read the fingerprints"));
  for (int r = 0; r < n; ++r) {
    const Fingerprint& theirs = rows[static_cast<std::size_t>(r)];
    const std::string differs = FingerprintDifference(fingerprint, theirs);
    if (!differs.empty()) {
      return Mismatch("ranks disagree on a collective (" + differs + "): " + team_.Describe() + " rank " +
                      std::to_string(team_.my_pe()) + " calls " + DescribeFingerprint(fingerprint) + ", rank " +
                      std::to_string(team_.pes[static_cast<std::size_t>(r)]) + " calls " + DescribeFingerprint(theirs));
    }
  }
  return rows;
}

Status CollectiveEngine::BeforeOpen(Status status) {
  if (!status.ok()) --team_.sequence;
  return status;
}

Status CollectiveEngine::Sync() {
  ++team_.epoch;
  return Broken(Disseminate(), "sync");
}

Status CollectiveEngine::Broken(Status status, const char* step) {
  if (status.ok()) return status;
  team_.broken = std::string(op_name()) + " failed after its first sync (" + step + "): " + status.message();
  return Status(status.code(), std::string(op_name()) + " failed after every rank had entered it (" + step + "): " +
                                   team_.Describe() + " (" + status.message() +
                                   "); the team is out of step: create a new one");
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

// ---- collectives --------------------------------------------------------------------------------------------------

Status CollectiveEngine::Barrier() {
  Fingerprint f = Begin(Collective::kBarrier, nullptr, 0, 0, -1);
  return Open(f).status();
}

Result<std::vector<std::vector<std::int64_t>>> CollectiveEngine::Agree(Fingerprint fingerprint,
                                                                      const std::vector<std::int64_t>& values) {
  const Fingerprint f = Begin(static_cast<Collective>(fingerprint.collective), nullptr, fingerprint.count,
                              fingerprint.reduce_op, fingerprint.peer);
  fingerprint.sequence = f.sequence;
  for (std::int64_t& w : fingerprint.where) w = -1;
  op_name_ = CollectiveName(static_cast<Collective>(fingerprint.collective));
  HP_RETURN_IF_ERROR(Open(fingerprint, &values).status());
  const int n = team_.size();
  std::vector<std::int64_t> table(static_cast<std::size_t>(n) * values.size());
  std::vector<std::vector<std::int64_t>> rows(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    rows[static_cast<std::size_t>(r)].resize(values.size());
    HP_RETURN_IF_ERROR(Broken(device_.CopyFromHeap(rows[static_cast<std::size_t>(r)].data(), team_.CountRow(Parity(), r),
                                                   values.size() * sizeof(std::int64_t)),
                              "read the published values"));
  }
  return rows;
}

Status CollectiveEngine::AllGather(const Buffer& output, const Buffer& input, const ElementType& type) {
  const std::size_t c = input.bytes;
  Fingerprint f = Begin(Collective::kAllGather, &type, c / type.bytes, 0, -1);
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
      HP_RETURN_IF_ERROR(Broken(Get(part(p), stage, c, p), "pull"));
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

Status CollectiveEngine::AllReduce(const Buffer& output, const Buffer& input, const ElementType& type, ReduceOp op) {
  const std::size_t count = output.bytes / type.bytes;
  Fingerprint f = Begin(Collective::kAllReduce, &type, count, static_cast<std::uint32_t>(op) + 1, -1);
  f.where[0] = output.heap_offset;
  f.where[1] = input.heap_offset;
  f.address[0] = Published(output.address);
  f.address[1] = Published(input.address);
  const int n = team_.size();
  const int me = team_.me;
  const std::size_t es = type.bytes;
  char* out = static_cast<char*>(output.address);
  const char* in = static_cast<const char*>(input.address);
  if (count > 0 && output.bytes <= OneStepBytes(true)) {   // one sync: every rank reduces every staged copy
    char* stage = team_.StagingHalf(Parity());
    HP_RETURN_IF_ERROR(BeforeOpen(Put(stage, in, output.bytes, me)));
    HP_RETURN_IF_ERROR(Open(f).status());
    return Broken(Reduce(out, stage, count, type, op), "reduce");
  }
  HP_ASSIGN_OR_RETURN(std::vector<Fingerprint> rows, Open(f));
  if (count == 0) return Status::Ok();
  if (SameSymmetric(rows, 0)) {   // two-shot in place: reduce this rank's part from every peer, push it to them
    if (in != out) {   // the peers reduce out of this rank's output: it holds the input first
      HP_RETURN_IF_ERROR(Broken(device_.Copy(out, in, output.bytes, stream_, keep_), "copy"));
      HP_RETURN_IF_ERROR(Sync());
    }
    const auto [lo, hi] = Part(count, n, me);
    if (hi > lo) {
      char* part = out + lo * es;
      HP_RETURN_IF_ERROR(Broken(Reduce(part, part, hi - lo, type, op), "reduce"));
      for (int r = 1; r < n; ++r) HP_RETURN_IF_ERROR(Broken(Put(part, part, (hi - lo) * es, (me + r) % n), "push"));
    }
    return Sync();
  }
  if (EveryAddress(rows, 0) && EveryAddress(rows, 1)) {
    // Two-shot between the tensors: this rank's part of the output reduced out of every rank's input, then the
    // others' parts pulled out of their outputs. An input is read only before the middle sync, and in place only its
    // owner's part of it is written before then.
    const auto [lo, hi] = Part(count, n, me);
    HP_RETURN_IF_ERROR(Broken(ReducePeerMemory(out + lo * es, rows, 1, lo * es, hi - lo, type, op), "reduce"));
    HP_RETURN_IF_ERROR(Sync());
    for (int r = 1; r < n; ++r) {
      const int p = (me + r) % n;
      const auto [plo, phi] = Part(count, n, p);
      if (phi > plo) {
        HP_RETURN_IF_ERROR(Broken(GetPeerMemory(out + plo * es, rows[static_cast<std::size_t>(p)].address[0] + plo * es,
                                                (phi - plo) * es, p),
                                  "pull"));
      }
    }
    return Sync();
  }
  // Staged: each piece of the input is reduced part by part in the ranks' staging areas, then every rank pulls the
  // reduced parts straight into its output.
  const std::size_t piece = team_.staging_bytes() / es;
  char* stage = team_.Staging();
  for (std::size_t off = 0; off < count; off += piece) {
    const std::size_t length = std::min(piece, count - off);
    HP_RETURN_IF_ERROR(Broken(Put(stage, in + off * es, length * es, me), "stage"));
    HP_RETURN_IF_ERROR(Sync());
    const auto [lo, hi] = Part(length, n, me);
    HP_RETURN_IF_ERROR(Broken(Reduce(stage + lo * es, stage + lo * es, hi - lo, type, op), "reduce"));
    HP_RETURN_IF_ERROR(Sync());
    for (int r = 1; r <= n; ++r) {
      const int p = (me + r) % n;
      const auto [plo, phi] = Part(length, n, p);
      if (phi > plo) HP_RETURN_IF_ERROR(Broken(Get(out + (off + plo) * es, stage + plo * es, (phi - plo) * es, p), "pull"));
    }
    HP_RETURN_IF_ERROR(Sync());
  }
  return Status::Ok();
}

Status CollectiveEngine::ReduceScatter(const Buffer& output, const Buffer& input, const ElementType& type, ReduceOp op) {
  const std::size_t es = type.bytes;
  const std::size_t c = output.bytes / es;
  Fingerprint f = Begin(Collective::kReduceScatter, &type, c, static_cast<std::uint32_t>(op) + 1, -1);
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
    return Broken(Reduce(out, stage + static_cast<std::size_t>(me) * c * es, c, type, op), "reduce");
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
  Fingerprint f = Begin(Collective::kAllToAll, &type, un, 0, -1);
  f.where[0] = where;
  const int parity = Parity();
  // This rank's own part never goes through staging: one local copy puts it in place, after the checks (none when
  // the call is in place). Only where the sends overlap the receive buffer some other way does it travel like a
  // peer's part, so that every send is read before its bytes can be overwritten. A local decision: no peer sees it.
  const Buffer& own = sends[static_cast<std::size_t>(me)];
  char* own_place = out + starts[static_cast<std::size_t>(me)];
  const bool own_in_place = own.address == own_place;
  const bool own_direct = own_in_place || !aliased;
  auto place_own = [&]() -> Status {
    if (own_in_place) return Status::Ok();
    return Broken(device_.Copy(own_place, own.address, own.bytes, stream_, keep_), "copy the own part");
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
                              "read the counts"));
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
    if (own_direct) HP_RETURN_IF_ERROR(place_own());
    for (int r = 1; r <= n; ++r) {
      const int i = (me + r) % n;
      if (i == me && own_direct) continue;
      const std::size_t length = static_cast<std::size_t>(table[static_cast<std::size_t>(i)][static_cast<std::size_t>(me)]) * es;
      if (length == 0) continue;
      HP_RETURN_IF_ERROR(Broken(Get(out + starts[static_cast<std::size_t>(i)],
                                    team_.StagingHalf(parity) + static_cast<std::size_t>(i) * eager_region, length, me),
                                "take the eager parts"));
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
    HP_RETURN_IF_ERROR(place_own());
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
  if (own_direct) HP_RETURN_IF_ERROR(place_own());
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

// ---- point to point -----------------------------------------------------------------------------------------------

Status CollectiveEngine::Send(const Buffer& data, int peer) {
  op_name_ = "send";
  if (!team_.broken.empty()) {
    return StateError("team cannot run collectives any more: op=send " + team_.Describe() + " reason=" + team_.broken);
  }
  const std::size_t total = data.bytes;
  const std::size_t payload = team_.mailbox_payload_bytes();
  const int pe = team_.pes[static_cast<std::size_t>(peer)];
  std::uint64_t seq = team_.sent_pieces[static_cast<std::size_t>(peer)];
  const std::uint64_t first = seq + 1;
  const auto* bytes = static_cast<const char*>(data.address);
  for (std::size_t off = 0; off < std::max<std::size_t>(total, 1); off += payload) {
    ++seq;
    auto fail = [&](Status status) {
      if (seq == first) return status;   // nothing of the message left: a retry starts it again
      team_.sent_pieces[static_cast<std::size_t>(peer)] = seq - 1;
      return Broken(status, "send");
    };
    // The piece is free once the receiver took the piece that used it kMailboxPieces pieces ago.
    if (seq > kMailboxPieces) {
      Status free = device_.WaitSignal(team_.Acked(peer), device_.native_signal_width(), CompareOp::kGe,
                                       team_.signal_base + static_cast<std::int64_t>(seq - kMailboxPieces), stream_);
      if (!free.ok()) {
        return fail(Status(free.code(), "send timed out waiting for a peer: " + team_.Describe() + " missing_ranks=[" +
                                            std::to_string(pe) + "] (" + free.message() + ")"));
      }
    }
    char* piece = team_.MailboxPiece(team_.me, static_cast<int>(seq % kMailboxPieces));
    // The header is written into this rank's own copy of the piece (never a destination: no rank sends to itself),
    // then travels heap to heap. The stream must be done with the previous use of that copy.
    if (stream_ != kDefaultStream) HP_RETURN_IF_ERROR(fail(device_.SynchronizeStream(stream_)));
    const std::uint64_t header[2] = {total, seq};
    HP_RETURN_IF_ERROR(fail(device_.CopyToHeap(piece, header, sizeof(header))));
    HP_RETURN_IF_ERROR(fail(Put(piece, piece, sizeof(header), peer)));
    const std::size_t length = std::min(payload, total > off ? total - off : 0);
    const std::size_t at = total <= kMailboxInlineBytes ? sizeof(header) : kMailboxHeaderBytes;
    if (length > 0) HP_RETURN_IF_ERROR(fail(Put(piece + at, bytes + off, length, peer)));
    HP_RETURN_IF_ERROR(fail(device_.Signal(team_.Sent(team_.me), device_.native_signal_width(),
                                           team_.signal_base + static_cast<std::int64_t>(seq), SignalOp::kSet, pe, stream_)));
  }
  team_.sent_pieces[static_cast<std::size_t>(peer)] = seq;
  return Status::Ok();
}

Status CollectiveEngine::Recv(const Buffer& data, int peer) {
  op_name_ = "recv";
  if (!team_.broken.empty()) {
    return StateError("team cannot run collectives any more: op=recv " + team_.Describe() + " reason=" + team_.broken);
  }
  const int pe = team_.pes[static_cast<std::size_t>(peer)];
  const std::size_t payload = team_.mailbox_payload_bytes();
  std::uint64_t seq = team_.received_pieces[static_cast<std::size_t>(peer)] + 1;
  const std::uint64_t first = seq;
  auto wait_piece = [&]() -> Status {
    Status arrived = device_.WaitSignal(team_.Sent(peer), device_.native_signal_width(), CompareOp::kGe,
                                        team_.signal_base + static_cast<std::int64_t>(seq), stream_);
    if (arrived.ok() && stream_ != kDefaultStream) arrived = device_.SynchronizeStream(stream_);
    if (arrived.ok()) return arrived;
    return Status(arrived.code(), "recv timed out waiting for a peer: " + team_.Describe() + " missing_ranks=[" +
                                      std::to_string(pe) + "] (" + arrived.message() + ")");
  };
  auto fail = [&](Status status) {
    if (seq == first) return status;
    return Broken(status, "recv");
  };
  HP_RETURN_IF_ERROR(wait_piece());
  std::uint64_t header[2] = {0, 0};
  HP_RETURN_IF_ERROR(device_.CopyFromHeap(header, team_.MailboxPiece(peer, static_cast<int>(seq % kMailboxPieces)),
                                          sizeof(header)));
  const std::size_t total = header[0];
  const bool fits = total == data.bytes;
  auto* bytes = static_cast<char*>(data.address);
  std::size_t index = 0;
  for (std::size_t off = 0; off < std::max<std::size_t>(total, 1); off += payload, ++index) {
    if (index > 0) {
      ++seq;
      HP_RETURN_IF_ERROR(fail(wait_piece()));
    }
    char* piece = team_.MailboxPiece(peer, static_cast<int>(seq % kMailboxPieces));
    const std::size_t length = std::min(payload, total > off ? total - off : 0);
    const std::size_t at = total <= kMailboxInlineBytes ? sizeof(header) : kMailboxHeaderBytes;   // as Send put it
    if (fits && length > 0) HP_RETURN_IF_ERROR(fail(Get(bytes + off, piece + at, length, team_.me)));
    HP_RETURN_IF_ERROR(fail(device_.Signal(team_.Acked(team_.me), device_.native_signal_width(),
                                           team_.signal_base + static_cast<std::int64_t>(seq), SignalOp::kSet, pe, stream_)));
    team_.received_pieces[static_cast<std::size_t>(peer)] = seq;
  }
  if (!fits) {
    return InvalidArgument("`tensor` must have the " + std::to_string(total) + " bytes rank " + std::to_string(peer) +
                           " sent, but got " + std::to_string(data.bytes) + " bytes");
  }
  return Status::Ok();
}

}  // namespace hp::shmem
