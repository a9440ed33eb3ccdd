// What a reduction combines and how: shared by the Device interface and every device's reduction kernels.
#pragma once

#include <cstddef>

namespace hp::shmem {

// Element types a reduction understands. Half-precision types accumulate in float32.
enum class DataType : int {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
};

// kAvg is the sum divided by the number of sources (integers: rejected by the callers, never reduced).
enum class ReduceOp : int { kSum = 0, kAvg = 1, kMax = 2, kMin = 3 };

const char* DataTypeName(DataType dtype);
const char* ReduceOpName(ReduceOp op);
std::size_t DataTypeSize(DataType dtype);
bool IsFloatingPoint(DataType dtype);

}  // namespace hp::shmem
