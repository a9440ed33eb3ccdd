// Letting a user interrupt a long wait (Ctrl-C) on any device.
//
// Devices ask InterruptRequested() between the sleeps of every wait and give up with kInterrupted when it says
// so. The framework binding installs the check (the torch binding: Python's pending signals, main thread only);
// without one, nothing interrupts a wait but its timeout.
#pragma once

namespace hp::shmem {

using InterruptCheck = bool (*)();
void SetInterruptCheck(InterruptCheck check);   // nullptr removes it
bool InterruptRequested();

// While one lives, waits on this thread are not interrupted. The runtime holds one wherever it holds its own
// lock: the check may run user code (Python signal handlers), which must not find that lock taken by its own
// thread. Those waits still end at their timeout.
class InterruptsBlocked {
 public:
  InterruptsBlocked();
  ~InterruptsBlocked();
  InterruptsBlocked(const InterruptsBlocked&) = delete;
  InterruptsBlocked& operator=(const InterruptsBlocked&) = delete;
};

}  // namespace hp::shmem
