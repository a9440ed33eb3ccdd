#include "runtime/runtime.h"

#include <algorithm>

#include "runtime/interrupt.h"
#include "runtime/logging.h"
#include "runtime/transfer.h"

namespace hp::shmem {

const char* LifecycleStateName(LifecycleState state) {
  switch (state) {
    case LifecycleState::kUninitialized: return "uninitialized";
    case LifecycleState::kInitialized: return "initialized";
    case LifecycleState::kFailed: return "failed";
  }
  return "?";
}

namespace {
bool IsPowerOfTwo(std::size_t v) { return v != 0 && (v & (v - 1)) == 0; }

Status CheckSameBytes(std::size_t dst_bytes, std::size_t src_bytes) {
  if (src_bytes == dst_bytes) return Status::Ok();
  return InvalidArgument("`src` must have as many bytes as `dst` (" + std::to_string(dst_bytes) + "), but got " +
                         std::to_string(src_bytes));
}

std::string DescribeAllocation(const AllocationInfo& info) {
  return "allocation_id=" + std::to_string(info.id) + " base=" + Hex(info.base) + " bytes=" + std::to_string(info.bytes);
}
}  // namespace

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
  const std::string reason =
      remote ? std::string("the ") + device_->name() + " device reaches other nodes for put, get and signal set only: "
                   "signal add and in-place peer access need mapped memory (MTE)"
             : std::string("one-sided calls of the ") + device_->name() +
                   " device reach the ranks of this rank's node only";
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
                         device_->ReservedBytes(control_), config_, device_->reaches_peer_memory(), nodes_};
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

