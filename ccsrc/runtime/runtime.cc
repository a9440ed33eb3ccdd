// The Runtime's lifecycle: Init and Shutdown (collective), the collective checks of allocation, streams, and the
// debug snapshot (runtime.h). Allocation, the data plane and the teams are in runtime_memory.cc,
// runtime_data_plane.cc and runtime_teams.cc.
#include "runtime/runtime.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "runtime/interrupt.h"
#include "runtime/logging.h"
#include "runtime/transfer.h"

namespace hp::shmem {

namespace {
// How long Shutdown lets the calls that are only passing through leave before it counts those in flight: a call
// that entered just before `closing_` was set, or that `closing_` is refusing right now, is counted until it returns,
// within moments; a wait or a copy stays, and is refused.
constexpr std::chrono::milliseconds kShutdownDrainGrace{250};
}  // namespace

const char* LifecycleStateName(LifecycleState state) {
  switch (state) {
    case LifecycleState::kUninitialized: return "uninitialized";
    case LifecycleState::kInitialized: return "initialized";
    case LifecycleState::kFailed: return "failed";
  }
  return "?";
}

Runtime& Runtime::Instance() {
  static Runtime* runtime = new Runtime();   // never destroyed: deleters may report to it during exit
  return *runtime;
}

LifecycleState Runtime::state() const { return state_.load(); }

std::uint64_t Runtime::lifecycle() const { return lifecycle_.load(); }

Status Runtime::Record(Status status) const {
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(failure_mu_);
    latest_failure_ = status.ToString();
  }
  return status;
}

Status Runtime::RequireInitialized(const char* op) const {
  const LifecycleState state = state_.load();
  if (state == LifecycleState::kInitialized && closing_.load()) {
    return StateError(std::string("shmem runtime is shutting down: op=") + op +
                      " (another thread of this rank is closing it)");
  }
  if (state == LifecycleState::kInitialized) return Status::Ok();
  return StateError(std::string("shmem runtime is not initialised: op=") + op + " state=" + LifecycleStateName(state) +
                    " (call acquire_shmem() first)");
}

Status Runtime::CheckOnNode(int pe, const char* op, bool remote_ok) const {
  if (nodes_[static_cast<std::size_t>(pe)] == nodes_[static_cast<std::size_t>(rank_)]) return Status::Ok();
  const bool remote = device_->reaches_remotely(pe);
  if (remote && remote_ok) return Status::Ok();
  std::string reason;
  if (!remote) {
    reason = std::string("one-sided calls of the ") + device_->name() +
             " device reach the ranks of this rank's node only";
    const std::string absence = device_->remote_absence();
    if (!absence.empty()) reason += ": " + absence;
  } else if (device_->signals_remotely(SignalOp::kAdd)) {
    reason = std::string("the ") + device_->name() + " device reaches other nodes for put, get and signal only: "
             "in-place peer access and reductions need mapped memory";
  } else {
    reason = std::string("the ") + device_->name() + " device reaches other nodes for put, get and signal set only: "
             "signal add and in-place peer access need mapped memory (MTE)";
  }
  return StateError("pe lies on another node (" + reason + "): op=" + op + " pe=" + std::to_string(pe) +
                    " pe_node=" + std::to_string(nodes_[static_cast<std::size_t>(pe)]) + " rank=" +
                    std::to_string(rank_) + " node=" + std::to_string(nodes_[static_cast<std::size_t>(rank_)]));
}

Status Runtime::CheckPe(int pe, const char* what) const {
  if (pe >= 0 && pe < world_size_) return Status::Ok();
  return InvalidArgument(std::string("`") + what + "` must be in [0, " + std::to_string(world_size_) + "), but got " +
                         std::to_string(pe));
}

