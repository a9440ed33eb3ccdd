// A device whose allocation is collective (Device::collective_allocation(), as CANN SHMEM's malloc is): the runtime
// agrees on the request and on every rank's CheckAllocate before any rank calls the device, so that no rank is left
// waiting inside the device's own barrier.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "host_forwarding_device.h"
#include "runtime/host/host_device.h"
#include "runtime/runtime.h"
#include "runtime_support.h"
#include "test_support.h"
#include "thread_bootstrap.h"

namespace hp::shmem {
namespace {

using testutil::HasError;
using testutil::IsOk;

// The host device, declared collective, with a CheckAllocate a test can make refuse; counts Allocate calls.
class CollectiveHostDevice final : public testutil::HostForwardingDevice {
 public:
  explicit CollectiveHostDevice(Status* refusal, int* allocations) : refusal_(refusal), allocations_(allocations) {}

  const char* name() const override { return "collective-host"; }
  bool collective_allocation() const override { return true; }
  Status CheckAllocate(std::size_t, std::size_t) const override { return *refusal_; }
  Result<void*> Allocate(std::size_t bytes, std::size_t alignment) override {
    ++*allocations_;
    return host().Allocate(bytes, alignment);
  }

 private:
  Status* refusal_;
  int* allocations_;
};

Status InitCollective(Runtime& runtime, Bootstrap& bootstrap, Status* refusal, int* allocations) {
  Config config;
  config.heap_size = testutil::kMiB;
  config.timeout_sec = 10.0;
  config.log_level = LogLevel::kError;
  return runtime.Init(config, std::make_unique<CollectiveHostDevice>(refusal, allocations), bootstrap);
}

TEST(RuntimeCollectiveAllocationTest, ARefusalOnOneRankIsAgreedBeforeAnyRankAllocates) {
  testutil::RunRanks(3, [](int rank, Bootstrap& bootstrap) {
    Status refusal = Status::Ok();
    int allocations = 0;
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitCollective(runtime, bootstrap, &refusal, &allocations)));
    const int at_init = allocations;   // the runtime's own control block
    if (rank == 1) refusal = OutOfMemory("test refusal: rank=1");
    auto refused = runtime.Allocate(256, 0, "test");
    if (rank == 1) {
      EXPECT_TRUE(HasError(refused.status(), StatusCode::kOutOfMemory, "test refusal: rank=1"));
    } else {
      EXPECT_TRUE(HasError(refused.status(), StatusCode::kOutOfMemory,
                           "symmetric allocation refused on another rank before the device allocated: rank=1 "
                           "status=OUT_OF_MEMORY op=Empty sequence=1 bytes=256 alignment="));
    }
    EXPECT_EQ(allocations, at_init);   // no rank called the device
    refusal = Status::Ok();
    auto agreed = runtime.Allocate(256, 0, "test");
    ASSERT_TRUE(agreed.ok()) << agreed.status().ToString();
    EXPECT_EQ(allocations, at_init + 1);
    ASSERT_TRUE(IsOk(runtime.Free(agreed->id, "test")));
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimeCollectiveAllocationTest, DifferentRequestsAreAMismatchBeforeAnyRankAllocates) {
  testutil::RunRanks(2, [](int rank, Bootstrap& bootstrap) {
    Status refusal = Status::Ok();
    int allocations = 0;
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitCollective(runtime, bootstrap, &refusal, &allocations)));
    const int at_init = allocations;
    auto disagreed = runtime.Allocate(rank == 0 ? 256 : 512, 0, "test");
    EXPECT_TRUE(HasError(disagreed.status(), StatusCode::kMismatch,
                         rank == 0 ? "ranks disagree on a symmetric allocation: rank=0 op=Empty sequence=1 bytes=256"
                                   : "ranks disagree on a symmetric allocation: rank=1 op=Empty sequence=1 bytes=512"));
    EXPECT_EQ(allocations, at_init);
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

}  // namespace
}  // namespace hp::shmem
