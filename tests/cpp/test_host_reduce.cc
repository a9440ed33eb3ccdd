// HostDevice::Reduce with thread-ranks: sources read straight from every pe's mapping, subsets of pes in their
// order, in place, stream order on a non-default stream, and what the kernel refuses.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/host/host_device.h"
#include "test_support.h"
#include "thread_bootstrap.h"

namespace hp::shmem::host {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): the shared test helpers

DeviceInitArgs Args(Bootstrap& bootstrap, double timeout_sec = 10.0) {
  DeviceInitArgs args;
  args.rank = bootstrap.rank();
  args.world_size = bootstrap.world_size();
  args.heap_size = kMiB;
  args.timeout_sec = timeout_sec;
  return args;
}

// What rank `pe` holds at element i: distinct per pe, exact in float32.
float Value(int pe, std::size_t i) { return static_cast<float>(i % 1000) * 0.25f + static_cast<float>(pe * 1000); }

TEST(HostReduceDeviceTest, ReducesEveryPeSubsetsAndInPlace) {
  constexpr int kWorld = 3;
  constexpr std::size_t kCount = 3000;   // several kernel blocks
  RunRanks(kWorld, [](int rank, Bootstrap& bootstrap) {
    HostDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap), bootstrap)));
    Result<void*> buffer = device.Allocate(kCount * sizeof(float), 64);
    ASSERT_TRUE(buffer.ok());
    auto* mine = static_cast<float*>(buffer.value());
    for (std::size_t i = 0; i < kCount; ++i) mine[i] = Value(rank, i);
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));

    std::vector<float> sum(kCount), max(kCount), pair(kCount);
    EXPECT_TRUE(IsOk(device.Reduce(sum.data(), mine, kCount, DataType::kFloat32, ReduceOp::kSum, {0, 1, 2},
                                   kDefaultStream, nullptr)));
    EXPECT_TRUE(IsOk(device.Reduce(max.data(), mine, kCount, DataType::kFloat32, ReduceOp::kMax, {1, 0, 2},
                                   kDefaultStream, nullptr)));
    const int other = (rank + 1) % kWorld;
    EXPECT_TRUE(IsOk(device.Reduce(pair.data(), mine, kCount, DataType::kFloat32, ReduceOp::kAvg, {other},
                                   kDefaultStream, nullptr)));
    for (std::size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(sum[i], (Value(0, i) + Value(1, i)) + Value(2, i)) << i;
      ASSERT_EQ(max[i], Value(2, i)) << i;
      ASSERT_EQ(pair[i], Value(other, i)) << i;
    }
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));   // nobody reads the buffers any more

    // In place: rank 1 overwrites its own buffer while the others keep off it.
    if (rank == 1) {
      EXPECT_TRUE(IsOk(device.Reduce(mine, mine, kCount, DataType::kFloat32, ReduceOp::kMin, {2, 1, 0},
                                     kDefaultStream, nullptr)));
      for (std::size_t i = 0; i < kCount; ++i) ASSERT_EQ(mine[i], Value(0, i)) << i;
    }
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    if (rank != 1) {
      for (std::size_t i = 0; i < kCount; ++i) ASSERT_EQ(mine[i], Value(rank, i)) << i;
    }
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    EXPECT_TRUE(IsOk(device.Free(buffer.value())));
    EXPECT_TRUE(IsOk(device.Finalize()));
  });
}

