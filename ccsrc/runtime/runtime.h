// The Runtime: the one per-process object that owns a lifecycle of symmetric memory.
//
//   kUninitialized --Init--> kInitialized --Shutdown--> kUninitialized (a new lifecycle may start)
//                                 |  Shutdown refused (live allocations): stays kInitialized
//                                 '- device Finalize failed --> kFailed (terminal)
//
// It checks every argument that needs no framework (ranks, byte ranges, allocation membership), keeps the
// allocation registry, verifies that ranks allocate symmetrically, and turns data-plane calls into device calls.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/collectives/engine.h"
#include "runtime/collectives/moe.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/heap.h"
#include "runtime/registry.h"
#include "runtime/status.h"
#include "runtime/team.h"

namespace hp::shmem {

enum class LifecycleState { kUninitialized, kInitialized, kFailed };
const char* LifecycleStateName(LifecycleState state);

// A byte range of symmetric memory resolved against the registry.
struct SymmetricRange {
  std::uint64_t allocation_id;
  void* address;
  std::size_t bytes;
};

struct DebugSnapshot {
  LifecycleState state = LifecycleState::kUninitialized;
  std::uint64_t lifecycle = 0;
  int rank = -1;
  int world_size = 0;
  std::string device;
  Config config;
  std::uintptr_t heap_base = 0;
  std::size_t heap_size = 0;
  std::size_t allocated = 0;
  std::size_t max_allocated = 0;
  std::size_t remaining = 0;      // heap_size minus every reservation, the runtime's own included
  std::vector<AllocationInfo> active;
  std::vector<AllocationInfo> leaked;
  std::string latest_failure;   // "" when nothing failed
  std::uint64_t in_flight = 0;  // data-plane calls running inside the runtime right now (any thread)
  std::size_t live_teams = 0;
  bool reaches_peer_memory = false;   // the device reads peers' ordinary tensors in place (Device::reaches_peer_memory)
  std::vector<int> nodes;             // the node of every PE (Device::nodes)
  // What carries this rank's one-sided calls to every PE: "self", "node" (the device's mapped memory), the device's
  // remote transport (Device::remote_transport, e.g. "ucx"), "lost" (a PE it reached whose process or node is gone
  // since: Device::peer_losses) or "none".
  std::vector<std::string> transports;
};

// The snapshot as one JSON object (state, lifecycle, rank, world_size, device, config, heap figures, allocations,
// latest_failure, calls_in_flight, live_teams, reaches_peer_memory, nodes, transports): what every handler reads.
std::string SnapshotJson(const DebugSnapshot& snapshot);
// A configuration as the snapshot's "config" object: what read_config() and hp_shmem_read_config_json return.
std::string ConfigJson(const Config& config);

// A live team as its creator sees it.
struct TeamView {
  std::vector<int> pes;   // PE of every group rank
  int me = -1;            // this rank's group rank
  int slot = -1;
  std::size_t staging_bytes = 0;
};

class Runtime {
 public:
  // The process-wide runtime.
  static Runtime& Instance();

  Runtime() = default;
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Collective over `bootstrap`: starts a lifecycle on `device`. On failure the runtime is left uninitialised.
  Status Init(const Config& config, std::unique_ptr<Device> device, Bootstrap& bootstrap);
  // Collective: waits for the device, refuses (on every rank alike, kStateError listing them) while any rank
  // holds live allocations or runs a data-plane call on another thread (it may be touching the heap), then passes
  // `bootstrap`'s barrier and releases the device. Calls that start once a shutdown has begun are refused.
  Status Shutdown(Bootstrap& bootstrap);

  LifecycleState state() const;
  std::uint64_t lifecycle() const;   // 0 before the first Init; +1 per Init
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // Collective: a symmetric allocation, checked against every rank's (same size, alignment and offset).
  Result<AllocationInfo> Allocate(std::size_t bytes, std::size_t alignment, std::string call_site);
  // Collective: frees an active allocation, checked against every rank's.
  Status Free(std::uint64_t allocation_id, const std::string& call_site);
  // The storage of an allocation let go of its memory before free (from a deleter, possibly on any thread):
  // its last reference died, or (`storage_alive`) torch gave it other memory, as share_memory_() does.
  void OnStorageReleased(std::uint64_t allocation_id, bool storage_alive = false);

