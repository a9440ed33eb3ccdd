// The one place that includes CANN: the ACL runtime and the CANN SHMEM v1.5.1 host API. The build chooses the
// headers: the fakes in ccsrc/fakes/include (default, unit tests) or a real CANN installation
// (HP_ASCEND_REAL_CANN=ON, $ASCEND_HOME_PATH). Both are included as SYSTEM headers.
#pragma once

#include <acl/acl.h>
#include <shmem.h>
