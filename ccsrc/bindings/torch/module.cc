// The Python extension `hyper_parallel._shmem_torch`: a thin layer between torch tensors and the runtime.
//
// It resolves tensors to addresses and byte counts, keeps tensors alive for operations queued on a stream, and
// releases the GIL around everything that may wait. Argument rules that need no torch live in the runtime. This file
// holds the lifecycle, the streams, the configuration, the numberings and the snapshot; the entries live by job:
// data_plane_entries.cc (memory, put/get/signal), team_entries.cc (teams and collectives, over fast_call.h),
// codec_entries.cc (the host codec), python_errors.cc and python_interrupt.cc (exceptions and Ctrl-C).
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "bindings/torch/allocations.h"
#include "bindings/torch/call_support.h"
#include "bindings/torch/codec_entries.h"
#include "bindings/torch/data_plane_entries.h"
#include "bindings/torch/log_forwarding.h"
#include "bindings/torch/py_bootstrap.h"
#include "bindings/torch/python_errors.h"
#include "bindings/torch/python_interrupt.h"
#include "bindings/torch/status_error.h"
#include "bindings/torch/symm_mem_register.h"
#include "bindings/torch/team_entries.h"
#include "bindings/torch/tensor_device.h"
#include "runtime/config.h"
#include "runtime/device_factory.h"
#ifdef HP_WITH_ASCEND_DEVICE
#include "bindings/torch/npu/npu_tensors.h"
#include "runtime/ascend/ascend_device.h"
#endif
#include "runtime/logging.h"
#include "runtime/numberings.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace hp::shmem::torch_binding {
namespace {

// The tensor device of `device`, which Init has just initialised (the ascend device's NPU is known only then).
const TensorDevice& TensorDeviceOf([[maybe_unused]] const Device& device) {
#ifdef HP_WITH_ASCEND_DEVICE
  if (const auto* ascend = dynamic_cast<const ascend::AscendDevice*>(&device)) {
    return npu::NpuTensorDevice(ascend->device_id());
  }
#endif
  return HostTensorDevice();
}

// `heap_size`: the heap of this lifecycle instead of the environment's (0: the environment's).
void Init(int rank, int world_size, py::object all_gather, py::object barrier, std::size_t heap_size) {
  Config config = ValueOrThrow(ConfigForInit(heap_size));
  std::unique_ptr<Device> device = ValueOrThrow(MakeDevice(config));
  const Device& initialised = *device;   // the runtime owns it from here on: alive once Init has succeeded
  PyBootstrap bootstrap(rank, world_size, std::move(all_gather), std::move(barrier));
  Status status;
  {
    py::gil_scoped_release nogil;   // the bootstrap takes the GIL back for each exchange
    status = R().Init(config, std::move(device), bootstrap);
  }
  ThrowIfError(std::move(status));
  SetActiveTensorDevice(TensorDeviceOf(initialised));
}

void Shutdown(int rank, int world_size, py::object all_gather, py::object barrier) {
  PyBootstrap bootstrap(rank, world_size, std::move(all_gather), std::move(barrier));
  Status status;
  {
    py::gil_scoped_release nogil;
    status = R().Shutdown(bootstrap);
  }
  ThrowIfError(std::move(status));
  ForgetAll();
}

// A JSON document of the runtime's, as Python objects.
py::object Loads(const std::string& json) { return py::module_::import("json").attr("loads")(json); }

// The configuration a lifecycle starting now would use, read from the environment by the runtime (ValueError on a bad
// value): the keys of debug_state()["config"].
py::object ReadConfig() { return Loads(ConfigJson(ValueOrThrow(ParseConfig(ProcessEnv())))); }

// The default wire format of the user API's reductions, by name (None: off): the lifecycle's, read once at init, or
// the environment's while none is active.
py::object DefaultWireFormat() {
  const std::optional<ops::LowFormat> format = ValueOrThrow(R().LowPrecisionDefault());
  if (!format.has_value()) return py::none();
  return py::str(ops::LowFormatName(*format));
}

// The runtime's snapshot, parsed from its one serialization (SnapshotJson), as the C ABI's reader parses it.
py::object DebugState() {
  std::string json;
  {
    // Snapshot takes the runtime's lock, which a wait on another thread may hold while it asks for the GIL
    // (bootstrap, interrupt check): never wait for that lock with the GIL held.
    py::gil_scoped_release nogil;
    if (R().state() == LifecycleState::kInitialized) (void)R().CheckDeferred();   // records what it finds
    json = SnapshotJson(R().Snapshot());
  }
  return Loads(json);
}

// Adds each numbering of the runtime (runtime/numberings.h) as a function returning a fresh name -> number dict.
void RegisterNumberings(py::module_& m) {
  for (const Numbering& numbering : Numberings()) {
    m.def(numbering.name, [values = numbering.values] {
      py::dict d;
      for (const auto& [name, number] : values) d[py::str(name)] = number;
      return d;
    });
  }
}

}  // namespace
}  // namespace hp::shmem::torch_binding

