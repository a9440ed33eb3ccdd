#include "runtime/team.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "ops/wire_format.h"
#include "runtime/logging.h"

namespace hp::shmem {

const char* CollectiveName(Collective collective) {
  switch (collective) {
    case Collective::kBarrier: return "barrier";
    case Collective::kAllGather: return "all_gather";
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllToAll: return "all_to_all";
    case Collective::kFusedAllGatherMatmul: return "fused_all_gather_matmul";
    case Collective::kFusedMatmulReduceScatter: return "fused_matmul_reduce_scatter";
    case Collective::kRelease: return "release";
    case Collective::kMoeDispatch: return "moe_dispatch";
    case Collective::kMoeCombine: return "moe_combine";
  }
  return "?";
}

const char* CallRoleName(CallRole role) {
  switch (role) {
    case CallRole::kForward: return "forward";
    case CallRole::kBackward: return "backward";
    case CallRole::kFusedGather: return "fused_gather";
    case CallRole::kFusedScatter: return "fused_scatter";
  }
  return "?";
}

namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kMinStaging = 8 << 10;

std::size_t RoundUp(std::size_t value, std::size_t unit) { return (value + unit - 1) / unit * unit; }
std::size_t RoundDown(std::size_t value, std::size_t unit) { return value / unit * unit; }
std::size_t Clamp(std::size_t value, std::size_t lo, std::size_t hi) { return std::max(lo, std::min(hi, value)); }

const char* WireName(std::uint32_t wire) {
  if (wire == kWireFull) return "full";
  return wire <= 4 ? ops::LowFormatName(static_cast<ops::LowFormat>(wire - 1)) : "?";
}

const char* ReduceName(std::uint32_t op) {
  return op == 0 ? "none" : ReduceOpName(static_cast<ReduceOp>(op - 1));
}

std::string CollectiveNameOf(std::uint32_t collective) {
  const char* name = CollectiveName(static_cast<Collective>(collective));
  return name[0] == '?' ? "unknown(" + std::to_string(collective) + ")" : name;
}

std::string RoleNameOf(std::uint32_t role) {
  const char* name = CallRoleName(static_cast<CallRole>(role));
  return name[0] == '?' ? "unknown(" + std::to_string(role) + ")" : name;
}

}  // namespace

Fingerprint CallFingerprint(std::uint32_t collective, std::uint32_t reduce_op, std::uint32_t wire, std::int32_t peer,
                            std::uint64_t count, std::uint64_t element_bytes, const std::string& dtype, CallRole role) {
  Fingerprint fingerprint{};
  fingerprint.collective = collective;
  fingerprint.reduce_op = reduce_op;
  fingerprint.wire = wire;
  fingerprint.peer = peer;
  fingerprint.count = count;
  fingerprint.element_bytes = element_bytes;
  fingerprint.role = static_cast<std::uint32_t>(role);
  dtype.copy(fingerprint.dtype, sizeof(fingerprint.dtype) - 1);
  return fingerprint;
}

std::string DescribeFingerprint(const Fingerprint& f) {
  std::string text = "collective=" + CollectiveNameOf(f.collective) + " sequence=" + std::to_string(f.sequence);
  if (f.dtype[0] != '\0') text += std::string(" dtype=") + std::string(f.dtype, strnlen(f.dtype, sizeof(f.dtype)));
  if (f.collective != static_cast<std::uint32_t>(Collective::kBarrier) &&
      f.collective != static_cast<std::uint32_t>(Collective::kRelease)) {
    text += " count=" + std::to_string(f.count);
  }
  if (f.reduce_op != 0) text += std::string(" op=") + ReduceName(f.reduce_op);
  if (f.reduce_op != 0 || f.wire != kWireFull) text += std::string(" wire=") + WireName(f.wire);
  if (f.peer >= 0) text += " root=" + std::to_string(f.peer);
  if (f.role != static_cast<std::uint32_t>(CallRole::kForward)) text += " role=" + RoleNameOf(f.role);
  return text;
}

std::string FingerprintDifference(const Fingerprint& a, const Fingerprint& b) {
  if (a.sequence != b.sequence) return "sequence";
  if (a.collective != b.collective) return "collective";
  if (std::strncmp(a.dtype, b.dtype, sizeof(a.dtype)) != 0 || a.element_bytes != b.element_bytes) return "dtype";
  if (a.count != b.count) return "count";
  if (a.reduce_op != b.reduce_op) return "op";
  if (a.wire != b.wire) return "wire";
  if (a.peer != b.peer) return "root";
  if (a.role != b.role) return "role";
  return "";
}

