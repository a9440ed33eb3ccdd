// The collective engine on the host device: every collective, mismatches, sub-teams, churn, timeouts and retries.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "collective_cases.h"
#include "host_forwarding_device.h"
#include "moe_cases.h"
#include "runtime/device_factory.h"
#include "runtime/host/host_device.h"
#include "runtime/logging.h"
#include "runtime/runtime.h"
#include "test_support.h"
#include "thread_bootstrap.h"

namespace hp::shmem {
namespace {

using testutil::AllPes;
using testutil::Contains;
using testutil::HasError;
using testutil::IsOk;
using testutil::kMiB;
using testutil::DeviceFloats;
using testutil::Float32;
using testutil::RunRanks;
using testutil::SplitBootstrap;

Config HostConfig(double timeout_sec = 10.0) {
  Config config;
  config.heap_size = 8 * kMiB;
  config.timeout_sec = timeout_sec;
  config.log_level = LogLevel::kError;
  return config;
}

testutil::CollectiveBackend HostBackend(double timeout_sec = 10.0,
                                        host::PeerMemory peer_memory = host::PeerMemory::kCrossMemoryAttach) {
  testutil::CollectiveBackend backend;
  backend.make_device = [peer_memory] { return std::make_unique<host::HostDevice>(peer_memory); };
  backend.config = [timeout_sec] { return HostConfig(timeout_sec); };
  backend.alloc_local = [](std::size_t bytes) { return std::malloc(bytes); };
  backend.free_local = [](void* p) { std::free(p); };
  backend.write = [](void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); };
  backend.read = [](void* dst, const void* src, std::size_t n) { std::memcpy(dst, src, n); };
  return backend;
}

// Ranks, and whether the device reaches peers' memory: ordinary tensors move through it or stage through the heap.
class HostCollectivesTest : public ::testing::TestWithParam<std::tuple<int, host::PeerMemory>> {
 protected:
  int world() const { return std::get<0>(GetParam()); }
  testutil::CollectiveBackend Backend() const { return HostBackend(10.0, std::get<1>(GetParam())); }
};

TEST_P(HostCollectivesTest, EveryCollectiveOnEveryPath) { testutil::RunEveryCollective(Backend(), world()); }

TEST_P(HostCollectivesTest, LowPrecisionInEveryWireFormat) {
  testutil::RunLowPrecision(Backend(), world(),
                            {ops::LowFormat::kFloat16, ops::LowFormat::kBFloat16, ops::LowFormat::kFloat8E4M3Fn,
                             ops::LowFormat::kFloat8E5M2});
}

TEST_P(HostCollectivesTest, AllToAllOnEveryPath) { testutil::RunAllToAllPaths(Backend(), world()); }

INSTANTIATE_TEST_SUITE_P(Ranks, HostCollectivesTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(host::PeerMemory::kCrossMemoryAttach,
                                                              host::PeerMemory::kThroughHeap)));

// The bytes a rank's device moved, by kind: a local Copy, a Put or Get with this rank's own pe (through its staging),
// or with a peer's. Per thread: each thread is one rank, and the default stream runs every call on it.
struct MovedBytes {
  std::size_t copied = 0;
  std::size_t put_self = 0;
  std::size_t got_self = 0;
  std::size_t put_peer = 0;
  std::size_t got_peer = 0;
  std::size_t got_peer_memory = 0;       // GetPeerMemory from a peer's memory outside the heap
  std::size_t reduced_peer_memory = 0;   // ReducePeerMemory: the bytes of every source
};
thread_local MovedBytes moved;

class CountingDevice final : public testutil::HostForwardingDevice {
 public:
  explicit CountingDevice(host::PeerMemory peer_memory) : HostForwardingDevice(peer_memory) {}
  Status GetPeerMemory(void* dst, std::uint64_t address, std::size_t bytes, int pe, StreamHandle stream,
                       KeepAlive keep) override {
    moved.got_peer_memory += bytes;
    return HostForwardingDevice::GetPeerMemory(dst, address, bytes, pe, stream, std::move(keep));
  }
  Status ReducePeerMemory(void* dst, const std::vector<std::uint64_t>& addresses, const std::vector<int>& pes,
                          std::size_t count, DataType dtype, ReduceOp op, StreamHandle stream, KeepAlive keep) override {
    moved.reduced_peer_memory += count * DataTypeSize(dtype) * addresses.size();
    return HostForwardingDevice::ReducePeerMemory(dst, addresses, pes, count, dtype, op, stream, std::move(keep));
  }
  Status Put(void* dst, const void* src, std::size_t bytes, int pe, StreamHandle stream, KeepAlive keep) override {
    (pe == rank() ? moved.put_self : moved.put_peer) += bytes;
    return HostForwardingDevice::Put(dst, src, bytes, pe, stream, std::move(keep));
  }
  Status Get(void* dst, const void* src, std::size_t bytes, int pe, StreamHandle stream, KeepAlive keep) override {
    (pe == rank() ? moved.got_self : moved.got_peer) += bytes;
    return HostForwardingDevice::Get(dst, src, bytes, pe, stream, std::move(keep));
  }
  Status Copy(void* dst, const void* src, std::size_t bytes, StreamHandle stream, KeepAlive keep) override {
    moved.copied += bytes;
    return HostForwardingDevice::Copy(dst, src, bytes, stream, std::move(keep));
  }
};

