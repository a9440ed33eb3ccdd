// The Python extension `hyper_parallel._shmem_torch`: a thin layer between torch tensors and the runtime.
//
// It resolves tensors to addresses and byte counts, keeps tensors alive for operations queued on a stream, and
// releases the GIL around everything that may wait. Argument rules that need no torch live in the runtime.
#include <torch/csrc/Dtype.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <array>
#include <cstring>

#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings/torch/allocations.h"
#include "bindings/torch/arguments.h"
#include "bindings/torch/log_forwarding.h"
#include "bindings/torch/py_bootstrap.h"
#include "bindings/torch/reduce_dtypes.h"
#include "bindings/torch/status_error.h"
#include "bindings/torch/symm_mem_register.h"
#include "bindings/torch/tensor_device.h"
#include "ops/host/codec.h"
#include "runtime/config.h"
#include "runtime/device_factory.h"
#include "runtime/interrupt.h"
#ifdef HP_WITH_ASCEND_DEVICE
#include "bindings/torch/npu/npu_tensors.h"
#include "runtime/ascend/ascend_device.h"
#endif
#include "runtime/logging.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace hp::shmem::torch_binding {
namespace {

Runtime& R() { return Runtime::Instance(); }

// Python exception classes by status code, registered by the Python layer (which owns them).
std::map<int, py::object>& ErrorClasses() {
  static auto* classes = new std::map<int, py::object>();   // never destroyed: outlives the interpreter's teardown
  return *classes;
}

void SetErrorClasses(const py::dict& classes) {
  for (auto item : classes) ErrorClasses()[item.first.cast<int>()] = py::reinterpret_borrow<py::object>(item.second);
}

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

// After a call that took Ctrl-C: re-raises SIGINT for Python and runs its handler now that the runtime's lock is
// free. True when the handler raised (KeyboardInterrupt, for the default one): that exception is the call's.
bool RunTakenSigintHandler() {
  if (!g_sigint_taken || std::this_thread::get_id() != g_main_thread) return false;
  g_sigint_taken = false;
  PyErr_SetInterrupt();
  return PyErr_CheckSignals() != 0;
}

// `stream` as Python passed it. Nothing to keep alive on the default stream: on the host device the operation is
// over when the call returns; on torch_npu's current stream torch's own rule holds, as for its ops (the caching
// allocator hands a tensor's memory out again only in that stream's order).
// A template so that the default stream copies no tensor (a copy takes a reference through torch's Python
// interpreter hooks, a cost on the small-message path).
template <typename... Tensors>
KeepAlive Keep(StreamHandle stream, const Tensors&... tensors) {
  if (stream == kDefaultStream) return nullptr;
  return std::make_shared<const std::vector<at::Tensor>>(std::vector<at::Tensor>{tensors...});
}

// The stream a call runs on: Python's default stream (0) is the active tensor device's, torch_npu's current stream
// on the ascend device, so that SHMEM operations keep their order with the torch ops around them. Called without
// the GIL: torch_npu drains its task queue first.
StreamHandle OnStream(StreamHandle stream) {
  if (stream != kDefaultStream) return stream;
  const TensorDevice& active = ActiveTensorDevice();
  return active.default_stream == nullptr ? kDefaultStream : active.default_stream(active.device);
}

SignalWidth WidthOf(const at::Tensor& signal) {
  return signal.element_size() == 8 ? SignalWidth::k64 : SignalWidth::k32;
}

// The tensor device of `device`, which Init has just initialised (the ascend device's NPU is known only then).
const TensorDevice& TensorDeviceOf([[maybe_unused]] const Device& device) {
#ifdef HP_WITH_ASCEND_DEVICE
  if (const auto* ascend = dynamic_cast<const ascend::AscendDevice*>(&device)) {
    return npu::NpuTensorDevice(ascend->device_id());
  }
#endif
  return HostTensorDevice();
}

void Init(int rank, int world_size, py::object all_gather, py::object barrier) {
  Config config = ValueOrThrow(ParseConfig(ProcessEnv()));
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

at::Tensor EmptyTensor(const std::vector<std::int64_t>& sizes, py::object dtype, std::size_t alignment,
                       std::string call_site) {
  if (!THPDtype_Check(dtype.ptr())) {
    throw StatusError(TypeError("`dtype` must be a torch.dtype, but got " + std::string(py::str(py::type::of(dtype)))));
  }
  const c10::ScalarType scalar_type = reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
  py::gil_scoped_release nogil;
  return Empty(sizes, scalar_type, alignment, std::move(call_site));
}

void FreeTensor(py::handle tensor_arg, const std::string& call_site) {
  const at::Tensor& tensor = TensorArg(tensor_arg, "tensor");
  py::gil_scoped_release nogil;
  Free(tensor, call_site);
}

at::Tensor PeerTensorOf(py::handle tensor_arg, py::handle pe_arg) {
  const at::Tensor& tensor = StridedTensorArg(tensor_arg, "tensor");
  const int pe = PeArg(pe_arg);
  return PeerTensor(tensor, pe);
}

void Put(py::handle dst_arg, py::handle src_arg, py::handle pe_arg, StreamHandle stream) {
  const at::Tensor& dst = TensorArg(dst_arg, "dst");
  const at::Tensor& src = TensorArg(src_arg, "src");
  const int pe = PeArg(pe_arg);
  void* dst_ptr = DataPointer(dst, "dst");
  const void* src_ptr = DataPointer(src, "src");
  KeepAlive keep = Keep(stream, dst, src);
  py::gil_scoped_release nogil;
  ThrowIfError(R().Put(dst_ptr, src_ptr, ByteSize(dst), ByteSize(src), pe, OnStream(stream), std::move(keep)));
}

void Get(py::handle dst_arg, py::handle src_arg, py::handle pe_arg, StreamHandle stream) {
  const at::Tensor& dst = TensorArg(dst_arg, "dst");
  const at::Tensor& src = TensorArg(src_arg, "src");
  const int pe = PeArg(pe_arg);
  void* dst_ptr = DataPointer(dst, "dst");
  const void* src_ptr = DataPointer(src, "src");
  KeepAlive keep = Keep(stream, dst, src);
  py::gil_scoped_release nogil;
  ThrowIfError(R().Get(dst_ptr, src_ptr, ByteSize(dst), ByteSize(src), pe, OnStream(stream), std::move(keep)));
}

void Signal(py::handle signal_arg, py::handle value_arg, py::handle pe_arg, int op, StreamHandle stream) {
  const at::Tensor& signal = TensorArg(signal_arg, "signal_tensor");
  const std::int64_t value = SignalValueArg(signal, value_arg);
  const int pe = PeArg(pe_arg);
  void* ptr = DataPointer(signal, "signal_tensor");
  py::gil_scoped_release nogil;
  ThrowIfError(R().Signal(ptr, WidthOf(signal), value, static_cast<SignalOp>(op), pe, OnStream(stream)));
}

void WaitSignal(py::handle signal_arg, py::handle value_arg, int cmp, StreamHandle stream) {
  const at::Tensor& signal = TensorArg(signal_arg, "signal_tensor");
  const std::int64_t value = SignalValueArg(signal, value_arg);
  void* ptr = DataPointer(signal, "signal_tensor");
  py::gil_scoped_release nogil;
  ThrowIfError(R().WaitSignal(ptr, WidthOf(signal), static_cast<CompareOp>(cmp), value, OnStream(stream)));
}

// The runtime's element type of a reduction's tensors; both tensors must share it.
DataType ReduceDtypeArg(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.scalar_type() != src.scalar_type()) {
    throw StatusError(TypeError("`dst` must have the dtype of `src` (" + DtypeName(src.scalar_type()) + "), but got " +
                                DtypeName(dst.scalar_type())));
  }
  if (const std::optional<DataType> dtype = ReduceDataTypeOf(src.scalar_type())) return *dtype;
  throw StatusError(TypeError(std::string("`src` must have one of dtypes ") + kReducibleDtypes + ", but got " +
                              DtypeName(src.scalar_type())));
}

// A list or tuple of ints; their range is the runtime's check.
std::vector<int> PesArg(py::handle value) {
  if (!PyList_Check(value.ptr()) && !PyTuple_Check(value.ptr())) {
    throw StatusError(TypeError("`pes` must be a list or tuple of ints, but got " + PyTypeName(value)));
  }
  const Py_ssize_t size = PySequence_Fast_GET_SIZE(value.ptr());
  PyObject** items = PySequence_Fast_ITEMS(value.ptr());
  std::vector<int> pes(static_cast<std::size_t>(size));
  for (Py_ssize_t i = 0; i < size; ++i) {
    // The element's name is built only when IntArg has to explain it: this loop sits on the hot path.
    int overflow = 0;
    const long long pe = PyLong_CheckExact(items[i]) ? PyLong_AsLongLongAndOverflow(items[i], &overflow) : 0;
    if (PyLong_CheckExact(items[i]) && overflow == 0 && pe >= std::numeric_limits<int>::min() &&
        pe <= std::numeric_limits<int>::max()) {
      pes[static_cast<std::size_t>(i)] = static_cast<int>(pe);
      continue;
    }
    const std::string name = "pes[" + std::to_string(i) + "]";
    pes[static_cast<std::size_t>(i)] = static_cast<int>(IntArg(items[i], name.c_str(), std::numeric_limits<int>::min(),
                                                               std::numeric_limits<int>::max(), "a C int"));
  }
  return pes;
}

void Reduce(py::handle dst_arg, py::handle src_arg, int op, py::handle pes_arg, StreamHandle stream) {
  const at::Tensor& dst = TensorArg(dst_arg, "dst");
  const at::Tensor& src = TensorArg(src_arg, "src");
  const DataType dtype = ReduceDtypeArg(dst, src);
  const std::vector<int> pes = PesArg(pes_arg);
  void* dst_ptr = DataPointer(dst, "dst");
  const void* src_ptr = DataPointer(src, "src");
  KeepAlive keep = Keep(stream, dst, src);
  py::gil_scoped_release nogil;
  ThrowIfError(R().Reduce(dst_ptr, ByteSize(dst), src_ptr, ByteSize(src), dtype, static_cast<ReduceOp>(op), pes,
                          OnStream(stream), std::move(keep)));
}

// The wire format of a codec's codes: the tensor's dtype names it.
ops::LowFormat LowFormatArg(const at::Tensor& tensor, const char* name) {
  switch (tensor.scalar_type()) {
    case at::kFloat8_e4m3fn: return ops::LowFormat::kFloat8E4M3Fn;
    case at::kFloat8_e5m2: return ops::LowFormat::kFloat8E5M2;
    case at::kHalf: return ops::LowFormat::kFloat16;
    case at::kBFloat16: return ops::LowFormat::kBFloat16;
    default:
      throw StatusError(TypeError(std::string("`") + name + "` must have dtype torch.float8_e4m3fn, "
                                  "torch.float8_e5m2, torch.float16 or torch.bfloat16, but got " +
                                  DtypeName(tensor.scalar_type())));
  }
}

// The dtype of the codec's wide side: what it encodes from, or decodes into.
DataType CodecFloatArg(const at::Tensor& tensor, const char* name) {
  switch (tensor.scalar_type()) {
    case at::kFloat: return DataType::kFloat32;
    case at::kDouble: return DataType::kFloat64;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    default:
      throw StatusError(TypeError(std::string("`") + name + "` must have one of dtypes torch.float32, torch.float64, "
                                  "torch.float16, torch.bfloat16, but got " + DtypeName(tensor.scalar_type())));
  }
}

// A fp8 run's scales: float32, one per started block of `count` values.
void CheckScales(const at::Tensor& scales, const char* scales_name, std::int64_t count) {
  if (scales.scalar_type() != at::kFloat) {
    throw StatusError(TypeError(std::string("`") + scales_name + "` must have dtype torch.float32, but got " +
                                DtypeName(scales.scalar_type())));
  }
  const auto expected = static_cast<std::int64_t>(ops::ScaleCount(static_cast<std::size_t>(count)));
  if (scales.numel() != expected) {
    throw StatusError(InvalidArgument(std::string("`") + scales_name + "` must have " + std::to_string(expected) +
                                      " elements (one per " + std::to_string(ops::kScaleBlock) + " values), but got " +
                                      std::to_string(scales.numel())));
  }
}

// The kernels' operands must not overlap (a slot's scales and bytes are disjoint slices of it).
void CheckDisjoint(const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name) {
  const auto* a_begin = static_cast<const char*>(a.data_ptr());
  const auto* b_begin = static_cast<const char*>(b.data_ptr());
  if (a.numel() > 0 && b.numel() > 0 && a_begin < b_begin + ByteSize(b) && b_begin < a_begin + ByteSize(a)) {
    throw StatusError(InvalidArgument(std::string("`") + a_name + "` must not overlap `" + b_name +
                                      "`, but got overlapping memory"));
  }
}

// An encoded run as Python passes it: a (scales, codes) tuple, scales None for float16/bfloat16 codes, as many
// codes as `out` has values. The tensors stay owned by the tuple, which the caller holds through the call.
struct RunArg {
  std::string name;
  const at::Tensor* scales;   // null for the plain formats
  const at::Tensor* codes;
};

// `wide` (named `wide_name`) is the full-precision tensor whose element count the codes must have. The first run's
// codes set `format`; every other run must share it.
RunArg EncodedRunArg(py::handle value, std::string name, const at::Tensor& wide, const char* wide_name,
                     std::optional<ops::LowFormat>* format) {
  if (!PyTuple_Check(value.ptr())) {
    throw StatusError(TypeError("`" + name + "` must be a (scales, codes) tuple, but got " + PyTypeName(value)));
  }
  if (PyTuple_GET_SIZE(value.ptr()) != 2) {
    throw StatusError(TypeError("`" + name + "` must be a (scales, codes) tuple, but got a tuple of " +
                                std::to_string(PyTuple_GET_SIZE(value.ptr())) + " items"));
  }
  const std::string scales_name = name + "[0]", codes_name = name + "[1]";
  const at::Tensor& codes = CpuTensorArg(PyTuple_GET_ITEM(value.ptr(), 1), codes_name.c_str());
  const ops::LowFormat run_format = LowFormatArg(codes, codes_name.c_str());
  if (!format->has_value()) *format = run_format;
  if (**format != run_format) {
    throw StatusError(TypeError("`" + codes_name + "` must have the dtype of the first run's codes (torch." +
                                std::string(ops::LowFormatName(**format)) + "), but got " +
                                DtypeName(codes.scalar_type())));
  }
  if (codes.numel() != wide.numel()) {
    throw StatusError(InvalidArgument("`" + codes_name + "` must have as many elements as `" + wide_name + "` (" +
                                      std::to_string(wide.numel()) + "), but got " + std::to_string(codes.numel())));
  }
  py::handle scales_value = PyTuple_GET_ITEM(value.ptr(), 0);
  if (!ops::LowFormatScaled(run_format)) {
    if (!scales_value.is_none()) {
      throw StatusError(TypeError("`" + scales_name + "` must be None for " + ops::LowFormatName(run_format) +
                                  " codes (they have no scales), but got " + PyTypeName(scales_value)));
    }
    return {std::move(name), nullptr, &codes};
  }
  const at::Tensor& scales = CpuTensorArg(scales_value, scales_name.c_str());
  CheckScales(scales, scales_name.c_str(), codes.numel());
  CheckDisjoint(scales, scales_name.c_str(), codes, codes_name.c_str());
  return {std::move(name), &scales, &codes};
}

// A run's scales (null for the plain formats) and codes.
ops::EncodedRun RunPointers(const RunArg& run) {
  return {run.scales != nullptr ? static_cast<const float*>(run.scales->data_ptr()) : nullptr, run.codes->data_ptr()};
}

// The reduction step of low-precision communication (ops/host/codec.h, HostReduceEncoded), on the calling thread:
// `out` = `own` (or nothing) + every decoded source, 'sum' (0) or 'avg' (1); with `reencode`, the result travels
// on in its codes and `out` receives their decoding.
void ReduceEncoded(py::handle out_arg, py::handle own_arg, py::handle sources_arg, int op, py::handle reencode_arg) {
  const at::Tensor& out = CpuTensorArg(out_arg, "out");
  const DataType out_dtype = CodecFloatArg(out, "out");
  const at::Tensor* own = nullptr;
  if (!own_arg.is_none()) {
    own = &CpuTensorArg(own_arg, "own");
    if (own->scalar_type() != out.scalar_type() || own->numel() != out.numel()) {
      throw StatusError(InvalidArgument("`own` must have the dtype and element count of `out` (" +
                                        DtypeName(out.scalar_type()) + ", " + std::to_string(out.numel()) +
                                        "), but got " + DtypeName(own->scalar_type()) + ", " +
                                        std::to_string(own->numel())));
    }
    if (own->data_ptr() != out.data_ptr()) CheckDisjoint(*own, "own", out, "out");
  }
  if (!PyList_Check(sources_arg.ptr()) && !PyTuple_Check(sources_arg.ptr())) {
    throw StatusError(TypeError("`sources` must be a list or tuple of (scales, codes) tuples, but got " +
                                PyTypeName(sources_arg)));
  }
  const Py_ssize_t nsources = PySequence_Fast_GET_SIZE(sources_arg.ptr());
  if (nsources == 0 && own == nullptr) {
    throw StatusError(InvalidArgument("`sources` must hold a run when `own` is None, but got an empty sequence"));
  }
  if (op != static_cast<int>(ReduceOp::kSum) && op != static_cast<int>(ReduceOp::kAvg)) {
    throw StatusError(InvalidArgument("`op` must be 0 (sum) or 1 (avg), but got " + std::to_string(op)));
  }
  PyObject** items = PySequence_Fast_ITEMS(sources_arg.ptr());
  std::optional<ops::LowFormat> format;
  std::vector<RunArg> runs;
  runs.reserve(static_cast<std::size_t>(nsources) + 1);
  for (Py_ssize_t k = 0; k < nsources; ++k) {
    runs.push_back(EncodedRunArg(items[k], "sources[" + std::to_string(k) + "]", out, "out", &format));
  }
  const bool reencoding = !reencode_arg.is_none();
  if (reencoding) runs.push_back(EncodedRunArg(reencode_arg, "reencode", out, "out", &format));
  if (!format.has_value()) {
    throw StatusError(InvalidArgument("`sources` or `reencode` must hold a run (their codes name the format), but "
                                      "got neither"));
  }
  // Only `own` may alias `out` (exactly); the codes and scales are read or written apart from every tensor.
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const bool written = reencoding && k + 1 == runs.size();
    for (const at::Tensor* part : {runs[k].scales, runs[k].codes}) {
      if (part == nullptr) continue;
      const std::string part_name = runs[k].name + (part == runs[k].codes ? "[1]" : "[0]");
      CheckDisjoint(*part, part_name.c_str(), out, "out");
      if (written && own != nullptr) CheckDisjoint(*part, part_name.c_str(), *own, "own");
      for (std::size_t j = 0; written && j + 1 < runs.size(); ++j) {
        for (const at::Tensor* read : {runs[j].scales, runs[j].codes}) {
          if (read == nullptr) continue;
          const std::string read_name = runs[j].name + (read == runs[j].codes ? "[1]" : "[0]");
          CheckDisjoint(*part, part_name.c_str(), *read, read_name.c_str());
        }
      }
    }
  }
  if (reencoding && runs.back().scales != nullptr) {
    CheckDisjoint(*runs.back().scales, "reencode[0]", *runs.back().codes, "reencode[1]");
  }
  std::vector<ops::EncodedRun> sources;
  sources.reserve(static_cast<std::size_t>(nsources));
  for (Py_ssize_t k = 0; k < nsources; ++k) sources.push_back(RunPointers(runs[static_cast<std::size_t>(k)]));
  ops::MutableEncodedRun reencode{nullptr, nullptr};
  if (reencoding) {
    const RunArg& run = runs.back();
    reencode = {run.scales != nullptr ? static_cast<float*>(DataPointer(*run.scales, "reencode[0]")) : nullptr,
                DataPointer(*run.codes, "reencode[1]")};
  }
  const void* own_ptr = own != nullptr ? own->data_ptr() : nullptr;
  void* out_ptr = DataPointer(out, "out");
  const auto count = static_cast<std::size_t>(out.numel());
  bool done;
  {
    py::gil_scoped_release nogil;
    done = ops::HostReduceEncoded(*format, out_dtype, static_cast<ReduceOp>(op), own_ptr, sources.data(),
                                  static_cast<int>(nsources), count, out_ptr, reencode);
  }
  if (!done) throw StatusError(Internal("the host codec refused checked arguments: reduce_encoded"));
}

