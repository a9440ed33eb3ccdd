// Fake of CANN SHMEM v1.5.1 include/host_device/shmem_common_types.h: the enums and limits that the host API of
// the ascend device uses. Names, underlying types and values are those of the release; nothing else is declared.
#ifndef HP_FAKE_SHMEM_COMMON_TYPES_H_
#define HP_FAKE_SHMEM_COMMON_TYPES_H_

#include <stdint.h>

#include "acl/acl_rt.h"

#ifdef __cplusplus
extern "C" {
#endif

enum aclshmem_team_index_t { ACLSHMEM_TEAM_INVALID = -1, ACLSHMEM_TEAM_WORLD = 0 };

// A bit mask of the engines a PE may use for data operations.
enum data_op_engine_type_t {
  ACLSHMEM_DATA_OP_MTE = 0x01,
  ACLSHMEM_DATA_OP_SDMA = 0x02,
  ACLSHMEM_DATA_OP_ROCE = 0x04,
  ACLSHMEM_DATA_OP_UDMA = 0x08,
  ACLSHMEM_DATA_OP_MAX = 0x08,
};

enum aclshmem_mem_type_t { HOST_SIDE = 0, DEVICE_SIDE };

enum aclshmem_signal_op_type_t { ACLSHMEM_SIGNAL_SET, ACLSHMEM_SIGNAL_ADD };

enum aclshmem_cmp_op_type_t {
  ACLSHMEM_CMP_EQ = 0,
  ACLSHMEM_CMP_NE,
  ACLSHMEM_CMP_GT,
  ACLSHMEM_CMP_GE,
  ACLSHMEM_CMP_LT,
  ACLSHMEM_CMP_LE
};

typedef int aclshmem_team_t;

#define ACLSHMEM_MAX_PES 16384
#define ACLSHMEM_MAX_LOCAL_SIZE (40UL * 1024 * 1024 * 1024)
// The heap is mapped in pages of this size: local_mem_size is a multiple of it.
#define ACLSHMEM_PAGE_SIZE (1024UL * 1024UL * 2)
#define ALIGN_TO(size, page) (((size) + (page) - 1) / (page) * (page))

// What init takes from the heap for itself (src/host/team/shmem_team.cpp): a sync pool and sync counters for every
// team. The heap CANN maps is local_mem_size + ACLSHMEM_EXTRA_SIZE (src/host/init/shmem_init.cpp).
#define ACLSHMEM_MAX_TEAMS 2048
#define SCALAR_DATA_CACHELINE_SIZE 64
#define ACLSHMEM_SYNCBIT_SIZE SCALAR_DATA_CACHELINE_SIZE
#define SYNC_LOG_MAX_PES 5
#define ACLSHMEM_BARRIER_TG_DISSEM_KVAL 8
#define SYNC_ARRAY_SIZE (ACLSHMEM_SYNCBIT_SIZE * SYNC_LOG_MAX_PES * ACLSHMEM_BARRIER_TG_DISSEM_KVAL)
#define SYNC_COUNTER_SIZE ACLSHMEM_SYNCBIT_SIZE
#define SYNC_POOL_SIZE (SYNC_ARRAY_SIZE * ACLSHMEM_MAX_TEAMS)
#define SYNC_COUNTERS_SIZE (SYNC_COUNTER_SIZE * ACLSHMEM_MAX_TEAMS)
#define ACLSHMEM_EXTRA_SIZE_UNALIGNED SYNC_POOL_SIZE
#define ACLSHMEM_EXTRA_SIZE ALIGN_TO(ACLSHMEM_EXTRA_SIZE_UNALIGNED, ACLSHMEM_PAGE_SIZE)

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_SHMEM_COMMON_TYPES_H_