Result<AllocationInfo> Runtime::Allocate(std::size_t bytes, std::size_t alignment, std::string call_site) {
  HP_RETURN_IF_ERROR(Record(RequireInitialized("empty")));
  if (alignment == 0) alignment = HeapAllocator::kMinAlignment;
  if (!IsPowerOfTwo(alignment)) {
    return Record(InvalidArgument("`alignment` must be a power of two, but got " + std::to_string(alignment)));
  }
  if (alignment > HeapAllocator::kMaxAlignment) {
    return Record(InvalidArgument("`alignment` must be at most " + std::to_string(HeapAllocator::kMaxAlignment) +
                                  " (2 MiB), but got " + std::to_string(alignment)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  InterruptsBlocked no_interrupts;   // see interrupt.h
  QuiesceBeforeCollective();
  if (device_->collective_allocation()) {
    // The device's allocation ends in a barrier of its own (CANN SHMEM's malloc): agree on the request first, so
    // that a rank that refuses never leaves its peers inside that barrier (bounded by the device, not by us).
    CheckRecord request{};
    request.op = static_cast<std::uint32_t>(CheckOp::kEmpty);
    request.status = static_cast<std::int32_t>(device_->CheckAllocate(bytes, alignment).code());
    request.bytes = bytes;
    request.alignment = alignment;
    auto requests = Exchange(request);
    if (!requests.ok()) return Record(requests.status());
    request.sequence = check_sequence_;
    for (int r : node_pes_) {
      const CheckRecord& theirs = requests.value()[static_cast<std::size_t>(r)];
      if (theirs.status != 0) {
        Status refused = r == rank_ ? device_->CheckAllocate(bytes, alignment)
                                    : Status(static_cast<StatusCode>(theirs.status),
                                             "symmetric allocation refused on another rank before the device "
                                             "allocated: rank=" + std::to_string(r) + " status=" +
                                                 StatusCodeName(static_cast<StatusCode>(theirs.status)) + " " +
                                                 Describe(theirs));
        return Record(refused);
      }
      if (theirs.bytes != bytes || theirs.alignment != alignment) {
        return Record(Mismatch("ranks disagree on a symmetric allocation: rank=" + std::to_string(rank_) + " " +
                               Describe(request) + ", rank=" + std::to_string(r) + " " + Describe(theirs)));
      }
    }
  }
  auto local = device_->Allocate(bytes, alignment);
  const std::uintptr_t heap_base = device_->heap_base();
  CheckRecord mine{};
  mine.op = static_cast<std::uint32_t>(CheckOp::kEmpty);
  mine.status = static_cast<std::int32_t>(local.status().code());
  mine.bytes = bytes;
  mine.alignment = alignment;
  mine.offset = local.ok() ? reinterpret_cast<std::uintptr_t>(local.value()) - heap_base : 0;
  auto undo = [&] {
    if (local.ok()) (void)device_->Free(local.value());
  };

  auto all = Exchange(mine);
  if (!all.ok()) {
    undo();
    return Record(all.status());
  }
  mine.sequence = check_sequence_;   // Exchange numbered its copy; error messages describe ours
  if (!local.ok()) return Record(local.status());
  for (int r : node_pes_) {
    const CheckRecord& theirs = all.value()[static_cast<std::size_t>(r)];
    if (theirs.status != 0) {
      undo();
      return Record(Status(static_cast<StatusCode>(theirs.status),
                           "symmetric allocation failed on another rank: rank=" + std::to_string(r) +
                               " status=" + StatusCodeName(static_cast<StatusCode>(theirs.status)) + " " +
                               Describe(theirs)));
    }
    if (theirs.op != mine.op || theirs.bytes != mine.bytes || theirs.alignment != mine.alignment ||
        theirs.offset != mine.offset) {
      undo();
      return Record(Mismatch("ranks disagree on a symmetric allocation: rank=" + std::to_string(rank_) + " " +
                             Describe(mine) + ", rank=" + std::to_string(r) + " " + Describe(theirs)));
    }
  }
  AllocationInfo info;
  info.base = reinterpret_cast<std::uintptr_t>(local.value());
  info.offset = mine.offset;
  info.bytes = bytes;
  info.reserved = device_->ReservedBytes(local.value());
  info.lifecycle = lifecycle_;
  info.call_site = std::move(call_site);
  info.id = registry_.Register(info.lifecycle, info.base, info.offset, info.bytes, info.reserved, info.call_site);
  HP_LOG(kDebug, "op=Empty " + DescribeAllocation(info) + " offset=" + Hex(info.offset) +
                     " call_site=" + (info.call_site.empty() ? "?" : info.call_site));
  return info;
}

Status Runtime::Free(std::uint64_t allocation_id, const std::string& call_site) {
  HP_RETURN_IF_ERROR(Record(RequireInitialized("free")));
  std::lock_guard<std::mutex> lock(mu_);
  InterruptsBlocked no_interrupts;   // see interrupt.h
  auto found = registry_.Get(allocation_id);
  if (!found.ok()) return Record(found.status());
  AllocationInfo info = std::move(found).value();
  if (info.state != AllocationState::kActive) {
    return Record(StateError(std::string("allocation is not active: allocation_id=") + std::to_string(allocation_id) +
                             " state=" + AllocationStateName(info.state)));
  }
  QuiesceBeforeCollective();
  CheckRecord mine{};
  mine.op = static_cast<std::uint32_t>(CheckOp::kFree);
  mine.bytes = info.bytes;
  mine.offset = info.offset;
  auto exchanged = Exchange(mine);
  if (!exchanged.ok()) return Record(exchanged.status());
  const std::vector<CheckRecord>& all = exchanged.value();
  mine.sequence = check_sequence_;   // Exchange numbered its copy; error messages describe ours
  for (int r : node_pes_) {
    const CheckRecord& theirs = all[static_cast<std::size_t>(r)];
    if (theirs.op != mine.op || theirs.bytes != mine.bytes || theirs.offset != mine.offset) {
      return Record(Mismatch("ranks disagree on a symmetric free: rank=" + std::to_string(rank_) + " " +
                             Describe(mine) + ", rank=" + std::to_string(r) + " " + Describe(theirs)));
    }
  }
  HP_RETURN_IF_ERROR(Record(registry_.MarkFreed(allocation_id).status()));
  HP_RETURN_IF_ERROR(Record(device_->Free(reinterpret_cast<void*>(info.base))));
  HP_LOG(kDebug, "op=Free " + DescribeAllocation(info) + " offset=" + Hex(info.offset) +
                     " call_site=" + (call_site.empty() ? "?" : call_site));
  return Status::Ok();
}

void Runtime::OnStorageReleased(std::uint64_t allocation_id, bool storage_alive) {
  if (!registry_.MarkStorageReleased(allocation_id)) return;
  auto info = registry_.Get(allocation_id);
  std::string what = "allocation_id=" + std::to_string(allocation_id);
  if (info.ok()) what = DescribeAllocation(info.value());
  const char* how = storage_alive ? "symmetric allocation leaked: its tensor was moved to other memory "
                                    "(share_memory_(), torch.multiprocessing or set_()) before shmem.free(): "
                                  : "symmetric allocation leaked: its last tensor died without shmem.free(): ";
  HP_LOG(kError, how + what +
                     " root_rank=" + std::to_string(rank_) +
                     (info.ok() && !info->call_site.empty() ? " call_site=" + info->call_site : std::string()));
}

Result<SymmetricRange> Runtime::ResolveSymmetric(const void* address, std::size_t bytes, const char* what) const {
  HP_ASSIGN_OR_RETURN(AllocationInfo found, registry_.FindActive(reinterpret_cast<std::uintptr_t>(address), bytes, what));
  return SymmetricRange{found.id, const_cast<void*>(address), bytes};
}

Status Runtime::TransferChunks(std::size_t bytes, const std::function<Status(std::size_t, std::size_t)>& fn) {
  return ForEachChunk(bytes, device_->max_transfer_bytes(), [&](const Chunk& chunk) { return fn(chunk.offset, chunk.bytes); });
}

Status Runtime::CheckTransfer(const char* op, int pe, std::size_t dst_bytes, std::size_t src_bytes,
                              const void* symmetric, const char* symmetric_name) const {
  HP_RETURN_IF_ERROR(RequireInitialized(op));
  HP_RETURN_IF_ERROR(CheckPe(pe, "pe"));
  HP_RETURN_IF_ERROR(CheckOnNode(pe, op, /*remote_ok=*/true));
  HP_RETURN_IF_ERROR(CheckSameBytes(dst_bytes, src_bytes));
  return ResolveSymmetric(symmetric, dst_bytes, symmetric_name).status();
}

Status Runtime::CheckSignal(const void* symmetric_signal, SignalWidth width) const {
  const auto bytes = static_cast<std::size_t>(width);
  HP_RETURN_IF_ERROR(ResolveSymmetric(symmetric_signal, bytes, "signal_tensor").status());
  if (reinterpret_cast<std::uintptr_t>(symmetric_signal) % bytes != 0) {   // atomics and futexes need it
    return InvalidArgument("`signal_tensor` must be aligned to " + std::to_string(bytes) + " bytes, but got address " +
                           Hex(reinterpret_cast<std::uintptr_t>(symmetric_signal)));
  }
  return Status::Ok();
}

Status Runtime::Put(const void* symmetric_dst, const void* src, std::size_t dst_bytes, std::size_t src_bytes, int pe,
                    StreamHandle stream, KeepAlive keep) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(CheckTransfer("put", pe, dst_bytes, src_bytes, symmetric_dst, "dst")));
  auto* to = static_cast<char*>(const_cast<void*>(symmetric_dst));
  const auto* from = static_cast<const char*>(src);
  return Record(TransferChunks(dst_bytes, [&](std::size_t offset, std::size_t n) {
    return device_->Put(to + offset, from + offset, n, pe, stream, keep);
  }));
}

Status Runtime::Get(void* dst, const void* symmetric_src, std::size_t dst_bytes, std::size_t src_bytes, int pe,
                    StreamHandle stream, KeepAlive keep) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(CheckTransfer("get", pe, dst_bytes, src_bytes, symmetric_src, "src")));
  auto* to = static_cast<char*>(dst);
  const auto* from = static_cast<const char*>(symmetric_src);
  return Record(TransferChunks(dst_bytes, [&](std::size_t offset, std::size_t n) {
    return device_->Get(to + offset, from + offset, n, pe, stream, keep);
  }));
}

