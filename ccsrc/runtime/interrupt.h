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

}  // namespace hp::shmem