// Encoding of `src` into the run `dst` (ops/host/codec.h), on the calling thread.
void Encode(py::handle src_arg, py::handle dst_arg) {
  const at::Tensor& src = CpuTensorArg(src_arg, "src");
  const DataType src_dtype = CodecFloatArg(src, "src");
  std::optional<ops::LowFormat> format;
  const RunArg dst = EncodedRunArg(dst_arg, "dst", src, "src", &format);
  for (const at::Tensor* part : {dst.scales, dst.codes}) {
    if (part != nullptr) CheckDisjoint(*part, part == dst.codes ? "dst[1]" : "dst[0]", src, "src");
  }
  ops::MutableEncodedRun run{
      dst.scales != nullptr ? static_cast<float*>(DataPointer(*dst.scales, "dst[0]")) : nullptr,
      DataPointer(*dst.codes, "dst[1]")};
  const void* src_ptr = DataPointer(src, "src");
  const auto count = static_cast<std::size_t>(src.numel());
  bool done;
  {
    py::gil_scoped_release nogil;
    done = ops::HostEncode(*format, src_dtype, src_ptr, count, run);
  }
  if (!done) throw StatusError(Internal("the host codec refused checked arguments: encode"));
}

// Decoding of the run `src` into `out`, added to it when `accumulate`.
void Decode(py::handle src_arg, py::handle out_arg, bool accumulate) {
  const at::Tensor& out = CpuTensorArg(out_arg, "out");
  const DataType out_dtype = CodecFloatArg(out, "out");
  std::optional<ops::LowFormat> format;
  const RunArg src = EncodedRunArg(src_arg, "src", out, "out", &format);
  for (const at::Tensor* part : {src.scales, src.codes}) {
    if (part != nullptr) CheckDisjoint(out, "out", *part, part == src.codes ? "src[1]" : "src[0]");
  }
  const ops::EncodedRun run = RunPointers(src);
  void* out_ptr = DataPointer(out, "out");
  const auto count = static_cast<std::size_t>(out.numel());
  bool done;
  {
    py::gil_scoped_release nogil;
    done = ops::HostDecode(*format, run, count, out_dtype, out_ptr, accumulate);
  }
  if (!done) throw StatusError(Internal("the host codec refused checked arguments: decode"));
}