Status Runtime::Signal(const void* symmetric_signal, SignalWidth width, std::int64_t value, SignalOp op, int pe,
                       StreamHandle stream) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("signal")));
  HP_RETURN_IF_ERROR(Record(CheckPe(pe, "pe")));
  HP_RETURN_IF_ERROR(Record(CheckOnNode(pe, "signal", /*remote_ok=*/op == SignalOp::kSet)));
  HP_RETURN_IF_ERROR(Record(CheckSignal(symmetric_signal, width)));
  return Record(device_->Signal(const_cast<void*>(symmetric_signal), width, value, op, pe, stream));
}

Status Runtime::WaitSignal(const void* symmetric_signal, SignalWidth width, CompareOp cmp, std::int64_t value,
                           StreamHandle stream) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("wait_signal")));
  HP_RETURN_IF_ERROR(Record(CheckSignal(symmetric_signal, width)));
  return Record(device_->WaitSignal(const_cast<void*>(symmetric_signal), width, cmp, value, stream));
}

Status Runtime::CheckReduce(const void* dst, std::size_t dst_bytes, const void* symmetric_src, std::size_t src_bytes,
                            DataType dtype, ReduceOp op, const std::vector<int>& pes) const {
  HP_RETURN_IF_ERROR(RequireInitialized("reduce"));
  if (pes.empty()) return InvalidArgument("`pes` must name at least one pe, but got none");
  for (std::size_t i = 0; i < pes.size(); ++i) {
    if (!CheckPe(pes[i], "pes").ok()) return CheckPe(pes[i], ("pes[" + std::to_string(i) + "]").c_str());
    HP_RETURN_IF_ERROR(CheckOnNode(pes[i], "reduce"));
    for (std::size_t j = 0; j < i; ++j) {
      if (pes[j] == pes[i]) {
        return InvalidArgument("`pes` must be distinct, but got " + std::to_string(pes[i]) + " at positions " +
                               std::to_string(j) + " and " + std::to_string(i));
      }
    }
  }
  HP_RETURN_IF_ERROR(CheckSameBytes(dst_bytes, src_bytes));
  const std::size_t element = DataTypeSize(dtype);
  if (src_bytes % element != 0) {
    return InvalidArgument(std::string("`src` must hold whole ") + DataTypeName(dtype) + " elements (" +
                           std::to_string(element) + " bytes each), but got " + std::to_string(src_bytes) + " bytes");
  }
  if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) {
    return InvalidArgument(std::string("`op` must be sum, max or min for ") + DataTypeName(dtype) + ", but got avg");
  }
  HP_RETURN_IF_ERROR(ResolveSymmetric(symmetric_src, src_bytes, "src").status());
  const auto to = reinterpret_cast<std::uintptr_t>(dst);
  const auto from = reinterpret_cast<std::uintptr_t>(symmetric_src);
  if (to != from && to < from + src_bytes && from < to + dst_bytes) {
    // In place works because a block of dst is written after its sources are read; a shifted dst would read
    // what it has already written.
    return InvalidArgument("`dst` must be `src` itself or not overlap it, but got bytes [" + Hex(to) + "," +
                           Hex(to + dst_bytes) + ") against src [" + Hex(from) + "," + Hex(from + src_bytes) + ")");
  }
  return Status::Ok();
}

