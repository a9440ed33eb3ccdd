// Fake of CANN SHMEM v1.5.1 include/host/data_plane/shmem_host_cc.h (barriers on a stream).
#ifndef HP_FAKE_SHMEM_HOST_CC_H_
#define HP_FAKE_SHMEM_HOST_CC_H_

#include "acl/acl.h"
#include "host/shmem_host_def.h"

#ifdef __cplusplus
extern "C" {
#endif

// One kernel each: every member reads every other member's sync word in place, so every member must be mapped (MTE).
ACLSHMEM_HOST_API void aclshmemx_barrier_on_stream(aclshmem_team_t team, aclrtStream stream);
ACLSHMEM_HOST_API void aclshmemx_barrier_all_on_stream(aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_SHMEM_HOST_CC_H_