  // Resolves [address, address + bytes) against the active allocations; `what` names the argument in errors.
  Result<SymmetricRange> ResolveSymmetric(const void* address, std::size_t bytes, const char* what) const;

  // Data plane. Zero bytes are validated no-ops. `pe` is the rank inside the root.
  Status Put(const void* symmetric_dst, const void* src, std::size_t dst_bytes, std::size_t src_bytes, int pe,
             StreamHandle stream, KeepAlive keep);
  Status Get(void* dst, const void* symmetric_src, std::size_t dst_bytes, std::size_t src_bytes, int pe,
             StreamHandle stream, KeepAlive keep);
  // Perf diagnostics only: Device::RemoteTransportTransfer (the transport's own put or get of `bytes` between `local`
  // and `symmetric`'s heap offset on `pe`), after the state and `pe` checks and `symmetric` checked against this
  // rank's heap only (no allocation lookup, no stream): the floor that Put and Get to another node stand on.
  Status RemoteTransportTransfer(bool put, void* symmetric, void* local, std::size_t bytes, int pe);
  // Device::ExchangeMessages with PEs of other nodes that the device reaches, under `tag`, after the state and `pe`
  // checks: the transport of the phase across nodes of teams that span nodes (the handlers' cross-node phase).
  Status ExchangeMessages(std::uint64_t tag, MessageExchange* exchanges, std::size_t count);
  Status Signal(const void* symmetric_signal, SignalWidth width, std::int64_t value, SignalOp op, int pe,
                StreamHandle stream);
  // Put, then Signal on the same `pe`, as one operation (Device::PutWithSignal): the data is visible on `pe` before
  // the signal is. Every check of both halves (Put's and Signal's) passes before anything is written.
  Status PutWithSignal(const void* symmetric_dst, const void* src, std::size_t dst_bytes, std::size_t src_bytes,
                       const void* symmetric_signal, SignalWidth width, std::int64_t value, SignalOp op, int pe,
                       StreamHandle stream, KeepAlive keep);
  Status WaitSignal(const void* symmetric_signal, SignalWidth width, CompareOp cmp, std::int64_t value,
                    StreamHandle stream);
  Status Barrier(StreamHandle stream);
  // dst[i] = op over pe in `pes` of symmetric_src[i] as it is on pe (distinct pes, in their order: it matters to
  // floating-point sums). `dst` is local memory: symmetric_src itself (in place) or outside it. The caller orders
  // it after the peers' writes; an in-place reduction overwrites what peers may still read.
  Status Reduce(void* dst, std::size_t dst_bytes, const void* symmetric_src, std::size_t src_bytes, DataType dtype,
                ReduceOp op, const std::vector<int>& pes, StreamHandle stream, KeepAlive keep);
  // Where [symmetric, symmetric + bytes), a range of one active allocation, lies on `pe` (rank inside the root),
  // for reading and writing a peer's copy directly; `what` names the argument in errors. Nothing is ordered.
  Result<void*> PeerAddress(const void* symmetric, std::size_t bytes, int pe, const char* what) const;
  // MoE's wire rows on this rank's device, in `stream` order (Device::EncodeRows, DecodeRows): what a handler sends
  // for dispatch and combine in a low-precision format, encoded and decoded where the rows are (an NPU's never pass
  // through host memory). Local, not collective. `dtype` must be floating point and wider than `format`; the
  // buffers are this rank's memory, heap or not, not overlapping (the caller's check: it knows their extents).
  Status EncodeRows(ops::LowFormat format, DataType dtype, const void* src, std::size_t rows, std::size_t row_elems,
                    void* dst, StreamHandle stream, KeepAlive keep);
  Status DecodeRows(ops::LowFormat format, const void* src, std::size_t rows, std::size_t row_elems, DataType dtype,
                    void* out, StreamHandle stream, KeepAlive keep);
  // Teams (team.h) and their collectives (collectives/engine.h). A team id names a team of this lifecycle.
  //
  // Collective over `bootstrap`, whose ranks are the members in group-rank order (`pes`: their PEs). The first team
  // of a lifecycle must be the root team (every PE, in order): it reserves the team pool, collectively over the root.
  // `serves`: for a node team (this node's members of a team that spans nodes), the PEs of that whole team in its
  // group-rank order, which the team's messages then name (Team::serves); every member passes the same, and it holds
  // every PE of `pes`. Empty for any other team.
  Result<std::uint64_t> CreateTeam(const std::vector<int>& pes, Bootstrap& bootstrap,
                                   const std::vector<int>& serves = {});
  // Local, never waits; calls of the team after it are refused.
  Status ReleaseTeam(std::uint64_t team);
  Result<TeamView> DescribeTeam(std::uint64_t team) const;
  // The collectives, each one call (collectives/engine.h for the contracts). Buffers are local addresses; symmetric ones
  // (inside an active allocation) let the engine take a copy-free path when every rank passes the same. `role`: what
  // the call is for (forward, backward, a fused op's phase), part of what the ranks agree on. An argument that breaks
  // a contract here is refused collectively: this rank still enters the call's first sync, and every member fails
  // with the same error, naming this rank.
  Status TeamBarrier(std::uint64_t team, StreamHandle stream, CallRole role = CallRole::kForward);
  Status AllGather(std::uint64_t team, void* output, std::size_t output_bytes, const void* input,
                   std::size_t input_bytes, const ElementType& type, StreamHandle stream, KeepAlive keep,
                   CallRole role = CallRole::kForward);
  // `wire`: the low-precision format the values travel in (sum or avg of a floating-point dtype wider than it, on a
  // device that carries it), or none for the tensor's own dtype. `input`: `bytes` of values to reduce into `tensor`
  // (out of place; it must not overlap `tensor`), or null to reduce `tensor` in place.
  Status AllReduce(std::uint64_t team, void* tensor, std::size_t bytes, DataType dtype, ReduceOp op,
                   StreamHandle stream, KeepAlive keep, std::optional<ops::LowFormat> wire = std::nullopt,
                   const void* input = nullptr, CallRole role = CallRole::kForward);
  Status ReduceScatter(std::uint64_t team, void* output, std::size_t output_bytes, const void* input,
                       std::size_t input_bytes, DataType dtype, ReduceOp op, StreamHandle stream, KeepAlive keep,
                       std::optional<ops::LowFormat> wire = std::nullopt, CallRole role = CallRole::kForward);
  Status AllToAll(std::uint64_t team, const std::vector<std::pair<const void*, std::size_t>>& sends, void* receive,
                  std::size_t receive_bytes, const std::vector<std::uint64_t>& receive_counts, const ElementType& type,
                  StreamHandle stream, KeepAlive keep, CallRole role = CallRole::kForward);
  // Point to point: `type` travels with the message, and a receiver of another dtype or size refuses it.
  Status Send(std::uint64_t team, const void* data, std::size_t bytes, const ElementType& type, int peer,
              StreamHandle stream, KeepAlive keep);
  Status Recv(std::uint64_t team, void* data, std::size_t bytes, const ElementType& type, int peer,
              StreamHandle stream, KeepAlive keep);
  // A fingerprinted sync that publishes `values` and returns every member's: up to 2n + 1 (n the most PEs of one
  // node) travel with the fingerprint, more (every member as many) through the team's staging, at most
  // CollectiveEngine::AgreeCapacity.
  Result<std::vector<std::vector<std::int64_t>>> Agree(std::uint64_t team, const Fingerprint& fingerprint,
                                                       const std::vector<std::int64_t>& values, StreamHandle stream);
  // MoE dispatch or combine (collectives/moe.h for the layouts). Collective over `args.team`: the members publish
  // their splits, source offsets and sizes with one fingerprinted sync (Agree; a row longer than a member's share of
  // the team's staging takes a sync per share; the split tables reach the host through the device: on a device that
  // does not arbitrate, a stream-ordered read after which the stream is synchronized, as Agree does), and every
  // member checks every member's call: a negative split, a chunk outside `input`, an `output` too small for what the
  // peers send (naming the rank, the expert and both sizes) fail the call on every member with the same
  // kInvalidArgument before anything is written. Then every member pulls its chunks out of the peers'
  // symmetric `input` (one Get per chunk, straight into place, and a closing barrier). Where a member's `input` is an
  // ordinary tensor, the engine's all_to_all moves the chunks through host staging on a device that arbitrates (its
  // memory is the host's); elsewhere each ordinary member's chunks pass through its copy of the team's staging area,
  // a window at a time (a Copy in, a sync, the receivers' Gets, a sync), every byte moved on the device.
  Status MoeExchange(const MoeExchangeArgs& args, StreamHandle stream, KeepAlive keep);
  // This rank refuses the call `collective` for `refusal`, a check of its own that failed above the runtime (a freed
  // tensor, a destroyed group): it enters the call's first sync so that every member fails with `refusal`, naming
  // this rank. Returns the refusal as every member reports it.
  Status Refuse(std::uint64_t team, Collective collective, const Status& refusal, StreamHandle stream,
                CallRole role = CallRole::kForward);
  // This rank gives up the team's next sync for `why` (a failure of its own above the runtime, e.g. across nodes):
  // the members waiting there, or arriving later, fail at once with `why`'s message. Local, never waits. Returns why.
  Status GiveUp(std::uint64_t team, const Status& why);
  // Test seam: the counter every team created from now on starts at (0 otherwise): tests run teams across the 32-bit
  // wrap of the ascend device's signals.
  void SetFirstTeamCounterForTesting(std::uint64_t counter) { teams_.set_first_counter(counter); }

