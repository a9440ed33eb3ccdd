// The wire formats of low-precision communication, and how a run of them is laid out in a staging slot: shared by
// the Device interface, every device's codec and the collective engine.
#pragma once

#include <cstddef>

#include "ops/reduce_op.h"

namespace hp::shmem::ops {

// The wire formats (with torch's names). The fp8 ones are block-scaled (ops/host/codec.h): e4m3fn has no infinity
// and one NaN per sign (largest finite 448); e5m2 is float16's upper byte (largest finite 57344, with infinities and
// NaN). float16 and bfloat16 travel as the plain cast (round to nearest even, like torch's), without scales.
enum class LowFormat : int { kFloat8E4M3Fn = 0, kFloat8E5M2 = 1, kFloat16 = 2, kBFloat16 = 3 };
constexpr int kLowFormats = 4;
const char* LowFormatName(LowFormat format);
// Whether `value` names a format (a number that crossed a language boundary).
constexpr bool IsLowFormat(int value) { return value >= 0 && value < kLowFormats; }
// Whether the format carries a scale per kScaleBlock values (the fp8 ones).
constexpr bool LowFormatScaled(LowFormat format) {
  return format == LowFormat::kFloat8E4M3Fn || format == LowFormat::kFloat8E5M2;
}
// Bytes of one code.
constexpr std::size_t LowFormatBytes(LowFormat format) { return LowFormatScaled(format) ? 1 : 2; }
// Whether values of `dtype` reduced with `op` may travel in `format`: 'sum' or 'avg' of a floating-point dtype wider
// than the format ("" when they may, else the rule that is broken, for a message).
const char* LowFormatRefusal(LowFormat format, DataType dtype, ReduceOp op);

// Bytes of one MoE wire row of `row_elems` values (ops/host/codec.h, HostEncodeRows): the fp8 formats' float32
// scale of the row, then one code per value.
constexpr std::size_t WireRowBytes(LowFormat format, std::size_t row_elems) {
  return (LowFormatScaled(format) ? sizeof(float) : 0) + row_elems * LowFormatBytes(format);
}

// Values per scale.
constexpr std::size_t kScaleBlock = 128;
// The scales a run of `count` values has.
constexpr std::size_t ScaleCount(std::size_t count) { return (count + kScaleBlock - 1) / kScaleBlock; }

// A staging slot of `slot_bytes` holding one encoded run: the float32 scales of `capacity` values (fp8 formats),
// padded to kSlotAlignment, then the codes. `capacity` is the largest whole number of blocks that fits (0: the slot
// cannot hold one block).
struct WireSlotLayout {
  static constexpr std::size_t kSlotAlignment = 64;
  std::size_t capacity = 0;      // values
  std::size_t scale_bytes = 0;   // where the codes start
  static WireSlotLayout For(LowFormat format, std::size_t slot_bytes);
};

}  // namespace hp::shmem::ops
