// The one place that includes CANN: the ACL runtime, the aclnn operators of the reductions and casts, and the CANN
// SHMEM v1.5.1 host API. The build chooses the
// headers: the fakes in ccsrc/fakes/include (default, unit tests) or a real CANN installation
// (HP_ASCEND_REAL_CANN=ON, $ASCEND_HOME_PATH). Both are included as SYSTEM headers.
#pragma once

#include <acl/acl.h>
#include <aclnn/acl_meta.h>
#include <aclnnop/aclnn_add.h>
#include <aclnnop/aclnn_add_n.h>
#include <aclnnop/aclnn_cast.h>
#include <aclnnop/aclnn_div.h>
#include <aclnnop/aclnn_maximum.h>
#include <aclnnop/aclnn_minimum.h>
#include <shmem.h>
