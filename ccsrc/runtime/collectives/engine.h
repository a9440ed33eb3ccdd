// The collective engine: every collective of a team, written once over the Device interface.
//
// Each collective picks one of four paths, the same on every rank (it decides from what every rank published):
//
//   one step     small messages: each rank stages its data in the staging half of the call's parity (the previous
//                call used the other one), one sync, then peers pull from it or reduce straight from it;
//   copy-free    every rank passes the same symmetric buffer (same heap offset, published with the first sync):
//                peers push into it, pull from it or reduce straight from it;
//   peer memory  the device reaches peers' memory outside the heap (Device::reaches_peer_memory) and every rank
//                published its tensors' addresses: ranks pull from or reduce straight out of each other's ordinary
//                tensors, one copy of each byte;
//   staged       otherwise, in pieces of the staging size.
//
// A rank reads or writes a peer's memory only between two syncs of the team. The first sync of every call carries
// the call's fingerprint (Team.h): ranks that disagree all fail with kMismatch naming both calls before any data
// moves, and stay in step for the next call. A timeout in that first sync leaves the team where it was, so that a
// retry pairs with the peers' call; a failure later in a call (a peer died mid-way) breaks the team.
//
// Every device call is enqueued on `stream`; the engine synchronizes it before the host reads what peers published
// (fingerprints, counts, message headers). Calls on one team are serialized (Team::mu).
//
// One file per family, each naming its paths: sync.cc (the protocol), transfers.cc (the data plane by group rank),
// all_gather.cc, all_reduce.cc, reduce_scatter.cc, all_to_all.cc, send_recv.cc, low_precision.cc; paths.h holds
// what they share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/reduce_op.h"
#include "ops/wire_format.h"
#include "runtime/device.h"
#include "runtime/team.h"

namespace hp::shmem {

// An element type as the engine sees it: its name (for fingerprints and messages), its size, and the reduction type
// when it has one.
struct ElementType {
  std::string name;
  std::size_t bytes = 1;
  bool reducible = false;
  DataType reduce_type = DataType::kUInt8;
};

// One collective call's buffers as the runtime resolved them: local addresses, and the heap offset of each when it
// lies inside an active allocation (-1 otherwise).
struct Buffer {
  void* address = nullptr;
  std::size_t bytes = 0;
  std::int64_t heap_offset = -1;
};

class CollectiveEngine {
 public:
  CollectiveEngine(Device& device, Team& team, StreamHandle stream, KeepAlive keep)
      : device_(device), team_(team), stream_(stream), keep_(std::move(keep)) {}

  // Every member reaches the barrier; everything enqueued before it on `stream` is visible to every member.
  Status Barrier();
  // output (n x input.bytes) receives group rank r's input at r x input.bytes. input may be this rank's part.
  Status AllGather(const Buffer& output, const Buffer& input, const ElementType& type);
  // output receives input reduced across the members; input may be output itself (in place), or must not overlap it.
  // Every rank ends with bit-identical values.
  Status AllReduce(const Buffer& output, const Buffer& input, const ElementType& type, ReduceOp op);
  // input (n equal parts); output receives part `me` reduced. output may be this rank's part of input.
  Status ReduceScatter(const Buffer& output, const Buffer& input, const ElementType& type, ReduceOp op);
  // Low-precision all_reduce in place ('sum' or 'avg' of a floating-point type wider than `format`): values travel
  // encoded (Device::Encode) and are summed in full precision. Up to the one-step size each rank encodes its tensor
  // once into its staging half and every rank sums every rank's codes in group-rank order; beyond it, two-shot: the
  // owner of each part sums the peers' codes of it with its own values, encodes the result once more, and every rank
  // decodes those codes. Either way every rank ends with bit-identical values. A team of one runs AllReduce.
  // Out of place (`input` not `tensor`), the input is first copied into `tensor` on this rank.
  Status AllReduceLowPrecision(const Buffer& tensor, const Buffer& input, const ElementType& type, ReduceOp op,
                               ops::LowFormat format);
  // Low-precision reduce_scatter: each rank encodes every part but its own into a slot for the part's owner, which
  // sums them with its own part in full precision. A team of one runs ReduceScatter.
  Status ReduceScatterLowPrecision(const Buffer& output, const Buffer& input, const ElementType& type, ReduceOp op,
                                   ops::LowFormat format);
  // sends[j] goes to group rank j; receive gets rank i's part at the sum of receive_counts[<i] elements. Counts are
  // checked across ranks before anything is written.
  Status AllToAll(const std::vector<Buffer>& sends, const Buffer& receive, const std::vector<std::uint64_t>& receive_counts,
                  const ElementType& type);
  // Point to point through the receiver's mailbox; messages between two ranks arrive in order.
  Status Send(const Buffer& data, int peer);
  // Receives the next message of `peer` into `data`; a message of another size is drained and refused.
  Status Recv(const Buffer& data, int peer);
  // A sync carrying `fingerprint` (collective, dtype, count, op, wire, peer as the caller fills them; sequence and
  // epoch are the engine's), after which every member's published `values` (at most 2n + 1) are returned in
  // group-rank order: for the algorithms the runtime's callers write over the primitives (fused ops, low precision).
  Result<std::vector<std::vector<std::int64_t>>> Agree(Fingerprint fingerprint, const std::vector<std::int64_t>& values);