  Result<StreamHandle> CreateStream();
  Status DestroyStream(StreamHandle stream);
  // Waits for the stream; then raises what the deferred checks of the teams' earlier calls found (once).
  Status SynchronizeStream(StreamHandle stream);
  // Compares what the deferred checks have read back so far, without waiting: a failure is recorded as the latest
  // failure (debug_state) and kept for the team's next call. Returns it.
  Status CheckDeferred();
  Status StreamWaitStream(StreamHandle waiter, StreamHandle waited);

  DebugSnapshot Snapshot() const;
  // The default wire format of the user API's reductions (SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE; std::nullopt: off):
  // the lifecycle's, read at Init, or the environment's while no lifecycle is active. A bad name fails here, in the
  // calls that take the default.
  Result<std::optional<ops::LowFormat>> LowPrecisionDefault() const;

  // Remembers `status` as the latest failure when it is not OK; returns it unchanged.
  Status Record(Status status) const;

 private:
  // One rank's part of a collective check, exchanged through the runtime's own control allocation.
  struct CheckRecord {
    std::uint64_t sequence;
    std::uint32_t op;        // CheckOp
    std::int32_t status;     // StatusCode of the local step
    std::uint64_t bytes;
    std::uint64_t alignment;
    std::uint64_t offset;
    std::uint64_t count;     // op-specific (live allocations at shutdown)
    std::uint64_t in_flight;   // shutdown: data-plane calls running on other threads
    std::uint64_t reserved;
  };
  static_assert(sizeof(CheckRecord) == 64, "a check record fills one cache line");
  enum class CheckOp : std::uint32_t { kEmpty = 1, kFree = 2, kShutdown = 3, kTeamPool = 4 };

