// Fake of CANN's aclnn/acl_meta.h: the descriptors of the two-phase operator API (aclnn*GetWorkspaceSize, then
// aclnn* on a stream), with the real signatures. Descriptors are host objects; the data stays where tensorData is.
#ifndef HP_FAKE_ACLNN_ACL_META_H_
#define HP_FAKE_ACLNN_ACL_META_H_

#include <stdint.h>

#include "acl/acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct aclOpExecutor aclOpExecutor;
typedef struct aclTensor aclTensor;
typedef struct aclScalar aclScalar;
typedef struct aclTensorList aclTensorList;
typedef int32_t aclnnStatus;

#ifndef ACLNN_API
#define ACLNN_API __attribute__((visibility("default")))
#endif

aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType, const int64_t *stride,
                           int64_t offset, aclFormat format, const int64_t *storageDims, uint64_t storageDimsNum,
                           void *tensorData);
aclScalar *aclCreateScalar(void *value, aclDataType dataType);
// A list of tensors (an operator's variable-length input). The list owns them: destroying it destroys each tensor.
aclTensorList *aclCreateTensorList(const aclTensor *const *value, uint64_t size);
aclnnStatus aclDestroyTensor(const aclTensor *tensor);
aclnnStatus aclDestroyScalar(const aclScalar *scalar);
aclnnStatus aclDestroyTensorList(const aclTensorList *array);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_ACLNN_ACL_META_H_
