#include "runtime/host/wait.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace hp::shmem::host {

SpinPolicy SpinPolicy::For(int ranks) {
  SpinPolicy policy;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (cores > 0 && ranks > cores) {
    // The rank a waiter needs is then most often runnable on the waiter's own core: a yield hands it the core at
    // once, a futex sleep costs the waiter a wake-up. Only a waiter whose peers made no progress over many yields
    // sleeps (docs/perf.md, "Waiters and the scheduler": 8 ranks on 2 cores).
    policy.spin = std::chrono::nanoseconds(0);
    policy.yields = 50;
  }
  return policy;
}

void FutexWait(const void* word, std::uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes. EAGAIN, EINTR and ETIMEDOUT all
  // mean "look again", which every caller does.
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(const void* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

void WakeIfSleeping(const void* word, const std::uint32_t* sleepers) {
  if (LoadSeqCst(sleepers) != 0) FutexWakeAll(word);
}

}  // namespace hp::shmem::host
