// Element-wise reductions of host memory: dst[i] = op over k of srcs[k][i].
//
// The kernels are compiled once portably and, on x86-64, once more for AVX2 + F16C; HostReduce picks the best
// variant the CPU supports (isa.h).
#pragma once

#include <cstddef>

#include "ops/host/isa.h"
#include "ops/reduce_op.h"

namespace hp::shmem::ops {

// Reduces `count` elements of `dtype` from each of `nsrc` sources into `dst`, combining the sources in their
// order (which matters for floating-point sums). Float16 and bfloat16 accumulate in float32 and are rounded once
// (to nearest even) when written; kAvg divides the sum by nsrc before that rounding. Integer sums wrap like
// torch's; max and min propagate NaN like torch.maximum/minimum.
//
// `dst` may be one of the sources exactly (in place); otherwise it must not overlap any of them. Returns false,
// writing nothing, for what it does not compute: no source, kAvg of an integer dtype, a variant the CPU lacks.
bool HostReduce(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int nsrc, std::size_t count);
bool HostReduce(HostIsa isa, DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int nsrc,
                std::size_t count);

}  // namespace hp::shmem::ops
