// The runtime's Bootstrap over a framework's C callbacks (hp_shmem_bootstrap).
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "capi/arguments.h"
#include "capi/hp_shmem.h"
#include "runtime/bootstrap.h"
#include "runtime/status.h"

namespace hp::shmem::capi {

class CBootstrap final : public Bootstrap {
 public:
  explicit CBootstrap(const hp_shmem_bootstrap& callbacks) : callbacks_(callbacks) {}

  // The contract of the struct itself; rank and world size are the runtime's checks.
  static Status Check(const hp_shmem_bootstrap* bootstrap) {
    HP_RETURN_IF_ERROR(NonNull(bootstrap, "bootstrap"));
    if (bootstrap->all_gather == nullptr) {
      return InvalidArgument("`bootstrap->all_gather` must be a non-null function pointer, but got NULL");
    }
    if (bootstrap->barrier == nullptr) {
      return InvalidArgument("`bootstrap->barrier` must be a non-null function pointer, but got NULL");
    }
    return Status::Ok();
  }

  int rank() const override { return callbacks_.rank; }
  int world_size() const override { return callbacks_.world_size; }

  Status AllGather(const void* in, std::size_t bytes, void* out) override {
    char error[kErrorBytes] = {};
    const int code = callbacks_.all_gather(callbacks_.context, in, bytes, out, error, sizeof(error));
    return FromCallback(code, error, "all_gather");
  }

  Status Barrier() override {
    char error[kErrorBytes] = {};
    const int code = callbacks_.barrier(callbacks_.context, error, sizeof(error));
    return FromCallback(code, error, "barrier");
  }

 private:
  static constexpr std::size_t kErrorBytes = 1024;

  // The callback's code and message; a code outside the header's is a device error (the framework failed).
  static Status FromCallback(int code, char* error, const char* what) {
    if (code == HP_SHMEM_OK) return Status::Ok();
    error[kErrorBytes - 1] = '\0';   // a callback that ignored error_bytes still ends here
    std::string message(error);
    if (message.empty()) {
      message = std::string("bootstrap ") + what + " callback failed without a message: code=" + std::to_string(code);
    }
    if (code < HP_SHMEM_INVALID_ARGUMENT || code > HP_SHMEM_INTERRUPTED) {
      return DeviceError(message + " (bootstrap " + what + " returned unknown code=" + std::to_string(code) + ")");
    }
    return Status(static_cast<StatusCode>(code), std::move(message));
  }

  hp_shmem_bootstrap callbacks_;
};

}  // namespace hp::shmem::capi
