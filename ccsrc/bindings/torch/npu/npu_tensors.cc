#include "bindings/torch/npu/npu_tensors.h"

#include <c10/util/Exception.h>
#include <torch_npu/csrc/aten/common/from_blob.h>
#include <torch_npu/csrc/core/npu/NPUStream.h>

#include <limits>
#include <map>
#include <mutex>

#include "bindings/torch/status_error.h"

namespace hp::shmem::torch_binding::npu {
namespace {

// torch_npu's from_blob, not at::from_blob: torch_npu's kernels take every npu storage for its NPUStorageImpl
// (which carries the memory format) and every npu tensor for an NPUTensorImpl, and only its own factory makes them.
at::Tensor WrapNpu(void* data, at::IntArrayRef sizes, const at::TensorOptions& options,
                   std::function<void(void*)> deleter) {
  return at_npu::native::from_blob(data, sizes, std::move(deleter), options, options.device());
}

std::string Unavailable(c10::Device device, const std::string& why) {
  return "torch_npu's current stream is unavailable: device=" + device.str() + " (" + why + ")";
}

// torch_npu's current stream on `device`. stream() first drains torch_npu's task queue (the ops it launches from a
// thread of its own), so that what this call enqueues runs after the torch ops issued before it.
StreamHandle CurrentStream(c10::Device device) {
  aclrtStream stream = nullptr;
  try {
    stream = c10_npu::getCurrentNPUStream(device.index()).stream();
  } catch (const c10::Error& e) {
    throw StatusError(DeviceError(Unavailable(device, e.what_without_backtrace())));
  }
  // torch_npu answers null when the queue failed to drain; null would read as the device's own default stream.
  if (stream == nullptr) throw StatusError(DeviceError(Unavailable(device, "its task queue failed to drain")));
  return reinterpret_cast<StreamHandle>(stream);
}

}  // namespace

const TensorDevice& NpuTensorDevice(int device_id) {
  if (device_id < 0 || device_id > std::numeric_limits<c10::DeviceIndex>::max()) {
    throw StatusError(Internal("NPU index outside torch's device indices: device_id=" + std::to_string(device_id)));
  }
  static std::mutex mu;
  // Never destroyed: the active tensor device points into it until the process ends.
  static auto* devices = new std::map<int, TensorDevice>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = devices->find(device_id);
  if (it == devices->end()) {
    // torch_npu names PrivateUse1 "npu" when it loads, so device.str() reads "npu:0".
    const c10::Device device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device_id));
    TensorDevice npu{device, "a tensor on " + device.str() + " (the SHMEM device), but got ", &WrapNpu, &CurrentStream};
    it = devices->emplace(device_id, std::move(npu)).first;
  }
  return it->second;
}

}  // namespace hp::shmem::torch_binding::npu
