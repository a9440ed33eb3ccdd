// The fake aclnn operator API: tensor and scalar descriptors, and the operators the ascend device reduces and casts
// with (in-place add, maximum, minimum, in-place division by a scalar, cast), in CANN's two phases. The first phase
// checks the descriptors and builds a one-shot executor; the second enqueues it on a stream, where it reads and
// writes NPU memory through the fakes' host views: memory of the launching NPU, or the heap of a PE that NPU maps
// (reached through aclshmem_ptr, over HCCS). Host memory, or a peer's heap the NPU does not map (aclshmem_ptr
// answers an address for it all the same), faults the kernel, as on an NPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "aclnn/acl_meta.h"
#include "aclnnop/aclnn_add.h"
#include "aclnnop/aclnn_cast.h"
#include "aclnnop/aclnn_div.h"
#include "aclnnop/aclnn_maximum.h"
#include "aclnnop/aclnn_minimum.h"
#include "fake_world.h"

using hp::fakes::FakeCall;
using hp::fakes::kAclnnErrParamInvalid;
using hp::fakes::kAclnnErrParamNullptr;
using hp::fakes::kAclnnWorkspaceBytes;
using hp::fakes::internal::CurrentProcess;
using hp::fakes::internal::HostView;
using hp::fakes::internal::Pe;
using hp::fakes::internal::Stream;
using hp::fakes::internal::World;

struct aclTensor {
  std::vector<int64_t> dims;
  aclDataType dtype = ACL_DT_UNDEFINED;
  char* data = nullptr;   // tensorData + offset elements
  std::size_t elements = 0;
};

struct aclScalar {
  aclDataType dtype = ACL_DT_UNDEFINED;
  double value = 0;
};

enum class Kind { kAdd, kMax, kMin, kDivs, kCast };

struct aclOpExecutor {
  Kind kind = Kind::kAdd;
  aclTensor self;
  aclTensor other;   // kAdd/kMax/kMin
  aclTensor out;     // kMax/kMin/kCast (kAdd, kDivs: self)
  double scalar = 0; // kAdd: alpha, kDivs: the divisor
  int device = -1;
  std::shared_ptr<Pe> pe;   // the launching process's PE (null: none): which peers' heaps its NPU maps
};

