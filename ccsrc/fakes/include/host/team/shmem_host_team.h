// Fake of CANN SHMEM v1.5.1 include/host/team/shmem_host_team.h (the PE queries).
#ifndef HP_FAKE_SHMEM_HOST_TEAM_H_
#define HP_FAKE_SHMEM_HOST_TEAM_H_

#include "host/shmem_host_def.h"

#ifdef __cplusplus
extern "C" {
#endif

// A team of the world PEs pe_start, pe_start + pe_stride, ... (pe_size of them, in the parent's numbering). Local:
// no barrier; a PE outside it gets ACLSHMEM_TEAM_INVALID and success.
ACLSHMEM_HOST_API int aclshmem_team_split_strided(aclshmem_team_t parent_team, int pe_start, int pe_stride, int pe_size,
                                                  aclshmem_team_t *new_team);
ACLSHMEM_HOST_API void aclshmem_team_destroy(aclshmem_team_t team);
ACLSHMEM_HOST_API int aclshmem_my_pe(void);
ACLSHMEM_HOST_API int aclshmem_n_pes(void);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_SHMEM_HOST_TEAM_H_
