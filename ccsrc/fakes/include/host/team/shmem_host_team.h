// Fake of CANN SHMEM v1.5.1 include/host/team/shmem_host_team.h (the PE queries).
#ifndef HP_FAKE_SHMEM_HOST_TEAM_H_
#define HP_FAKE_SHMEM_HOST_TEAM_H_

#include "host/shmem_host_def.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLSHMEM_HOST_API int aclshmem_my_pe(void);
ACLSHMEM_HOST_API int aclshmem_n_pes(void);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_SHMEM_HOST_TEAM_H_
