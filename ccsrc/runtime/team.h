// Teams: a set of PEs that runs collectives together, with the workspace they stage through and the epoch protocol
// that keeps them in step.
//
// The runtime reserves one symmetric *team pool* when the root team is created (collective over the root): slot 0
// for the root team, kSubTeamSlots slots for the other teams. A slot is laid out once (TeamSlotLayout):
//
//   control   dissemination words (one per round), send/recv sequence words (one per sender), the release count,
//             the fingerprint table (2 parities x members), the count table (2 parities x members x 3n + 1)
//   staging   bounce space for collectives whose tensors are not symmetric (two halves for one-step ops)
//   mailbox   one region per sender for send/recv, kMailboxPieces pieces in flight, each a header and a payload
//
// Every value a team writes into a signal word is `base + counter`, with counters that only grow: a slot never needs
// resetting, and a team created in a slot starts above every value an earlier team of that slot left there.
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
};
const char* CollectiveName(Collective collective);

// Wire formats a fingerprint names (0: the tensor's own dtype). The low-precision formats follow ops::LowFormat + 1.
constexpr std::uint32_t kWireFull = 0;

// What a rank says it is calling, carried by every sync of a team. Ranks compare every field but `epoch`, `where`
// and `address`, which carry what each rank publishes for the others: the heap offsets of its tensors (-1 for none),
// and, when the device reaches peers' memory, their addresses in its own process (0 for none).
struct Fingerprint {
  std::uint64_t epoch;      // base + the sync's epoch: tells who arrived
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
  std::uint8_t reserved[8];
};
static_assert(sizeof(Fingerprint) == 128, "a fingerprint is laid out the same on every rank");
// "collective=all_reduce sequence=3 dtype=float32 count=8 op=sum wire=full": what a message names of a call.
std::string DescribeFingerprint(const Fingerprint& fingerprint);
// The first field on which two calls differ ("" when they agree).
std::string FingerprintDifference(const Fingerprint& a, const Fingerprint& b);

constexpr int kSubTeamSlots = 64;
constexpr int kTeamSlots = kSubTeamSlots + 1;   // slot 0: the root team
constexpr int kMailboxPieces = 4;               // send/recv pieces in flight per (sender, receiver)
constexpr std::size_t kMailboxHeaderBytes = 64;
// A message of at most this many bytes travels in its header's cache line, right after the header's two words
// (total bytes, piece number): the receiver reads one line per message instead of two.
constexpr std::size_t kMailboxInlineBytes = kMailboxHeaderBytes - 2 * sizeof(std::uint64_t);

// Where everything lies inside one slot. The same on every rank (it depends on the heap size and the root's size).
struct TeamSlotLayout {
  int world_size = 0;
  int rounds = 0;                      // dissemination rounds words (enough for the root)
  std::size_t dissemination = 0;       // rounds x int64
  std::size_t sent = 0;                // world x int64: the last piece sender i put here
  std::size_t acked = 0;               // world x int64: the last piece receiver i took from here
  std::size_t release_count = 0;       // int64
  std::size_t fingerprints = 0;        // 2 x world x Fingerprint
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

// One live team on this rank. Used by one collective at a time (mu).
struct Team {
  std::uint64_t id = 0;
  std::uint64_t lifecycle = 0;
  int slot = -1;
  std::vector<int> pes;   // PE (rank in the root) of every group rank
  int me = -1;            // this rank's group rank
  int size() const { return static_cast<int>(pes.size()); }
  int my_pe() const { return pes[static_cast<std::size_t>(me)]; }
  char* base = nullptr;   // the slot in this rank's heap
  const TeamSlotLayout* layout = nullptr;
  std::int64_t signal_base = 0;   // every signal value is signal_base + a counter
  std::uint64_t epoch = 0;        // syncs so far
  std::uint64_t sequence = 0;     // calls so far
  std::vector<std::uint64_t> sent_pieces;       // per peer: send/recv pieces sent to it
  std::vector<std::uint64_t> received_pieces;   // per peer: pieces taken from it
  std::string broken;             // why the team cannot be used any more ("" while it can)
  std::mutex mu;

  char* At(std::size_t offset) const { return base + offset; }
  std::int64_t* Dissemination(int round) const {
    return reinterpret_cast<std::int64_t*>(At(layout->dissemination)) + round;
  }
  std::int64_t* Sent(int sender) const { return reinterpret_cast<std::int64_t*>(At(layout->sent)) + sender; }
  std::int64_t* Acked(int receiver) const { return reinterpret_cast<std::int64_t*>(At(layout->acked)) + receiver; }
  Fingerprint* FingerprintRow(int parity, int rank) const {
    return reinterpret_cast<Fingerprint*>(At(layout->fingerprints)) +
           static_cast<std::size_t>(parity) * static_cast<std::size_t>(layout->world_size) + rank;
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
  std::string Describe() const;   // "team_ranks=[0,2]"
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

  // Collective over `bootstrap`, whose ranks are the team's members in group-rank order: agrees on a slot and a
  // signal base. `pes` are the members' PEs (checked by the caller); `me` this rank's group rank.
  Result<std::shared_ptr<Team>> Create(Device& device, const std::vector<int>& pes, int me, Bootstrap& bootstrap,
                                       double timeout_sec);
  // Local, never waits: tells every member that this rank is done with the team's slot.
  Status Release(Device& device, std::uint64_t team_id);
  Result<std::shared_ptr<Team>> Find(std::uint64_t team_id) const;
  std::size_t live_teams() const;

 private:
  struct SlotState {
    bool busy = false;
    std::int64_t expected_releases = 0;   // members of every team this slot held so far
  };
  // Whether `slot` may hold a new team on this rank, and the highest signal value anything left in it.
  Result<bool> SlotFree(Device& device, int slot) const;
  Result<std::int64_t> HighWater(Device& device, int slot) const;

  mutable std::mutex mu_;
  char* memory_ = nullptr;
  TeamPoolLayout layout_;
  std::uint64_t lifecycle_ = 0;
  std::vector<int> root_pes_;
  std::array<SlotState, kTeamSlots> slots_{};
  std::vector<std::shared_ptr<Team>> teams_;
  std::uint64_t next_id_ = 1;
};

}  // namespace hp::shmem
