#include "bindings/torch/python_errors.h"

#include <map>

#include "bindings/torch/python_interrupt.h"
#include "runtime/status.h"

namespace py = pybind11;

namespace hp::shmem::torch_binding {
namespace {

// Python exception classes by status code, registered by the Python layer (which owns them).
std::map<int, py::object>& ErrorClasses() {
  static auto* classes = new std::map<int, py::object>();   // never destroyed: outlives the interpreter's teardown
  return *classes;
}

}  // namespace

void SetErrorClasses(const py::dict& classes) {
  for (auto item : classes) ErrorClasses()[item.first.cast<int>()] = py::reinterpret_borrow<py::object>(item.second);
}

void SetPythonError(const StatusError& e) {
  const int code = static_cast<int>(e.status().code());
  if (e.status().code() == StatusCode::kInterrupted && (PyErr_Occurred() || RunTakenSigintHandler())) {
    return;   // KeyboardInterrupt, or what the user's handler raised
  }
  auto& classes = ErrorClasses();
  auto it = classes.find(code);
  if (it == classes.end()) it = classes.find(static_cast<int>(StatusCode::kInternal));
  if (it == classes.end()) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } else {
    PyErr_SetString(it->second.ptr(), e.what());
  }
}

}  // namespace hp::shmem::torch_binding