// On a host stream the reduction runs after what was enqueued before it: here a wait for a peer's signal that
// follows the peer's new data, which the reduction must see.
TEST(HostReduceDeviceTest, RunsInStreamOrderAndKeepsItsBuffersAlive) {
  constexpr std::size_t kCount = 1500;
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    HostDevice device;
    ASSERT_TRUE(IsOk(device.Init(Args(bootstrap), bootstrap)));
    Result<void*> buffer = device.Allocate(kCount * sizeof(std::int32_t), 64);
    Result<void*> flag = device.Allocate(8, 64);
    ASSERT_TRUE(buffer.ok() && flag.ok());
    auto* mine = static_cast<std::int32_t*>(buffer.value());
    for (std::size_t i = 0; i < kCount; ++i) mine[i] = 1;
    std::memset(flag.value(), 0, 8);
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));

    if (rank == 0) {
      Result<StreamHandle> stream = device.CreateStream();
      ASSERT_TRUE(stream.ok());
      std::vector<std::int32_t> dst(kCount, -1);
      auto token = std::make_shared<int>(0);   // stands for the tensors a binding keeps alive
      std::weak_ptr<int> watch = token;
      ASSERT_TRUE(IsOk(device.WaitSignal(flag.value(), SignalWidth::k32, CompareOp::kEq, 1, stream.value())));
      ASSERT_TRUE(IsOk(device.Reduce(dst.data(), mine, kCount, DataType::kInt32, ReduceOp::kSum, {0, 1},
                                     stream.value(), std::move(token))));
      EXPECT_FALSE(watch.expired());   // held by the queued reduction
      EXPECT_EQ(dst, std::vector<std::int32_t>(kCount, -1));   // not run: the stream waits for the signal
      ASSERT_TRUE(IsOk(bootstrap.Barrier()));   // rank 1 writes and signals only now
      ASSERT_TRUE(IsOk(device.SynchronizeStream(stream.value())));
      EXPECT_TRUE(watch.expired());    // released once it ran
      EXPECT_EQ(dst, std::vector<std::int32_t>(kCount, 1 + 41));
      EXPECT_TRUE(IsOk(device.DestroyStream(stream.value())));
    } else {
      ASSERT_TRUE(IsOk(bootstrap.Barrier()));
      for (std::size_t i = 0; i < kCount; ++i) mine[i] = 41;
      ASSERT_TRUE(IsOk(device.Signal(flag.value(), SignalWidth::k32, 1, SignalOp::kSet, 0, kDefaultStream)));
    }
    ASSERT_TRUE(IsOk(device.Barrier(kDefaultStream)));
    EXPECT_TRUE(IsOk(device.Free(flag.value())));
    EXPECT_TRUE(IsOk(device.Free(buffer.value())));
    EXPECT_TRUE(IsOk(device.Finalize()));
  });
}

TEST(HostReduceDeviceTest, WhatTheKernelRefusesIsAnInternalErrorAndWritesNothing) {
  ThreadGroup group(1);
  ThreadBootstrap bootstrap(group, 0);
  HostDevice device;
  ASSERT_TRUE(IsOk(device.Init(Args(bootstrap), bootstrap)));
  Result<void*> buffer = device.Allocate(64, 64);
  ASSERT_TRUE(buffer.ok());
  std::memset(buffer.value(), 7, 64);
  std::vector<std::int32_t> dst(16, -1);
  // The runtime rejects these before they reach a device; the device still refuses rather than guess.
  EXPECT_TRUE(HasError(device.Reduce(dst.data(), buffer.value(), 16, DataType::kInt32, ReduceOp::kAvg, {0},
                                     kDefaultStream, nullptr),
                       StatusCode::kInternal, "host reduction cannot compute this: dtype=int32 op=avg sources=1"));
  EXPECT_TRUE(HasError(device.Reduce(dst.data(), buffer.value(), 16, DataType::kInt32, ReduceOp::kSum, {},
                                     kDefaultStream, nullptr),
                       StatusCode::kInternal, "host reduction cannot compute this: dtype=int32 op=sum sources=0"));
  EXPECT_EQ(dst, std::vector<std::int32_t>(16, -1));
  // On a stream the failure is the stream's, reported by its synchronize.
  Result<StreamHandle> stream = device.CreateStream();
  ASSERT_TRUE(stream.ok());
  EXPECT_TRUE(IsOk(device.Reduce(dst.data(), buffer.value(), 16, DataType::kUInt8, ReduceOp::kAvg, {0},
                                 stream.value(), nullptr)));
  EXPECT_TRUE(HasError(device.SynchronizeStream(stream.value()), StatusCode::kInternal, "dtype=uint8 op=avg"));
  EXPECT_EQ(dst, std::vector<std::int32_t>(16, -1));
  EXPECT_TRUE(HasError(device.Reduce(dst.data(), buffer.value(), 16, DataType::kInt32, ReduceOp::kSum, {0}, 0x1234,
                                     nullptr),
                       StatusCode::kInvalidArgument,
                       "`stream` must be a live stream of the host device, but got handle 0x1234"));
  EXPECT_TRUE(IsOk(device.DestroyStream(stream.value())));
  EXPECT_TRUE(IsOk(device.Free(buffer.value())));
  EXPECT_TRUE(IsOk(device.Finalize()));
}

}  // namespace
}  // namespace hp::shmem::host