void Barrier(StreamHandle stream) {
  py::gil_scoped_release nogil;
  ThrowIfError(R().Barrier(OnStream(stream)));
}

// ---- teams and their collectives (runtime/team.h, runtime/collectives/engine.h) ----

// Whether a call on these arguments may skip torch's dispatcher: plain tensors (no subclass), nothing that autograd
// would record, no dispatch mode (a fake-tensor mode) and no functorch transform active. The one check the
// collectives' fast path makes on every eager call, in C++ because in Python it costs about a microsecond.
bool PlainEager(PyObject* const* arguments, Py_ssize_t count) {
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) return false;
  const c10::DispatchKeySet included = c10::impl::tls_local_dispatch_key_set().included_;
  if (included.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) ||
      included.has(c10::DispatchKey::FuncTorchDynamicLayerBackMode)) {
    return false;
  }
  const bool grad = at::GradMode::is_enabled();
  for (Py_ssize_t i = 0; i < count; ++i) {
    if (!THPVariable_CheckExact(arguments[i])) return false;
    if (grad && THPVariable_Unpack(arguments[i]).requires_grad()) return false;
  }
  return true;
}

PyObject* PlainEagerEntry(PyObject* /*module*/, PyObject* const* arguments, Py_ssize_t count) {
  if (PlainEager(arguments, count)) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

// A tensor's element type as the engine names it in fingerprints ("float32"). The name is Python's, asked once
// per dtype (the GIL guards the cache): the collectives call this on every call.
ElementType ElementTypeOf(const at::Tensor& tensor) {
  static auto* names = new std::map<at::ScalarType, std::string>();   // never destroyed, as ErrorClasses
  const at::ScalarType scalar_type = tensor.scalar_type();
  auto it = names->find(scalar_type);
  if (it == names->end()) {
    std::string name = DtypeName(scalar_type);
    if (name.rfind("torch.", 0) == 0) name = name.substr(6);
    it = names->emplace(scalar_type, std::move(name)).first;
  }
  ElementType type;
  type.name = it->second;
  type.bytes = static_cast<std::size_t>(tensor.element_size());
  return type;
}

std::uint64_t TeamCreate(py::handle pes_arg, int group_rank, py::object all_gather, py::object barrier) {
  const std::vector<int> pes = PesArg(pes_arg);
  PyBootstrap bootstrap(group_rank, static_cast<int>(pes.size()), std::move(all_gather), std::move(barrier));
  Result<std::uint64_t> team = StateError("team was not created");
  {
    py::gil_scoped_release nogil;   // the bootstrap takes the GIL back for each exchange
    team = R().CreateTeam(pes, bootstrap);
  }
  return ValueOrThrow(std::move(team));
}

py::tuple TeamDescribe(std::uint64_t team) {
  const TeamView view = ValueOrThrow(R().DescribeTeam(team));
  return py::make_tuple(view.pes, view.me, view.slot, view.staging_bytes);
}

// What a call is for, as the Python side numbers it (CALL_ROLES).
CallRole RoleArg(int role) {
  if (role < 0 || role > static_cast<int>(CallRole::kFusedScatter)) {
    throw StatusError(InvalidArgument("`role` must be a call role of CALL_ROLES, but got " + std::to_string(role)));
  }
  return static_cast<CallRole>(role);
}

// Resolves a collective's arguments with `resolve`; a check that fails there (a freed tensor, a bad dtype) is refused
// collectively: this rank still enters the call's first sync, so that every member fails with the same error naming
// this rank, instead of leaving them waiting for a call that will not come.
template <typename Resolve>
auto Collectively(std::uint64_t team, Collective collective, StreamHandle stream, CallRole role, Resolve&& resolve) {
  try {
    return resolve();
  } catch (const StatusError& e) {
    Status refused;
    {
      py::gil_scoped_release nogil;
      refused = R().Refuse(team, collective, e.status(), OnStream(stream), role);
    }
    // No team to refuse through (no runtime, a released team): nobody waits for this call; the error is this rank's.
    const bool reported = refused.code() == e.status().code() && refused.message().rfind(e.status().message(), 0) == 0;
    throw StatusError(reported ? std::move(refused) : e.status());
  }
}

void TeamBarrier(std::uint64_t team, StreamHandle stream, int role) {
  const CallRole call_role = RoleArg(role);
  py::gil_scoped_release nogil;
  ThrowIfError(R().TeamBarrier(team, OnStream(stream), call_role));
}

void TeamAllGather(std::uint64_t team, py::handle output_arg, py::handle input_arg, StreamHandle stream, int role) {
  const CallRole call_role = RoleArg(role);
  struct Args {
    ElementType type;
    void* out;
    std::size_t out_bytes;
    const void* in;
    std::size_t in_bytes;
    KeepAlive keep;
  };
  Args a = Collectively(team, Collective::kAllGather, stream, call_role, [&] {
    const at::Tensor& output = TensorArg(output_arg, "output");
    const at::Tensor& input = TensorArg(input_arg, "input");
    return Args{ElementTypeOf(input), DataPointer(output, "output"), ByteSize(output), DataPointer(input, "input"),
                ByteSize(input), Keep(stream, output, input)};
  });
  py::gil_scoped_release nogil;
  ThrowIfError(R().AllGather(team, a.out, a.out_bytes, a.in, a.in_bytes, a.type, OnStream(stream), std::move(a.keep),
                             call_role));
}

// A wire format as the Python side numbers it (WIRE_FORMATS: 0 the tensor's own dtype, else ops::LowFormat + 1).
std::optional<ops::LowFormat> WireArg(int wire) {
  if (wire == 0) return std::nullopt;
  if (!ops::IsLowFormat(wire - 1)) {
    throw StatusError(InvalidArgument("`wire` must be 0 or a low-precision format + 1, but got " + std::to_string(wire)));
  }
  return static_cast<ops::LowFormat>(wire - 1);
}

// `input_arg`: None (in place) or the tensor whose values are reduced into `tensor`.
void TeamAllReduce(std::uint64_t team, py::handle tensor_arg, py::handle input_arg, int op, StreamHandle stream,
                   int wire, int role) {
  const CallRole call_role = RoleArg(role);
  struct Args {
    DataType dtype;
    std::optional<ops::LowFormat> format;
    void* ptr;
    std::size_t bytes;
    const void* in;
    KeepAlive keep;
  };
  Args a = Collectively(team, Collective::kAllReduce, stream, call_role, [&] {
    const at::Tensor& tensor = TensorArg(tensor_arg, "tensor");
    Args args{ReduceDtypeArg(tensor, tensor), WireArg(wire), DataPointer(tensor, "tensor"), ByteSize(tensor), nullptr,
              nullptr};
    if (input_arg.is_none()) {
      args.keep = Keep(stream, tensor);
      return args;
    }
    const at::Tensor& input = TensorArg(input_arg, "input");
    if (input.scalar_type() != tensor.scalar_type()) {
      throw StatusError(TypeError("`input` must have the dtype of `tensor` (" + DtypeName(tensor.scalar_type()) +
                                  "), but got " + DtypeName(input.scalar_type())));
    }
    if (ByteSize(input) != ByteSize(tensor)) {
      throw StatusError(InvalidArgument("`input` must have the " + std::to_string(ByteSize(tensor)) +
                                        " bytes of `tensor`, but got " + std::to_string(ByteSize(input))));
    }
    args.in = DataPointer(input, "input");
    args.keep = Keep(stream, tensor, input);
    return args;
  });
  py::gil_scoped_release nogil;
  ThrowIfError(R().AllReduce(team, a.ptr, a.bytes, a.dtype, static_cast<ReduceOp>(op), OnStream(stream),
                             std::move(a.keep), a.format, a.in, call_role));
}

void TeamReduceScatter(std::uint64_t team, py::handle output_arg, py::handle input_arg, int op, StreamHandle stream,
                       int wire, int role) {
  const CallRole call_role = RoleArg(role);
  struct Args {
    DataType dtype;
    std::optional<ops::LowFormat> format;
    void* out;
    std::size_t out_bytes;
    const void* in;
    std::size_t in_bytes;
    KeepAlive keep;
  };
  Args a = Collectively(team, Collective::kReduceScatter, stream, call_role, [&] {
    const at::Tensor& output = TensorArg(output_arg, "output");
    const at::Tensor& input = TensorArg(input_arg, "input");
    return Args{ReduceDtypeArg(output, input), WireArg(wire), DataPointer(output, "output"), ByteSize(output),
                DataPointer(input, "input"), ByteSize(input), Keep(stream, output, input)};
  });
  py::gil_scoped_release nogil;
  ThrowIfError(R().ReduceScatter(team, a.out, a.out_bytes, a.in, a.in_bytes, a.dtype, static_cast<ReduceOp>(op),
                                 OnStream(stream), std::move(a.keep), a.format, call_role));
}

// "sends[j]", the name of a sequence's item in messages.
std::string IndexedName(const char* name, std::size_t index) {
  return std::string(name) + "[" + std::to_string(index) + "]";
}

void TeamAllToAll(std::uint64_t team, py::handle send_args, py::handle receive_arg, py::handle receive_counts_arg,
                  StreamHandle stream, int role) {
  const CallRole call_role = RoleArg(role);
  struct Args {
    ElementType type;
    std::vector<std::pair<const void*, std::size_t>> views;
    std::vector<std::uint64_t> receive_counts;
    void* out;
    std::size_t out_bytes;
    KeepAlive keep;
  };
  Args a = Collectively(team, Collective::kAllToAll, stream, call_role, [&] {
    const at::Tensor& receive = TensorArg(receive_arg, "receive");
    Args args{ElementTypeOf(receive), {}, {}, nullptr, ByteSize(receive), nullptr};
    if (!PyList_Check(send_args.ptr()) && !PyTuple_Check(send_args.ptr())) {
      throw StatusError(TypeError("`sends` must be a list or tuple of tensors, but got " + PyTypeName(send_args)));
    }
    if (!PyList_Check(receive_counts_arg.ptr()) && !PyTuple_Check(receive_counts_arg.ptr())) {
      throw StatusError(TypeError("`receive_counts` must be a list or tuple of ints, but got " +
                                  PyTypeName(receive_counts_arg)));
    }
    const auto nsends = static_cast<std::size_t>(PySequence_Fast_GET_SIZE(send_args.ptr()));
    PyObject** send_items = PySequence_Fast_ITEMS(send_args.ptr());
    args.views.reserve(nsends);
    for (std::size_t j = 0; j < nsends; ++j) {
      const std::string name = IndexedName("sends", j);   // short: no allocation
      const at::Tensor& send = TensorArg(send_items[j], name.c_str());
      args.views.emplace_back(DataPointer(send, name.c_str()), ByteSize(send));
    }
    const auto ncounts = static_cast<std::size_t>(PySequence_Fast_GET_SIZE(receive_counts_arg.ptr()));
    PyObject** count_items = PySequence_Fast_ITEMS(receive_counts_arg.ptr());
    args.receive_counts.resize(ncounts);
    for (std::size_t i = 0; i < ncounts; ++i) {
      int overflow = 0;
      const long long count =
          PyLong_CheckExact(count_items[i]) ? PyLong_AsLongLongAndOverflow(count_items[i], &overflow) : -1;
      args.receive_counts[i] = static_cast<std::uint64_t>(
          count >= 0 && overflow == 0 ? count
                                      : IntArg(count_items[i], IndexedName("receive_counts", i).c_str(), 0,
                                               std::numeric_limits<std::int64_t>::max(), "[0, 9223372036854775807]"));
    }
    args.out = DataPointer(receive, "receive");
    if (stream != kDefaultStream) {   // the sends and the receive buffer live until the stream ran the call
      std::vector<at::Tensor> held{receive};
      for (std::size_t j = 0; j < nsends; ++j) held.push_back(THPVariable_Unpack(send_items[j]));
      args.keep = std::make_shared<const std::vector<at::Tensor>>(std::move(held));
    }
    return args;
  });
  py::gil_scoped_release nogil;
  ThrowIfError(R().AllToAll(team, a.views, a.out, a.out_bytes, a.receive_counts, a.type, OnStream(stream),
                            std::move(a.keep), call_role));
}

void TeamSend(std::uint64_t team, py::handle tensor_arg, int peer, StreamHandle stream) {
  const at::Tensor& tensor = TensorArg(tensor_arg, "tensor");
  const ElementType type = ElementTypeOf(tensor);
  const void* ptr = DataPointer(tensor, "tensor");
  KeepAlive keep = Keep(stream, tensor);
  py::gil_scoped_release nogil;
  ThrowIfError(R().Send(team, ptr, ByteSize(tensor), type, peer, OnStream(stream), std::move(keep)));
}

void TeamRecv(std::uint64_t team, py::handle tensor_arg, int peer, StreamHandle stream) {
  const at::Tensor& tensor = TensorArg(tensor_arg, "tensor");
  const ElementType type = ElementTypeOf(tensor);
  void* ptr = DataPointer(tensor, "tensor");
  KeepAlive keep = Keep(stream, tensor);
  py::gil_scoped_release nogil;
  ThrowIfError(R().Recv(team, ptr, ByteSize(tensor), type, peer, OnStream(stream), std::move(keep)));
}

std::vector<std::vector<std::int64_t>> TeamAgree(std::uint64_t team, int collective, const std::string& dtype,
                                                 std::uint64_t element_bytes, std::uint64_t count, int reduce_op,
                                                 int wire, int peer, const std::vector<std::int64_t>& values,
                                                 StreamHandle stream, int role) {
  Fingerprint fingerprint{};
  fingerprint.collective = static_cast<std::uint32_t>(collective);
  fingerprint.reduce_op = static_cast<std::uint32_t>(reduce_op);
  fingerprint.wire = static_cast<std::uint32_t>(wire);
  fingerprint.peer = peer;
  fingerprint.count = count;
  fingerprint.element_bytes = element_bytes;
  fingerprint.role = static_cast<std::uint32_t>(RoleArg(role));
  std::strncpy(fingerprint.dtype, dtype.c_str(), sizeof(fingerprint.dtype) - 1);
  Result<std::vector<std::vector<std::int64_t>>> rows = StateError("agree did not run");
  {
    py::gil_scoped_release nogil;
    rows = R().Agree(team, fingerprint, values, OnStream(stream));
  }
  return ValueOrThrow(std::move(rows));
}

// A refusal of the call `collective` that the Python side decided (a destroyed group, a freed tensor): raised on
// every member, naming this rank. `code`: a status code of status_codes().
void TeamRefuse(std::uint64_t team, int collective, int code, const std::string& message, StreamHandle stream,
                int role) {
  const CallRole call_role = RoleArg(role);
  if (code <= 0 || code > static_cast<int>(StatusCode::kInterrupted)) {
    throw StatusError(InvalidArgument("`code` must be a failure code of status_codes(), but got " + std::to_string(code)));
  }
  Status refused;
  {
    py::gil_scoped_release nogil;
    refused = R().Refuse(team, static_cast<Collective>(collective), Status(static_cast<StatusCode>(code), message),
                         OnStream(stream), call_role);
  }
  ThrowIfError(std::move(refused));
}

// This rank gives up the team's next sync (a failure of its own across nodes): members waiting there fail with
// `message`. Raises nothing itself.
void TeamGiveUp(std::uint64_t team, const std::string& message) {
  py::gil_scoped_release nogil;
  (void)R().GiveUp(team, StateError(message));
}

// The configuration a new lifecycle would use, parsed from the environment (ValueError on a bad value).
py::dict ReadConfig() {
  const Config config = ValueOrThrow(ParseConfig(ProcessEnv()));
  py::dict d;
  d["heap_size"] = config.heap_size;
  d["timeout_sec"] = config.timeout_sec;
  d["log_level"] = static_cast<int>(config.log_level);
  d["device"] = config.device;
  return d;
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
  return py::module_::import("json").attr("loads")(json);
}

}  // namespace
}  // namespace hp::shmem::torch_binding

