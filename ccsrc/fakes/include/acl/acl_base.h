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

// The element types and layouts of aclnn's tensor descriptors (real names and values).
typedef enum {
  ACL_DT_UNDEFINED = -1,
  ACL_FLOAT = 0,
  ACL_FLOAT16 = 1,
  ACL_INT8 = 2,
  ACL_INT32 = 3,
  ACL_UINT8 = 4,
  ACL_INT16 = 6,
  ACL_UINT16 = 7,
  ACL_UINT32 = 8,
  ACL_INT64 = 9,
  ACL_UINT64 = 10,
  ACL_DOUBLE = 11,
  ACL_BOOL = 12,
  ACL_STRING = 13,
  ACL_COMPLEX64 = 16,
  ACL_COMPLEX128 = 17,
  ACL_BF16 = 27,
} aclDataType;

typedef enum {
  ACL_FORMAT_UNDEFINED = -1,
  ACL_FORMAT_NCHW = 0,
  ACL_FORMAT_NHWC = 1,
  ACL_FORMAT_ND = 2,
} aclFormat;

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_ACL_ACL_BASE_H_