namespace {

constexpr int kKernelFault = ACL_ERROR_RT_AICORE_EXCEPTION;

std::size_t ElementSize(aclDataType dtype) {
  switch (dtype) {
    case ACL_FLOAT: case ACL_INT32: return 4;
    case ACL_FLOAT16: case ACL_BF16: return 2;
    case ACL_INT8: case ACL_UINT8: return 1;
    case ACL_DOUBLE: case ACL_INT64: return 8;
    default: return 0;   // not one the fake computes with
  }
}

bool IsFloat(aclDataType dtype) {
  return dtype == ACL_FLOAT || dtype == ACL_FLOAT16 || dtype == ACL_BF16 || dtype == ACL_DOUBLE;
}

float HalfToFloat(std::uint16_t h) {
  const std::uint32_t sign = (h >> 15) & 1u, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa != 0 ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  return sign != 0 ? -magnitude : magnitude;
}

// Round to nearest even, as the NPU's cast does.
std::uint16_t FloatToHalf(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  if (std::isnan(f)) return static_cast<std::uint16_t>(sign | 0x7e00u);
  const float magnitude = std::fabs(f);
  if (magnitude >= 65520.0f) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (magnitude < std::ldexp(1.0f, -14)) {   // subnormal: units of 2^-24, rounded to nearest even
    const float units = std::nearbyint(magnitude * std::ldexp(1.0f, 24));
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(units));
  }
  int exponent;
  const float fraction = std::frexp(magnitude, &exponent);   // [0.5, 1)
  float mantissa = std::nearbyint(fraction * 2048.0f);        // 11 significant bits
  if (mantissa >= 2048.0f) {
    mantissa /= 2.0f;
    ++exponent;
  }
  const int biased = exponent - 1 + 15;
  if (biased >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  return static_cast<std::uint16_t>(sign | (biased << 10) | (static_cast<std::uint32_t>(mantissa) & 0x3ffu));
}

float Bf16ToFloat(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t FloatToBf16(float f) {
  std::uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

double Load(const char* p, aclDataType dtype) {
  switch (dtype) {
    case ACL_FLOAT: { float v; std::memcpy(&v, p, 4); return v; }
    case ACL_DOUBLE: { double v; std::memcpy(&v, p, 8); return v; }
    case ACL_FLOAT16: { std::uint16_t v; std::memcpy(&v, p, 2); return HalfToFloat(v); }
    case ACL_BF16: { std::uint16_t v; std::memcpy(&v, p, 2); return Bf16ToFloat(v); }
    case ACL_INT8: return static_cast<std::int8_t>(*p);
    case ACL_UINT8: return static_cast<std::uint8_t>(*p);
    case ACL_INT32: { std::int32_t v; std::memcpy(&v, p, 4); return v; }
    case ACL_INT64: { std::int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    default: return 0;
  }
}

void Store(char* p, aclDataType dtype, double value) {
  switch (dtype) {
    case ACL_FLOAT: { const float v = static_cast<float>(value); std::memcpy(p, &v, 4); break; }
    case ACL_DOUBLE: std::memcpy(p, &value, 8); break;
    case ACL_FLOAT16: { const std::uint16_t v = FloatToHalf(static_cast<float>(value)); std::memcpy(p, &v, 2); break; }
    case ACL_BF16: { const std::uint16_t v = FloatToBf16(static_cast<float>(value)); std::memcpy(p, &v, 2); break; }
    case ACL_INT8: *p = static_cast<char>(static_cast<std::int8_t>(value)); break;
    case ACL_UINT8: *p = static_cast<char>(static_cast<std::uint8_t>(value)); break;
    case ACL_INT32: { const auto v = static_cast<std::int32_t>(value); std::memcpy(p, &v, 4); break; }
    default: break;
  }
}

// Integers of 64 bits keep every bit: they are reduced as integers, never through double.
std::int64_t LoadInt64(const char* p) {
  std::int64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

double Apply(Kind kind, double a, double b, double scalar) {
  switch (kind) {
    case Kind::kAdd: return a + scalar * b;
    case Kind::kMax: return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b);
    case Kind::kMin: return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b);
    case Kind::kDivs: return a / scalar;
    case Kind::kCast: return a;
  }
  return a;
}

std::int64_t ApplyInt64(Kind kind, std::int64_t a, std::int64_t b, double scalar) {
  switch (kind) {
    case Kind::kAdd: {
      // Wrapping, as the NPU's integer add does.
      const auto alpha = static_cast<std::uint64_t>(static_cast<std::int64_t>(scalar));
      return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b) * alpha);
    }
    case Kind::kMax: return std::max(a, b);
    case Kind::kMin: return std::min(a, b);
    default: return a;
  }
}

// The operator on the stream: every operand must be memory the launching NPU reaches, or the kernel faults.
int Run(const aclOpExecutor& op) {
  const std::size_t n = op.self.elements;
  const bool binary = op.kind == Kind::kAdd || op.kind == Kind::kMax || op.kind == Kind::kMin;
  const aclTensor& out = op.kind == Kind::kAdd || op.kind == Kind::kDivs ? op.self : op.out;
  const HostView self = HostView::Of(op.self.data, n * ElementSize(op.self.dtype));
  const HostView other = binary ? HostView::Of(op.other.data, n * ElementSize(op.other.dtype)) : HostView{};
  const HostView to = HostView::Of(out.data, n * ElementSize(out.dtype));
  {
    World& world = World::Get();
    std::lock_guard<std::mutex> lock(world.mu);
    const Pe* launcher = op.pe.get();
    if (!world.Accessible(launcher, op.device, self) || !world.Accessible(launcher, op.device, to) ||
        (binary && !world.Accessible(launcher, op.device, other))) {
      return kKernelFault;
    }
  }
  const std::size_t in_size = ElementSize(op.self.dtype), out_size = ElementSize(out.dtype);
  for (std::size_t i = 0; i < n; ++i) {
    const char* a = self.host + i * in_size;
    char* r = to.host + i * out_size;
    if (op.self.dtype == ACL_INT64 && out.dtype == ACL_INT64) {
      const std::int64_t value = ApplyInt64(op.kind, LoadInt64(a), binary ? LoadInt64(other.host + i * 8) : 0,
                                            op.scalar);
      std::memcpy(r, &value, 8);
      continue;
    }
    const double b = binary ? Load(other.host + i * in_size, op.other.dtype) : 0;
    const double value = Apply(op.kind, Load(a, op.self.dtype), b, op.scalar);
    if (out.dtype == ACL_INT64) {
      const auto v = static_cast<std::int64_t>(value);
      std::memcpy(r, &v, 8);
    } else {
      Store(r, out.dtype, value);
    }
  }
  return ACL_SUCCESS;
}

FakeCall Named(const char* name, const aclTensor* tensor, void* stream = nullptr) {
  FakeCall call;
  call.name = name;
  call.stream = reinterpret_cast<std::uintptr_t>(stream);
  if (tensor != nullptr) {
    call.address = reinterpret_cast<std::uintptr_t>(tensor->data);
    call.bytes = tensor->elements;
    call.value = tensor->dtype;
  }
  return call;
}

// The first phase's shared part: records the call, takes an injected failure, checks the descriptors.
int Prepare(const char* name, Kind kind, const aclTensor* self, const aclTensor* other, const aclTensor* out,
            double scalar, uint64_t* workspaceSize, aclOpExecutor** executor) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  FakeCall call = Named(name, self);
  call.op = static_cast<int>(kind);
  if (const int code = world.Enter(call)) return code;
  const bool binary = kind == Kind::kAdd || kind == Kind::kMax || kind == Kind::kMin;
  const bool has_out = kind == Kind::kMax || kind == Kind::kMin || kind == Kind::kCast;
  if (self == nullptr || workspaceSize == nullptr || executor == nullptr || (binary && other == nullptr) ||
      (has_out && out == nullptr)) {
    return kAclnnErrParamNullptr;
  }
  if (binary && (other->elements != self->elements || other->dtype != self->dtype)) return kAclnnErrParamInvalid;
  if (has_out && out->elements != self->elements) return kAclnnErrParamInvalid;
  if ((kind == Kind::kMax || kind == Kind::kMin) && out->dtype != self->dtype) return kAclnnErrParamInvalid;
  if (kind == Kind::kDivs && !IsFloat(self->dtype)) return kAclnnErrParamInvalid;
  auto* op = new aclOpExecutor();
  op->kind = kind;
  op->self = *self;
  if (binary) op->other = *other;
  if (has_out) op->out = *out;
  op->scalar = scalar;
  op->device = CurrentProcess().device;
  *workspaceSize = kAclnnWorkspaceBytes;
  *executor = op;
  return ACL_SUCCESS;
}

