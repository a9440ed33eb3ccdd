// The host device: symmetric memory for the processes of one machine over POSIX shared memory.
//
// Every rank creates one segment (a control block, then its heap) and maps the segments of the other ranks of its
// node, so a put is a memcpy into the peer's mapping, a signal an atomic on it, and a wait a futex on the local word.
// A node is found, not assumed: the ranks that can open each other's shared memory (hostnames can lie both ways:
// containers on two machines may share one, two containers of one machine may share /dev/shm under two).
// PEs of other nodes are reached, when the world spans nodes and the build has UCX, through a remote transport
// (remote_transport.h): put, get and signal (set and add) only, each complete before it returns.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/device.h"
#include "runtime/heap.h"
#include "runtime/host/host_stream.h"
#include "runtime/host/remote_transport.h"
#include "runtime/host/shm_segment.h"
#include "runtime/host/wait.h"

namespace hp::shmem::host {

// How the host device reaches peers' memory outside the heap (ordinary tensors).
enum class PeerMemory {
  // Through the kernel's cross-memory attach (process_vm_readv), where the system lets every rank read every peer
  // (same user, no ptrace restriction against it; probed and agreed at Init). Otherwise as kThroughHeap.
  kCrossMemoryAttach,
  // Not at all: collectives on ordinary tensors stage through the heap.
  kThroughHeap,
};

// The nodes of a world from which ranks can open each other's shared memory: `reach[a * world_size + b]` is nonzero
// when rank a opened rank b's probe. Returns the node of every rank, numbered by its lowest rank, or kDeviceError
// naming a pair of ranks when the table is not a partition (reflexive, symmetric, transitive).
Result<std::vector<int>> NodesFromReach(const std::vector<std::uint8_t>& reach, int world_size);

class HostDevice final : public Device {
 public:
  explicit HostDevice(PeerMemory peer_memory = PeerMemory::kCrossMemoryAttach);
  ~HostDevice() override;

  const char* name() const override { return "host"; }
  Status Init(const DeviceInitArgs& args, Bootstrap& bootstrap) override;
  // Retires every segment (ShmSegment::Retire) instead of unmapping it: pointers that escaped into any rank's
  // heap (numpy arrays, DLPack capsules) stay harmless, at the cost of the heaps' address ranges (address space
  // only, no memory) for the rest of the process.
  Status Finalize() override;

  Result<void*> Allocate(std::size_t bytes, std::size_t alignment) override;
  Status Free(void* ptr) override;
  std::size_t ReservedBytes(const void* ptr) const override;
  std::uintptr_t heap_base() const override;
  std::size_t heap_size() const override { return heap_size_; }
  const std::vector<int>& nodes() const override { return nodes_; }
  bool reaches_remotely(int pe) const override { return IsRemote(pe); }
  bool signals_remotely(SignalOp /*op*/) const override { return true; }   // set and add: remote atomics
  std::string remote_absence() const override { return remote_absence_; }
  std::string remote_transport() const override { return remote_ != nullptr ? remote_->name() : "none"; }
  std::shared_ptr<const PeerLosses> peer_losses() const override {
    return remote_ != nullptr ? remote_->losses() : nullptr;
  }
  // RemoteTransport::Put or Get itself (remote_transport.h), for a PE that IsRemote.
  Status RemoteTransportTransfer(bool put, void* symmetric, void* local, std::size_t bytes, int pe) override;
  // RemoteTransport::ExchangeMessages, for PEs that IsRemote.
  Status ExchangeMessages(std::uint64_t tag, MessageExchange* exchanges, std::size_t count) override;
  Status CopyToHeap(void* symmetric_dst, const void* host_src, std::size_t bytes) override;
  Status CopyFromHeap(void* host_dst, const void* symmetric_src, std::size_t bytes) override;
  std::size_t max_transfer_bytes() const override { return 0; }
  // memcpy when the stream reaches them (at once on the default stream).
  Status StageFromHost(void* symmetric_dst, const void* host_src, std::size_t bytes, StreamHandle stream) override;
  Result<std::uint64_t> ReadLater(const void* symmetric_src, std::size_t bytes, StreamHandle stream) override;
  Result<bool> TakeRead(std::uint64_t token, void* host_dst) override;

