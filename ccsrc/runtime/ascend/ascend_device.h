// The ascend device: symmetric memory on Ascend NPUs through CANN SHMEM v1.5.1 (pinned in
// third_party/shmem_patches/). This header is free of CANN headers, so that callers (the binding's device factory,
// tests) need no CANN include path; only ascend_device.cc, ascend_compute.cc and cann_*.cc include CANN.
//
// Initialisation needs no fixed port: rank 0 asks CANN for a unique id (bound to SHMEM_UID_SESSION_ID, else
// SHMEM_UID_SOCK_IFNAME, else the first non-loopback interface: CANN reads them itself), the bootstrap broadcasts
// it, and every rank initialises CANN SHMEM with it (ACLSHMEMX_INIT_WITH_UNIQUEID). v1.5.1 runs the config store
// of that mode without TLS whatever aclshmemx_set_conf_store_tls says (init_config_store() turns it off), so the
// device turns it off itself and refuses HYPER_PARALLEL_SHMEM_TLS_INFO. When the ranks span several hosts, the
// device adds RoCE to the data engines (put/get/signal across hosts need ACLSHMEM_DATA_OP_ROCE).
//
// The heap CANN maps is local_mem_size (HYPER_PARALLEL_SHMEM_HEAP_SIZE, rounded up to 2 MiB) plus
// ACLSHMEM_EXTRA_SIZE (6 MiB), of which init takes about 5.13 MiB (its signal word, every team's sync pool and
// counters) through its own allocator: heap_size() is the whole mapped range, so that in-heap checks use the real
// bounds. Allocation is collective inside CANN (aclshmem_malloc/align end with a control-plane barrier):
// collective_allocation() says so, and the runtime agrees on every request before the device calls CANN.
//
// Timeouts: CANN bounds its own bootstrap and control-plane waits (init, malloc) with DEFAULT_TIMEOUT (120 s) in
// unique-id mode; every other wait (stream synchronizations, the bootstrap exchanges before CANN's collective
// calls) is bounded by the configured timeout. A wait that timed out keeps its kernel spinning on the stream, and
// destroying that stream or finalizing would then hang: the device releases such a waiter by writing the awaited
// value into the local signal, then drains the stream (bounded); a stream it cannot drain is never destroyed.
//
// Reductions run on the stream through CANN's operator library (aclnn, two-phase): peers' copies are read in place
// through aclshmem_ptr and combined with aclnnInplaceAdd / aclnnMaximum / aclnnMinimum; avg is the sum divided by
// the number of sources (aclnnInplaceDivs). Low-precision communication in float16 and bfloat16 casts with
// aclnnCast; the fp8 wire formats are refused (no block-scaled cast kernel).
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

  // HYPER_PARALLEL_SHMEM_TLS_INFO. CANN SHMEM v1.5.1 cannot run its config store with TLS in unique-id mode:
  // anything but empty fails Init, naming why.
  std::string tls_info;
  std::size_t max_transfer_bytes = kCannMaxTransferBytes;
  // The host this rank runs on, compared across ranks at Init to decide RoCE; empty: gethostname().
  std::string node_name;
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

  // CANN's malloc and align end with a barrier over every PE: the runtime agrees before calling Allocate.
  bool collective_allocation() const override { return true; }
  Status CheckAllocate(std::size_t bytes, std::size_t alignment) const override;
  Result<void*> Allocate(std::size_t bytes, std::size_t alignment) override;
  Status Free(void* ptr) override;
  std::size_t ReservedBytes(const void* ptr) const override;
  std::uintptr_t heap_base() const override { return heap_base_; }
  std::size_t heap_size() const override { return heap_size_; }
  // One node: CANN SHMEM reaches every PE of the world itself, other machines over RoCE (ACLSHMEM_DATA_OP_ROCE).
  const std::vector<int>& nodes() const override { return nodes_; }
  // aclrtMemcpy (host to device, device to host): the heap is NPU memory that the host cannot dereference.
  Status CopyToHeap(void* symmetric_dst, const void* host_src, std::size_t bytes) override;
  Status CopyFromHeap(void* host_dst, const void* symmetric_src, std::size_t bytes) override;
  std::size_t max_transfer_bytes() const override { return options_.max_transfer_bytes; }
  SignalWidth native_signal_width() const override { return SignalWidth::k32; }

  Status Put(void* symmetric_dst, const void* src, std::size_t bytes, int pe, StreamHandle stream,
             KeepAlive keep) override;
  Status Get(void* dst, const void* symmetric_src, std::size_t bytes, int pe, StreamHandle stream,
             KeepAlive keep) override;
  Status Signal(void* symmetric_signal, SignalWidth width, std::int64_t value, SignalOp op, int pe,
                StreamHandle stream) override;
  Status WaitSignal(void* symmetric_signal, SignalWidth width, CompareOp cmp, std::int64_t value,
                    StreamHandle stream) override;
  // aclnn operators on the stream, reading the peers' copies in place (aclshmem_ptr); every pe's copy must be
  // reachable by this NPU (the same HCCS domain). dst must be NPU memory of this device.
  Status Reduce(void* dst, const void* symmetric_src, std::size_t count, DataType dtype, ReduceOp op,
                const std::vector<int>& pes, StreamHandle stream, KeepAlive keep) override;
  Status Barrier(StreamHandle stream) override;
  // aclrtMemcpyAsync (device to device) on the stream: both sides NPU memory of this device.
  Status Copy(void* dst, const void* src, std::size_t bytes, StreamHandle stream, KeepAlive keep) override;

  Result<StreamHandle> CreateStream() override;
  Status DestroyStream(StreamHandle stream) override;
  Status SynchronizeStream(StreamHandle stream) override;
  Status StreamWaitStream(StreamHandle waiter, StreamHandle waited) override;
  Status Quiesce() override;

  // NPU memory outside the symmetric heap belongs to its own process: peers reach a rank's tensors through the heap
  // only, so the collectives on ordinary tensors stage through it. The two copies refuse, naming the reason.
  bool reaches_peer_memory() const override { return false; }
  Status GetPeerMemory(void* dst, std::uint64_t peer_address, std::size_t bytes, int pe, StreamHandle stream,
                       KeepAlive keep) override;
  Status ReducePeerMemory(void* dst, const std::vector<std::uint64_t>& addresses, const std::vector<int>& pes,
                          std::size_t count, DataType dtype, ReduceOp op, StreamHandle stream, KeepAlive keep) override;

  // aclshmem_ptr: the address of `symmetric`'s heap offset on `pe`, which the NPU reaches directly.
  Result<void*> PeerAddress(const void* symmetric, int pe) const override;

  // Low-precision communication in float16 and bfloat16: aclnnCast on the stream, peers' runs read in place
  // (aclshmem_ptr), terms summed with aclnnInplaceAdd in the tensor's dtype; the fp8 formats are refused (no
  // block-scaled cast kernel in CANN's operator library).
  Status CheckWireFormat(ops::LowFormat format) const override;
  Status Encode(ops::LowFormat format, DataType dtype, const void* src, std::size_t count, WireRun dst,
                StreamHandle stream, KeepAlive keep) override;
  Status Decode(ops::LowFormat format, WireRun symmetric_src, int pe, std::size_t count, DataType dtype, void* out,
                StreamHandle stream, KeepAlive keep) override;
  Status ReduceEncoded(ops::LowFormat format, DataType dtype, ReduceOp op, const void* own, WireRun symmetric_src,
                       const std::vector<int>& pes, std::size_t count, void* out, WireRun reencode,
                       StreamHandle stream, KeepAlive keep) override;

  int device_id() const { return device_id_; }            // frozen at Init (-1 before)
  std::size_t local_mem_size() const { return local_mem_size_; }   // what CANN was asked for (heap_size() - extra)
  bool uses_roce() const { return uses_roce_; }
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
  // After a timed-out synchronization of `acl_stream`: releases its pending waits (writes each awaited value into
  // the local signal) and drains it, bounded. False: the stream still runs and must never be destroyed.
  bool ReleaseAndDrain(void* acl_stream);
  // An aclnn operator in its two phases on `acl_stream`: the workspace (aclrtMalloc) and the descriptors stay alive
  // until the stream's next successful synchronization.
  struct AclnnCall;
  Status RunAclnn(AclnnCall& call, void* acl_stream, const std::string& what);
  // aclnnCast, aclnnInplaceAdd (one dtype) and aclnnInplaceDivs over `count` contiguous elements, enqueued.
  Status EnqueueCast(void* dst, DataType to, const void* src, DataType from, std::size_t count, void* acl_stream,
                     const std::string& what);
  Status EnqueueAdd(void* out, const void* other, std::size_t count, DataType dtype, void* acl_stream,
                    const std::string& what);
  Status EnqueueDivide(void* out, std::size_t count, DataType dtype, float divisor, void* acl_stream,
                       const std::string& what);
  Status CheckWireCall(const char* op, ops::LowFormat format, DataType dtype) const;
  // Where `symmetric` lies on `pe` for the NPU (aclshmem_ptr), or why it cannot be reached.
  Result<void*> PeerRun(const void* symmetric, int pe, const std::string& what);
  // Releases a failed or half-initialised CANN SHMEM after a failed init; reports what is left.
  Status ReleaseHalfInit(Status failure);

  AscendDeviceOptions options_;
  State state_ = State::kUninitialized;
  int rank_ = 0;
  int world_size_ = 0;
  std::vector<int> nodes_;
  std::int32_t device_id_ = -1;
  std::string soc_name_;
  std::size_t heap_size_ = 0;
  std::size_t local_mem_size_ = 0;
  bool uses_roce_ = false;
  std::uintptr_t heap_base_ = 0;
  double timeout_sec_ = 0;
  std::int32_t timeout_ms_ = -1;
  void* default_stream_ = nullptr;
  // CANN keeps a pointer to it until init returns.
  std::vector<unsigned char> unique_id_;

  mutable std::mutex mu_;
  std::set<void*> own_streams_;                        // created by CreateStream
  std::set<void*> foreign_streams_;                    // passed in by the caller (the torch_npu current stream)
  std::map<void*, std::vector<KeepAlive>> kept_;       // buffers of enqueued calls, by stream
  std::map<void*, Status> pending_;                    // failures Quiesce met, for the next SynchronizeStream
  std::vector<void*> events_;                          // of StreamWaitStream, destroyed once every stream drained
  std::map<std::uintptr_t, std::size_t> reserved_;     // allocation -> bytes CANN reserved (16-byte granules)
  struct PendingWait {
    void* signal;
    CompareOp cmp;
    std::int32_t value;
  };
  std::map<void*, std::vector<PendingWait>> waits_;    // waits enqueued since the stream's last synchronization
  std::set<void*> stuck_;                              // streams whose queue could not be drained: never destroyed
};

}  // namespace hp::shmem::ascend
