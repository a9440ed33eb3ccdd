// Waiting on a word of shared memory: spin policy, futex sleep and wake, timeouts.
#include "runtime/host/wait.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "runtime/host/atomics.h"
#include "runtime/host/shm_segment.h"

namespace hp::shmem::host {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Only the futex: no spinning, no yielding.
SpinPolicy SleepOnly(milliseconds slice) {
  SpinPolicy policy;
  policy.spin = std::chrono::nanoseconds(0);
  policy.yields = 0;
  policy.sleep_slice = slice;
  return policy;
}

// Spins (yielding) until `sleepers` shows a sleeping waiter; false after 10 s.
bool AwaitSleeper(const std::uint32_t* sleepers) {
  const auto deadline = Clock::now() + seconds(10);
  while (LoadSeqCst(sleepers) == 0) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(SpinPolicyTest, DefaultsSpinBeforeSleeping) {
  const SpinPolicy policy;
  EXPECT_EQ(policy.spin, std::chrono::microseconds(200));
  EXPECT_EQ(policy.spin_before_yielding, std::chrono::microseconds(5));
  EXPECT_EQ(policy.yields, 4);
  EXPECT_EQ(policy.sleep_slice, milliseconds(50));
}

TEST(SpinPolicyTest, NoSpinningButYieldingWhenRanksOutnumberCores) {
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  ASSERT_GT(cores, 0);
  const SpinPolicy crowded = SpinPolicy::For(static_cast<int>(cores) + 1);
  EXPECT_EQ(crowded.spin.count(), 0);
  EXPECT_EQ(crowded.yields, 50);   // hand the core to the peer rather than sleep
  EXPECT_EQ(crowded.sleep_slice, milliseconds(50));

  const SpinPolicy fits = SpinPolicy::For(static_cast<int>(cores));
  EXPECT_EQ(fits.spin, std::chrono::microseconds(200));
  EXPECT_EQ(fits.yields, 4);
  const SpinPolicy one = SpinPolicy::For(1);
  EXPECT_GT(one.spin.count(), 0);
}

TEST(WaitUntilTest, ReturnsAtOnceWhenAlreadyDone) {
  alignas(8) std::uint32_t word = 7;
  std::uint32_t sleepers = 0;
  int described = 0;
  const Status status = WaitUntil(
      &word, &sleepers, [&] { return word == 7; }, SleepOnly(milliseconds(10)), Clock::now() + seconds(10),
      [&] {
        ++described;
        return std::string("unused");
      });
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(sleepers, 0u);
  EXPECT_EQ(described, 0);
}

TEST(WaitUntilTest, FutexWaiterIsWokenByAnotherThread) {
  alignas(8) std::uint32_t word = 0;
  std::uint32_t sleepers = 0;
  std::uint32_t sleepers_seen = 0;
  std::thread waker([&] {
    // Change the word only once the waiter announced itself: it then sleeps in (or is entering) the futex.
    if (AwaitSleeper(&sleepers)) sleepers_seen = LoadSeqCst(&sleepers);
    StoreSeqCst(&word, std::uint32_t{1});
    WakeIfSleeping(&word, &sleepers);
  });
  // One sleep slice as long as the deadline: without the wake the waiter would sleep the full 10 s.
  const auto start = Clock::now();
  const Status status = WaitUntil(
      &word, &sleepers, [&] { return LoadAcquire(&word) == 1; }, SleepOnly(milliseconds(10000)),
      start + seconds(10), [] { return std::string("never woken"); });
  const auto waited = Clock::now() - start;
  waker.join();
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(sleepers_seen, 1u);   // the futex path was taken
  EXPECT_EQ(sleepers, 0u);        // and the waiter left it again
  // A bound against a lost wake-up (it would wait the whole 10 s), not a performance check.
  EXPECT_LT(waited, seconds(5));
}

TEST(WaitUntilTest, SleepSlicesNoticeAChangeWithoutAWake) {
  alignas(8) std::uint32_t word = 0;
  std::uint32_t sleepers = 0;
  std::thread changer([&] {
    AwaitSleeper(&sleepers);
    StoreSeqCst(&word, std::uint32_t{2});   // no wake: the next slice boundary must see it
  });
  const Status status = WaitUntil(
      &word, &sleepers, [&] { return LoadAcquire(&word) == 2; }, SleepOnly(milliseconds(1)), Clock::now() + seconds(10),
      [] { return std::string("not seen"); });
  changer.join();
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(sleepers, 0u);
}

TEST(WaitUntilTest, SpinningWaiterSeesAChange) {
  alignas(8) std::uint64_t counter = 0;   // waits on the low half of a 64-bit word, as the barrier does
  std::uint32_t sleepers = 0;
  std::thread changer([&] {
    FetchAddSeqCst(&counter, std::uint64_t{3});
    WakeIfSleeping(&counter, &sleepers);
  });
  const Status status = WaitUntil(
      &counter, &sleepers, [&] { return LoadAcquire(&counter) >= 3; }, SpinPolicy{}, Clock::now() + seconds(10),
      [] { return std::string("not seen"); });
  changer.join();
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(sleepers, 0u);
}

TEST(WaitUntilTest, TimesOutWithTheDescribedMessage) {
  alignas(8) std::uint32_t word = 0;
  std::uint32_t sleepers = 0;
  int described = 0;
  const Status status = WaitUntil(
      &word, &sleepers, [&] { return LoadAcquire(&word) == 1; }, SleepOnly(milliseconds(5)),
      Clock::now() + milliseconds(20), [&] {
        ++described;
        return "signal wait timed out: expected=1 observed=" + std::to_string(LoadAcquire(&word));
      });
  EXPECT_EQ(status.code(), StatusCode::kTimeout);
  EXPECT_EQ(status.message(), "signal wait timed out: expected=1 observed=0");
  EXPECT_EQ(described, 1);
  EXPECT_EQ(sleepers, 0u);
}

std::atomic<int> g_interrupt_asks{0};
bool InterruptOnThirdAsk(bool) { return ++g_interrupt_asks >= 3; }

TEST(WaitUntilTest, AnInterruptCheckEndsTheWaitLongBeforeItsTimeout) {
  alignas(8) std::uint32_t word = 0;
  std::uint32_t sleepers = 0;
  g_interrupt_asks = 0;
  SetInterruptCheck(&InterruptOnThirdAsk);
  const auto started = Clock::now();
  const Status status = WaitUntil(
      &word, &sleepers, [&] { return LoadAcquire(&word) == 1; }, SleepOnly(milliseconds(5)),
      Clock::now() + seconds(30), [] { return std::string("never described"); });
  SetInterruptCheck(nullptr);
  EXPECT_EQ(status.code(), StatusCode::kInterrupted);
  EXPECT_EQ(status.message(), "wait interrupted by a signal to the process (e.g. Ctrl-C)");
  EXPECT_EQ(g_interrupt_asks.load(), 3);   // asked once per kernel sleep
  EXPECT_LT(Clock::now() - started, seconds(10));
  EXPECT_EQ(sleepers, 0u);
  EXPECT_FALSE(InterruptRequested());   // removed again
}

std::atomic<int> g_handler_asks{0};
std::atomic<int> g_handler_free_asks{0};
bool CountAsks(bool may_run_handlers) {
  ++(may_run_handlers ? g_handler_asks : g_handler_free_asks);
  return false;
}

TEST(InterruptTest, BlockedRegionsAskWithoutRunningHandlers) {
  SetInterruptCheck(&CountAsks);
  EXPECT_FALSE(InterruptRequested());
  {
    InterruptsBlocked blocked;
    EXPECT_FALSE(InterruptRequested());
    {
      InterruptsBlocked nested;
      EXPECT_FALSE(InterruptRequested());
    }
    EXPECT_FALSE(InterruptRequested());
  }
  EXPECT_FALSE(InterruptRequested());
  SetInterruptCheck(nullptr);
  EXPECT_EQ(g_handler_asks.load(), 2);
  EXPECT_EQ(g_handler_free_asks.load(), 3);
}

TEST(WaitUntilTest, DefaultPolicyTimesOutToo) {
  alignas(8) std::uint32_t word = 0;
  std::uint32_t sleepers = 0;
  const Status status = WaitUntil(
      &word, &sleepers, [] { return false; }, SpinPolicy{}, Clock::now() + milliseconds(10),
      [] { return std::string("barrier timed out"); });
  EXPECT_EQ(status.code(), StatusCode::kTimeout);
  EXPECT_EQ(status.message(), "barrier timed out");
  EXPECT_EQ(sleepers, 0u);
}

TEST(FutexTest, WaitReturnsAtOnceOnAStaleValueAndAfterItsTimeout) {
  alignas(8) std::uint32_t word = 5;
  FutexWait(&word, 4, seconds(10));          // the word no longer holds 4: returns at once
  FutexWait(&word, 5, milliseconds(1));      // holds 5: sleeps until the timeout
  FutexWakeAll(&word);                       // nobody sleeps: harmless
  EXPECT_EQ(word, 5u);
}

TEST(FutexTest, WakeReachesAWaiterThroughAnotherMappingOfTheSameSegment) {
  Result<ShmSegment> created = ShmSegment::Create(4096);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ShmSegment own = std::move(created).value();
  Result<ShmSegment> opened = ShmSegment::Open(own.name(), 4096);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  ShmSegment peer = std::move(opened).value();
  ASSERT_TRUE(own.Unlink().ok());
  ASSERT_NE(own.data(), peer.data());

  auto* word = static_cast<std::uint32_t*>(own.data());
  auto* sleepers = static_cast<std::uint32_t*>(own.data()) + 16;
  auto* peer_word = static_cast<std::uint32_t*>(peer.data());
  auto* peer_sleepers = static_cast<std::uint32_t*>(peer.data()) + 16;
  std::thread waker([&] {
    AwaitSleeper(peer_sleepers);
    StoreSeqCst(peer_word, std::uint32_t{9});
    WakeIfSleeping(peer_word, peer_sleepers);
  });
  const auto start = Clock::now();
  const Status status = WaitUntil(
      word, sleepers, [&] { return LoadAcquire(word) == 9; }, SleepOnly(milliseconds(10000)), start + seconds(10),
      [] { return std::string("never woken"); });
  const auto waited = Clock::now() - start;
  waker.join();
  EXPECT_TRUE(status.ok()) << status.ToString();
  EXPECT_LT(waited, seconds(5));   // a shared (not process-private) futex: the wake crossed mappings
}

}  // namespace
}  // namespace hp::shmem::host
