// The Device interface: what the runtime needs from a symmetric-memory backend (host, ascend, later cuda).
//
// The runtime owns argument checking, the registry and the lifecycle; a device owns the symmetric heap and
// moves bytes. Every data-plane call is enqueued on a stream: kDefaultStream is the device's default stream
// (on the host device, the calling thread: the call completes before it returns).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/reduce_op.h"
#include "ops/wire_format.h"
#include "runtime/bootstrap.h"
#include "runtime/peer_losses.h"
#include "runtime/status.h"

namespace hp::shmem {

using StreamHandle = std::uintptr_t;
constexpr StreamHandle kDefaultStream = 0;

enum class SignalOp : int { kSet = 0, kAdd = 1 };
enum class CompareOp : int { kEq = 0, kNe = 1, kGt = 2, kGe = 3, kLt = 4, kLe = 5 };
const char* SignalOpName(SignalOp op);
const char* CompareOpName(CompareOp op);

// Signals are 4- or 8-byte signed integers in symmetric memory.
enum class SignalWidth : int { k32 = 4, k64 = 8 };

// Why a member gave up a sync (Device::Arrive, Device::GiveUp).
enum class GiveUpReason : int { kTimeout = 1, kInterrupted = 2, kFailed = 3 };
const char* GiveUpReasonName(GiveUpReason reason);

// One PE's part of Device::ExchangeMessages: what goes to it, where its message lands, and how that went.
struct MessageExchange {
  int pe = -1;
  const void* send = nullptr;        // null: nothing is sent
  std::size_t send_bytes = 0;
  void* receive = nullptr;           // null: nothing is received
  std::size_t receive_capacity = 0;
  std::size_t received = 0;          // out: the received message's length
  Status status;                     // out: this exchange's outcome
};

// An arrival counter of an arbitrated sync: a 64-bit word in symmetric memory. Its low 31 bits count the members that
// arrived; a member that gives the sync up sets kGivenUpBit (and bit 31, so that the low half a futex sleeps on
// changes too) and names itself and its reason, in the same atomic step: a counter is either complete (every member
// counted, no mark) or given up, never both. Marked words are larger than any count.
struct ArrivalCounter {
  static constexpr std::int64_t kGivenUpBit = std::int64_t{1} << 62;
  static constexpr std::int64_t Mark(int member, GiveUpReason reason) {
    return kGivenUpBit | (static_cast<std::int64_t>(reason) << 48) | (static_cast<std::int64_t>(member + 1) << 32) |
           (std::int64_t{1} << 31);
  }
  static constexpr std::int64_t Count(std::int64_t word) { return word & 0x7fffffff; }
  static constexpr bool GivenUp(std::int64_t word) { return (word & kGivenUpBit) != 0; }
  static constexpr int Member(std::int64_t word) { return static_cast<int>((word >> 32) & 0xffff) - 1; }
  static constexpr GiveUpReason Reason(std::int64_t word) { return static_cast<GiveUpReason>((word >> 48) & 0xff); }
};

struct DeviceInitArgs {
  int rank = 0;
  int world_size = 1;
  std::size_t heap_size = 0;
  double timeout_sec = 120.0;
};

// A run of encoded values (ops/wire_format.h) in this rank's heap: the block scales (fp8 formats; null for float16
// and bfloat16), then the codes. A peer's copy of the run lies at the same heap offsets.
struct WireRun {
  void* scales = nullptr;
  void* codes = nullptr;
};

// Keeps the buffers of an enqueued operation alive until it has run (e.g. torch tensors).
using KeepAlive = std::shared_ptr<const void>;

class Device;

// OK when [address, address + bytes) lies inside `device`'s own heap; otherwise the broken contract, naming `what`.
Status CheckInOwnHeap(const Device& device, const void* address, std::size_t bytes, const char* what);

class Device {
 public:
  virtual ~Device() = default;

  virtual const char* name() const = 0;

  // Collective over the bootstrap (every rank of the world): finds which ranks share this rank's node and maps the
  // symmetric heap of each of them.
  virtual Status Init(const DeviceInitArgs& args, Bootstrap& bootstrap) = 0;
  // Local: waits for every stream (a failure nobody synchronized is logged), releases the heap. Pointers into it
  // that escaped (aliases of tensors) must not crash the process afterwards: the host device leaves private zero
  // pages where the heaps were mapped. The device cannot be used afterwards.
  virtual Status Finalize() = 0;