// all_to_all copies this rank's own part once, straight into place, and a peer's part twice through the receiver's
// staging (one step and staged); in place, each rank of a pair moves half of the two blocks: its half of its own
// block into its staging, the peer's half into place, its held half into the peer's block.
TEST(HostCollectivesCopiesTest, AllToAllCopiesTheOwnPartOnceAndPeersPartsAtMostTwice) {
  testutil::CollectiveBackend backend = HostBackend();
  backend.make_device = [] { return std::make_unique<CountingDevice>(host::PeerMemory::kThroughHeap); };
  testutil::RunOnRootTeam(backend, 2, [&](int rank, Runtime& runtime, std::uint64_t t) {
    for (std::size_t count : {std::size_t{3000}, std::size_t{70000}}) {   // 12 KB parts (one step), 280 KB (staged)
      for (bool in_place : {false, true}) {
        SCOPED_TRACE("count=" + std::to_string(count) + " in_place=" + std::to_string(in_place));
        const std::size_t part = count * 4;
        DeviceFloats receive(backend, runtime, 2 * count, in_place);
        DeviceFloats separate(backend, runtime, 2 * count, false);
        const DeviceFloats& sending = in_place ? receive : separate;
        std::vector<float> values(2 * count);
        for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(rank * 1000 + static_cast<int>(i % 997));
        sending.Set(values);
        const std::vector<std::pair<const void*, std::size_t>> sends = {{sending.at(0), part}, {sending.at(count), part}};
        moved = MovedBytes{};
        ASSERT_TRUE(IsOk(runtime.AllToAll(t, sends, receive.data(), receive.bytes(), {count, count}, Float32(),
                                          kDefaultStream, nullptr)));
        const MovedBytes call = moved;
        std::vector<float> expected(2 * count);
        for (std::size_t i = 0; i < count; ++i) {
          expected[static_cast<std::size_t>(rank) * count + i] = values[static_cast<std::size_t>(rank) * count + i];
          const std::size_t theirs = static_cast<std::size_t>(rank) * count + i;   // the peer's part for this rank
          expected[static_cast<std::size_t>(1 - rank) * count + i] = static_cast<float>((1 - rank) * 1000 + static_cast<int>(theirs % 997));
        }
        EXPECT_EQ(receive.Get(), expected);
        EXPECT_EQ(call.put_self, 0u);   // nothing of this rank's staged through its own staging
        if (in_place && count == 70000) {   // the pairwise swap of the symmetric buffer's blocks
          EXPECT_EQ(call.copied, part / 2);
          EXPECT_EQ(call.got_self, 0u);
          EXPECT_EQ(call.got_peer, part / 2);
          EXPECT_GE(call.put_peer, part / 2);
        } else {
          // The own part into place (in place it stays where it is), and the peer's part out of this rank's staging:
          // local copies, never a get from this rank itself.
          EXPECT_EQ(call.copied, (in_place ? 0u : part) + part);
          EXPECT_EQ(call.got_self, 0u);
          EXPECT_EQ(call.got_peer, 0u);
          EXPECT_GE(call.put_peer, part);                  // this rank's part for the peer into its staging
        }
        EXPECT_LT(call.put_peer, (in_place && count == 70000 ? part / 2 : part) + 4096);   // besides: the sync's rows
        ASSERT_TRUE(IsOk(runtime.TeamBarrier(t, kDefaultStream)));
      }
    }
  });
}

// Where the device reaches peers' memory, the collectives on ordinary buffers above the one-step size move each byte
// once, straight out of the peers' buffers: nothing goes through staging (the only heap traffic is the syncs' rows).
TEST(HostCollectivesCopiesTest, OrdinaryBuffersMoveEachByteOnceThroughPeersMemory) {
  testutil::CollectiveBackend backend = HostBackend();
  backend.make_device = [] { return std::make_unique<CountingDevice>(host::PeerMemory::kCrossMemoryAttach); };
  const int world = 3;
  testutil::RunOnRootTeam(backend, world, [&](int rank, Runtime& runtime, std::uint64_t t) {
    const std::size_t count = 90000;   // 360 KB per rank: above the one-step size
    const std::size_t part = count * 4;
    const auto n = static_cast<std::size_t>(world);
    const auto me = static_cast<std::size_t>(rank);
    auto value = [](std::size_t r, std::size_t i) { return static_cast<float>(r * 10 + i % 7); };
    auto this_ranks_values = [&](std::size_t size) {
      std::vector<float> values(size);
      for (std::size_t i = 0; i < size; ++i) values[i] = value(me, i);
      return values;
    };
    auto expect_summed = [&](const std::vector<float>& got) {
      for (std::size_t i : {std::size_t{0}, count / 2, count - 1}) {
        EXPECT_EQ(got[i], value(0, i) + value(1, i) + value(2, i)) << "i=" << i;
      }
    };
    auto nothing_staged = [&](const MovedBytes& call) {
      EXPECT_EQ(call.put_self, 0u);
      EXPECT_EQ(call.got_self, 0u);
      EXPECT_EQ(call.got_peer, 0u);
      EXPECT_LT(call.put_peer, 4096u);
    };
    {   // all_gather: the peers' inputs into place, this rank's copied once
      SCOPED_TRACE("all_gather");
      DeviceFloats input(backend, runtime, count, false);
      DeviceFloats output(backend, runtime, n * count, false);
      const std::vector<float> values = this_ranks_values(count);
      input.Set(values);
      moved = MovedBytes{};
      ASSERT_TRUE(IsOk(runtime.AllGather(t, output.data(), output.bytes(), input.data(), input.bytes(), Float32(),
                                         kDefaultStream, nullptr)));
      const MovedBytes call = moved;
      const std::vector<float> got = output.Get();
      for (std::size_t r = 0; r < n; ++r) EXPECT_EQ(got[r * count + count - 1], value(r, count - 1));
      nothing_staged(call);
      EXPECT_EQ(call.got_peer_memory, (n - 1) * part);
      EXPECT_EQ(call.copied, part);
    }
    {   // all_reduce: this rank's part reduced out of every rank's tensor, the others' reduced parts pulled
      SCOPED_TRACE("all_reduce");
      DeviceFloats tensor(backend, runtime, count, false);
      const std::vector<float> values = this_ranks_values(count);
      tensor.Set(values);
      moved = MovedBytes{};
      ASSERT_TRUE(IsOk(runtime.AllReduce(t, tensor.data(), tensor.bytes(), DataType::kFloat32, ReduceOp::kSum,
                                         kDefaultStream, nullptr)));
      const MovedBytes call = moved;
      expect_summed(tensor.Get());
      nothing_staged(call);
      EXPECT_EQ(call.reduced_peer_memory, part);             // a third of the tensor from each of 3 ranks
      EXPECT_EQ(call.got_peer_memory, part - part / n);       // the two other thirds
    }
    {   // all_reduce out of place: the same, reduced out of every rank's input into the outputs, the inputs untouched
      SCOPED_TRACE("all_reduce out of place");
      DeviceFloats input(backend, runtime, count, false);
      DeviceFloats output(backend, runtime, count, false);
      const std::vector<float> values = this_ranks_values(count);
      input.Set(values);
      moved = MovedBytes{};
      ASSERT_TRUE(IsOk(runtime.AllReduce(t, output.data(), output.bytes(), DataType::kFloat32, ReduceOp::kSum,
                                         kDefaultStream, nullptr, std::nullopt, input.data())));
      const MovedBytes call = moved;
      expect_summed(output.Get());
      EXPECT_EQ(input.Get(), values);
      nothing_staged(call);
      EXPECT_EQ(call.copied, 0u);   // no copy of the input into the output first
      EXPECT_EQ(call.reduced_peer_memory, part);
      EXPECT_EQ(call.got_peer_memory, part - part / n);
      // An input that overlaps the output (other than being it) is refused before anything moves.
      EXPECT_TRUE(HasError(runtime.AllReduce(t, output.data(), output.bytes() - 4, DataType::kFloat32, ReduceOp::kSum,
                                             kDefaultStream, nullptr, std::nullopt, output.at(1)),
                           StatusCode::kInvalidArgument, "`input` must be `tensor` itself or not overlap it, but got an "
                                                         "overlap at byte 4"));
    }
    {   // reduce_scatter: this rank's part reduced out of every rank's input
      SCOPED_TRACE("reduce_scatter");
      DeviceFloats input(backend, runtime, n * count, false);
      DeviceFloats output(backend, runtime, count, false);
      const std::vector<float> values = this_ranks_values(n * count);
      input.Set(values);
      moved = MovedBytes{};
      ASSERT_TRUE(IsOk(runtime.ReduceScatter(t, output.data(), output.bytes(), input.data(), input.bytes(),
                                             DataType::kFloat32, ReduceOp::kMax, kDefaultStream, nullptr)));
      const MovedBytes call = moved;
      EXPECT_EQ(output.Get()[count - 1], value(2, me * count + count - 1));
      nothing_staged(call);
      EXPECT_EQ(call.reduced_peer_memory, n * part);
      EXPECT_EQ(call.got_peer_memory, 0u);
    }
    {   // all_to_all: each peer's part pulled out of its send, this rank's copied once
      SCOPED_TRACE("all_to_all");
      DeviceFloats sending(backend, runtime, n * count, false);
      DeviceFloats receive(backend, runtime, n * count, false);
      const std::vector<float> values = this_ranks_values(n * count);
      sending.Set(values);
      std::vector<std::pair<const void*, std::size_t>> sends;
      for (std::size_t j = 0; j < n; ++j) sends.emplace_back(sending.at(j * count), part);
      moved = MovedBytes{};
      ASSERT_TRUE(IsOk(runtime.AllToAll(t, sends, receive.data(), receive.bytes(), std::vector<std::uint64_t>(n, count),
                                        Float32(), kDefaultStream, nullptr)));
      const MovedBytes call = moved;
      const std::vector<float> got = receive.Get();
      for (std::size_t r = 0; r < n; ++r) EXPECT_EQ(got[r * count + 5], value(r, me * count + 5)) << "r=" << r;
      nothing_staged(call);
      EXPECT_EQ(call.got_peer_memory, (n - 1) * part);
      EXPECT_EQ(call.copied, part);
    }
  });
}

