// Fake of CANN's acl/acl_base.h: the base types of the ACL runtime that the ascend device and CANN SHMEM use.
// Same names, types and values as the real header; only what this project needs is declared.
#ifndef HP_FAKE_ACL_ACL_BASE_H_
#define HP_FAKE_ACL_ACL_BASE_H_

#include <stddef.h>
#include <stdint.h>

#include "acl/error_codes/rt_error_codes.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int aclError;
typedef void *aclrtStream;
typedef void *aclrtEvent;

static const int ACL_SUCCESS = 0;

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_ACL_ACL_BASE_H_
