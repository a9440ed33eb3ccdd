#include "ops/wire_format.h"

namespace hp::shmem::ops {

const char* LowFormatName(LowFormat format) {
  switch (format) {
    case LowFormat::kFloat8E4M3Fn: return "float8_e4m3fn";
    case LowFormat::kFloat8E5M2: return "float8_e5m2";
    case LowFormat::kFloat16: return "float16";
    case LowFormat::kBFloat16: return "bfloat16";
  }
  return "?";
}

const char* LowFormatRefusal(LowFormat format, DataType dtype, ReduceOp op) {
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg) return "used with sum or avg only";
  if (!IsFloatingPoint(dtype)) return "used with floating-point tensors only";
  if (LowFormatBytes(format) >= DataTypeSize(dtype)) return "narrower than the tensor's dtype";
  return "";
}

WireSlotLayout WireSlotLayout::For(LowFormat format, std::size_t slot_bytes) {
  auto round_up = [](std::size_t value, std::size_t unit) { return (value + unit - 1) / unit * unit; };
  const std::size_t code_bytes = LowFormatBytes(format);
  WireSlotLayout layout;
  if (!LowFormatScaled(format)) {
    layout.capacity = slot_bytes / code_bytes / kScaleBlock * kScaleBlock;
    return layout;
  }
  // A block takes kScaleBlock codes and one float32 scale; the scales are padded once, at their end.
  std::size_t blocks = slot_bytes / (kScaleBlock * code_bytes + sizeof(float));
  while (blocks > 0 && round_up(blocks * sizeof(float), kSlotAlignment) + blocks * kScaleBlock * code_bytes > slot_bytes) {
    --blocks;
  }
  layout.capacity = blocks * kScaleBlock;
  layout.scale_bytes = round_up(blocks * sizeof(float), kSlotAlignment);
  return layout;
}

}  // namespace hp::shmem::ops