TeamSlotLayout TeamSlotLayout::For(int world_size, std::size_t staging_bytes) {
  TeamSlotLayout l;
  l.world_size = world_size;
  const auto n = static_cast<std::size_t>(world_size);
  int rounds = 0;
  while ((std::size_t{1} << rounds) < n) ++rounds;
  l.rounds = rounds;
  // 1. Signal words, each alone on its line: peers write them concurrently (an NPU's signal write cleans the whole
  //    line, so a neighbour's concurrent write to it would be lost).
  const std::size_t pieces = n * static_cast<std::size_t>(kMailboxPieces);
  l.dissemination = 0;
  l.arrivals = l.dissemination + static_cast<std::size_t>(std::max(rounds, 1)) * 2 * kSignalLineBytes;
  l.sent = l.arrivals + static_cast<std::size_t>(kArrivalWords) * kSignalLineBytes;
  l.acked = l.sent + pieces * kSignalLineBytes;
  l.refused = l.acked + pieces * kSignalLineBytes;
  l.release_count = l.refused + n * kSignalLineBytes;
  l.signals_bytes = l.release_count;   // the release count outlives the slot's teams: never zeroed
  // 2. The tables every rank writes its row of (puts, not signal writes: no line of their own needed).
  l.tables = l.release_count + kSignalLineBytes;
  l.table_bytes = n * (sizeof(Fingerprint) + kStatementBytes);
  l.receipts = l.tables + 2 * l.table_bytes;
  l.counts = l.receipts + pieces * sizeof(MailboxHeader);
  l.control_bytes = RoundUp(l.counts + 2 * n * l.count_row_bytes(), kPage);
  // 3. Staging, then the mailbox of the same size.
  l.staging = l.control_bytes;
  l.staging_bytes = staging_bytes;
  l.mailbox = l.staging + staging_bytes;
  l.mailbox_bytes = staging_bytes;
  l.slot_bytes = l.mailbox + l.mailbox_bytes;
  return l;
}

TeamPoolLayout TeamPoolLayout::For(std::size_t heap_size, int world_size) {
  // The root stages through up to 2 MiB (a sixty-fourth of the heap), every other team through up to 512 KiB (a
  // two-thousandth): 64 sub-teams cost 1/16 of the heap at most, and the root's pieces stay in a core's cache.
  TeamPoolLayout p;
  // Every mailbox holds at least 128 bytes per piece for every sender.
  const std::size_t floor = std::max(kMinStaging, RoundUp(static_cast<std::size_t>(world_size) * kMailboxPieces * 256, kPage));
  p.root = TeamSlotLayout::For(world_size, RoundDown(Clamp(heap_size / 64, 8 * floor, 2 << 20), kPage));
  p.sub = TeamSlotLayout::For(world_size, RoundDown(Clamp(heap_size / 2048, floor, 512 << 10), kPage));
  p.total_bytes = p.root.slot_bytes + static_cast<std::size_t>(kSubTeamSlots) * p.sub.slot_bytes;
  return p;
}

std::size_t Team::one_step_bytes() const { return std::min<std::size_t>(256 << 10, staging_bytes() / 2); }

std::size_t Team::mailbox_payload_bytes() const {
  const std::size_t region = RoundDown(layout->mailbox_bytes / static_cast<std::size_t>(size()), 64);
  return RoundDown(region / kMailboxPieces, 64) - kMailboxHeaderBytes;
}

char* Team::MailboxPiece(int sender, int index) const {
  const std::size_t piece = mailbox_payload_bytes() + kMailboxHeaderBytes;
  return At(layout->mailbox) + (static_cast<std::size_t>(sender) * kMailboxPieces + static_cast<std::size_t>(index)) *
                                   piece;
}

namespace {
std::string RankList(const std::vector<int>& ranks) {
  std::string text = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? "," : "") + std::to_string(ranks[i]);
  return text + "]";
}