Status Runtime::Init(const Config& config, std::unique_ptr<Device> device, Bootstrap& bootstrap) {
  std::lock_guard<std::mutex> lock(mu_);
  InterruptsBlocked no_interrupts;   // see interrupt.h
  const LifecycleState state = state_.load();
  if (state != LifecycleState::kUninitialized) {
    return Record(StateError(std::string("shmem runtime cannot be initialised: state=") + LifecycleStateName(state) +
                             " lifecycle=" + std::to_string(lifecycle_.load())));
  }
  if (device == nullptr) return Record(InvalidArgument("`device` must be a device, but got nullptr"));
  const int rank = bootstrap.rank();
  const int world_size = bootstrap.world_size();
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return Record(InvalidArgument("`rank` must be in [0, world_size), but got rank=" + std::to_string(rank) +
                                  " world_size=" + std::to_string(world_size)));
  }
  Logger::SetLevel(config.log_level);
  Logger::SetRank(rank);

  DeviceInitArgs args;
  args.rank = rank;
  args.world_size = world_size;
  args.heap_size = config.heap_size;
  args.timeout_sec = config.timeout_sec;
  HP_RETURN_IF_ERROR(Record(device->Init(args, bootstrap)));

  // The check records live in symmetric memory of their own: the first allocation, identical on every rank.
  const std::size_t control_bytes = 2 * static_cast<std::size_t>(world_size) * sizeof(CheckRecord);
  auto control = device->Allocate(control_bytes, 64);
  Status cleared = control.status();
  if (cleared.ok()) {
    // The heap may be device memory: the records are cleared through the device, never by the host directly.
    const std::vector<char> zeros(control_bytes);
    cleared = device->CopyToHeap(control.value(), zeros.data(), control_bytes);
  }
  if (!cleared.ok()) {
    (void)device->Finalize();
    return Record(cleared);
  }

  rank_ = rank;
  world_size_ = world_size;
  nodes_ = device->nodes();
  node_pes_.clear();
  max_node_size_ = 0;
  for (int pe = 0; pe < world_size; ++pe) {
    const int size = static_cast<int>(std::count(nodes_.begin(), nodes_.end(), nodes_[static_cast<std::size_t>(pe)]));
    max_node_size_ = std::max(max_node_size_, size);
    if (nodes_[static_cast<std::size_t>(pe)] == nodes_[static_cast<std::size_t>(rank)]) node_pes_.push_back(pe);
  }
  config_ = config;
  device_ = std::move(device);
  control_ = control.value();
  check_sequence_ = 0;
  registry_.Reset();
  ++lifecycle_;
  {
    std::lock_guard<std::mutex> failure_lock(failure_mu_);
    latest_failure_.clear();
  }
  // Every rank's control records are zero before anyone writes into them.
  Status ready = device_->Barrier(kDefaultStream);
  if (!ready.ok()) {
    (void)device_->Finalize();
    device_.reset();
    return Record(ready);
  }
  {
    std::lock_guard<std::mutex> identity_lock(identity_mu_);
    identity_ = Identity{rank_, world_size_, device_->name(), device_->heap_base(), device_->heap_size(),
                         device_->ReservedBytes(control_), config_, device_->reaches_peer_memory(), nodes_,
                         Transports(), device_->peer_losses()};
  }
  state_.store(LifecycleState::kInitialized);
  HP_LOG(kInfo, "shmem runtime initialised: lifecycle=" + std::to_string(lifecycle_.load()) + " device=" + device_->name() +
                    " world_size=" + std::to_string(world_size_) + " " + config_.ToString());
  return Status::Ok();
}

void Runtime::QuiesceBeforeCollective() {
  // Queued stream work may still touch memory being freed, or hold a barrier that would otherwise pair with the
  // check exchange's barrier on another rank. A failure there stays with its stream, for its synchronize().
  (void)device_->Quiesce();
}

Result<std::vector<Runtime::CheckRecord>> Runtime::Exchange(CheckRecord mine) {
  mine.sequence = ++check_sequence_;
  // Two slots alternate: a rank writes slot s only after the barrier of the previous exchange, which every rank
  // passes only after reading slot s of the exchange before that.
  const std::size_t slot = mine.sequence & 1;
  char* slot_base = static_cast<char*>(control_) + slot * static_cast<std::size_t>(world_size_) * sizeof(CheckRecord);
  char* my_slot = slot_base + static_cast<std::size_t>(rank_) * sizeof(CheckRecord);
  // The heap may be device memory, which the host cannot touch and device copies need on both sides: the record
  // enters this rank's own slot by a local copy, then travels from there into the same slot of every peer.
  HP_RETURN_IF_ERROR(device_->CopyToHeap(my_slot, &mine, sizeof(mine)));
  for (int pe : node_pes_) {
    if (pe == rank_) continue;
    // Through TransferChunks like every other transfer: the device may carry fewer bytes per call than a record.
    HP_RETURN_IF_ERROR(TransferChunks(sizeof(mine), [&](std::size_t offset, std::size_t n) {
      return device_->Put(my_slot + offset, my_slot + offset, n, pe, kDefaultStream, nullptr);
    }));
  }
  Status arrived = device_->Barrier(kDefaultStream);
  if (!arrived.ok()) {
    return Status(arrived.code(), "collective check did not complete on every rank: rank=" + std::to_string(rank_) +
                                      " " + Describe(mine) + " (" + arrived.message() + ")");
  }
  std::vector<CheckRecord> all(static_cast<std::size_t>(world_size_));
  HP_RETURN_IF_ERROR(device_->CopyFromHeap(all.data(), slot_base, all.size() * sizeof(CheckRecord)));
  for (int r : node_pes_) {
    if (all[static_cast<std::size_t>(r)].sequence != mine.sequence) {
      return Mismatch("ranks are not in the same collective: rank=" + std::to_string(rank_) + " " + Describe(mine) +
                      ", rank=" + std::to_string(r) + " sequence=" +
                      std::to_string(all[static_cast<std::size_t>(r)].sequence) +
                      " (a rank skipped or added an empty/free, or called barrier() instead)");
    }
  }
  return all;
}