// The second phase: the workspace must be NPU memory of the caller's device, of the size asked for.
int Launch(const char* name, void* workspace, uint64_t workspaceSize, aclOpExecutor* executor, aclrtStream stream) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  world.Record(Named(name, executor != nullptr ? &executor->self : nullptr, stream));
  std::unique_ptr<aclOpExecutor> op(executor);   // one-shot: consumed by the launch
  if (const int code = world.TakeFailure(name)) return code;
  if (op == nullptr) return kAclnnErrParamNullptr;
  const HostView scratch = HostView::Of(workspace, kAclnnWorkspaceBytes);
  if (workspaceSize < kAclnnWorkspaceBytes || !scratch || scratch.memory->device() != CurrentProcess().device) {
    return kAclnnErrParamInvalid;
  }
  if (world.streams.count(stream) == 0) return kAclnnErrParamInvalid;
  std::shared_ptr<aclOpExecutor> shared(op.release());
  shared->pe = CurrentProcess().pe;
  world.Enqueue(stream, [shared](const Stream&) { return Run(*shared); });
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclTensor* aclCreateTensor(const int64_t* viewDims, uint64_t viewDimsNum, aclDataType dataType, const int64_t* stride,
                           int64_t offset, aclFormat format, const int64_t* storageDims, uint64_t storageDimsNum,
                           void* tensorData) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  if ((viewDimsNum != 0 && viewDims == nullptr) || ElementSize(dataType) == 0 || format != ACL_FORMAT_ND ||
      offset < 0 || storageDimsNum != viewDimsNum || (storageDimsNum != 0 && storageDims == nullptr)) {
    return nullptr;
  }
  std::size_t elements = 1;
  int64_t expected_stride = 1;
  for (uint64_t d = viewDimsNum; d-- > 0;) {
    if (viewDims[d] < 0 || storageDims[d] != viewDims[d]) return nullptr;
    if (stride != nullptr && viewDims[d] > 1 && stride[d] != expected_stride) return nullptr;   // contiguous only
    expected_stride *= viewDims[d];
    elements *= static_cast<std::size_t>(viewDims[d]);
  }
  auto* tensor = new aclTensor();
  tensor->dims.assign(viewDims, viewDims + viewDimsNum);
  tensor->dtype = dataType;
  tensor->data = static_cast<char*>(tensorData) + offset * static_cast<int64_t>(ElementSize(dataType));
  tensor->elements = elements;
  ++world.live_aclnn_objects;
  return tensor;
}