  // Symmetric-heap memory (local address). Deterministic: the same call sequence on every rank gives the same
  // offsets from heap_base().
  //
  // collective_allocation(): Allocate is itself collective (every rank must call it, with the same request, or the
  // others wait inside the device's own barrier, e.g. CANN SHMEM's malloc). The runtime then agrees on the request
  // and on CheckAllocate's verdict across ranks first, and calls Allocate only when every rank will. Local and
  // immediate; Allocate's own failures after that (an exhausted heap) are agreed on after it, as for any device.
  virtual bool collective_allocation() const { return false; }
  virtual Status CheckAllocate(std::size_t /*bytes*/, std::size_t /*alignment*/) const { return Status::Ok(); }
  virtual Result<void*> Allocate(std::size_t bytes, std::size_t alignment) = 0;
  virtual Status Free(void* ptr) = 0;
  virtual std::size_t ReservedBytes(const void* ptr) const = 0;
  virtual std::uintptr_t heap_base() const = 0;
  virtual std::size_t heap_size() const = 0;

  // The node of every PE (index: PE), numbered by each node's lowest PE; agreed at Init, so the same list on every
  // rank. A node is the PEs whose heaps this device maps: Put, Get, Signal, WaitSignal, Reduce, Decode,
  // ReduceEncoded, PeerAddress, GetPeerMemory and ReducePeerMemory reach the PEs of this rank's node only (but see
  // reaches_remotely), and Barrier counts them only. The host device's node is the ranks that share its
  // shared-memory filesystem (one machine); the ascend device's is the NPUs that reach each other over MTE (one host
  // and, on a 910B, one HCCS group of 8).
  virtual const std::vector<int>& nodes() const = 0;
  // Whether Put, Get and Signal (the ops of signals_remotely) reach `pe` although it lies outside this rank's node:
  // over a transport the device opened at Init (the ascend device's RoCE, the host device's UCX), not through mapped
  // memory, so PeerAddress and the in-place reductions still stop at the node. Local and immediate; false for a PE
  // of this rank's node.
  virtual bool reaches_remotely(int /*pe*/) const { return false; }
  // Which signal ops reach the PEs of reaches_remotely: set on every such device; add where the transport has
  // remote atomics (the host device's UCX; the ascend device's add is an MTE atomic, which stops at the node).
  virtual bool signals_remotely(SignalOp op) const { return op == SignalOp::kSet; }
  // Why this device reaches no PE of another node, and the remedy, for the refusal's message; empty when it
  // reaches them or has nothing to add. Agreed at Init.
  virtual std::string remote_absence() const { return {}; }
  // What carries the calls to the PEs of reaches_remotely, for diagnostics (debug_state's "transports").
  virtual std::string remote_transport() const { return "remote"; }
  // The PEs of reaches_remotely found gone since Init (their process exited or their node died), for diagnostics:
  // debug_state's "transports" says "lost" for them. Null where the device watches no remote peer. The record may
  // outlive the device (the runtime reads it without its lock).
  virtual std::shared_ptr<const PeerLosses> peer_losses() const { return nullptr; }
  // Perf diagnostics only (the perf tool's floor column): the remote transport's own write (`put`) of `bytes` at
  // `local` into `symmetric`'s heap offset on `pe`, or read of them into `local`, complete when it returns, with none
  // of the data plane's streams, chunking or checks: the floor under Put and Get to a PE of reaches_remotely. The
  // runtime checks `pe` and that `symmetric` lies in this rank's heap. A device without a remote transport refuses.
  virtual Status RemoteTransportTransfer(bool /*put*/, void* /*symmetric*/, void* /*local*/, std::size_t /*bytes*/,
                                         int pe) {
    return StateError(std::string("a remote transport must reach `pe`, but device ") + name() +
                      " has none: pe=" + std::to_string(pe));
  }

  // Two-sided messages with PEs of reaches_remotely, for the phase across nodes of the teams that span nodes (their
  // lane exchange, run by the framework handler). For each of `count` exchanges: sends `send_bytes` of host memory at
  // `send` to its `pe` as one message under `tag` (null `send`: none) and receives the next message that `pe` sent to
  // this rank under `tag` into host memory at `receive`, at most `receive_capacity` bytes (null `receive`: none).
  // Not collective (each PE of a pair calls it). Every direction of every exchange is posted at once, so no two PEs
  // wait for each other's order and the exchanges overlap on the wire; messages from one PE under one tag arrive in
  // the order they were sent. Not ordered with any stream; synchronous: every exchange is complete or failed when it
  // returns, within one timeout for all. Returns a refusal, with nothing posted, for bad input (a `pe` it does not
  // reach, a `tag` too wide); otherwise Ok, and each exchange's own outcome in its `status` (naming its `pe`: a PE
  // found gone fails its exchange at once, a message longer than `receive_capacity` fails it), its received length in
  // `received`. A device without a remote transport refuses.
  virtual Status ExchangeMessages(std::uint64_t /*tag*/, MessageExchange* exchanges, std::size_t count) {
    return StateError(std::string("a remote transport must reach `pe`, but device ") + name() +
                      " has none: op=exchange_messages pe=" + (count > 0 ? std::to_string(exchanges[0].pe) : "none"));
  }

