// CANN return codes as runtime Statuses. Every Status keeps the CANN code in its message
// ("cann_error_code=-7 (ACLSHMEM_TIMEOUT_ERROR)"), so that debug_state()'s latest_failure shows it.
#pragma once

#include <string>

#include "runtime/status.h"

namespace hp::shmem::ascend {

// "ACLSHMEM_TIMEOUT_ERROR", or "unknown" for a code CANN SHMEM v1.5.1 does not define.
const char* ShmemErrorName(int code);
// "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT" for the ACL runtime codes the device tells apart, "ACL_ERROR" otherwise.
const char* AclErrorName(int code);

// A CANN SHMEM return code (aclshmem_error_code_t) of `call`; `context` adds "key=value" facts.
//   invalid param/value -> kInvalidArgument   not inited -> kStateError   timeout, inner timeout -> kTimeout
//   malloc failed -> kOutOfMemory             everything else (and unknown codes) -> kDeviceError
Status FromShmemCode(int code, const char* call, const std::string& context = "");
// An ACL runtime return code (aclError) of `call`.
//   stream/event sync, wait and task timeouts -> kTimeout   memory allocation, device OOM -> kOutOfMemory
//   invalid param/device id -> kInvalidArgument             no current context -> kStateError
//   everything else -> kDeviceError
Status FromAclError(int code, const char* call, const std::string& context = "");

}  // namespace hp::shmem::ascend
