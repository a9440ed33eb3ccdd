#include "bindings/torch/tensor_device.h"

#include <ATen/ops/from_blob.h>

#include <atomic>

namespace hp::shmem::torch_binding {
namespace {

at::Tensor WrapCpu(void* data, at::IntArrayRef sizes, const at::TensorOptions& options,
                   std::function<void(void*)> deleter) {
  return at::from_blob(data, sizes, deleter, options);
}

// Empty runs without the GIL, so another thread's Init may replace the active device while it reads it. Null:
// the host's (constant-initialised, so no other translation unit can see it before it is set up).
constinit std::atomic<const TensorDevice*> g_active{nullptr};

}  // namespace

const TensorDevice& HostTensorDevice() {
  static const TensorDevice host{c10::Device(c10::kCPU), "a cpu tensor (the host device), but got a tensor on ",
                                 &WrapCpu, nullptr};
  return host;
}

const TensorDevice& ActiveTensorDevice() {
  const TensorDevice* active = g_active.load(std::memory_order_acquire);
  return active == nullptr ? HostTensorDevice() : *active;
}

void SetActiveTensorDevice(const TensorDevice& device) { g_active.store(&device, std::memory_order_release); }

}  // namespace hp::shmem::torch_binding