// FNV-1a over the PEs a node team serves: what its members compare at creation (a fixed-size offer).
std::uint64_t ServesHash(const std::vector<int>& serves) {
  std::uint64_t hash = 14695981039346656037ull;
  auto mix = [&hash](std::uint64_t word) {
    for (int b = 0; b < 8; ++b) {
      hash ^= (word >> (8 * b)) & 0xFF;
      hash *= 1099511628211ull;
    }
  };
  mix(serves.size());
  for (int pe : serves) mix(static_cast<std::uint32_t>(pe));
  return hash;
}
}  // namespace

std::string Team::Describe() const {
  // A node team's members know the whole team as the user made it; its own ranks are a detail of the phases.
  if (!serves.empty()) return "team_ranks=" + RankList(serves) + " node_team_ranks=" + RankList(pes);
  return "team_ranks=" + RankList(pes);
}

void TeamPool::Reset(void* memory, const TeamPoolLayout& layout, std::uint64_t lifecycle, std::vector<int> root_pes) {
  std::lock_guard<std::mutex> lock(mu_);
  root_pes_ = std::move(root_pes);
  memory_ = static_cast<char*>(memory);
  layout_ = layout;
  lifecycle_ = lifecycle;
  slots_ = {};
  teams_.clear();
}

void TeamPool::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  memory_ = nullptr;
  slots_ = {};
  teams_.clear();
}

Result<bool> TeamPool::SlotFree(Device& device, int slot) const {
  const SlotState& state = slots_[static_cast<std::size_t>(slot)];
  if (state.busy) return false;
  std::int64_t releases = 0;
  char* base = memory_ + layout_.SlotOffset(slot);
  if (device.native_signal_width() == SignalWidth::k32) {
    std::int32_t narrow = 0;
    HP_RETURN_IF_ERROR(device.CopyFromHeap(&narrow, base + layout_.Of(slot).release_count, sizeof(narrow)));
    releases = narrow;
  } else {
    HP_RETURN_IF_ERROR(device.CopyFromHeap(&releases, base + layout_.Of(slot).release_count, sizeof(releases)));
  }
  return releases == state.expected_releases;
}

