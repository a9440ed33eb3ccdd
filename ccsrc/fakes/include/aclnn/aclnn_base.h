// Fake of CANN's aclnn/aclnn_base.h, which the operator headers include.
#ifndef HP_FAKE_ACLNN_ACLNN_BASE_H_
#define HP_FAKE_ACLNN_ACLNN_BASE_H_

#include "acl/acl_rt.h"
#include "aclnn/acl_meta.h"

#endif  // HP_FAKE_ACLNN_ACLNN_BASE_H_