Status Runtime::Reduce(void* dst, std::size_t dst_bytes, const void* symmetric_src, std::size_t src_bytes,
                       DataType dtype, ReduceOp op, const std::vector<int>& pes, StreamHandle stream, KeepAlive keep) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(CheckReduce(dst, dst_bytes, symmetric_src, src_bytes, dtype, op, pes)));
  if (dst_bytes == 0) return Status::Ok();
  return Record(device_->Reduce(dst, symmetric_src, dst_bytes / DataTypeSize(dtype), dtype, op, pes, stream,
                                std::move(keep)));
}

Result<void*> Runtime::PeerAddress(const void* symmetric, std::size_t bytes, int pe, const char* what) const {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("peer_tensor")));
  HP_RETURN_IF_ERROR(Record(CheckPe(pe, "pe")));
  HP_RETURN_IF_ERROR(Record(CheckOnNode(pe, "peer_tensor")));
  HP_RETURN_IF_ERROR(Record(ResolveSymmetric(symmetric, bytes, what).status()));
  Result<void*> peer = device_->PeerAddress(symmetric, pe);
  if (!peer.ok()) return Record(peer.status());
  return peer;
}

Status Runtime::Barrier(StreamHandle stream) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("barrier")));
  return Record(device_->Barrier(stream));
}

Buffer Runtime::Resolve(const void* address, std::size_t bytes) const {
  Buffer buffer{const_cast<void*>(address), bytes, -1};
  // Ordinary tensors lie outside the heap: they are told apart without the registry's lock.
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  const std::uintptr_t base = device_->heap_base();
  if (bytes == 0 || at < base || at - base >= device_->heap_size()) return buffer;
  if (registry_.ContainsActive(at, bytes)) buffer.heap_offset = static_cast<std::int64_t>(at - base);
  return buffer;
}

