// The engine's protocol: numbering calls, the first sync that carries every member's fingerprint, the syncs after
// it, and what a failure does to the team (collectives/engine.h, docs/engine.md).

#include <algorithm>
#include <cstring>

#include "runtime/collectives/engine.h"
#include "runtime/collectives/paths.h"

namespace hp::shmem {

using collectives::StatementBytes;

// ---- calls --------------------------------------------------------------------------------------------------------

Result<Fingerprint> CollectiveEngine::Begin(Collective collective, const ElementType* type, std::uint64_t count,
                                            std::uint32_t reduce_op, std::int32_t peer) {
  op_name_ = CollectiveName(collective);
  if (Deferred()) HP_RETURN_IF_ERROR(CheckDeferred(/*take=*/true));   // an earlier call's verdict, now it is in
  if (!team_.broken.empty()) {
    return StateError("team cannot run collectives any more: op=" + std::string(op_name()) + " " + team_.Describe() +
                      " reason=" + team_.broken);
  }
  if (team_.given_up_epoch != 0) {
    // The last call ended at a sync some member gave up. Every member fails there, but a member may still be inside
    // the call before it (reading this rank's staging or tensors): this call writes nothing before all have arrived.
    const Status all = device_.AwaitArrivals(team_.Arrivals(team_.given_up_epoch), team_.pes);
    if (!all.ok()) {
      team_.broken = "a member never reached a given-up call (" + all.message() + ")";
      return Status(all.code(), "team is out of step: op=" + std::string(op_name()) + " " + team_.Describe() +
                                    " (a member never reached the call given up before this one: " + all.message() +
                                    "); create a new group");
    }
    team_.given_up_epoch = 0;
  }
  Fingerprint f{};
  f.sequence = ++team_.sequence;
  f.collective = static_cast<std::uint32_t>(collective);
  f.reduce_op = reduce_op;
  f.wire = kWireFull;
  f.peer = peer;
  f.count = count;
  f.role = static_cast<std::uint32_t>(role_);
  if (type != nullptr) {
    f.element_bytes = type->bytes;
    std::strncpy(f.dtype, type->name.c_str(), sizeof(f.dtype) - 1);
  }
  for (std::int64_t& w : f.where) w = -1;
  return f;
}

Status CollectiveEngine::Barrier() {
  HP_ASSIGN_OR_RETURN(Fingerprint f, Begin(Collective::kBarrier, nullptr, 0, 0, -1));
  return Open(f).status();
}

Status CollectiveEngine::Refuse(Collective collective, const Status& refusal) {
  auto begun = Begin(collective, nullptr, 0, 0, -1);
  if (!begun.ok()) return refusal;   // the team runs no call any more: nobody waits for this one
  return RefuseCall(begun.value(), refusal);
}

Status CollectiveEngine::RefuseCall(Fingerprint f, const Status& refusal) {
  f.refusal = static_cast<std::int32_t>(refusal.code());
  const Status reported = Open(f, nullptr, &refusal.message()).status();
  if (!reported.ok()) return reported;
  if (Deferred()) {   // the members learn of it from their deferred checks
    return Status(refusal.code(), refusal.message() + " (refused by rank " + std::to_string(team_.my_pe()) + ": op=" +
                                      op_name() + " " + team_.Describe() + "; every member fails this call)");
  }
  return Internal("a refused call passed its first sync: op=" + std::string(op_name()));
}

Status CollectiveEngine::GiveUp(const Status& why) {
  op_name_ = "give_up";
  if (!team_.broken.empty()) return why;   // nobody waits at a sync of this team any more
  if (team_.given_up_epoch != 0) {
    // The counter of the next sync is zeroed by the first member when it reaches the given-up one: wait for that.
    const Status all = device_.AwaitArrivals(team_.Arrivals(team_.given_up_epoch), team_.pes);
    if (!all.ok()) {
      team_.broken = "a member never reached a given-up call (" + all.message() + ")";
      return why;
    }
    team_.given_up_epoch = 0;
  }
  // Between calls: the next sync is the next call's first, whose number this rank takes too.
  ++team_.sequence;
  const Status given = GiveUpNext(GiveUpReason::kFailed, why.message());
  if (!given.ok()) team_.broken = "giving up a sync failed (" + given.message() + ")";
  return why;
}

std::size_t CollectiveEngine::AgreeCapacity(int node_size, int team_size, std::size_t staging_bytes) {
  const std::size_t half = staging_bytes / 2;
  const std::size_t staged = half / static_cast<std::size_t>(std::max(team_size, 1)) / sizeof(std::int64_t);
  return std::max(AgreeCountRowValues(node_size), staged);
}

Result<std::vector<std::vector<std::int64_t>>> CollectiveEngine::Agree(Fingerprint fingerprint,
                                                                      const std::vector<std::int64_t>& values) {
  HP_ASSIGN_OR_RETURN(const Fingerprint f, Begin(static_cast<Collective>(fingerprint.collective), nullptr,
                                                 fingerprint.count, fingerprint.reduce_op, fingerprint.peer));
  fingerprint.sequence = f.sequence;
  if (fingerprint.role == static_cast<std::uint32_t>(CallRole::kForward)) fingerprint.role = f.role;
  fingerprint.refusal = 0;
  for (std::int64_t& w : fingerprint.where) w = -1;
  const int n = team_.size();
  const std::size_t bytes = values.size() * sizeof(std::int64_t);
  // Values beyond the count row travel through the staging half of the call's parity, a region per member (the
  // one-step all_gather's rule for the half): each member writes its own region before the sync and pulls the
  // peers' regions into its own half after it, so that a rank writes only its own heap.
  const bool staged = values.size() > AgreeCountRowValues(team_.layout->world_size);
  char* half = team_.StagingHalf(Parity());
  auto region = [&](int r) { return half + static_cast<std::size_t>(r) * bytes; };
  if (staged) {
    HP_RETURN_IF_ERROR(BeforeOpen(device_.arbitrates()
                                      ? device_.CopyToHeap(region(team_.me), values.data(), bytes)
                                      : device_.StageFromHost(region(team_.me), values.data(), bytes, stream_)));
  }
  HP_RETURN_IF_ERROR(OpenNow(fingerprint, staged ? nullptr : &values).status());   // the values go back to the host now
  std::vector<std::int64_t> table;
  if (staged) {
    for (int r = 1; r < n; ++r) {
      const int p = (team_.me + r) % n;
      HP_RETURN_IF_ERROR(Broken(Get(region(p), region(p), bytes, p), "pull the published values", Next::kCallEnd));
    }
    if (stream_ != kDefaultStream) {
      HP_RETURN_IF_ERROR(Broken(device_.SynchronizeStream(stream_), "pull the published values", Next::kCallEnd));
    }
    table.resize(static_cast<std::size_t>(n) * values.size());
    HP_RETURN_IF_ERROR(Broken(device_.CopyFromHeap(table.data(), half, table.size() * sizeof(std::int64_t)),
                              "read the published values", Next::kCallEnd));
  }
  std::vector<std::vector<std::int64_t>> rows(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto& row = rows[static_cast<std::size_t>(r)];
    if (staged) {
      const auto first = table.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * values.size());
      row.assign(first, first + static_cast<std::ptrdiff_t>(values.size()));
      continue;
    }
    row.resize(values.size());
    HP_RETURN_IF_ERROR(Broken(device_.CopyFromHeap(row.data(), team_.CountRow(Parity(), r), bytes),
                              "read the published values", Next::kCallEnd));
  }
  return rows;
}

