// Fake of CANN's aclnnop/aclnn_maximum.h (ops-math): out = max(self, other), with the real signatures.
#ifndef HP_FAKE_ACLNN_MAXIMUM_H_
#define HP_FAKE_ACLNN_MAXIMUM_H_

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnMaximumGetWorkspaceSize(const aclTensor *self, const aclTensor *other, aclTensor *out,
                                                   uint64_t *workspaceSize, aclOpExecutor **executor);
ACLNN_API aclnnStatus aclnnMaximum(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                   aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_ACLNN_MAXIMUM_H_
