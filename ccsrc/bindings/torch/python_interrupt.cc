#include "bindings/torch/python_interrupt.h"

#include <Python.h>
#include <pybind11/pybind11.h>

#include <thread>

#include "runtime/interrupt.h"

namespace py = pybind11;

namespace hp::shmem::torch_binding {
namespace {

// The thread that imported the module: Python delivers signals (Ctrl-C) to the main thread only.
std::thread::id g_main_thread;

// Set when a wait took Ctrl-C without running its handler (see PythonSignalPending); the exception translator
// hands it back to Python. Main thread only.
bool g_sigint_taken = false;

// The runtime's interrupt check, from a wait on the main thread. Where handlers may run, it runs Python's pending
// ones: a raised KeyboardInterrupt stays pending in the thread state and surfaces when the call returns. Inside the
// runtime's lock it only takes Ctrl-C, so that a collective check ends at once instead of at its timeout.
bool PythonSignalPending(bool may_run_handlers) {
  if (std::this_thread::get_id() != g_main_thread || !Py_IsInitialized()) return false;
  py::gil_scoped_acquire gil;
  if (may_run_handlers) return PyErr_CheckSignals() != 0;
  if (PyOS_InterruptOccurred() == 0) return false;
  g_sigint_taken = true;
  return true;
}

}  // namespace

bool RunTakenSigintHandler() {
  if (!g_sigint_taken || std::this_thread::get_id() != g_main_thread) return false;
  g_sigint_taken = false;
  PyErr_SetInterrupt();
  return PyErr_CheckSignals() != 0;
}

void InstallInterruptCheck() {
  g_main_thread = std::this_thread::get_id();
  SetInterruptCheck(&PythonSignalPending);
}

}  // namespace hp::shmem::torch_binding
