// Fake of CANN SHMEM v1.5.1 include/host/shmem_host_def.h: error codes, init flags and the init structures, with
// the release's layouts (tests/cpp/test_cann_fakes.cc asserts the sizes CANN documents: 24, 120 and 136 bytes).
#ifndef HP_FAKE_SHMEM_HOST_DEF_H_
#define HP_FAKE_SHMEM_HOST_DEF_H_

#include <climits>
#include <stddef.h>
#include <stdint.h>

#include "host_device/shmem_common_types.h"

#ifdef __cplusplus
extern "C" {
#endif

constexpr uint16_t ACLSHMEM_UNIQUE_ID_INNER_LEN = 124;
constexpr int DEFAULT_TIMEOUT = 120;

#define ACLSHMEM_HOST_API __attribute__((visibility("default")))
#define ACLSHMEM_MAX_IP_PORT_LEN 64

// The release declares this alias at global scope; the fake keeps it so that a clash shows up here first.
using Result = int32_t;

enum aclshmem_error_code_t : int {
  ACLSHMEM_SUCCESS = 0,
  ACLSHMEM_INVALID_PARAM = -1,
  ACLSHMEM_INVALID_VALUE = -2,
  ACLSHMEM_SMEM_ERROR = -3,
  ACLSHMEM_INNER_ERROR = -4,
  ACLSHMEM_NOT_INITED = -5,
  ACLSHMEM_BOOTSTRAP_ERROR = -6,
  ACLSHMEM_TIMEOUT_ERROR = -7,
  ACLSHMEM_MALLOC_FAILED = -8,
  ACLSHMEM_DL_FUNC_FAILED = -9,
  ACLSHMEM_INNER_TIMEOUT = -10,
  ACLSHMEM_UNDER_API_UNLOAD = -11,
  ACLSHMEM_NOT_SUPPORTED = -100,
};

enum aclshmemx_bootstrap_t : int {
  ACLSHMEMX_INIT_WITH_DEFAULT = 1 << 0,
  ACLSHMEMX_INIT_WITH_MPI = 1 << 1,
  ACLSHMEMX_INIT_WITH_UNIQUEID = 1 << 3,
  ACLSHMEMX_INIT_MAX = 1 << 31
};

enum aclshmemx_init_status_t {
  ACLSHMEM_STATUS_NOT_INITIALIZED = 0,
  ACLSHMEM_STATUS_SHM_CREATED,
  ACLSHMEM_STATUS_IS_INITIALIZED,
  ACLSHMEM_STATUS_INVALID = INT_MAX,
};

typedef struct {
  int version;
  data_op_engine_type_t data_op_engine_type;
  uint32_t shm_init_timeout;
  uint32_t shm_create_timeout;
  uint32_t control_operation_timeout;
  int32_t sockFd;
} aclshmem_init_optional_attr_t;

// Default member initialisers as in the release: a value-initialised attribute is ready for
// aclshmemx_set_attr_uniqueid_args.
typedef struct aclshmemx_init_attr_t {
  int my_pe;
  int n_pes;
  char ip_port[ACLSHMEM_MAX_IP_PORT_LEN] = {};
  uint64_t local_mem_size;
  aclshmem_init_optional_attr_t option_attr = {(1 << 16) + sizeof(aclshmem_init_optional_attr_t),
                                               ACLSHMEM_DATA_OP_MTE, DEFAULT_TIMEOUT, DEFAULT_TIMEOUT,
                                               DEFAULT_TIMEOUT};
  void *comm_args = nullptr;
  uint64_t instance_id = 0;
} aclshmemx_init_attr_t;

typedef struct {
  int32_t version;
  int my_pe;
  int n_pes;
  char internal[ACLSHMEM_UNIQUE_ID_INNER_LEN];
} aclshmemx_uniqueid_t;

// Decrypts the TLS private key's password (aclshmemx_set_config_store_tls_key).
typedef int (*aclshmem_decrypt_handler)(const char *cipherText, size_t cipherTextLen, char *plainText,
                                        size_t &plainTextLen);

constexpr int32_t ACLSHMEM_UNIQUEID_VERSION = (1 << 16) + sizeof(aclshmemx_uniqueid_t);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_SHMEM_HOST_DEF_H_