Status Runtime::ReserveTeamPool() {
  std::lock_guard<std::mutex> lock(mu_);
  if (teams_.ready()) return Status::Ok();
  QuiesceBeforeCollective();
  const TeamPoolLayout layout = TeamPoolLayout::For(device_->heap_size(), max_node_size_);
  auto local = device_->Allocate(layout.total_bytes, 4096);
  CheckRecord mine{};
  mine.op = static_cast<std::uint32_t>(CheckOp::kTeamPool);
  mine.status = static_cast<std::int32_t>(local.status().code());
  mine.bytes = layout.total_bytes;
  mine.alignment = 4096;
  mine.offset = local.ok() ? reinterpret_cast<std::uintptr_t>(local.value()) - device_->heap_base() : 0;
  auto undo = [&] {
    if (local.ok()) (void)device_->Free(local.value());
  };
  auto all = Exchange(mine);
  if (!all.ok()) {
    undo();
    return all.status();
  }
  mine.sequence = check_sequence_;
  for (int r : node_pes_) {
    const CheckRecord& theirs = all.value()[static_cast<std::size_t>(r)];
    if (theirs.status != 0) {
      undo();
      return Status(static_cast<StatusCode>(theirs.status),
                    "team pool does not fit the symmetric heap: rank=" + std::to_string(r) + " pool_bytes=" +
                        std::to_string(layout.total_bytes) + " heap_size=" + std::to_string(device_->heap_size()) +
                        " (raise HYPER_PARALLEL_SHMEM_HEAP_SIZE)");
    }
    if (theirs.op != mine.op || theirs.bytes != mine.bytes || theirs.offset != mine.offset) {
      undo();
      return Mismatch("ranks disagree on the team pool: rank=" + std::to_string(rank_) + " " + Describe(mine) +
                      ", rank=" + std::to_string(r) + " " + Describe(theirs));
    }
  }
  // Cleared through the device (the heap may be device memory), a piece at a time; the creation's exchange that
  // follows orders it before any peer writes into it.
  const std::vector<char> zeros(std::min<std::size_t>(layout.total_bytes, 1 << 20));
  for (std::size_t off = 0; off < layout.total_bytes; off += zeros.size()) {
    Status cleared = device_->CopyToHeap(static_cast<char*>(local.value()) + off, zeros.data(),
                                         std::min(zeros.size(), layout.total_bytes - off));
    if (!cleared.ok()) {
      undo();
      return cleared;
    }
  }
  team_pool_ = local.value();
  teams_.Reset(team_pool_, layout, lifecycle_.load(), node_pes_);
  {
    std::lock_guard<std::mutex> identity_lock(identity_mu_);
    identity_.internal_reserved += device_->ReservedBytes(team_pool_);
  }
  return Status::Ok();
}

Result<std::uint64_t> Runtime::CreateTeam(const std::vector<int>& pes, Bootstrap& bootstrap) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("team_create")));
  const auto n = static_cast<int>(pes.size());
  if (n == 0) return Record(InvalidArgument("`pes` must name at least one pe, but got none"));
  for (int i = 0; i < n; ++i) {
    const int pe = pes[static_cast<std::size_t>(i)];
    HP_RETURN_IF_ERROR(Record(CheckPe(pe, ("pes[" + std::to_string(i) + "]").c_str())));
    if (nodes_[static_cast<std::size_t>(pe)] != nodes_[static_cast<std::size_t>(rank_)]) {
      return Record(InvalidArgument(std::string("`pes` must lie on this rank's node (") + device_->name() +
                                    " device: a team's members map each other's heaps), but got pes[" +
                                    std::to_string(i) + "]=" + std::to_string(pe) + " on node " +
                                    std::to_string(nodes_[static_cast<std::size_t>(pe)]) + ", this rank (" +
                                    std::to_string(rank_) + ") on node " +
                                    std::to_string(nodes_[static_cast<std::size_t>(rank_)])));
    }
    for (int j = 0; j < i; ++j) {
      if (pes[static_cast<std::size_t>(j)] == pe) {
        return Record(InvalidArgument("`pes` must be distinct, but got " + std::to_string(pe) + " at positions " +
                                      std::to_string(j) + " and " + std::to_string(i)));
      }
    }
  }
  if (bootstrap.world_size() != n || bootstrap.rank() < 0 || bootstrap.rank() >= n ||
      pes[static_cast<std::size_t>(bootstrap.rank())] != rank_) {
    return Record(InvalidArgument("`pes` must list this rank (" + std::to_string(rank_) + ") at the group rank of its "
                                  "bootstrap (" + std::to_string(bootstrap.rank()) + " of " +
                                  std::to_string(bootstrap.world_size()) + "), but got " + std::to_string(n) + " pes"));
  }
  if (!teams_.ready()) {
    if (pes != node_pes_) {
      return Record(StateError("the root team must be created first: op=team_create group_size=" + std::to_string(n) +
                               " root_size=" + std::to_string(world_size_) + " node_size=" +
                               std::to_string(node_pes_.size()) +
                               " (create the team of every rank of the node, in root order, on every rank first)"));
    }
    HP_RETURN_IF_ERROR(Record(ReserveTeamPool()));
  }
  InterruptsBlocked no_interrupts;   // the bootstrap takes Python's lock: see interrupt.h
  auto team = teams_.Create(*device_, pes, bootstrap.rank(), bootstrap);
  if (!team.ok()) return Record(team.status());
  return team.value()->id;
}

Status Runtime::ReleaseTeam(std::uint64_t team) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("team_release")));
  return Record(teams_.Release(*device_, team));
}

Result<std::shared_ptr<Team>> Runtime::LiveTeam(std::uint64_t team, const char* op) const {
  HP_RETURN_IF_ERROR(RequireInitialized(op));
  return teams_.Find(team);
}

