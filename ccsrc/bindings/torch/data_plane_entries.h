// Symmetric memory and the one-sided data plane as the binding's entries: empty, free, peer_tensor, put, get,
// signal, wait_signal, reduce and the barrier over the root.
#pragma once

#include <pybind11/pybind11.h>

namespace hp::shmem::torch_binding {

void RegisterDataPlane(pybind11::module_& m);

}  // namespace hp::shmem::torch_binding
