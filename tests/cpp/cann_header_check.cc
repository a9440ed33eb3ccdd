// The translation unit of the header check (-DHP_CANN_HEADER_CHECK=<include dirs>): the layout assertions of
// cann_layout.h against a real CANN header tree, and every declaration the ascend device uses, called with the
// argument types the device passes. Compiled, never linked or run.
#include "cann_layout.h"

#include <aclnnop/aclnn_add.h>
#include <aclnnop/aclnn_add_n.h>
#include <aclnnop/aclnn_cast.h>
#include <aclnnop/aclnn_div.h>
#include <aclnnop/aclnn_maximum.h>
#include <aclnnop/aclnn_minimum.h>
