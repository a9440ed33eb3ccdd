// Teams: a set of PEs that runs collectives together, with the workspace they stage through and the protocols that
// keep them in step.
//
// The runtime reserves one symmetric *team pool* when the root team is created (collective over the root): slot 0
// for the root team, kSubTeamSlots slots for the other teams. A slot is laid out once (TeamSlotLayout):
//
//   signals     every word peers write concurrently, each on a 64-byte line of its own (an NPU's signal write cleans
//               and invalidates the whole line it lies in, losing a neighbour's concurrent write): the dissemination
//               words (one per round and parity), the arrival counters of arbitrated syncs (three), the send/recv
//               words (one per sender and mailbox piece, one per receiver and piece), the refusal words of send/recv
//               (one per receiver), the release count
//   tables      the fingerprint table (2 parities x members), the statements (2 parities x members: the text of a
//               refusal or of a given-up call), the receipts (members x mailbox pieces: what a receiver expected of
//               a message this rank sent), the count table (2 parities x members x 3n + 1)
//   staging     bounce space for collectives whose tensors are not symmetric (two halves for one-step ops)
//   mailbox     one region per sender for send/recv, kMailboxPieces pieces in flight, each a header and a payload
//
// Every value a protocol writes into a signal word is SignalValue(counter), with counters that only grow, and every
// wait compares for equality with the value it expects: a word is written again only after its reader has seen the
// value before, so 32-bit signals (CANN SHMEM's) survive their wrap, and no word ever needs resetting within a team.
// A team made in a slot starts from words its members zeroed (SignalValue is never 0).
//
// A team is created collectively by its members (through a Bootstrap over them: bounded, naming who did not
// arrive); the members agree on the lowest slot free on all of them. Releasing is local and never waits: the
// releasing rank adds one to the release count of the slot on every member, and a rank reuses a slot only once it is
// released there and every member of the slot's last team has released it, so no late write of that team can reach
// the next one.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/bootstrap.h"
#include "runtime/device.h"
#include "runtime/status.h"

