// The runtime's logger: stderr lines by default, queued records while a face forwards them.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "runtime/logging.h"

namespace hp::shmem {
namespace {

using std::chrono::milliseconds;

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Logger::SetLevel(LogLevel::kDebug);
    Logger::SetRank(3);
  }
  void TearDown() override {
    if (Logger::Forwarding()) Logger::StopForwarding();
    Logger::SetLevel(LogLevel::kWarning);
    Logger::SetRank(-1);
  }
};

TEST_F(LoggingTest, WritesAWholeLineToStderrByDefault) {
  ::testing::internal::CaptureStderr();
  HP_LOG(kInfo, "team created: team_id=1");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "[hyper_parallel.shmem INFO rank=3] team created: team_id=1\n");
}

TEST_F(LoggingTest, LevelBelowTheThresholdIsNotWritten) {
  Logger::SetLevel(LogLevel::kError);
  ::testing::internal::CaptureStderr();
  HP_LOG(kWarning, "not shown");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST_F(LoggingTest, ForwardedRecordsAreQueuedInOrderAndNotPrinted) {
  Logger::StartForwarding();
  ::testing::internal::CaptureStderr();
  HP_LOG(kDebug, "first");
  HP_LOG(kError, "second");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  auto records = Logger::TakeForwarded();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].level, LogLevel::kDebug);
  EXPECT_EQ(records[0].rank, 3);
  EXPECT_EQ(records[0].message, "first");
  EXPECT_EQ(records[1].level, LogLevel::kError);
  EXPECT_EQ(records[1].message, "second");
  EXPECT_TRUE(Logger::TakeForwarded().empty());
}

TEST_F(LoggingTest, WaitReturnsWhenAnotherThreadQueuesARecord) {
  Logger::StartForwarding();
  std::thread writer([] {
    std::this_thread::sleep_for(milliseconds(50));
    HP_LOG(kWarning, "from a worker");
  });
  EXPECT_TRUE(Logger::WaitForwarded(milliseconds(10000)));
  writer.join();
  auto records = Logger::TakeForwarded();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].message, "from a worker");
}

TEST_F(LoggingTest, WaitEndsAtItsTimeoutWhenNothingCame) {
  Logger::StartForwarding();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(Logger::WaitForwarded(milliseconds(30)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(25));
}

TEST_F(LoggingTest, StopPrintsWhatWasQueuedAndEndsWaits) {
  Logger::StartForwarding();
  HP_LOG(kWarning, "still queued");
  ::testing::internal::CaptureStderr();
  Logger::StopForwarding();
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "[hyper_parallel.shmem WARNING rank=3] still queued\n");
  // Not forwarding: a wait returns at once, whatever its timeout.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(Logger::WaitForwarded(milliseconds(60000)));
  EXPECT_TRUE(Logger::TakeForwarded().empty());
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(30000));
}

TEST_F(LoggingTest, AFullQueueDropsTheOldestAndCountsThem) {
  Logger::StartForwarding();
  const std::size_t extra = 5;
  for (std::size_t i = 0; i < Logger::kForwardedCapacity + extra; ++i) HP_LOG(kInfo, "record " + std::to_string(i));
  auto records = Logger::TakeForwarded();
  ASSERT_EQ(records.size(), Logger::kForwardedCapacity + 1);
  EXPECT_EQ(records[0].level, LogLevel::kWarning);
  EXPECT_EQ(records[0].message.rfind("log records dropped: count=5 capacity=4096", 0), 0u) << records[0].message;
  EXPECT_EQ(records[1].message, "record " + std::to_string(extra));
  EXPECT_EQ(records.back().message, "record " + std::to_string(Logger::kForwardedCapacity + extra - 1));
}

}  // namespace
}  // namespace hp::shmem
