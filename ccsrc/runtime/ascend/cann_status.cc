#include "runtime/ascend/cann_status.h"

#include "runtime/ascend/cann_api.h"

namespace hp::shmem::ascend {
namespace {

std::string Describe(const char* call, int code, const char* name, const std::string& context) {
  std::string text = std::string(call) + " failed: cann_error_code=" + std::to_string(code) + " (" + name + ")";
  if (!context.empty()) text += " " + context;
  return text;
}

// A rejected argument is a broken contract: the message takes the contract form.
std::string Rejected(const char* call, int code, const char* name, const std::string& context) {
  std::string text = std::string("arguments of ") + call + " must be valid for CANN, but got cann_error_code=" +
                     std::to_string(code) + " (" + name + ")";
  if (!context.empty()) text += " " + context;
  return text;
}

}  // namespace

const char* ShmemErrorName(int code) {
  switch (code) {
    case ACLSHMEM_SUCCESS: return "ACLSHMEM_SUCCESS";
    case ACLSHMEM_INVALID_PARAM: return "ACLSHMEM_INVALID_PARAM";
    case ACLSHMEM_INVALID_VALUE: return "ACLSHMEM_INVALID_VALUE";
    case ACLSHMEM_SMEM_ERROR: return "ACLSHMEM_SMEM_ERROR";
    case ACLSHMEM_INNER_ERROR: return "ACLSHMEM_INNER_ERROR";
    case ACLSHMEM_NOT_INITED: return "ACLSHMEM_NOT_INITED";
    case ACLSHMEM_BOOTSTRAP_ERROR: return "ACLSHMEM_BOOTSTRAP_ERROR";
    case ACLSHMEM_TIMEOUT_ERROR: return "ACLSHMEM_TIMEOUT_ERROR";
    case ACLSHMEM_MALLOC_FAILED: return "ACLSHMEM_MALLOC_FAILED";
    case ACLSHMEM_DL_FUNC_FAILED: return "ACLSHMEM_DL_FUNC_FAILED";
    case ACLSHMEM_INNER_TIMEOUT: return "ACLSHMEM_INNER_TIMEOUT";
    case ACLSHMEM_UNDER_API_UNLOAD: return "ACLSHMEM_UNDER_API_UNLOAD";
    case ACLSHMEM_NOT_SUPPORTED: return "ACLSHMEM_NOT_SUPPORTED";
    default: return "unknown";
  }
}

const char* AclErrorName(int code) {
  switch (code) {
    case ACL_SUCCESS: return "ACL_SUCCESS";
    case ACL_ERROR_RT_PARAM_INVALID: return "ACL_ERROR_RT_PARAM_INVALID";
    case ACL_ERROR_RT_INVALID_DEVICEID: return "ACL_ERROR_RT_INVALID_DEVICEID";
    case ACL_ERROR_RT_CONTEXT_NULL: return "ACL_ERROR_RT_CONTEXT_NULL";
    case ACL_ERROR_RT_WAIT_TIMEOUT: return "ACL_ERROR_RT_WAIT_TIMEOUT";
    case ACL_ERROR_RT_TASK_TIMEOUT: return "ACL_ERROR_RT_TASK_TIMEOUT";
    case ACL_ERROR_RT_MEMORY_ALLOCATION: return "ACL_ERROR_RT_MEMORY_ALLOCATION";
    case ACL_ERROR_RT_DEVICE_OOM: return "ACL_ERROR_RT_DEVICE_OOM";
    case ACL_ERROR_RT_STREAM_SYNC_TIMEOUT: return "ACL_ERROR_RT_STREAM_SYNC_TIMEOUT";
    case ACL_ERROR_RT_EVENT_SYNC_TIMEOUT: return "ACL_ERROR_RT_EVENT_SYNC_TIMEOUT";
    default: return "ACL_ERROR";
  }
}

Status FromShmemCode(int code, const char* call, const std::string& context) {
  const char* name = ShmemErrorName(code);
  switch (code) {
    case ACLSHMEM_SUCCESS:
      return Status::Ok();
    case ACLSHMEM_INVALID_PARAM:
    case ACLSHMEM_INVALID_VALUE:
      return InvalidArgument(Rejected(call, code, name, context));
    case ACLSHMEM_NOT_INITED:
      return StateError(Describe(call, code, name, context));
    case ACLSHMEM_TIMEOUT_ERROR:
    case ACLSHMEM_INNER_TIMEOUT:
      return Timeout(Describe(call, code, name, context));
    case ACLSHMEM_MALLOC_FAILED:
      return OutOfMemory(Describe(call, code, name, context));
    default:
      return DeviceError(Describe(call, code, name, context));
  }
}

Status FromAclError(int code, const char* call, const std::string& context) {
  const char* name = AclErrorName(code);
  switch (code) {
    case ACL_SUCCESS:
      return Status::Ok();
    case ACL_ERROR_RT_STREAM_SYNC_TIMEOUT:
    case ACL_ERROR_RT_EVENT_SYNC_TIMEOUT:
    case ACL_ERROR_RT_WAIT_TIMEOUT:
    case ACL_ERROR_RT_TASK_TIMEOUT:
      return Timeout(Describe(call, code, name, context));
    case ACL_ERROR_RT_MEMORY_ALLOCATION:
    case ACL_ERROR_RT_DEVICE_OOM:
      return OutOfMemory(Describe(call, code, name, context));
    case ACL_ERROR_RT_PARAM_INVALID:
    case ACL_ERROR_RT_INVALID_DEVICEID:
      return InvalidArgument(Rejected(call, code, name, context));
    case ACL_ERROR_RT_CONTEXT_NULL:
      return StateError(Describe(call, code, name, context));
    default:
      return DeviceError(Describe(call, code, name, context));
  }
}

}  // namespace hp::shmem::ascend