namespace hp::shmem {

// Collectives a fingerprint names. One numbering for every layer: the bindings export it.
enum class Collective : std::uint32_t {
  kBarrier = 1,
  kAllGather = 2,
  kAllReduce = 3,
  kReduceScatter = 4,
  kAllToAll = 5,
  kFusedAllGatherMatmul = 6,
  kFusedMatmulReduceScatter = 7,
  kRelease = 8,
  kMoeDispatch = 9,
  kMoeCombine = 10,
};
const char* CollectiveName(Collective collective);

// Wire formats a fingerprint names (0: the tensor's own dtype). The low-precision formats follow ops::LowFormat + 1.
constexpr std::uint32_t kWireFull = 0;

// What a call is for, beside what it computes: a gradient's collective never pairs with a forward one, nor one phase
// of a fused op with another. One numbering for every layer: the bindings export it.
enum class CallRole : std::uint32_t {
  kForward = 0,
  kBackward = 1,
  kFusedGather = 2,    // the fused ops' own syncs, by phase
  kFusedScatter = 3,
};
const char* CallRoleName(CallRole role);

// What a rank says it is calling, carried by every sync of a team. Ranks compare every field but `epoch`, `where`,
// `address` and `refusal`, which carry what each rank publishes for the others: the heap offsets of its tensors (-1
// for none), when the device reaches peers' memory their addresses in its own process (0 for none), and a refusal.
struct Fingerprint {
  std::uint64_t epoch;      // SignalValue of the sync's epoch: tells who arrived
  std::uint64_t sequence;   // the team's call number
  std::uint32_t collective;
  std::uint32_t reduce_op;  // ReduceOp + 1, 0 for none
  std::uint32_t wire;       // kWireFull or a low-precision format + 1
  std::int32_t peer;        // root or peer group rank, -1 for none
  std::uint64_t count;      // elements (op-specific: all_gather's input, reduce_scatter's output)
  std::uint64_t element_bytes;
  char dtype[24];           // NUL-terminated name ("float32"), "" for none
  std::int64_t where[4];
  std::uint64_t address[2];
  std::uint32_t role;       // CallRole
  std::int32_t refusal;     // a StatusCode when this rank refuses the call (its statement says why), 0 otherwise
};
static_assert(sizeof(Fingerprint) == 128, "a fingerprint is laid out the same on every rank");
// A call's fingerprint from the fields a handler's agree entry names (the sync fills in the rest). `dtype`: at most
// 23 characters, "" for none; a longer name is cut, which only a mismatch message would show.
Fingerprint CallFingerprint(std::uint32_t collective, std::uint32_t reduce_op, std::uint32_t wire, std::int32_t peer,
                            std::uint64_t count, std::uint64_t element_bytes, const std::string& dtype, CallRole role);
// "collective=all_reduce sequence=3 dtype=float32 count=8 op=sum wire=full": what a message names of a call.
std::string DescribeFingerprint(const Fingerprint& fingerprint);
// The first field on which two calls differ ("" when they agree).
std::string FingerprintDifference(const Fingerprint& a, const Fingerprint& b);

// The value a signal word holds for `counter`: in [1, 2^31 - 1], never 0 (a zeroed word), and consecutive counters
// differ, also across the 32-bit wrap.
constexpr std::int64_t kSignalPeriod = (std::int64_t{1} << 31) - 1;
inline std::int64_t SignalValue(std::uint64_t counter) {
  return 1 + static_cast<std::int64_t>(counter % static_cast<std::uint64_t>(kSignalPeriod));
}

// Bytes of a member's statement: the text every member reads when that member refuses or gives up a call.
constexpr std::size_t kStatementBytes = 256;
// Each signal word lies alone on a line of this size.
constexpr std::size_t kSignalLineBytes = 64;
// Arbitrated syncs (Device::arbitrates) count arrivals on three words of the team's first member, used in turn: the
// word of sync e is zeroed by that member when it arrives at sync e - 2, when everyone is past sync e - 3, the
// word's last use.
constexpr int kArrivalWords = 3;

constexpr int kSubTeamSlots = 64;
constexpr int kTeamSlots = kSubTeamSlots + 1;   // slot 0: the root team
constexpr int kMailboxPieces = 4;               // send/recv pieces in flight per (sender, receiver)
constexpr std::size_t kMailboxHeaderBytes = 64;
// A message's header: the piece number, then what the message is (so a receiver of another dtype or size refuses it).
struct MailboxHeader {
  std::uint64_t piece;
  std::uint64_t bytes;
  char dtype[16];   // NUL-terminated name of the element type ("float32")
};
static_assert(sizeof(MailboxHeader) == 32, "a mailbox header is laid out the same on every rank");
// A message of at most this many bytes travels in its header's cache line, right after the header: the receiver reads
// one line per message instead of two.
constexpr std::size_t kMailboxInlineBytes = kMailboxHeaderBytes - sizeof(MailboxHeader);

// Where everything lies inside one slot. The same on every rank (it depends on the heap size and the root's size).
struct TeamSlotLayout {
  int world_size = 0;
  int rounds = 0;                      // dissemination rounds (enough for the root)
  std::size_t dissemination = 0;       // rounds x 2 parities: the round's partner signals the sync's value
  std::size_t arrivals = 0;            // kArrivalWords counters (arbitrated syncs; used in the first member's slot)
  std::size_t sent = 0;                // world x kMailboxPieces: sender i put its piece k here
  std::size_t acked = 0;               // world x kMailboxPieces: receiver i took this rank's piece k
  std::size_t refused = 0;             // world: receiver i refused a message of this rank
  std::size_t release_count = 0;
  std::size_t signals_bytes = 0;       // every signal word above: what a new team's members zero
  std::size_t tables = 0;              // 2 parities x (world x Fingerprint, then world x kStatementBytes)
  std::size_t table_bytes = 0;         // one parity's: what a deferred check reads back in one piece
  std::size_t receipts = 0;            // world x kMailboxPieces x MailboxHeader: receiver i's view of piece k
  std::size_t counts = 0;              // 2 x world x (3 world + 1) x int64
  std::size_t control_bytes = 0;       // the above, rounded up to a page
  std::size_t staging = 0;
  std::size_t staging_bytes = 0;
  std::size_t mailbox = 0;
  std::size_t mailbox_bytes = 0;       // = staging_bytes
  std::size_t slot_bytes = 0;