std::string Runtime::Describe(const CheckRecord& record) {
  const char* op = record.op == static_cast<std::uint32_t>(CheckOp::kEmpty)      ? "Empty"
                   : record.op == static_cast<std::uint32_t>(CheckOp::kFree)     ? "Free"
                   : record.op == static_cast<std::uint32_t>(CheckOp::kTeamPool) ? "TeamPool"
                                                                                  : "Shutdown";
  std::string text = std::string("op=") + op + " sequence=" + std::to_string(record.sequence);
  if (record.op == static_cast<std::uint32_t>(CheckOp::kShutdown)) {
    return text + " live_allocations=" + std::to_string(record.count) + " in_flight=" + std::to_string(record.in_flight);
  }
  text += " bytes=" + std::to_string(record.bytes);
  if (record.op == static_cast<std::uint32_t>(CheckOp::kEmpty)) text += " alignment=" + std::to_string(record.alignment);
  return text + " offset=" + Hex(record.offset);
}


Result<StreamHandle> Runtime::CreateStream() {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("Stream")));
  auto stream = device_->CreateStream();
  if (!stream.ok()) return Record(stream.status());
  return stream;
}

Status Runtime::DestroyStream(StreamHandle stream) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(RequireInitialized("Stream.destroy"));
  return Record(device_->DestroyStream(stream));
}

Status Runtime::SynchronizeStream(StreamHandle stream) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("synchronize")));
  HP_RETURN_IF_ERROR(Record(device_->SynchronizeStream(stream)));
  return Record(CheckTeams(/*take=*/true));
}

Status Runtime::CheckDeferred() {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(RequireInitialized("check"));
  return Record(CheckTeams(/*take=*/false));
}

Status Runtime::CheckTeams(bool take) {
  Status first;
  for (const std::shared_ptr<Team>& team : teams_.Live()) {
    std::lock_guard<std::mutex> lock(team->mu);
    CollectiveEngine engine(*device_, *team, kDefaultStream, nullptr, CallRole::kForward, config_.strict_checks);
    Status checked = engine.CheckDeferred(take);
    if (!take && checked.ok()) checked = team->deferred_failure;   // kept for the team's next call
    if (first.ok()) first = std::move(checked);
  }
  return first;
}

Status Runtime::StreamWaitStream(StreamHandle waiter, StreamHandle waited) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("wait_stream")));
  return Record(device_->StreamWaitStream(waiter, waited));
}

