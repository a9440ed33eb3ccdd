#include "bindings/torch/fast_call.h"

namespace py = pybind11;

namespace hp::shmem::torch_binding {

void AddFastFunction(py::module_& m, const char* name, FastFunction function, const char* doc) {
  auto* def = new PyMethodDef{name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(function)),
                              METH_FASTCALL, doc};
  py::object callable = py::reinterpret_steal<py::object>(PyCFunction_NewEx(def, nullptr, m.attr("__name__").ptr()));
  if (!callable) throw py::error_already_set();
  m.attr(name) = callable;
}

}  // namespace hp::shmem::torch_binding