Result<std::shared_ptr<Team>> TeamPool::Create(Device& device, const std::vector<int>& pes, int me,
                                                Bootstrap& bootstrap, const std::vector<int>& serves) {
  std::lock_guard<std::mutex> lock(mu_);
  if (memory_ == nullptr) return Internal("team pool is not allocated: op=team_create");
  const int n = static_cast<int>(pes.size());
  const bool whole_root = pes == root_pes_;
  // 1. Every member is past what it did before this call (its releases of earlier teams included); then what this
  //    rank offers: its PE and the slots free here.
  HP_RETURN_IF_ERROR(bootstrap.Barrier());
  struct Offer {
    std::int32_t pe;
    std::int32_t members;
    std::uint64_t free_mask[2];   // bit s: slot s is free on this rank
    std::uint64_t serves;         // ServesHash(Team::serves)
  };
  Offer mine{};
  mine.pe = pes[static_cast<std::size_t>(me)];
  mine.members = n;
  mine.serves = ServesHash(serves);
  for (int s = 0; s < kTeamSlots; ++s) {
    HP_ASSIGN_OR_RETURN(bool free, SlotFree(device, s));
    if (free) mine.free_mask[s / 64] |= std::uint64_t{1} << (s % 64);
  }
  // 2. Every member's offer, bounded by the bootstrap (which names who did not arrive).
  std::vector<Offer> offers(static_cast<std::size_t>(n));
  HP_RETURN_IF_ERROR(bootstrap.AllGather(&mine, sizeof(mine), offers.data()));
  for (int i = 0; i < n; ++i) {
    const Offer& theirs = offers[static_cast<std::size_t>(i)];
    if (theirs.pe != pes[static_cast<std::size_t>(i)] || theirs.members != n) {
      return Mismatch("ranks disagree on a team's members: group_rank=" + std::to_string(i) + " expected_pe=" +
                      std::to_string(pes[static_cast<std::size_t>(i)]) + " observed_pe=" + std::to_string(theirs.pe) +
                      " expected_members=" + std::to_string(n) + " observed_members=" + std::to_string(theirs.members));
    }
    if (theirs.serves != mine.serves) {
      return Mismatch("ranks disagree on the team a node team serves: rank=" + std::to_string(mine.pe) + " serves=" +
                      RankList(serves) + ", rank=" + std::to_string(theirs.pe) + " serves another list");
    }
  }
  // 3. The lowest slot free on every member (slot 0 only for the whole root in root order).
  int chosen = -1;
  for (int s = whole_root ? 0 : 1; s < kTeamSlots && chosen < 0; ++s) {
    bool everywhere = true;
    for (const Offer& offer : offers) everywhere = everywhere && (offer.free_mask[s / 64] >> (s % 64)) & 1;
    if (everywhere) chosen = s;
  }
  if (chosen < 0) {
    return StateError("every team slot is taken on some member: slots=" + std::to_string(kSubTeamSlots) +
                      " live_teams_here=" + std::to_string(teams_.size()) +
                      " (release teams of destroyed groups: shmem.Team.release() or destroy_process_group)");
  }
  // 4. This rank's signal words and tables of the slot start from zero (no late write of the slot's earlier teams
  //    can come: the slot is free on every member), and no member uses the team before every member zeroed them.
  const TeamSlotLayout& chosen_layout = layout_.Of(chosen);
  char* chosen_base = memory_ + layout_.SlotOffset(chosen);
  const std::vector<char> zeros(std::max(chosen_layout.signals_bytes, chosen_layout.control_bytes - chosen_layout.tables), 0);
  HP_RETURN_IF_ERROR(device.CopyToHeap(chosen_base, zeros.data(), chosen_layout.signals_bytes));
  HP_RETURN_IF_ERROR(device.CopyToHeap(chosen_base + chosen_layout.tables, zeros.data(),
                                       chosen_layout.control_bytes - chosen_layout.tables));
  HP_RETURN_IF_ERROR(bootstrap.Barrier());

  static std::atomic<std::uint64_t> next_id{1};   // never reused, not even across lifecycles
  auto team = std::make_shared<Team>();
  team->id = next_id.fetch_add(1);
  team->lifecycle = lifecycle_;
  team->slot = chosen;
  team->pes = pes;
  team->me = me;
  team->serves = serves;
  team->base = chosen_base;
  team->layout = &chosen_layout;
  team->first_counter = first_counter_;
  team->epoch = first_counter_;
  team->sequence = first_counter_;
  team->sent_pieces.assign(static_cast<std::size_t>(n), first_counter_);
  team->received_pieces.assign(static_cast<std::size_t>(n), first_counter_);
  team->refusals_seen.assign(static_cast<std::size_t>(n), 0);
  team->sent_messages.assign(static_cast<std::size_t>(n), {});
  slots_[static_cast<std::size_t>(chosen)].busy = true;
  slots_[static_cast<std::size_t>(chosen)].expected_releases += n;
  teams_.push_back(team);
  HP_LOG(kDebug, "team created: team_id=" + std::to_string(team->id) + " slot=" + std::to_string(chosen) + " " +
                     team->Describe());
  return team;
}

Status TeamPool::Release(Device& device, std::uint64_t team_id) {
  std::shared_ptr<Team> team;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(teams_.begin(), teams_.end(), [&](const auto& t) { return t->id == team_id; });
    if (it == teams_.end()) return StateError("team is not live: op=team_release team_id=" + std::to_string(team_id));
    team = *it;
    teams_.erase(it);
  }
  // Waits for a collective of another thread on this team to end: its writes must precede the release count.
  std::lock_guard<std::mutex> team_lock(team->mu);
  team->broken = "the team was released";
  Status first;
  for (int pe : team->pes) {
    Status told = device.Signal(team->At(team->layout->release_count), device.native_signal_width(), 1,
                                SignalOp::kAdd, pe, kDefaultStream);
    if (first.ok() && !told.ok()) first = told;
  }
  if (first.ok()) first = device.SynchronizeStream(kDefaultStream);   // the count reaches the members now
  std::lock_guard<std::mutex> lock(mu_);
  slots_[static_cast<std::size_t>(team->slot)].busy = false;
  return first;
}

Result<std::shared_ptr<Team>> TeamPool::Find(std::uint64_t team_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& team : teams_) {
    if (team->id == team_id) return team;
  }
  return StateError("team is not live: team_id=" + std::to_string(team_id) +
                    " (it was released, or belongs to an earlier lifecycle of the runtime)");
}

std::vector<std::shared_ptr<Team>> TeamPool::Live() const {
  std::lock_guard<std::mutex> lock(mu_);
  return teams_;
}

std::size_t TeamPool::live_teams() const {
  std::lock_guard<std::mutex> lock(mu_);
  return teams_.size();
}

}  // namespace hp::shmem