aclScalar* aclCreateScalar(void* value, aclDataType dataType) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  if (value == nullptr) return nullptr;
  auto* scalar = new aclScalar();
  scalar->dtype = dataType;
  switch (dataType) {
    case ACL_INT64: scalar->value = static_cast<double>(LoadInt64(static_cast<const char*>(value))); break;
    case ACL_FLOAT: case ACL_DOUBLE: case ACL_INT32:
      scalar->value = Load(static_cast<const char*>(value), dataType);
      break;
    default: delete scalar; return nullptr;
  }
  ++world.live_aclnn_objects;
  return scalar;
}

aclnnStatus aclDestroyTensor(const aclTensor* tensor) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  if (tensor == nullptr) return kAclnnErrParamNullptr;
  delete tensor;
  --world.live_aclnn_objects;
  return ACL_SUCCESS;
}

aclnnStatus aclDestroyScalar(const aclScalar* scalar) {
  World& world = World::Get();
  std::lock_guard<std::mutex> lock(world.mu);
  if (scalar == nullptr) return kAclnnErrParamNullptr;
  delete scalar;
  --world.live_aclnn_objects;
  return ACL_SUCCESS;
}

aclnnStatus aclnnInplaceAddGetWorkspaceSize(const aclTensor* selfRef, const aclTensor* other, const aclScalar* alpha,
                                            uint64_t* workspaceSize, aclOpExecutor** executor) {
  if (alpha == nullptr) return kAclnnErrParamNullptr;
  return Prepare("aclnnInplaceAddGetWorkspaceSize", Kind::kAdd, selfRef, other, nullptr, alpha->value, workspaceSize,
                 executor);
}

aclnnStatus aclnnInplaceAdd(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor, aclrtStream stream) {
  return Launch("aclnnInplaceAdd", workspace, workspaceSize, executor, stream);
}

aclnnStatus aclnnMaximumGetWorkspaceSize(const aclTensor* self, const aclTensor* other, aclTensor* out,
                                         uint64_t* workspaceSize, aclOpExecutor** executor) {
  return Prepare("aclnnMaximumGetWorkspaceSize", Kind::kMax, self, other, out, 0, workspaceSize, executor);
}

aclnnStatus aclnnMaximum(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor, aclrtStream stream) {
  return Launch("aclnnMaximum", workspace, workspaceSize, executor, stream);
}

aclnnStatus aclnnMinimumGetWorkspaceSize(const aclTensor* self, const aclTensor* other, aclTensor* out,
                                         uint64_t* workspaceSize, aclOpExecutor** executor) {
  return Prepare("aclnnMinimumGetWorkspaceSize", Kind::kMin, self, other, out, 0, workspaceSize, executor);
}

aclnnStatus aclnnMinimum(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor, aclrtStream stream) {
  return Launch("aclnnMinimum", workspace, workspaceSize, executor, stream);
}

aclnnStatus aclnnInplaceDivsGetWorkspaceSize(aclTensor* selfRef, const aclScalar* other, uint64_t* workspaceSize,
                                             aclOpExecutor** executor) {
  if (other == nullptr) return kAclnnErrParamNullptr;
  return Prepare("aclnnInplaceDivsGetWorkspaceSize", Kind::kDivs, selfRef, nullptr, nullptr, other->value,
                 workspaceSize, executor);
}

aclnnStatus aclnnInplaceDivs(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor, aclrtStream stream) {
  return Launch("aclnnInplaceDivs", workspace, workspaceSize, executor, stream);
}

aclnnStatus aclnnCastGetWorkspaceSize(const aclTensor* self, const aclDataType dtype, aclTensor* out,
                                      uint64_t* workspaceSize, aclOpExecutor** executor) {
  if (out != nullptr && out->dtype != dtype) return kAclnnErrParamInvalid;
  return Prepare("aclnnCastGetWorkspaceSize", Kind::kCast, self, nullptr, out, 0, workspaceSize, executor);
}

aclnnStatus aclnnCast(void* workspace, uint64_t workspaceSize, aclOpExecutor* executor, aclrtStream stream) {
  return Launch("aclnnCast", workspace, workspaceSize, executor, stream);
}

}  // extern "C"
