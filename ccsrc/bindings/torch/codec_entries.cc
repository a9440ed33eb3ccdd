#include "bindings/torch/codec_entries.h"

#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings/torch/allocations.h"
#include "bindings/torch/arguments.h"
#include "bindings/torch/call_support.h"
#include "bindings/torch/status_error.h"
#include "ops/host/codec.h"
#include "ops/reduce_op.h"
#include "ops/wire_format.h"

namespace py = pybind11;

namespace hp::shmem::torch_binding {
namespace {

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

// A wire format by name (the low-precision formats' names, as torch spells the dtypes).
ops::LowFormat LowFormatByName(const std::string& name) {
  std::string names;
  for (int f = 0; f < ops::kLowFormats; ++f) {
    const auto format = static_cast<ops::LowFormat>(f);
    if (name == ops::LowFormatName(format)) return format;
    names += (f > 0 ? ", " : "") + std::string(ops::LowFormatName(format));
  }
  throw StatusError(InvalidArgument("`format` must be one of " + names + ", but got " + name));
}

// Rows of a tensor of at least one dimension: its first dimension, and the values of each row.
std::pair<std::size_t, std::size_t> RowShape(const at::Tensor& tensor, const char* name) {
  if (tensor.dim() < 1) {
    throw StatusError(InvalidArgument(std::string("`") + name + "` must have at least one dimension (its rows), "
                                      "but got a 0-d tensor"));
  }
  std::size_t row_elems = 1;
  for (std::int64_t d = 1; d < tensor.dim(); ++d) row_elems *= static_cast<std::size_t>(tensor.size(d));
  return {static_cast<std::size_t>(tensor.size(0)), row_elems};
}

// The wire rows of `rows` (uint8, rows x WireRowBytes) whose values `wide` (named `wide_name`) holds.
void CheckWireRows(const at::Tensor& wire, const char* wire_name, ops::LowFormat format, std::size_t rows,
                   std::size_t row_elems, const char* wide_name) {
  if (wire.scalar_type() != at::kByte) {
    throw StatusError(TypeError(std::string("`") + wire_name + "` must have dtype torch.uint8, but got " +
                                DtypeName(wire.scalar_type())));
  }
  const std::size_t expected = rows * ops::WireRowBytes(format, row_elems);
  if (static_cast<std::size_t>(wire.numel()) != expected) {
    throw StatusError(InvalidArgument(std::string("`") + wire_name + "` must have " + std::to_string(expected) +
                                      " bytes (" + std::to_string(rows) + " rows of `" + wide_name + "` in " +
                                      ops::LowFormatName(format) + "), but got " + std::to_string(wire.numel())));
  }
}

// MoE rows (ops/host/codec.h, HostEncodeRows): the rows (first dimension) of the values `wide` to or from their
// wire rows `wire`, encoding (`wide` is `src`, `wire` is `dst`) or decoding (`wire` is `src`, `wide` is `out`).
// Without `stream`: CPU tensors, by the host kernels on the calling thread. With it: tensors of the active tensor
// device, by the runtime's device on that stream (Runtime::EncodeRows: an NPU's rows stay on the NPU).
void CodeRows(py::handle wide_arg, py::handle wire_arg, const std::string& format_name, bool encode,
              std::optional<StreamHandle> stream) {
  const ops::LowFormat format = LowFormatByName(format_name);
  const char* wide_name = encode ? "src" : "out";
  const char* wire_name = encode ? "dst" : "src";
  const at::Tensor& wide = stream ? TensorArg(wide_arg, wide_name) : CpuTensorArg(wide_arg, wide_name);
  const DataType dtype = CodecFloatArg(wide, wide_name);
  const at::Tensor& wire = stream ? TensorArg(wire_arg, wire_name) : CpuTensorArg(wire_arg, wire_name);
  const auto [rows, row_elems] = RowShape(wide, wide_name);
  CheckWireRows(wire, wire_name, format, rows, row_elems, wide_name);
  CheckDisjoint(wide, wide_name, wire, wire_name);
  void* wide_ptr = DataPointer(wide, wide_name);
  void* wire_ptr = DataPointer(wire, wire_name);
  if (stream) {
    KeepAlive keep = Keep(*stream, wide, wire);
    py::gil_scoped_release nogil;
    const StreamHandle on = OnStream(*stream);
    ThrowIfError(encode ? R().EncodeRows(format, dtype, wide_ptr, rows, row_elems,
                                         wire_ptr, on, std::move(keep))
                        : R().DecodeRows(format, wire_ptr, rows, row_elems, dtype, wide_ptr, on, std::move(keep)));
    return;
  }
  bool done;
  {
    py::gil_scoped_release nogil;
    done = encode ? ops::HostEncodeRows(format, dtype, wide_ptr, rows, row_elems, wire_ptr)
                  : ops::HostDecodeRows(format, wire_ptr, rows, row_elems, dtype, wide_ptr);
  }
  if (!done) throw StatusError(Internal("the host codec refused checked arguments: rows"));
}

}  // namespace

void RegisterCodec(py::module_& m) {
  m.def("encode_rows", [](py::handle src, py::handle dst, const std::string& format,
                          std::optional<StreamHandle> stream) {
    CodeRows(src, dst, format, true, stream);
  }, py::arg("src"), py::arg("dst"), py::arg("format"), py::arg("stream") = py::none());
  m.def("decode_rows", [](py::handle src, py::handle out, const std::string& format,
                          std::optional<StreamHandle> stream) {
    CodeRows(out, src, format, false, stream);
  }, py::arg("src"), py::arg("out"), py::arg("format"), py::arg("stream") = py::none());
  m.def("wire_row_bytes", [](const std::string& format, std::size_t row_elems) {
    return ops::WireRowBytes(LowFormatByName(format), row_elems);
  }, py::arg("format"), py::arg("row_elems"));
  m.def("encode", &Encode, py::arg("src"), py::arg("dst"));
  m.def("decode", &Decode, py::arg("src"), py::arg("out"), py::arg("accumulate"));
  m.def("reduce_encoded", &ReduceEncoded, py::arg("out"), py::arg("own"), py::arg("sources"), py::arg("op"),
        py::arg("reencode"));
  m.attr("scale_block") = ops::kScaleBlock;
}

}  // namespace hp::shmem::torch_binding
