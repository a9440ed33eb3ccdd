// Fake of CANN SHMEM v1.5.1 include/host/data_plane/shmem_host_p2p_sync.h (signal waits on a stream).
#ifndef HP_FAKE_SHMEM_HOST_P2P_SYNC_H_
#define HP_FAKE_SHMEM_HOST_P2P_SYNC_H_

#include <stdint.h>

#include "acl/acl.h"
#include "host/shmem_host_def.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLSHMEM_HOST_API void aclshmemx_signal_wait_until_on_stream(int32_t *sig_addr, int cmp, int32_t cmp_val,
                                                             aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_SHMEM_HOST_P2P_SYNC_H_