// ---- syncs --------------------------------------------------------------------------------------------------------

Status CollectiveEngine::Disseminate() {
  const int n = team_.size();
  const int parity = static_cast<int>(team_.epoch & 1);
  const std::int64_t value = SignalValue(team_.epoch);
  for (int distance = 1, round = 0; distance < n; distance *= 2, ++round) {
    const int to = (team_.me + distance) % n;
    // A word is written again two epochs later, only after this rank read it: equality survives the 32-bit wrap.
    HP_RETURN_IF_ERROR(device_.Signal(team_.Dissemination(round, parity), device_.native_signal_width(), value,
                                      SignalOp::kSet, team_.pes[static_cast<std::size_t>(to)], stream_));
    HP_RETURN_IF_ERROR(device_.WaitSignal(team_.Dissemination(round, parity), device_.native_signal_width(),
                                          CompareOp::kEq, value, stream_));
  }
  return Status::Ok();
}

Status CollectiveEngine::Arrive() {
  if (!device_.arbitrates()) return Disseminate();
  // Syncs run on the calling thread: the stream's earlier steps must be done (and a failed one gives the sync up).
  if (stream_ != kDefaultStream) {
    const Status earlier = device_.SynchronizeStream(stream_);
    if (!earlier.ok()) {
      (void)device_.GiveUp(team_.Arrivals(team_.epoch), team_.pes, team_.me, GiveUpReason::kFailed);
      return earlier;
    }
  }
  if (team_.me == 0) {
    // The counter of sync epoch + 1 was last used by sync epoch - 2, which every member has passed: this member is
    // past sync epoch - 1, which needed everyone. Nobody counts on it before this sync completes.
    const std::int64_t zero = 0;
    HP_RETURN_IF_ERROR(device_.CopyToHeap(team_.Arrivals(team_.epoch + 1), &zero, sizeof(zero)));
  }
  return device_.Arrive(team_.Arrivals(team_.epoch), team_.pes, team_.me);
}

