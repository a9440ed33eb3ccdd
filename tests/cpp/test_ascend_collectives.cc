// The collective engine on the ascend device over the CANN fakes: the same cases as on the host device, with a heap
// and tensors the host cannot touch (every access goes through aclrtMemcpy), streams that run later than the host
// enqueues, and signal writes that clean a whole line. The engine defers its checks here (docs/engine.md); the cases
// that expect a mismatch before any data moves run with strict checks. On an explicit stream, what each collective
// costs is counted and asserted: no stream synchronization, no blocking copy, no allocation.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "collective_cases.h"
#include "moe_cases.h"
#include "fake_cann.h"
#include "runtime/ascend/ascend_device.h"
#include "runtime/logging.h"
#include "runtime/team.h"

namespace hp::shmem {
namespace {

testutil::CollectiveBackend AscendBackend(bool strict = false) {
  testutil::CollectiveBackend backend;
  backend.make_device = [] { return std::make_unique<ascend::AscendDevice>(); };
  backend.config = [strict] {
    Config config;
    config.device = "ascend";
    // 16 ranks gather 16 x 160 KB beside CANN's own 5 MiB of the heap.
    config.heap_size = 24 * testutil::kMiB;
    config.timeout_sec = 10.0;
    config.log_level = LogLevel::kError;
    config.strict_checks = strict;
    return config;
  };
  backend.alloc_local = [](std::size_t bytes) {
    void* data = nullptr;
    EXPECT_EQ(aclrtMalloc(&data, bytes, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
    return data;
  };
  backend.free_local = [](void* data) { EXPECT_EQ(aclrtFree(data), ACL_SUCCESS); };
  backend.write = [](void* dst, const void* src, std::size_t n) {
    EXPECT_EQ(aclrtMemcpy(dst, n, src, n, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
  };
  backend.read = [](void* dst, const void* src, std::size_t n) {
    EXPECT_EQ(aclrtMemcpy(dst, n, src, n, ACL_MEMCPY_DEVICE_TO_HOST), ACL_SUCCESS);
  };
  backend.enter_rank = [](int rank) { ASSERT_EQ(aclrtSetDevice(rank), ACL_SUCCESS); };
  return backend;
}

class AscendCollectivesTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    fakes::FakeCann::Reset();
    // 16 NPUs of a 910B host are two HCCS groups, hence two nodes; a SoC whose NPUs share one HCCS domain keeps
    // 16 ranks on one node, so that one team holds them all.
    if (GetParam() > 8) fakes::FakeCann::SetSocName("Ascend910_9391");
  }
  void TearDown() override {
    fakes::FakeCann::Reset();
    Logger::SetLevel(LogLevel::kWarning);
  }
};

TEST_P(AscendCollectivesTest, EveryCollectiveOnEveryPath) { testutil::RunEveryCollective(AscendBackend(), GetParam()); }

// float16 and bfloat16 through aclnnCast; the fp8 formats are refused by the device before anything moves.
TEST_P(AscendCollectivesTest, LowPrecisionInTheSixteenBitFormatsAndFp8Refused) {
  const testutil::CollectiveBackend backend = AscendBackend();   // outlives the buffers that refer to it
  testutil::RunLowPrecision(backend, GetParam(), {ops::LowFormat::kFloat16, ops::LowFormat::kBFloat16});
  testutil::RunOnRootTeam(backend, GetParam(), [&](int, Runtime& runtime, std::uint64_t t) {
    testutil::DeviceFloats tensor(backend, runtime, 16, false);
    EXPECT_TRUE(testutil::HasError(runtime.AllReduce(t, tensor.data(), 64, DataType::kFloat32, ReduceOp::kSum,
                                                     kDefaultStream, nullptr, ops::LowFormat::kFloat8E4M3Fn),
                                   StatusCode::kDeviceError, "needs a block-scaled fp8 cast kernel"));
    ASSERT_TRUE(testutil::IsOk(runtime.TeamBarrier(t, kDefaultStream)));
  });
}

TEST_P(AscendCollectivesTest, AllToAllOnEveryPath) { testutil::RunAllToAllPaths(AscendBackend(), GetParam()); }

// Strict checks: every call checked before its data moves, as on the host device.
TEST_P(AscendCollectivesTest, StrictChecksFailMismatchesOnEveryRankAndTheTeamStaysInStep) {
  testutil::RunMismatches(AscendBackend(/*strict=*/true), GetParam());
}

TEST_P(AscendCollectivesTest, StrictChecksFailOneStepAgainstStagedWithNothingWritten) {
  testutil::RunOneStepAgainstStaged(AscendBackend(/*strict=*/true), GetParam());
}

TEST_P(AscendCollectivesTest, EveryCollectiveOnEveryPathWithStrictChecks) {
  testutil::RunEveryCollective(AscendBackend(/*strict=*/true), GetParam());
}

// MoE dispatch and combine: split tables in NPU memory, read and written through the device; inputs symmetric or
// ordinary (staged through the team's staging area on the device).
TEST_P(AscendCollectivesTest, MoeDispatchAndCombineRoundTrip) {
  testutil::RunMoeRoundTrip(AscendBackend(), GetParam());
}

TEST_P(AscendCollectivesTest, MoeReceiveBufferTooSmallFailsOnEveryRankBeforeAnythingIsWritten) {
  testutil::RunMoeTooSmall(AscendBackend(), GetParam());
}

TEST_P(AscendCollectivesTest, MoeBadSplitsOfOneRankFailOnEveryRank) {
  testutil::RunMoeBadCalls(AscendBackend(), GetParam());
}

TEST_P(AscendCollectivesTest, MoeRanksThatDisagreeAboutTheCallAllRaiseAMismatchBeforeAnythingIsWritten) {
  testutil::RunMoeMismatch(AscendBackend(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Ranks, AscendCollectivesTest, ::testing::Values(2, 3, 4, 8, 16));

// MoE on ordinary NPU tensors (every rank's, or some ranks' beside symmetric ones): every byte moves on the
// device (the fakes refuse host memory where CANN does), compared with a reference computed in the test.
class AscendMoeTest : public AscendCollectivesTest {};

TEST_P(AscendMoeTest, OrdinaryInputsDispatchAndCombineAgainstTheReference) {
  testutil::RunMoeOrdinaryInputs(AscendBackend(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Ranks, AscendMoeTest, ::testing::Values(2, 3, 4, 8));

// Deferred checks find a mismatch after the call ran: every member raises it at its next call, naming both calls.
TEST(AscendDeferredChecksTest, AMismatchIsRaisedByEveryMembersNextCall) {
  fakes::FakeCann::Reset();
  const testutil::CollectiveBackend backend = AscendBackend();
  testutil::RunOnRootTeam(backend, 2, [&](int rank, Runtime& runtime, std::uint64_t t) {
    testutil::DeviceFloats tensor(backend, runtime, 8, false);
    tensor.Set(std::vector<float>(8, 1.0f));
    ASSERT_TRUE(testutil::IsOk(runtime.AllReduce(t, tensor.data(), rank == 1 ? 16 : 32, DataType::kFloat32,
                                                 ReduceOp::kSum, kDefaultStream, nullptr)));
    const Status next = runtime.TeamBarrier(t, kDefaultStream);
    EXPECT_TRUE(testutil::HasError(next, StatusCode::kMismatch, "ranks disagree on a collective (count)"))
        << next.ToString();
    EXPECT_TRUE(testutil::Contains(next.message(), "found after the call ran on the stream")) << next.message();
  });
  fakes::FakeCann::Reset();
}

// The other two places a deferred verdict reaches a member: a synchronize of the stream through this library raises
// it, and the check debug_state() makes records it as the latest failure, which the team's next call then raises.
TEST(AscendDeferredChecksTest, AMismatchIsRaisedBySynchronizeAndRecordedByTheDebugStateCheck) {
  fakes::FakeCann::Reset();
  const testutil::CollectiveBackend backend = AscendBackend();
  testutil::RunOnRootTeam(backend, 2, [&](int rank, Runtime& runtime, std::uint64_t t) {
    testutil::DeviceFloats tensor(backend, runtime, 8, false);
    tensor.Set(std::vector<float>(8, 1.0f));
    auto stream = runtime.CreateStream();
    ASSERT_TRUE(stream.ok());
    ASSERT_TRUE(testutil::IsOk(runtime.AllReduce(t, tensor.data(), rank == 1 ? 16 : 32, DataType::kFloat32,
                                                 ReduceOp::kSum, stream.value(), nullptr)));
    const Status synced = runtime.SynchronizeStream(stream.value());
    EXPECT_TRUE(testutil::HasError(synced, StatusCode::kMismatch, "ranks disagree on a collective (count)"))
        << synced.ToString();
    EXPECT_TRUE(testutil::Contains(synced.message(), "found after the call ran on the stream")) << synced.message();
    ASSERT_TRUE(testutil::IsOk(runtime.DestroyStream(stream.value())));
  });
  testutil::RunOnRootTeam(backend, 2, [&](int rank, Runtime& runtime, std::uint64_t t) {
    testutil::DeviceFloats tensor(backend, runtime, 8, false);
    tensor.Set(std::vector<float>(8, 1.0f));
    ASSERT_TRUE(testutil::IsOk(runtime.AllReduce(t, tensor.data(), rank == 1 ? 16 : 32, DataType::kFloat32,
                                                 ReduceOp::kSum, kDefaultStream, nullptr)));
    const Status checked = runtime.CheckDeferred();   // what debug_state() runs before it takes the snapshot
    EXPECT_TRUE(testutil::HasError(checked, StatusCode::kMismatch, "ranks disagree on a collective (count)"))
        << checked.ToString();
    EXPECT_TRUE(testutil::Contains(runtime.Snapshot().latest_failure, "ranks disagree on a collective (count)"))
        << runtime.Snapshot().latest_failure;
    const Status next = runtime.TeamBarrier(t, kDefaultStream);
    EXPECT_TRUE(testutil::HasError(next, StatusCode::kMismatch, "ranks disagree on a collective (count)"))
        << next.ToString();
  });
  fakes::FakeCann::Reset();
}

// The chip's signals are int32, compared for equality (SignalValue of counters that only grow): a team whose counters
// start just below the wrap runs 10,000 syncs and send/recv pieces across it on the fakes, each on the stream.
TEST(AscendSignalWrapTest, TenThousandSyncsAndSendsAcrossTheSignalWrap) {
  fakes::FakeCann::Reset();
  const testutil::CollectiveBackend backend = AscendBackend();
  testutil::RunRanks(2, [&](int rank, Bootstrap& bootstrap) {
    backend.enter_rank(rank);
    Runtime runtime;
    ASSERT_TRUE(testutil::IsOk(runtime.Init(backend.config(), backend.make_device(), bootstrap)));
    runtime.SetFirstTeamCounterForTesting(static_cast<std::uint64_t>(kSignalPeriod) - 5000);
    auto team = runtime.CreateTeam(testutil::AllPes(2), bootstrap);
    ASSERT_TRUE(team.ok()) << team.status().ToString();
    const std::uint64_t t = team.value();
    void* value = backend.alloc_local(8);
    void* message = backend.alloc_local(8);
    for (int i = 0; i < 10000; ++i) {
      std::int64_t mine = i + rank;
      backend.write(value, &mine, 8);
      ASSERT_TRUE(testutil::IsOk(
          runtime.AllReduce(t, value, 8, DataType::kInt64, ReduceOp::kSum, kDefaultStream, nullptr))) << i;
      std::int64_t got = 0;
      backend.read(&got, value, 8);
      ASSERT_EQ(got, 2 * i + 1) << i;
      std::int64_t sent = 3 * i;
      if (rank == 0) {
        backend.write(message, &sent, 8);
        ASSERT_TRUE(testutil::IsOk(runtime.Send(t, message, 8, testutil::Int64(), 1, kDefaultStream, nullptr))) << i;
      } else {
        ASSERT_TRUE(testutil::IsOk(runtime.Recv(t, message, 8, testutil::Int64(), 0, kDefaultStream, nullptr))) << i;
        backend.read(&got, message, 8);
        ASSERT_EQ(got, sent) << i;
      }
    }
    backend.free_local(value);
    backend.free_local(message);
    EXPECT_TRUE(testutil::IsOk(runtime.ReleaseTeam(t)));
    EXPECT_TRUE(testutil::IsOk(runtime.Shutdown(bootstrap)));
  });
  fakes::FakeCann::Reset();
}

// Runs `body(backend, world, rank, runtime, team, stream)` on every rank of a root team of 2, 4 and 8 ranks on the
// fakes, each rank on an explicit stream of its own.
template <typename Body>
void RunOnStreamsOfTwoFourAndEightRanks(Body&& body) {
  for (int world : {2, 4, 8}) {
    fakes::FakeCann::Reset();
    const testutil::CollectiveBackend backend = AscendBackend();
    testutil::RunOnRootTeam(backend, world, [&](int rank, Runtime& runtime, std::uint64_t t) {
      auto stream = runtime.CreateStream();
      ASSERT_TRUE(stream.ok());
      body(backend, world, rank, runtime, t, stream.value());
      ASSERT_TRUE(testutil::IsOk(runtime.DestroyStream(stream.value())));
    });
  }
  fakes::FakeCann::Reset();
}

// A MoE dispatch reads its split table back to the host once and agrees on every member's call in one sync (its
// rows staged through the team's staging: Agree synchronizes the stream at its sync and after pulling the rows), so
// a warm call synchronizes its stream three times whatever the experts and ranks (sharing the rows through the count
// row, 2n + 1 values per sync, took 9 at 2 ranks and 8 experts, 28 at 32 experts: one per sync). Ordinary inputs
// stage through the team's staging on the stream: no synchronization, blocking copy or allocation more than
// symmetric ones take.
TEST(AscendCostTest, MoeAgreesOnEveryMembersCallInOneSyncWhateverTheExpertsAndRanks) {
  RunOnStreamsOfTwoFourAndEightRanks([](const testutil::CollectiveBackend& backend, int world, int rank,
                                        Runtime& runtime, std::uint64_t t, StreamHandle s) {
    std::map<int, fakes::FakeCounters> symmetric_cost;   // by experts
    for (bool symmetric : {true, false}) {
      for (int experts : {1, 8, 32}) {
        SCOPED_TRACE("ranks=" + std::to_string(world) + " experts=" + std::to_string(experts) +
                     " symmetric=" + std::to_string(symmetric));
        const std::size_t nsplits = static_cast<std::size_t>(world) * static_cast<std::size_t>(experts);
        // One row to every expert of every rank: each rank receives nsplits rows.
        testutil::DeviceFloats input(backend, runtime, nsplits * testutil::moe::kRowFloats, symmetric);
        testutil::DeviceFloats output(backend, runtime, nsplits * testutil::moe::kRowFloats, symmetric);
        const testutil::DeviceInts in_splits(backend, std::vector<std::int64_t>(nsplits, 1));
        const testutil::DeviceInts out_table(backend, std::vector<std::int64_t>(2 * nsplits, -1));
        const MoeExchangeArgs x = testutil::moe::Args("moe_dispatch", t, MoeDirection::kDispatch, experts, input,
                                                      output, in_splits, nullptr, out_table, nsplits);
        ASSERT_TRUE(testutil::IsOk(runtime.MoeExchange(x, s, nullptr)));   // warm
        ASSERT_TRUE(testutil::IsOk(runtime.SynchronizeStream(s)));
        fakes::FakeCann::ResetCounters();
        ASSERT_TRUE(testutil::IsOk(runtime.MoeExchange(x, s, nullptr)));
        const fakes::FakeCounters cost = fakes::FakeCann::Counters();
        EXPECT_EQ(cost.stream_synchronizations, 3u);
        EXPECT_EQ(cost.device_mallocs, 0u);
        if (symmetric) symmetric_cost[experts] = cost;
        EXPECT_EQ(cost.blocking_copies, symmetric_cost[experts].blocking_copies);
        ASSERT_TRUE(testutil::IsOk(runtime.SynchronizeStream(s)));
        const std::vector<std::int64_t> out = out_table.Get();
        EXPECT_EQ(out, [&] {
          std::vector<std::int64_t> expected(2 * nsplits, 1);
          for (std::size_t i = 0; i < nsplits; ++i) expected[nsplits + i] = static_cast<std::int64_t>(i);
          return expected;
        }());
        if (rank == 0) {
          std::printf("[ cost ] ranks=%d moe_dispatch experts=%-3d %s stream_synchronizations=%zu device_tasks=%zu\n",
                      world, experts, symmetric ? "symmetric" : "ordinary ", cost.stream_synchronizations,
                      cost.device_tasks);
        }
      }
    }
  });
}

// What each collective costs on the NPU's stream in the default (deferred) mode, warm: the host never waits for the
// stream (no synchronization, no blocking copy) and allocates nothing; the device tasks per call are printed (the
// table in docs/engine.md). Values are checked once the stream is synchronized.
TEST(AscendCostTest, NoCollectiveSynchronizesCopiesBlockingOrAllocates) {
  RunOnStreamsOfTwoFourAndEightRanks([](const testutil::CollectiveBackend& backend, int world, int rank,
                                        Runtime& runtime, std::uint64_t t, StreamHandle s) {
    const auto n = static_cast<std::size_t>(world);
    const std::size_t small = 16;      // 64 B
    const std::size_t large = 40000;   // 160 KB: past the one-step size, staged in pieces or copy-free
    testutil::DeviceFloats ordinary(backend, runtime, large * n, false);
    testutil::DeviceFloats gathered(backend, runtime, large * n, false);
    testutil::DeviceFloats symmetric(backend, runtime, large * n, true);
    testutil::DeviceFloats message(backend, runtime, small, false);
    std::vector<float> ones(large * n, 1.0f);
    ordinary.Set(ones);
    symmetric.Set(ones);
    const std::vector<std::pair<std::string, std::function<Status()>>> calls = {
        {"barrier", [&] { return runtime.TeamBarrier(t, s); }},
        {"all_reduce 64 B", [&] {
           return runtime.AllReduce(t, ordinary.data(), small * 4, DataType::kFloat32, ReduceOp::kSum, s, nullptr);
         }},
        {"all_reduce 160 KB symmetric", [&] {
           return runtime.AllReduce(t, symmetric.data(), large * 4, DataType::kFloat32, ReduceOp::kSum, s, nullptr);
         }},
        {"all_gather 64 B", [&] {
           return runtime.AllGather(t, gathered.data(), small * 4 * n, ordinary.data(), small * 4, testutil::Float32(), s,
                                    nullptr);
         }},
        {"reduce_scatter 64 B", [&] {
           return runtime.ReduceScatter(t, gathered.data(), small * 4, ordinary.data(), small * 4 * n,
                                        DataType::kFloat32, ReduceOp::kSum, s, nullptr);
         }},
        {"all_to_all 64 B", [&] {
           std::vector<std::pair<const void*, std::size_t>> sends;
           for (std::size_t j = 0; j < n; ++j) sends.emplace_back(static_cast<char*>(ordinary.data()) + j * 64, 64);
           return runtime.AllToAll(t, sends, gathered.data(), 64 * n, std::vector<std::uint64_t>(n, 16),
                                   testutil::Float32(), s, nullptr);
         }},
        {"send/recv 64 B", [&] {
           const int next = (rank + 1) % world;
           const int previous = (rank + world - 1) % world;
           HP_RETURN_IF_ERROR(runtime.Send(t, message.data(), small * 4, testutil::Float32(), next, s, nullptr));
           return runtime.Recv(t, message.data(), small * 4, testutil::Float32(), previous, s, nullptr);
         }},
    };
    for (const auto& [name, call] : calls) {
      SCOPED_TRACE(name);
      ASSERT_TRUE(testutil::IsOk(call()));   // warm: workspaces, page-locked buffers, events
      ASSERT_TRUE(testutil::IsOk(runtime.SynchronizeStream(s)));
      fakes::FakeCann::ResetCounters();
      ASSERT_TRUE(testutil::IsOk(call()));
      const fakes::FakeCounters cost = fakes::FakeCann::Counters();
      EXPECT_EQ(cost.stream_synchronizations, 0u);
      EXPECT_EQ(cost.blocking_copies, 0u);
      EXPECT_EQ(cost.device_mallocs, 0u);
      if (rank == 0) std::printf("[ cost ] ranks=%d %-28s device_tasks=%zu\n", world, name.c_str(), cost.device_tasks);
      ASSERT_TRUE(testutil::IsOk(runtime.SynchronizeStream(s)));
    }
  });
}

}  // namespace
}  // namespace hp::shmem
