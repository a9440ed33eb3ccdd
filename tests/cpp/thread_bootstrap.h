// A Bootstrap over the threads of one process, so that googletest can run N ranks of the runtime at once.
//
//   RunRanks(2, [](int rank, Bootstrap& bootstrap) {
//     Runtime runtime;                                       // every thread-rank owns its runtime and device
//     ASSERT_TRUE(runtime.Init(config, std::make_unique<host::HostDevice>(), bootstrap).ok());
//     ...
//   });
//
// Several HostDevices of one process map each other's segments like processes do, and futexes on shared
// mappings work between threads too. Every wait here is bounded: a barrier that some rank never reaches fails
// after the group's timeout, and at once when that rank has already returned from its body (e.g. after a failed
// ASSERT), so a broken test fails instead of hanging the binary. Once a barrier failed the group is broken and
// every later call fails with the same message.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/bootstrap.h"
#include "runtime/status.h"

namespace hp::shmem::testutil {

constexpr std::chrono::milliseconds kDefaultGroupTimeout{20000};

// What the ranks of one RunRanks share: a generation-based barrier and one exchange buffer per rank.
class ThreadGroup {
 public:
  explicit ThreadGroup(int world_size, std::chrono::milliseconds timeout = kDefaultGroupTimeout)
      : world_size_(world_size),
        timeout_(timeout),
        slots_(static_cast<std::size_t>(world_size)),
        waiting_(static_cast<std::size_t>(world_size), false),
        left_(static_cast<std::size_t>(world_size), false) {}

  int world_size() const { return world_size_; }

  Status Barrier(int rank) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!broken_.empty()) return Timeout(broken_);
    const std::uint64_t generation = generation_;
    waiting_[static_cast<std::size_t>(rank)] = true;
    if (++arrived_ == world_size_) {
      arrived_ = 0;
      ++generation_;
      waiting_.assign(waiting_.size(), false);
      cv_.notify_all();
      return Status::Ok();
    }
    for (int r = 0; r < world_size_; ++r) {
      if (left_[static_cast<std::size_t>(r)]) {
        Break("thread bootstrap barrier cannot complete: rank=" + std::to_string(r) + " already returned");
        return Timeout(broken_);
      }
    }
    const bool passed = cv_.wait_for(lock, timeout_, [&] { return generation_ != generation || !broken_.empty(); });
    if (generation_ != generation) return Status::Ok();
    if (passed) return Timeout(broken_);
    Break("thread bootstrap barrier timed out: rank=" + std::to_string(rank) + " missing_ranks=[" + Missing() + "]");
    return Timeout(broken_);
  }

  Status AllGather(int rank, const void* in, std::size_t bytes, void* out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const char* begin = static_cast<const char*>(in);
      slots_[static_cast<std::size_t>(rank)].assign(begin, begin + bytes);
    }
    HP_RETURN_IF_ERROR(Barrier(rank));
    Status copied = Status::Ok();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int r = 0; r < world_size_ && copied.ok(); ++r) {
        const std::vector<char>& slot = slots_[static_cast<std::size_t>(r)];
        if (slot.size() != bytes) {
          copied = Mismatch("thread bootstrap all_gather sizes differ: rank=" + std::to_string(rank) +
                            " bytes=" + std::to_string(bytes) + ", rank=" + std::to_string(r) +
                            " bytes=" + std::to_string(slot.size()));
        } else if (bytes != 0) {
          std::memcpy(static_cast<char*>(out) + static_cast<std::size_t>(r) * bytes, slot.data(), bytes);
        }
      }
    }
    // Nobody overwrites its slot before everyone has read it.
    HP_RETURN_IF_ERROR(Barrier(rank));
    return copied;
  }

  // `rank` returned from its body: a barrier that still needs it can never complete.
  void Leave(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    left_[static_cast<std::size_t>(rank)] = true;
    if (arrived_ > 0 && broken_.empty()) {
      Break("thread bootstrap barrier cannot complete: rank=" + std::to_string(rank) + " returned while ranks=[" +
            Waiting() + "] waited");
    }
  }

 private:
  // Needs mu_ held.
  void Break(std::string why) {
    broken_ = std::move(why);
    cv_.notify_all();
  }
  std::string Missing() const {
    std::string list;
    for (int r = 0; r < world_size_; ++r) {
      if (!waiting_[static_cast<std::size_t>(r)]) list += (list.empty() ? "" : ",") + std::to_string(r);
    }
    return list;
  }
  std::string Waiting() const {
    std::string list;
    for (int r = 0; r < world_size_; ++r) {
      if (waiting_[static_cast<std::size_t>(r)]) list += (list.empty() ? "" : ",") + std::to_string(r);
    }
    return list;
  }

  const int world_size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::uint64_t generation_ = 0;
  int arrived_ = 0;
  std::vector<std::vector<char>> slots_;
  std::vector<bool> waiting_;   // in the current barrier generation
  std::vector<bool> left_;
  std::string broken_;
};

// One rank's view of a ThreadGroup.
class ThreadBootstrap final : public Bootstrap {
 public:
  ThreadBootstrap(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return group_.world_size(); }
  Status AllGather(const void* in, std::size_t bytes, void* out) override {
    return group_.AllGather(rank_, in, bytes, out);
  }
  Status Barrier() override { return group_.Barrier(rank_); }

 private:
  ThreadGroup& group_;
  int rank_;
};

// Runs fn(rank, bootstrap) on `world_size` threads and joins them. googletest assertions are thread-safe with
// pthreads: use EXPECT_* (an ASSERT_* returns from fn only). Failures carry "rank=<r>" through SCOPED_TRACE; an
// exception escaping fn is reported as a failure.
template <typename Fn>
void RunRanks(int world_size, Fn&& fn, std::chrono::milliseconds timeout = kDefaultGroupTimeout) {
  ThreadGroup group(world_size, timeout);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&group, &fn, rank] {
      SCOPED_TRACE("rank=" + std::to_string(rank));
      ThreadBootstrap bootstrap(group, rank);
      try {
        fn(rank, static_cast<Bootstrap&>(bootstrap));
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << rank << " threw: " << e.what();
      } catch (...) {
        ADD_FAILURE() << "rank " << rank << " threw a non-std exception";
      }
      group.Leave(rank);
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// Exchanges one trivially copyable value between the ranks: element r is rank r's `value`.
template <typename T>
std::vector<T> GatherValue(Bootstrap& bootstrap, const T& value) {
  std::vector<T> all(static_cast<std::size_t>(bootstrap.world_size()));
  const Status status = bootstrap.AllGather(&value, sizeof(T), all.data());
  EXPECT_TRUE(status.ok()) << status.ToString();
  return all;
}

}  // namespace hp::shmem::testutil
