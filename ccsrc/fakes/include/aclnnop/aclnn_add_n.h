// Fake of CANN's aclnnop/aclnn_add_n.h (ops-math, math/add_n/op_api): out = tensors[0] + ... + tensors[n-1], with the
// real signatures.
#ifndef HP_FAKE_ACLNN_ADD_N_H_
#define HP_FAKE_ACLNN_ADD_N_H_

#include "aclnn/aclnn_base.h"

#ifdef __cplusplus
extern "C" {
#endif

ACLNN_API aclnnStatus aclnnAddNGetWorkspaceSize(const aclTensorList *tensors, aclTensor *out, uint64_t *workspaceSize,
                                                aclOpExecutor **executor);
ACLNN_API aclnnStatus aclnnAddN(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif  // HP_FAKE_ACLNN_ADD_N_H_
