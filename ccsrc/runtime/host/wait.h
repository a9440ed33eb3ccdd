// Waiting for a word of shared memory: spin a while (yielding the core between checks after a short solo spin), then
// yield, then sleep in the kernel (futex).
//
// Ranks may outnumber cores (8 ranks on 2 cores in CI): a waiter that only spins would burn the time slice its
// peer needs to make progress, so spinning is short and the kernel does the rest. Wakers pay a futex syscall
// only when someone sleeps: waiters announce themselves in a per-rank `sleepers` counter first.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "runtime/interrupt.h"
#include "runtime/status.h"

namespace hp::shmem::host {

struct SpinPolicy {
  // Busy-wait with a pause instruction. Long enough to cover a peer's hand-off written in Python, which takes less
  // than a futex wake-up's scheduling latency (docs/perf.md, "Figures behind the code's constants").
  std::chrono::nanoseconds spin{std::chrono::microseconds(200)};
  // Spin without yielding this long, then yield the core between checks for the rest of the spin: after a wake-up
  // the scheduler may put a peer on this rank's core, and the balancer can take tens of ms to move it away; a waiter
  // that kept the core to itself would make every hand-off cost the whole spin (docs/perf.md, "Waiters and the
  // scheduler").
  std::chrono::nanoseconds spin_before_yielding{std::chrono::microseconds(5)};
  int yields = 4;                                                   // sched_yield rounds after spinning
  std::chrono::milliseconds sleep_slice{50};                        // longest single futex sleep

  // A policy for `ranks` processes on this machine: no spinning when they outnumber the online cores.
  static SpinPolicy For(int ranks);
};

// Sleeps on the 32-bit word at `word` while it still holds `expected`, at most `timeout`.
void FutexWait(const void* word, std::uint32_t expected, std::chrono::nanoseconds timeout);
// Wakes every waiter sleeping on `word`.
void FutexWakeAll(const void* word);

// Wakes the waiters of `word` if the rank owning `sleepers` has any asleep. Call after changing the value.
void WakeIfSleeping(const void* word, const std::uint32_t* sleepers);

// Waits until `done()` is true. `word` is the 32-bit word (the low half of a 64-bit value is fine) whose
// change makes done() true; `sleepers` is the counter of the rank that waits. On timeout returns kTimeout with
// the message `describe_timeout()` builds at that moment (so it can show the observed value); kInterrupted
// when InterruptRequested() said so. `describe_timeout` is a template too: a wait that succeeds at once builds
// no std::function (the collectives wait on every call).
template <typename Done, typename Describe>
Status WaitUntil(const void* word, std::uint32_t* sleepers, Done&& done, const SpinPolicy& policy,
                 std::chrono::steady_clock::time_point deadline, Describe&& describe_timeout);

}  // namespace hp::shmem::host

#include "runtime/host/wait_inl.h"