Result<TeamView> Runtime::DescribeTeam(std::uint64_t team) const {
  auto found = LiveTeam(team, "team");
  if (!found.ok()) return Record(found.status());
  const Team& t = *found.value();
  return TeamView{t.pes, t.me, t.slot, t.staging_bytes()};
}

// Runs `body` on the live team with its lock held, counted as a call in flight.
#define HP_WITH_TEAM(team_id, op, engine, stream, keep, role)             \
  OperationScope scope(*this);                                            \
  auto hp_found = LiveTeam(team_id, op);                                  \
  if (!hp_found.ok()) return Record(hp_found.status());                   \
  std::lock_guard<std::mutex> hp_team_lock(hp_found.value()->mu);         \
  CollectiveEngine engine(*device_, *hp_found.value(), stream, keep, role)

// The first failed check of a collective is refused collectively (every member fails with it); none runs `call`.
#define HP_REFUSE_IF_ERROR(engine, collective, check)                      \
  do {                                                                     \
    ::hp::shmem::Status hp_check_ = (check);                               \
    if (!hp_check_.ok()) return Record((engine).Refuse((collective), hp_check_)); \
  } while (0)

namespace {
ElementType ReducibleType(DataType dtype) {
  ElementType type;
  type.name = DataTypeName(dtype);
  type.bytes = DataTypeSize(dtype);
  type.reducible = true;
  type.reduce_type = dtype;
  return type;
}

Status CheckReduceOp(DataType dtype, ReduceOp op) {
  if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) {
    return InvalidArgument(std::string("`op` must be sum, max or min for ") + DataTypeName(dtype) + ", but got avg");
  }
  return Status::Ok();
}

// The wire format must apply to the reduction and be one the device carries.
Status CheckWire(const Device& device, std::optional<ops::LowFormat> wire, DataType dtype, ReduceOp op) {
  if (!wire.has_value()) return Status::Ok();
  const std::string refusal = ops::LowFormatRefusal(*wire, dtype, op);
  if (!refusal.empty()) {
    return InvalidArgument("`low_precision_dtype` must be " + refusal + " (dtype=" + DataTypeName(dtype) +
                           " op=" + ReduceOpName(op) + "), but got " + ops::LowFormatName(*wire));
  }
  return device.CheckWireFormat(*wire);
}

Status CheckWholeElements(std::size_t bytes, DataType dtype, const char* what) {
  if (bytes % DataTypeSize(dtype) == 0) return Status::Ok();
  return InvalidArgument(std::string("`") + what + "` must hold whole " + DataTypeName(dtype) + " elements, but got " +
                         std::to_string(bytes) + " bytes");
}

Status CheckAllGather(const Team& team, const void* output, std::size_t output_bytes, const void* input,
                      std::size_t input_bytes) {
  const auto n = static_cast<std::size_t>(team.size());
  const std::size_t expected = input_bytes * n;
  if (expected / n != input_bytes || output_bytes != expected) {
    return InvalidArgument("`output` must have group_size * input bytes (" + std::to_string(n) + " * " +
                           std::to_string(input_bytes) + " = " + std::to_string(expected) + "), but got " +
                           std::to_string(output_bytes));
  }
  const auto* out = static_cast<const char*>(output);
  const auto* in = static_cast<const char*>(input);
  const char* slot = out + static_cast<std::size_t>(team.me) * input_bytes;
  if (in != slot && in < out + output_bytes && out < in + input_bytes) {
    // Peers write every other part while this rank still reads its input: only its own part is safe in place.
    return InvalidArgument("`input` must not overlap `output` except as this rank's own part (offset " +
                           std::to_string(slot - out) + "), but got an input at offset " + std::to_string(in - out) +
                           " of the output");
  }
  return Status::Ok();
}

Status CheckAllReduce(const Device& device, const void* tensor, std::size_t bytes, DataType dtype, ReduceOp op,
                      std::optional<ops::LowFormat> wire, const void* input) {
  HP_RETURN_IF_ERROR(CheckReduceOp(dtype, op));
  HP_RETURN_IF_ERROR(CheckWire(device, wire, dtype, op));
  HP_RETURN_IF_ERROR(CheckWholeElements(bytes, dtype, "tensor"));
  const auto* out = static_cast<const char*>(tensor);
  const auto* in = input == nullptr ? out : static_cast<const char*>(input);
  if (in != out && in < out + bytes && out < in + bytes) {
    return InvalidArgument("`input` must be `tensor` itself or not overlap it, but got an overlap at byte " +
                           std::to_string(in < out ? out - in : in - out));
  }
  return Status::Ok();
}

