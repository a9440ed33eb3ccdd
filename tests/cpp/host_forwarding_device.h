// A Device of a test's own over the host device: it forwards every call, so that a test overrides only what it
// changes (injected faults, a collective allocation, counters).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/device.h"
#include "runtime/host/host_device.h"

namespace hp::shmem::testutil {

class HostForwardingDevice : public Device {
 public:
  explicit HostForwardingDevice(host::PeerMemory peer_memory = host::PeerMemory::kCrossMemoryAttach)
      : host_(peer_memory) {}
  const char* name() const override { return host_.name(); }
  Status Init(const DeviceInitArgs& args, Bootstrap& bootstrap) override {
    rank_ = args.rank;
    return host_.Init(args, bootstrap);
  }
  Status Finalize() override { return host_.Finalize(); }
  Result<void*> Allocate(std::size_t bytes, std::size_t alignment) override { return host_.Allocate(bytes, alignment); }
  Status Free(void* ptr) override { return host_.Free(ptr); }
  std::size_t ReservedBytes(const void* ptr) const override { return host_.ReservedBytes(ptr); }
  std::uintptr_t heap_base() const override { return host_.heap_base(); }
  std::size_t heap_size() const override { return host_.heap_size(); }
  const std::vector<int>& nodes() const override { return host_.nodes(); }
  Status CopyToHeap(void* dst, const void* src, std::size_t bytes) override { return host_.CopyToHeap(dst, src, bytes); }
  Status StageFromHost(void* dst, const void* src, std::size_t bytes, StreamHandle stream) override {
    return host_.StageFromHost(dst, src, bytes, stream);
  }
  Result<std::uint64_t> ReadLater(const void* src, std::size_t bytes, StreamHandle stream) override {
    return host_.ReadLater(src, bytes, stream);
  }
  Result<bool> TakeRead(std::uint64_t token, void* dst) override { return host_.TakeRead(token, dst); }
  Status CopyFromHeap(void* dst, const void* src, std::size_t bytes) override {
    return host_.CopyFromHeap(dst, src, bytes);
  }
  std::size_t max_transfer_bytes() const override { return host_.max_transfer_bytes(); }
  Status Put(void* dst, const void* src, std::size_t bytes, int pe, StreamHandle stream, KeepAlive keep) override {
    return host_.Put(dst, src, bytes, pe, stream, std::move(keep));
  }
  Status Get(void* dst, const void* src, std::size_t bytes, int pe, StreamHandle stream, KeepAlive keep) override {
    return host_.Get(dst, src, bytes, pe, stream, std::move(keep));
  }
  Status Signal(void* signal, SignalWidth width, std::int64_t value, SignalOp op, int pe,
                StreamHandle stream) override {
    return host_.Signal(signal, width, value, op, pe, stream);
  }
  Status PutWithSignal(void* dst, const void* src, std::size_t bytes, void* signal, SignalWidth width,
                       std::int64_t value, SignalOp op, int pe, StreamHandle stream, KeepAlive keep) override {
    return host_.PutWithSignal(dst, src, bytes, signal, width, value, op, pe, stream, std::move(keep));
  }
  Status WaitSignal(void* signal, SignalWidth width, CompareOp cmp, std::int64_t value,
                    StreamHandle stream) override {
    return host_.WaitSignal(signal, width, cmp, value, stream);
  }
  Status Reduce(void* dst, const void* src, std::size_t count, DataType dtype, ReduceOp op, const std::vector<int>& pes,
                StreamHandle stream, KeepAlive keep) override {
    return host_.Reduce(dst, src, count, dtype, op, pes, stream, std::move(keep));
  }
  Status CheckWireFormat(ops::LowFormat format) const override { return host_.CheckWireFormat(format); }
  Status Encode(ops::LowFormat format, DataType dtype, const void* src, std::size_t count, WireRun dst,
                StreamHandle stream, KeepAlive keep) override {
    return host_.Encode(format, dtype, src, count, dst, stream, std::move(keep));
  }
  Status Decode(ops::LowFormat format, WireRun src, int pe, std::size_t count, DataType dtype, void* out,
                StreamHandle stream, KeepAlive keep) override {
    return host_.Decode(format, src, pe, count, dtype, out, stream, std::move(keep));
  }
  Status ReduceEncoded(ops::LowFormat format, DataType dtype, ReduceOp op, const void* own, WireRun src,
                       const std::vector<int>& pes, std::size_t count, void* out, WireRun reencode,
                       StreamHandle stream, KeepAlive keep) override {
    return host_.ReduceEncoded(format, dtype, op, own, src, pes, count, out, reencode, stream, std::move(keep));
  }
  Status EncodeRows(ops::LowFormat format, DataType dtype, const void* src, std::size_t rows, std::size_t row_elems,
                    void* dst, StreamHandle stream, KeepAlive keep) override {
    return host_.EncodeRows(format, dtype, src, rows, row_elems, dst, stream, std::move(keep));
  }
  Status DecodeRows(ops::LowFormat format, const void* src, std::size_t rows, std::size_t row_elems, DataType dtype,
                    void* out, StreamHandle stream, KeepAlive keep) override {
    return host_.DecodeRows(format, src, rows, row_elems, dtype, out, stream, std::move(keep));
  }
  Result<void*> PeerAddress(const void* symmetric, int pe) const override { return host_.PeerAddress(symmetric, pe); }
  Status Barrier(StreamHandle stream) override { return host_.Barrier(stream); }
  bool arbitrates() const override { return host_.arbitrates(); }
  Status Arrive(void* counter, const std::vector<int>& members, int member) override {
    return host_.Arrive(counter, members, member);
  }
  Status GiveUp(void* counter, const std::vector<int>& members, int member, GiveUpReason reason) override {
    return host_.GiveUp(counter, members, member, reason);
  }
  Status AwaitArrivals(const void* counter, const std::vector<int>& members) override {
    return host_.AwaitArrivals(counter, members);
  }
  Result<std::int64_t> ReadCounter(const void* counter, int pe) override { return host_.ReadCounter(counter, pe); }
  Status Copy(void* dst, const void* src, std::size_t bytes, StreamHandle stream, KeepAlive keep) override {
    return host_.Copy(dst, src, bytes, stream, std::move(keep));
  }
  bool reaches_peer_memory() const override { return host_.reaches_peer_memory(); }
  Status GetPeerMemory(void* dst, std::uint64_t peer_address, std::size_t bytes, int pe, StreamHandle stream,
                       KeepAlive keep) override {
    return host_.GetPeerMemory(dst, peer_address, bytes, pe, stream, std::move(keep));
  }
  Status ReducePeerMemory(void* dst, const std::vector<std::uint64_t>& addresses, const std::vector<int>& pes,
                          std::size_t count, DataType dtype, ReduceOp op, StreamHandle stream, KeepAlive keep) override {
    return host_.ReducePeerMemory(dst, addresses, pes, count, dtype, op, stream, std::move(keep));
  }
  Result<StreamHandle> CreateStream() override { return host_.CreateStream(); }
  Status DestroyStream(StreamHandle stream) override { return host_.DestroyStream(stream); }
  Status SynchronizeStream(StreamHandle stream) override { return host_.SynchronizeStream(stream); }
  Status StreamWaitStream(StreamHandle waiter, StreamHandle waited) override {
    return host_.StreamWaitStream(waiter, waited);
  }
  Status Quiesce() override { return host_.Quiesce(); }

 protected:
  host::HostDevice& host() { return host_; }
  int rank() const { return rank_; }   // from Init

 private:
  host::HostDevice host_;
  int rank_ = -1;
};

}  // namespace hp::shmem::testutil