Status CollectiveEngine::GiveUpNext(GiveUpReason reason, const std::string& why) {
  ++team_.epoch;
  if (!device_.arbitrates()) {
    team_.broken = std::string(op_name()) + " " + GiveUpReasonName(reason) + " (" + why + ")";
    return Status::Ok();
  }
  // The statement first, in every member's copy: a member that sees the mark reads it in its own heap.
  const std::vector<char> text = StatementBytes(why);
  char* mine = team_.Statement(static_cast<int>(team_.epoch & 1), team_.me);
  Status told = device_.CopyToHeap(mine, text.data(), text.size());
  for (int r = 1; r < team_.size() && told.ok(); ++r) {
    told = Put(mine, mine, text.size(), (team_.me + r) % team_.size());
  }
  if (told.ok() && stream_ != kDefaultStream) told = device_.SynchronizeStream(stream_);
  const Status given = device_.GiveUp(team_.Arrivals(team_.epoch), team_.pes, team_.me, reason);
  team_.given_up_epoch = team_.epoch;
  return given.ok() ? told : given;
}

std::string CollectiveEngine::MissingRanks(int parity, std::int64_t epoch_value) {
  const int n = team_.size();
  std::vector<Fingerprint> rows(static_cast<std::size_t>(n));
  if (!device_.CopyFromHeap(rows.data(), team_.FingerprintRow(parity, 0), rows.size() * sizeof(Fingerprint)).ok()) {
    return "?";
  }
  std::string missing;
  for (int r = 0; r < n; ++r) {
    if (static_cast<std::int64_t>(rows[static_cast<std::size_t>(r)].epoch) != epoch_value) {
      missing += (missing.empty() ? "" : ",") + std::to_string(team_.pes[static_cast<std::size_t>(r)]);
    }
  }
  return missing;
}

std::string CollectiveEngine::StatementOf(int rank) {
  std::vector<char> text(kStatementBytes, '\0');
  if (!device_.CopyFromHeap(text.data(), team_.Statement(static_cast<int>(team_.epoch & 1), rank), text.size()).ok()) {
    return "?";
  }
  text.back() = '\0';
  return std::string(text.data());
}