 private:
  // Starts a call: numbers it and fills the fingerprint's identity.
  Fingerprint Begin(Collective collective, const ElementType* type, std::uint64_t count, std::uint32_t reduce_op,
                    std::int32_t peer);
  // The first sync of a call: publishes `fingerprint` (and, when `counts` is set, this rank's count row), checks every
  // member's, and returns them. Rolls the team back on a timeout.
  Result<std::vector<Fingerprint>> Open(Fingerprint fingerprint, const std::vector<std::int64_t>* counts = nullptr);
  // A failure before the call's first sync (staging its data): no peer saw the call, so its number is given back and
  // a retry pairs with the peers' call.
  Status BeforeOpen(Status status);
  // Every sync after the first.
  Status Sync();
  // The dissemination barrier at the current epoch.
  Status Disseminate();
  // Marks the team broken when a call fails after its first sync.
  Status Broken(Status status, const char* step);
  std::string MissingRanks(int parity, std::uint64_t epoch_value);

  Status Put(void* symmetric_dst, const void* src, std::size_t bytes, int group_rank);
  Status Get(void* dst, const void* symmetric_src, std::size_t bytes, int group_rank);
  Status Reduce(void* dst, const void* symmetric_src, std::size_t count, const ElementType& type, ReduceOp op);
  // This rank's `address` as peers read it when the device reaches their memory, 0 (published nothing) otherwise.
  std::uint64_t Published(const void* address) const;
  Status GetPeerMemory(void* dst, std::uint64_t peer_address, std::size_t bytes, int group_rank);
  // dst = op over every member's published `column` address + `offset` bytes, `count` elements.
  Status ReducePeerMemory(void* dst, const std::vector<Fingerprint>& rows, int column, std::size_t offset,
                          std::size_t count, const ElementType& type, ReduceOp op);
  Status SwapBlocks(char* out, const std::vector<std::size_t>& starts, const std::vector<std::vector<std::int64_t>>& table,
                    std::size_t element_bytes);

  // The largest message this call takes in one step (`reduces`: all_reduce, reduce_scatter): the team's one-step size,
  // lower where the device reaches peers' memory. The same on every rank.
  std::size_t OneStepBytes(bool reduces) const;
  std::int64_t EpochValue() const { return team_.signal_base + static_cast<std::int64_t>(team_.epoch); }
  int Parity() const { return static_cast<int>(team_.sequence & 1); }
  const char* op_name() const { return op_name_; }

  Device& device_;
  Team& team_;
  StreamHandle stream_;
  KeepAlive keep_;
  const char* op_name_ = "barrier";
  Fingerprint current_{};
};

}  // namespace hp::shmem
