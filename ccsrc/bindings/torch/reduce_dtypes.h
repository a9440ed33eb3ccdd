// The runtime's element type of a reduction over tensors of a torch dtype: one table for every entry of the binding
// that reduces (module.cc's team and local reductions, the symm_mem operators of symm_mem_ops.cc), each of which
// words its own error for a dtype outside it.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>

#include "ops/reduce_op.h"

namespace hp::shmem::torch_binding {

// The dtypes ReduceDataTypeOf takes, as messages list them.
inline constexpr const char* kReducibleDtypes = "float32, float64, float16, bfloat16, int8, uint8, int32, int64";

// The reduction's DataType of `type`; nullopt where the runtime does not reduce it.
inline std::optional<DataType> ReduceDataTypeOf(c10::ScalarType type) {
  switch (type) {
    case c10::kFloat: return DataType::kFloat32;
    case c10::kDouble: return DataType::kFloat64;
    case c10::kHalf: return DataType::kFloat16;
    case c10::kBFloat16: return DataType::kBFloat16;
    case c10::kChar: return DataType::kInt8;
    case c10::kByte: return DataType::kUInt8;
    case c10::kInt: return DataType::kInt32;
    case c10::kLong: return DataType::kInt64;
    default: return std::nullopt;
  }
}

}  // namespace hp::shmem::torch_binding
