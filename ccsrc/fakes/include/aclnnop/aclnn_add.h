// Fake of CANN's aclnnop/aclnn_add.h (ops-math): selfRef += alpha * other, with the real signatures.
#ifndef HP_FAKE_ACLNN_ADD_H_
#define HP_FAKE_ACLNN_ADD_H_

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnInplaceAddGetWorkspaceSize(const aclTensor *selfRef, const aclTensor *other,
                                                      const aclScalar *alpha, uint64_t *workspaceSize,
                                                      aclOpExecutor **executor);
ACLNN_API aclnnStatus aclnnInplaceAdd(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                      aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_ACLNN_ADD_H_
