// The entry of each compiled variant of the host reduction kernels (see reduce_kernels.inc). Internal to ops/.
#pragma once

#include <cstddef>

#include "ops/reduce_op.h"

namespace hp::shmem::ops {

bool ReducePortable(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int nsrc, std::size_t count);
#if defined(HP_OPS_HAVE_AVX2_F16C)
bool ReduceAvx2F16c(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int nsrc, std::size_t count);
#endif

}  // namespace hp::shmem::ops