  // Local copies between host memory and this rank's own heap, for the runtime's own records. The heap may be
  // device memory that the host cannot dereference (an NPU's): these are the only way the host reads or writes it.
  // Synchronous, and not ordered with stream work: the caller makes sure nothing enqueued touches the range.
  // `symmetric_*` must lie inside this rank's heap; zero bytes are a no-op.
  virtual Status CopyToHeap(void* symmetric_dst, const void* host_src, std::size_t bytes) = 0;
  virtual Status CopyFromHeap(void* host_dst, const void* symmetric_src, std::size_t bytes) = 0;

  // The same between host memory and this rank's heap, in stream order and without waiting: a device whose heap the
  // host cannot read without stopping the stream (an NPU's) runs the engine's collectives on these (their fingerprints,
  // count rows and message headers), so that no collective synchronizes the stream.
  //
  // Copies `bytes` of host memory at `host_src` into this rank's heap at `symmetric_dst` (or other memory of this
  // device: a tensor's storage, as MoE's split tables are), in order on `stream`. The bytes are taken before the call
  // returns (the caller may reuse `host_src`).
  virtual Status StageFromHost(void* symmetric_dst, const void* host_src, std::size_t bytes, StreamHandle stream);
  // Starts a read of `bytes` of this rank's heap at `symmetric_src` (or other memory of this device) in order on
  // `stream`; never waits. The token names the read for TakeRead.
  virtual Result<std::uint64_t> ReadLater(const void* symmetric_src, std::size_t bytes, StreamHandle stream);
  // Whether the read of `token` has run; when it has, its bytes land in `host_dst` (as many as ReadLater asked for)
  // and the token is spent. Never waits. A read whose stream failed reports the stream's failure.
  virtual Result<bool> TakeRead(std::uint64_t token, void* host_dst);

  // Largest byte count one Put/Get call may carry; 0 means no limit. The runtime splits larger transfers.
  virtual std::size_t max_transfer_bytes() const = 0;
  // The signal width the device handles natively (CANN SHMEM's signals are int32): what internal protocols use.
  virtual SignalWidth native_signal_width() const { return SignalWidth::k64; }

