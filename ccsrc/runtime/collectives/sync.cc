// The engine's protocol: numbering calls, the first sync that carries every member's fingerprint, the syncs
// after it, and what a failure does to the team (collectives/engine.h).

#include <cstring>

#include "runtime/collectives/engine.h"

namespace hp::shmem {

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

}  // namespace hp::shmem
