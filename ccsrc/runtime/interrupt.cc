#include "runtime/interrupt.h"

#include <atomic>

namespace hp::shmem {
namespace {
std::atomic<InterruptCheck> g_interrupt_check{nullptr};
thread_local int t_blocked = 0;
}  // namespace

InterruptsBlocked::InterruptsBlocked() { ++t_blocked; }
InterruptsBlocked::~InterruptsBlocked() { --t_blocked; }

void SetInterruptCheck(InterruptCheck check) { g_interrupt_check.store(check); }

bool InterruptRequested() {
  const InterruptCheck check = g_interrupt_check.load(std::memory_order_relaxed);
  return check != nullptr && check(/*may_run_handlers=*/t_blocked == 0);
}

}  // namespace hp::shmem
