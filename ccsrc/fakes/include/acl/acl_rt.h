// Fake of CANN's acl/acl_rt.h: the ACL runtime calls of the ascend device, with the real signatures.
#ifndef HP_FAKE_ACL_ACL_RT_H_
#define HP_FAKE_ACL_ACL_RT_H_

#include <stddef.h>
#include <stdint.h>

#include "acl/acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum aclrtMemcpyKind {
  ACL_MEMCPY_HOST_TO_HOST,
  ACL_MEMCPY_HOST_TO_DEVICE,
  ACL_MEMCPY_DEVICE_TO_HOST,
  ACL_MEMCPY_DEVICE_TO_DEVICE,
} aclrtMemcpyKind;

typedef enum aclrtMemMallocPolicy {
  ACL_MEM_MALLOC_HUGE_FIRST,
  ACL_MEM_MALLOC_HUGE_ONLY,
  ACL_MEM_MALLOC_NORMAL_ONLY,
  ACL_MEM_MALLOC_HUGE_FIRST_P2P,
  ACL_MEM_MALLOC_HUGE_ONLY_P2P,
  ACL_MEM_MALLOC_NORMAL_ONLY_P2P,
} aclrtMemMallocPolicy;

aclError aclrtSetDevice(int32_t deviceId);
aclError aclrtGetDevice(int32_t *deviceId);
const char *aclrtGetSocName();

aclError aclrtCreateStream(aclrtStream *stream);
aclError aclrtDestroyStream(aclrtStream stream);
aclError aclrtSynchronizeStream(aclrtStream stream);
// timeout in milliseconds; -1 waits forever.
aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout);

aclError aclrtCreateEvent(aclrtEvent *event);
aclError aclrtDestroyEvent(aclrtEvent event);
aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream);
aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event);

// Memory of the current device.
aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy);
aclError aclrtFree(void *devPtr);
// Page-locked host memory: an aclrtMemcpyAsync with a side in it only enqueues, like a device-to-device one.
aclError aclrtMallocHost(void **hostPtr, size_t size);
aclError aclrtFreeHost(void *hostPtr);
// Synchronous copy of `count` bytes into a destination of `destMax` bytes; `kind` says which sides are device memory.
aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind);
// The same on `stream`. A copy with a side in pageable host memory returns once it ran (in the stream's order); a
// device-to-device copy, or one with its host side in aclrtMallocHost memory, only enqueues. ACL_MEMCPY_HOST_TO_HOST is
// refused (ACL_ERROR_RT_FEATURE_NOT_SUPPORT).
aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                          aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_ACL_ACL_RT_H_
