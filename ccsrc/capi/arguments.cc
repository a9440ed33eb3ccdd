#include "capi/arguments.h"

#include <cstring>
#include <optional>
#include <string>

#include "capi/call.h"
#include "ops/reduce_op.h"
#include "ops/wire_format.h"
#include "runtime/numberings.h"
#include "runtime/runtime.h"

namespace hp::shmem::capi {
namespace {

// ---- the header's numbers are the runtime's ----

static_assert(HP_SHMEM_OK == Code(StatusCode::kOk));
static_assert(HP_SHMEM_INVALID_ARGUMENT == Code(StatusCode::kInvalidArgument));
static_assert(HP_SHMEM_TYPE_ERROR == Code(StatusCode::kTypeError));
static_assert(HP_SHMEM_STATE_ERROR == Code(StatusCode::kStateError));
static_assert(HP_SHMEM_TIMEOUT == Code(StatusCode::kTimeout));
static_assert(HP_SHMEM_OUT_OF_MEMORY == Code(StatusCode::kOutOfMemory));
static_assert(HP_SHMEM_MISMATCH == Code(StatusCode::kMismatch));
static_assert(HP_SHMEM_DEVICE_ERROR == Code(StatusCode::kDeviceError));
static_assert(HP_SHMEM_INTERNAL == Code(StatusCode::kInternal));
static_assert(HP_SHMEM_INTERRUPTED == Code(StatusCode::kInterrupted));

static_assert(HP_SHMEM_FLOAT32 == static_cast<int>(DataType::kFloat32));
static_assert(HP_SHMEM_FLOAT64 == static_cast<int>(DataType::kFloat64));
static_assert(HP_SHMEM_FLOAT16 == static_cast<int>(DataType::kFloat16));
static_assert(HP_SHMEM_BFLOAT16 == static_cast<int>(DataType::kBFloat16));
static_assert(HP_SHMEM_INT8 == static_cast<int>(DataType::kInt8));
static_assert(HP_SHMEM_UINT8 == static_cast<int>(DataType::kUInt8));
static_assert(HP_SHMEM_INT32 == static_cast<int>(DataType::kInt32));
static_assert(HP_SHMEM_INT64 == static_cast<int>(DataType::kInt64));

// The numbers the header promises in words (and the range checks below rely on): sum, avg, max, min; set, add;
// eq, ne, gt, ge, lt, le; float8_e4m3fn, float8_e5m2, float16, bfloat16.
static_assert(static_cast<int>(ReduceOp::kSum) == 0 && static_cast<int>(ReduceOp::kAvg) == 1 &&
              static_cast<int>(ReduceOp::kMax) == 2 && static_cast<int>(ReduceOp::kMin) == 3);
static_assert(static_cast<int>(SignalOp::kSet) == 0 && static_cast<int>(SignalOp::kAdd) == 1);
static_assert(HP_SHMEM_ROLE_FORWARD == static_cast<int>(CallRole::kForward) &&
              HP_SHMEM_ROLE_BACKWARD == static_cast<int>(CallRole::kBackward) &&
              HP_SHMEM_ROLE_FUSED_GATHER == static_cast<int>(CallRole::kFusedGather) &&
              HP_SHMEM_ROLE_FUSED_SCATTER == static_cast<int>(CallRole::kFusedScatter));
static_assert(static_cast<int>(CompareOp::kEq) == 0 && static_cast<int>(CompareOp::kNe) == 1 &&
              static_cast<int>(CompareOp::kGt) == 2 && static_cast<int>(CompareOp::kGe) == 3 &&
              static_cast<int>(CompareOp::kLt) == 4 && static_cast<int>(CompareOp::kLe) == 5);
static_assert(static_cast<int>(ops::LowFormat::kFloat8E4M3Fn) == 0 &&
              static_cast<int>(ops::LowFormat::kFloat8E5M2) == 1 && static_cast<int>(ops::LowFormat::kFloat16) == 2 &&
              static_cast<int>(ops::LowFormat::kBFloat16) == 3 && ops::kLowFormats == 4);
static_assert(static_cast<int>(LifecycleState::kUninitialized) == 0 &&
              static_cast<int>(LifecycleState::kInitialized) == 1 && static_cast<int>(LifecycleState::kFailed) == 2,
              "hp_shmem_state's numbers");
static_assert(static_cast<int>(SignalWidth::k32) == 4 && static_cast<int>(SignalWidth::k64) == 8);
// The element type's name travels in a fingerprint, NUL included.
constexpr std::size_t kMaxTypeName = sizeof(Fingerprint{}.dtype) - 1;
static_assert(kMaxTypeName == 23, "hp_shmem_element_type.name: at most 23 characters");
static_assert(HP_SHMEM_WIRE_FULL == static_cast<int>(kWireFull) &&
              HP_SHMEM_WIRE_FLOAT8_E4M3FN == static_cast<int>(ops::LowFormat::kFloat8E4M3Fn) + 1 &&
              HP_SHMEM_WIRE_FLOAT8_E5M2 == static_cast<int>(ops::LowFormat::kFloat8E5M2) + 1 &&
              HP_SHMEM_WIRE_FLOAT16 == static_cast<int>(ops::LowFormat::kFloat16) + 1 &&
              HP_SHMEM_WIRE_BFLOAT16 == static_cast<int>(ops::LowFormat::kBFloat16) + 1,
              "hp_shmem_wire: the runtime's wire_formats numbering");

}  // namespace

Status NonNull(const void* pointer, const char* name) {
  if (pointer != nullptr) return Status::Ok();
  return InvalidArgument(std::string("`") + name + "` must be a non-null pointer, but got NULL");
}

Status NonNullData(const void* pointer, std::size_t bytes, const char* name) {
  return bytes == 0 ? Status::Ok() : NonNull(pointer, name);
}

Status NonNegative(int value, const char* name) {
  if (value >= 0) return Status::Ok();
  return InvalidArgument(std::string("`") + name + "` must be >= 0, but got " + std::to_string(value));
}

Result<DataType> DtypeArg(int dtype, const char* name) {
  if (dtype >= HP_SHMEM_FLOAT32 && dtype <= HP_SHMEM_INT64) return static_cast<DataType>(dtype);
  return TypeError(std::string("`") + name +
                   "` must be one of 0 (float32), 1 (float64), 2 (float16), 3 (bfloat16), 4 (int8), 5 (uint8), "
                   "6 (int32), 7 (int64), but got " + std::to_string(dtype));
}

Result<ReduceOp> ReduceOpArg(int op) {
  if (op >= 0 && op <= 3) return static_cast<ReduceOp>(op);
  return InvalidArgument("`reduce_op` must be one of 0 (sum), 1 (avg), 2 (max), 3 (min), but got " +
                         std::to_string(op));
}

Result<SignalOp> SignalOpArg(int op) {
  if (op >= 0 && op <= 1) return static_cast<SignalOp>(op);
  return InvalidArgument("`signal_op` must be one of 0 (set), 1 (add), but got " + std::to_string(op));
}

Result<CompareOp> CompareOpArg(int op) {
  if (op >= 0 && op <= 5) return static_cast<CompareOp>(op);
  return InvalidArgument("`compare_op` must be one of 0 (eq), 1 (ne), 2 (gt), 3 (ge), 4 (lt), 5 (le), but got " +
                         std::to_string(op));
}

Result<SignalWidth> SignalWidthArg(int signal_bytes) {
  if (signal_bytes == 4) return SignalWidth::k32;
  if (signal_bytes == 8) return SignalWidth::k64;
  return InvalidArgument("`signal_bytes` must be 4 (int32) or 8 (int64), but got " + std::to_string(signal_bytes));
}

Result<ElementType> ElementTypeArg(const hp_shmem_element_type* type) {
  HP_RETURN_IF_ERROR(NonNull(type, "type"));
  HP_RETURN_IF_ERROR(NonNull(type->name, "type->name"));
  const std::size_t length = strnlen(type->name, kMaxTypeName + 1);
  if (length == 0 || length > kMaxTypeName) {
    return InvalidArgument("`type->name` must have 1 to " + std::to_string(kMaxTypeName) +
                           " characters, but got " + (length == 0 ? std::string("0") : std::string("more")));
  }
  if (type->bytes == 0) return InvalidArgument("`type->bytes` must be > 0, but got 0");
  ElementType element;
  element.name.assign(type->name, length);
  element.bytes = type->bytes;
  if (type->reduce_dtype != -1) {
    HP_ASSIGN_OR_RETURN(const DataType dtype, DtypeArg(type->reduce_dtype, "type->reduce_dtype"));
    if (DataTypeSize(dtype) != type->bytes) {
      return InvalidArgument("`type->bytes` must be " + std::to_string(DataTypeSize(dtype)) + " for reduce_dtype " +
                             DataTypeName(dtype) + ", but got " + std::to_string(type->bytes));
    }
    element.reducible = true;
    element.reduce_type = dtype;
  }
  return element;
}

Result<ops::LowFormat> LowWireArg(int wire) {
  if (wire >= HP_SHMEM_WIRE_FLOAT8_E4M3FN && wire <= HP_SHMEM_WIRE_BFLOAT16) {
    HP_ASSIGN_OR_RETURN(const std::optional<ops::LowFormat> format, WireFromNumber(wire));
    if (format.has_value()) return *format;
  }
  return InvalidArgument("`wire` must be one of 1 (float8_e4m3fn), 2 (float8_e5m2), 3 (float16), 4 (bfloat16), but "
                         "got " + std::to_string(wire));
}

Result<DataType> CodecDtypeArg(int dtype) {
  HP_ASSIGN_OR_RETURN(const DataType type, DtypeArg(dtype));
  if (IsFloatingPoint(type)) return type;
  return TypeError("`dtype` must be one of 0 (float32), 1 (float64), 2 (float16), 3 (bfloat16), but got " +
                   std::to_string(dtype) + " (" + DataTypeName(type) + ")");
}

}  // namespace hp::shmem::capi