class HostMismatchTest : public ::testing::TestWithParam<int> {};

TEST_P(HostMismatchTest, MismatchesFailOnEveryRankAndTheTeamStaysInStep) {
  testutil::RunMismatches(HostBackend(), GetParam());
}

TEST_P(HostMismatchTest, OneStepAgainstStagedFailsWithNothingWritten) {
  testutil::RunOneStepAgainstStaged(HostBackend(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Ranks, HostMismatchTest, ::testing::Values(2, 3, 4));

TEST(TeamTest, SubTeamsRunSideBySideAndSlotsAreReused) {
  RunRanks(4, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(HostConfig(), std::make_unique<host::HostDevice>(), bootstrap)));
    // The root team comes first: a sub-team before it is refused.
    SplitBootstrap early(bootstrap, rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3});
    EXPECT_TRUE(HasError(runtime.CreateTeam(rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}, early).status(),
                         StatusCode::kStateError, "the root team must be created first: op=team_create group_size=2"));
    auto root = runtime.CreateTeam(AllPes(4), bootstrap);
    ASSERT_TRUE(root.ok()) << root.status().ToString();
    // 300 rounds of two disjoint pairs, then the pairs the other way: far more teams than slots over time.
    for (int round = 0; round < 300; ++round) {
      const bool halves = round % 2 == 0;
      std::vector<int> members = halves ? (rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3})
                                        : (rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3});
      SplitBootstrap split(bootstrap, members);
      auto team = runtime.CreateTeam(members, split);
      ASSERT_TRUE(team.ok()) << "round " << round << ": " << team.status().ToString();
      float value = static_cast<float>(rank + round);
      ASSERT_TRUE(IsOk(runtime.AllReduce(team.value(), &value, 4, DataType::kFloat32, ReduceOp::kSum, kDefaultStream,
                                         nullptr)));
      EXPECT_EQ(value, static_cast<float>(members[0] + members[1] + 2 * round));
      ASSERT_TRUE(IsOk(runtime.ReleaseTeam(team.value())));
      EXPECT_TRUE(HasError(runtime.TeamBarrier(team.value(), kDefaultStream), StatusCode::kStateError,
                           "team is not live: team_id=" + std::to_string(team.value())));
    }
    EXPECT_EQ(runtime.Snapshot().live_teams, 1u);
    EXPECT_TRUE(IsOk(runtime.ReleaseTeam(root.value())));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(TeamTest, SixtyFourLiveTeamsThenAClearRefusal) {
  RunRanks(2, [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(HostConfig(), std::make_unique<host::HostDevice>(), bootstrap)));
    auto root = runtime.CreateTeam(AllPes(2), bootstrap);
    ASSERT_TRUE(root.ok());
    std::vector<std::uint64_t> teams;
    for (int i = 0; i < kSubTeamSlots; ++i) {
      auto team = runtime.CreateTeam(AllPes(2), bootstrap);
      ASSERT_TRUE(team.ok()) << i << ": " << team.status().ToString();
      teams.push_back(team.value());
    }
    EXPECT_TRUE(HasError(runtime.CreateTeam(AllPes(2), bootstrap).status(), StatusCode::kStateError,
                         "every team slot is taken on some member: slots=64 live_teams_here=65"));
    // Every one of them works, each in its own slot.
    for (std::uint64_t team : teams) {
      std::int64_t value = 1;
      ASSERT_TRUE(IsOk(runtime.AllReduce(team, &value, 8, DataType::kInt64, ReduceOp::kSum, kDefaultStream, nullptr)));
      EXPECT_EQ(value, 2);
    }
    for (std::uint64_t team : teams) EXPECT_TRUE(IsOk(runtime.ReleaseTeam(team)));
    auto again = runtime.CreateTeam(AllPes(2), bootstrap);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

// The host device as a device that does not arbitrate: the engine defers its checks, as on the ascend device (its
// first syncs run on the stream, tables read back later; pull-only paths; a pairwise all_to_all), and every collective
// case runs through that mode here, fast.
class DeferringHostDevice final : public testutil::HostForwardingDevice {
 public:
  bool arbitrates() const override { return false; }
};

testutil::CollectiveBackend DeferringBackend(double timeout_sec = 10.0) {
  testutil::CollectiveBackend backend = HostBackend(timeout_sec);
  backend.make_device = [] { return std::make_unique<DeferringHostDevice>(); };
  return backend;
}

class DeferredCollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(DeferredCollectivesTest, EveryCollectiveOnEveryPath) { testutil::RunEveryCollective(DeferringBackend(), GetParam()); }

TEST_P(DeferredCollectivesTest, LowPrecisionInEveryWireFormat) {
  testutil::RunLowPrecision(DeferringBackend(), GetParam(),
                            {ops::LowFormat::kFloat16, ops::LowFormat::kBFloat16, ops::LowFormat::kFloat8E4M3Fn,
                             ops::LowFormat::kFloat8E5M2});
}

TEST_P(DeferredCollectivesTest, AllToAllOnEveryPath) { testutil::RunAllToAllPaths(DeferringBackend(), GetParam()); }

INSTANTIATE_TEST_SUITE_P(Ranks, DeferredCollectivesTest, ::testing::Values(2, 3, 4));

// With deferred checks a mismatch is found after the call ran: every member raises it at its next call on the team
// (or at a synchronize), naming both calls, and the team is then out of step on every member.
TEST(DeferredChecksTest, AMismatchIsRaisedByEveryMembersNextCallAndBreaksTheTeam) {
  RunRanks(3, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(HostConfig(), std::make_unique<DeferringHostDevice>(), bootstrap)));
    auto team = runtime.CreateTeam(AllPes(3), bootstrap);
    ASSERT_TRUE(team.ok());
    float values[8] = {};
    // Rank 2 reduces 4 floats, the others 8: every member's call runs, on wrong values in its own output only.
    ASSERT_TRUE(IsOk(runtime.AllReduce(team.value(), values, rank == 2 ? 16 : 32, DataType::kFloat32, ReduceOp::kSum,
                                       kDefaultStream, nullptr)));
    const Status next = runtime.TeamBarrier(team.value(), kDefaultStream);
    EXPECT_TRUE(HasError(next, StatusCode::kMismatch, "ranks disagree on a collective (count)")) << next.ToString();
    EXPECT_TRUE(Contains(next.message(), "found after the call ran on the stream")) << next.message();
    EXPECT_TRUE(HasError(runtime.TeamBarrier(team.value(), kDefaultStream), StatusCode::kStateError,
                         "team cannot run collectives any more"));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

// A refusal with deferred checks: the refusing rank raises at once; its peers' calls ran on the stream (on its stale
// staging, into their own outputs only) and they raise the refusal, naming it, at their next call. The members may have
// run different numbers of syncs since, so the team is then out of step on every member. Every member refusing alike
// (the same bad call everywhere) keeps the team in step.
TEST(DeferredChecksTest, ARefusalOfOneMemberIsRaisedByEveryMemberAndEndsTheTeam) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(HostConfig(), std::make_unique<DeferringHostDevice>(), bootstrap)));
    auto team = runtime.CreateTeam(AllPes(2), bootstrap);
    ASSERT_TRUE(team.ok());
    std::int32_t ints[2] = {rank, rank};
    // Both refuse alike: each raises at once, and the team runs on.
    EXPECT_TRUE(HasError(runtime.AllReduce(team.value(), ints, 8, DataType::kInt32, ReduceOp::kAvg, kDefaultStream,
                                           nullptr),
                         StatusCode::kInvalidArgument, "`op` must be sum, max or min for int32, but got avg"));
    ASSERT_TRUE(IsOk(runtime.AllReduce(team.value(), ints, 8, DataType::kInt32, ReduceOp::kSum, kDefaultStream, nullptr)));
    EXPECT_EQ(ints[0], 1);
    // Rank 1 alone refuses.
    const Status first = runtime.AllReduce(team.value(), ints, 8, DataType::kInt32,
                                           rank == 1 ? ReduceOp::kAvg : ReduceOp::kSum, kDefaultStream, nullptr);
    const Status next = runtime.TeamBarrier(team.value(), kDefaultStream);
    if (rank == 1) {
      EXPECT_TRUE(HasError(first, StatusCode::kInvalidArgument, "`op` must be sum, max or min for int32, but got avg "
                                                                "(refused by rank 1: op=all_reduce"))
          << first.ToString();
      EXPECT_TRUE(HasError(next, StatusCode::kStateError, "team is out of step")) << next.ToString();
    } else {
      EXPECT_TRUE(IsOk(first));
      EXPECT_TRUE(HasError(next, StatusCode::kInvalidArgument, "`op` must be sum, max or min for int32, but got avg "
                                                               "(refused by rank 1: op=all_reduce (call "))
          << next.ToString();
    }
    EXPECT_TRUE(HasError(runtime.TeamBarrier(team.value(), kDefaultStream), StatusCode::kStateError,
                         "team cannot run collectives any more"));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