Status CheckReduceScatter(const Device& device, const Team& team, const void* output, std::size_t output_bytes,
                          const void* input, std::size_t input_bytes, DataType dtype, ReduceOp op,
                          std::optional<ops::LowFormat> wire) {
  HP_RETURN_IF_ERROR(CheckReduceOp(dtype, op));
  HP_RETURN_IF_ERROR(CheckWire(device, wire, dtype, op));
  HP_RETURN_IF_ERROR(CheckWholeElements(output_bytes, dtype, "output"));
  const auto n = static_cast<std::size_t>(team.size());
  if (input_bytes != n * output_bytes) {
    return InvalidArgument("`input` must have group_size * output bytes (" + std::to_string(n) + " * " +
                           std::to_string(output_bytes) + "), but got " + std::to_string(input_bytes));
  }
  const auto* out = static_cast<const char*>(output);
  const auto* in = static_cast<const char*>(input);
  const char* mine = in + static_cast<std::size_t>(team.me) * output_bytes;
  if (out != mine && out < in + input_bytes && in < out + output_bytes) {
    return InvalidArgument("`output` must be this rank's part of `input` or not overlap it, but got an overlap "
                           "at byte " + std::to_string(out - in) + " of the input");
  }
  return Status::Ok();
}

Status CheckAllToAll(const Team& team, const std::vector<std::pair<const void*, std::size_t>>& sends,
                     std::size_t receive_bytes, const std::vector<std::uint64_t>& receive_counts,
                     const ElementType& type) {
  const auto n = static_cast<std::size_t>(team.size());
  if (sends.size() != n || receive_counts.size() != n) {
    return InvalidArgument("`sends` and `receive_counts` must have one entry per group rank (" + std::to_string(n) +
                           "), but got " + std::to_string(sends.size()) + " and " +
                           std::to_string(receive_counts.size()));
  }
  std::uint64_t total = 0;
  for (std::uint64_t c : receive_counts) total += c;
  if (total * type.bytes > receive_bytes) {
    return InvalidArgument("`sum(receive_counts)` must fit the receive buffer (" +
                           std::to_string(receive_bytes / type.bytes) + " elements), but got " + std::to_string(total));
  }
  for (std::size_t j = 0; j < n; ++j) {
    if (sends[j].second % type.bytes != 0) {
      return InvalidArgument("`sends[" + std::to_string(j) + "]` must hold whole " + type.name + " elements, but got " +
                             std::to_string(sends[j].second) + " bytes");
    }
  }
  return Status::Ok();
}

Status CheckPeer(const Team& team, int peer) {
  if (peer >= 0 && peer < team.size() && peer != team.me) return Status::Ok();
  return InvalidArgument("`peer` must be another group rank in [0, " + std::to_string(team.size()) +
                         ") than this one (" + std::to_string(team.me) + "), but got " + std::to_string(peer));
}
}  // namespace

Status Runtime::TeamBarrier(std::uint64_t team, StreamHandle stream, CallRole role) {
  HP_WITH_TEAM(team, "team_barrier", engine, stream, nullptr, role);
  return Record(engine.Barrier());
}

Status Runtime::AllGather(std::uint64_t team, void* output, std::size_t output_bytes, const void* input,
                          std::size_t input_bytes, const ElementType& type, StreamHandle stream, KeepAlive keep,
                          CallRole role) {
  HP_WITH_TEAM(team, "all_gather", engine, stream, std::move(keep), role);
  HP_REFUSE_IF_ERROR(engine, Collective::kAllGather,
                     CheckAllGather(*hp_found.value(), output, output_bytes, input, input_bytes));
  return Record(engine.AllGather(Resolve(output, output_bytes), Resolve(input, input_bytes), type));
}

Status Runtime::AllReduce(std::uint64_t team, void* tensor, std::size_t bytes, DataType dtype, ReduceOp op,
                          StreamHandle stream, KeepAlive keep, std::optional<ops::LowFormat> wire, const void* input,
                          CallRole role) {
  HP_WITH_TEAM(team, "all_reduce", engine, stream, std::move(keep), role);
  HP_REFUSE_IF_ERROR(engine, Collective::kAllReduce, CheckAllReduce(*device_, tensor, bytes, dtype, op, wire, input));
  const Buffer values = Resolve(input == nullptr ? tensor : input, bytes);
  if (wire.has_value()) {
    return Record(engine.AllReduceLowPrecision(Resolve(tensor, bytes), values, ReducibleType(dtype), op, *wire));
  }
  return Record(engine.AllReduce(Resolve(tensor, bytes), values, ReducibleType(dtype), op));
}

