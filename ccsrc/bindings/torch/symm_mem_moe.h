// MoE dispatch and combine (torch's all_to_all_vdev, all_to_all_vdev_2d and all_to_all_vdev_2d_offset) over the
// runtime's teams, in one function that knows nothing of torch: the engine can adopt it as one operation later.
//
// The unit of the splits is a row: `row_bytes` bytes at stride row_bytes in `input` and `output`. A group of n ranks
// runs `experts` experts per rank, so every split table holds n x experts entries:
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
// Collective over the team; every member passes the same `experts` and direction. An all_to_all of the splits and
// source offsets, then an agreement on every member's verdict (a negative split, a chunk outside `input`, an `output`
// too small for what the peers send: every member raises the same error, naming the rank, the expert and both sizes,
// before anything is written) and on the data path:
//   - every member's `input` symmetric: each member pulls its chunks out of the peers' `input` (one Get per chunk,
//     straight into place), and a closing barrier keeps every `input` unchanged until all members have read it;
//   - otherwise (an ordinary tensor: what torch.compile's functionalization passes on): the engine's all_to_all of
//     each member's chunks per receiver, packed first where they are not contiguous (combine), laid out
//     expert-major after (dispatch): one local copy more than the pull.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/runtime.h"

namespace hp::shmem::torch_binding {

enum class MoeDirection { kDispatch, kCombine };

struct MoeExchange {
  const char* op = "all_to_all_vdev";   // names the call in messages
  std::uint64_t team = 0;
  MoeDirection direction = MoeDirection::kDispatch;
  int experts = 1;                       // experts per rank (1: a plain all_to_all_v)
  const char* input = nullptr;
  std::int64_t input_rows = 0;
  std::int64_t input_heap_offset = -1;   // where `input` lies in the symmetric heap (-1: an ordinary tensor)
  char* output = nullptr;
  std::int64_t output_rows = 0;
  std::size_t row_bytes = 0;
  const std::int64_t* in_splits = nullptr;    // n x experts
  const std::int64_t* in_offsets = nullptr;   // n x experts, or null: the chunks are packed in split order
  std::int64_t major_align = 0;               // dispatch: alignment of each expert's region in rows (0: packed)
  std::int64_t* out_splits = nullptr;         // n x experts, written once every member agreed
  std::int64_t* out_offsets = nullptr;        // n x experts, written once every member agreed
};

// Runs `exchange` on the calling thread (the default stream). Fails with kInvalidArgument, the same on every member,
// when a member's splits or sizes do not fit; with the team's errors (kTimeout naming the missing member, kMismatch)
// otherwise.
Status RunMoeExchange(Runtime& runtime, const MoeExchange& exchange);

}  // namespace hp::shmem::torch_binding
