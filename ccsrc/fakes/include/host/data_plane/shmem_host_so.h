// Fake of CANN SHMEM v1.5.1 include/host/data_plane/shmem_host_so.h (signal operations on a stream).
#ifndef HP_FAKE_SHMEM_HOST_SO_H_
#define HP_FAKE_SHMEM_HOST_SO_H_

#include <stdint.h>

#include "acl/acl.h"
#include "host/shmem_host_def.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLSHMEM_HOST_API void aclshmemx_signal_op_on_stream(int32_t *sig_addr, int32_t signal, int sig_op, int pe,
                                                     aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_SHMEM_HOST_SO_H_
