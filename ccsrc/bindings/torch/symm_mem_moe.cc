#include "bindings/torch/symm_mem_moe.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace hp::shmem::torch_binding {
namespace {

// What a member found wrong with the call, published to every member so that all raise the same error.
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

std::string Describe(const MoeExchange& x, const Finding& f, int rank, int experts) {
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

// The rows a member sends in all (every split; the verdict made sure they are non-negative).
std::int64_t SentRows(const MoeExchange& x, std::size_t nsplits) {
  std::int64_t rows = 0;
  for (std::size_t t = 0; t < nsplits; ++t) rows += x.in_splits[t];
  return rows;
}

}  // namespace

Status RunMoeExchange(Runtime& runtime, const MoeExchange& x) {
  HP_ASSIGN_OR_RETURN(const TeamView view, runtime.DescribeTeam(x.team));
  const int n = static_cast<int>(view.pes.size());
  const int me = view.me;
  const int ne = x.experts;
  const bool dispatch = x.direction == MoeDirection::kDispatch;
  const std::size_t nsplits = static_cast<std::size_t>(n) * static_cast<std::size_t>(ne);
  const std::size_t block = 2 * static_cast<std::size_t>(ne);   // per receiver: splits, then source offsets

  // 1. This rank's chunks: where each starts in `input`, and what goes to each receiver.
  Finding mine;
  std::vector<std::int64_t> source(nsplits);
  std::int64_t packed = 0;
  for (std::size_t t = 0; t < nsplits; ++t) {
    const std::int64_t split = x.in_splits[t];
    const std::int64_t start = x.in_offsets != nullptr ? x.in_offsets[t] : packed;
    source[t] = start;
    packed = SaturatingAdd(packed, std::max<std::int64_t>(split, 0));
    if (mine.verdict != Verdict::kOk) continue;
    if (split < 0) {
      mine = {Verdict::kNegativeSplit, static_cast<std::int64_t>(t), split, 0};
    } else if (start < 0 || SaturatingAdd(start, split) > x.input_rows) {
      mine = {Verdict::kOutsideInput, static_cast<std::int64_t>(t), SaturatingAdd(start, split), x.input_rows};
    }
  }
  std::vector<std::int64_t> sends(static_cast<std::size_t>(n) * block);
  for (int r = 0; r < n; ++r) {
    for (int e = 0; e < ne; ++e) {
      const std::size_t t = dispatch ? static_cast<std::size_t>(r) * ne + e : static_cast<std::size_t>(e) * n + r;
      sends[r * block + e] = x.in_splits[t];
      sends[r * block + ne + e] = source[t];
    }
  }

  // 2. Every receiver learns the splits and source offsets of its chunks.
  std::vector<std::int64_t> table(sends.size());
  std::vector<std::pair<const void*, std::size_t>> views;
  views.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) views.emplace_back(sends.data() + r * block, block * sizeof(std::int64_t));
  const std::vector<std::uint64_t> counts(static_cast<std::size_t>(n), block);
  ElementType int64;
  int64.name = "int64";
  int64.bytes = sizeof(std::int64_t);
  HP_RETURN_IF_ERROR(runtime.AllToAll(x.team, views, table.data(), table.size() * sizeof(std::int64_t), counts, int64,
                                      kDefaultStream, nullptr));

  // 3. Where each received chunk lands: expert-major with aligned regions (dispatch), rank-major packed (combine).
  std::vector<std::int64_t> out_splits(nsplits), out_offsets(nsplits), from(nsplits);
  auto received = [&](int s, int e) { return std::max<std::int64_t>(table[s * block + e], 0); };
  std::int64_t cursor = 0;
  if (dispatch) {
    for (int e = 0; e < ne; ++e) {
      const std::int64_t region = cursor;
      for (int s = 0; s < n; ++s) {
        const std::size_t i = static_cast<std::size_t>(e) * n + s;
        out_splits[i] = received(s, e);
        out_offsets[i] = cursor;
        from[i] = table[s * block + ne + e];
        cursor = SaturatingAdd(cursor, out_splits[i]);
      }
      cursor = SaturatingAdd(region, x.major_align > 0 ? AlignUp(cursor - region, x.major_align) : cursor - region);
    }
  } else {
    for (int s = 0; s < n; ++s) {
      for (int e = 0; e < ne; ++e) {
        const std::size_t i = static_cast<std::size_t>(s) * ne + e;
        out_splits[i] = received(s, e);
        out_offsets[i] = cursor;
        from[i] = table[s * block + ne + e];
        cursor = SaturatingAdd(cursor, out_splits[i]);
      }
    }
  }
  if (mine.verdict == Verdict::kOk) {
    std::int64_t needed = 0;
    std::int64_t first_overflow = -1;
    for (std::size_t i = 0; i < nsplits; ++i) {
      if (out_splits[i] == 0) continue;
      const std::int64_t end = SaturatingAdd(out_offsets[i], out_splits[i]);
      needed = std::max(needed, end);
      if (end > x.output_rows && first_overflow < 0) {
        // The expert the chunk belongs to, numbered across the group (one expert per rank: the sending rank).
        const std::int64_t e = dispatch ? static_cast<std::int64_t>(i) / n : static_cast<std::int64_t>(i) % ne;
        const std::int64_t owner = dispatch ? me : static_cast<std::int64_t>(i) / ne;
        const std::int64_t sender = dispatch ? static_cast<std::int64_t>(i) % n : owner;
        first_overflow = ne == 1 ? sender : owner * ne + e;
      }
    }
    if (first_overflow >= 0) mine = {Verdict::kOutputTooSmall, first_overflow, needed, x.output_rows};
  }