Status Runtime::ReduceScatter(std::uint64_t team, void* output, std::size_t output_bytes, const void* input,
                              std::size_t input_bytes, DataType dtype, ReduceOp op, StreamHandle stream,
                              KeepAlive keep, std::optional<ops::LowFormat> wire, CallRole role) {
  HP_WITH_TEAM(team, "reduce_scatter", engine, stream, std::move(keep), role);
  HP_REFUSE_IF_ERROR(engine, Collective::kReduceScatter,
                     CheckReduceScatter(*device_, *hp_found.value(), output, output_bytes, input, input_bytes, dtype,
                                        op, wire));
  if (wire.has_value()) {
    return Record(engine.ReduceScatterLowPrecision(Resolve(output, output_bytes), Resolve(input, input_bytes),
                                                   ReducibleType(dtype), op, *wire));
  }
  return Record(engine.ReduceScatter(Resolve(output, output_bytes), Resolve(input, input_bytes), ReducibleType(dtype), op));
}

Status Runtime::AllToAll(std::uint64_t team, const std::vector<std::pair<const void*, std::size_t>>& sends,
                         void* receive, std::size_t receive_bytes, const std::vector<std::uint64_t>& receive_counts,
                         const ElementType& type, StreamHandle stream, KeepAlive keep, CallRole role) {
  HP_WITH_TEAM(team, "all_to_all", engine, stream, std::move(keep), role);
  HP_REFUSE_IF_ERROR(engine, Collective::kAllToAll,
                     CheckAllToAll(*hp_found.value(), sends, receive_bytes, receive_counts, type));
  std::vector<Buffer> buffers;
  buffers.reserve(sends.size());
  for (const auto& send : sends) buffers.push_back(Buffer{const_cast<void*>(send.first), send.second, -1});
  return Record(engine.AllToAll(buffers, Resolve(receive, receive_bytes), receive_counts, type));
}

Status Runtime::Send(std::uint64_t team, const void* data, std::size_t bytes, const ElementType& type, int peer,
                     StreamHandle stream, KeepAlive keep) {
  HP_WITH_TEAM(team, "send", engine, stream, std::move(keep), CallRole::kForward);
  HP_RETURN_IF_ERROR(Record(CheckPeer(*hp_found.value(), peer)));
  return Record(engine.Send(Buffer{const_cast<void*>(data), bytes, -1}, peer, type));
}

Status Runtime::Recv(std::uint64_t team, void* data, std::size_t bytes, const ElementType& type, int peer,
                     StreamHandle stream, KeepAlive keep) {
  HP_WITH_TEAM(team, "recv", engine, stream, std::move(keep), CallRole::kForward);
  HP_RETURN_IF_ERROR(Record(CheckPeer(*hp_found.value(), peer)));
  return Record(engine.Recv(Buffer{data, bytes, -1}, peer, type));
}

Result<std::vector<std::vector<std::int64_t>>> Runtime::Agree(std::uint64_t team, const Fingerprint& fingerprint,
                                                              const std::vector<std::int64_t>& values,
                                                              StreamHandle stream) {
  HP_WITH_TEAM(team, "agree", engine, stream, nullptr, static_cast<CallRole>(fingerprint.role));
  const std::size_t limit = 2 * static_cast<std::size_t>(max_node_size_) + 1;
  if (values.size() > limit) {
    return Record(engine.Refuse(static_cast<Collective>(fingerprint.collective),
                                InvalidArgument("`values` must have at most " + std::to_string(limit) +
                                                " entries, but got " + std::to_string(values.size()))));
  }
  auto rows = engine.Agree(fingerprint, values);
  if (!rows.ok()) return Record(rows.status());
  return rows;
}

Status Runtime::Refuse(std::uint64_t team, Collective collective, const Status& refusal, StreamHandle stream,
                       CallRole role) {
  if (refusal.ok()) return Record(InvalidArgument("`refusal` must be a failure, but got OK"));
  HP_WITH_TEAM(team, "refuse", engine, stream, nullptr, role);
  return Record(engine.Refuse(collective, refusal));
}

Status Runtime::GiveUp(std::uint64_t team, const Status& why) {
  if (why.ok()) return Record(InvalidArgument("`why` must be a failure, but got OK"));
  HP_WITH_TEAM(team, "give_up", engine, kDefaultStream, nullptr, CallRole::kForward);
  return Record(engine.GiveUp(why));
}

#undef HP_REFUSE_IF_ERROR
#undef HP_WITH_TEAM

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
  return Record(device_->SynchronizeStream(stream));
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

}  // namespace hp::shmem