// A message of another dtype: with deferred checks the receiver's recv takes what it expected and both ranks raise
// later (the receiver at its next call, the sender when it reuses the piece).
TEST(DeferredChecksTest, AMessageOfAnotherDtypeIsRaisedOnBothSides) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(HostConfig(), std::make_unique<DeferringHostDevice>(), bootstrap)));
    auto team = runtime.CreateTeam(AllPes(2), bootstrap);
    ASSERT_TRUE(team.ok());
    float data[4] = {1.5f, 0.0f, 0.0f, 0.0f};
    if (rank == 0) {
      ASSERT_TRUE(IsOk(runtime.Send(team.value(), data, 4, Float32(), 1, kDefaultStream, nullptr)));
      Status later = Status::Ok();
      for (int i = 0; i < 8 && later.ok(); ++i) later = runtime.Send(team.value(), data, 4, Float32(), 1, kDefaultStream, nullptr);
      EXPECT_TRUE(HasError(later, StatusCode::kTypeError, "a message this rank sent (float32 message of 4 bytes) must "
                                                          "match the receive buffer of rank 1, but that rank expected a "
                                                          "int32 message of 4 bytes"))
          << later.ToString();
    } else {
      std::int32_t wrong = -1;
      ASSERT_TRUE(IsOk(runtime.Recv(team.value(), &wrong, 4, testutil::Int32(), 0, kDefaultStream, nullptr)));
      const Status later = runtime.Recv(team.value(), data, 4, Float32(), 0, kDefaultStream, nullptr);
      EXPECT_TRUE(HasError(later, StatusCode::kTypeError, "`tensor` must be a receive buffer for the float32 message of "
                                                          "4 bytes rank 0 sent, but got int32 of 4 bytes"))
          << later.ToString();
      for (int i = 0; i < 7; ++i) (void)runtime.Recv(team.value(), data, 4, Float32(), 0, kDefaultStream, nullptr);
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

// A call that one member gives up (its first sync timed out while a peer was late) fails on every member, the late
// one included, which never reads what the member that gave up has taken back; then the team runs on. Ordinary
// tensors of 1,000 floats take the one-step path, of 1 Mi floats the peer-memory path (each rank reads the others'
// tensors in place), both checked by value.
class GivenUpCallTest : public ::testing::TestWithParam<std::tuple<int, std::size_t>> {};

TEST_P(GivenUpCallTest, FailsOnEveryMemberAndTheTeamRunsOn) {
  const int world = std::get<0>(GetParam());
  const std::size_t count = std::get<1>(GetParam());
  RunRanks(world, [&](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(HostConfig(0.3), std::make_unique<host::HostDevice>(), bootstrap)));
    auto team = runtime.CreateTeam(AllPes(world), bootstrap);
    ASSERT_TRUE(team.ok());
    const int late = world - 1;
    std::vector<float> values(count, 10.0f * static_cast<float>(rank + 1));
    auto all_reduce = [&] {
      return runtime.AllReduce(team.value(), values.data(), count * 4, DataType::kFloat32, ReduceOp::kSum,
                               kDefaultStream, nullptr);
    };
    if (rank != late) {
      const Status gave_up = all_reduce();
      EXPECT_TRUE(gave_up.code() == StatusCode::kTimeout || gave_up.code() == StatusCode::kStateError)
          << gave_up.ToString();
      if (gave_up.code() == StatusCode::kTimeout) {
        EXPECT_TRUE(Contains(gave_up.message(), "all_reduce timed out at its first sync: team_ranks=[")) << gave_up.message();
        EXPECT_TRUE(Contains(gave_up.message(), "missing_ranks=[" + std::to_string(late) + "]")) << gave_up.message();
        EXPECT_TRUE(Contains(gave_up.message(), "it fails on every member")) << gave_up.message();
      }
      std::fill(values.begin(), values.end(), 99.0f);   // the tensor is taken back and changed
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));   // the late rank arrives only now
    if (rank == late) {
      const Status refused = all_reduce();
      EXPECT_EQ(refused.code(), StatusCode::kStateError) << refused.ToString();
      EXPECT_TRUE(Contains(refused.message(), "all_reduce was given up by a member at its first sync")) << refused.message();
      EXPECT_TRUE(Contains(refused.message(), "(it timed out)")) << refused.message();
      EXPECT_EQ(values, std::vector<float>(count, 10.0f * static_cast<float>(rank + 1)));   // untouched
    }
    // The team runs on: the next calls pair up, numbered alike, with every member's new values.
    for (int call = 1; call <= 3; ++call) {
      std::fill(values.begin(), values.end(), static_cast<float>(call * (rank + 1)));
      ASSERT_TRUE(IsOk(all_reduce()));
      const float expected = static_cast<float>(call * world * (world + 1) / 2);
      EXPECT_EQ(values, std::vector<float>(count, expected));
    }
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

INSTANTIATE_TEST_SUITE_P(RanksAndSizes, GivenUpCallTest,
                         ::testing::Combine(::testing::Values(2, 4), ::testing::Values(std::size_t{1000},
                                                                                          std::size_t{1} << 20)));

// The one-step paths move their data with the first sync: all_gather stages it in the sender's half, all_to_all
// pushes it into the receiver's. A call given up there writes no output on any member; the calls after it (the
// other parity, then the same) deliver every part.
TEST(TeamTest, AGivenUpOneStepCallWritesNothingAndTheNextCallsDeliver) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(HostConfig(0.2), std::make_unique<host::HostDevice>(), bootstrap)));
    auto team = runtime.CreateTeam(AllPes(2), bootstrap);
    ASSERT_TRUE(team.ok());
    const float mine[2] = {static_cast<float>(rank + 1), static_cast<float>(10 * (rank + 1))};
    float gathered[4] = {};
    float received[4] = {};
    const std::vector<std::pair<const void*, std::size_t>> sends = {{mine, sizeof(mine)}, {mine, sizeof(mine)}};
    const std::vector<std::uint64_t> counts = {2, 2};
    auto all_gather = [&] {
      return runtime.AllGather(team.value(), gathered, sizeof(gathered), mine, sizeof(mine), testutil::Float32(),
                               kDefaultStream, nullptr);
    };
    auto all_to_all = [&] {
      return runtime.AllToAll(team.value(), sends, received, sizeof(received), counts, testutil::Float32(),
                              kDefaultStream, nullptr);
    };
    const std::vector<float> expected = {1.0f, 10.0f, 2.0f, 20.0f};
    for (int call = 0; call < 2; ++call) {
      SCOPED_TRACE(call == 0 ? "all_gather" : "all_to_all");
      if (rank == 0) {   // rank 1 is late: rank 0 gives the call up
        const Status late = call == 0 ? all_gather() : all_to_all();
        EXPECT_EQ(late.code(), StatusCode::kTimeout) << late.ToString();
        EXPECT_TRUE(Contains(late.message(), "missing_ranks=[1]")) << late.message();
      }
      ASSERT_TRUE(IsOk(bootstrap.Barrier()));
      if (rank == 1) {
        const Status refused = call == 0 ? all_gather() : all_to_all();
        EXPECT_TRUE(HasError(refused, StatusCode::kStateError, "was given up by a member")) << refused.ToString();
      }
      const float* output = call == 0 ? gathered : received;
      EXPECT_EQ(std::vector<float>(output, output + 4), std::vector<float>(4, 0.0f));
    }
    for (int again = 0; again < 3; ++again) {
      std::fill(gathered, gathered + 4, 0.0f);
      std::fill(received, received + 4, 0.0f);
      ASSERT_TRUE(IsOk(all_gather()));
      ASSERT_TRUE(IsOk(all_to_all()));
      EXPECT_EQ(std::vector<float>(gathered, gathered + 4), expected);
      EXPECT_EQ(std::vector<float>(received, received + 4), expected);
    }
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

