// Template body of WaitUntil; include wait.h instead.
#pragma once

#include <sched.h>

#include "runtime/host/atomics.h"

namespace hp::shmem::host {

template <typename Done, typename Describe>
Status WaitUntil(const void* word, std::uint32_t* sleepers, Done&& done, const SpinPolicy& policy,
                 std::chrono::steady_clock::time_point deadline, Describe&& describe_timeout) {
  using Clock = std::chrono::steady_clock;
  if (done()) return Status::Ok();

  if (policy.spin.count() > 0) {
    const auto start = Clock::now();
    const auto spin_until = start + policy.spin;
    const auto yield_after = start + policy.spin_before_yielding;
    for (int i = 1;; ++i) {
      CpuRelax();
      if (done()) return Status::Ok();
      if ((i & 63) == 0) {
        const auto now = Clock::now();
        if (now >= spin_until) break;
        if (now >= yield_after) sched_yield();
      }
    }
  }
  for (int i = 0; i < policy.yields; ++i) {
    sched_yield();
    if (done()) return Status::Ok();
  }
  while (true) {
    const std::uint32_t snapshot = LoadAcquire(static_cast<const std::uint32_t*>(word));
    FetchAddSeqCst(sleepers, 1u);   // announce before the last check: a waker either sees us or we see it
    if (done()) {
      FetchAddSeqCst(sleepers, static_cast<std::uint32_t>(-1));
      return Status::Ok();
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      FetchAddSeqCst(sleepers, static_cast<std::uint32_t>(-1));
      return Timeout(describe_timeout());
    }
    const auto remaining = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
    FutexWait(word, snapshot, remaining < policy.sleep_slice ? remaining : std::chrono::nanoseconds(policy.sleep_slice));
    FetchAddSeqCst(sleepers, static_cast<std::uint32_t>(-1));
    if (done()) return Status::Ok();
    if (InterruptRequested()) return Interrupted("wait interrupted by a signal to the process (e.g. Ctrl-C)");
  }
}

}  // namespace hp::shmem::host
