// Fake of CANN's aclnnop/aclnn_div.h (ops-math): selfRef /= other (a scalar), with the real signatures.
#ifndef HP_FAKE_ACLNN_DIV_H_
#define HP_FAKE_ACLNN_DIV_H_

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnInplaceDivsGetWorkspaceSize(aclTensor *selfRef, const aclScalar *other,
                                                       uint64_t *workspaceSize, aclOpExecutor **executor);
ACLNN_API aclnnStatus aclnnInplaceDivs(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor,
                                       aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_ACLNN_DIV_H_