namespace hp::shmem::torch_binding {
namespace {

// Sets the Python exception of a failed status: the class the Python layer registered for its code (Ctrl-C taken
// in a wait: the KeyboardInterrupt, or what the user's handler raised).
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

// ---- entries on the small-message path, without pybind11's dispatcher ----
//
// pybind11's dispatcher (overloads, keywords, type casters) costs about as much as the rest of a small collective's
// binding. These entries are plain METH_FASTCALL functions over the same bodies: positional arguments only (the
// runtime face calls them so), ints converted and checked as the data plane's are.

template <typename T>
T FastArg(PyObject* value, const char* name);

template <>
py::handle FastArg<py::handle>(PyObject* value, const char* /*name*/) {
  return value;
}

template <>
std::uint64_t FastArg<std::uint64_t>(PyObject* value, const char* name) {
  return static_cast<std::uint64_t>(IntArg(value, name, 0, std::numeric_limits<std::int64_t>::max(),
                                           "[0, 9223372036854775807]"));
}

template <>
int FastArg<int>(PyObject* value, const char* name) {
  if (value == nullptr) return 0;   // an optional trailing argument the caller left out
  return static_cast<int>(IntArg(value, name, std::numeric_limits<int>::min(), std::numeric_limits<int>::max(),
                                 "a C int"));
}

template <typename... Args, std::size_t... I>
void FastCall(void (*fn)(Args...), PyObject* const* arguments, const char* const* names, std::index_sequence<I...>) {
  // Braces convert left to right: the first bad argument is the one named.
  std::tuple<std::decay_t<Args>...> converted{FastArg<std::decay_t<Args>>(arguments[I], names[I])...};
  std::apply(fn, converted);
}

template <typename... Args>
constexpr std::size_t Arity(void (* /*fn*/)(Args...)) {
  return sizeof...(Args);
}

// `fn` called with Python's positional arguments, named `names` in errors; returns None. The last `optional` ints may
// be left out (0: a call role's forward).
template <auto Fn, const auto& Names, std::size_t Optional = 0>
PyObject* FastEntry(PyObject* /*module*/, PyObject* const* arguments, Py_ssize_t count) {
  constexpr std::size_t arity = Arity(Fn);
  static_assert(std::size(Names) == arity, "one name per argument");
  if (count < static_cast<Py_ssize_t>(arity - Optional) || count > static_cast<Py_ssize_t>(arity)) {
    PyErr_Format(PyExc_TypeError, "takes %zu positional arguments (%s, ...), but got %zd", arity, Names[0], count);
    return nullptr;
  }
  std::array<PyObject*, arity> given{};
  std::copy(arguments, arguments + count, given.begin());
  try {
    FastCall(Fn, given.data(), Names, std::make_index_sequence<arity>{});
  } catch (const StatusError& e) {
    SetPythonError(e);
    return nullptr;
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

constexpr const char* kAllGatherArgs[] = {"team", "output", "input", "stream", "role"};
constexpr const char* kAllToAllArgs[] = {"team", "sends", "receive", "receive_counts", "stream", "role"};
constexpr const char* kPointToPointArgs[] = {"team", "tensor", "peer", "stream"};
constexpr const char* kAllReduceArgs[] = {"team", "tensor", "input", "op", "stream", "wire", "role"};
constexpr const char* kReduceScatterArgs[] = {"team", "output", "input", "op", "stream", "wire", "role"};

// A METH_FASTCALL function (Python 3.11 names its type only privately).
using FastFunction = PyObject* (*)(PyObject*, PyObject* const*, Py_ssize_t);

// Adds `function` to `m` as `name` (the method table lives as long as the process).
void AddFastFunction(py::module_& m, const char* name, FastFunction function, const char* doc) {
  auto* def = new PyMethodDef{name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(function)),
                              METH_FASTCALL, doc};
  py::object callable = py::reinterpret_steal<py::object>(PyCFunction_NewEx(def, nullptr, m.attr("__name__").ptr()));
  if (!callable) throw py::error_already_set();
  m.attr(name) = callable;
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

  g_main_thread = std::this_thread::get_id();
  SetInterruptCheck(&PythonSignalPending);

  m.def("set_error_classes", &SetErrorClasses, "Maps status codes (int) to the Python exception classes to raise.");
  m.def("init", &Init, py::arg("rank"), py::arg("world_size"), py::arg("all_gather"), py::arg("barrier"));
  m.def("shutdown", &Shutdown, py::arg("rank"), py::arg("world_size"), py::arg("all_gather"), py::arg("barrier"));
  m.def("state", [] { return std::string(LifecycleStateName(Runtime::Instance().state())); });
  m.def("lifecycle", [] { return Runtime::Instance().lifecycle(); });
  m.def("empty", &EmptyTensor, py::arg("sizes"), py::arg("dtype"), py::arg("alignment"), py::arg("call_site"));
  m.def("free", &FreeTensor, py::arg("tensor"), py::arg("call_site"));
  m.def("peer_tensor", &PeerTensorOf, py::arg("tensor"), py::arg("pe"));
  m.def("put", &Put, py::arg("dst"), py::arg("src"), py::arg("pe"), py::arg("stream"));
  m.def("get", &Get, py::arg("dst"), py::arg("src"), py::arg("pe"), py::arg("stream"));
  m.def("signal", &Signal, py::arg("signal"), py::arg("value"), py::arg("pe"), py::arg("op"), py::arg("stream"));
  m.def("wait_signal", &WaitSignal, py::arg("signal"), py::arg("value"), py::arg("cmp"), py::arg("stream"));
  m.def("reduce", &Reduce, py::arg("dst"), py::arg("src"), py::arg("op"), py::arg("pes"), py::arg("stream"));
  m.def("barrier", &Barrier, py::arg("stream"));
  m.def("encode", &Encode, py::arg("src"), py::arg("dst"));
  m.def("decode", &Decode, py::arg("src"), py::arg("out"), py::arg("accumulate"));
  m.def("reduce_encoded", &ReduceEncoded, py::arg("out"), py::arg("own"), py::arg("sources"), py::arg("op"),
        py::arg("reencode"));
  m.attr("scale_block") = ops::kScaleBlock;
  AddFastFunction(m, "plain_eager", &PlainEagerEntry,
                  "plain_eager(*tensors): whether a call on them may skip torch's dispatcher");
  m.def("team_create", &TeamCreate, py::arg("pes"), py::arg("group_rank"), py::arg("all_gather"), py::arg("barrier"));
  m.def("team_release", [](std::uint64_t team) { ThrowIfError(R().ReleaseTeam(team)); }, py::arg("team"));
  m.def("team_describe", &TeamDescribe, py::arg("team"));
  m.def("team_barrier", &TeamBarrier, py::arg("team"), py::arg("stream"), py::arg("role") = 0);
  AddFastFunction(m, "all_gather", &FastEntry<&TeamAllGather, kAllGatherArgs, 1>,
                  "all_gather(team, output, input, stream, role=0)");
  AddFastFunction(m, "all_reduce", &FastEntry<&TeamAllReduce, kAllReduceArgs, 1>,
                  "all_reduce(team, tensor, input, op, stream, wire, role=0)");
  AddFastFunction(m, "reduce_scatter", &FastEntry<&TeamReduceScatter, kReduceScatterArgs, 1>,
                  "reduce_scatter(team, output, input, op, stream, wire, role=0)");
  AddFastFunction(m, "all_to_all", &FastEntry<&TeamAllToAll, kAllToAllArgs, 1>,
                  "all_to_all(team, sends, receive, receive_counts, stream, role=0)");
  AddFastFunction(m, "send", &FastEntry<&TeamSend, kPointToPointArgs>, "send(team, tensor, peer, stream)");
  AddFastFunction(m, "recv", &FastEntry<&TeamRecv, kPointToPointArgs>, "recv(team, tensor, peer, stream)");
  m.def("agree", &TeamAgree, py::arg("team"), py::arg("collective"), py::arg("dtype"), py::arg("element_bytes"),
        py::arg("count"),
        py::arg("reduce_op"), py::arg("wire"), py::arg("peer"), py::arg("values"), py::arg("stream"), py::arg("role") = 0);
  m.def("refuse", &TeamRefuse, py::arg("team"), py::arg("collective"), py::arg("code"), py::arg("message"),
        py::arg("stream"), py::arg("role") = 0);
  m.def("give_up", &TeamGiveUp, py::arg("team"), py::arg("message"));
  m.def("call_roles", [] {
    py::dict d;
    for (CallRole role : {CallRole::kForward, CallRole::kBackward, CallRole::kFusedGather, CallRole::kFusedScatter}) {
      d[CallRoleName(role)] = static_cast<int>(role);
    }
    return d;
  });
  // The enum numberings, defined once in the runtime: the Python layers read them from here.
  m.def("reduce_ops", [] {
    py::dict d;
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      d[ReduceOpName(op)] = static_cast<int>(op);
    }
    return d;
  });
  m.def("compare_ops", [] {
    py::dict d;
    for (CompareOp op : {CompareOp::kEq, CompareOp::kNe, CompareOp::kGt, CompareOp::kGe, CompareOp::kLt, CompareOp::kLe}) {
      d[CompareOpName(op)] = static_cast<int>(op);
    }
    return d;
  });
  m.def("signal_ops", [] {
    py::dict d;
    for (SignalOp op : {SignalOp::kSet, SignalOp::kAdd}) d[SignalOpName(op)] = static_cast<int>(op);
    return d;
  });
  // A fingerprint's wire format: 0 for full precision, else the low format + 1 (runtime/team.h).
  m.def("wire_formats", [] {
    py::dict d;
    d["full"] = static_cast<int>(kWireFull);
    for (ops::LowFormat f : {ops::LowFormat::kFloat8E4M3Fn, ops::LowFormat::kFloat8E5M2, ops::LowFormat::kFloat16,
                             ops::LowFormat::kBFloat16}) {
      d[ops::LowFormatName(f)] = static_cast<int>(f) + 1;
    }
    return d;
  });
  m.def("collectives", [] {
    py::dict d;
    for (Collective c : {Collective::kBarrier, Collective::kAllGather, Collective::kAllReduce, Collective::kReduceScatter,
                         Collective::kAllToAll, Collective::kFusedAllGatherMatmul,
                         Collective::kFusedMatmulReduceScatter, Collective::kRelease}) {
      d[CollectiveName(c)] = static_cast<int>(c);
    }
    return d;
  });
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
  m.def("log_level", [] { return static_cast<int>(Logger::Level()); });
  RegisterLogForwarding(m);   // the runtime's records for Python's logging (log_forwarding.h)
  RegisterSymmMemBackend(m);   // the host device as torch's symmetric-memory backend for CPU (symm_mem_backend.h)
  m.def("status_codes", [] {
    py::dict codes;
    for (int c = static_cast<int>(StatusCode::kOk); c <= static_cast<int>(StatusCode::kInterrupted); ++c) {
      codes[StatusCodeName(static_cast<StatusCode>(c))] = c;
    }
    return codes;
  });
}
