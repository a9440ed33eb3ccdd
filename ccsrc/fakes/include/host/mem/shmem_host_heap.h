// Fake of CANN SHMEM v1.5.1 include/host/mem/shmem_host_heap.h.
#ifndef HP_FAKE_SHMEM_HOST_HEAP_H_
#define HP_FAKE_SHMEM_HOST_HEAP_H_

#include <stddef.h>

#include "host/shmem_host_def.h"

#ifdef __cplusplus
extern "C" {
#endif

// malloc, calloc and align allocate locally, then end with a control-plane barrier over every PE (collective, bounded
// by the control-operation timeout; a failed barrier releases the block and returns NULL). free is local.
ACLSHMEM_HOST_API void *aclshmem_malloc(size_t size);
ACLSHMEM_HOST_API void *aclshmem_calloc(size_t nmemb, size_t size);
ACLSHMEM_HOST_API void *aclshmem_align(size_t alignment, size_t size);
ACLSHMEM_HOST_API void aclshmem_free(void *ptr);
ACLSHMEM_HOST_API void *aclshmemx_get_heap_base(aclshmem_mem_type_t mem_type = DEVICE_SIDE);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_SHMEM_HOST_HEAP_H_
