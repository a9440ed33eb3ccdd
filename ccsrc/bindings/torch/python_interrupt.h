// Ctrl-C during the runtime's waits: Python delivers signals to the main thread only, and a wait must neither miss
// one nor run a Python handler while it holds the runtime's lock.
#pragma once

namespace hp::shmem::torch_binding {

// Makes the importing thread the main thread and installs the runtime's interrupt check (runtime/interrupt.h).
void InstallInterruptCheck();

// After a call that took Ctrl-C: re-raises SIGINT for Python and runs its handler now that the runtime's lock is
// free. True when the handler raised (KeyboardInterrupt, for the default one): that exception is the call's.
bool RunTakenSigintHandler();

}  // namespace hp::shmem::torch_binding