// A gradient's collective never pairs with a forward one: the role is part of what the members agree on.
TEST(TeamTest, ABackwardCallNeverPairsWithAForwardOne) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(HostConfig(), std::make_unique<host::HostDevice>(), bootstrap)));
    auto team = runtime.CreateTeam(AllPes(2), bootstrap);
    ASSERT_TRUE(team.ok());
    float value = rank == 0 ? 100.0f : 2.0f;
    const Status mixed = runtime.AllReduce(team.value(), &value, 4, DataType::kFloat32, ReduceOp::kSum, kDefaultStream,
                                           nullptr, std::nullopt, nullptr,
                                           rank == 0 ? CallRole::kBackward : CallRole::kForward);
    EXPECT_TRUE(HasError(mixed, StatusCode::kMismatch, "ranks disagree on a collective (role)")) << mixed.ToString();
    EXPECT_TRUE(Contains(mixed.message(), "role=backward")) << mixed.message();
    EXPECT_EQ(value, rank == 0 ? 100.0f : 2.0f);
    ASSERT_TRUE(IsOk(runtime.AllReduce(team.value(), &value, 4, DataType::kFloat32, ReduceOp::kSum, kDefaultStream,
                                       nullptr, std::nullopt, nullptr, CallRole::kBackward)));
    EXPECT_EQ(value, 102.0f);
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

