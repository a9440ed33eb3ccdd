// The layouts, enum values and error codes of CANN SHMEM v1.5.1 and the ACL/aclnn types the ascend device and the
// fakes rely on, as compile-time checks. Included by the fakes' tests (against ccsrc/fakes/include) and by the
// header check (HP_CANN_HEADER_CHECK, against a real CANN header tree): the same assertions hold for both, so the
// fakes cannot drift from the release.
#pragma once

#include <cstddef>

#include <acl/acl.h>
#include <aclnn/acl_meta.h>
#include <shmem.h>

namespace hp::cann_layout {

// Init structures (include/host/shmem_host_def.h).
static_assert(sizeof(aclshmem_init_optional_attr_t) == 24, "optional init attributes are 24 bytes");
static_assert(offsetof(aclshmem_init_optional_attr_t, data_op_engine_type) == 4, "data_op_engine_type at 4");
static_assert(offsetof(aclshmem_init_optional_attr_t, shm_init_timeout) == 8, "shm_init_timeout at 8");
static_assert(offsetof(aclshmem_init_optional_attr_t, control_operation_timeout) == 16, "control timeout at 16");
static_assert(sizeof(aclshmemx_init_attr_t) == 120, "init attributes are 120 bytes in v1.5");
static_assert(offsetof(aclshmemx_init_attr_t, ip_port) == 8, "ip_port at 8");
static_assert(offsetof(aclshmemx_init_attr_t, local_mem_size) == 72, "local_mem_size at 72");
static_assert(offsetof(aclshmemx_init_attr_t, option_attr) == 80, "option_attr at 80");
static_assert(offsetof(aclshmemx_init_attr_t, comm_args) == 104, "comm_args at 104");
static_assert(offsetof(aclshmemx_init_attr_t, instance_id) == 112, "instance_id at 112");
static_assert(sizeof(aclshmemx_uniqueid_t) == 136, "the unique id is 136 bytes");
static_assert(ACLSHMEM_UNIQUEID_VERSION == (1 << 16) + 136, "unique id version");
static_assert(DEFAULT_TIMEOUT == 120, "the bootstrap timeout of unique-id mode");

// Enums and flags.
static_assert(ACLSHMEMX_INIT_WITH_UNIQUEID == 8 && ACLSHMEMX_INIT_WITH_DEFAULT == 1, "bootstrap flags");
static_assert(ACLSHMEM_STATUS_NOT_INITIALIZED == 0 && ACLSHMEM_STATUS_SHM_CREATED == 1 &&
                  ACLSHMEM_STATUS_IS_INITIALIZED == 2,
              "init states");
static_assert(ACLSHMEM_SIGNAL_SET == 0 && ACLSHMEM_SIGNAL_ADD == 1, "signal ops");
static_assert(ACLSHMEM_CMP_EQ == 0 && ACLSHMEM_CMP_NE == 1 && ACLSHMEM_CMP_GT == 2 && ACLSHMEM_CMP_GE == 3 &&
                  ACLSHMEM_CMP_LT == 4 && ACLSHMEM_CMP_LE == 5,
              "compare ops");
static_assert(ACLSHMEM_DATA_OP_MTE == 0x01 && ACLSHMEM_DATA_OP_ROCE == 0x04 && ACLSHMEM_DATA_OP_MAX == 0x08,
              "data engines");
static_assert(DEVICE_SIDE == 1, "heap sides");

// Error codes.
static_assert(ACLSHMEM_SUCCESS == 0 && ACLSHMEM_INVALID_PARAM == -1 && ACLSHMEM_INVALID_VALUE == -2 &&
                  ACLSHMEM_SMEM_ERROR == -3 && ACLSHMEM_INNER_ERROR == -4 && ACLSHMEM_NOT_INITED == -5 &&
                  ACLSHMEM_BOOTSTRAP_ERROR == -6 && ACLSHMEM_TIMEOUT_ERROR == -7 && ACLSHMEM_MALLOC_FAILED == -8 &&
                  ACLSHMEM_DL_FUNC_FAILED == -9 && ACLSHMEM_INNER_TIMEOUT == -10 &&
                  ACLSHMEM_UNDER_API_UNLOAD == -11 && ACLSHMEM_NOT_SUPPORTED == -100,
              "CANN SHMEM error codes");
static_assert(ACL_SUCCESS == 0 && ACL_ERROR_RT_PARAM_INVALID == 107000 && ACL_ERROR_RT_INVALID_DEVICEID == 107001 &&
                  ACL_ERROR_RT_CONTEXT_NULL == 107002 && ACL_ERROR_RT_WAIT_TIMEOUT == 107019 &&
                  ACL_ERROR_RT_TASK_TIMEOUT == 107020 && ACL_ERROR_RT_MEMORY_ALLOCATION == 207001 &&
                  ACL_ERROR_RT_DEVICE_OOM == 207018 && ACL_ERROR_RT_INTERNAL_ERROR == 507000 &&
                  ACL_ERROR_RT_AICORE_EXCEPTION == 507015 && ACL_ERROR_RT_STREAM_SYNC_TIMEOUT == 507046 &&
                  ACL_ERROR_RT_EVENT_SYNC_TIMEOUT == 507047,
              "ACL runtime error codes");
static_assert(ACL_ERROR_RT_STREAM_CAPTURED == 107027 && ACL_ERROR_RT_STREAM_NOT_CAPTURED == 107029 &&
                  ACL_ERROR_RT_CAPTURE_MODE_NOT_SUPPORT == 107030 &&
                  ACL_ERROR_RT_STREAM_CAPTURE_INVALIDATED == 507903,
              "ACL graph-capture error codes");

// Graph capture (acl/acl_mdl.h).
static_assert(ACL_MODEL_RI_CAPTURE_MODE_GLOBAL == 0 && ACL_MODEL_RI_CAPTURE_MODE_THREAD_LOCAL == 1 &&
                  ACL_MODEL_RI_CAPTURE_MODE_RELAXED == 2,
              "capture modes");
static_assert(ACL_MODEL_RI_CAPTURE_STATUS_NONE == 0 && ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE == 1 &&
                  ACL_MODEL_RI_CAPTURE_STATUS_INVALIDATED == 2,
              "capture states");
static_assert(sizeof(aclmdlRI) == sizeof(void*), "aclmdlRI is a handle");
static_assert(ACLSHMEM_TEAM_WORLD == 0 && ACLSHMEM_TEAM_INVALID == -1, "team handles");
static_assert(SCALAR_DATA_CACHELINE_SIZE == 64, "the cache line a SET writes back");

// The heap CANN maps and what init takes from it (include/host_device/shmem_common_types.h).
static_assert(ACLSHMEM_PAGE_SIZE == 2u << 20, "2 MiB pages");
static_assert(SYNC_POOL_SIZE == 5u << 20 && SYNC_COUNTERS_SIZE == 128u << 10, "init's sync pool and counters");
static_assert(ACLSHMEM_EXTRA_SIZE == 6u << 20, "6 MiB beyond local_mem_size");
static_assert(ACLSHMEM_MAX_PES == 16384, "PE limit");
static_assert(ACLSHMEM_MAX_LOCAL_SIZE == 40UL * 1024 * 1024 * 1024, "heap limit");

// ACL and aclnn types.
static_assert(ACL_FLOAT == 0 && ACL_FLOAT16 == 1 && ACL_INT8 == 2 && ACL_INT32 == 3 && ACL_UINT8 == 4 &&
                  ACL_INT64 == 9 && ACL_DOUBLE == 11 && ACL_BF16 == 27,
              "aclDataType values");
static_assert(ACL_FORMAT_ND == 2, "aclFormat ND");
static_assert(ACL_MEMCPY_HOST_TO_DEVICE == 1 && ACL_MEMCPY_DEVICE_TO_HOST == 2, "memcpy kinds");
static_assert(sizeof(aclnnStatus) == 4, "aclnnStatus is int32_t");

}  // namespace hp::cann_layout
