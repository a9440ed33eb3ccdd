// Checks of the Python arguments of the data-plane entries, in the project's contract form.
//
// They run in C++ because they sit on the hot path of every put/get/signal: the same checks in Python cost
// more than the operation they guard. Only the binding's entry files include this (it needs torch's Python headers).
#pragma once

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <limits>
#include <string>

#include "bindings/torch/status_error.h"
#include "bindings/torch/tensor_device.h"

namespace hp::shmem::torch_binding {

inline std::string PyTypeName(pybind11::handle value) {
  return pybind11::str(pybind11::type::of(value).attr("__name__"));
}

// "torch.float32", as Python prints the dtype.
inline std::string DtypeName(at::ScalarType type) {
  return pybind11::str(pybind11::handle(reinterpret_cast<PyObject*>(torch::getTHPDtype(type))));
}

inline std::string IntList(c10::IntArrayRef values) {
  std::string text = "[";
  for (std::size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

// `value` as a tensor, or a TypeError naming the argument.
inline const at::Tensor& UnpackTensor(pybind11::handle value, const char* name) {
  if (!THPVariable_Check(value.ptr())) {
    throw StatusError(TypeError(std::string("`") + name + "` must be a torch.Tensor, but got " + PyTypeName(value)));
  }
  return THPVariable_Unpack(value.ptr());
}

// No lazy conjugation or negation: the tensor's bytes are its values.
inline void CheckResolved(const at::Tensor& tensor, const char* name) {
  if (tensor.is_conj() || tensor.is_neg()) {   // lazy views: their bytes are not their values
    throw StatusError(InvalidArgument(std::string("`") + name +
                                      "` must have its lazy conjugation or negation resolved (call .resolve_conj() "
                                      "or .resolve_neg()), but got a " + (tensor.is_conj() ? "conjugate" : "negative") +
                                      " view"));
  }
}

inline void CheckContiguous(const at::Tensor& tensor, const char* name) {
  if (!tensor.is_contiguous()) {
    throw StatusError(InvalidArgument(std::string("`") + name + "` must be contiguous, but got a tensor of shape " +
                                      IntList(tensor.sizes()) + " and strides " + IntList(tensor.strides())));
  }
}

// A tensor of any layout on the active tensor device: any CPU tensor on the host device, a tensor on the SHMEM
// NPU (npu:N) on the ascend device.
inline const at::Tensor& StridedTensorArg(pybind11::handle value, const char* name) {
  const at::Tensor& tensor = UnpackTensor(value, name);
  const TensorDevice& active = ActiveTensorDevice();
  const c10::Device device = tensor.device();
  if (device.type() != active.device.type() || (active.device.has_index() && device.index() != active.device.index())) {
    throw StatusError(InvalidArgument(std::string("`") + name + "` must be " + active.mismatch + device.str()));
  }
  CheckResolved(tensor, name);
  return tensor;
}

// A contiguous tensor on the active tensor device (the data plane moves plain byte ranges).
inline const at::Tensor& TensorArg(pybind11::handle value, const char* name) {
  const at::Tensor& tensor = StridedTensorArg(value, name);
  CheckContiguous(tensor, name);
  return tensor;
}

// A contiguous CPU tensor, whatever the active tensor device: an operand of the host kernels.
inline const at::Tensor& CpuTensorArg(pybind11::handle value, const char* name) {
  const at::Tensor& tensor = UnpackTensor(value, name);
  if (!tensor.device().is_cpu()) {
    throw StatusError(InvalidArgument(std::string("`") + name + "` must be a CPU tensor, but got a tensor on " +
                                      tensor.device().str()));
  }
  CheckResolved(tensor, name);
  CheckContiguous(tensor, name);
  return tensor;
}

// A Python int (not a bool) that fits in [low, high]; `range_text` describes the range in the message.
inline std::int64_t IntArg(pybind11::handle value, const char* name, std::int64_t low, std::int64_t high,
                           const std::string& range_text) {
  if (!PyLong_Check(value.ptr()) || PyBool_Check(value.ptr())) {
    throw StatusError(TypeError(std::string("`") + name + "` must be an int, but got " + PyTypeName(value)));
  }
  int overflow = 0;
  const long long parsed = PyLong_AsLongLongAndOverflow(value.ptr(), &overflow);
  if (overflow != 0 || parsed < low || parsed > high) {
    throw StatusError(InvalidArgument(std::string("`") + name + "` must fit in " + range_text + ", but got " +
                                      std::string(pybind11::str(value))));
  }
  return parsed;
}

inline int PeArg(pybind11::handle value) {
  return static_cast<int>(IntArg(value, "pe", std::numeric_limits<int>::min(), std::numeric_limits<int>::max(),
                                 "a C int"));
}

// A one-element int32 or int64 tensor, and a value that fits its dtype.
inline std::int64_t SignalValueArg(const at::Tensor& signal, pybind11::handle value) {
  const bool is32 = signal.scalar_type() == at::kInt;
  if (!is32 && signal.scalar_type() != at::kLong) {
    throw StatusError(TypeError("`signal_tensor` must be an int32 or int64 tensor, but got " +
                                DtypeName(signal.scalar_type())));
  }
  if (signal.numel() != 1) {
    throw StatusError(InvalidArgument("`signal_tensor` must have exactly one element, but got " +
                                      std::to_string(signal.numel())));
  }
  if (is32) {
    return IntArg(value, "value", std::numeric_limits<std::int32_t>::min(), std::numeric_limits<std::int32_t>::max(),
                  "torch.int32 [-2147483648, 2147483647]");
  }
  return IntArg(value, "value", std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max(),
                "torch.int64 [-9223372036854775808, 9223372036854775807]");
}

}  // namespace hp::shmem::torch_binding
