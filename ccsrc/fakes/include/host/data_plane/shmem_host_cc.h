// Fake of CANN SHMEM v1.5.1 include/host/data_plane/shmem_host_cc.h (barriers on a stream).
#ifndef HP_FAKE_SHMEM_HOST_CC_H_
#define HP_FAKE_SHMEM_HOST_CC_H_

#include "acl/acl.h"
#include "host/shmem_host_def.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLSHMEM_HOST_API void aclshmemx_barrier_all_on_stream(aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_SHMEM_HOST_CC_H_
