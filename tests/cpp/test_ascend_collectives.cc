// The collective engine on the ascend device over the CANN fakes: the same cases as on the host device, with a heap
// and tensors the host cannot touch (every access goes through aclrtMemcpy).
#include <gtest/gtest.h>

#include <memory>

#include "acl/acl.h"
#include "collective_cases.h"
#include "fake_cann.h"
#include "runtime/ascend/ascend_device.h"
#include "runtime/logging.h"

namespace hp::shmem {
namespace {

testutil::CollectiveBackend AscendBackend() {
  testutil::CollectiveBackend backend;
  backend.make_device = [] { return std::make_unique<ascend::AscendDevice>(); };
  backend.config = [] {
    Config config;
    config.device = "ascend";
    config.heap_size = 8 * testutil::kMiB;
    config.timeout_sec = 10.0;
    config.log_level = LogLevel::kError;
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
  void SetUp() override { fakes::FakeCann::Reset(); }
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

TEST_P(AscendCollectivesTest, MismatchesFailOnEveryRankAndTheTeamStaysInStep) {
  testutil::RunMismatches(AscendBackend(), GetParam());
}

TEST_P(AscendCollectivesTest, OneStepAgainstStagedFailsWithNothingWritten) {
  testutil::RunOneStepAgainstStaged(AscendBackend(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Ranks, AscendCollectivesTest, ::testing::Values(2, 3));

}  // namespace
}  // namespace hp::shmem