  static TeamSlotLayout For(int world_size, std::size_t staging_bytes);
  std::size_t count_row_bytes() const { return (3 * static_cast<std::size_t>(world_size) + 1) * sizeof(std::int64_t); }
};

// The pool's two layouts: the root slot stages more (every op of the root group goes through it). `world_size`: the
// most members a team may have (the PEs of the largest node).
struct TeamPoolLayout {
  TeamSlotLayout root;
  TeamSlotLayout sub;
  std::size_t total_bytes = 0;
  static TeamPoolLayout For(std::size_t heap_size, int world_size);
  std::size_t SlotOffset(int slot) const {
    return slot == 0 ? 0 : root.slot_bytes + static_cast<std::size_t>(slot - 1) * sub.slot_bytes;
  }
  const TeamSlotLayout& Of(int slot) const { return slot == 0 ? root : sub; }
};

// A check of a call that the engine could not make when the call ran: on a device that does not arbitrate, the first
// sync runs on the stream, and what the members published (fingerprints, counts, a message's header) is read back
// later (Device::ReadLater) and compared once the read has run.
struct DeferredCheck {
  enum class Kind { kCall, kMessage, kReceipt };
  Kind kind = Kind::kCall;
  std::string op;             // the call's name, for messages
  std::uint64_t read = 0;     // the token of the read
  // kCall: this rank's fingerprint, and the parity of the sync whose table was read; with counts (all_to_all), the
  // token of the count table's read too.
  Fingerprint mine{};
  std::uint64_t counts = 0;
  std::size_t count_values = 0;
  // kMessage (a message this rank received) and kReceipt (what the receiver expected of one this rank sent): the peer's
  // group rank, and the message as this rank expected or sent it.
  int peer = -1;
  MailboxHeader expected{};
};

// One live team on this rank. Used by one collective at a time (mu).
struct Team {
  std::uint64_t id = 0;
  std::uint64_t lifecycle = 0;
  int slot = -1;
  std::vector<int> pes;   // PE (rank in the root) of every group rank
  int me = -1;            // this rank's group rank
  // A node team (the members on this node of a team that spans nodes, whose phases run over it): the PEs of that
  // whole team, in its group-rank order, so that its messages name the team the user made. Empty for other teams.
  std::vector<int> serves;
  int size() const { return static_cast<int>(pes.size()); }
  int my_pe() const { return pes[static_cast<std::size_t>(me)]; }
  char* base = nullptr;   // the slot in this rank's heap
  const TeamSlotLayout* layout = nullptr;
  std::uint64_t first_counter = 0;   // where every counter below started
  std::uint64_t epoch = 0;        // syncs so far (SignalValue(epoch): what the current sync signals)
  std::uint64_t sequence = 0;     // calls so far
  std::vector<std::uint64_t> sent_pieces;       // per peer: send/recv pieces sent to it
  std::vector<std::uint64_t> received_pieces;   // per peer: pieces taken from it
  std::vector<std::int64_t> refusals_seen;      // per peer: the refusal word as this rank last reported it
  // The epoch of the last sync a member gave up (0: none since the team was made): before this rank's next call, every
  // member must have arrived at it (and failed there), so that no peer still reads what that call left behind.
  std::uint64_t given_up_epoch = 0;
  std::deque<DeferredCheck> deferred_checks;    // oldest first
  Status deferred_failure;                      // a deferred check that failed: this rank's next call raises it
  std::vector<std::deque<MailboxHeader>> sent_messages;   // per peer: the last messages sent, for its receipts
  std::string broken;             // why the team cannot be used any more ("" while it can)
  std::mutex mu;