Status CollectiveEngine::SyncFailed(const Status& status, bool first) {
  const std::string where = first ? "its first sync" : "a sync";
  if (!device_.arbitrates()) {
    team_.broken = std::string(op_name()) + " failed at " + where + ": " + status.message();
    return Status(status.code(), std::string(op_name()) + " failed at " + where + ": " + team_.Describe() + " (" +
                                     status.message() + "); the team is out of step: create a new one");
  }
  // The sync is given up for every member (by this rank, or by the one the device names): every member fails this
  // call, and each one's next call waits for all to have arrived here.
  team_.given_up_epoch = team_.epoch;
  std::string detail = status.message();
  if (status.code() == StatusCode::kStateError) {   // another member gave it up: say why, in its own words
    const auto word = device_.ReadCounter(team_.Arrivals(team_.epoch), team_.pes.front());
    if (word.ok() && ArrivalCounter::GivenUp(word.value()) &&
        ArrivalCounter::Reason(word.value()) == GiveUpReason::kFailed) {
      const int member = ArrivalCounter::Member(word.value());
      if (member >= 0 && member < team_.size()) detail += ": " + StatementOf(member);
    }
    return StateError(std::string(op_name()) + " was given up by a member at " + where + ": " + team_.Describe() +
                      " (" + detail + "); it fails on every member, and the team runs on from the next call");
  }
  if (status.code() == StatusCode::kTimeout || status.code() == StatusCode::kInterrupted) {
    if (first) {
      detail = "missing_ranks=[" + MissingRanks(static_cast<int>(team_.epoch & 1), SignalValue(team_.epoch)) +
               "] (" + detail + ")";
    }
    return Status(status.code(), std::string(op_name()) + (status.code() == StatusCode::kTimeout ? " timed out" : " was interrupted") +
                                     " at " + where + ": " + team_.Describe() + " epoch=" + std::to_string(team_.epoch) +
                                     " " + detail + "; it fails on every member, and the team runs on from the next "
                                     "call once every member has reached this one");
  }
  return Status(status.code(), std::string(op_name()) + " failed at " + where + ": " + team_.Describe() + " (" + detail +
                                   "); it fails on every member");
}

Result<std::vector<Fingerprint>> CollectiveEngine::Open(Fingerprint fingerprint, const std::vector<std::int64_t>* counts,
                                                        const std::string* statement) {
  if (!Deferred()) return OpenNow(fingerprint, counts, statement);
  HP_RETURN_IF_ERROR(OpenDeferred(fingerprint, counts, statement));
  return std::vector<Fingerprint>{};
}

Status CollectiveEngine::PublishCall(Fingerprint& fingerprint, const std::vector<std::int64_t>* counts,
                                     const std::string* statement, bool in_stream_order) {
  const int n = team_.size();
  ++team_.epoch;
  fingerprint.epoch = static_cast<std::uint64_t>(SignalValue(team_.epoch));
  const int parity = static_cast<int>(team_.epoch & 1);
  Fingerprint* row = team_.FingerprintRow(parity, team_.me);
  std::int64_t* count_row = team_.CountRow(Parity(), team_.me);
  char* said = team_.Statement(parity, team_.me);
  // Into this rank's own tables from host memory: now, or where the stream reaches it.
  auto own = [&](void* symmetric_dst, const void* host_src, std::size_t bytes) {
    return in_stream_order ? device_.StageFromHost(symmetric_dst, host_src, bytes, stream_)
                           : device_.CopyToHeap(symmetric_dst, host_src, bytes);
  };
  Status published;
  if (statement != nullptr) {
    const std::vector<char> text = StatementBytes(*statement);
    published = own(said, text.data(), text.size());
  }
  if (published.ok() && counts != nullptr) published = own(count_row, counts->data(), counts->size() * sizeof(std::int64_t));
  if (published.ok()) published = own(row, &fingerprint, sizeof(fingerprint));
  // Then into every peer's, heap to heap (the heap may be device memory).
  for (int r = 1; r < n && published.ok(); ++r) {
    const int peer = (team_.me + r) % n;
    if (statement != nullptr) published = Put(said, said, kStatementBytes, peer);
    if (published.ok() && counts != nullptr) {
      published = Put(count_row, count_row, counts->size() * sizeof(std::int64_t), peer);
    }
    if (published.ok()) published = Put(row, row, sizeof(Fingerprint), peer);
  }
  return published;
}