  // 4. Every member's verdict: all raise the first member's error before anything is written.
  std::vector<std::vector<std::int64_t>> verdicts;
  const std::vector<std::int64_t> published = {static_cast<std::int64_t>(mine.verdict), mine.a, mine.b, mine.c,
                                               x.input_heap_offset};
  if (n > 1) {
    Fingerprint fingerprint{};
    fingerprint.collective = static_cast<std::uint32_t>(Collective::kAllToAll);
    fingerprint.peer = -1;
    fingerprint.count = nsplits;
    fingerprint.element_bytes = x.row_bytes;
    std::snprintf(fingerprint.dtype, sizeof(fingerprint.dtype), "%s", dispatch ? "moe_dispatch" : "moe_combine");
    HP_ASSIGN_OR_RETURN(verdicts, runtime.Agree(x.team, fingerprint, published, kDefaultStream));
  } else {
    verdicts.push_back(published);
  }
  bool pull = true;   // every member's input is symmetric
  for (int r = 0; r < n; ++r) {
    const auto& row = verdicts[static_cast<std::size_t>(r)];
    pull = pull && row[4] >= 0;
    if (row[0] == 0) continue;
    const Finding found{static_cast<Verdict>(row[0]), row[1], row[2], row[3]};
    return InvalidArgument(Describe(x, found, r, ne));
  }
  std::copy(out_splits.begin(), out_splits.end(), x.out_splits);
  std::copy(out_offsets.begin(), out_offsets.end(), x.out_offsets);
  // The receiving chunk i comes from group rank `SourceOf(i)`.
  auto source_of = [&](std::size_t i) {
    return dispatch ? static_cast<int>(i % static_cast<std::size_t>(n)) : static_cast<int>(i / ne);
  };

  // 5a. Pull every chunk straight into place out of the peer's input (at the peer's heap offset), then hold `input`
  // until every member has read it.
  if (pull) {
    for (std::size_t i = 0; i < nsplits; ++i) {
      if (out_splits[i] == 0) continue;
      const int s = source_of(i);
      const std::int64_t shift = verdicts[static_cast<std::size_t>(s)][4] - x.input_heap_offset;
      const std::size_t bytes = static_cast<std::size_t>(out_splits[i]) * x.row_bytes;
      HP_RETURN_IF_ERROR(runtime.Get(x.output + static_cast<std::size_t>(out_offsets[i]) * x.row_bytes,
                                     x.input + shift + static_cast<std::size_t>(from[i]) * x.row_bytes, bytes, bytes,
                                     view.pes[static_cast<std::size_t>(s)], kDefaultStream, nullptr));
    }
    return runtime.TeamBarrier(x.team, kDefaultStream);
  }

  // 5b. The engine's all_to_all: each member's chunks for a receiver in one part (expert after expert), received
  // source after source.
  std::vector<char> send_staging;
  std::vector<std::pair<const void*, std::size_t>> parts;
  parts.reserve(static_cast<std::size_t>(n));
  const bool contiguous = dispatch && x.in_offsets == nullptr;   // rank-major and packed: a receiver's part is whole
  if (!contiguous) send_staging.resize(static_cast<std::size_t>(std::max<std::int64_t>(SentRows(x, nsplits), 0)) *
                                 x.row_bytes);
  std::size_t at = 0;
  for (int r = 0; r < n; ++r) {
    const std::size_t first = at;
    std::size_t rows = 0;
    for (int e = 0; e < ne; ++e) {
      const std::size_t t = dispatch ? static_cast<std::size_t>(r) * ne + e : static_cast<std::size_t>(e) * n + r;
      const auto split = static_cast<std::size_t>(x.in_splits[t]);
      if (!contiguous && split > 0) {
        std::memcpy(send_staging.data() + at * x.row_bytes, x.input + static_cast<std::size_t>(source[t]) * x.row_bytes,
                    split * x.row_bytes);
      }
      at += split;
      rows += split;
    }
    const char* base = contiguous ? x.input + static_cast<std::size_t>(source[static_cast<std::size_t>(r) * ne]) *
                                                  x.row_bytes
                                  : send_staging.data() + first * x.row_bytes;
    parts.emplace_back(base, rows * x.row_bytes);
  }
  std::vector<std::uint64_t> receive_rows(static_cast<std::size_t>(n), 0);
  for (std::size_t i = 0; i < nsplits; ++i) receive_rows[static_cast<std::size_t>(source_of(i))] += out_splits[i];
  std::uint64_t total = 0;
  for (std::uint64_t rows : receive_rows) total += rows;
  ElementType row_type;
  row_type.name = "moe_row";
  row_type.bytes = x.row_bytes;
  if (!dispatch) {   // combine's output is rank-major and packed: the engine's own layout
    return runtime.AllToAll(x.team, parts, x.output, total * x.row_bytes, receive_rows, row_type, kDefaultStream,
                            nullptr);
  }
  std::vector<char> receive_staging(total * x.row_bytes);
  HP_RETURN_IF_ERROR(runtime.AllToAll(x.team, parts, receive_staging.data(), receive_staging.size(), receive_rows, row_type,
                                      kDefaultStream, nullptr));
  // Source after source, each source's chunks expert after expert: into the expert-major regions.
  std::size_t read = 0;
  for (int s = 0; s < n; ++s) {
    for (int e = 0; e < ne; ++e) {
      const std::size_t i = static_cast<std::size_t>(e) * n + s;
      const std::size_t bytes = static_cast<std::size_t>(out_splits[i]) * x.row_bytes;
      if (bytes > 0) {
        std::memcpy(x.output + static_cast<std::size_t>(out_offsets[i]) * x.row_bytes, receive_staging.data() + read, bytes);
      }
      read += bytes;
    }
  }
  return Status::Ok();
}

}  // namespace hp::shmem::torch_binding
