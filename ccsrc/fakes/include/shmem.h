// Fake of CANN SHMEM v1.5.1's umbrella header include/shmem.h (host part only).
#ifndef HP_FAKE_SHMEM_H_
#define HP_FAKE_SHMEM_H_

#include "host/shmem_host_def.h"
#include "host/mem/shmem_host_heap.h"
#include "host/init/shmem_host_init.h"
#include "host/data_plane/shmem_host_rma.h"
#include "host/data_plane/shmem_host_so.h"
#include "host/data_plane/shmem_host_p2p_sync.h"
#include "host/data_plane/shmem_host_cc.h"
#include "host/team/shmem_host_team.h"

#endif  // HP_FAKE_SHMEM_H_