  // Counts a data-plane call while it runs, for Shutdown: the heap must not be unmapped under it. Taken before
  // RequireInitialized, which Shutdown's `closing_` fails from then on, so no call slips past the count.
  class OperationScope {
   public:
    explicit OperationScope(const Runtime& runtime) : in_flight_(runtime.in_flight_) { in_flight_.fetch_add(1); }
    ~OperationScope() { in_flight_.fetch_sub(1); }
    OperationScope(const OperationScope&) = delete;
    OperationScope& operator=(const OperationScope&) = delete;

   private:
    std::atomic<std::uint64_t>& in_flight_;
  };

  Status RequireInitialized(const char* op) const;
  Status CheckPe(int pe, const char* what) const;
  // OK when `pe` (in range) lies on this rank's node, or when `remote_ok` (put, get, and the signal ops of
  // Device::signals_remotely) and the device reaches it remotely (Device::reaches_remotely); otherwise the fact,
  // naming both nodes and why the device does not reach it (Device::remote_absence), for data-plane `op`.
  Status CheckOnNode(int pe, const char* op, bool remote_ok = false) const;
  // DebugSnapshot::transports, from the device (set at Init).
  std::vector<std::string> Transports() const;
  // A signal: inside an active allocation and naturally aligned.
  Status CheckSignal(const void* symmetric_signal, SignalWidth width) const;
  // The checks shared by Put and Get: state, pe, equal byte counts, the symmetric side inside an allocation.
  Status CheckTransfer(const char* op, int pe, std::size_t dst_bytes, std::size_t src_bytes, const void* symmetric,
                       const char* symmetric_name) const;
  // Every contract of Reduce but the device's own.
  Status CheckReduce(const void* dst, std::size_t dst_bytes, const void* symmetric_src, std::size_t src_bytes,
                     DataType dtype, ReduceOp op, const std::vector<int>& pes) const;
  // Waits for every stream of this rank before a collective check.
  void QuiesceBeforeCollective();
  // Publishes `mine` to every rank and returns every rank's record (index = rank).
  Result<std::vector<CheckRecord>> Exchange(CheckRecord mine);
  static std::string Describe(const CheckRecord& record);
  // Runs the deferred checks of every live team (`take`: and returns their failure once).
  Status CheckTeams(bool take);
  // Reserves and clears the team pool (collective over the root, under mu_).
  Status ReserveTeamPool();
  // The live team `team` for `op`, with its lock held by the caller.
  Result<std::shared_ptr<Team>> LiveTeam(std::uint64_t team, const char* op) const;
  // The buffer [address, address + bytes) with its heap offset when it lies inside one active allocation.
  Buffer Resolve(const void* address, std::size_t bytes) const;
  Status TransferChunks(std::size_t bytes, const std::function<Status(std::size_t offset, std::size_t n)>& fn);

