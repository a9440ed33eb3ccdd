// The ascend device's tensor device: torch_npu tensors on the SHMEM NPU, and torch_npu's current stream for
// Python's default stream. Compiled only with the ascend device (HP_WITH_ASCEND_DEVICE), against torch_npu; this
// header names no torch_npu type, so that module.cc needs no torch_npu include path.
#pragma once

#include "bindings/torch/tensor_device.h"

namespace hp::shmem::torch_binding::npu {

// The tensor device of NPU `device_id` (the one the ascend device froze at Init); lives until the process ends.
const TensorDevice& NpuTensorDevice(int device_id);

}  // namespace hp::shmem::torch_binding::npu
