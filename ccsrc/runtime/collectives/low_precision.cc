// The low-precision collectives of the engine (collectives/engine.h): all_reduce and reduce_scatter whose values travel in
// a wire format (ops/wire_format.h) through the team's staging area, encoded and decoded by the device.
//
// Slots. A call uses the staging half of its parity only, cut into one slot per group rank (the one-step all_reduce:
// one slot, the whole half), each laid out as ops::WireSlotLayout says. Writes before the call's first sync go into
// this rank's own half of the call's parity, which no peer reads any more (the previous call used the other half,
// and every rank finished the one before it); everything else happens after the first sync. So, like the one-step
// full-precision paths, a call that uses one half needs no closing sync.
#include <algorithm>
#include <vector>

#include "runtime/collectives/engine.h"
#include "runtime/collectives/paths.h"

namespace hp::shmem {

using namespace collectives;   // paths.h: what every family shares

namespace {

std::size_t CeilDiv(std::size_t value, std::size_t unit) { return (value + unit - 1) / unit; }

// The PEs of every member but this rank, in group-rank order (the order their terms are summed in).
std::vector<int> PeerPes(const Team& team) {
  std::vector<int> pes;
  for (int p = 0; p < team.size(); ++p) {
    if (p != team.me) pes.push_back(team.pes[static_cast<std::size_t>(p)]);
  }
  return pes;
}

// One staging half cut into `slots` slots of a wire format.
struct WireSlots {
  char* base = nullptr;
  std::size_t slot_bytes = 0;
  ops::WireSlotLayout layout;
  bool scaled = false;

  WireSlots(char* half, std::size_t half_bytes, int slots, ops::LowFormat format)
      : base(half),
        slot_bytes(RoundDown(half_bytes / static_cast<std::size_t>(slots), ops::WireSlotLayout::kSlotAlignment)),
        layout(ops::WireSlotLayout::For(format, slot_bytes)),
        scaled(ops::LowFormatScaled(format)) {}

