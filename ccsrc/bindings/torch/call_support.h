// What every entry of the binding needs around a runtime call: the runtime, the stream a call runs on, the tensors
// kept alive for a stream, and the argument conversions shared by the data plane and the teams.
#pragma once

#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <vector>

#include "runtime/runtime.h"

namespace hp::shmem::torch_binding {

inline Runtime& R() { return Runtime::Instance(); }

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
StreamHandle OnStream(StreamHandle stream);

// The runtime's element type of a reduction's tensors; both tensors must share it.
DataType ReduceDtypeArg(const at::Tensor& dst, const at::Tensor& src);

// A list or tuple of ints; their range is the runtime's check.
std::vector<int> PesArg(pybind11::handle value);

}  // namespace hp::shmem::torch_binding
