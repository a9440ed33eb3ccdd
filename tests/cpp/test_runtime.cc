// The Runtime over thread-ranks: lifecycle state machine, symmetric allocation checks, data plane, streams.
//
// Every thread-rank owns its own Runtime and HostDevice; the ranks meet through thread_bootstrap.h.
#include "runtime/runtime.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "host_forwarding_device.h"
#include "runtime/host/host_device.h"
#include "runtime/logging.h"
#include "test_support.h"
#include "thread_bootstrap.h"

namespace hp::shmem {
namespace {

using host::HostDevice;
using namespace testutil;  // NOLINT(build/namespaces): the shared test helpers

// The runtime's own check records: 2 * world_size records of 64 bytes, the first allocation of a lifecycle.
std::size_t ControlBytes(int world_size) { return 2 * static_cast<std::size_t>(world_size) * 64; }

Config TestConfig(std::size_t heap_size = kMiB, double timeout_sec = 10.0) {
  Config config;
  config.heap_size = heap_size;
  config.timeout_sec = timeout_sec;
  config.log_level = LogLevel::kError;
  return config;
}

// `status` has `code` and exactly `message`.
// What every member of a team of `world` PEs 0..world-1 adds to a refusal its rank 0 made.
std::string RefusedByRankZero(const std::string& op, int world) {
  std::string ranks;
  for (int r = 0; r < world; ++r) ranks += (r ? "," : "") + std::to_string(r);
  return " (refused by rank 0: op=" + op + " team_ranks=[" + ranks + "]; every member fails this call)";
}

::testing::AssertionResult IsError(const Status& status, StatusCode code, const std::string& message) {
  if (status.code() == code && status.message() == message) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got " << status.ToString() << "; expected " << StatusCodeName(code) << ": "
                                       << message;
}

Status InitHost(Runtime& runtime, Bootstrap& bootstrap, const Config& config = TestConfig()) {
  return runtime.Init(config, std::make_unique<HostDevice>(), bootstrap);
}

// Allocates and expects success; returns a default AllocationInfo (id 0) otherwise.
AllocationInfo MustAllocate(Runtime& runtime, std::size_t bytes, std::size_t alignment = 0) {
  Result<AllocationInfo> info = runtime.Allocate(bytes, alignment, "test");
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  return info.ok() ? info.value() : AllocationInfo{};
}

void* Address(const AllocationInfo& info, std::size_t offset = 0) {
  return reinterpret_cast<char*>(info.base) + offset;
}

std::vector<std::uint64_t> Ids(const std::vector<AllocationInfo>& infos) {
  std::vector<std::uint64_t> ids;
  for (const AllocationInfo& info : infos) ids.push_back(info.id);
  return ids;
}

std::vector<unsigned char> Pattern(std::size_t bytes, int seed) {
  std::vector<unsigned char> data(bytes);
  for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>((i * 7 + static_cast<std::size_t>(seed) * 31 + 1) & 0xff);
  return data;
}

// ---------------------------------------------------------------------------------------------------------------
// A test-only decorator of the host device: injects failures and records every transfer the runtime asks for.

struct Transfer {
  bool put;
  std::uintptr_t symmetric;   // the symmetric (local heap) address of the call
  std::size_t bytes;
  int pe;
};

struct Faults {
  bool fail_init = false;
  bool fail_finalize = false;
  int fail_allocate_call = -1;         // index of the Allocate call that fails (0: the runtime's control block)
  bool fail_copy_to_heap = false;
  std::size_t max_transfer_bytes = 0;

  std::mutex mu;
  int allocate_calls = 0;
  int copies_to_heap = 0;
  int copies_from_heap = 0;
  std::vector<Transfer> transfers;
  std::size_t largest_transfer = 0;

  void Record(const Transfer& transfer) {
    std::lock_guard<std::mutex> lock(mu);
    transfers.push_back(transfer);
    largest_transfer = std::max(largest_transfer, transfer.bytes);
  }
  std::vector<Transfer> TakeTransfers() {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<Transfer> out = std::move(transfers);
    transfers.clear();
    return out;
  }
};

class FaultyDevice final : public HostForwardingDevice {
 public:
  explicit FaultyDevice(std::shared_ptr<Faults> faults) : faults_(std::move(faults)) {}

  const char* name() const override { return "faulty-host"; }
  Status Init(const DeviceInitArgs& args, Bootstrap& bootstrap) override {
    if (faults_->fail_init) return DeviceError("injected init failure: rank=" + std::to_string(args.rank));
    return host().Init(args, bootstrap);
  }
  Status Finalize() override {
    Status status = host().Finalize();
    if (faults_->fail_finalize) return DeviceError("injected finalize failure");
    return status;
  }
  Result<void*> Allocate(std::size_t bytes, std::size_t alignment) override {
    int call;
    {
      std::lock_guard<std::mutex> lock(faults_->mu);
      call = faults_->allocate_calls++;
    }
    if (call == faults_->fail_allocate_call) {
      return OutOfMemory("injected allocation failure: call=" + std::to_string(call));
    }
    return host().Allocate(bytes, alignment);
  }
  Status CopyToHeap(void* dst, const void* src, std::size_t bytes) override {
    {
      std::lock_guard<std::mutex> lock(faults_->mu);
      ++faults_->copies_to_heap;
    }
    if (faults_->fail_copy_to_heap) return DeviceError("injected copy failure: bytes=" + std::to_string(bytes));
    return host().CopyToHeap(dst, src, bytes);
  }
  Status CopyFromHeap(void* dst, const void* src, std::size_t bytes) override {
    {
      std::lock_guard<std::mutex> lock(faults_->mu);
      ++faults_->copies_from_heap;
    }
    return host().CopyFromHeap(dst, src, bytes);
  }
  std::size_t max_transfer_bytes() const override { return faults_->max_transfer_bytes; }
  Status Put(void* dst, const void* src, std::size_t bytes, int pe, StreamHandle stream, KeepAlive keep) override {
    faults_->Record({true, reinterpret_cast<std::uintptr_t>(dst), bytes, pe});
    return host().Put(dst, src, bytes, pe, stream, std::move(keep));
  }
  Status Get(void* dst, const void* src, std::size_t bytes, int pe, StreamHandle stream, KeepAlive keep) override {
    faults_->Record({false, reinterpret_cast<std::uintptr_t>(src), bytes, pe});
    return host().Get(dst, src, bytes, pe, stream, std::move(keep));
  }

 private:
  std::shared_ptr<Faults> faults_;
};

// ---------------------------------------------------------------------------------------------------------------
// The thread bootstrap itself.

TEST(ThreadBootstrapTest, AllGatherInRankOrder) {
  RunRanks(3, [](int rank, Bootstrap& bootstrap) {
    EXPECT_EQ(bootstrap.rank(), rank);
    EXPECT_EQ(bootstrap.world_size(), 3);
    for (int round = 0; round < 3; ++round) {
      const std::int64_t mine = rank * 100 + round;
      EXPECT_EQ(GatherValue(bootstrap, mine), (std::vector<std::int64_t>{round, 100 + round, 200 + round}));
    }
    EXPECT_TRUE(IsOk(bootstrap.Barrier()));
  });
}

TEST(ThreadBootstrapTest, AllGatherSizeMismatchFailsOnEveryRank) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    char in[8] = {};
    char out[16] = {};
    const Status status = bootstrap.AllGather(in, rank == 0 ? 4 : 8, out);
    EXPECT_TRUE(HasError(status, StatusCode::kMismatch, "thread bootstrap all_gather sizes differ: rank="));
    // The group is still usable afterwards.
    EXPECT_TRUE(IsOk(bootstrap.Barrier()));
  });
}

TEST(ThreadBootstrapTest, BarrierFailsAtOnceWhenARankReturned) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    if (rank == 1) return;
    const Status status = bootstrap.Barrier();
    EXPECT_TRUE(HasError(status, StatusCode::kTimeout, "thread bootstrap barrier cannot complete: rank=1"));
    // Broken for good.
    EXPECT_TRUE(HasError(bootstrap.Barrier(), StatusCode::kTimeout, "thread bootstrap barrier cannot complete"));
  });
}

TEST(ThreadBootstrapTest, BarrierTimesOutNamingTheMissingRank) {
  std::promise<void> rank0_failed;
  std::shared_future<void> failed = rank0_failed.get_future().share();
  RunRanks(
      2,
      [&](int rank, Bootstrap& bootstrap) {
        if (rank == 1) {
          failed.wait();
          EXPECT_TRUE(HasError(bootstrap.Barrier(), StatusCode::kTimeout,
                               "thread bootstrap barrier timed out: rank=0 missing_ranks=[1]"));
          return;
        }
        EXPECT_TRUE(IsError(bootstrap.Barrier(), StatusCode::kTimeout,
                            "thread bootstrap barrier timed out: rank=0 missing_ranks=[1]"));
        rank0_failed.set_value();
      },
      std::chrono::milliseconds(50));
}

// ---------------------------------------------------------------------------------------------------------------
// Lifecycle.

