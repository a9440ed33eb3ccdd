// MoE dispatch and combine over the runtime's teams (bindings/torch/symm_mem_moe.h), thread-ranks on the host device:
// the layouts and offsets torch's all_to_all_vdev_2d / _offset define, a round trip that restores every token, and
// the verdicts every rank reaches alike before anything is written.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings/torch/symm_mem_moe.h"
#include "runtime_support.h"
#include "thread_bootstrap.h"

namespace hp::shmem {
namespace {

using testutil::HasError;
using testutil::IsOk;
using testutil::RunRanks;
using torch_binding::MoeDirection;
using torch_binding::MoeExchange;
using torch_binding::RunMoeExchange;

// The host device with room for the team pool and the tests' buffers.
Status InitHost(Runtime& runtime, Bootstrap& bootstrap) {
  Config config;
  config.heap_size = 8 * testutil::kMiB;
  config.timeout_sec = 10.0;
  config.log_level = LogLevel::kError;
  return runtime.Init(config, std::make_unique<host::HostDevice>(), bootstrap);
}

std::vector<int> AllPes(int world) {
  std::vector<int> pes;
  for (int pe = 0; pe < world; ++pe) pes.push_back(pe);
  return pes;
}

constexpr int kExperts = 3;
constexpr std::int64_t kRowFloats = 2;   // a row: two floats
constexpr std::size_t kRowBytes = kRowFloats * sizeof(float);

// Rows rank `source` sends to expert e of rank `peer`: uneven, some empty.
std::int64_t Split(int source, int peer, int e) { return (source * 7 + peer * 3 + e * 5) % 4; }

// A token's value: who sent it, to which (peer, expert), which row of the chunk.
float Token(int source, int peer, int e, std::int64_t row, int column) {
  return static_cast<float>(source * 10000 + peer * 1000 + e * 100 + row * 2 + column);
}

std::int64_t AlignUp(std::int64_t rows, std::int64_t align) {
  const std::int64_t aligned = (rows + align - 1) / align * align;
  return aligned < align ? align : aligned;
}

struct Buffers {
  float* input = nullptr;    // symmetric
  float* output = nullptr;   // symmetric
  float* back = nullptr;     // symmetric: combine's output
  std::int64_t input_offset = -1;    // heap offsets
  std::int64_t output_offset = -1;
};

Buffers Allocate(Runtime& runtime, std::int64_t rows) {
  Buffers b;
  std::int64_t* offsets[] = {&b.input_offset, &b.output_offset, nullptr};
  int k = 0;
  for (float** p : {&b.input, &b.output, &b.back}) {
    auto info = runtime.Allocate(static_cast<std::size_t>(rows) * kRowBytes, 0, "moe test");
    EXPECT_TRUE(info.ok()) << info.status().ToString();
    *p = reinterpret_cast<float*>(info.value().base);
    if (offsets[k] != nullptr) *offsets[k] = static_cast<std::int64_t>(info.value().offset);
    ++k;
  }
  return b;
}

// Both data paths: pulled out of symmetric inputs, or through the engine's all_to_all (an ordinary input on rank 0,
// as torch.compile hands one over, takes every rank there).
TEST(SymmMemMoeTest, DispatchLaysOutExpertMajorAndCombineRestoresEveryToken) {
  for (auto [world, symmetric] : {std::pair{2, true}, std::pair{3, true}, std::pair{2, false}, std::pair{3, false}}) {
    RunRanks(world, [world, symmetric = symmetric](int rank, Bootstrap& bootstrap) {
      Runtime runtime;
      ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
      auto team = runtime.CreateTeam(AllPes(world), bootstrap);
      ASSERT_TRUE(team.ok()) << team.status().ToString();
      const std::int64_t capacity = 64;
      Buffers b = Allocate(runtime, capacity);
      const int n = world;
      const std::size_t nsplits = static_cast<std::size_t>(n) * kExperts;
      // Rank-major input: the chunks for (peer, expert) one after the other.
      std::vector<std::int64_t> in_splits(nsplits);
      std::int64_t row = 0;
      for (int peer = 0; peer < n; ++peer) {
        for (int e = 0; e < kExperts; ++e) {
          const std::int64_t split = Split(rank, peer, e);
          in_splits[static_cast<std::size_t>(peer * kExperts + e)] = split;
          for (std::int64_t r = 0; r < split; ++r, ++row) {
            for (int c = 0; c < kRowFloats; ++c) b.input[row * kRowFloats + c] = Token(rank, peer, e, r, c);
          }
        }
      }
      const std::int64_t routed = row;
      const std::int64_t align = 4;
      std::vector<std::int64_t> out(2 * nsplits, -1);
      MoeExchange dispatch;
      dispatch.op = "all_to_all_vdev_2d";
      dispatch.team = team.value();
      dispatch.direction = MoeDirection::kDispatch;
      dispatch.experts = kExperts;
      dispatch.input = reinterpret_cast<const char*>(b.input);
      dispatch.input_heap_offset = symmetric || rank > 0 ? b.input_offset : -1;
      dispatch.input_rows = capacity;
      dispatch.output = reinterpret_cast<char*>(b.output);
      dispatch.output_rows = capacity;
      dispatch.row_bytes = kRowBytes;
      dispatch.in_splits = in_splits.data();
      dispatch.major_align = align;
      dispatch.out_splits = out.data();
      dispatch.out_offsets = out.data() + nsplits;
      ASSERT_TRUE(IsOk(RunMoeExchange(runtime, dispatch)));

      // Expert-major: expert e's region starts aligned and holds every source's chunk in rank order.
      std::int64_t region = 0;
      for (int e = 0; e < kExperts; ++e) {
        std::int64_t at = region;
        for (int s = 0; s < n; ++s) {
          const std::size_t i = static_cast<std::size_t>(e * n + s);
          const std::int64_t split = Split(s, rank, e);
          EXPECT_EQ(out[i], split) << "expert " << e << " source " << s;
          EXPECT_EQ(out[nsplits + i], at) << "expert " << e << " source " << s;
          for (std::int64_t r = 0; r < split; ++r) {
            for (int c = 0; c < kRowFloats; ++c) {
              EXPECT_EQ(b.output[(at + r) * kRowFloats + c], Token(s, rank, e, r, c));
            }
          }
          at += split;
        }
        region += AlignUp(at - region, align);
      }

      // Combine with dispatch's splits and offsets: every token returns to where it left.
      std::vector<std::int64_t> back(2 * nsplits, -1);
      MoeExchange combine = dispatch;
      combine.op = "all_to_all_vdev_2d_offset";
      combine.direction = MoeDirection::kCombine;
      combine.input = reinterpret_cast<const char*>(b.output);
      combine.input_heap_offset = symmetric || rank > 0 ? b.output_offset : -1;
      combine.output = reinterpret_cast<char*>(b.back);
      combine.in_splits = out.data();
      combine.in_offsets = out.data() + nsplits;
      combine.major_align = 0;
      combine.out_splits = back.data();
      combine.out_offsets = back.data() + nsplits;
      ASSERT_TRUE(IsOk(RunMoeExchange(runtime, combine)));
      std::int64_t packed = 0;
      for (std::size_t i = 0; i < nsplits; ++i) {
        EXPECT_EQ(back[i], in_splits[i]);
        EXPECT_EQ(back[nsplits + i], packed);
        packed += in_splits[i];
      }
      for (std::int64_t f = 0; f < routed * kRowFloats; ++f) EXPECT_EQ(b.back[f], b.input[f]) << "float " << f;
      ASSERT_TRUE(IsOk(runtime.ReleaseTeam(team.value())));
    });
  }
}

TEST(SymmMemMoeTest, AReceiveBufferTooSmallFailsOnEveryRankBeforeAnythingIsWritten) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    auto team = runtime.CreateTeam(AllPes(2), bootstrap);
    ASSERT_TRUE(team.ok()) << team.status().ToString();
    Buffers b = Allocate(runtime, 16);
    for (int f = 0; f < 16 * kRowFloats; ++f) b.output[f] = -1.0F;
    // Every rank sends 3 rows to each expert of rank 1 and 1 row to rank 0: rank 1 receives 12 rows, and its
    // `out` holds 8 (its expert 0's region takes 6, expert 1's region ends at row 12).
    std::vector<std::int64_t> in_splits = {1, 1, 3, 3};
    std::vector<std::int64_t> out(8, -7);   // splits, then offsets
    MoeExchange x;
    x.op = "all_to_all_vdev_2d";
    x.team = team.value();
    x.experts = 2;
    x.input = reinterpret_cast<const char*>(b.input);
    x.input_rows = 16;
    x.output = reinterpret_cast<char*>(b.output);
    x.output_rows = rank == 1 ? 8 : 16;
    x.row_bytes = kRowBytes;
    x.in_splits = in_splits.data();
    x.major_align = 1;
    x.out_splits = out.data();
    x.out_offsets = out.data() + 4;
    EXPECT_TRUE(HasError(RunMoeExchange(runtime, x), StatusCode::kInvalidArgument,
                         "all_to_all_vdev_2d: `out` of rank 1 must hold the 12 rows its peers send (the overflow starts "
                         "at expert 3, local expert 1 of rank 1), but got 8 rows (every rank raises; nothing was "
                         "written)"));
    EXPECT_EQ(out, std::vector<std::int64_t>(8, -7));
    for (int f = 0; f < 16 * kRowFloats; ++f) EXPECT_EQ(b.output[f], -1.0F);
    // The team stays in step: the same exchange with room for everything goes through.
    x.output_rows = 16;
    EXPECT_TRUE(IsOk(RunMoeExchange(runtime, x)));
    EXPECT_EQ(out[0] + out[1], rank == 0 ? 2 : 6);
    ASSERT_TRUE(IsOk(runtime.ReleaseTeam(team.value())));
  });
}

