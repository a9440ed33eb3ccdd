// The ascend device: symmetric memory on Ascend NPUs through CANN SHMEM v1.5.1 (pinned in
// third_party/shmem_patches/, whose README gives the source line of every behaviour relied on here). This header is
// free of CANN headers, so that callers (the binding's device factory, tests) need no CANN include path; only
// ascend_device.cc (init, memory, the data plane, streams), ascend_compute.cc (aclnn) and cann_status.cc include CANN.
//
// Initialisation needs no fixed port: rank 0 asks CANN for a unique id, the bootstrap broadcasts it, and every rank
// initialises CANN SHMEM with it (ACLSHMEMX_INIT_WITH_UNIQUEID). CANN itself picks the address the id binds to:
// SHMEM_UID_SESSION_ID (ip:port) if set; else SHMEM_UID_SOCK_IFNAME as "prefix:family" (the part before ':' is an
// interface-name prefix, family "inet6" means IPv6 and anything else IPv4; without the ':' no interface is found and
// aclshmemx_get_uniqueid fails with ACLSHMEM_INVALID_PARAM); else the first interface, in the system's order, that is
// up, running, not loopback, not named lo*, docker*, veth*, br-*, virbr*, tun* or tap*, with a routable address.
// v1.5.1 runs the config store of that mode without TLS whatever aclshmemx_set_conf_store_tls says
// (init_config_store() turns it off), so the device turns it off itself and refuses HYPER_PARALLEL_SHMEM_TLS_INFO.
//
// Topology. A node is the PEs whose heaps this NPU maps, i.e. reaches over MTE: the same host and, on a 910B, the
// same group of 8 logical NPUs (HCCS; the logical id is ASCEND_RT_VISIBLE_DEVICES[device] when set, else the device
// id), as CANN's memory layer decides it. Every rank publishes its host and logical NPU at Init. PEs outside this
// rank's node get no in-place access (PeerAddress, the reductions and casts read peers in place) and no signal ADD
// (an MTE atomic); put, get and signal SET reach them only when RoCE is on, which the device turns on when the ranks
// span several hosts (ACLSHMEM_DATA_OP_MTE | ACLSHMEM_DATA_OP_ROCE): one host with two HCCS groups (16 NPUs of a 910B
// server) gets two nodes and no RoCE, so nothing one-sided crosses between the groups. aclshmem_ptr answers an address
// for every PE, mapped or not, so the device never takes a non-null answer for reachability.
//
// Init states. A failed aclshmemx_init_attr rolls nothing back, and leaves NOT_INITIALIZED (it failed before the heap
// was set up, e.g. a peer missing at its first barrier), SHM_CREATED (after) or IS_INITIALIZED (its last barrier):
// the device calls aclshmem_finalize after any failed init, whatever the state, and reports the state it found.
//
// The heap CANN maps is local_mem_size (HYPER_PARALLEL_SHMEM_HEAP_SIZE, rounded up to 2 MiB) plus
// ACLSHMEM_EXTRA_SIZE (6 MiB), of which init takes about 5.13 MiB (its signal word, every team's sync pool and
// counters) through its own allocator: heap_size() is the whole mapped range, so that in-heap checks use the real
// bounds. Allocation is collective inside CANN (aclshmem_malloc/align end with a control-plane barrier):
// collective_allocation() says so, and the runtime agrees on every request before the device calls CANN. CANN answers
// NULL for a full heap and for a failed barrier alike; the device tells them apart by the room it knows is left.
//
// Timeouts: CANN bounds its own bootstrap and control-plane waits (init, malloc) with DEFAULT_TIMEOUT (120 s) in
// unique-id mode, and reports a barrier that timed out as ACLSHMEM_SMEM_ERROR; every other wait (stream
// synchronizations, the bootstrap exchanges before CANN's collective calls) is bounded by the configured timeout. A
// wait that timed out keeps its kernel spinning on the stream, and destroying that stream or finalizing would then
// hang: the device releases such a waiter by writing the awaited value into the local signal, then drains the stream
// (bounded); a stream it cannot drain is never destroyed.
//
// Reductions run on the stream through CANN's operator library (aclnn, two-phase): peers' copies are read in place
// through aclshmem_ptr; a sum is one aclnnAddN over every copy where the operator takes the dtype (int32, int64,
// float16, bfloat16, float32 on a 910B or 910_93), otherwise, and for max and min, aclnnInplaceAdd / aclnnMaximum /
// aclnnMinimum pairwise; avg is the sum divided by the number of sources (aclnnInplaceDivs). Low-precision
// communication in float16 and bfloat16 casts with aclnnCast; the fp8 wire formats are refused (no block-scaled cast
// kernel). Each stream has one operator workspace and one scratch buffer (aclrtMalloc), grown when a call needs more:
// operators on one stream run one after another, so they share them; a buffer that was outgrown is freed once the
// stream has run past its last use (a synchronization, or a completed event recorded after it).
//
// The NPU the caller had selected (aclrtGetDevice) and its SoC name are frozen at Init; every later call made
// with another current device fails ("current device must be npu:0 (fixed at acquire_shmem), but got npu:1").
//
// Streams: a StreamHandle is an aclrtStream. Calls on an explicit handle (the binding passes the torch_npu current
// stream) are only enqueued: stream order is the completion guarantee, failures surface at SynchronizeStream.
// kDefaultStream is a stream this device creates at Init; a call on it completes before it returns (the device
// synchronizes it, bounded by the timeout), as the runtime's own uses of the default stream (the init barrier, the
// collective checks) expect. Buffers kept alive for an enqueued call are released at that stream's next successful
// synchronization, or once an event recorded after the call (StageFromHost's) has completed.
//
// Staging and reads in stream order (StageFromHost, ReadLater, TakeRead: the engine's deferred checks): the host bytes
// go through page-locked memory (aclrtMallocHost) with aclrtMemcpyAsync on the stream, which only enqueues; an event
// recorded after the copy (aclrtRecordEvent) tells, through aclrtQueryEventStatus, when it has run, without waiting.
// Page-locked buffers and events are pooled: one is used again only once the event recorded after its copy completed,
// so that once warm no call allocates or creates anything.
//
// Graph capture (aclmdlRICaptureBegin): a stream under capture may not be synchronized and no blocking copy may run:
// SynchronizeStream and Quiesce of a captured stream, and CopyToHeap/CopyFromHeap while any stream the device has seen
// is being captured, are refused before they would invalidate the capture. StageFromHost and ReadLater are refused on
// a captured stream too: the capture would record the copy of a page-locked buffer, and every replay would copy that
// buffer again long after the call (stale bytes, or bytes of a later call that the pool gave the buffer to), so the
// engine's collectives cannot be captured.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
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
  // The MTE-reachable sets (the same host and HCCS group), agreed at Init.
  const std::vector<int>& nodes() const override { return nodes_; }
  // RoCE is on and `pe` lies outside this rank's node: put, get and signal SET reach it, nothing else does.
  bool reaches_remotely(int pe) const override;
  // aclrtMemcpy (host to device, device to host): the heap is NPU memory that the host cannot dereference.
  Status CopyToHeap(void* symmetric_dst, const void* host_src, std::size_t bytes) override;
  Status CopyFromHeap(void* host_dst, const void* symmetric_src, std::size_t bytes) override;
  // Through a pooled page-locked buffer and aclrtMemcpyAsync on the stream, an event after it (see the header comment);
  // refused on a stream under graph capture.
  Status StageFromHost(void* symmetric_dst, const void* host_src, std::size_t bytes, StreamHandle stream) override;
  Result<std::uint64_t> ReadLater(const void* symmetric_src, std::size_t bytes, StreamHandle stream) override;
  // aclrtQueryEventStatus on the read's event; a failure Quiesce met on the read's stream is reported (kept for that
  // stream's SynchronizeStream too).
  Result<bool> TakeRead(std::uint64_t token, void* host_dst) override;
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
  // aclnn operators on the stream, reading the peers' copies in place (aclshmem_ptr); every pe must lie in this
  // rank's node (MTE). dst must be NPU memory of this device. sum and avg: one aclnnAddN where it takes the dtype.
  Status Reduce(void* dst, const void* symmetric_src, std::size_t count, DataType dtype, ReduceOp op,
                const std::vector<int>& pes, StreamHandle stream, KeepAlive keep) override;
  // aclshmemx_barrier_on_stream over a CANN team of this rank's node (one kernel; CANN's barrier reads every member's
  // word in place, so it cannot span nodes).
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

  // aclshmem_ptr: the address of `symmetric`'s heap offset on `pe`, which the NPU reaches directly; refused for a pe
  // outside this rank's node, whose address would fault the kernel that touches it.
  Result<void*> PeerAddress(const void* symmetric, int pe) const override;

  // Low-precision communication in float16 and bfloat16: aclnnCast on the stream, peers' runs read in place
  // (aclshmem_ptr), each decoded into the stream's scratch buffer and added with aclnnInplaceAdd in the tensor's dtype;
  // MoE's wire rows of those formats are the same cast over all the rows at once. The fp8 formats are refused (no
  // block-scaled cast kernel in CANN's operator library).
  Status CheckWireFormat(ops::LowFormat format) const override;
  Status Encode(ops::LowFormat format, DataType dtype, const void* src, std::size_t count, WireRun dst,
                StreamHandle stream, KeepAlive keep) override;
  Status Decode(ops::LowFormat format, WireRun symmetric_src, int pe, std::size_t count, DataType dtype, void* out,
                StreamHandle stream, KeepAlive keep) override;
  Status ReduceEncoded(ops::LowFormat format, DataType dtype, ReduceOp op, const void* own, WireRun symmetric_src,
                       const std::vector<int>& pes, std::size_t count, void* out, WireRun reencode,
                       StreamHandle stream, KeepAlive keep) override;
  Status EncodeRows(ops::LowFormat format, DataType dtype, const void* src, std::size_t rows, std::size_t row_elems,
                    void* dst, StreamHandle stream, KeepAlive keep) override;
  Status DecodeRows(ops::LowFormat format, const void* src, std::size_t rows, std::size_t row_elems, DataType dtype,
                    void* out, StreamHandle stream, KeepAlive keep) override;

  int device_id() const { return device_id_; }            // frozen at Init (-1 before)
  std::size_t local_mem_size() const { return local_mem_size_; }   // what CANN was asked for (heap_size() - extra)
  bool uses_roce() const { return uses_roce_; }
  int logical_device_id() const { return logical_device_; }   // the NPU's logical id (-1 before Init)
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
  // An aclnn operator in its two phases on `acl_stream`, in the stream's workspace; the descriptors stay alive until
  // the stream has run past it.
  struct AclnnCall;
  Status RunAclnn(AclnnCall& call, void* acl_stream, const std::string& what);
  // The stream's buffer of `kind` (NPU memory), at least `bytes`: grown (aclrtMalloc) when smaller, the outgrown one
  // kept alive with the stream's enqueued calls (kept_). Callers hold enqueue_mu_ while they use it.
  enum class StreamBufferKind { kWorkspace = 0, kScratch = 1 };
  Result<void*> StreamBuffer(void* acl_stream, StreamBufferKind kind, std::size_t bytes, const std::string& what);
  // One aclnnAddN of `sources` (each `count` elements of `dtype`, in that order) into `out`, which may be one of them.
  Status EnqueueSum(void* out, const std::vector<void*>& sources, std::size_t count, DataType dtype, void* acl_stream,
                    const std::string& what);
  // Whether EnqueueSum takes `dtype` on this NPU.
  bool SumsInOneOperator(DataType dtype) const;
  // aclnnCast, aclnnInplaceAdd (one dtype) and aclnnInplaceDivs over `count` contiguous elements, enqueued.
  Status EnqueueCast(void* dst, DataType to, const void* src, DataType from, std::size_t count, void* acl_stream,
                     const std::string& what);
  Status EnqueueAdd(void* out, const void* other, std::size_t count, DataType dtype, void* acl_stream,
                    const std::string& what);
  Status EnqueueDivide(void* out, std::size_t count, DataType dtype, float divisor, void* acl_stream,
                       const std::string& what);
  Status CheckWireCall(const char* op, ops::LowFormat format, DataType dtype) const;
  // Where `symmetric` lies on `pe` for this NPU's kernels (aclshmem_ptr), for in-place access: `pe` must lie in this
  // rank's node. `op` names the caller in the refusal.
  Result<void*> PeerInPlace(const void* symmetric, int pe, const char* op) const;
  // PeerInPlace for a peer, `symmetric` itself for this rank.
  Result<void*> PeerRun(const void* symmetric, int pe, const char* op) const;
  // OK when `pe` lies in this rank's node; otherwise a refusal of `op` naming both nodes and `reason`.
  Status CheckOnNode(int pe, const char* op, const std::string& reason) const;
  // "node=0 (host=h0 hccs_group=0)" for `pe`'s node.
  std::string NodeFact(const char* key, int pe) const;
  // Put, Get and Signal's reach: `pe` in this node, or beyond it over RoCE when `remote_ok` (not for ADD).
  Status CheckReach(int pe, const char* op, bool remote_ok) const;
  // Learns every rank's host and logical NPU (one exchange with the unique id) and derives nodes_.
  Status DeriveNodes(const std::vector<std::string>& hosts, const std::vector<int>& groups);
  // The CANN team of this rank's node, for Barrier (ACLSHMEM_TEAM_WORLD when the world is one node).
  Status CreateNodeTeam();
  // Releases a failed or half-initialised CANN SHMEM after any failed aclshmemx_init_attr (its answer: `cann_code`);
  // reports what was left.
  Status ReleaseHalfInit(Status failure, int cann_code);
  // Whether `bytes` at `alignment` fit in a gap of the heap, from CANN's own reservation and this device's
  // allocations: a NULL from aclshmem_malloc then means its barrier failed, not the heap.
  bool HeapHasRoom(std::size_t bytes, std::size_t alignment) const;
  // Refusals under graph capture: `op` would synchronize `acl_stream`, or would do a blocking copy while a stream the
  // device has seen is being captured (`because`: why that is refused; by default, the capture would fail).
  Status RefuseIfCaptured(void* acl_stream, const char* op, const char* would,
                          const char* because = "which a graph capture does not allow (the capture would fail)") const;
  Status RefuseIfAnyCaptured(const char* op, const char* would) const;

  // Page-locked host memory (aclrtMallocHost) of the staging and read pools.
  struct PinnedBuffer {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  // The copy StageFromHost and ReadLater share: a pooled buffer of `bytes` and aclrtMemcpyAsync between it and
  // `symmetric` (to the heap when `to_heap`), then a pooled event recorded after it on `acl_stream`; with `sealed`, what
  // the calls enqueued on the stream before the event keep alive (kept_) moves there, in the same step as the record.
  Status CopyThroughPinned(const char* op, void* acl_stream, void* symmetric, std::size_t bytes, bool to_heap,
                           const void* host_src, PinnedBuffer* buffer, void** event, std::vector<KeepAlive>* sealed);
  // Pools (mu_ held): a buffer of at least `bytes` or an event, taken from the pool or made; and back again.
  Result<PinnedBuffer> TakePinned(std::size_t bytes);
  Result<void*> TakeEvent();
  void Recycle(PinnedBuffer buffer, void* event);
  // Releases the fences of `acl_stream` whose event completed (every one when `drained`: the stream was synchronized),
  // returning their buffers and events to the pools and letting go of what they kept. Never waits.
  Status ReleaseFences(void* acl_stream, bool drained);
  // After a successful synchronization of `acl_stream`: nothing enqueued on it is pending any more.
  void Drained(void* acl_stream);
  // Frees every pooled and in-flight buffer and event, and each stream's workspace and scratch (Finalize, after every
  // stream drained).
  void ReleasePools();
  // Frees `acl_stream`'s workspace and scratch (the stream drained and is gone, or forgotten).
  void FreeStreamBuffers(void* acl_stream);

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
  int logical_device_ = -1;
  std::vector<std::string> hosts_;   // by PE, published at Init
  std::vector<int> hccs_groups_;     // by PE: logical device id / 8 on a 910B, 0 elsewhere
  int node_team_ = -1;               // aclshmem_team_t of this rank's node (ACLSHMEM_TEAM_INVALID: none)
  std::uintptr_t heap_base_ = 0;
  double timeout_sec_ = 0;
  std::int32_t timeout_ms_ = -1;
  void* default_stream_ = nullptr;
  // CANN keeps a pointer to it until init returns.
  std::vector<unsigned char> unique_id_;

  mutable std::mutex mu_;
  std::set<void*> own_streams_;                        // created by CreateStream
  std::set<void*> foreign_streams_;                    // passed in by the caller (the torch_npu current stream)
  std::map<void*, std::vector<KeepAlive>> kept_;       // buffers of enqueued calls, by stream, since its last fence
  // An event recorded on a stream after a staged copy, and what may go once it completed: the copy's page-locked
  // source and the buffers of the calls enqueued on the stream before it.
  struct Fence {
    void* event = nullptr;
    PinnedBuffer staging;
    std::vector<KeepAlive> kept;
  };
  std::map<void*, std::deque<Fence>> fences_;          // by stream, in the order they were recorded
  // A read started by ReadLater: its page-locked destination and the event recorded after the copy (none: nothing to
  // read). The token names it until TakeRead took it.
  struct PendingRead {
    void* acl_stream = nullptr;
    void* event = nullptr;
    PinnedBuffer buffer;
    std::size_t bytes = 0;
  };
  std::map<std::uint64_t, PendingRead> reads_;
  std::uint64_t next_read_ = 1;
  std::multimap<std::size_t, void*> free_pinned_;      // page-locked buffers not in use, by capacity
  std::vector<void*> free_events_;                     // events whose last record completed
  struct DeviceBuffer {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  std::map<void*, std::array<DeviceBuffer, 2>> stream_buffers_;   // by stream: workspace, scratch (StreamBufferKind)
  // Held while a call enqueues operators that use a stream's workspace or scratch, so that calls on one stream from
  // several threads never interleave inside a sequence sharing the scratch (recursive: RunAclnn takes it inside).
  std::recursive_mutex enqueue_mu_;
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