// A device whose next staging step fails once (the local copy into the staging area, or Encode), as a failed enqueue
// would.
class FailOnceDevice final : public testutil::HostForwardingDevice {
 public:
  Status Copy(void* dst, const void* src, std::size_t bytes, StreamHandle stream, KeepAlive keep) override {
    if (fail_next) {
      fail_next = false;
      return DeviceError("injected: the staging copy failed");
    }
    return HostForwardingDevice::Copy(dst, src, bytes, stream, std::move(keep));
  }
  Status Encode(ops::LowFormat format, DataType dtype, const void* src, std::size_t count, WireRun dst,
                StreamHandle stream, KeepAlive keep) override {
    if (fail_next) {
      fail_next = false;
      return DeviceError("injected: the encode failed");
    }
    return HostForwardingDevice::Encode(format, dtype, src, count, dst, stream, std::move(keep));
  }
  bool fail_next = false;
};

// A call that fails on one rank before its first sync (staging its data) is given up for every member at once (the
// peers fail now, not after their timeout, naming that rank and its reason); the team runs on.
TEST(TeamTest, AFailureBeforeTheFirstSyncFailsEveryMemberAtOnce) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    auto owned = std::make_unique<FailOnceDevice>();
    FailOnceDevice* device = owned.get();
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(HostConfig(30.0), std::move(owned), bootstrap)));
    auto team = runtime.CreateTeam(AllPes(2), bootstrap);
    ASSERT_TRUE(team.ok());
    for (bool low_precision : {false, true}) {
      SCOPED_TRACE(low_precision ? "low precision" : "full precision");
      float values[4] = {1.0f, 2.0f, 3.0f, 4.0f};
      auto call = [&] {
        return low_precision ? runtime.AllReduce(team.value(), values, sizeof(values), DataType::kFloat32,
                                                 ReduceOp::kSum, kDefaultStream, nullptr, ops::LowFormat::kBFloat16)
                             : runtime.AllReduce(team.value(), values, sizeof(values), DataType::kFloat32,
                                                 ReduceOp::kSum, kDefaultStream, nullptr);
      };
      device->fail_next = rank == 1;
      const Status first = call();
      if (rank == 1) {
        EXPECT_TRUE(HasError(first, StatusCode::kDeviceError, "all_reduce failed before its first sync")) << first.ToString();
      } else {
        EXPECT_TRUE(HasError(first, StatusCode::kStateError, "all_reduce was given up by a member at its first sync"))
            << first.ToString();
        EXPECT_TRUE(Contains(first.message(), "given up by rank 1 (it failed)")) << first.message();
        EXPECT_TRUE(Contains(first.message(), "injected:")) << first.message();   // rank 1's own words
      }
      ASSERT_TRUE(IsOk(call()));
      EXPECT_EQ(std::vector<float>(values, values + 4), (std::vector<float>{2.0f, 4.0f, 6.0f, 8.0f}));
      ASSERT_TRUE(IsOk(runtime.TeamBarrier(team.value(), kDefaultStream)));
    }
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

// A check that fails on one member only (its own addresses, sizes, ops) is refused collectively: every member fails
// the call with that member's error, naming it, and nothing is written; the next call pairs up.
class RefusalTest : public ::testing::TestWithParam<int> {};

TEST_P(RefusalTest, OneMembersBadArgumentFailsEveryMemberWithItsError) {
  const int world = GetParam();
  RunRanks(world, [&](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(HostConfig(), std::make_unique<host::HostDevice>(), bootstrap)));
    auto team = runtime.CreateTeam(AllPes(world), bootstrap);
    ASSERT_TRUE(team.ok());
    const int refuser = 1;
    std::vector<float> output(static_cast<std::size_t>(world) * 4, -1.0f);
    std::vector<float> input(4, static_cast<float>(rank));
    // The refuser's input lies inside another member's block of its output.
    const float* in = rank == refuser ? output.data() + ((rank + 1) % world) * 4 : input.data();
    const Status gathered = runtime.AllGather(team.value(), output.data(), output.size() * 4, in, 16,
                                              testutil::Float32(), kDefaultStream, nullptr);
    EXPECT_TRUE(HasError(gathered, StatusCode::kInvalidArgument,
                         "`input` must not overlap `output` except as this rank's own part"))
        << gathered.ToString();
    EXPECT_TRUE(Contains(gathered.message(), "(refused by rank 1: op=all_gather team_ranks=[")) << gathered.message();
    if (rank != refuser) {
      EXPECT_EQ(output, std::vector<float>(output.size(), -1.0f));
    }
    // avg of an integer tensor on the refuser only.
    std::int32_t ints[2] = {rank, rank};
    const Status reduced = runtime.AllReduce(team.value(), ints, 8, DataType::kInt32,
                                             rank == refuser ? ReduceOp::kAvg : ReduceOp::kSum, kDefaultStream, nullptr);
    EXPECT_TRUE(HasError(reduced, StatusCode::kInvalidArgument, "`op` must be sum, max or min for int32, but got avg"))
        << reduced.ToString();
    EXPECT_TRUE(Contains(reduced.message(), "refused by rank 1")) << reduced.message();
    EXPECT_EQ(ints[0], rank);
    ASSERT_TRUE(IsOk(runtime.AllReduce(team.value(), ints, 8, DataType::kInt32, ReduceOp::kSum, kDefaultStream, nullptr)));
    EXPECT_EQ(ints[0], world * (world - 1) / 2);
    // A refusal decided above the runtime (a freed tensor, a destroyed group) the same way.
    const Status above = rank == refuser
                             ? runtime.Refuse(team.value(), Collective::kAllReduce,
                                              StateError("tensor of a freed symmetric allocation: allocation_id=7"),
                                              kDefaultStream)
                             : runtime.AllReduce(team.value(), ints, 8, DataType::kInt32, ReduceOp::kSum,
                                                 kDefaultStream, nullptr);
    EXPECT_TRUE(HasError(above, StatusCode::kStateError, "tensor of a freed symmetric allocation: allocation_id=7 "
                                                         "(refused by rank 1: op=all_reduce"))
        << above.ToString();
    ASSERT_TRUE(IsOk(runtime.TeamBarrier(team.value(), kDefaultStream)));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, RefusalTest, ::testing::Values(2, 4));