Status Runtime::Shutdown(Bootstrap& bootstrap) {
  HP_RETURN_IF_ERROR(Record(RequireInitialized("shutdown")));
  std::lock_guard<std::mutex> lock(mu_);
  InterruptsBlocked no_interrupts;   // see interrupt.h
  // 1. From here on, calls of other threads are refused; those already inside are counted below.
  closing_.store(true);
  struct ReopenUnlessDone {
    std::atomic<bool>& closing;
    bool done = false;
    ~ReopenUnlessDone() {
      if (!done) closing.store(false);
    }
  } reopen{closing_};
  QuiesceBeforeCollective();
  const auto drained_by = std::chrono::steady_clock::now() + kShutdownDrainGrace;
  while (in_flight_.load() != 0 && std::chrono::steady_clock::now() < drained_by) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  // 2. Every rank learns every rank's live allocations and calls in flight, and all refuse alike.
  const std::vector<AllocationInfo> live = registry_.Active();
  CheckRecord mine{};
  mine.op = static_cast<std::uint32_t>(CheckOp::kShutdown);
  mine.count = live.size();
  mine.in_flight = in_flight_.load();
  auto exchanged = Exchange(mine);
  if (!exchanged.ok()) return Record(exchanged.status());
  const std::vector<CheckRecord>& all = exchanged.value();
  mine.sequence = check_sequence_;   // Exchange numbered its copy; error messages describe ours
  std::string holders;
  std::string busy;
  for (int r : node_pes_) {
    const CheckRecord& theirs = all[static_cast<std::size_t>(r)];
    if (theirs.op != mine.op) {
      return Record(Mismatch("ranks are not all shutting down: rank=" + std::to_string(rank_) + " " + Describe(mine) +
                             ", rank=" + std::to_string(r) + " " + Describe(theirs)));
    }
    if (theirs.count != 0) holders += " rank" + std::to_string(r) + "=" + std::to_string(theirs.count);
    if (theirs.in_flight != 0) busy += " rank" + std::to_string(r) + "=" + std::to_string(theirs.in_flight);
  }
  if (!busy.empty()) {
    // Unmapping the heap under a wait or a copy of another thread would crash it.
    return Record(StateError("shutdown refused: calls of other threads are still running (wait for them, then "
                             "close again): in_flight:" + busy));
  }
  if (!holders.empty()) {
    std::string list;
    for (const AllocationInfo& info : live) list += (list.empty() ? "" : ", ") + DescribeAllocation(info);
    return Record(StateError("shutdown refused: live allocations remain (free them, then close again):" + holders +
                             " local=[" + list + "]"));
  }
  for (const AllocationInfo& info : registry_.Leaked()) {
    HP_LOG(kWarning, "shutting down with a leaked allocation: " + DescribeAllocation(info));
  }
  // 3. Release the device on every rank together.
  HP_RETURN_IF_ERROR(Record(bootstrap.Barrier()));
  reopen.done = true;   // past this point the lifecycle ends either way
  teams_.Clear();
  Status finalized = device_->Finalize();
  if (!finalized.ok()) {
    state_.store(LifecycleState::kFailed);
    closing_.store(false);
    return Record(Status(finalized.code(), "device finalize failed, the runtime cannot be used again: " +
                                               finalized.message()));
  }
  device_.reset();
  control_ = nullptr;
  teams_.Clear();
  team_pool_ = nullptr;
  registry_.Reset();
  state_.store(LifecycleState::kUninitialized);
  closing_.store(false);
  {
    std::lock_guard<std::mutex> identity_lock(identity_mu_);
    identity_ = Identity{};
    identity_.config = config_;
  }
  HP_LOG(kInfo, "shmem runtime shut down: lifecycle=" + std::to_string(lifecycle_.load()));
  return Status::Ok();
}

std::vector<std::string> Runtime::Transports() const {
  std::vector<std::string> transports;
  for (int pe = 0; pe < world_size_; ++pe) {
    if (nodes_[static_cast<std::size_t>(pe)] == nodes_[static_cast<std::size_t>(rank_)]) {
      transports.emplace_back(pe == rank_ ? "self" : "node");
    } else {
      transports.push_back(device_->reaches_remotely(pe) ? device_->remote_transport() : "none");
    }
  }
  return transports;
}

DebugSnapshot Runtime::Snapshot() const {
  // Not mu_: a collective holds it while it waits, and diagnostics matter most exactly then.
  DebugSnapshot snapshot;
  Identity identity;
  {
    std::lock_guard<std::mutex> identity_lock(identity_mu_);
    snapshot.state = state_.load();
    identity = identity_;
  }
  snapshot.lifecycle = lifecycle_.load();
  snapshot.config = identity.config;
  snapshot.rank = identity.rank;
  snapshot.world_size = identity.world_size;
  snapshot.device = identity.device;
  snapshot.heap_base = identity.heap_base;
  snapshot.heap_size = identity.heap_size;
  snapshot.reaches_peer_memory = identity.reaches_peer_memory;
  snapshot.nodes = identity.nodes;
  snapshot.transports = identity.transports;
  if (identity.losses != nullptr) {
    for (int pe : identity.losses->pes()) snapshot.transports[static_cast<std::size_t>(pe)] = "lost";
  }
  snapshot.allocated = registry_.allocated_bytes();
  const std::size_t used = snapshot.allocated + identity.internal_reserved;
  snapshot.remaining = snapshot.heap_size > used ? snapshot.heap_size - used : 0;
  snapshot.max_allocated = registry_.max_allocated_bytes();
  snapshot.active = registry_.Active();
  snapshot.leaked = registry_.Leaked();
  snapshot.in_flight = in_flight_.load();
  snapshot.live_teams = teams_.live_teams();
  std::lock_guard<std::mutex> failure_lock(failure_mu_);
  snapshot.latest_failure = latest_failure_;
  return snapshot;
}

Result<std::optional<ops::LowFormat>> Runtime::LowPrecisionDefault() const {
  Config config;
  bool active = false;
  {
    std::lock_guard<std::mutex> identity_lock(identity_mu_);
    active = state_.load() == LifecycleState::kInitialized;
    if (active) config = identity_.config;
  }
  if (!active) {
    HP_ASSIGN_OR_RETURN(config, ParseConfig(ProcessEnv()));
  }
  return hp::shmem::LowPrecisionDefault(config);
}

}  // namespace hp::shmem