  // Data plane. `symmetric_*` pointers are local addresses inside the heap; the device addresses the same heap
  // offset on `pe`. Stream order is the only completion guarantee.
  virtual Status Put(void* symmetric_dst, const void* src, std::size_t bytes, int pe, StreamHandle stream,
                     KeepAlive keep) = 0;
  virtual Status Get(void* dst, const void* symmetric_src, std::size_t bytes, int pe, StreamHandle stream,
                     KeepAlive keep) = 0;
  // Atomically sets or adds `value` to the signal at the same offset on `pe`; everything enqueued on `stream`
  // before it is visible (on whichever PE it was written) before the new signal value is, so that a chain of signals
  // carries the visibility of every write before it (the team's dissemination barrier relies on it).
  virtual Status Signal(void* symmetric_signal, SignalWidth width, std::int64_t value, SignalOp op, int pe,
                        StreamHandle stream) = 0;
  // Put, then Signal, to the same `pe` on `stream`: `bytes` of `src` land at `symmetric_dst`'s offset on `pe` and are
  // visible there (with everything enqueued on `stream` before) before the new signal value is. Completes in stream
  // order, as one operation (on kDefaultStream, before it returns). Zero bytes signal only. The default enqueues Put,
  // then Signal; a device with a transport that orders the two on the wire overrides it to wait once for both (the
  // host device, to a PE of another node). The caller checked both halves.
  virtual Status PutWithSignal(void* symmetric_dst, const void* src, std::size_t bytes, void* symmetric_signal,
                               SignalWidth width, std::int64_t value, SignalOp op, int pe, StreamHandle stream,
                               KeepAlive keep);
  // Waits until the local signal compares true against `value`, at most the configured timeout.
  virtual Status WaitSignal(void* symmetric_signal, SignalWidth width, CompareOp cmp, std::int64_t value,
                            StreamHandle stream) = 0;
  // Reduces one heap range across `pes` into local memory: dst[i] = op over pe in `pes` of symmetric_src[i] as
  // it is on pe, for `count` elements of `dtype`. `dst` may be `symmetric_src` itself (in place); every other
  // range of `dst` must not overlap a source. The caller orders it after the peers' writes (signals).
  virtual Status Reduce(void* dst, const void* symmetric_src, std::size_t count, DataType dtype, ReduceOp op,
                        const std::vector<int>& pes, StreamHandle stream, KeepAlive keep) = 0;
  // Low-precision communication: values travel encoded in an ops::LowFormat and are summed in full precision on
  // arrival. Every rank encodes and decodes on its own device (host: the vectorised codec of ops/host/codec.h), so
  // ranks that decode the same codes get bit-identical values.
  //
  // Whether this device encodes `format`: local and immediate. A refusal names what the device lacks.
  virtual Status CheckWireFormat(ops::LowFormat format) const = 0;
  // Encodes `count` values of `dtype` (floating point, wider than `format`) at `src` (this rank's memory or heap) into
  // `dst` (this rank's heap, ScaleCount(count) scales for the fp8 formats), for peers to read after a signal.
  virtual Status Encode(ops::LowFormat format, DataType dtype, const void* src, std::size_t count, WireRun dst,
                        StreamHandle stream, KeepAlive keep) = 0;
  // Decodes the `count` codes of the run at `symmetric_src`'s offsets on `pe` into `out` (local, `dtype`).
  virtual Status Decode(ops::LowFormat format, WireRun symmetric_src, int pe, std::size_t count, DataType dtype,
                        void* out, StreamHandle stream, KeepAlive keep) = 0;
  // The owner's step of a low-precision reduction: out[i] = `own`[i] (when not null; `dtype`, may be `out` itself)
  // plus the decoded run at `symmetric_src`'s offsets on every PE of `pes`, in that order, summed in float32 (float64
  // for a float64 `dtype`) and divided by the number of terms for kAvg (kSum and kAvg only). When `reencode.codes` is
  // set, the result is encoded into it (this rank's heap) and `out` receives the decoding of those codes: what every
  // peer decodes. Ordered after the peers' writes by the caller (signals).
  virtual Status ReduceEncoded(ops::LowFormat format, DataType dtype, ReduceOp op, const void* own,
                               WireRun symmetric_src, const std::vector<int>& pes, std::size_t count, void* out,
                               WireRun reencode, StreamHandle stream, KeepAlive keep) = 0;
  // MoE's wire rows (ops/wire_format.h, WireRowBytes), on this device and in `stream` order: an NPU's rows never
  // pass through host memory. Encodes `rows` rows of `row_elems` values of `dtype` (floating point, wider than
  // `format`), contiguous at `src`, into `rows` wire rows at `dst`: this rank's memory, heap or not, not overlapping.
  // A float16 or bfloat16 row is the plain cast, as Encode's; an fp8 row is its float32 scale, then its codes
  // (ops/host/codec.h, HostEncodeRows). Local, not collective; a format the device lacks is refused as
  // CheckWireFormat refuses it, before anything is enqueued.
  virtual Status EncodeRows(ops::LowFormat format, DataType dtype, const void* src, std::size_t rows,
                            std::size_t row_elems, void* dst, StreamHandle stream, KeepAlive keep) = 0;
  // EncodeRows undone: the `rows` wire rows at `src` decoded into `rows` x `row_elems` values of `dtype` at `out`
  // (each value its code's exact value, rounded once into `dtype`).
  virtual Status DecodeRows(ops::LowFormat format, const void* src, std::size_t rows, std::size_t row_elems,
                            DataType dtype, void* out, StreamHandle stream, KeepAlive keep) = 0;
  // The address of `symmetric`'s heap offset on `pe` (a local heap address in, an address on `pe` out), for
  // kernels and tensors that read or write a peer's memory directly. Not ordered with any stream: the caller
  // orders the accesses (signals, barriers).
  virtual Result<void*> PeerAddress(const void* symmetric, int pe) const = 0;
  // Every rank of this rank's node reaches the barrier, and everything enqueued before it (on those ranks) is
  // complete and visible.
  virtual Status Barrier(StreamHandle stream) = 0;