  Status Put(void* symmetric_dst, const void* src, std::size_t bytes, int pe, StreamHandle stream,
             KeepAlive keep) override;
  Status Get(void* dst, const void* symmetric_src, std::size_t bytes, int pe, StreamHandle stream,
             KeepAlive keep) override;
  Status Signal(void* symmetric_signal, SignalWidth width, std::int64_t value, SignalOp op, int pe,
                StreamHandle stream) override;
  // To a PE of another node, the transport's PutWithSignal (one round trip); within the node, memcpy then the
  // signal, as Put then Signal.
  Status PutWithSignal(void* symmetric_dst, const void* src, std::size_t bytes, void* symmetric_signal,
                       SignalWidth width, std::int64_t value, SignalOp op, int pe, StreamHandle stream,
                       KeepAlive keep) override;
  Status WaitSignal(void* symmetric_signal, SignalWidth width, CompareOp cmp, std::int64_t value,
                    StreamHandle stream) override;
  Status Reduce(void* dst, const void* symmetric_src, std::size_t count, DataType dtype, ReduceOp op,
                const std::vector<int>& pes, StreamHandle stream, KeepAlive keep) override;
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
  Result<void*> PeerAddress(const void* symmetric, int pe) const override;
  Status Barrier(StreamHandle stream) override;
  // Atomics on the counter in the first member's mapping; waits as every wait (spin, then futex on the counter).
  bool arbitrates() const override { return true; }
  Status Arrive(void* symmetric_counter, const std::vector<int>& members, int member) override;
  Status GiveUp(void* symmetric_counter, const std::vector<int>& members, int member, GiveUpReason reason) override;
  Status AwaitArrivals(const void* symmetric_counter, const std::vector<int>& members) override;
  Result<std::int64_t> ReadCounter(const void* symmetric_counter, int pe) override;
  // memcpy on the stream: every buffer of this process is host memory.
  Status Copy(void* dst, const void* src, std::size_t bytes, StreamHandle stream, KeepAlive keep) override;
  // One copy out of the peer's process (process_vm_readv); this rank's own memory is read directly.
  bool reaches_peer_memory() const override { return reaches_peer_memory_; }
  Status GetPeerMemory(void* dst, std::uint64_t peer_address, std::size_t bytes, int pe, StreamHandle stream,
                       KeepAlive keep) override;
  // Reads the peers' sources a cache-sized block at a time and reduces each block while it is in cache.
  Status ReducePeerMemory(void* dst, const std::vector<std::uint64_t>& addresses, const std::vector<int>& pes,
                          std::size_t count, DataType dtype, ReduceOp op, StreamHandle stream, KeepAlive keep) override;

  Result<StreamHandle> CreateStream() override;
  Status DestroyStream(StreamHandle stream) override;
  Status SynchronizeStream(StreamHandle stream) override;
  Status StreamWaitStream(StreamHandle waiter, StreamHandle waited) override;
  Status Quiesce() override;

  // Bytes of the control block behind every heap (the heap starts at the page-aligned mapping).
  static constexpr std::size_t kControlBytes = 4096;
  struct ControlBlock;

 private:

  // `pe` must lie on this rank's node (the runtime checks it before any data-plane call).
  ControlBlock* control(int pe) const;
  // OK when `pe` is a PE of this rank's node; otherwise the broken contract (out of range) or the fact, naming both
  // nodes.
  Status CheckOnNode(int pe, const char* op) const;
  char* Remote(const void* local, int pe) const;
  // Runs `op` now on the default stream, or queues it on a host stream (keeping `keep` alive until it ran). A
  // template so that the default stream runs the lambda as it is: no std::function (a heap allocation for most
  // captures) on the small-message path, which makes several device calls per collective.
  template <typename Op>
  Status Submit(StreamHandle stream, Op&& op) {
    if (stream == kDefaultStream) return op();
    return Enqueue(stream, std::function<Status()>(std::forward<Op>(op)));
  }
  Status Enqueue(StreamHandle stream, std::function<Status()> op);
  Result<std::shared_ptr<HostStream>> FindStream(StreamHandle stream) const;
  // Joins the released streams that have finished their work (streams_mu_ held).
  void ReapReleasedStreams();

