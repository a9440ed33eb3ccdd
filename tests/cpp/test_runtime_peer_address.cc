// Runtime::PeerAddress over thread-ranks: each rank reads and writes every peer's copy through the address it
// gets, and every contract fails by its message (recorded as the latest failure).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "runtime_support.h"
#include "thread_bootstrap.h"

namespace hp::shmem {
namespace {

using namespace testutil;  // NOLINT(build/namespaces): the shared test helpers

// `result` failed as Rejected (runtime_support.h) describes.
::testing::AssertionResult Rejected(const Runtime& runtime, const Result<void*>& result, StatusCode code,
                                    const std::string& message) {
  if (result.ok()) return ::testing::AssertionFailure() << "succeeded; expected " << message;
  return testutil::Rejected(runtime, result.status(), code, message);
}

class RuntimePeerAddressTest : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Ranks, RuntimePeerAddressTest, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& info) { return std::to_string(info.param) + "ranks"; });

TEST_P(RuntimePeerAddressTest, ReadsAndWritesEveryPeersCopy) {
  const int world = GetParam();
  RunRanks(world, [world](int rank, Bootstrap& bootstrap) {
    Runtime runtime;
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    // Slot pe of `inbox` is written by rank pe; `own` holds this rank's id at every element.
    Result<AllocationInfo> own = runtime.Allocate(64 * sizeof(std::int64_t), 0, "test");
    Result<AllocationInfo> inbox = runtime.Allocate(static_cast<std::size_t>(world) * sizeof(std::int64_t), 0, "test");
    ASSERT_TRUE(own.ok() && inbox.ok());
    auto* mine = reinterpret_cast<std::int64_t*>(own->base);
    for (int i = 0; i < 64; ++i) mine[i] = rank * 1000 + i;
    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));

    for (int pe = 0; pe < world; ++pe) {
      // A range in the middle of the allocation resolves to the same offset on the peer.
      Result<void*> peer = runtime.PeerAddress(mine + 10, 20 * sizeof(std::int64_t), pe, "tensor");
      ASSERT_TRUE(peer.ok()) << peer.status().ToString();
      const auto* theirs = static_cast<const std::int64_t*>(peer.value());
      for (int i = 0; i < 20; ++i) EXPECT_EQ(theirs[i], pe * 1000 + 10 + i) << "pe=" << pe << " i=" << i;
      Result<void*> slot = runtime.PeerAddress(reinterpret_cast<std::int64_t*>(inbox->base) + rank,
                                               sizeof(std::int64_t), pe, "tensor");
      ASSERT_TRUE(slot.ok()) << slot.status().ToString();
      *static_cast<std::int64_t*>(slot.value()) = rank + 1;
    }
    // The address of this rank's own copy is the local one.
    Result<void*> self = runtime.PeerAddress(mine, 8, rank, "tensor");
    ASSERT_TRUE(self.ok());
    EXPECT_EQ(self.value(), static_cast<void*>(mine));

    ASSERT_TRUE(IsOk(runtime.Barrier(kDefaultStream)));
    const auto* received = reinterpret_cast<const std::int64_t*>(inbox->base);
    for (int pe = 0; pe < world; ++pe) EXPECT_EQ(received[pe], pe + 1) << "written by pe=" << pe;
    ASSERT_TRUE(IsOk(runtime.Free(inbox->id, "test")));
    ASSERT_TRUE(IsOk(runtime.Free(own->id, "test")));
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

TEST(RuntimePeerAddress, RejectsBadPesRangesAndStatesByMessage) {
  RunRanks(2, [](int, Bootstrap& bootstrap) {
    Runtime runtime;
    std::int64_t local = 0;
    EXPECT_TRUE(Rejected(runtime, runtime.PeerAddress(&local, 8, 0, "tensor"), StatusCode::kStateError,
                         "shmem runtime is not initialised: op=peer_tensor state=uninitialized "
                         "(call acquire_shmem() first)"));
    ASSERT_TRUE(IsOk(InitHost(runtime, bootstrap)));
    Result<AllocationInfo> info = runtime.Allocate(256, 0, "test");
    ASSERT_TRUE(info.ok());
    void* base = reinterpret_cast<void*>(info->base);
    EXPECT_TRUE(Rejected(runtime, runtime.PeerAddress(base, 8, 2, "tensor"), StatusCode::kInvalidArgument,
                         "`pe` must be in [0, 2), but got 2"));
    EXPECT_TRUE(Rejected(runtime, runtime.PeerAddress(base, 8, -1, "tensor"), StatusCode::kInvalidArgument,
                         "`pe` must be in [0, 2), but got -1"));
    Result<void*> outside = runtime.PeerAddress(&local, 8, 1, "tensor");
    ASSERT_FALSE(outside.ok());
    EXPECT_EQ(outside.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(outside.status().message().find("`tensor`"), std::string::npos) << outside.status().ToString();
    Result<void*> past = runtime.PeerAddress(static_cast<char*>(base) + 200, 64, 1, "tensor");
    ASSERT_FALSE(past.ok());
    EXPECT_EQ(past.status().code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(IsOk(runtime.Free(info->id, "test")));
    Result<void*> freed = runtime.PeerAddress(base, 8, 1, "tensor");
    ASSERT_FALSE(freed.ok());
    EXPECT_EQ(freed.status().code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(IsOk(runtime.Shutdown(bootstrap)));
  });
}

}  // namespace
}  // namespace hp::shmem
