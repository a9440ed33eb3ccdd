#include "runtime/device_factory.h"

#include "runtime/host/host_device.h"
#ifdef HP_WITH_ASCEND_DEVICE
#include "runtime/ascend/ascend_device.h"
#endif

namespace hp::shmem {

Result<std::unique_ptr<Device>> MakeDevice(const Config& config) {
  if (config.device == "host") return std::unique_ptr<Device>(std::make_unique<host::HostDevice>());
#ifdef HP_WITH_ASCEND_DEVICE
  if (config.device == "ascend") {
    return std::unique_ptr<Device>(std::make_unique<ascend::AscendDevice>(ascend::AscendDeviceOptions{config.tls_info}));
  }
#endif
  return StateError("device is not built into this module: device=" + config.device +
                    " built=host (build with -DHP_ASCEND_REAL_CANN=ON where CANN is installed)");
}

}  // namespace hp::shmem