TEST(RuntimeStateTest, OpsBeforeInitAreRejected) {
  ThreadGroup group(1);
  ThreadBootstrap bootstrap(group, 0);
  Runtime runtime;
  EXPECT_EQ(runtime.state(), LifecycleState::kUninitialized);
  EXPECT_EQ(runtime.lifecycle(), 0u);
  const DebugSnapshot before = runtime.Snapshot();
  EXPECT_EQ(before.state, LifecycleState::kUninitialized);
  EXPECT_EQ(before.lifecycle, 0u);
  EXPECT_EQ(before.rank, -1);
  EXPECT_EQ(before.heap_size, 0u);
  EXPECT_TRUE(before.active.empty());
  EXPECT_EQ(before.latest_failure, "");

  auto rejected = [](const char* op) {
    return std::string("shmem runtime is not initialised: op=") + op +
           " state=uninitialized (call acquire_shmem() first)";
  };
  char buffer[64] = {};
  EXPECT_TRUE(IsError(runtime.Allocate(64, 0, "").status(), StatusCode::kStateError, rejected("empty")));
  EXPECT_TRUE(IsError(runtime.Free(1, ""), StatusCode::kStateError, rejected("free")));
  EXPECT_TRUE(IsError(runtime.Put(buffer, buffer, 8, 8, 0, kDefaultStream, nullptr), StatusCode::kStateError,
                      rejected("put")));
  EXPECT_TRUE(IsError(runtime.Get(buffer, buffer, 8, 8, 0, kDefaultStream, nullptr), StatusCode::kStateError,
                      rejected("get")));
  EXPECT_TRUE(IsError(runtime.Signal(buffer, SignalWidth::k64, 1, SignalOp::kSet, 0, kDefaultStream),
                      StatusCode::kStateError, rejected("signal")));
  EXPECT_TRUE(IsError(runtime.WaitSignal(buffer, SignalWidth::k64, CompareOp::kEq, 1, kDefaultStream),
                      StatusCode::kStateError, rejected("wait_signal")));
  EXPECT_TRUE(IsError(runtime.Barrier(kDefaultStream), StatusCode::kStateError, rejected("barrier")));
  EXPECT_TRUE(IsError(runtime.AllGather(1, buffer, 8, buffer, 8, ElementType{}, kDefaultStream, nullptr),
                      StatusCode::kStateError, rejected("all_gather")));
  EXPECT_TRUE(IsError(runtime.CreateStream().status(), StatusCode::kStateError, rejected("Stream")));
  EXPECT_TRUE(IsError(runtime.SynchronizeStream(kDefaultStream), StatusCode::kStateError, rejected("synchronize")));
  EXPECT_TRUE(
      IsError(runtime.StreamWaitStream(kDefaultStream, kDefaultStream), StatusCode::kStateError, rejected("wait_stream")));
  EXPECT_TRUE(IsError(runtime.DestroyStream(1), StatusCode::kStateError, rejected("Stream.destroy")));
  EXPECT_TRUE(IsError(runtime.Shutdown(bootstrap), StatusCode::kStateError, rejected("shutdown")));
  EXPECT_EQ(runtime.state(), LifecycleState::kUninitialized);
  EXPECT_EQ(runtime.Snapshot().latest_failure, "STATE_ERROR: " + rejected("shutdown"));
}

TEST(RuntimeStateTest, InitRejectsANullDevice) {
  ThreadGroup group(1);
  ThreadBootstrap bootstrap(group, 0);
  Runtime runtime;
  EXPECT_TRUE(IsError(runtime.Init(TestConfig(), nullptr, bootstrap), StatusCode::kInvalidArgument,
                      "`device` must be a device, but got nullptr"));
  EXPECT_EQ(runtime.state(), LifecycleState::kUninitialized);
  EXPECT_EQ(runtime.lifecycle(), 0u);
}

class RuntimeRanksTest : public ::testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(Ranks, RuntimeRanksTest, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "ranks"; });

TEST_P(RuntimeRanksTest, InitShutdownReinit) {
  const int world = GetParam();
  RunRanks(world, [world](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap, TestConfig(kMiB))));
    EXPECT_EQ(runtime.state(), LifecycleState::kInitialized);
    EXPECT_EQ(runtime.lifecycle(), 1u);
    EXPECT_EQ(runtime.rank(), rank);
    EXPECT_EQ(runtime.world_size(), world);
    DebugSnapshot snapshot = runtime.Snapshot();
    EXPECT_EQ(snapshot.state, LifecycleState::kInitialized);
    EXPECT_EQ(snapshot.rank, rank);
    EXPECT_EQ(snapshot.world_size, world);
    EXPECT_EQ(snapshot.device, "host");
    EXPECT_EQ(snapshot.heap_size, kMiB);
    EXPECT_EQ(snapshot.config.heap_size, kMiB);
    EXPECT_NE(snapshot.heap_base, 0u);
    EXPECT_EQ(snapshot.allocated, 0u);
    EXPECT_EQ(snapshot.remaining, kMiB - ControlBytes(world));
    EXPECT_EQ(snapshot.latest_failure, "");

    // A second Init is rejected without touching the running lifecycle.
    EXPECT_TRUE(IsError(InitHost(runtime, bootstrap), StatusCode::kStateError,
                        "shmem runtime cannot be initialised: state=initialized lifecycle=1"));
    EXPECT_EQ(runtime.state(), LifecycleState::kInitialized);
    EXPECT_EQ(runtime.lifecycle(), 1u);
    EXPECT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));

    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
    EXPECT_EQ(runtime.state(), LifecycleState::kUninitialized);
    EXPECT_EQ(runtime.lifecycle(), 1u);
    EXPECT_EQ(runtime.Snapshot().heap_size, 0u);
    EXPECT_TRUE(HasError(runtime.Barrier(kDefaultStream), StatusCode::kStateError,
                         "shmem runtime is not initialised: op=barrier state=uninitialized"));

    // A new lifecycle with another heap size.
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap, TestConfig(2 * kMiB))));
    EXPECT_EQ(runtime.lifecycle(), 2u);
    snapshot = runtime.Snapshot();
    EXPECT_EQ(snapshot.lifecycle, 2u);
    EXPECT_EQ(snapshot.heap_size, 2 * kMiB);
    EXPECT_EQ(snapshot.config.heap_size, 2 * kMiB);
    EXPECT_EQ(snapshot.remaining, 2 * kMiB - ControlBytes(world));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST_P(RuntimeRanksTest, ShutdownRefusedWhileAllocationsLive) {
  const int world = GetParam();
  RunRanks(world, [world](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    const AllocationInfo a = MustAllocate(runtime, 4096);
    const AllocationInfo b = MustAllocate(runtime, 100);
    std::string holders;
    for (int r = 0; r < world; ++r) holders += " rank" + std::to_string(r) + "=2";
    const std::string expected = "shutdown refused: live allocations remain (free them, then close again):" + holders +
                                 " local=[allocation_id=" + std::to_string(a.id) + " base=" + Hex(a.base) +
                                 " bytes=4096, allocation_id=" + std::to_string(b.id) + " base=" + Hex(b.base) +
                                 " bytes=100]";
    EXPECT_TRUE(IsError(runtime.Shutdown(bootstrap), StatusCode::kStateError, expected));
    EXPECT_EQ(runtime.state(), LifecycleState::kInitialized);
    EXPECT_EQ(runtime.Snapshot().latest_failure, "STATE_ERROR: " + expected);

    // Still fully usable: free one, refused again with the one left, free it, then shut down.
    EXPECT_TRUE(IsOk(runtime.Free(a.id, "test")));
    holders.clear();
    for (int r = 0; r < world; ++r) holders += " rank" + std::to_string(r) + "=1";
    EXPECT_TRUE(HasError(runtime.Shutdown(bootstrap), StatusCode::kStateError,
                         "(free them, then close again):" + holders + " local=[allocation_id=" + std::to_string(b.id) +
                             " "));
    EXPECT_TRUE(IsOk(runtime.Free(b.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
    EXPECT_EQ(runtime.state(), LifecycleState::kUninitialized);
  });
}

TEST(RuntimeTest, ShutdownRefusedOnEveryRankWhenOnlyOneRankStillHolds) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    const AllocationInfo a = MustAllocate(runtime, 4096);
    // Rank 0's last tensor died: a leak, not a live allocation; rank 1 still holds its copy.
    if (rank == 0) runtime.OnStorageReleased(a.id);
    const std::string local = rank == 0 ? "" : "allocation_id=" + std::to_string(a.id) + " base=" + Hex(a.base) +
                                                   " bytes=4096";
    EXPECT_TRUE(IsError(runtime.Shutdown(bootstrap), StatusCode::kStateError,
                        "shutdown refused: live allocations remain (free them, then close again): rank1=1 local=[" +
                            local + "]"));
    EXPECT_EQ(runtime.state(), LifecycleState::kInitialized);
    if (rank == 1) runtime.OnStorageReleased(a.id);
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
    EXPECT_EQ(runtime.state(), LifecycleState::kUninitialized);
  });
}

// Waits (bounded) until `runtime` counts `calls` data-plane calls in flight.
void AwaitInFlight(const Runtime& runtime, std::uint64_t calls) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (runtime.Snapshot().in_flight != calls && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(runtime.Snapshot().in_flight, calls);
}