  Status DoSignal(void* symmetric_signal, SignalWidth width, std::int64_t value, SignalOp op, int pe);
  Status DoWaitSignal(void* symmetric_signal, SignalWidth width, CompareOp cmp, std::int64_t value);
  Status DoBarrier();
  // The counter of `members[0]` at `symmetric_counter`'s offset, checked to lie in this rank's heap and on its node.
  Result<std::int64_t*> Counter(const void* symmetric_counter, const std::vector<int>& members, const char* op) const;
  std::chrono::steady_clock::time_point Deadline() const;

  // Which ranks share this rank's shared memory (step 1 of Init): sets nodes_ and node_pes_.
  Status DiscoverNodes(Bootstrap& bootstrap);
  // Whether every rank can read every peer's memory of its node (step 4 of Init).
  Status ProbePeerMemory(Bootstrap& bootstrap);
  // The transport to the other nodes (step 5 of Init, when the world spans nodes): every rank opens it and connects,
  // or none does and remote_absence_ says why.
  Status OpenRemote(Bootstrap& bootstrap);
  // Whether `pe` lies on another node and the remote transport reaches it.
  bool IsRemote(int pe) const {
    return remote_ != nullptr && nodes_[static_cast<std::size_t>(pe)] != nodes_[static_cast<std::size_t>(rank_)];
  }
  // IsRemote(pe), or the refusal of `op`: the PE lies on this node or no transport reaches it (and why).
  Status RequireRemote(int pe, const char* op) const;
  std::size_t HeapOffset(const void* local) const {
    return static_cast<std::size_t>(static_cast<const char*>(local) - bases_[static_cast<std::size_t>(rank_)]);
  }
  // Wakes every waiter on a signal of this rank: a peer's remote atomic changed it without a futex wake.
  void WakeRemoteWaiters();

  PeerMemory peer_memory_;
  bool reaches_peer_memory_ = false;
  int rank_ = 0;
  int world_size_ = 0;
  std::size_t heap_size_ = 0;
  std::chrono::nanoseconds timeout_{0};
  SpinPolicy spin_;
  std::vector<int> nodes_;                    // the node of every PE, numbered by its lowest PE
  std::vector<int> node_pes_;                 // the PEs of this rank's node, ascending
  std::vector<ShmSegment> segments_;          // index = rank; segments_[rank_] is ours; empty off this node
  std::vector<char*> bases_;                  // mapping of each rank's segment; null off this node
  std::unique_ptr<HeapAllocator> heap_;
  std::unique_ptr<RemoteTransport> remote_;   // null: one node, or no transport (remote_absence_ says why)
  std::string remote_absence_;
  // The signals this rank's threads wait on while a remote transport is up, for WakeRemoteWaiters.
  std::mutex watched_mu_;
  std::multiset<const void*> watched_;
  std::atomic<int> watched_count_{0};
  // Barriers this rank has entered. Barriers pair up across ranks by their order, so a process issues one
  // barrier at a time (from one stream or thread), like one NCCL communicator.
  std::atomic<std::uint64_t> barrier_epoch_{0};

  // Reads started by ReadLater: the bytes, and the stream and ticket after which they are there (none: at once).
  struct PendingRead {
    std::vector<char> bytes;
    std::shared_ptr<HostStream> stream;
    std::uint64_t ticket = 0;
  };
  std::mutex reads_mu_;
  std::map<std::uint64_t, std::shared_ptr<PendingRead>> reads_;
  std::uint64_t next_read_ = 1;

  mutable std::mutex streams_mu_;
  std::map<StreamHandle, std::shared_ptr<HostStream>> streams_;
  std::vector<std::shared_ptr<HostStream>> released_;   // destroyed by the user, maybe still running

};

}  // namespace hp::shmem::host
