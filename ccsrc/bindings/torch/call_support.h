// What every entry of the binding needs around a runtime call: the runtime, the stream a call runs on, the tensors
// kept alive for a stream, and the argument conversions shared by the data plane and the teams.
#pragma once

#include <ATen/record_function.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <optional>
#include <vector>

#include "runtime/runtime.h"

// A named range "hyper_parallel_shmem::<name>" in torch.profiler's traces for the rest of the calling scope, as
// torch's own collectives have. Nothing is built while no callback wants it (torch.profiler is off): an
// at::RecordFunction built for nothing costs a visible part of a small collective (docs/perf.md).
#define HP_PROFILED_RANGE(name) ::hp::shmem::torch_binding::ProfiledRange hp_profiled_range("hyper_parallel_shmem::" name)

namespace hp::shmem::torch_binding {

inline Runtime& R() { return Runtime::Instance(); }

class ProfiledRange {
 public:
  explicit ProfiledRange(const char* name) {
    // The check torch's dispatcher makes before every operator.
    auto callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::FUNCTION);
    if (C10_UNLIKELY(callbacks.has_value())) {
      range_.emplace(std::move(*callbacks));
      if (range_->isActive()) range_->before(name);
    }
  }
  ProfiledRange(const ProfiledRange&) = delete;
  ProfiledRange& operator=(const ProfiledRange&) = delete;

 private:
  std::optional<at::RecordFunction> range_;
};

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
std::vector<int> PesArg(pybind11::handle value, const char* name = "pes");

}  // namespace hp::shmem::torch_binding