TEST(RuntimeTest, ShutdownRefusedOnEveryRankWhileAnotherThreadWaits) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    const AllocationInfo signal = MustAllocate(runtime, 8, 8);
    auto* word = reinterpret_cast<std::int64_t*>(signal.base);
    *word = 0;
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    // Only rank 0's thread waits; both ranks must refuse, or rank 1 would unmap the heap rank 0 still reads.
    std::future<Status> waiter;
    if (rank == 0) {
      waiter = std::async(std::launch::async, [&] {
        return runtime.WaitSignal(word, SignalWidth::k64, CompareOp::kGe, 1, kDefaultStream);
      });
      AwaitInFlight(runtime, 1);
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    // The calls in flight are named before the live allocation: they are what shutdown would crash.
    EXPECT_TRUE(IsError(runtime.Shutdown(bootstrap), StatusCode::kStateError,
                        "shutdown refused: calls of other threads are still running (wait for them, then close "
                        "again): in_flight: rank0=1"));
    EXPECT_EQ(runtime.state(), LifecycleState::kInitialized);
    if (rank == 0) {
      // The refusal reopened the runtime: this thread's own signal releases the waiter.
      EXPECT_TRUE(IsOk(runtime.Signal(word, SignalWidth::k64, 1, SignalOp::kSet, 0, kDefaultStream)));
      EXPECT_TRUE(IsOk(waiter.get()));
    }
    EXPECT_TRUE(IsOk(runtime.Free(signal.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
    EXPECT_EQ(runtime.state(), LifecycleState::kUninitialized);
  });
}

TEST(RuntimeTest, CallsThatStartDuringAShutdownAreRefused) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    if (rank == 0) {
      // Rank 0's shutdown waits in its check for rank 1, which comes only once this thread saw a refusal.
      auto closing = std::async(std::launch::async, [&] { return runtime.Shutdown(bootstrap); });
      Status refused = Status::Ok();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (refused.ok() && std::chrono::steady_clock::now() < deadline) {
        refused = runtime.SynchronizeStream(kDefaultStream);   // returns at once while the runtime is open
        if (refused.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      EXPECT_TRUE(IsError(refused, StatusCode::kStateError,
                          "shmem runtime is shutting down: op=synchronize (another thread of this rank is closing it)"));
      ASSERT_TRUE(IsOk(bootstrap.Barrier()));
      EXPECT_TRUE(IsOk(closing.get()));
    } else {
      ASSERT_TRUE(IsOk(bootstrap.Barrier()));
      EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
    }
    EXPECT_EQ(runtime.state(), LifecycleState::kUninitialized);
  });
}