  mutable std::mutex mu_;   // lifecycle, allocation and the check exchange
  std::atomic<LifecycleState> state_{LifecycleState::kUninitialized};
  std::atomic<std::uint64_t> lifecycle_{0};   // read without mu_: callers may hold a framework lock
  mutable std::atomic<std::uint64_t> in_flight_{0};   // data-plane calls inside the runtime (OperationScope)
  std::atomic<bool> closing_{false};                  // a Shutdown is under way: new calls are refused
  int rank_ = -1;
  int world_size_ = 0;
  std::vector<int> nodes_;       // Device::nodes
  std::vector<int> node_pes_;    // the PEs of this rank's node, ascending: the scope of checks, barriers and teams
  int max_node_size_ = 0;        // the most PEs of one node: the most members a team may have
  Config config_;
  std::unique_ptr<Device> device_;
  AllocationRegistry registry_;
  void* control_ = nullptr;            // 2 * world_size CheckRecords, the first allocation of every lifecycle
  std::uint64_t check_sequence_ = 0;
  TeamPool teams_;
  void* team_pool_ = nullptr;
  // What Snapshot shows of the lifecycle, under a lock of its own (set at Init, cleared at Shutdown).
  struct Identity {
    int rank = -1;
    int world_size = 0;
    std::string device;
    std::uintptr_t heap_base = 0;
    std::size_t heap_size = 0;
    std::size_t internal_reserved = 0;   // the runtime's own control records
    Config config;
    bool reaches_peer_memory = false;
    std::vector<int> nodes;
    std::vector<std::string> transports;
    std::shared_ptr<const PeerLosses> losses;   // Device::peer_losses: turns a PE's transport into "lost"
  };
  mutable std::mutex identity_mu_;
  Identity identity_;
  mutable std::mutex failure_mu_;
  mutable std::string latest_failure_;
};

}  // namespace hp::shmem
