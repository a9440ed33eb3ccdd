// Fake of CANN's aclnnop/aclnn_minimum.h (ops-math): out = min(self, other), with the real signatures.
#ifndef HP_FAKE_ACLNN_MINIMUM_H_
#define HP_FAKE_ACLNN_MINIMUM_H_

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnMinimumGetWorkspaceSize(const aclTensor *self, const aclTensor *other, aclTensor *out,
                                                   uint64_t *workspaceSize, aclOpExecutor **executor);
ACLNN_API aclnnStatus aclnnMinimum(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                   aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_ACLNN_MINIMUM_H_
