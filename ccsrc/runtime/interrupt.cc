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
  if (t_blocked != 0) return false;
  const InterruptCheck check = g_interrupt_check.load(std::memory_order_relaxed);
  return check != nullptr && check();
}

}  // namespace hp::shmem
