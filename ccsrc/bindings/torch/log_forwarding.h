// The runtime's log records for Python's `logging` (core/multicore/runtime_logs.py takes them on a thread of its own).
#pragma once

#include <pybind11/pybind11.h>

namespace hp::shmem::torch_binding {

// Adds log_forward(on: bool), log_wait(timeout_ms: int) -> bool and log_take() -> list[(level, rank, message)], the
// binding's side of Logger's forwarding (runtime/logging.h).
void RegisterLogForwarding(pybind11::module_& m);

}  // namespace hp::shmem::torch_binding
