#include "bindings/torch/log_forwarding.h"

#include <pybind11/stl.h>

#include <chrono>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/logging.h"

namespace hp::shmem::torch_binding {
namespace py = pybind11;

void RegisterLogForwarding(py::module_& m) {
  m.def("log_forward", [](bool on) {
    if (on) {
      Logger::StartForwarding();
    } else {
      Logger::StopForwarding();
    }
  });
  m.def("log_wait", [](int timeout_ms) {
    py::gil_scoped_release nogil;   // the wait must never hold the GIL: the threads that log may need it
    return Logger::WaitForwarded(std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : 0));
  });
  m.def("log_take", [] {
    std::vector<LogRecord> records = Logger::TakeForwarded();
    std::vector<std::tuple<int, int, std::string>> taken;
    taken.reserve(records.size());
    for (LogRecord& record : records) {
      taken.emplace_back(static_cast<int>(record.level), record.rank, std::move(record.message));
    }
    return taken;
  });
}

}  // namespace hp::shmem::torch_binding
