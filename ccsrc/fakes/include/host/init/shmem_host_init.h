// Fake of CANN SHMEM v1.5.1 include/host/init/shmem_host_init.h (the calls the ascend device makes).
#ifndef HP_FAKE_SHMEM_HOST_INIT_H_
#define HP_FAKE_SHMEM_HOST_INIT_H_

#include "host/shmem_host_def.h"
#include "host_device/shmem_common_types.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLSHMEM_HOST_API int aclshmemx_init_status(void);
ACLSHMEM_HOST_API int aclshmemx_get_uniqueid(aclshmemx_uniqueid_t *uid);
// Stores `uid` in attributes->comm_args: it must stay alive until aclshmemx_init_attr returns.
ACLSHMEM_HOST_API int aclshmemx_set_attr_uniqueid_args(int my_pe, int n_pes, int64_t local_mem_size,
                                                       aclshmemx_uniqueid_t *uid,
                                                       aclshmemx_init_attr_t *aclshmem_attr);
ACLSHMEM_HOST_API int aclshmemx_init_attr(aclshmemx_bootstrap_t bootstrap_flags, aclshmemx_init_attr_t *attributes);
ACLSHMEM_HOST_API int aclshmem_finalize(void);
ACLSHMEM_HOST_API void aclshmem_info_get_version(int *major, int *minor);
// Stores the `tls_info` pointer (no copy): it must stay alive until aclshmemx_init_attr returns. In unique-id mode
// v1.5.1's bootstrap plugin hands it to the config store and then turns TLS off again in init_config_store()
// (src/host/bootstrap/shmemi_bootstrap_config_store.cpp): the store always runs without TLS.
ACLSHMEM_HOST_API int32_t aclshmemx_set_conf_store_tls(bool enable, const char *tls_info,
                                                       const uint32_t tls_info_len);
// Stores the TLS private key, its password and the password's decrypter (pointers, no copies).
ACLSHMEM_HOST_API int32_t aclshmemx_set_config_store_tls_key(const char *tls_pk, const uint32_t tls_pk_len,
                                                             const char *tls_pk_pw, const uint32_t tls_pk_pw_len,
                                                             const aclshmem_decrypt_handler decrypt_handler);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_SHMEM_HOST_INIT_H_