PYBIND11_MODULE(_shmem_torch, m) {
  using namespace hp::shmem;
  using namespace hp::shmem::torch_binding;
  m.doc() = "HyperParallel SHMEM runtime binding for torch (internal: use hyper_parallel.core.multicore.shmem)";

  py::register_exception_translator([](std::exception_ptr error) {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const StatusError& e) {
      SetPythonError(e);
    }
  });
  InstallInterruptCheck();

  m.def("set_error_classes", &SetErrorClasses, "Maps status codes (int) to the Python exception classes to raise.");
  m.def("init", &Init, py::arg("rank"), py::arg("world_size"), py::arg("all_gather"), py::arg("barrier"),
        py::arg("heap_size") = 0);
  m.def("shutdown", &Shutdown, py::arg("rank"), py::arg("world_size"), py::arg("all_gather"), py::arg("barrier"));
  m.def("state", [] { return std::string(LifecycleStateName(Runtime::Instance().state())); });
  m.def("lifecycle", [] { return Runtime::Instance().lifecycle(); });
  RegisterDataPlane(m);
  RegisterCodec(m);
  RegisterTeams(m);
  // The enum numberings, defined once in the runtime: the Python layers read them from here (status_codes,
  // reduce_ops, compare_ops, signal_ops, wire_formats, call_roles, collectives, dtypes).
  RegisterNumberings(m);
  m.def("create_stream", [] { return ValueOrThrow(Runtime::Instance().CreateStream()); });
  m.def("destroy_stream", [](StreamHandle s) {
    py::gil_scoped_release nogil;
    ThrowIfError(Runtime::Instance().DestroyStream(s));
  });
  m.def("synchronize_stream", [](StreamHandle s) {
    py::gil_scoped_release nogil;
    ThrowIfError(Runtime::Instance().SynchronizeStream(OnStream(s)));
  });
  m.def("stream_wait_stream", [](StreamHandle waiter, StreamHandle waited) {
    py::gil_scoped_release nogil;
    ThrowIfError(Runtime::Instance().StreamWaitStream(OnStream(waiter), OnStream(waited)));
  });
  m.def("debug_state", &DebugState);
  // The devices this module can run (HYPER_PARALLEL_SHMEM_DEVICE), for symmetric_memory.is_shmem_available().
#ifdef HP_WITH_ASCEND_DEVICE
  m.attr("built_devices") = py::make_tuple("host", "ascend");
#else
  m.attr("built_devices") = py::make_tuple("host");
#endif
  m.def("read_config", &ReadConfig);
  m.def("low_precision_default", &DefaultWireFormat);
  m.def("log_level", [] { return static_cast<int>(Logger::Level()); });
  RegisterLogForwarding(m);   // the runtime's records for Python's logging (log_forwarding.h)
  RegisterSymmMemBackend(m);   // the host device as torch's symmetric-memory backend for CPU (symm_mem_backend.h)
}