  // Arbitration: one decision of every member of a sync. A device whose host reaches every heap of its node with
  // atomic operations (the host device) arbitrates: the engine's syncs on it are arrival counters (ArrivalCounter) in
  // the heap of a team's first member, so that when a member gives a sync up (its wait timed out, it was interrupted,
  // or a step of the call failed) the members agree on whether the sync happened: every member passes it, or every
  // member fails it, and a member arriving late fails at once. Devices that do not arbitrate (stream devices whose
  // heap the host cannot read without stopping the stream) refuse these calls.
  //
  // Whether this device arbitrates: local and immediate.
  virtual bool arbitrates() const { return false; }
  // Counts this member's arrival on the counter at `symmetric_counter` on `members[0]`, then waits until every one of
  // `members` (PEs, this rank's at index `member`) arrived. Fails at once, naming who gave the sync up and why, when
  // the counter is marked given up (before or during the wait: kStateError). When this member's own wait times out
  // or is interrupted, it marks the counter given up on its own behalf unless every member has arrived by then (the
  // sync happened: it completes), and fails with kTimeout or kInterrupted. Synchronous (the caller finishes its
  // streams' work first): every member's writes before its arrival are visible once it completes.
  virtual Status Arrive(void* symmetric_counter, const std::vector<int>& members, int member);
  // This member gives the sync up for `reason` before arriving at it: marks the counter (unless it is marked
  // already), then counts its arrival, so that the members waiting there fail at once and the count still reaches
  // every member once they all passed by. Synchronous; never waits.
  virtual Status GiveUp(void* symmetric_counter, const std::vector<int>& members, int member, GiveUpReason reason);
  // Waits until every one of `members` arrived at the counter, given up or not: after a given-up sync, no member
  // is still inside the call before it. Synchronous, bounded by the timeout.
  virtual Status AwaitArrivals(const void* symmetric_counter, const std::vector<int>& members);
  // The counter's value now (synchronous).
  virtual Result<std::int64_t> ReadCounter(const void* symmetric_counter, int pe);

  // Peers' memory outside the heap: ordinary tensors, at the addresses their own process sees. A device that reaches
  // it lets the collectives on ordinary tensors move each byte once, straight between the ranks' buffers, instead of
  // twice through the heap. The host device reaches it through the kernel's cross-memory attach where the system
  // allows it; an accelerator's memory is reached through the symmetric heap only.
  //
  // Whether this device reaches peers' memory: agreed at Init, so the same on every rank.
  virtual bool reaches_peer_memory() const = 0;
  // Copies `bytes` from `peer_address` (an address in `pe`'s own address space; this rank's when `pe` is this rank)
  // into `dst` (this rank's memory). The caller orders it between the syncs that bracket the peer's use of the
  // memory; a range the peer has not mapped fails, naming the address.
  virtual Status GetPeerMemory(void* dst, std::uint64_t peer_address, std::size_t bytes, int pe, StreamHandle stream,
                               KeepAlive keep) = 0;
  // Reduce with the sources anywhere in the members' memory: dst[i] = op over k of the element i at addresses[k] in
  // pes[k]'s address space, combined in that order (Reduce's rules for float16, bfloat16 and kAvg). `dst` (this
  // rank's memory) may be this rank's own source exactly; otherwise it must not overlap one.
  virtual Status ReducePeerMemory(void* dst, const std::vector<std::uint64_t>& addresses, const std::vector<int>& pes,
                                  std::size_t count, DataType dtype, ReduceOp op, StreamHandle stream,
                                  KeepAlive keep) = 0;

  // Local copy. `bytes` from `src` to `dst`, both memory this rank's device addresses (its own heap, or memory of
  // the device outside the heap: a tensor's storage), neither a peer's. Not collective; ordered on `stream` like
  // every data-plane call, and complete when the stream reaches it (on kDefaultStream, before it returns). The
  // ranges must not overlap; zero bytes are a no-op. Unlike Put/Get with this rank's own pe, neither side has to
  // lie in the heap, and no byte limit applies (max_transfer_bytes is for Put/Get).
  virtual Status Copy(void* dst, const void* src, std::size_t bytes, StreamHandle stream, KeepAlive keep) = 0;

  // Streams.
  virtual Result<StreamHandle> CreateStream() = 0;
  // Releases the stream at once, like cudaStreamDestroy: work already queued on it still runs (Quiesce and
  // Finalize wait for it); a failure of that work is logged, since nobody can synchronize the stream any more.
  virtual Status DestroyStream(StreamHandle stream) = 0;
  virtual Status SynchronizeStream(StreamHandle stream) = 0;
  // Work enqueued on `waiter` after this call starts only when the work enqueued on `waited` so far is done.
  virtual Status StreamWaitStream(StreamHandle waiter, StreamHandle waited) = 0;
  // Waits for every stream of the device (destroyed ones too). Returns the first failure still pending on a
  // stream without clearing it: that stream's SynchronizeStream still reports it.
  virtual Status Quiesce() = 0;
};

}  // namespace hp::shmem
