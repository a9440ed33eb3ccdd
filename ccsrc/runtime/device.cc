// What every device shares: the names of the interface's enums, the own-heap check, and the refusals of devices
// that do not arbitrate (device.h).
#include "runtime/device.h"

#include <utility>

#include "runtime/logging.h"

namespace hp::shmem {

const char* SignalOpName(SignalOp op) { return op == SignalOp::kSet ? "set" : "add"; }

const char* CompareOpName(CompareOp op) {
  switch (op) {
    case CompareOp::kEq: return "eq";
    case CompareOp::kNe: return "ne";
    case CompareOp::kGt: return "gt";
    case CompareOp::kGe: return "ge";
    case CompareOp::kLt: return "lt";
    case CompareOp::kLe: return "le";
  }
  return "?";
}

Status CheckInOwnHeap(const Device& device, const void* address, std::size_t bytes, const char* what) {
  const std::uintptr_t base = device.heap_base();
  const std::uintptr_t end = base + device.heap_size();
  const auto from = reinterpret_cast<std::uintptr_t>(address);
  if (from >= base && from <= end && bytes <= end - from) return Status::Ok();
  return InvalidArgument(std::string("`") + what + "` must lie inside this rank's symmetric heap [" + Hex(base) + "," +
                         Hex(end) + "), but got [" + Hex(from) + "," + Hex(from + bytes) + ")");
}

const char* GiveUpReasonName(GiveUpReason reason) {
  switch (reason) {
    case GiveUpReason::kTimeout: return "timed out";
    case GiveUpReason::kInterrupted: return "was interrupted";
    case GiveUpReason::kFailed: return "failed";
  }
  return "?";
}

Status Device::PutWithSignal(void* symmetric_dst, const void* src, std::size_t bytes, void* symmetric_signal,
                             SignalWidth width, std::int64_t value, SignalOp op, int pe, StreamHandle stream,
                             KeepAlive keep) {
  if (bytes > 0) HP_RETURN_IF_ERROR(Put(symmetric_dst, src, bytes, pe, stream, std::move(keep)));
  return Signal(symmetric_signal, width, value, op, pe, stream);
}

namespace {
Status NoArbitration(const Device& device, const char* op) {
  return StateError(std::string("device does not arbitrate syncs (its host cannot reach the heaps atomically): op=") +
                    op + " device=" + device.name());
}
}  // namespace

Status Device::Arrive(void*, const std::vector<int>&, int) { return NoArbitration(*this, "Arrive"); }

// Devices that defer the engine's checks (those that do not arbitrate) implement these; the others never need them.
Status Device::StageFromHost(void*, const void*, std::size_t, StreamHandle) {
  return StateError(std::string("device has no stream-ordered host staging: op=StageFromHost device=") + name());
}
Result<std::uint64_t> Device::ReadLater(const void*, std::size_t, StreamHandle) {
  return StateError(std::string("device has no stream-ordered host reads: op=ReadLater device=") + name());
}
Result<bool> Device::TakeRead(std::uint64_t, void*) {
  return StateError(std::string("device has no stream-ordered host reads: op=TakeRead device=") + name());
}
Status Device::GiveUp(void*, const std::vector<int>&, int, GiveUpReason) { return NoArbitration(*this, "GiveUp"); }
Status Device::AwaitArrivals(const void*, const std::vector<int>&) { return NoArbitration(*this, "AwaitArrivals"); }
Result<std::int64_t> Device::ReadCounter(const void*, int) { return NoArbitration(*this, "ReadCounter"); }

}  // namespace hp::shmem
