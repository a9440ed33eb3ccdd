// The one entry module.cc needs of the host device's symm_mem backend (symm_mem_backend.h), without torch's
// symmetric-memory headers.
#pragma once

#include <pybind11/pybind11.h>

namespace hp::shmem::torch_binding {

// Registers the allocator with torch (DeviceType::CPU, and by name for symm_mem.set_backend) and adds the module's
// entries of the backend's Python side (platform/torch/symm_mem_backend.py): symm_mem_set_hooks, symm_mem_flush,
// symm_mem_forget, symm_mem_state, symm_mem_register_ops, symm_mem_backend_name.
void RegisterSymmMemBackend(pybind11::module_& m);

}  // namespace hp::shmem::torch_binding
