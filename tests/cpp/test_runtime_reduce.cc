// Runtime::Reduce over thread-ranks: results across all pes and subsets, every contract by its message (nothing
// written, the failure recorded), zero bytes, and stream order.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime_support.h"
#include "thread_bootstrap.h"

namespace hp::shmem {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): the shared test helpers

AllocationInfo MustAllocate(Runtime& runtime, std::size_t bytes) {
  Result<AllocationInfo> info = runtime.Allocate(bytes, 0, "test");
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  return info.ok() ? info.value() : AllocationInfo{};
}

void* Address(const AllocationInfo& info, std::size_t offset = 0) { return reinterpret_cast<char*>(info.base) + offset; }

std::int64_t Value(int pe, std::size_t i) { return static_cast<std::int64_t>(i) * 3 - 50 + pe * 7; }

class RuntimeReduceTest : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Ranks, RuntimeReduceTest, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "ranks"; });

TEST_P(RuntimeReduceTest, ReducesAcrossEveryPeAndSubsets) {
  const int world = GetParam();
  RunRanks(world, [world](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    constexpr std::size_t kCount = 1031;
    const AllocationInfo floats = MustAllocate(runtime, kCount * sizeof(float));
    const AllocationInfo ints = MustAllocate(runtime, kCount * sizeof(std::int64_t));
    auto* f = static_cast<float*>(Address(floats));
    auto* n = static_cast<std::int64_t*>(Address(ints));
    for (std::size_t i = 0; i < kCount; ++i) {
      f[i] = static_cast<float>(Value(rank, i));
      n[i] = Value(rank, i);
    }
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    std::vector<int> all;
    for (int pe = 0; pe < world; ++pe) all.push_back(pe);
    // A subset, last pe first: {world - 1, 0}, or {0} alone in a world of one.
    const std::vector<int> pes_subset = world == 1 ? std::vector<int>{0} : std::vector<int>{world - 1, 0};

    std::vector<float> avg(kCount);
    std::vector<std::int64_t> sum(kCount), max(kCount);
    ASSERT_TRUE(IsOk(runtime.Reduce(avg.data(), kCount * 4, f, kCount * 4, DataType::kFloat32, ReduceOp::kAvg, all,
                                    kDefaultStream, nullptr)));
    ASSERT_TRUE(IsOk(runtime.Reduce(sum.data(), kCount * 8, n, kCount * 8, DataType::kInt64, ReduceOp::kSum, all,
                                    kDefaultStream, nullptr)));
    ASSERT_TRUE(IsOk(runtime.Reduce(max.data(), kCount * 8, n, kCount * 8, DataType::kInt64, ReduceOp::kMax,
                                    pes_subset, kDefaultStream, nullptr)));
    for (std::size_t i = 0; i < kCount; ++i) {
      std::int64_t total = 0;
      for (int pe = 0; pe < world; ++pe) total += Value(pe, i);
      ASSERT_EQ(sum[i], total) << i;
      ASSERT_EQ(avg[i], static_cast<float>(total) / static_cast<float>(world)) << i;   // small ints: exact sums
      ASSERT_EQ(max[i], Value(world - 1, i)) << i;
    }
    // In place, with nobody else reading: every rank reduces only its own copy.
    ASSERT_TRUE(IsOk(runtime.Reduce(n, kCount * 8, n, kCount * 8, DataType::kInt64, ReduceOp::kSum, {rank},
                                    kDefaultStream, nullptr)));
    EXPECT_EQ(n[kCount - 1], Value(rank, kCount - 1));
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    EXPECT_TRUE(IsOk(runtime.Free(ints.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Free(floats.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeReduceTest, RejectedBeforeInit) {
  Runtime runtime;
  float value = 0;
  EXPECT_TRUE(Rejected(runtime,
                       runtime.Reduce(&value, 4, &value, 4, DataType::kFloat32, ReduceOp::kSum, {0}, kDefaultStream,
                                      nullptr),
                       StatusCode::kStateError,
                       "shmem runtime is not initialised: op=reduce state=uninitialized (call acquire_shmem() first)"));
}

TEST(RuntimeReduceTest, EveryContractByItsMessageAndNothingWritten) {
  RunRanks(2, [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    const AllocationInfo buffer = MustAllocate(runtime, 64);
    auto* src = static_cast<float*>(Address(buffer));
    for (int i = 0; i < 16; ++i) src[i] = static_cast<float>(i);
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    std::vector<float> dst(32, -1.0f);
    const std::vector<float> untouched = dst;
    auto reduce = [&](void* to, std::size_t dst_bytes, const void* from, std::size_t src_bytes, DataType dtype,
                      ReduceOp op, const std::vector<int>& pes) {
      return runtime.Reduce(to, dst_bytes, from, src_bytes, dtype, op, pes, kDefaultStream, nullptr);
    };
    const auto f32 = DataType::kFloat32;
    const auto sum = ReduceOp::kSum;
    const StatusCode invalid = StatusCode::kInvalidArgument;
    EXPECT_TRUE(Rejected(runtime, reduce(dst.data(), 64, src, 64, f32, sum, {}), invalid,
                         "`pes` must name at least one pe, but got none"));
    EXPECT_TRUE(Rejected(runtime, reduce(dst.data(), 64, src, 64, f32, sum, {0, 2}), invalid,
                         "`pes[1]` must be in [0, 2), but got 2"));
    EXPECT_TRUE(Rejected(runtime, reduce(dst.data(), 64, src, 64, f32, sum, {-1}), invalid,
                         "`pes[0]` must be in [0, 2), but got -1"));
    EXPECT_TRUE(Rejected(runtime, reduce(dst.data(), 64, src, 64, f32, sum, {1, 0, 1}), invalid,
                         "`pes` must be distinct, but got 1 at positions 0 and 2"));
    EXPECT_TRUE(Rejected(runtime, reduce(dst.data(), 60, src, 64, f32, sum, {0}), invalid,
                         "`src` must have as many bytes as `dst` (60), but got 64"));
    EXPECT_TRUE(Rejected(runtime, reduce(dst.data(), 6, src, 6, f32, sum, {0}), invalid,
                         "`src` must hold whole float32 elements (4 bytes each), but got 6 bytes"));
    EXPECT_TRUE(Rejected(runtime, reduce(dst.data(), 64, src, 64, DataType::kInt32, ReduceOp::kAvg, {0}), invalid,
                         "`op` must be sum, max or min for int32, but got avg"));
    EXPECT_TRUE(Rejected(runtime, reduce(dst.data(), 64, dst.data() + 16, 64, f32, sum, {0}), invalid,
                         "`src` must be a symmetric tensor allocated by shmem.empty, but got an address " +
                             Hex(reinterpret_cast<std::uintptr_t>(dst.data() + 16)) +
                             " outside every active allocation"));
    EXPECT_TRUE(Rejected(runtime, reduce(dst.data(), 128, src, 128, f32, sum, {0}), invalid,
                         "`src` must lie inside its symmetric allocation, but got bytes [" + Hex(buffer.base) + "," +
                             Hex(buffer.base + 128) + ") past the end of allocation_id=" + std::to_string(buffer.id) +
                             " (base=" + Hex(buffer.base) + " bytes=64)"));
    // dst overlapping src other than as src itself, from either side.
    EXPECT_TRUE(Rejected(runtime, reduce(src + 1, 8, src, 8, f32, sum, {0}), invalid,
                         "`dst` must be `src` itself or not overlap it, but got bytes [" + Hex(buffer.base + 4) + "," +
                             Hex(buffer.base + 12) + ") against src [" + Hex(buffer.base) + "," +
                             Hex(buffer.base + 8) + ")"));
    EXPECT_TRUE(Rejected(runtime, reduce(src, 8, src + 1, 8, f32, sum, {0}), invalid,
                         "`dst` must be `src` itself or not overlap it, but got bytes [" + Hex(buffer.base) + "," +
                             Hex(buffer.base + 8) + ") against src [" + Hex(buffer.base + 4) + "," +
                             Hex(buffer.base + 12) + ")"));
    // Zero bytes: validated, then nothing happens.
    EXPECT_TRUE(IsOk(reduce(dst.data(), 0, src, 0, f32, sum, {0, 1})));
    EXPECT_TRUE(Rejected(runtime, reduce(dst.data(), 0, src, 0, f32, sum, {2}), invalid,
                         "`pes[0]` must be in [0, 2), but got 2"));
    EXPECT_TRUE(Rejected(runtime, reduce(dst.data(), 0, dst.data(), 0, f32, sum, {0}), invalid,
                         "`src` must be a symmetric tensor allocated by shmem.empty, but got an address " +
                             Hex(reinterpret_cast<std::uintptr_t>(dst.data())) + " outside every active allocation"));
    EXPECT_EQ(dst, untouched);
    // Disjoint ranges of the same allocation are fine.
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));   // the peers are done reading src
    EXPECT_TRUE(IsOk(reduce(src + 8, 32, src, 32, f32, sum, {0})));
    EXPECT_EQ(src[8], 0.0f);
    EXPECT_EQ(src[15], 7.0f);
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    EXPECT_TRUE(IsOk(runtime.Free(buffer.id, "test")));
    // A freed allocation is no source.
    EXPECT_TRUE(HasError(reduce(dst.data(), 4, src, 4, f32, sum, {0}), invalid,
                         "`src` must be a symmetric tensor allocated by shmem.empty"));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeReduceTest, RunsInStreamOrder) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    constexpr std::size_t kCount = 2000;
    const AllocationInfo buffer = MustAllocate(runtime, kCount * sizeof(std::int32_t));
    const AllocationInfo flag = MustAllocate(runtime, 8);
    auto* data = static_cast<std::int32_t*>(Address(buffer));
    for (std::size_t i = 0; i < kCount; ++i) data[i] = 2;
    std::memset(Address(flag), 0, 8);
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    if (rank == 0) {
      Result<StreamHandle> stream = runtime.CreateStream();
      ASSERT_TRUE(stream.ok());
      std::vector<std::int32_t> out(kCount, 0);
      ASSERT_TRUE(IsOk(runtime.WaitSignal(Address(flag), SignalWidth::k32, CompareOp::kEq, 1, stream.value())));
      ASSERT_TRUE(IsOk(runtime.Reduce(out.data(), kCount * 4, data, kCount * 4, DataType::kInt32, ReduceOp::kMax,
                                      {0, 1}, stream.value(), nullptr)));
      ASSERT_TRUE(IsOk(bootstrap.Barrier()));
      ASSERT_TRUE(IsOk(runtime.SynchronizeStream(stream.value())));
      EXPECT_EQ(out, std::vector<std::int32_t>(kCount, 9));   // rank 1's data written before its signal
      EXPECT_TRUE(IsOk(runtime.DestroyStream(stream.value())));
    } else {
      ASSERT_TRUE(IsOk(bootstrap.Barrier()));
      for (std::size_t i = 0; i < kCount; ++i) data[i] = 9;
      ASSERT_TRUE(IsOk(runtime.Signal(Address(flag), SignalWidth::k32, 1, SignalOp::kSet, 0, kDefaultStream)));
    }
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    EXPECT_TRUE(IsOk(runtime.Free(flag.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Free(buffer.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

}  // namespace
}  // namespace hp::shmem
