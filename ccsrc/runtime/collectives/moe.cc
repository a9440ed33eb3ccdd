// MoE dispatch and combine (collectives/moe.h, Runtime::MoeExchange): written over the Device interface and the
// runtime's own team calls (Agree, Get, AllToAll, TeamBarrier), so that it runs on every device.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/runtime.h"

namespace hp::shmem {
namespace {

// What a member found wrong with its own call, published to every member so that all raise the same error.
enum class Verdict : std::int64_t {
  kOk = 0,
  kNegativeSplit = 1,   // a = split index, b = value
  kOutsideInput = 2,    // a = split index, b = end row, c = input rows
  kOutputTooSmall = 3,  // a = global expert (one expert per rank: the sending rank), b = rows needed, c = output rows
};

struct Finding {
  Verdict verdict = Verdict::kOk;
  std::int64_t a = 0, b = 0, c = 0;
};

// A member's published row (MoePublishedRow): its own verdict and its finding's three values, its output's rows, its
// input's heap offset, then its splits and source offsets (every chunk's first row).
constexpr std::size_t kVerdict = 0, kOutputRows = 4, kHeapOffset = 5, kHeader = kMoeRowHeader;

std::int64_t SaturatingAdd(std::int64_t x, std::int64_t y) {
  std::int64_t sum = 0;
  return __builtin_add_overflow(x, y, &sum) ? std::numeric_limits<std::int64_t>::max() : sum;
}

std::int64_t AlignUp(std::int64_t rows, std::int64_t align) {
  if (align <= 0) return rows;
  const std::int64_t aligned = rows / align * align + (rows % align != 0 ? align : 0);
  // An empty region still takes one alignment unit (grouped GEMMs refuse empty groups), as torch lays it out.
  return std::max(aligned, align);
}

std::string DescribeFinding(const MoeExchangeArgs& x, const Finding& f, int rank, int experts) {
  const std::string on_rank = " on rank " + std::to_string(rank);
  switch (f.verdict) {
    case Verdict::kNegativeSplit:
      return std::string(x.op) + ": `in_splits` must be non-negative, but got in_splits[" + std::to_string(f.a) +
             "]=" + std::to_string(f.b) + on_rank;
    case Verdict::kOutsideInput:
      return std::string(x.op) + ": the chunks of `in_splits` must lie inside `input` (" + std::to_string(f.c) +
             " rows), but got chunk " + std::to_string(f.a) + " ending at row " + std::to_string(f.b) + on_rank;
    case Verdict::kOutputTooSmall: {
      const std::string where =
          experts == 1 ? "the rows from rank " + std::to_string(f.a)
                       : "expert " + std::to_string(f.a) + ", local expert " + std::to_string(f.a % experts) +
                             " of rank " + std::to_string(f.a / experts);
      return std::string(x.op) + ": `out` of rank " + std::to_string(rank) + " must hold the " + std::to_string(f.b) +
             " rows its peers send (the overflow starts at " + where + "), but got " + std::to_string(f.c) +
             " rows (every rank raises; nothing was written)";
    }
    case Verdict::kOk:
      break;
  }
  return "";
}

// Where the chunks a receiver gets land, and where each comes from on its source.
struct Layout {
  std::vector<std::int64_t> splits, offsets, from;   // indexed as the receiver's out_splits
  std::int64_t needed = 0;                            // rows of `output` the chunks reach
  std::int64_t first_overflow = -1;                   // the global expert where `output` overflows, or -1
};

// The layout of receiver `q` from every member's published row: expert-major with aligned regions (dispatch),
// rank-major packed (combine).
Layout LayoutOf(const MoeExchangeArgs& x, const std::vector<std::vector<std::int64_t>>& rows, int q) {
  const int n = static_cast<int>(rows.size());
  const int ne = x.experts;
  const bool dispatch = x.direction == MoeDirection::kDispatch;
  const std::size_t nsplits = static_cast<std::size_t>(n) * static_cast<std::size_t>(ne);
  Layout l;
  l.splits.resize(nsplits);
  l.offsets.resize(nsplits);
  l.from.resize(nsplits);
  // The split source `s` sends to expert `e` of `q`, and its first row there.
  auto sent = [&](int s, int e, std::size_t part) {
    const std::size_t t = dispatch ? static_cast<std::size_t>(q) * ne + e : static_cast<std::size_t>(e) * n + q;
    return rows[static_cast<std::size_t>(s)][kHeader + part * nsplits + t];
  };
  auto place = [&](std::size_t i, int s, int e, std::int64_t* cursor) {
    l.splits[i] = std::max<std::int64_t>(sent(s, e, 0), 0);
    l.offsets[i] = *cursor;
    l.from[i] = sent(s, e, 1);
    *cursor = SaturatingAdd(*cursor, l.splits[i]);
  };
  std::int64_t cursor = 0;
  if (dispatch) {
    for (int e = 0; e < ne; ++e) {
      const std::int64_t region = cursor;
      for (int s = 0; s < n; ++s) place(static_cast<std::size_t>(e) * n + s, s, e, &cursor);
      cursor = SaturatingAdd(region, AlignUp(cursor - region, x.major_align));
    }
  } else {
    for (int s = 0; s < n; ++s) {
      for (int e = 0; e < ne; ++e) place(static_cast<std::size_t>(s) * ne + e, s, e, &cursor);
    }
  }
  const std::int64_t output_rows = rows[static_cast<std::size_t>(q)][kOutputRows];
  for (std::size_t i = 0; i < nsplits; ++i) {
    if (l.splits[i] == 0) continue;
    const std::int64_t end = SaturatingAdd(l.offsets[i], l.splits[i]);
    l.needed = std::max(l.needed, end);
    if (end > output_rows && l.first_overflow < 0) {
      // The expert the chunk belongs to, numbered across the team (one expert per rank: the sending rank).
      const auto index = static_cast<std::int64_t>(i);
      const std::int64_t e = dispatch ? index / n : index % ne;
      const std::int64_t owner = dispatch ? q : index / ne;
      const std::int64_t sender = dispatch ? index % n : owner;
      l.first_overflow = ne == 1 ? sender : owner * ne + e;
    }
  }
  return l;
}

// `bytes` of memory the device addresses into host memory, after the stream's earlier work. A device that does not
// arbitrate is read the way the engine reads its tables there: a stream-ordered copy, then the stream synchronized.
Status ReadToHost(Device& device, void* host, const void* src, std::size_t bytes, StreamHandle stream) {
  if (bytes == 0) return Status::Ok();
  if (device.arbitrates()) {   // its memory is the host's
    HP_RETURN_IF_ERROR(device.Copy(host, src, bytes, stream, nullptr));
    return stream == kDefaultStream ? Status::Ok() : device.SynchronizeStream(stream);
  }
  HP_ASSIGN_OR_RETURN(const std::uint64_t token, device.ReadLater(src, bytes, stream));
  HP_RETURN_IF_ERROR(device.SynchronizeStream(stream));
  HP_ASSIGN_OR_RETURN(const bool taken, device.TakeRead(token, host));
  if (!taken) return StateError("a read of the split tables had not run after its stream was synchronized");
  return Status::Ok();
}

// Host values into memory the device addresses, in stream order (the values are taken before it returns).
Status WriteFromHost(Device& device, void* dst, std::vector<std::int64_t> values, StreamHandle stream) {
  if (values.empty()) return Status::Ok();
  const std::size_t bytes = values.size() * sizeof(std::int64_t);
  if (!device.arbitrates()) return device.StageFromHost(dst, values.data(), bytes, stream);
  auto held = std::make_shared<std::vector<std::int64_t>>(std::move(values));
  return device.Copy(dst, held->data(), bytes, stream, held);
}

}  // namespace

Result<MoeExchangeArgs> MoeStepArgs(int direction, int experts, std::int64_t major_align, std::int64_t input_rows,
                                    std::int64_t output_rows) {
  if (direction != 0 && direction != 1) {
    return InvalidArgument("`direction` must be 0 (dispatch) or 1 (combine), but got " + std::to_string(direction));
  }
  if (experts < 1 || major_align < 0 || input_rows < 0 || output_rows < 0) {
    return InvalidArgument("`experts` must be positive and `major_align` and the row counts non-negative, but got "
                           "experts=" + std::to_string(experts) + " major_align=" + std::to_string(major_align) +
                           " input_rows=" + std::to_string(input_rows) + " output_rows=" + std::to_string(output_rows));
  }
  MoeExchangeArgs x;
  x.direction = direction == 0 ? MoeDirection::kDispatch : MoeDirection::kCombine;
  x.op = direction == 0 ? "moe_dispatch" : "moe_combine";
  x.experts = experts;
  x.major_align = major_align;
  x.input_rows = input_rows;
  x.output_rows = output_rows;
  return x;
}

std::vector<std::int64_t> MoePublishedRow(const MoeExchangeArgs& x, int members, const std::int64_t* splits,
                                          const std::int64_t* offsets, std::int64_t heap_offset) {
  const std::size_t nsplits = static_cast<std::size_t>(members) * static_cast<std::size_t>(x.experts);
  std::vector<std::int64_t> row(kHeader + 2 * nsplits, 0);
  Finding own;
  std::int64_t packed = 0;
  for (std::size_t t = 0; t < nsplits; ++t) {
    const std::int64_t split = splits[t];
    const std::int64_t start = offsets != nullptr ? offsets[t] : packed;
    row[kHeader + t] = split;
    row[kHeader + nsplits + t] = start;
    packed = SaturatingAdd(packed, std::max<std::int64_t>(split, 0));
    if (own.verdict != Verdict::kOk) continue;
    if (split < 0) {
      own = {Verdict::kNegativeSplit, static_cast<std::int64_t>(t), split, 0};
    } else if (start < 0 || SaturatingAdd(start, split) > x.input_rows) {
      own = {Verdict::kOutsideInput, static_cast<std::int64_t>(t), SaturatingAdd(start, split), x.input_rows};
    }
  }
  row[kVerdict] = static_cast<std::int64_t>(own.verdict);
  row[1] = own.a;
  row[2] = own.b;
  row[3] = own.c;
  row[kOutputRows] = x.output_rows;
  row[kHeapOffset] = heap_offset;
  return row;
}

Result<MoeLayout> PlanMoeExchange(const MoeExchangeArgs& x, const std::vector<std::vector<std::int64_t>>& rows,
                                  int me) {
  const int n = static_cast<int>(rows.size());
  const std::size_t length = kHeader + 2 * static_cast<std::size_t>(n) * static_cast<std::size_t>(x.experts);
  for (int r = 0; r < n; ++r) {
    if (rows[static_cast<std::size_t>(r)].size() != length) {
      return InvalidArgument("`rows` must hold " + std::to_string(length) + " values each (" +
                             std::to_string(kHeader) + " + 2 x members x experts), but got " +
                             std::to_string(rows[static_cast<std::size_t>(r)].size()) + " from member " +
                             std::to_string(r));
    }
  }
  if (me < 0 || me >= n) {
    return InvalidArgument("`me` must be in [0, " + std::to_string(n) + "), but got " + std::to_string(me));
  }
  // The verdicts, in group-rank order: each member's own first, then every receiver's room.
  for (int r = 0; r < n; ++r) {
    const auto& row = rows[static_cast<std::size_t>(r)];
    if (row[kVerdict] == 0) continue;
    const Finding found{static_cast<Verdict>(row[kVerdict]), row[1], row[2], row[3]};
    return InvalidArgument(DescribeFinding(x, found, r, x.experts));
  }
  MoeLayout mine;
  for (int q = 0; q < n; ++q) {
    Layout l = LayoutOf(x, rows, q);
    if (l.first_overflow >= 0) {
      const Finding found{Verdict::kOutputTooSmall, l.first_overflow, l.needed,
                          rows[static_cast<std::size_t>(q)][kOutputRows]};
      return InvalidArgument(DescribeFinding(x, found, q, x.experts));
    }
    if (q == me) mine = MoeLayout{std::move(l.splits), std::move(l.offsets), std::move(l.from)};
  }
  return mine;
}

Status Runtime::MoeExchange(const MoeExchangeArgs& x, StreamHandle stream, KeepAlive keep) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized(x.op)));
  HP_ASSIGN_OR_RETURN(const TeamView view, DescribeTeam(x.team));
  if (x.experts < 1 || x.row_bytes == 0 || x.in_splits == nullptr || x.out_splits == nullptr ||
      x.out_offsets == nullptr || x.input_rows < 0 || x.output_rows < 0) {
    // Refused collectively: the peers still enter the call's first sync, and every member fails naming this rank.
    return Record(Refuse(x.team, x.direction == MoeDirection::kDispatch ? Collective::kMoeDispatch
                                                                        : Collective::kMoeCombine,
                         InvalidArgument(std::string(x.op) +
                                  ": `experts` and `row_bytes` must be positive, the row counts non-negative and "
                                  "the split tables given, but got experts=" +
                                  std::to_string(x.experts) + " row_bytes=" + std::to_string(x.row_bytes) +
                                  " input_rows=" + std::to_string(x.input_rows) +
                                  " output_rows=" + std::to_string(x.output_rows)),
                         stream, x.role));
  }
  const int n = static_cast<int>(view.pes.size());
  const int me = view.me;
  const int ne = x.experts;
  const bool dispatch = x.direction == MoeDirection::kDispatch;
  const std::size_t nsplits = static_cast<std::size_t>(n) * static_cast<std::size_t>(ne);

  // 1. This rank's split tables, read through the device, and its own verdict.
  std::vector<std::int64_t> splits(nsplits), offsets;
  HP_RETURN_IF_ERROR(Record(ReadToHost(*device_, splits.data(), x.in_splits, nsplits * sizeof(std::int64_t), stream)));
  if (x.in_offsets != nullptr) {
    offsets.resize(nsplits);
    HP_RETURN_IF_ERROR(
        Record(ReadToHost(*device_, offsets.data(), x.in_offsets, nsplits * sizeof(std::int64_t), stream)));
  }
  const std::int64_t heap_offset =
      Resolve(x.input, static_cast<std::size_t>(x.input_rows) * x.row_bytes).heap_offset;
  const std::vector<std::int64_t> mine =
      MoePublishedRow(x, n, splits.data(), x.in_offsets != nullptr ? offsets.data() : nullptr, heap_offset);

  // 2. Every member's row, in one fingerprinted sync (Agree stages rows beyond its count row through the team's
  // staging; a row longer than a member's share of it takes a sync per share): every member then knows every
  // member's call, and all decide alike.
  std::vector<std::vector<std::int64_t>> rows(static_cast<std::size_t>(n));
  if (n == 1) {
    rows[0] = mine;
  } else {
    const std::size_t capacity = CollectiveEngine::AgreeCapacity(max_node_size_, n, view.staging_bytes);
    Fingerprint fingerprint{};
    fingerprint.collective =
        static_cast<std::uint32_t>(dispatch ? Collective::kMoeDispatch : Collective::kMoeCombine);
    fingerprint.peer = -1;
    fingerprint.count = mine.size();   // experts per rank, as the team's size is the same everywhere
    fingerprint.element_bytes = x.row_bytes;
    fingerprint.role = static_cast<std::uint32_t>(x.role);
    std::snprintf(fingerprint.dtype, sizeof(fingerprint.dtype), "%s", "moe_rows");
    for (std::size_t start = 0; start < mine.size(); start += capacity) {
      const std::vector<std::int64_t> piece(mine.begin() + static_cast<std::ptrdiff_t>(start),
                                            mine.begin() + static_cast<std::ptrdiff_t>(
                                                               std::min(mine.size(), start + capacity)));
      HP_ASSIGN_OR_RETURN(const auto agreed, Agree(x.team, fingerprint, piece, stream));
      for (int r = 0; r < n; ++r) {
        const auto& theirs = agreed[static_cast<std::size_t>(r)];
        rows[static_cast<std::size_t>(r)].insert(rows[static_cast<std::size_t>(r)].end(), theirs.begin(),
                                                 theirs.end());
      }
    }
  }

  // 3. The verdicts and this member's layout (PlanMoeExchange): every member raises the same error before anything is
  // written.
  auto planned = PlanMoeExchange(x, rows, me);
  if (!planned.ok()) return Record(planned.status());
  const MoeLayout layout = std::move(planned).value();
  HP_RETURN_IF_ERROR(Record(WriteFromHost(*device_, x.out_splits, layout.splits, stream)));
  HP_RETURN_IF_ERROR(Record(WriteFromHost(*device_, x.out_offsets, layout.offsets, stream)));
  // The receiving chunk i comes from group rank `source_of(i)`.
  auto source_of = [&](std::size_t i) {
    return dispatch ? static_cast<int>(i % static_cast<std::size_t>(n)) : static_cast<int>(i / ne);
  };
  bool pull = true;   // every member's input is symmetric
  for (const auto& row : rows) pull = pull && row[kHeapOffset] >= 0;
  char* output = static_cast<char*>(x.output);
  const char* input = static_cast<const char*>(x.input);

  // 4a. Pull every chunk straight into place out of the peer's input (at the peer's heap offset), then hold `input`
  // until every member has read it.
  if (pull) {
    for (std::size_t i = 0; i < nsplits; ++i) {
      if (layout.splits[i] == 0) continue;
      const int s = source_of(i);
      const std::int64_t shift = rows[static_cast<std::size_t>(s)][kHeapOffset] - heap_offset;
      const std::size_t bytes = static_cast<std::size_t>(layout.splits[i]) * x.row_bytes;
      HP_RETURN_IF_ERROR(Get(output + static_cast<std::size_t>(layout.offsets[i]) * x.row_bytes,
                             input + shift + static_cast<std::size_t>(layout.from[i]) * x.row_bytes, bytes, bytes,
                             view.pes[static_cast<std::size_t>(s)], stream, keep));
    }
    return TeamBarrier(x.team, stream, x.role);
  }

  // 4b. A device that does not arbitrate (an NPU: its host addresses none of its memory, and peers reach only its
  // heap) moves every byte on the device, in stream order. A symmetric source's chunks are pulled straight out of its
  // `input` (as in 4a) and this rank's own are copied into place; an ordinary source stages the chunks it sends to
  // its peers through its own copy of the team's staging area. Those chunks, in its split table's order, are one
  // stream of bytes cut into windows of the staging size: window k of every source is copied into its staging
  // between two syncs (the first: every peer has read the window before, or Agree's rows) and pulled by its
  // receivers before the next window's, and a closing sync keeps the inputs and the staging until all have read them.
  if (!device_->arbitrates()) {
    auto found = LiveTeam(x.team, x.op);
    if (!found.ok()) return Record(found.status());
    char* const staging = found.value()->Staging();
    const std::size_t window = found.value()->staging_bytes();
    const std::size_t row_bytes = x.row_bytes;
    auto receiver_of = [&](std::size_t t) { return dispatch ? static_cast<int>(t / ne) : static_cast<int>(t % n); };
    // Where each chunk of an ordinary source starts in its stream (its own chunks take no room), and how many
    // windows the longest stream takes: the same on every member, from the rows they agreed on.
    std::vector<std::vector<std::size_t>> starts(static_cast<std::size_t>(n));
    std::size_t windows = 0;
    for (int s = 0; s < n; ++s) {
      const auto& row = rows[static_cast<std::size_t>(s)];
      if (row[kHeapOffset] >= 0) continue;
      auto& at = starts[static_cast<std::size_t>(s)];
      at.resize(nsplits);
      std::size_t length = 0;
      for (std::size_t t = 0; t < nsplits; ++t) {
        at[t] = length;
        if (receiver_of(t) != s) length += static_cast<std::size_t>(row[kHeader + t]) * row_bytes;
      }
      windows = std::max(windows, (length + window - 1) / window);
    }
    // Source `s`'s table entry of the receiving chunk i.
    auto sent_as = [&](std::size_t i) {
      return dispatch ? static_cast<std::size_t>(me) * ne + i / n : (i % ne) * n + static_cast<std::size_t>(me);
    };
    const char* heap = reinterpret_cast<const char*>(device_->heap_base());
    for (std::size_t i = 0; i < nsplits; ++i) {
      const int s = source_of(i);
      const std::int64_t source_offset = rows[static_cast<std::size_t>(s)][kHeapOffset];
      if (layout.splits[i] == 0 || (s != me && source_offset < 0)) continue;   // staged below
      char* to = output + static_cast<std::size_t>(layout.offsets[i]) * row_bytes;
      const std::size_t from = static_cast<std::size_t>(layout.from[i]) * row_bytes;
      const std::size_t bytes = static_cast<std::size_t>(layout.splits[i]) * row_bytes;
      if (s == me) {
        HP_RETURN_IF_ERROR(Record(device_->Copy(to, input + from, bytes, stream, keep)));
        continue;
      }
      const char* symmetric = heap + source_offset + from;
      const int pe = view.pes[static_cast<std::size_t>(s)];
      HP_RETURN_IF_ERROR(Record(TransferChunks(bytes, [&](std::size_t at, std::size_t part) {
        return device_->Get(to + at, symmetric + at, part, pe, stream, keep);
      })));
    }
    for (std::size_t k = 0; k < windows; ++k) {
      const std::size_t low = k * window;
      const std::size_t high = low + window;
      HP_RETURN_IF_ERROR(TeamBarrier(x.team, stream, x.role));
      if (heap_offset < 0) {
        for (std::size_t t = 0; t < nsplits; ++t) {
          if (receiver_of(t) == me) continue;
          const std::size_t begin = starts[static_cast<std::size_t>(me)][t];
          const std::size_t lo = std::max(begin, low);
          const std::size_t hi = std::min(begin + static_cast<std::size_t>(splits[t]) * row_bytes, high);
          if (lo >= hi) continue;
          const char* from = input + static_cast<std::size_t>(mine[kHeader + nsplits + t]) * row_bytes + (lo - begin);
          HP_RETURN_IF_ERROR(Record(device_->Copy(staging + (lo - low), from, hi - lo, stream, keep)));
        }
      }
      HP_RETURN_IF_ERROR(TeamBarrier(x.team, stream, x.role));
      for (std::size_t i = 0; i < nsplits; ++i) {
        const int s = source_of(i);
        if (layout.splits[i] == 0 || s == me || rows[static_cast<std::size_t>(s)][kHeapOffset] >= 0) continue;
        const std::size_t begin = starts[static_cast<std::size_t>(s)][sent_as(i)];
        const std::size_t lo = std::max(begin, low);
        const std::size_t hi = std::min(begin + static_cast<std::size_t>(layout.splits[i]) * row_bytes, high);
        if (lo >= hi) continue;
        char* to = output + static_cast<std::size_t>(layout.offsets[i]) * row_bytes + (lo - begin);
        const char* from = staging + (lo - low);
        const int pe = view.pes[static_cast<std::size_t>(s)];
        HP_RETURN_IF_ERROR(Record(TransferChunks(hi - lo, [&](std::size_t at, std::size_t part) {
          return device_->Get(to + at, from + at, part, pe, stream, keep);
        })));
      }
    }
    return TeamBarrier(x.team, stream, x.role);
  }

  // 4c. The engine's all_to_all (a device that arbitrates: its memory is the host's, so the chunks stage in host
  // memory): each member's chunks for a receiver in one part (expert after expert), received source after source.
  auto send_staging = std::make_shared<std::vector<char>>();
  std::vector<std::pair<const void*, std::size_t>> parts;
  parts.reserve(static_cast<std::size_t>(n));
  const bool contiguous = dispatch && x.in_offsets == nullptr;   // rank-major and packed: a receiver's part is whole
  std::size_t packed = 0;   // every split is non-negative here (PlanMoeExchange refused the others)
  for (std::int64_t split : splits) packed += static_cast<std::size_t>(split);
  if (!contiguous) send_staging->resize(packed * x.row_bytes);
  std::size_t at = 0;
  for (int r = 0; r < n; ++r) {
    const std::size_t first = at;
    std::size_t part_rows = 0;
    for (int e = 0; e < ne; ++e) {
      const std::size_t t = dispatch ? static_cast<std::size_t>(r) * ne + e : static_cast<std::size_t>(e) * n + r;
      const auto split = static_cast<std::size_t>(splits[t]);
      const std::size_t source = static_cast<std::size_t>(mine[kHeader + nsplits + t]);
      if (!contiguous && split > 0) {
        HP_RETURN_IF_ERROR(Record(device_->Copy(send_staging->data() + at * x.row_bytes,
                                                input + source * x.row_bytes, split * x.row_bytes, stream,
                                                send_staging)));
      }
      at += split;
      part_rows += split;
    }
    const char* base =
        contiguous
            ? input + static_cast<std::size_t>(mine[kHeader + nsplits + static_cast<std::size_t>(r) * ne]) * x.row_bytes
            : send_staging->data() + first * x.row_bytes;
    parts.emplace_back(base, part_rows * x.row_bytes);
  }
  std::vector<std::uint64_t> receive_rows(static_cast<std::size_t>(n), 0);
  for (std::size_t i = 0; i < nsplits; ++i) {
    receive_rows[static_cast<std::size_t>(source_of(i))] += static_cast<std::uint64_t>(layout.splits[i]);
  }
  std::uint64_t total = 0;
  for (std::uint64_t r : receive_rows) total += r;
  ElementType row_type;
  row_type.name = "moe_row";
  row_type.bytes = x.row_bytes;
  if (!dispatch) {   // combine's output is rank-major and packed: the engine's own layout
    return AllToAll(x.team, parts, output, total * x.row_bytes, receive_rows, row_type, stream, send_staging,
                    x.role);
  }
  auto receive_staging = std::make_shared<std::vector<char>>(total * x.row_bytes);
  HP_RETURN_IF_ERROR(AllToAll(x.team, parts, receive_staging->data(), receive_staging->size(), receive_rows, row_type,
                              stream, send_staging, x.role));
  // Source after source, each source's chunks expert after expert: into the expert-major regions.
  std::size_t read = 0;
  for (int s = 0; s < n; ++s) {
    for (int e = 0; e < ne; ++e) {
      const std::size_t i = static_cast<std::size_t>(e) * n + s;
      const std::size_t bytes = static_cast<std::size_t>(layout.splits[i]) * x.row_bytes;
      if (bytes > 0) {
        HP_RETURN_IF_ERROR(Record(device_->Copy(output + static_cast<std::size_t>(layout.offsets[i]) * x.row_bytes,
                                                receive_staging->data() + read, bytes, stream, receive_staging)));
      }
      read += bytes;
    }
  }
  return Status::Ok();
}

}  // namespace hp::shmem
