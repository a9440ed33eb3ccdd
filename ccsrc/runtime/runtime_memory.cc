// The Runtime's symmetric allocations: collective and checked on every rank (runtime.h).
#include "runtime/runtime.h"

#include "runtime/interrupt.h"
#include "runtime/logging.h"

namespace hp::shmem {

namespace {
bool IsPowerOfTwo(std::size_t v) { return v != 0 && (v & (v - 1)) == 0; }
}  // namespace

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

Buffer Runtime::Resolve(const void* address, std::size_t bytes) const {
  Buffer buffer{const_cast<void*>(address), bytes, -1};
  // Ordinary tensors lie outside the heap: they are told apart without the registry's lock.
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  const std::uintptr_t base = device_->heap_base();
  if (bytes == 0 || at < base || at - base >= device_->heap_size()) return buffer;
  if (registry_.ContainsActive(at, bytes)) buffer.heap_offset = static_cast<std::int64_t>(at - base);
  return buffer;
}

}  // namespace hp::shmem
