// The collective engine: every collective of a team, written once over the Device interface.
//
// Each collective picks one of four paths, the same on every rank (it decides from what every rank published):
//
//   one step     small messages: each rank stages its data in the staging half of the call's parity (the previous
//                call used the other one), one sync, then peers pull from it or reduce straight from it;
//   copy-free    every rank passes the same symmetric buffer (same heap offset, published with the first sync):
//                peers push into it, pull from it or reduce straight from it (all_reduce of a symmetric input into an
//                ordinary output: one-shot between two members, else staged reducing straight from the input);
//   peer memory  the device reaches peers' memory outside the heap (Device::reaches_peer_memory) and every rank
//                published its tensors' addresses: ranks pull from or reduce straight out of each other's ordinary
//                tensors, one copy of each byte;
//   staged       otherwise, in pieces of the staging size.
//
// The protocol (sync.cc, docs/engine.md "A call is one decision of every member"):
//   - A rank reads or writes a peer's memory only between two syncs of the team.
//   - The first sync of every call carries the call's fingerprint (team.h): what it computes, what it is for (its
//     role) and, when this rank refuses the call (an argument check that failed here), the refusal. Every member sees
//     every row: a refusal makes every member fail with it, ranks that disagree all fail with kMismatch naming both
//     calls, both before any data moves; the team stays in step for the next call.
//   - On a device that arbitrates (Device::arbitrates: the host device), every sync is an arrival counter: a member
//     that gives a sync up (its wait timed out, it was interrupted, a step of its call failed) makes that sync, and so
//     the call, fail on every member, a member arriving late included, which never reads what the member that gave up
//     has taken back. The next call of each member first waits for every member to have reached the given-up sync;
//     then the team runs on, its calls numbered alike. Syncs run on the calling thread, after the stream's earlier work.
//   - On other devices, syncs are dissemination barriers on the stream (parity words compared for equality), and a
//     failure breaks the team on the member that sees it.
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
  // `strict`: on a device that does not arbitrate, check every call before its data moves (the stream synchronized
  // at each first sync) instead of deferring the checks (HYPER_PARALLEL_SHMEM_CHECKS).
  CollectiveEngine(Device& device, Team& team, StreamHandle stream, KeepAlive keep,
                   CallRole role = CallRole::kForward, bool strict = false)
      : device_(device), team_(team), stream_(stream), keep_(std::move(keep)), role_(role), strict_(strict) {}

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
  // Point to point through the receiver's mailbox; messages between two ranks arrive in order. The header says what
  // the message is (`type`, bytes).
  Status Send(const Buffer& data, int peer, const ElementType& type);
  // Receives the next message of `peer` into `data`; a message of another dtype or size is drained and refused, and
  // the sender learns of the refusal at its next send or recv with this rank.
  Status Recv(const Buffer& data, int peer, const ElementType& type);
  // The call `collective` that this rank refuses for `refusal` (an argument check that failed here): it still enters
  // the call's first sync, so that every member fails with the same refusal, naming this rank, instead of waiting
  // for a call that will not come. Returns the refusal as every member reports it.
  Status Refuse(Collective collective, const Status& refusal);
  // The same for a call already begun (its fingerprint numbered): a refusal the call's own path finds.
  Status RefuseCall(Fingerprint fingerprint, const Status& refusal);
  // This rank gives up the team's next sync for `why` (a failure of its own outside the engine, e.g. across nodes):
  // the members waiting there, or arriving later, fail at once with `why`'s message. Returns `why`.
  Status GiveUp(const Status& why);
  // Compares what the deferred checks of earlier calls read back, as far as the stream has run (never waits); the
  // first failure is kept for this rank's next call on the team, and returned (once) here too when `take` is set.
  Status CheckDeferred(bool take);
  // A sync carrying `fingerprint` (collective, dtype, count, op, wire, peer as the caller fills them; sequence and
  // epoch are the engine's), after which every member's published `values` (at most AgreeCapacity) are returned in
  // group-rank order: for the algorithms the runtime's callers write over the primitives (fused ops, low precision,
  // MoE's split tables). Up to 2n + 1 values travel in the count row, with the fingerprint; more travel through the
  // staging half of the call's parity (a region per member, pulled after the sync), and then every member must
  // publish as many (the caller's fingerprint says so: its count is compared before anything is pulled).
  Result<std::vector<std::vector<std::int64_t>>> Agree(Fingerprint fingerprint, const std::vector<std::int64_t>& values);
  // The most values one Agree publishes per member, for a team of `team_size` staging through `staging_bytes` in a
  // pool laid out for `node_size` PEs: the same on every member.
  static std::size_t AgreeCapacity(int node_size, int team_size, std::size_t staging_bytes);

 private:
  // Whether this call's checks are deferred: the device does not arbitrate and no strict checks were asked for. Its
  // first sync then runs on the stream, and the paths are chosen from this rank's own arguments (the members' agree
  // when their fingerprints do), pulling only: a rank writes its own outputs and the slots assigned to it, so a
  // mismatch found later can leave wrong values in its own outputs, never anywhere else (deferred.cc).
  bool Deferred() const { return !device_.arbitrates() && !strict_; }
  // The values Agree publishes in a member's count row (the rest of the row is all_to_all's).
  static std::size_t AgreeCountRowValues(int node_size) { return 2 * static_cast<std::size_t>(node_size) + 1; }
  // The first sync of a deferred call: stages the row in stream order, syncs on the stream, and reads the table back
  // for a deferred check.
  Status OpenDeferred(Fingerprint fingerprint, const std::vector<std::int64_t>* counts = nullptr,
                      const std::string* statement = nullptr);
  // The first sync's publication (Open, OpenDeferred): numbers the sync (the team's next epoch, into `fingerprint`),
  // then puts this rank's statement (a refusal's text), count row and fingerprint row into its own tables at that
  // epoch's parity, copied now or staged where the stream reaches them (`in_stream_order`), then into every peer's.
  // The row goes last: a member that sees it sees the rest.
  Status PublishCall(Fingerprint& fingerprint, const std::vector<std::int64_t>* counts, const std::string* statement,
                     bool in_stream_order);
  // The check of one call as it reads back: OK, a refusal, or a mismatch (which breaks the team: its members may have
  // run different numbers of syncs since).
  Status CompareCall(const DeferredCheck& check, const std::vector<char>& table, const std::vector<std::int64_t>& counts);
  // all_to_all of a deferred call: a pairwise exchange through the mailbox with every peer in turn.
  Status AllToAllPairwise(const std::vector<Buffer>& sends, const Buffer& receive,
                          const std::vector<std::uint64_t>& receive_counts, const ElementType& type);
  // One piece of a message to `peer` (`seq`), and one from it, as Send and Recv move them.
  Status SendPiece(int peer, std::uint64_t seq, const MailboxHeader& header, const char* payload, std::size_t length);
  Status RecvPiece(int peer, std::uint64_t seq, const MailboxHeader& expected, char* payload, std::size_t length);

  // Starts a call: refuses it when the team is broken, waits for every member to have reached the sync the last
  // call gave up (if it did), numbers the call and fills the fingerprint's identity.
  Result<Fingerprint> Begin(Collective collective, const ElementType* type, std::uint64_t count,
                            std::uint32_t reduce_op, std::int32_t peer);
  // The first sync of a call: publishes `fingerprint` (with `counts`, this rank's count row; with `statement`, the
  // text of this rank's refusal), then checks every member's row: a refusal first, then a mismatch. Returns the rows;
  // with deferred checks, none (OpenDeferred: the check comes later).
  Result<std::vector<Fingerprint>> Open(Fingerprint fingerprint, const std::vector<std::int64_t>* counts = nullptr,
                                        const std::string* statement = nullptr);
  // The same, checked now whatever the device: the stream synchronized, the rows read on the host.
  Result<std::vector<Fingerprint>> OpenNow(Fingerprint fingerprint, const std::vector<std::int64_t>* counts = nullptr,
                                           const std::string* statement = nullptr);
  // A failure before the call's first sync (staging its data): the first sync is given up for every member.
  Status BeforeOpen(Status status);
  // Every sync after the first.
  Status Sync();
  // One sync at the current epoch: an arrival (arbitrating devices) or the dissemination barrier.
  Status Arrive();
  Status Disseminate();
  // What a failed sync means for the team (given up for every member, or broken here), as the call reports it.
  Status SyncFailed(const Status& status, bool first);
  // What follows a step of a call, for Broken: another sync of the call, the end of the call (the one-step paths
  // after their only sync), or not known yet (before the path is chosen).
  enum class Next { kSync, kCallEnd, kUnknown };
  // A step of the call failed after its first sync: the next sync is given up for every member. When the call ends
  // without another sync, that is the next call's first sync, whose number this rank takes too, so that the calls
  // stay numbered alike; when it is not known, the team is broken.
  Status Broken(Status status, const char* step, Next next = Next::kSync);
  // Gives up the sync after the current one for `reason`, with `why` as this rank's statement.
  Status GiveUpNext(GiveUpReason reason, const std::string& why);
  // The members whose row does not carry this sync's value yet.
  std::string MissingRanks(int parity, std::int64_t epoch_value);
  // The text member `rank` published as its statement at the current sync.
  std::string StatementOf(int rank);
  // A signal word of this rank's copy of the slot, in the device's width (0 when it cannot be read).
  std::int64_t ReadSignal(const void* symmetric_signal);
  // A message of this rank that `peer` refused (send/recv) since this rank last looked: its error, once.
  Status ReportRefusal(int peer);

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
  int Parity() const { return static_cast<int>(team_.sequence & 1); }
  const char* op_name() const { return op_name_; }

  Device& device_;
  Team& team_;
  StreamHandle stream_;
  KeepAlive keep_;
  CallRole role_;
  bool strict_;
  const char* op_name_ = "barrier";
};

}  // namespace hp::shmem