  WireRun Run(int index) const {
    char* slot = base + static_cast<std::size_t>(index) * slot_bytes;
    return {scaled ? slot : nullptr, slot + layout.scale_bytes};
  }
};

Status TooSmall(const Team& team, ops::LowFormat format) {
  return StateError("the staging area is too small for low-precision communication: staging_bytes=" +
                    std::to_string(team.staging_bytes()) + " team_size=" + std::to_string(team.size()) +
                    " format=" + ops::LowFormatName(format));
}

}  // namespace

Status CollectiveEngine::AllReduceLowPrecision(const Buffer& tensor, const Buffer& input, const ElementType& type,
                                               ReduceOp op, ops::LowFormat format) {
  const int n = team_.size();
  if (n == 1) return AllReduce(tensor, input, type, op);   // nothing travels
  // A local copy before the call is numbered: a failure leaves the team as it was.
  if (input.address != tensor.address) HP_RETURN_IF_ERROR(device_.Copy(tensor.address, input.address, tensor.bytes, stream_, keep_));
  const std::size_t es = type.bytes;
  const std::size_t count = tensor.bytes / es;
  const std::size_t half_bytes = team_.staging_bytes() / 2;
  const int me = team_.me;
  const std::vector<int> peers = PeerPes(team_);
  // Decided alike on every rank: the layout depends on the team and the format only, the path on the count (which
  // the fingerprint checks).
  const WireSlots parts(nullptr, half_bytes, n, format);
  if (parts.layout.capacity == 0) return TooSmall(team_, format);
  HP_ASSIGN_OR_RETURN(Fingerprint f, Begin(Collective::kAllReduce, &type, count, static_cast<std::uint32_t>(op) + 1, -1));
  f.wire = static_cast<std::uint32_t>(format) + 1;
  f.where[0] = tensor.heap_offset;
  char* t = static_cast<char*>(tensor.address);
  char* half = team_.StagingHalf(Parity());
  const WireSlots whole(half, half_bytes, 1, format);
  if (count > 0 && tensor.bytes <= team_.one_step_bytes() && count <= whole.layout.capacity) {
    // 1. One step: this rank's codes into its own half, then every rank sums every rank's codes, in group-rank order.
    HP_RETURN_IF_ERROR(BeforeOpen(device_.Encode(format, type.reduce_type, t, count, whole.Run(0), stream_, keep_)));
    HP_RETURN_IF_ERROR(Open(f).status());
    return Broken(device_.ReduceEncoded(format, type.reduce_type, op, nullptr, whole.Run(0), team_.pes, count, t,
                                        WireRun{}, stream_, keep_),
                  "reduce", Next::kCallEnd);
  }
  HP_RETURN_IF_ERROR(Open(f).status());
  // 2. Two-shot, in pieces of n slots: parts start on scale-block boundaries, so that a part's blocks are the
  //    tensor's.
  const WireSlots slots(half, half_bytes, n, format);
  const std::size_t capacity = slots.layout.capacity;
  for (std::size_t off = 0; off < count; off += static_cast<std::size_t>(n) * capacity) {
    const std::size_t length = std::min(static_cast<std::size_t>(n) * capacity, count - off);
    const std::size_t part = CeilDiv(CeilDiv(length, static_cast<std::size_t>(n)), ops::kScaleBlock) * ops::kScaleBlock;
    auto bounds = [&](int p) {
      const std::size_t lo = std::min(static_cast<std::size_t>(p) * part, length);
      return std::make_pair(lo, std::min(lo + part, length));
    };
    // 2a. The parts other ranks own, encoded into this rank's slots for them.
    for (int q = 0; q < n; ++q) {
      const auto [lo, hi] = bounds(q);
      if (q == me || hi == lo) continue;
      HP_RETURN_IF_ERROR(Broken(device_.Encode(format, type.reduce_type, t + (off + lo) * es, hi - lo, slots.Run(q),
                                               stream_, keep_),
                                "encode"));
    }
    HP_RETURN_IF_ERROR(Sync());
    // 2b. This rank's part: its values plus every peer's codes of it, encoded once more into its own slot, and
    //     decoded from those codes, as every peer will.
    const auto [lo, hi] = bounds(me);
    if (hi > lo) {
      char* mine = t + (off + lo) * es;
      HP_RETURN_IF_ERROR(Broken(device_.ReduceEncoded(format, type.reduce_type, op, mine, slots.Run(me), peers, hi - lo,
                                                      mine, slots.Run(me), stream_, keep_),
                                "reduce"));
    }
    HP_RETURN_IF_ERROR(Sync());
    // 2c. Every peer's reduced part, decoded from its slot. After the last piece's, the call ends.
    const Next after_decode = off + static_cast<std::size_t>(n) * capacity >= count ? Next::kCallEnd : Next::kSync;
    for (int p = 0; p < n; ++p) {
      const auto [plo, phi] = bounds(p);
      if (p == me || phi == plo) continue;
      HP_RETURN_IF_ERROR(Broken(device_.Decode(format, slots.Run(p), team_.pes[static_cast<std::size_t>(p)], phi - plo,
                                               type.reduce_type, t + (off + plo) * es, stream_, keep_),
                                "decode", after_decode));
    }
  }
  return Status::Ok();
}

Status CollectiveEngine::ReduceScatterLowPrecision(const Buffer& output, const Buffer& input, const ElementType& type,
                                                   ReduceOp op, ops::LowFormat format) {
  const int n = team_.size();
  if (n == 1) return ReduceScatter(output, input, type, op);   // the sum of one rank is its input
  const std::size_t es = type.bytes;
  const std::size_t c = output.bytes / es;
  const int me = team_.me;
  const std::vector<int> peers = PeerPes(team_);
  const std::size_t half_bytes = team_.staging_bytes() / 2;
  const WireSlots layout(nullptr, half_bytes, n, format);
  const std::size_t capacity = layout.layout.capacity;
  if (capacity == 0) return TooSmall(team_, format);
  HP_ASSIGN_OR_RETURN(Fingerprint f, Begin(Collective::kReduceScatter, &type, c, static_cast<std::uint32_t>(op) + 1, -1));
  f.wire = static_cast<std::uint32_t>(format) + 1;
  f.where[0] = input.heap_offset;
  char* out = static_cast<char*>(output.address);
  const char* in = static_cast<const char*>(input.address);
  const int parity = Parity();
  // Pieces alternate between the two halves, so that one sync a piece suffices: a rank writes a half again only
  // after every peer passed the sync that follows their reads of it.
  std::size_t piece = 0;
  for (std::size_t off = 0; off == 0 || off < c; off += capacity, ++piece) {
    const std::size_t length = std::min(capacity, c - off);
    const WireSlots slots(team_.StagingHalf((parity + static_cast<int>(piece)) & 1), half_bytes, n, format);
    for (int q = 0; q < n && length > 0; ++q) {
      if (q == me) continue;
      Status encoded = device_.Encode(format, type.reduce_type,
                                      in + (static_cast<std::size_t>(q) * c + off) * es, length, slots.Run(q),
                                      stream_, keep_);
      HP_RETURN_IF_ERROR(piece == 0 ? BeforeOpen(encoded) : Broken(encoded, "encode"));
    }
    // The first piece is encoded into this rank's own half of the call's parity before the first sync.
    HP_RETURN_IF_ERROR(piece == 0 ? Open(f).status() : Sync());
    if (length == 0) return Status::Ok();
    HP_RETURN_IF_ERROR(Broken(device_.ReduceEncoded(format, type.reduce_type, op,
                                                    in + (static_cast<std::size_t>(me) * c + off) * es, slots.Run(me),
                                                    peers, length, out + off * es, WireRun{}, stream_, keep_),
                              "reduce", off + capacity >= c && piece == 0 ? Next::kCallEnd : Next::kSync));
  }
  // A later piece may have used the other half, which the team's next call writes before its first sync.
  return piece > 1 ? Sync() : Status::Ok();
}

}  // namespace hp::shmem
