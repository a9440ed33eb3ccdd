// Which device a lifecycle runs on: the runtime's configuration (HYPER_PARALLEL_SHMEM_DEVICE) decides, not the
// framework handlers, so that every handler (torch now, MindSpore next) gets the same devices the same way.
#pragma once

#include <memory>

#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/status.h"

namespace hp::shmem {

// The device `config.device` names, new and uninitialised. The ascend device exists only in a build against a real
// CANN installation (never on the fakes); asking for it elsewhere is a kStateError that says how to get it.
Result<std::unique_ptr<Device>> MakeDevice(const Config& config);

}  // namespace hp::shmem
