#include "runtime/status.h"

namespace hp::shmem {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kTypeError: return "TYPE_ERROR";
    case StatusCode::kStateError: return "STATE_ERROR";
    case StatusCode::kTimeout: return "TIMEOUT";
    case StatusCode::kOutOfMemory: return "OUT_OF_MEMORY";
    case StatusCode::kMismatch: return "MISMATCH";
    case StatusCode::kDeviceError: return "DEVICE_ERROR";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kInterrupted: return "INTERRUPTED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

}  // namespace hp::shmem
