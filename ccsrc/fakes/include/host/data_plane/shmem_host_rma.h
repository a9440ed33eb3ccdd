// Fake of CANN SHMEM v1.5.1 include/host/data_plane/shmem_host_rma.h (the stream-enqueued calls and aclshmem_ptr).
// `elem_size` is a byte count: the release posts these copies with an element size of one byte.
#ifndef HP_FAKE_SHMEM_HOST_RMA_H_
#define HP_FAKE_SHMEM_HOST_RMA_H_

#include <stddef.h>
#include <stdint.h>

#include "acl/acl.h"
#include "host/shmem_host_def.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLSHMEM_HOST_API void *aclshmem_ptr(void *ptr, int pe);
ACLSHMEM_HOST_API void aclshmemx_getmem_on_stream(void *dst, void *src, size_t elem_size, int32_t pe,
                                                  aclrtStream stream);
ACLSHMEM_HOST_API void aclshmemx_putmem_on_stream(void *dst, void *src, size_t elem_size, int32_t pe,
                                                  aclrtStream stream);
ACLSHMEM_HOST_API void aclshmemx_quiet_on_stream(aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_SHMEM_HOST_RMA_H_
