// Where the binding's tensors live and which stream Python's default stream stands for, by device: the CPU and
// the calling thread on the host device; the SHMEM NPU and torch_npu's current stream on the ascend device
// (npu/npu_tensors.h, compiled only where torch_npu is installed).
//
// The active one is that of the latest successful Init: a module built with the ascend device still runs the
// host device when the configuration asks for it, so the choice is made at run time, not at build time.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/TensorOptions.h>

#include <functional>
#include <string>

#include "runtime/device.h"

namespace hp::shmem::torch_binding {

struct TensorDevice {
  // Empty's tensors live here, and tensor arguments must: without an index it accepts every index of its type.
  c10::Device device;
  // What an argument on another device is told, between "`name` must be " and the device it is on.
  std::string mismatch;
  // Wraps memory of the symmetric heap as a tensor of `options` (dtype and `device`); its storage calls `deleter`
  // once it lets go of the memory.
  at::Tensor (*wrap)(void* data, at::IntArrayRef sizes, const at::TensorOptions& options,
                     std::function<void(void*)> deleter);
  // The stream of a data-plane call made on Python's default stream (0); null: the device's own default stream.
  StreamHandle (*default_stream)(c10::Device device);
};

// The CPU, at::from_blob, and the device's default stream.
const TensorDevice& HostTensorDevice();

// The tensor device of the latest successful Init; the host's before any. Safe from any thread.
const TensorDevice& ActiveTensorDevice();

// After a successful Init. `device` lives until the process ends.
void SetActiveTensorDevice(const TensorDevice& device);

}  // namespace hp::shmem::torch_binding
