// The ascend device: symmetric memory on Ascend NPUs through CANN SHMEM v1.5.1 (pinned in
// third_party/shmem_patches/). This header is free of CANN headers, so that callers (the binding's device factory,
// tests) need no CANN include path; only ascend_device.cc and cann_*.cc include CANN.
//
// Initialisation needs no fixed port: rank 0 asks CANN for a unique id, the bootstrap broadcasts it, and every rank
// initialises CANN SHMEM with it (ACLSHMEMX_INIT_WITH_UNIQUEID). The config store's TLS is decided before that:
// on with HYPER_PARALLEL_SHMEM_TLS_INFO, off otherwise (one WARNING line says so).
//
// The NPU the caller had selected (aclrtGetDevice) and its SoC name are frozen at Init; every later call made
// with another current device fails ("current device must be npu:0 (fixed at acquire_shmem), but got npu:1").
//
// Streams: a StreamHandle is an aclrtStream. Calls on an explicit handle (the binding passes the torch_npu current
// stream) are only enqueued: stream order is the completion guarantee, failures surface at SynchronizeStream.
// kDefaultStream is a stream this device creates at Init; a call on it completes before it returns (the device
// synchronizes it, bounded by the timeout), as the runtime's own uses of the default stream (the init barrier, the
// collective checks) expect. Buffers kept alive for an enqueued call are released at that stream's next successful
// synchronization.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "runtime/device.h"

namespace hp::shmem::ascend {

struct AscendDeviceOptions {
  // The CANN SHMEM copy kernels take a uint32_t byte count (v1.5.1, src/device/gm2gm/shmemi_device_rma.cpp): one
  // call carries at most this much (a power of two, so chunks keep their alignment); the runtime splits the rest.
  static constexpr std::size_t kCannMaxTransferBytes = std::size_t{1} << 31;

  // HYPER_PARALLEL_SHMEM_TLS_INFO: TLS settings of CANN's config store (memfabric's format). Empty: TLS off.
  std::string tls_info;
  std::size_t max_transfer_bytes = kCannMaxTransferBytes;
};

class AscendDevice final : public Device {
 public:
  // CANN maps the heap in pages of 2 MiB: Init rounds the heap size up to a multiple of it.
  static constexpr std::size_t kHeapPageBytes = std::size_t{2} << 20;

  explicit AscendDevice(AscendDeviceOptions options = {});
  ~AscendDevice() override;

  const char* name() const override { return "ascend"; }
  Status Init(const DeviceInitArgs& args, Bootstrap& bootstrap) override;
  Status Finalize() override;

  Result<void*> Allocate(std::size_t bytes, std::size_t alignment) override;
  Status Free(void* ptr) override;
  std::size_t ReservedBytes(const void* ptr) const override;
  std::uintptr_t heap_base() const override { return heap_base_; }
  std::size_t heap_size() const override { return heap_size_; }
  // aclrtMemcpy (host to device, device to host): the heap is NPU memory that the host cannot dereference.
  Status CopyToHeap(void* symmetric_dst, const void* host_src, std::size_t bytes) override;
  Status CopyFromHeap(void* host_dst, const void* symmetric_src, std::size_t bytes) override;
  std::size_t max_transfer_bytes() const override { return options_.max_transfer_bytes; }

  Status Put(void* symmetric_dst, const void* src, std::size_t bytes, int pe, StreamHandle stream,
             KeepAlive keep) override;
  Status Get(void* dst, const void* symmetric_src, std::size_t bytes, int pe, StreamHandle stream,
             KeepAlive keep) override;
  Status Signal(void* symmetric_signal, SignalWidth width, std::int64_t value, SignalOp op, int pe,
                StreamHandle stream) override;
  Status WaitSignal(void* symmetric_signal, SignalWidth width, CompareOp cmp, std::int64_t value,
                    StreamHandle stream) override;
  // Not available: reductions need the AscendC reduction kernel, which this build does not compile.
  Status Reduce(void* dst, const void* symmetric_src, std::size_t count, DataType dtype, ReduceOp op,
                const std::vector<int>& pes, StreamHandle stream, KeepAlive keep) override;
  Status Barrier(StreamHandle stream) override;

  Result<StreamHandle> CreateStream() override;
  Status DestroyStream(StreamHandle stream) override;
  Status SynchronizeStream(StreamHandle stream) override;
  Status StreamWaitStream(StreamHandle waiter, StreamHandle waited) override;
  Status Quiesce() override;

  // aclshmem_ptr: the address of `symmetric`'s heap offset on `pe`, which the NPU reaches directly.
  Result<void*> PeerAddress(const void* symmetric, int pe) const override;

  int device_id() const { return device_id_; }            // frozen at Init (-1 before)
  const std::string& soc_name() const { return soc_name_; }
  StreamHandle default_stream() const { return reinterpret_cast<StreamHandle>(default_stream_); }

 private:
  enum class State { kUninitialized, kInitialized, kFailed };

  // Initialised, and the caller's current NPU is still the frozen one.
  Status RequireReady(const char* op) const;
  Status CheckCurrentDevice() const;
  Status CheckPe(int pe) const;
  // The checks of one Put or Get call: ready, a valid pe, at most one call's bytes.
  Status CheckCopy(const char* op, int pe, std::size_t bytes) const;
  Status CheckSignal(SignalWidth width, std::int64_t value, const char* value_name) const;
  // The shared part of CopyToHeap and CopyFromHeap: one aclrtMemcpy between the host and `symmetric` in this heap.
  Status CopyLocal(const char* op, void* dst, const void* src, std::size_t bytes, bool to_heap);
  // The aclrtStream behind a handle (kDefaultStream: the device's own); remembers handles it did not create.
  void* Resolve(StreamHandle stream);
  // After enqueueing on `stream`: kDefaultStream calls complete before they return; others keep `keep` alive.
  Status Completed(StreamHandle stream, void* acl_stream, KeepAlive keep, const std::string& what);
  // aclrtSynchronizeStreamWithTimeout with the configured timeout; releases the stream's kept buffers on success.
  Status Synchronize(void* acl_stream, const std::string& what);
  Status DestroyEvents();
  // Releases streams, events and CANN SHMEM after a failed collective step of Init (no status: best effort).
  void AbandonInit(bool cann_initialised);
  std::string TimeoutFact() const;

  AscendDeviceOptions options_;
  State state_ = State::kUninitialized;
  int rank_ = 0;
  int world_size_ = 0;
  std::int32_t device_id_ = -1;
  std::string soc_name_;
  std::size_t heap_size_ = 0;
  std::uintptr_t heap_base_ = 0;
  double timeout_sec_ = 0;
  std::int32_t timeout_ms_ = -1;
  void* default_stream_ = nullptr;
  // CANN keeps pointers to these until init returns (the unique id) or longer (the TLS settings).
  std::vector<unsigned char> unique_id_;
  std::string tls_info_;

  mutable std::mutex mu_;
  std::set<void*> own_streams_;                        // created by CreateStream
  std::set<void*> foreign_streams_;                    // passed in by the caller (the torch_npu current stream)
  std::map<void*, std::vector<KeepAlive>> kept_;       // buffers of enqueued calls, by stream
  std::map<void*, Status> pending_;                    // failures Quiesce met, for the next SynchronizeStream
  std::vector<void*> events_;                          // of StreamWaitStream, destroyed once every stream drained
  std::map<std::uintptr_t, std::size_t> reserved_;     // allocation -> bytes CANN reserved (16-byte granules)
};

}  // namespace hp::shmem::ascend