Result<std::vector<Fingerprint>> CollectiveEngine::OpenNow(Fingerprint fingerprint,
                                                           const std::vector<std::int64_t>* counts,
                                                           const std::string* statement) {
  // 1. This rank's call, numbered and copied into its own tables now, then put into every peer's.
  const Status published = PublishCall(fingerprint, counts, statement, /*in_stream_order=*/false);
  const int n = team_.size();
  const int parity = static_cast<int>(team_.epoch & 1);
  if (!published.ok()) {
    --team_.epoch;   // GiveUpNext gives this sync up
    (void)GiveUpNext(GiveUpReason::kFailed, std::string(op_name()) + " could not publish its call: " + published.message());
    return SyncFailed(published, /*first=*/true);
  }
  // 2. Once through the sync, every member has published.
  Status arrived = Arrive();
  if (arrived.ok() && stream_ != kDefaultStream) arrived = device_.SynchronizeStream(stream_);
  if (!arrived.ok()) return SyncFailed(arrived, /*first=*/true);
  // 3. Every member's call: all ranks see the same table, so all decide alike. A refusal first (the lowest group
  //    rank's), then the first member whose call differs from this one's.
  std::vector<Fingerprint> rows(static_cast<std::size_t>(n));
  HP_RETURN_IF_ERROR(Broken(device_.CopyFromHeap(rows.data(), team_.FingerprintRow(parity, 0), rows.size() * sizeof(Fingerprint)),
                            "read the fingerprints", Next::kUnknown));
  for (int r = 0; r < n; ++r) {
    const Fingerprint& theirs = rows[static_cast<std::size_t>(r)];
    if (theirs.refusal == 0) continue;
    return Status(static_cast<StatusCode>(theirs.refusal),
                  StatementOf(r) + " (refused by rank " + std::to_string(team_.pes[static_cast<std::size_t>(r)]) +
                      ": op=" + op_name() + " " + team_.Describe() + "; every member fails this call)");
  }
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
  if (status.ok()) return status;
  // Peers are on their way into this call's first sync: give it up for them, so they fail now instead of waiting.
  (void)GiveUpNext(GiveUpReason::kFailed, std::string(op_name()) + " failed before its first sync: " + status.message());
  return Status(status.code(), std::string(op_name()) + " failed before its first sync: " + team_.Describe() + " (" +
                                   status.message() + "); it fails on every member");
}

Status CollectiveEngine::Sync() {
  ++team_.epoch;
  const Status arrived = Arrive();
  return arrived.ok() ? arrived : SyncFailed(arrived, /*first=*/false);
}

Status CollectiveEngine::Broken(Status status, const char* step, Next next) {
  if (status.ok()) return status;
  const std::string what = std::string(op_name()) + " failed after every rank had entered it (" + step + ")";
  if (next == Next::kCallEnd) {
    // No sync of this call is left: the peers learn of it at the next call's first sync, which this rank gives up
    // in that call's place (it takes that call's number too).
    ++team_.sequence;
  }
  const Status given = GiveUpNext(GiveUpReason::kFailed, what + ": " + status.message());
  if (!given.ok()) team_.broken = what + " and giving up the next sync failed (" + given.message() + ")";
  if (next == Next::kUnknown) team_.broken = what + ": " + status.message();
  return Status(status.code(), what + ": " + team_.Describe() + " (" + status.message() + ")" +
                                   (device_.arbitrates() ? "; it fails on every member"
                                                         : "; the team is out of step: create a new one"));
}

}  // namespace hp::shmem
