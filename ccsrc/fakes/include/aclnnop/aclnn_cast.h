// Fake of CANN's aclnnop/aclnn_cast.h (ops-math): out = self converted to dtype, with the real signatures.
#ifndef HP_FAKE_ACLNN_CAST_H_
#define HP_FAKE_ACLNN_CAST_H_

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnCastGetWorkspaceSize(const aclTensor *self, const aclDataType dtype, aclTensor *out,
                                                uint64_t *workspaceSize, aclOpExecutor **executor);
ACLNN_API aclnnStatus aclnnCast(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_ACLNN_CAST_H_
