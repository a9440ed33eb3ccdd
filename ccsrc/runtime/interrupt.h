// Letting a user interrupt a long wait (Ctrl-C) on any device.
//
// Devices ask InterruptRequested() between the sleeps of every wait and give up with kInterrupted when it says
// so. The framework binding installs the check (the torch binding: Python's pending signals, main thread only);
// without one, nothing interrupts a wait but its timeout.
#pragma once

namespace hp::shmem {

// `may_run_handlers`: whether the check may run user code (Python signal handlers). Where it may not, it only
// takes an interrupt request (Ctrl-C) and hands it back to the framework once the call is over.
using InterruptCheck = bool (*)(bool may_run_handlers);
void SetInterruptCheck(InterruptCheck check);   // nullptr removes it
bool InterruptRequested();

// While one lives, the check on this thread runs no handlers. The runtime holds one wherever it holds its own
// lock: a handler that calls back into the runtime must not find that lock taken by its own thread. Ctrl-C still
// ends those waits at once.
class InterruptsBlocked {
 public:
  InterruptsBlocked();
  ~InterruptsBlocked();
  InterruptsBlocked(const InterruptsBlocked&) = delete;
  InterruptsBlocked& operator=(const InterruptsBlocked&) = delete;
};

}  // namespace hp::shmem
