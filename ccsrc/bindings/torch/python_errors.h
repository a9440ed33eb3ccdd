// The Python exception of a failed call: the class the Python layer registered for the status's code (it owns the
// classes), or what a Ctrl-C taken in a wait raised.
#pragma once

#include <pybind11/pybind11.h>

#include "bindings/torch/status_error.h"

namespace hp::shmem::torch_binding {

// Maps status codes (int) to the Python exception classes to raise.
void SetErrorClasses(const pybind11::dict& classes);

// Sets the Python exception of a failed status.
void SetPythonError(const StatusError& e);

}  // namespace hp::shmem::torch_binding