// A member that gives up the team's next sync for a reason of its own (e.g. its node's peer died) makes the members
// waiting there fail at once with its words.
TEST(TeamTest, AMemberGivingUpTheNextSyncWakesTheOthersWithItsReason) {
  RunRanks(3, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(HostConfig(30.0), std::make_unique<host::HostDevice>(), bootstrap)));
    auto team = runtime.CreateTeam(AllPes(3), bootstrap);
    ASSERT_TRUE(team.ok());
    if (rank == 2) {
      const Status why = StateError("node 1 died: rank 5 did not answer the exchange across nodes");
      EXPECT_EQ(runtime.GiveUp(team.value(), why).message(), why.message());
    }
    const Status waited = rank == 2 ? Status::Ok() : runtime.TeamBarrier(team.value(), kDefaultStream);
    if (rank != 2) {
      EXPECT_TRUE(HasError(waited, StatusCode::kStateError, "barrier was given up by a member")) << waited.ToString();
      EXPECT_TRUE(Contains(waited.message(), "node 1 died: rank 5 did not answer")) << waited.message();
    }
    ASSERT_TRUE(IsOk(runtime.TeamBarrier(team.value(), kDefaultStream)));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(TeamTest, BadArgumentsAreRefused) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(HostConfig(), std::make_unique<host::HostDevice>(), bootstrap)));
    EXPECT_TRUE(HasError(runtime.CreateTeam({0, 0}, bootstrap).status(), StatusCode::kInvalidArgument,
                         "`pes` must be distinct, but got 0 at positions 0 and 1"));
    EXPECT_TRUE(HasError(runtime.CreateTeam({0, 2}, bootstrap).status(), StatusCode::kInvalidArgument,
                         "`pes[1]` must be in [0, 2), but got 2"));
    auto team = runtime.CreateTeam(AllPes(2), bootstrap);
    ASSERT_TRUE(team.ok());
    float data[4] = {};
    EXPECT_TRUE(HasError(runtime.AllGather(team.value(), data, 12, data, 4, testutil::Float32(), kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`output` must have group_size * input bytes (2 * 4 = 8), but got 12"));
    EXPECT_TRUE(HasError(runtime.AllReduce(team.value(), data, 8, DataType::kInt32, ReduceOp::kAvg, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`op` must be sum, max or min for int32, but got avg"));
    EXPECT_TRUE(HasError(runtime.Send(team.value(), data, 4, Float32(), rank, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`peer` must be another group rank in [0, 2) than this one"));
    EXPECT_TRUE(IsOk(runtime.TeamBarrier(team.value(), kDefaultStream)));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(TeamTest, DescribeNamesTheWholeTeamOfANodeTeam) {
  Team team;
  team.pes = {0, 2};
  EXPECT_EQ(team.Describe(), "team_ranks=[0,2]");
  team.serves = {4, 0, 2, 6};
  EXPECT_EQ(team.Describe(), "team_ranks=[4,0,2,6] node_team_ranks=[0,2]");
}

// A node team (this node's members of a team that spans nodes) names the whole team it serves in every message its
// members raise: a refusal and a mismatch on one node team, both node teams at once. Bad `serves` lists are refused
// on every member before anything is exchanged, and members that disagree on it all raise.
TEST(TeamTest, ANodeTeamNamesTheWholeTeamItServes) {
  RunRanks(4, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(HostConfig(), std::make_unique<host::HostDevice>(), bootstrap)));
    auto root = runtime.CreateTeam(AllPes(4), bootstrap);
    ASSERT_TRUE(root.ok()) << root.status().ToString();
    const std::vector<int> half = rank < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    const std::string node_ranks = rank < 2 ? "[0,1]" : "[2,3]";
    SplitBootstrap split(bootstrap, half);
    EXPECT_TRUE(HasError(runtime.CreateTeam(half, split, {0, 2}).status(), StatusCode::kInvalidArgument,
                         "`serves` must hold every pe of `pes`, but got none equal to pes[1]=" +
                             std::to_string(half[1])));
    EXPECT_TRUE(HasError(runtime.CreateTeam(half, split, {0, 1, 2, 4}).status(), StatusCode::kInvalidArgument,
                         "`serves[3]` must be in [0, 4), but got 4"));
    EXPECT_TRUE(HasError(runtime.CreateTeam(half, split, {0, 1, 2, 3, 2}).status(), StatusCode::kInvalidArgument,
                         "`serves` must be distinct, but got 2 at positions 2 and 4"));
    // The second member of each node team lists the whole team in another order.
    const std::vector<int> listed = rank % 2 == 0 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{1, 0, 3, 2};
    const Status disagreed = runtime.CreateTeam(half, split, listed).status();
    EXPECT_TRUE(HasError(disagreed, StatusCode::kMismatch, "ranks disagree on the team a node team serves: rank=" +
                                                               std::to_string(rank)))
        << disagreed.ToString();
    EXPECT_TRUE(Contains(disagreed.message(), "rank=" + std::to_string(rank ^ 1) + " serves another list"))
        << disagreed.message();

    auto node = runtime.CreateTeam(half, split, {0, 1, 2, 3});
    ASSERT_TRUE(node.ok()) << node.status().ToString();
    const std::string whole = "team_ranks=[0,1,2,3] node_team_ranks=" + node_ranks;
    std::int32_t ints[2] = {rank, rank};
    const int refuser = half[1];
    const Status refused = runtime.AllReduce(node.value(), ints, 8, DataType::kInt32,
                                             rank == refuser ? ReduceOp::kAvg : ReduceOp::kSum, kDefaultStream, nullptr);
    EXPECT_TRUE(HasError(refused, StatusCode::kInvalidArgument,
                         "`op` must be sum, max or min for int32, but got avg (refused by rank " +
                             std::to_string(refuser) + ": op=all_reduce " + whole + "; every member fails this call)"))
        << refused.ToString();
    float values[8] = {};
    const Status mismatch = runtime.AllReduce(node.value(), values, rank == half[0] ? 16 : 32, DataType::kFloat32,
                                              ReduceOp::kSum, kDefaultStream, nullptr);
    EXPECT_TRUE(HasError(mismatch, StatusCode::kMismatch, "ranks disagree on a collective (count): " + whole + " rank " +
                                                              std::to_string(rank) + " calls "))
        << mismatch.ToString();
    ASSERT_TRUE(IsOk(runtime.AllReduce(node.value(), ints, 8, DataType::kInt32, ReduceOp::kSum, kDefaultStream, nullptr)));
    EXPECT_EQ(ints[0], half[0] + half[1]);
    // The root team is no node team: its messages name its own ranks only.
    const Status plain = runtime.AllReduce(root.value(), ints, 8, DataType::kInt32,
                                           rank == 3 ? ReduceOp::kAvg : ReduceOp::kSum, kDefaultStream, nullptr);
    EXPECT_TRUE(Contains(plain.message(), "(refused by rank 3: op=all_reduce team_ranks=[0,1,2,3]; every member"))
        << plain.ToString();
    EXPECT_TRUE(IsOk(runtime.ReleaseTeam(node.value())));
    EXPECT_TRUE(IsOk(runtime.ReleaseTeam(root.value())));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

// A message of another size or dtype is drained and refused on both sides: the receiver's recv fails naming what was
// sent, the sender's next send or recv with it fails once; the next message arrives.
TEST(TeamTest, AMessageOfAnotherSizeOrDtypeIsRefusedOnBothSides) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(HostConfig(), std::make_unique<host::HostDevice>(), bootstrap)));
    auto team = runtime.CreateTeam(AllPes(2), bootstrap);
    ASSERT_TRUE(team.ok());
    float data[4] = {1.5f, 0.0f, 0.0f, 0.0f};
    const ElementType int32 = testutil::Int32();
    if (rank == 0) {
      ASSERT_TRUE(IsOk(runtime.Send(team.value(), data, 16, Float32(), 1, kDefaultStream, nullptr)));   // size
      ASSERT_TRUE(IsOk(bootstrap.Barrier()));
      EXPECT_TRUE(HasError(runtime.Send(team.value(), data, 4, Float32(), 1, kDefaultStream, nullptr),
                           StatusCode::kInvalidArgument, "a message this rank sent must match the receive buffer of rank 1"));
      ASSERT_TRUE(IsOk(runtime.Send(team.value(), data, 4, Float32(), 1, kDefaultStream, nullptr)));    // dtype
      ASSERT_TRUE(IsOk(bootstrap.Barrier()));
      data[0] = 7.0f;
      EXPECT_TRUE(HasError(runtime.Send(team.value(), data, 4, Float32(), 1, kDefaultStream, nullptr),
                           StatusCode::kInvalidArgument, "refused it"));
      ASSERT_TRUE(IsOk(runtime.Send(team.value(), data, 4, Float32(), 1, kDefaultStream, nullptr)));
    } else {
      EXPECT_TRUE(HasError(runtime.Recv(team.value(), data, 8, Float32(), 0, kDefaultStream, nullptr),
                           StatusCode::kInvalidArgument,
                           "`tensor` must be a receive buffer for the float32 message of 16 bytes rank 0 sent, but got "
                           "float32 of 8 bytes"));
      ASSERT_TRUE(IsOk(bootstrap.Barrier()));
      std::int32_t wrong = -1;
      EXPECT_TRUE(HasError(runtime.Recv(team.value(), &wrong, 4, int32, 0, kDefaultStream, nullptr), StatusCode::kTypeError,
                           "`tensor` must be a receive buffer for the float32 message of 4 bytes rank 0 sent, but got "
                           "int32 of 4 bytes"));
      EXPECT_EQ(wrong, -1);   // 1.5f never lands in it as 1069547520
      ASSERT_TRUE(IsOk(bootstrap.Barrier()));
      ASSERT_TRUE(IsOk(runtime.Recv(team.value(), data, 4, Float32(), 0, kDefaultStream, nullptr)));
      EXPECT_EQ(data[0], 7.0f);
    }
    EXPECT_TRUE(IsOk(runtime.TeamBarrier(team.value(), kDefaultStream)));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

// Signal words hold SignalValue of counters that only grow, compared for equality: a team whose counters start just
// below the 32-bit signals' wrap runs 10,000 syncs and send/recv pieces across it.
TEST(TeamTest, TenThousandSyncsAndSendsAcrossTheSignalWrap) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(runtime.Init(HostConfig(), std::make_unique<host::HostDevice>(), bootstrap)));
    auto root = runtime.CreateTeam(AllPes(2), bootstrap);
    ASSERT_TRUE(root.ok());
    runtime.SetFirstTeamCounterForTesting(static_cast<std::uint64_t>(kSignalPeriod) - 5000);
    auto team = runtime.CreateTeam(AllPes(2), bootstrap);
    ASSERT_TRUE(team.ok());
    for (int i = 0; i < 10000; ++i) {
      std::int64_t value = i + rank;
      ASSERT_TRUE(IsOk(runtime.AllReduce(team.value(), &value, 8, DataType::kInt64, ReduceOp::kSum, kDefaultStream,
                                         nullptr))) << i;
      ASSERT_EQ(value, 2 * i + 1) << i;
      std::int64_t message = 3 * i;
      if (rank == 0) {
        ASSERT_TRUE(IsOk(runtime.Send(team.value(), &message, 8, testutil::Int64(), 1, kDefaultStream, nullptr))) << i;
      } else {
        message = -1;
        ASSERT_TRUE(IsOk(runtime.Recv(team.value(), &message, 8, testutil::Int64(), 0, kDefaultStream, nullptr))) << i;
        ASSERT_EQ(message, 3 * i) << i;
      }
    }
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(DeviceFactoryTest, TheConfigurationChoosesTheDevice) {
  Config config;
  auto host = MakeDevice(config);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  EXPECT_STREQ(host.value()->name(), "host");
  config.device = "ascend";   // only a build against a real CANN installation carries it, never the fakes
  EXPECT_TRUE(HasError(MakeDevice(config).status(), StatusCode::kStateError,
                       "device is not built into this module: device=ascend built=host"));
}

// MoE dispatch and combine (moe_cases.h), on both data paths: pulled out of symmetric inputs, or through the
// engine's all_to_all (ordinary inputs).
class HostMoeTest : public ::testing::TestWithParam<int> {};

TEST_P(HostMoeTest, DispatchLaysOutExpertMajorAndCombineRestoresEveryToken) {
  testutil::RunMoeRoundTrip(HostBackend(), GetParam());
}

TEST_P(HostMoeTest, AReceiveBufferTooSmallFailsOnEveryRankBeforeAnythingIsWritten) {
  testutil::RunMoeTooSmall(HostBackend(), GetParam());
}

TEST_P(HostMoeTest, BadSplitsOfOneRankFailOnEveryRank) {
  testutil::RunMoeBadCalls(HostBackend(), GetParam());
}

TEST_P(HostMoeTest, RanksThatDisagreeAboutTheCallAllRaiseAMismatchBeforeAnythingIsWritten) {
  testutil::RunMoeMismatch(HostBackend(), GetParam());
}

TEST_P(HostMoeTest, OrdinaryInputsDispatchAndCombineAgainstTheReference) {
  testutil::RunMoeOrdinaryInputs(HostBackend(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Ranks, HostMoeTest, ::testing::Values(2, 3, 4, 8));

}  // namespace
}  // namespace hp::shmem
