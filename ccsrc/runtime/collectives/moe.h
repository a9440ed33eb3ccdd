// MoE dispatch and combine: one collective of a team (Runtime::MoeExchange, collectives/moe.cc), what torch's
// all_to_all_vdev, all_to_all_vdev_2d and all_to_all_vdev_2d_offset compute and what the user API's
// shmem_moe_dispatch and shmem_moe_combine call.
//
// The unit of the splits is a row: `row_bytes` bytes at stride row_bytes in `input` and `output`. A team of n ranks
// runs `experts` experts per rank, so every split table holds n x experts int64 entries:
//
//   dispatch  in_splits[peer * experts + e] rows of `input` go to local expert e of `peer` (rank-major, packed in
//             that order unless `in_offsets` says where each chunk starts). `output` is expert-major: expert e's
//             region holds the chunks of every source rank in rank order, and starts at a multiple of
//             `major_align` (each region takes at least `major_align` rows); out_splits/out_offsets are indexed
//             [e * n + source].
//   combine   in_splits[e * n + peer] rows, at in_offsets[e * n + peer], of local expert e go to `peer`
//             (expert-major, the layout dispatch produced). `output` is rank-major, packed: the chunks of source s
//             for its experts 0..experts-1 in order; out_splits/out_offsets are indexed [source * experts + e].
//
// Combine with dispatch's out_splits and out_offsets as its in_splits and in_offsets puts every row back where
// dispatch took it (when dispatch's input was packed): each is the other's backward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/status.h"
#include "runtime/team.h"

namespace hp::shmem {

enum class MoeDirection { kDispatch, kCombine };

// One exchange's arguments. Every buffer is memory this rank's device addresses (the split tables too: on an NPU they
// are device memory, read through the device); `input` may lie in the symmetric heap or outside it, on any member
// (an ordinary one stages through host memory where the device's memory is the host's, else through the team's
// symmetric staging area, on the device's stream).
struct MoeExchangeArgs {
  const char* op = "moe_dispatch";   // names the call in messages
  std::uint64_t team = 0;
  MoeDirection direction = MoeDirection::kDispatch;
  int experts = 1;   // experts per rank (1: a plain all_to_all_v)
  const void* input = nullptr;
  std::int64_t input_rows = 0;
  void* output = nullptr;
  std::int64_t output_rows = 0;
  std::size_t row_bytes = 0;
  const std::int64_t* in_splits = nullptr;    // n x experts
  const std::int64_t* in_offsets = nullptr;   // n x experts, or null: the chunks are packed in split order
  std::int64_t major_align = 0;               // dispatch: alignment of each expert's region in rows (0: packed)
  std::int64_t* out_splits = nullptr;         // n x experts, written once every member agreed
  std::int64_t* out_offsets = nullptr;        // n x experts, written once every member agreed
  CallRole role = CallRole::kForward;         // a gradient's exchange never pairs with a forward one
};

// The two steps every member of an exchange takes before anything moves, as pure functions: the engine's exchange
// (Runtime::MoeExchange) runs them, and so do the handlers' phases of a team that spans nodes
// (core/multicore/hierarchy.py), so that both lay out, check and word their errors alike.
//
// The arguments these steps read (op, direction, experts, major_align and the row counts), from a handler's numbers:
// `direction` 0 (dispatch) or 1 (combine), `experts` positive, the rest non-negative.
Result<MoeExchangeArgs> MoeStepArgs(int direction, int experts, std::int64_t major_align, std::int64_t input_rows,
                                    std::int64_t output_rows);

// 1. What a member publishes of its own call (`x`'s experts, row counts and offsets' presence; `splits`, and
//    `offsets` or null, hold members x experts values): its own finding on its split tables (a negative split, a chunk
//    outside `input`), its output's rows, its input's heap offset (-1: memory the peers cannot read), its splits and
//    each chunk's first row. kMoeRowHeader + 2 x members x experts values.
constexpr std::size_t kMoeRowHeader = 6;
std::vector<std::int64_t> MoePublishedRow(const MoeExchangeArgs& x, int members, const std::int64_t* splits,
                                          const std::int64_t* offsets, std::int64_t heap_offset);

// 2. From every member's published row (group-rank order, the same on every member), member `me`'s layout: where
//    each chunk it receives lands (its out_splits and out_offsets) and where it starts on its source (`from`), all
//    indexed as the receiver's out_splits. The first finding a member published, else the first receiver whose
//    output is too small, fails with the message every member raises (InvalidArgument).
struct MoeLayout {
  std::vector<std::int64_t> splits, offsets, from;
};
Result<MoeLayout> PlanMoeExchange(const MoeExchangeArgs& x, const std::vector<std::vector<std::int64_t>>& rows, int me);

}  // namespace hp::shmem
