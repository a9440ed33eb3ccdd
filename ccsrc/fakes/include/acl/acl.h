// Fake of CANN's umbrella acl/acl.h.
#ifndef HP_FAKE_ACL_ACL_H_
#define HP_FAKE_ACL_ACL_H_

#include "acl/acl_base.h"
#include "acl/acl_rt.h"
#include "acl/acl_mdl.h"

#endif  // HP_FAKE_ACL_ACL_H_