  char* At(std::size_t offset) const { return base + offset; }
  char* Line(std::size_t offset, std::size_t index) const { return At(offset + index * kSignalLineBytes); }
  void* Dissemination(int round, int parity) const {
    return Line(layout->dissemination, static_cast<std::size_t>(round) * 2 + static_cast<std::size_t>(parity));
  }
  void* Arrivals(std::uint64_t epoch_of_sync) const {
    return Line(layout->arrivals, static_cast<std::size_t>(epoch_of_sync % kArrivalWords));
  }
  void* Sent(int sender, std::uint64_t piece) const {
    return Line(layout->sent, static_cast<std::size_t>(sender) * kMailboxPieces + piece % kMailboxPieces);
  }
  void* Acked(int receiver, std::uint64_t piece) const {
    return Line(layout->acked, static_cast<std::size_t>(receiver) * kMailboxPieces + piece % kMailboxPieces);
  }
  void* Refused(int receiver) const { return Line(layout->refused, static_cast<std::size_t>(receiver)); }
  // The statement member `rank` made at the sync of this parity (read there, after the sync, like the fingerprints).
  MailboxHeader* Receipt(int receiver, std::uint64_t piece) const {
    return reinterpret_cast<MailboxHeader*>(At(layout->receipts)) +
           static_cast<std::size_t>(receiver) * kMailboxPieces + piece % kMailboxPieces;
  }
  char* Statement(int parity, int rank) const {
    return Table(parity) + static_cast<std::size_t>(layout->world_size) * sizeof(Fingerprint) +
           static_cast<std::size_t>(rank) * kStatementBytes;
  }
  char* Table(int parity) const { return At(layout->tables + static_cast<std::size_t>(parity) * layout->table_bytes); }
  Fingerprint* FingerprintRow(int parity, int rank) const {
    return reinterpret_cast<Fingerprint*>(Table(parity)) + rank;
  }
  std::int64_t* CountRow(int parity, int rank) const {
    return reinterpret_cast<std::int64_t*>(At(layout->counts + (static_cast<std::size_t>(parity) *
                                                                    static_cast<std::size_t>(layout->world_size) +
                                                                static_cast<std::size_t>(rank)) *
                                                                   layout->count_row_bytes()));
  }
  char* Staging() const { return At(layout->staging); }
  std::size_t staging_bytes() const { return layout->staging_bytes; }
  // One staging half per parity, for the one-step ops.
  char* StagingHalf(int parity) const { return Staging() + static_cast<std::size_t>(parity) * (staging_bytes() / 2); }
  std::size_t one_step_bytes() const;
  // The mailbox piece `index` (0 .. kMailboxPieces-1) from group rank `sender`: a header and its payload.
  char* MailboxPiece(int sender, int index) const;
  std::size_t mailbox_payload_bytes() const;
  // "team_ranks=[0,2]"; a node team names the whole team first: "team_ranks=[0,1,2,3] node_team_ranks=[0,1]".
  std::string Describe() const;
};

// The teams of one lifecycle: the pool, its slots on this rank, and the live teams.
class TeamPool {
 public:
  // Lays the pool out over `memory` (this rank's copy, zeroed by the caller). `root_pes`: the members of the root
  // team, the only team that takes slot 0 (every PE of this rank's node, in order).
  void Reset(void* memory, const TeamPoolLayout& layout, std::uint64_t lifecycle, std::vector<int> root_pes);
  void Clear();
  bool ready() const { return memory_ != nullptr; }
  const TeamPoolLayout& layout() const { return layout_; }

  // Collective over `bootstrap`, whose ranks are the team's members in group-rank order: agrees on a slot, zeroes
  // its signal words and tables here, and waits for every member to have done so. `pes` are the members' PEs
  // (checked by the caller); `me` this rank's group rank; `serves` Team::serves (checked by the caller; the members
  // must pass the same).
  Result<std::shared_ptr<Team>> Create(Device& device, const std::vector<int>& pes, int me, Bootstrap& bootstrap,
                                       const std::vector<int>& serves = {});
  // Where a new team's counters start (0; tests start them near the 32-bit wrap).
  void set_first_counter(std::uint64_t counter) { first_counter_ = counter; }
  // Local, never waits: tells every member that this rank is done with the team's slot.
  Status Release(Device& device, std::uint64_t team_id);
  Result<std::shared_ptr<Team>> Find(std::uint64_t team_id) const;
  std::size_t live_teams() const;
  std::vector<std::shared_ptr<Team>> Live() const;

 private:
  struct SlotState {
    bool busy = false;
    std::int64_t expected_releases = 0;   // members of every team this slot held so far
  };
  // Whether `slot` may hold a new team on this rank.
  Result<bool> SlotFree(Device& device, int slot) const;

  mutable std::mutex mu_;
  char* memory_ = nullptr;
  TeamPoolLayout layout_;
  std::uint64_t lifecycle_ = 0;
  std::vector<int> root_pes_;
  std::array<SlotState, kTeamSlots> slots_{};
  std::vector<std::shared_ptr<Team>> teams_;
  std::uint64_t next_id_ = 1;
  std::uint64_t first_counter_ = 0;
};

}  // namespace hp::shmem
