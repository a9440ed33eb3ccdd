// HostStream: an ordered worker queue with CUDA-like sticky errors.
#include "runtime/host/host_stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <set>
#include <thread>
#include <vector>

namespace hp::shmem::host {
namespace {

using std::chrono::seconds;

// A gate that tasks wait on; opened at the latest when it goes out of scope, so that a failed assertion cannot
// leave a stream's worker blocked forever. Declare it after the stream: it is destroyed (opened) first.
class Gate {
 public:
  Gate() : opened_(promise_.get_future().share()) {}
  ~Gate() { Open(); }
  void Open() {
    if (!open_) {
      open_ = true;
      promise_.set_value();
    }
  }
  std::shared_future<void> future() const { return opened_; }

 private:
  std::promise<void> promise_;
  std::shared_future<void> opened_;
  bool open_ = false;
};

// Enqueues a task held back by `gate`, then `count` more behind it; each task adds one to `done` when it runs.
void EnqueueGatedCounters(HostStream& stream, const Gate& gate, std::atomic<int>& done, int count) {
  std::shared_future<void> opened = gate.future();
  stream.Enqueue([opened, &done] {
    opened.wait();
    ++done;
    return Status::Ok();
  });
  for (int i = 0; i < count; ++i) {
    stream.Enqueue([&done] {
      ++done;
      return Status::Ok();
    });
  }
}

TEST(HostStreamTest, EmptyStream) {
  HostStream stream;
  EXPECT_EQ(stream.last_ticket(), 0u);
  stream.WaitFor(0);
  EXPECT_TRUE(stream.Synchronize().ok());
}

TEST(HostStreamTest, RunsTasksInOrderWithIncreasingTickets) {
  HostStream stream;
  std::vector<int> order;   // touched by the worker only until Synchronize returns
  for (int i = 0; i < 500; ++i) {
    const std::uint64_t ticket = stream.Enqueue([&order, i] {
      order.push_back(i);
      return Status::Ok();
    });
    EXPECT_EQ(ticket, static_cast<std::uint64_t>(i) + 1);
  }
  EXPECT_EQ(stream.last_ticket(), 500u);
  ASSERT_TRUE(stream.Synchronize().ok());
  ASSERT_EQ(order.size(), 500u);
  for (int i = 0; i < 500; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
}

TEST(HostStreamTest, FirstErrorIsStickyAndLaterTasksAreSkipped) {
  HostStream stream;
  std::atomic<int> ran{0};
  bool third_ran = false;
  bool fourth_ran = false;
  stream.Enqueue([&] {
    ++ran;
    return Status::Ok();
  });
  stream.Enqueue([&] {
    ++ran;
    return Timeout("signal wait timed out: first");
  });
  stream.Enqueue([&] {
    third_ran = true;
    return DeviceError("second");
  });
  stream.Enqueue([&] {
    fourth_ran = true;
    return Status::Ok();
  });
  const Status status = stream.Synchronize();
  EXPECT_EQ(status.code(), StatusCode::kTimeout);
  EXPECT_EQ(status.message(), "signal wait timed out: first");
  EXPECT_EQ(ran.load(), 2);
  EXPECT_FALSE(third_ran);
  EXPECT_FALSE(fourth_ran);
  EXPECT_EQ(stream.last_ticket(), 4u);

  // Reported once; afterwards the stream runs work again.
  EXPECT_TRUE(stream.Synchronize().ok());
  bool fifth_ran = false;
  stream.Enqueue([&] {
    fifth_ran = true;
    return Status::Ok();
  });
  EXPECT_TRUE(stream.Synchronize().ok());
  EXPECT_TRUE(fifth_ran);
}

TEST(HostStreamTest, WaitForReturnsOnceItsTicketRanNotLater) {
  HostStream stream;
  Gate gate;
  std::shared_future<void> opened = gate.future();
  std::atomic<bool> first_ran{false};
  std::atomic<bool> second_ran{false};
  const std::uint64_t first = stream.Enqueue([&] {
    first_ran = true;
    return Status::Ok();
  });
  const std::uint64_t second = stream.Enqueue([&, opened] {
    opened.wait();
    second_ran = true;
    return Status::Ok();
  });
  // Ticket 1 completes although ticket 2 is blocked.
  auto waited = std::async(std::launch::async, [&] { stream.WaitFor(first); });
  ASSERT_EQ(waited.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_TRUE(first_ran.load());
  EXPECT_FALSE(second_ran.load());

  // Ticket 2 is only reached once its task ran.
  auto waited_second = std::async(std::launch::async, [&] {
    stream.WaitFor(second);
    return second_ran.load();
  });
  gate.Open();
  ASSERT_EQ(waited_second.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_TRUE(waited_second.get());
  EXPECT_TRUE(stream.Synchronize().ok());
}

TEST(HostStreamTest, SynchronizeWaitsForEverythingQueuedSoFar) {
  HostStream stream;
  Gate gate;
  std::atomic<int> done{0};
  EnqueueGatedCounters(stream, gate, done, 10);
  auto synced = std::async(std::launch::async, [&] { return stream.Synchronize(); });
  gate.Open();
  ASSERT_EQ(synced.wait_for(seconds(10)), std::future_status::ready);
  EXPECT_TRUE(synced.get().ok());
  EXPECT_EQ(done.load(), 11);
}

TEST(HostStreamTest, TaskStateIsReleasedBeforeCompletionIsReported) {
  HostStream stream;
  auto payload = std::make_shared<int>(42);
  std::weak_ptr<int> watch = payload;
  int seen = 0;
  stream.Enqueue([payload, &seen] {
    seen = *payload;
    return Status::Ok();
  });
  payload.reset();
  ASSERT_TRUE(stream.Synchronize().ok());
  EXPECT_EQ(seen, 42);
  EXPECT_TRUE(watch.expired());
}

TEST(HostStreamTest, DestructorRunsWhatIsQueued) {
  std::atomic<int> done{0};
  {
    HostStream stream;
    Gate gate;
    EnqueueGatedCounters(stream, gate, done, 20);
    gate.Open();
  }
  EXPECT_EQ(done.load(), 21);
}

TEST(HostStreamTest, ConcurrentEnqueuersGetDistinctTickets) {
  HostStream stream;
  int counter = 0;   // the worker is the only writer
  std::vector<std::vector<std::uint64_t>> tickets(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 250; ++i) {
        tickets[static_cast<std::size_t>(t)].push_back(stream.Enqueue([&counter] {
          ++counter;
          return Status::Ok();
        }));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  ASSERT_TRUE(stream.Synchronize().ok());
  EXPECT_EQ(counter, 1000);
  std::set<std::uint64_t> all;
  for (const auto& list : tickets) {
    for (std::size_t i = 1; i < list.size(); ++i) EXPECT_LT(list[i - 1], list[i]);
    all.insert(list.begin(), list.end());
  }
  EXPECT_EQ(all.size(), 1000u);
  EXPECT_EQ(*all.begin(), 1u);
  EXPECT_EQ(*all.rbegin(), 1000u);
}

}  // namespace
}  // namespace hp::shmem::host