TEST(SymmMemMoeTest, BadSplitsOfOneRankFailOnEveryRank) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    auto team = runtime.CreateTeam(AllPes(2), bootstrap);
    ASSERT_TRUE(team.ok()) << team.status().ToString();
    Buffers b = Allocate(runtime, 8);
    std::vector<std::int64_t> out(4, -7);
    MoeExchange x;
    x.op = "all_to_all_vdev";
    x.team = team.value();
    x.input = reinterpret_cast<const char*>(b.input);
    x.input_rows = 8;
    x.output = reinterpret_cast<char*>(b.output);
    x.output_rows = 8;
    x.row_bytes = kRowBytes;
    x.out_splits = out.data();
    x.out_offsets = out.data() + 2;
    // A negative split on rank 0.
    std::vector<std::int64_t> negative = rank == 0 ? std::vector<std::int64_t>{2, -1} : std::vector<std::int64_t>{1, 1};
    x.in_splits = negative.data();
    EXPECT_TRUE(HasError(RunMoeExchange(runtime, x), StatusCode::kInvalidArgument,
                         "all_to_all_vdev: `in_splits` must be non-negative, but got in_splits[1]=-1 on rank 0"));
    // Splits that sum past `input` on rank 1.
    std::vector<std::int64_t> past = rank == 1 ? std::vector<std::int64_t>{5, 4} : std::vector<std::int64_t>{1, 1};
    x.in_splits = past.data();
    EXPECT_TRUE(HasError(RunMoeExchange(runtime, x), StatusCode::kInvalidArgument,
                         "all_to_all_vdev: the chunks of `in_splits` must lie inside `input` (8 rows), but got chunk 1 "
                         "ending at row 9 on rank 1"));
    EXPECT_EQ(out, std::vector<std::int64_t>(4, -7));
    ASSERT_TRUE(IsOk(runtime.ReleaseTeam(team.value())));
  });
}

}  // namespace
}  // namespace hp::shmem
