#include "runtime/interrupt.h"

#include <atomic>

namespace hp::shmem {
namespace {
std::atomic<InterruptCheck> g_interrupt_check{nullptr};
}  // namespace

void SetInterruptCheck(InterruptCheck check) { g_interrupt_check.store(check); }

bool InterruptRequested() {
  const InterruptCheck check = g_interrupt_check.load(std::memory_order_relaxed);
  return check != nullptr && check();
}

}  // namespace hp::shmem