TEST_P(RuntimeRanksTest, AllocationIdsAreNeverReused) {
  const int world = GetParam();
  RunRanks(world, [world](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    const AllocationInfo a = MustAllocate(runtime, 4096);
    EXPECT_EQ(a.offset, ControlBytes(world));   // right behind the runtime's check records
    EXPECT_EQ(a.lifecycle, 1u);
    EXPECT_EQ(a.bytes, 4096u);
    EXPECT_EQ(a.reserved, 4096u);
    EXPECT_EQ(a.base, runtime.Snapshot().heap_base + a.offset);
    // Symmetric: the same offset on every rank.
    const std::vector<std::size_t> offsets = GatherValue(bootstrap, a.offset);
    EXPECT_EQ(offsets, std::vector<std::size_t>(static_cast<std::size_t>(world), a.offset));

    ASSERT_TRUE(IsOk(runtime.Free(a.id, "test")));
    const AllocationInfo b = MustAllocate(runtime, 4096);
    EXPECT_EQ(b.base, a.base);   // the heap hands the same block out again...
    EXPECT_GT(b.id, a.id);       // ...under a new id
    EXPECT_TRUE(IsError(runtime.Free(a.id, "test"), StatusCode::kStateError,
                        "allocation was already freed: allocation_id=" + std::to_string(a.id)));
    ASSERT_TRUE(IsOk(runtime.Free(b.id, "test")));
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));

    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap, TestConfig(2 * kMiB))));
    const AllocationInfo c = MustAllocate(runtime, 4096);
    EXPECT_EQ(c.offset, a.offset);
    EXPECT_EQ(c.lifecycle, 2u);
    EXPECT_GT(c.id, b.id);
    // An id of the previous lifecycle is unknown to this one.
    EXPECT_TRUE(IsError(runtime.Free(b.id, "test"), StatusCode::kStateError,
                        "allocation is not registered: allocation_id=" + std::to_string(b.id)));
    EXPECT_TRUE(IsOk(runtime.Free(c.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Failures of the device.

TEST(RuntimeTest, InitFailureLeavesACleanUninitializedRuntime) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    auto faults = std::make_shared<Faults>();
    faults->fail_init = true;
    const Status failed = runtime.Init(TestConfig(), std::make_unique<FaultyDevice>(faults), bootstrap);
    EXPECT_TRUE(IsError(failed, StatusCode::kDeviceError, "injected init failure: rank=" + std::to_string(rank)));
    EXPECT_EQ(runtime.state(), LifecycleState::kUninitialized);
    EXPECT_EQ(runtime.lifecycle(), 0u);
    EXPECT_EQ(runtime.Snapshot().latest_failure, failed.ToString());
    EXPECT_TRUE(HasError(runtime.Barrier(kDefaultStream), StatusCode::kStateError, "op=barrier state=uninitialized"));

    // A heap too small for the runtime's own records fails after the device came up: it is finalised again.
    const Status too_small = InitHost(runtime, bootstrap, TestConfig(0));
    EXPECT_TRUE(HasError(too_small, StatusCode::kOutOfMemory, "symmetric heap exhausted: requested=256"));
    EXPECT_EQ(runtime.state(), LifecycleState::kUninitialized);
    EXPECT_EQ(runtime.lifecycle(), 0u);

    // So does a device that cannot clear the runtime's records in its heap.
    auto copy_faults = std::make_shared<Faults>();
    copy_faults->fail_copy_to_heap = true;
    EXPECT_TRUE(IsError(runtime.Init(TestConfig(), std::make_unique<FaultyDevice>(copy_faults), bootstrap),
                        StatusCode::kDeviceError, "injected copy failure: bytes=256"));
    EXPECT_EQ(runtime.state(), LifecycleState::kUninitialized);
    EXPECT_EQ(runtime.lifecycle(), 0u);

    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    EXPECT_EQ(runtime.lifecycle(), 1u);
    EXPECT_EQ(runtime.Snapshot().latest_failure, "");
    const AllocationInfo a = MustAllocate(runtime, 64);
    EXPECT_TRUE(IsOk(runtime.Free(a.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, FailedFinalizeIsTerminal) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    auto faults = std::make_shared<Faults>();
    faults->fail_finalize = rank == 1;
    ASSERT_TRUE(IsOk(runtime.Init(TestConfig(), std::make_unique<FaultyDevice>(faults), bootstrap)));
    EXPECT_EQ(runtime.Snapshot().device, "faulty-host");
    const Status shutdown = runtime.Shutdown(bootstrap);
    if (rank == 0) {
      EXPECT_TRUE(IsOk(shutdown));
      EXPECT_EQ(runtime.state(), LifecycleState::kUninitialized);
      return;
    }
    EXPECT_TRUE(IsError(shutdown, StatusCode::kDeviceError,
                        "device finalize failed, the runtime cannot be used again: injected finalize failure"));
    EXPECT_EQ(runtime.state(), LifecycleState::kFailed);
    EXPECT_EQ(runtime.Snapshot().state, LifecycleState::kFailed);
    EXPECT_EQ(runtime.Snapshot().latest_failure, shutdown.ToString());
    // Terminal: no new lifecycle, no operation.
    EXPECT_TRUE(IsError(InitHost(runtime, bootstrap), StatusCode::kStateError,
                        "shmem runtime cannot be initialised: state=failed lifecycle=1"));
    EXPECT_TRUE(IsError(runtime.Allocate(64, 0, "").status(), StatusCode::kStateError,
                        "shmem runtime is not initialised: op=empty state=failed (call acquire_shmem() first)"));
    EXPECT_TRUE(HasError(runtime.Shutdown(bootstrap), StatusCode::kStateError, "op=shutdown state=failed"));
    EXPECT_EQ(runtime.state(), LifecycleState::kFailed);
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Symmetric allocation checks.

TEST(RuntimeTest, RanksAllocatingDifferentSizesAllFail) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    const Result<AllocationInfo> result = runtime.Allocate(rank == 0 ? 4096 : 8192, 0, "test");
    const std::string r0 = "rank=0 op=Empty sequence=1 bytes=4096 alignment=64 offset=0x100";
    const std::string r1 = "rank=1 op=Empty sequence=1 bytes=8192 alignment=64 offset=0x100";
    EXPECT_TRUE(IsError(result.status(), StatusCode::kMismatch,
                        "ranks disagree on a symmetric allocation: " + (rank == 0 ? r0 + ", " + r1 : r1 + ", " + r0)));
    DebugSnapshot snapshot = runtime.Snapshot();
    EXPECT_TRUE(snapshot.active.empty());
    EXPECT_EQ(snapshot.allocated, 0u);
    EXPECT_EQ(snapshot.remaining, kMiB - ControlBytes(2));
    // The heap is intact: the next agreed allocation gets the same block.
    const AllocationInfo a = MustAllocate(runtime, 8192);
    EXPECT_EQ(a.offset, 0x100u);
    EXPECT_TRUE(IsOk(runtime.Free(a.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, MismatchNamesTheDisagreeingRankAmongFour) {
  RunRanks(4, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    const Result<AllocationInfo> result = runtime.Allocate(rank == 2 ? 128 : 64, 0, "test");
    const std::string odd = "rank=2 op=Empty sequence=1 bytes=128 alignment=64 offset=0x200";
    EXPECT_TRUE(HasError(result.status(), StatusCode::kMismatch, "ranks disagree on a symmetric allocation: rank=" +
                                                                    std::to_string(rank)));
    if (rank != 2) {
      EXPECT_TRUE(HasError(result.status(), StatusCode::kMismatch, ", " + odd));
    } else {
      EXPECT_TRUE(HasError(result.status(), StatusCode::kMismatch, odd + ", rank=0 op=Empty"));
    }
    EXPECT_TRUE(runtime.Snapshot().active.empty());
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, AllocateAgainstFreeIsAMismatch) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    const AllocationInfo a = MustAllocate(runtime, 64);
    if (rank == 0) {
      const Result<AllocationInfo> extra = runtime.Allocate(64, 0, "test");
      EXPECT_TRUE(HasError(extra.status(), StatusCode::kMismatch,
                           "ranks disagree on a symmetric allocation: rank=0 op=Empty sequence=2 bytes=64"));
      EXPECT_TRUE(HasError(extra.status(), StatusCode::kMismatch, ", rank=1 op=Free sequence=2 bytes=64"));
    } else {
      EXPECT_TRUE(HasError(runtime.Free(a.id, "test"), StatusCode::kMismatch,
                           "ranks disagree on a symmetric free: rank=1 op=Free sequence=2 bytes=64 offset=0x100, "
                           "rank=0 op=Empty sequence=2 bytes=64"));
    }
    // Nothing changed on either side.
    EXPECT_EQ(Ids(runtime.Snapshot().active), std::vector<std::uint64_t>{a.id});
    EXPECT_TRUE(IsOk(runtime.Free(a.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, FreeingDifferentAllocationsIsAMismatch) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    const AllocationInfo a = MustAllocate(runtime, 64);
    const AllocationInfo b = MustAllocate(runtime, 128);
    const std::string fa = "op=Free sequence=3 bytes=64 offset=0x100";
    const std::string fb = "op=Free sequence=3 bytes=128 offset=0x140";
    EXPECT_TRUE(IsError(runtime.Free(rank == 0 ? a.id : b.id, "test"), StatusCode::kMismatch,
                        rank == 0 ? "ranks disagree on a symmetric free: rank=0 " + fa + ", rank=1 " + fb
                                  : "ranks disagree on a symmetric free: rank=1 " + fb + ", rank=0 " + fa));
    EXPECT_EQ(Ids(runtime.Snapshot().active), (std::vector<std::uint64_t>{a.id, b.id}));
    EXPECT_TRUE(IsOk(runtime.Free(a.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Free(b.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, ShutdownAgainstAllocateIsAMismatch) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    if (rank == 0) {
      EXPECT_TRUE(IsError(runtime.Shutdown(bootstrap), StatusCode::kMismatch,
                          "ranks are not all shutting down: rank=0 op=Shutdown sequence=1 live_allocations=0 "
                          "in_flight=0, rank=1 op=Empty sequence=1 bytes=64 alignment=64 offset=0x100"));
      EXPECT_EQ(runtime.state(), LifecycleState::kInitialized);
    } else {
      EXPECT_TRUE(IsError(runtime.Allocate(64, 0, "test").status(), StatusCode::kMismatch,
                          "ranks disagree on a symmetric allocation: rank=1 op=Empty sequence=1 bytes=64 alignment=64 "
                          "offset=0x100, rank=0 op=Shutdown sequence=1 live_allocations=0 in_flight=0"));
      EXPECT_TRUE(runtime.Snapshot().active.empty());
    }
    // Both sides are back in step.
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, AllocateAgainstBarrierIsDetected) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    if (rank == 0) {
      EXPECT_TRUE(IsError(runtime.Allocate(64, 0, "test").status(), StatusCode::kMismatch,
                          "ranks are not in the same collective: rank=0 op=Empty sequence=1 bytes=64 alignment=64 "
                          "offset=0x100, rank=1 sequence=0 (a rank skipped or added an empty/free, or called barrier() "
                          "instead)"));
      EXPECT_TRUE(runtime.Snapshot().active.empty());
      EXPECT_EQ(runtime.Snapshot().remaining, kMiB - ControlBytes(2));
    } else {
      EXPECT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    }
    // The check sequences now differ for good; the runtimes are released by their destructors.
  });
}

TEST(RuntimeTest, OneRankOutOfMemoryFailsEveryRank) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    const AllocationInfo keep = MustAllocate(runtime, 64);
    const std::size_t bytes = rank == 1 ? 8 * kMiB : 4096;
    const Result<AllocationInfo> result = runtime.Allocate(bytes, 0, "test");
    if (rank == 1) {
      EXPECT_TRUE(HasError(result.status(), StatusCode::kOutOfMemory,
                           "symmetric heap exhausted: requested=8388608 alignment=64"));
    } else {
      EXPECT_TRUE(IsError(result.status(), StatusCode::kOutOfMemory,
                          "symmetric allocation failed on another rank: rank=1 status=OUT_OF_MEMORY op=Empty "
                          "sequence=2 bytes=8388608 alignment=64 offset=0x0"));
    }
    EXPECT_EQ(Ids(runtime.Snapshot().active), std::vector<std::uint64_t>{keep.id});
    EXPECT_EQ(runtime.Snapshot().allocated, 64u);
    // Both ranks out of memory alike.
    EXPECT_TRUE(HasError(runtime.Allocate(2 * kMiB, 0, "test").status(), StatusCode::kOutOfMemory,
                         "symmetric heap exhausted: requested=2097152"));
    // The heap is still usable and symmetric.
    const AllocationInfo next = MustAllocate(runtime, 4096);
    EXPECT_EQ(next.offset, 0x140u);
    EXPECT_TRUE(IsOk(runtime.Free(next.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Free(keep.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, InjectedAllocationFailureOnOneRankFailsEveryRank) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    auto faults = std::make_shared<Faults>();
    faults->fail_allocate_call = rank == 0 ? 1 : -1;   // call 0 is the runtime's control block
    ASSERT_TRUE(IsOk(runtime.Init(TestConfig(), std::make_unique<FaultyDevice>(faults), bootstrap)));
    const Result<AllocationInfo> result = runtime.Allocate(4096, 0, "test");
    if (rank == 0) {
      EXPECT_TRUE(IsError(result.status(), StatusCode::kOutOfMemory, "injected allocation failure: call=1"));
    } else {
      EXPECT_TRUE(IsError(result.status(), StatusCode::kOutOfMemory,
                          "symmetric allocation failed on another rank: rank=0 status=OUT_OF_MEMORY op=Empty "
                          "sequence=1 bytes=4096 alignment=64 offset=0x0"));
    }
    EXPECT_TRUE(runtime.Snapshot().active.empty());
    EXPECT_EQ(runtime.Snapshot().allocated, 0u);
    const AllocationInfo a = MustAllocate(runtime, 4096);
    EXPECT_EQ(a.offset, 0x100u);   // rank 1 gave its block back
    EXPECT_TRUE(IsOk(runtime.Free(a.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST_P(RuntimeRanksTest, AlignmentMustBeAPowerOfTwo) {
  RunRanks(GetParam(), [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    EXPECT_TRUE(IsError(runtime.Allocate(64, 48, "test").status(), StatusCode::kInvalidArgument,
                        "`alignment` must be a power of two, but got 48"));
    EXPECT_TRUE(IsError(runtime.Allocate(64, std::size_t{4} << 20, "test").status(), StatusCode::kInvalidArgument,
                        "`alignment` must be at most 2097152 (2 MiB), but got 4194304"));
    EXPECT_TRUE(runtime.Snapshot().active.empty());
    const AllocationInfo small = MustAllocate(runtime, 1, 0);   // 0: the default alignment
    EXPECT_EQ(small.offset % 64, 0u);
    EXPECT_EQ(small.reserved, 64u);
    const AllocationInfo page = MustAllocate(runtime, 64, 4096);
    EXPECT_EQ(page.offset % 4096, 0u);
    EXPECT_EQ(page.base % 4096, 0u);
    EXPECT_TRUE(IsOk(runtime.Free(page.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Free(small.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Free errors, leaks, accounting.

TEST(RuntimeTest, FreeOfAnUnknownOrFreedIdIsAStateError) {
  RunRanks(2, [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    const std::uint64_t unknown = std::uint64_t{1} << 60;
    const Status missing = runtime.Free(unknown, "test");
    EXPECT_TRUE(IsError(missing, StatusCode::kStateError,
                        "allocation is not registered: allocation_id=" + std::to_string(unknown)));
    EXPECT_EQ(runtime.Snapshot().latest_failure, missing.ToString());
    const AllocationInfo a = MustAllocate(runtime, 64);
    ASSERT_TRUE(IsOk(runtime.Free(a.id, "test")));
    const Status twice = runtime.Free(a.id, "test");
    EXPECT_TRUE(IsError(twice, StatusCode::kStateError, "allocation was already freed: allocation_id=" + std::to_string(a.id)));
    EXPECT_EQ(runtime.Snapshot().latest_failure, twice.ToString());
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, LeaksAndHeapAccounting) {
  RunRanks(2, [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    const AllocationInfo a = MustAllocate(runtime, 1000);   // reserves 1024
    const AllocationInfo b = MustAllocate(runtime, 4096);
    const AllocationInfo c = MustAllocate(runtime, 64);
    EXPECT_EQ(a.reserved, 1024u);
    DebugSnapshot snapshot = runtime.Snapshot();
    EXPECT_EQ(snapshot.allocated, 1024u + 4096u + 64u);
    EXPECT_EQ(snapshot.max_allocated, 1024u + 4096u + 64u);
    EXPECT_EQ(snapshot.remaining, kMiB - ControlBytes(2) - snapshot.allocated);
    EXPECT_EQ(Ids(snapshot.active), (std::vector<std::uint64_t>{a.id, b.id, c.id}));

    // a's last tensor died without free: leaked, not active, still counted.
    runtime.OnStorageReleased(a.id);
    runtime.OnStorageReleased(a.id);                       // a second report changes nothing
    runtime.OnStorageReleased(std::uint64_t{1} << 60);     // unknown ids are ignored
    snapshot = runtime.Snapshot();
    EXPECT_EQ(Ids(snapshot.active), (std::vector<std::uint64_t>{b.id, c.id}));
    ASSERT_EQ(snapshot.leaked.size(), 1u);
    EXPECT_EQ(snapshot.leaked[0].id, a.id);
    EXPECT_EQ(snapshot.leaked[0].state, AllocationState::kLeaked);
    EXPECT_EQ(snapshot.allocated, 1024u + 4096u + 64u);
    // A leaked allocation is no target of the data plane, and cannot be freed.
    char byte = 0;
    EXPECT_TRUE(HasError(runtime.Put(Address(a), &byte, 1, 1, 0, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`dst` must be a symmetric tensor allocated by shmem.empty"));
    EXPECT_TRUE(IsError(runtime.Free(a.id, "test"), StatusCode::kStateError,
                        "allocation is not active: allocation_id=" + std::to_string(a.id) + " state=leaked"));

    // Freeing lowers allocated, never the high-water mark.
    EXPECT_TRUE(IsOk(runtime.Free(b.id, "test")));
    snapshot = runtime.Snapshot();
    EXPECT_EQ(snapshot.allocated, 1024u + 64u);
    EXPECT_EQ(snapshot.max_allocated, 1024u + 4096u + 64u);
    const AllocationInfo d = MustAllocate(runtime, 8192);
    snapshot = runtime.Snapshot();
    EXPECT_EQ(snapshot.allocated, 1024u + 64u + 8192u);
    EXPECT_EQ(snapshot.max_allocated, 1024u + 64u + 8192u);
    EXPECT_TRUE(IsOk(runtime.Free(d.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Free(c.id, "test")));
    EXPECT_EQ(runtime.Snapshot().max_allocated, 1024u + 64u + 8192u);
    // A leak alone does not block shutdown; the next lifecycle starts from zero.
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    snapshot = runtime.Snapshot();
    EXPECT_TRUE(snapshot.leaked.empty());
    EXPECT_EQ(snapshot.allocated, 0u);
    EXPECT_EQ(snapshot.max_allocated, 0u);
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Data plane.

TEST_P(RuntimeRanksTest, PutAndGetBetweenRanks) {
  const int world = GetParam();
  RunRanks(world, [world](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    constexpr std::size_t kBytes = 4096;
    const AllocationInfo buffer = MustAllocate(runtime, kBytes);
    std::memset(Address(buffer), 0, kBytes);
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));

    const int right = (rank + 1) % world;
    const int left = (rank + world - 1) % world;
    const std::vector<unsigned char> mine = Pattern(kBytes, rank);
    ASSERT_TRUE(IsOk(runtime.Put(Address(buffer), mine.data(), kBytes, kBytes, right, kDefaultStream, nullptr)));
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    const std::vector<unsigned char> from_left = Pattern(kBytes, left);
    EXPECT_EQ(std::memcmp(Address(buffer), from_left.data(), kBytes), 0);

    // Get a slice of the right neighbour's buffer, which holds our own pattern now.
    std::vector<unsigned char> got(100);
    ASSERT_TRUE(IsOk(runtime.Get(got.data(), Address(buffer, 1000), 100, 100, right, kDefaultStream, nullptr)));
    EXPECT_TRUE(std::equal(got.begin(), got.end(), mine.begin() + 1000));

    // A put into the middle of the allocation on ourselves.
    const unsigned char marker[3] = {0xAB, 0xCD, 0xEF};
    ASSERT_TRUE(IsOk(runtime.Put(Address(buffer, kBytes - 3), marker, 3, 3, rank, kDefaultStream, nullptr)));
    EXPECT_EQ(std::memcmp(Address(buffer, kBytes - 3), marker, 3), 0);
    EXPECT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    EXPECT_TRUE(IsOk(runtime.Free(buffer.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, DataPlaneArgumentChecks) {
  RunRanks(2, [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    const AllocationInfo buffer = MustAllocate(runtime, 4096);
    std::vector<unsigned char> local(8192, 0x5A);

    // Zero bytes: a no-op, but pe is still checked.
    const std::vector<unsigned char> before(static_cast<unsigned char*>(Address(buffer)),
                                            static_cast<unsigned char*>(Address(buffer)) + 4096);
    EXPECT_TRUE(IsOk(runtime.Put(Address(buffer), local.data(), 0, 0, 1, kDefaultStream, nullptr)));
    EXPECT_TRUE(IsOk(runtime.Get(local.data(), Address(buffer), 0, 0, 0, kDefaultStream, nullptr)));
    EXPECT_TRUE(IsError(runtime.Put(Address(buffer), local.data(), 0, 0, 2, kDefaultStream, nullptr),
                        StatusCode::kInvalidArgument, "`pe` must be in [0, 2), but got 2"));
    EXPECT_TRUE(IsError(runtime.Get(local.data(), Address(buffer), 0, 0, -1, kDefaultStream, nullptr),
                        StatusCode::kInvalidArgument, "`pe` must be in [0, 2), but got -1"));
    EXPECT_TRUE(IsError(runtime.Signal(Address(buffer), SignalWidth::k64, 1, SignalOp::kSet, 5, kDefaultStream),
                        StatusCode::kInvalidArgument, "`pe` must be in [0, 2), but got 5"));

    // Byte counts must agree.
    EXPECT_TRUE(IsError(runtime.Put(Address(buffer), local.data(), 4096, 4095, 1, kDefaultStream, nullptr),
                        StatusCode::kInvalidArgument, "`src` must have as many bytes as `dst` (4096), but got 4095"));
    EXPECT_TRUE(IsError(runtime.Get(local.data(), Address(buffer), 16, 32, 1, kDefaultStream, nullptr),
                        StatusCode::kInvalidArgument, "`src` must have as many bytes as `dst` (16), but got 32"));

    // dst outside the heap, or past the end of its allocation.
    EXPECT_TRUE(IsError(runtime.Put(local.data(), local.data(), 16, 16, 1, kDefaultStream, nullptr),
                        StatusCode::kInvalidArgument,
                        "`dst` must be a symmetric tensor allocated by shmem.empty, but got an address " +
                            Hex(reinterpret_cast<std::uintptr_t>(local.data())) + " outside every active allocation"));
    const std::uintptr_t tail = buffer.base + 4000;
    EXPECT_TRUE(IsError(runtime.Put(Address(buffer, 4000), local.data(), 200, 200, 1, kDefaultStream, nullptr),
                        StatusCode::kInvalidArgument,
                        "`dst` must lie inside its symmetric allocation, but got bytes [" + Hex(tail) + "," +
                            Hex(tail + 200) + ") past the end of allocation_id=" + std::to_string(buffer.id) +
                            " (base=" + Hex(buffer.base) + " bytes=4096)"));
    EXPECT_TRUE(IsError(runtime.Put(Address(buffer), local.data(), 8192, 8192, 1, kDefaultStream, nullptr),
                        StatusCode::kInvalidArgument,
                        "`dst` must lie inside its symmetric allocation, but got bytes [" + Hex(buffer.base) + "," +
                            Hex(buffer.base + 8192) + ") past the end of allocation_id=" + std::to_string(buffer.id) +
                            " (base=" + Hex(buffer.base) + " bytes=4096)"));
    EXPECT_TRUE(HasError(runtime.Get(local.data(), local.data(), 16, 16, 1, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`src` must be a symmetric tensor allocated by shmem.empty"));
    EXPECT_TRUE(HasError(runtime.Signal(local.data(), SignalWidth::k32, 1, SignalOp::kSet, 0, kDefaultStream),
                         StatusCode::kInvalidArgument, "`signal_tensor` must be a symmetric tensor"));
    EXPECT_TRUE(HasError(runtime.WaitSignal(Address(buffer, 4092), SignalWidth::k64, CompareOp::kEq, 0, kDefaultStream),
                         StatusCode::kInvalidArgument, "`signal_tensor` must lie inside its symmetric allocation"));
    EXPECT_EQ(runtime.Snapshot().latest_failure.rfind("INVALID_ARGUMENT: `signal_tensor` must lie inside", 0), 0u);
    // put_with_signal: a broken half of either kind refuses the whole, the data included.
    EXPECT_TRUE(IsError(runtime.PutWithSignal(Address(buffer), local.data(), 16, 16, Address(buffer, 64),
                                              SignalWidth::k64, 1, SignalOp::kSet, 2, kDefaultStream, nullptr),
                        StatusCode::kInvalidArgument, "`pe` must be in [0, 2), but got 2"));
    EXPECT_TRUE(IsError(runtime.PutWithSignal(Address(buffer), local.data(), 16, 8, Address(buffer, 64),
                                              SignalWidth::k64, 1, SignalOp::kSet, 1, kDefaultStream, nullptr),
                        StatusCode::kInvalidArgument, "`src` must have as many bytes as `dst` (16), but got 8"));
    EXPECT_TRUE(HasError(runtime.PutWithSignal(Address(buffer, 4000), local.data(), 200, 200, Address(buffer, 64),
                                               SignalWidth::k64, 1, SignalOp::kSet, 1, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`dst` must lie inside its symmetric allocation"));
    EXPECT_TRUE(HasError(runtime.PutWithSignal(Address(buffer), local.data(), 16, 16, local.data(), SignalWidth::k64, 1,
                                               SignalOp::kSet, 1, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`signal_tensor` must be a symmetric tensor"));
    EXPECT_TRUE(HasError(runtime.PutWithSignal(Address(buffer), local.data(), 16, 16, Address(buffer, 4092),
                                               SignalWidth::k64, 1, SignalOp::kAdd, 1, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`signal_tensor` must lie inside its symmetric allocation"));
    EXPECT_TRUE(HasError(runtime.PutWithSignal(Address(buffer), local.data(), 16, 16, Address(buffer, 68),
                                               SignalWidth::k64, 1, SignalOp::kAdd, 1, kDefaultStream, nullptr),
                         StatusCode::kInvalidArgument, "`signal_tensor` must be aligned to 8 bytes"));
    // Nothing was written by any rejected call.
    EXPECT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    EXPECT_EQ(std::memcmp(Address(buffer), before.data(), 4096), 0);
    EXPECT_TRUE(IsOk(runtime.Free(buffer.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, SignalsAcrossRanks) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    const AllocationInfo signals = MustAllocate(runtime, 64);
    auto* wide = static_cast<std::int64_t*>(Address(signals, 0));
    auto* narrow = static_cast<std::int32_t*>(Address(signals, 8));
    *wide = 0;
    *narrow = 0;
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    const std::int64_t big = (std::int64_t{1} << 40) + 5;
    if (rank == 1) {
      // Three adds wake rank 0's wait on the 32-bit signal; a set of a value beyond 32 bits on the 64-bit one.
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(IsOk(runtime.Signal(narrow, SignalWidth::k32, 1, SignalOp::kAdd, 0, kDefaultStream)));
      }
      EXPECT_TRUE(IsOk(runtime.Signal(wide, SignalWidth::k64, big, SignalOp::kSet, 0, kDefaultStream)));
      EXPECT_TRUE(IsOk(runtime.Signal(wide, SignalWidth::k64, -(std::int64_t{1} << 41), SignalOp::kAdd, 0,
                                      kDefaultStream)));
      // put_with_signal: 32 bytes into rank 0's copy, announced by a set of another 32-bit signal.
      const std::vector<unsigned char> bytes(32, 0xC3);
      EXPECT_TRUE(IsOk(runtime.PutWithSignal(Address(signals, 32), bytes.data(), 32, 32, Address(signals, 16),
                                             SignalWidth::k32, 100, SignalOp::kSet, 0, kDefaultStream, nullptr)));
    } else {
      EXPECT_TRUE(IsOk(runtime.WaitSignal(narrow, SignalWidth::k32, CompareOp::kGe, 3, kDefaultStream)));
      EXPECT_TRUE(IsOk(runtime.WaitSignal(wide, SignalWidth::k64, CompareOp::kLt, 0, kDefaultStream)));
      EXPECT_EQ(*narrow, 3);
      EXPECT_EQ(*wide, big - (std::int64_t{1} << 41));
      EXPECT_TRUE(IsOk(runtime.WaitSignal(Address(signals, 16), SignalWidth::k32, CompareOp::kEq, 100,
                                          kDefaultStream)));
      EXPECT_EQ(*static_cast<unsigned char*>(Address(signals, 32)), 0xC3);
      EXPECT_EQ(*static_cast<unsigned char*>(Address(signals, 63)), 0xC3);
    }
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    if (rank == 1) {
      EXPECT_EQ(*narrow, 0);   // nobody signalled rank 1
      EXPECT_EQ(*wide, 0);
    }
    EXPECT_TRUE(IsOk(runtime.Free(signals.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, WaitSignalEveryCompareOp) {
  RunRanks(1, [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap, TestConfig(kMiB, 0.01))));
    const AllocationInfo signals = MustAllocate(runtime, 64);
    struct Case {
      CompareOp cmp;
      bool below, equal, above;   // outcome against value - 1, value, value + 1
    };
    const Case cases[] = {
        {CompareOp::kEq, false, true, false}, {CompareOp::kNe, true, false, true},
        {CompareOp::kGt, true, false, false}, {CompareOp::kGe, true, true, false},
        {CompareOp::kLt, false, false, true}, {CompareOp::kLe, false, true, true},
    };
    for (SignalWidth width : {SignalWidth::k32, SignalWidth::k64}) {
      const std::int64_t value = width == SignalWidth::k32 ? -7 : (std::int64_t{3} << 33);
      ASSERT_TRUE(IsOk(runtime.Signal(Address(signals), width, value, SignalOp::kSet, 0, kDefaultStream)));
      for (const Case& c : cases) {
        const std::int64_t against[3] = {value - 1, value, value + 1};
        const bool expected[3] = {c.below, c.equal, c.above};
        for (int i = 0; i < 3; ++i) {
          SCOPED_TRACE(std::string("cmp=") + CompareOpName(c.cmp) + " width=" +
                       std::to_string(static_cast<int>(width)) + " against=" + std::to_string(against[i]));
          const Status status = runtime.WaitSignal(Address(signals), width, c.cmp, against[i], kDefaultStream);
          if (expected[i]) {
            EXPECT_TRUE(IsOk(status));
          } else {
            EXPECT_TRUE(HasError(status, StatusCode::kTimeout,
                                 std::string(" cmp=") + CompareOpName(c.cmp) + " expected=" +
                                     std::to_string(against[i]) + " observed=" + std::to_string(value) +
                                     " timeout_sec=0.01"));
          }
        }
      }
    }
    EXPECT_TRUE(IsOk(runtime.Free(signals.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, WaitSignalTimesOutWithExpectedAndObserved) {
  RunRanks(1, [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap, TestConfig(kMiB, 0.2))));
    const AllocationInfo signals = MustAllocate(runtime, 64);
    ASSERT_TRUE(IsOk(runtime.Signal(Address(signals, 8), SignalWidth::k32, 3, SignalOp::kSet, 0, kDefaultStream)));
    const Status status = runtime.WaitSignal(Address(signals, 8), SignalWidth::k32, CompareOp::kEq, 5, kDefaultStream);
    const std::uintptr_t address = signals.base + 8;
    EXPECT_TRUE(IsError(status, StatusCode::kTimeout,
                        "signal wait timed out: signal=" + Hex(address) + " heap_offset=" + Hex(signals.offset + 8) +
                            " cmp=eq expected=5 observed=3 timeout_sec=0.2"));
    EXPECT_EQ(runtime.Snapshot().latest_failure, status.ToString());
    EXPECT_TRUE(IsOk(runtime.Free(signals.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, AllocationTimeoutNamesTheCollective) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap, TestConfig(kMiB, 0.2))));
    if (rank == 0) {   // rank 1 never allocates
      Result<AllocationInfo> info = runtime.Allocate(4096, 0, "test");
      EXPECT_EQ(info.status().code(), StatusCode::kTimeout);
      EXPECT_TRUE(Contains(info.status().message(),
                           "collective check did not complete on every rank: rank=0 op=Empty sequence=1 bytes=4096 "
                           "alignment=64"));
      EXPECT_TRUE(Contains(info.status().message(), "(barrier timed out: epoch=2"));
      EXPECT_TRUE(runtime.Snapshot().active.empty());   // nothing half-allocated on the rank that gave up
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
  });
}

TEST(RuntimeTest, MisalignedSignalsAndOverlappingAllGatherInputsAreRejected) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap, TestConfig(4 * kMiB))));
    const AllocationInfo buffer = MustAllocate(runtime, 256);
    void* odd = Address(buffer, 2);
    const std::string misaligned = "`signal_tensor` must be aligned to 4 bytes, but got address " +
                                   Hex(reinterpret_cast<std::uintptr_t>(odd));
    EXPECT_TRUE(IsError(runtime.Signal(odd, SignalWidth::k32, 1, SignalOp::kSet, 0, kDefaultStream),
                        StatusCode::kInvalidArgument, misaligned));
    EXPECT_TRUE(IsError(runtime.WaitSignal(odd, SignalWidth::k32, CompareOp::kEq, 1, kDefaultStream),
                        StatusCode::kInvalidArgument, misaligned));
    // The input is the other rank's part of the output: peers would overwrite it while it is read.
    auto team = runtime.CreateTeam({0, 1}, bootstrap);
    ASSERT_TRUE(team.ok()) << team.status().ToString();
    const std::size_t other_slot = static_cast<std::size_t>(1 - rank) * 128;
    // Every member fails with rank 0's refusal (the lowest group rank that refused).
    EXPECT_TRUE(IsError(runtime.AllGather(team.value(), Address(buffer), 256, Address(buffer, other_slot), 128,
                                          ElementType{}, kDefaultStream, nullptr),
                        StatusCode::kInvalidArgument,
                        "`input` must not overlap `output` except as this rank's own part (offset 0), but got an "
                        "input at offset 128 of the output" + RefusedByRankZero("all_gather", 2)));
    EXPECT_TRUE(IsOk(runtime.Free(buffer.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, BarrierTimeoutNamesTheMissingRank) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap, TestConfig(kMiB, 0.2))));
    if (rank == 0) {
      // Init passed barrier 1; rank 1 does not come to barrier 2 in time.
      EXPECT_TRUE(IsError(runtime.Barrier(kDefaultStream), StatusCode::kTimeout,
                          "barrier timed out: epoch=2 expected_arrivals=2 observed_arrivals=1 missing_ranks=[1] "
                          "timeout_sec=0.2"));
    }
    ASSERT_TRUE(IsOk(bootstrap.Barrier()));
    // Rank 1 arrives late and completes barrier 2 on its own; both ranks agree again from here on.
    if (rank == 1) {
      EXPECT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    }
    EXPECT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST_P(RuntimeRanksTest, AllGather) {
  const int world = GetParam();
  RunRanks(world, [world](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap, TestConfig(4 * kMiB))));
    std::vector<int> pes;
    for (int pe = 0; pe < world; ++pe) pes.push_back(pe);
    auto team = runtime.CreateTeam(pes, bootstrap);
    ASSERT_TRUE(team.ok()) << team.status().ToString();
    constexpr std::size_t kBlock = 1000;
    const std::size_t total = kBlock * static_cast<std::size_t>(world);
    const AllocationInfo output = MustAllocate(runtime, total);
    std::memset(Address(output), 0, total);
    std::vector<unsigned char> expected;
    for (int r = 0; r < world; ++r) {
      const std::vector<unsigned char> block = Pattern(kBlock, r);
      expected.insert(expected.end(), block.begin(), block.end());
    }
    const ElementType bytes{"uint8", 1, true, DataType::kUInt8};

    const std::vector<unsigned char> input = Pattern(kBlock, rank);
    ASSERT_TRUE(IsOk(runtime.AllGather(team.value(), Address(output), total, input.data(), kBlock, bytes, kDefaultStream,
                                       nullptr)));
    EXPECT_EQ(std::memcmp(Address(output), expected.data(), total), 0);

    // In place: the input is our own block of the output.
    std::memset(Address(output), 0, total);
    std::memcpy(Address(output, static_cast<std::size_t>(rank) * kBlock), input.data(), kBlock);
    ASSERT_TRUE(IsOk(runtime.AllGather(team.value(), Address(output), total,
                                       Address(output, static_cast<std::size_t>(rank) * kBlock), kBlock, bytes,
                                       kDefaultStream, nullptr)));
    EXPECT_EQ(std::memcmp(Address(output), expected.data(), total), 0);

    // Sizes must match; zero bytes are a no-op.
    EXPECT_TRUE(IsError(runtime.AllGather(team.value(), Address(output), total, input.data(), kBlock - 1, bytes,
                                          kDefaultStream, nullptr),
                        StatusCode::kInvalidArgument,
                        "`output` must have group_size * input bytes (" + std::to_string(world) + " * 999 = " +
                            std::to_string(999 * world) + "), but got " + std::to_string(total) +
                            RefusedByRankZero("all_gather", world)));
    EXPECT_TRUE(IsOk(runtime.AllGather(team.value(), Address(output), 0, input.data(), 0, bytes, kDefaultStream, nullptr)));
    EXPECT_EQ(std::memcmp(Address(output), expected.data(), total), 0);
    EXPECT_TRUE(IsOk(runtime.Free(output.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Transfer chunking.

TEST(RuntimeTest, TransfersAreSplitAtTheDeviceLimit) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    auto faults = std::make_shared<Faults>();
    faults->max_transfer_bytes = 1000;
    ASSERT_TRUE(IsOk(runtime.Init(TestConfig(), std::make_unique<FaultyDevice>(faults), bootstrap)));
    const AllocationInfo buffer = MustAllocate(runtime, 4096);
    std::memset(Address(buffer), 0, 4096);
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    (void)faults->TakeTransfers();

    const std::vector<unsigned char> data = Pattern(4096, 9);
    if (rank == 0) {
      ASSERT_TRUE(IsOk(runtime.Put(Address(buffer), data.data(), 4096, 4096, 1, kDefaultStream, nullptr)));
      const std::vector<Transfer> puts = faults->TakeTransfers();
      ASSERT_EQ(puts.size(), 5u);
      const std::size_t sizes[5] = {1000, 1000, 1000, 1000, 96};
      for (std::size_t i = 0; i < puts.size(); ++i) {
        EXPECT_TRUE(puts[i].put);
        EXPECT_EQ(puts[i].symmetric, buffer.base + i * 1000) << i;
        EXPECT_EQ(puts[i].bytes, sizes[i]) << i;
        EXPECT_EQ(puts[i].pe, 1);
      }
    }
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    if (rank == 1) {
      EXPECT_EQ(std::memcmp(Address(buffer), data.data(), 4096), 0);
      // Get back from rank 0 (zeros) in chunks too.
      std::vector<unsigned char> got(2500, 0xFF);
      ASSERT_TRUE(IsOk(runtime.Get(got.data(), Address(buffer, 1), 2500, 2500, 0, kDefaultStream, nullptr)));
      EXPECT_EQ(std::count(got.begin(), got.end(), 0), 2500);
      const std::vector<Transfer> gets = faults->TakeTransfers();
      ASSERT_EQ(gets.size(), 3u);
      EXPECT_FALSE(gets[0].put);
      EXPECT_EQ(gets[2].symmetric, buffer.base + 1 + 2000);
      EXPECT_EQ(gets[2].bytes, 500u);
    }
    EXPECT_TRUE(IsOk(runtime.Free(buffer.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, CheckRecordsMoveHeapToHeapAndTheHostOnlyCopiesLocally) {
  // The heap may be device memory: a check writes this rank's record into its own slot with one local copy, puts it
  // from there into every peer's slot (symmetric memory on both sides), and reads every record with one local copy.
  constexpr int kWorld = 3;
  RunRanks(kWorld, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    auto faults = std::make_shared<Faults>();
    ASSERT_TRUE(IsOk(runtime.Init(TestConfig(), std::make_unique<FaultyDevice>(faults), bootstrap)));
    EXPECT_EQ(faults->copies_to_heap, 1);   // Init clears the records through the device
    EXPECT_EQ(faults->copies_from_heap, 0);
    (void)faults->TakeTransfers();
    const std::uintptr_t control = runtime.Snapshot().heap_base;   // the records are the first allocation
    const AllocationInfo buffer = MustAllocate(runtime, 256);
    const std::vector<Transfer> puts = faults->TakeTransfers();
    ASSERT_EQ(puts.size(), static_cast<std::size_t>(kWorld - 1));
    std::vector<int> pes;
    for (const Transfer& put : puts) {
      EXPECT_TRUE(put.put);
      EXPECT_EQ(put.bytes, 64u);   // one record
      // Slot 1 (sequence 1), this rank's record.
      EXPECT_EQ(put.symmetric, control + ControlBytes(kWorld) / 2 + static_cast<std::size_t>(rank) * 64);
      pes.push_back(put.pe);
    }
    std::sort(pes.begin(), pes.end());
    std::vector<int> peers;
    for (int pe = 0; pe < kWorld; ++pe) {
      if (pe != rank) peers.push_back(pe);
    }
    EXPECT_EQ(pes, peers);
    EXPECT_EQ(faults->copies_to_heap, 2);
    EXPECT_EQ(faults->copies_from_heap, 1);
    EXPECT_TRUE(IsOk(runtime.Free(buffer.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
    EXPECT_EQ(faults->copies_to_heap, 4);
    EXPECT_EQ(faults->copies_from_heap, 3);
  });
}

TEST(RuntimeTest, NoDeviceTransferExceedsTheLimitInternalOnesIncluded) {
  RunRanks(4, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    auto faults = std::make_shared<Faults>();
    faults->max_transfer_bytes = 100;
    ASSERT_TRUE(IsOk(runtime.Init(TestConfig(4 * kMiB), std::make_unique<FaultyDevice>(faults), bootstrap)));
    auto team = runtime.CreateTeam({0, 1, 2, 3}, bootstrap);
    ASSERT_TRUE(team.ok()) << team.status().ToString();
    const AllocationInfo buffer = MustAllocate(runtime, 400 * 4);   // the allocation check exchanges records
    const std::vector<unsigned char> input = Pattern(400, rank);
    ASSERT_TRUE(IsOk(runtime.AllGather(team.value(), Address(buffer), 1600, input.data(), 400,
                                       ElementType{"uint8", 1, true, DataType::kUInt8}, kDefaultStream, nullptr)));
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(std::memcmp(Address(buffer, 400 * static_cast<std::size_t>(r)), Pattern(400, r).data(), 400), 0);
    }
    EXPECT_TRUE(IsOk(runtime.Free(buffer.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
    EXPECT_FALSE(faults->transfers.empty());
    EXPECT_LE(faults->largest_transfer, 100u);
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Streams.

TEST(RuntimeTest, StreamRunsPutsAndSignalsInOrder) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    constexpr std::size_t kBytes = 64 * 1024;
    const AllocationInfo data = MustAllocate(runtime, kBytes);
    const AllocationInfo flag = MustAllocate(runtime, 8);
    std::memset(Address(data), 0, kBytes);
    *static_cast<std::int64_t*>(Address(flag)) = 0;
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    if (rank == 0) {
      Result<StreamHandle> stream = runtime.CreateStream();
      ASSERT_TRUE(stream.ok()) << stream.status().ToString();
      EXPECT_NE(stream.value(), kDefaultStream);
      auto payload = std::make_shared<std::vector<unsigned char>>(Pattern(kBytes, 3));
      // Four puts of a quarter each, then the signal: the peer must see every byte once it sees the signal.
      for (std::size_t q = 0; q < 4; ++q) {
        ASSERT_TRUE(IsOk(runtime.Put(Address(data, q * kBytes / 4), payload->data() + q * kBytes / 4, kBytes / 4,
                                     kBytes / 4, 1, stream.value(), payload)));
      }
      ASSERT_TRUE(IsOk(runtime.Signal(Address(flag), SignalWidth::k64, 1, SignalOp::kSet, 1, stream.value())));
      payload.reset();   // the stream keeps it alive
      EXPECT_TRUE(IsOk(runtime.SynchronizeStream(stream.value())));
      EXPECT_TRUE(IsOk(runtime.DestroyStream(stream.value())));
      EXPECT_TRUE(HasError(runtime.SynchronizeStream(stream.value()), StatusCode::kInvalidArgument,
                           "`stream` must be a live stream of the host device, but got handle " + Hex(stream.value())));
    } else {
      ASSERT_TRUE(IsOk(runtime.WaitSignal(Address(flag), SignalWidth::k64, CompareOp::kEq, 1, kDefaultStream)));
      EXPECT_EQ(std::memcmp(Address(data), Pattern(kBytes, 3).data(), kBytes), 0);
    }
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    EXPECT_TRUE(IsOk(runtime.Free(flag.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Free(data.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, SynchronizeStreamReportsTheFirstErrorAndSkipsTheRest) {
  RunRanks(1, [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap, TestConfig(kMiB, 0.2))));
    const AllocationInfo signals = MustAllocate(runtime, 64);
    const AllocationInfo buffer = MustAllocate(runtime, 64);
    std::memset(Address(signals), 0, 64);
    std::memset(Address(buffer), 0, 64);
    Result<StreamHandle> stream = runtime.CreateStream();
    ASSERT_TRUE(stream.ok());
    const std::int64_t value = 42;
    // The wait times out; the put and the signal behind it must not run.
    ASSERT_TRUE(IsOk(runtime.WaitSignal(Address(signals), SignalWidth::k64, CompareOp::kEq, 1, stream.value())));
    ASSERT_TRUE(IsOk(runtime.Put(Address(buffer), &value, 8, 8, 0, stream.value(), nullptr)));
    ASSERT_TRUE(IsOk(runtime.Signal(Address(signals, 8), SignalWidth::k64, 7, SignalOp::kSet, 0, stream.value())));
    const Status status = runtime.SynchronizeStream(stream.value());
    EXPECT_TRUE(HasError(status, StatusCode::kTimeout, "signal wait timed out: signal=" + Hex(signals.base)));
    EXPECT_TRUE(HasError(status, StatusCode::kTimeout, " cmp=eq expected=1 observed=0 timeout_sec=0.2"));
    EXPECT_EQ(runtime.Snapshot().latest_failure, status.ToString());
    EXPECT_EQ(*static_cast<std::int64_t*>(Address(buffer)), 0);
    EXPECT_EQ(*static_cast<std::int64_t*>(Address(signals, 8)), 0);
    // The error was reported once; the stream runs new work again.
    EXPECT_TRUE(IsOk(runtime.SynchronizeStream(stream.value())));
    ASSERT_TRUE(IsOk(runtime.Put(Address(buffer), &value, 8, 8, 0, stream.value(), nullptr)));
    EXPECT_TRUE(IsOk(runtime.SynchronizeStream(stream.value())));
    EXPECT_EQ(*static_cast<std::int64_t*>(Address(buffer)), 42);
    EXPECT_TRUE(IsOk(runtime.DestroyStream(stream.value())));
    EXPECT_TRUE(IsOk(runtime.Free(buffer.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Free(signals.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, StreamWaitStreamOrdersTwoStreams) {
  RunRanks(1, [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    const AllocationInfo go = MustAllocate(runtime, 8);
    const AllocationInfo buffer = MustAllocate(runtime, 8);
    *static_cast<std::int64_t*>(Address(go)) = 0;
    *static_cast<std::int64_t*>(Address(buffer)) = 0;
    Result<StreamHandle> first = runtime.CreateStream();
    Result<StreamHandle> second = runtime.CreateStream();
    ASSERT_TRUE(first.ok() && second.ok());
    const std::int64_t value = 77;
    // first: wait for `go`, then write the buffer. second: after first, read the buffer.
    ASSERT_TRUE(IsOk(runtime.WaitSignal(Address(go), SignalWidth::k64, CompareOp::kEq, 1, first.value())));
    ASSERT_TRUE(IsOk(runtime.Put(Address(buffer), &value, 8, 8, 0, first.value(), nullptr)));
    ASSERT_TRUE(IsOk(runtime.StreamWaitStream(second.value(), first.value())));
    std::int64_t seen = -1;
    ASSERT_TRUE(IsOk(runtime.Get(&seen, Address(buffer), 8, 8, 0, second.value(), nullptr)));
    // Work enqueued on `first` after the wait_stream call is not waited for.
    ASSERT_TRUE(IsOk(runtime.Signal(Address(go), SignalWidth::k64, 1, SignalOp::kSet, 0, kDefaultStream)));
    EXPECT_TRUE(IsOk(runtime.SynchronizeStream(second.value())));
    EXPECT_EQ(seen, 77);
    EXPECT_TRUE(IsOk(runtime.SynchronizeStream(first.value())));
    // The default stream waiting on a stream, and a stream waiting on the default stream.
    std::int64_t again = -1;
    ASSERT_TRUE(IsOk(runtime.Get(&again, Address(buffer), 8, 8, 0, first.value(), nullptr)));
    EXPECT_TRUE(IsOk(runtime.StreamWaitStream(kDefaultStream, first.value())));
    EXPECT_EQ(again, 77);
    EXPECT_TRUE(IsOk(runtime.StreamWaitStream(first.value(), kDefaultStream)));
    EXPECT_TRUE(IsOk(runtime.DestroyStream(first.value())));
    EXPECT_TRUE(IsOk(runtime.DestroyStream(second.value())));
    EXPECT_TRUE(IsOk(runtime.Free(buffer.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Free(go.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeTest, BarrierAndAllGatherOnAStream) {
  RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap, TestConfig(4 * kMiB))));
    auto team = runtime.CreateTeam({0, 1}, bootstrap);
    ASSERT_TRUE(team.ok()) << team.status().ToString();
    const AllocationInfo output = MustAllocate(runtime, 128);
    Result<StreamHandle> stream = runtime.CreateStream();
    ASSERT_TRUE(stream.ok());
    auto input = std::make_shared<std::vector<unsigned char>>(Pattern(64, rank));
    ASSERT_TRUE(IsOk(runtime.AllGather(team.value(), Address(output), 128, input->data(), 64,
                                       ElementType{"uint8", 1, true, DataType::kUInt8}, stream.value(), input)));
    ASSERT_TRUE(IsOk(runtime.Barrier(stream.value())));
    ASSERT_TRUE(IsOk(runtime.SynchronizeStream(stream.value())));
    EXPECT_EQ(std::memcmp(Address(output), Pattern(64, 0).data(), 64), 0);
    EXPECT_EQ(std::memcmp(Address(output, 64), Pattern(64, 1).data(), 64), 0);
    EXPECT_TRUE(IsOk(runtime.DestroyStream(stream.value())));
    EXPECT_TRUE(IsOk(runtime.Free(output.id, "test")));
    EXPECT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

}  // namespace
}  // namespace hp::shmem
