// The ascend device's compute on the NPU: CANN's operator library (aclnn, two phases) for the reductions and the
// low-precision casts. Everything here is enqueued on a stream; peers' copies are read in place through
// aclshmem_ptr, so only the PEs of this rank's node (MTE) can be sources. The data plane (init, memory, put/get,
// signals, streams) is ascend_device.cc.
#include <algorithm>
#include <functional>

#include "runtime/ascend/ascend_device.h"
#include "runtime/ascend/cann_api.h"
#include "runtime/ascend/cann_status.h"

namespace hp::shmem::ascend {
namespace {
bool ToAclDataType(DataType dtype, aclDataType* out) {
  switch (dtype) {
    case DataType::kFloat32: *out = ACL_FLOAT; return true;
    case DataType::kFloat64: *out = ACL_DOUBLE; return true;
    case DataType::kFloat16: *out = ACL_FLOAT16; return true;
    case DataType::kBFloat16: *out = ACL_BF16; return true;
    case DataType::kInt8: *out = ACL_INT8; return true;
    case DataType::kUInt8: *out = ACL_UINT8; return true;
    case DataType::kInt32: *out = ACL_INT32; return true;
    case DataType::kInt64: *out = ACL_INT64; return true;
  }
  return false;
}

Status FromAclnnStatus(aclnnStatus code, const char* call, const std::string& context) {
  if (code == 0) return Status::Ok();
  return DeviceError(std::string(call) + " failed: aclnn_status=" + std::to_string(code) + " " + context);
}

}  // namespace

struct AscendDevice::AclnnCall {
  const char* prepare_name;
  const char* launch_name;
  std::function<aclnnStatus(std::uint64_t*, aclOpExecutor**)> prepare;
  std::function<aclnnStatus(void*, std::uint64_t, aclOpExecutor*, aclrtStream)> launch;
  std::vector<KeepAlive> descriptors;   // tensors and scalars the executor refers to
};

namespace {

// An aclTensor over `count` contiguous elements at `data`, destroyed when the last holder lets go.
std::shared_ptr<aclTensor> Tensor(void* data, std::size_t count, aclDataType dtype) {
  const std::int64_t dims[1] = {static_cast<std::int64_t>(count)};
  const std::int64_t strides[1] = {1};
  aclTensor* tensor = aclCreateTensor(dims, 1, dtype, strides, 0, ACL_FORMAT_ND, dims, 1, data);
  if (tensor == nullptr) return nullptr;
  return std::shared_ptr<aclTensor>(tensor, [](aclTensor* t) { (void)aclDestroyTensor(t); });
}

std::shared_ptr<aclScalar> Scalar(float value) {
  aclScalar* scalar = aclCreateScalar(&value, ACL_FLOAT);
  if (scalar == nullptr) return nullptr;
  return std::shared_ptr<aclScalar>(scalar, [](aclScalar* s) { (void)aclDestroyScalar(s); });
}

std::shared_ptr<aclScalar> IntScalar(std::int64_t value) {
  aclScalar* scalar = aclCreateScalar(&value, ACL_INT64);
  if (scalar == nullptr) return nullptr;
  return std::shared_ptr<aclScalar>(scalar, [](aclScalar* s) { (void)aclDestroyScalar(s); });
}

}  // namespace

Status AscendDevice::RunAclnn(AclnnCall& call, void* acl_stream, const std::string& what) {
  std::uint64_t workspace_bytes = 0;
  aclOpExecutor* executor = nullptr;
  HP_RETURN_IF_ERROR(FromAclnnStatus(call.prepare(&workspace_bytes, &executor), call.prepare_name, what));
  KeepAlive workspace;
  void* workspace_data = nullptr;
  if (workspace_bytes > 0) {
    HP_RETURN_IF_ERROR(FromAclError(aclrtMalloc(&workspace_data, workspace_bytes, ACL_MEM_MALLOC_HUGE_FIRST),
                                    "aclrtMalloc", "workspace_bytes=" + std::to_string(workspace_bytes) + " " + what));
    workspace = std::shared_ptr<void>(workspace_data, [](void* p) { (void)aclrtFree(p); });
  }
  HP_RETURN_IF_ERROR(
      FromAclnnStatus(call.launch(workspace_data, workspace_bytes, executor, acl_stream), call.launch_name, what));
  // The operator runs later on the stream: its workspace and descriptors live until the stream is synchronized.
  std::lock_guard<std::mutex> lock(mu_);
  auto& kept = kept_[acl_stream];
  if (workspace) kept.push_back(std::move(workspace));
  for (KeepAlive& descriptor : call.descriptors) kept.push_back(std::move(descriptor));
  return Status::Ok();
}

Status AscendDevice::Reduce(void* dst, const void* symmetric_src, std::size_t count, DataType dtype, ReduceOp op,
                            const std::vector<int>& pes, StreamHandle stream, KeepAlive keep) {
  HP_RETURN_IF_ERROR(RequireReady("Reduce"));
  if (pes.empty()) return InvalidArgument("`pes` must name at least one pe, but got none");
  for (int pe : pes) HP_RETURN_IF_ERROR(CheckPe(pe));
  aclDataType acl_dtype = ACL_DT_UNDEFINED;
  if (!ToAclDataType(dtype, &acl_dtype)) {
    return InvalidArgument(std::string("`dtype` must be one aclnn reduces, but got ") + DataTypeName(dtype));
  }
  if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) {
    return InvalidArgument(std::string("`op` must be sum, max or min for ") + DataTypeName(dtype) + ", but got avg");
  }
  if (count == 0) return Status::Ok();
  const std::size_t bytes = count * DataTypeSize(dtype);
  const std::string what = std::string("op=Reduce reduce_op=") + ReduceOpName(op) + " dtype=" + DataTypeName(dtype) +
                           " count=" + std::to_string(count) + " pes=" + std::to_string(pes.size());
  // Every source is read in place by this NPU's kernels, through the heaps it maps: this rank's node only.
  std::vector<void*> sources;
  for (int pe : pes) {
    HP_ASSIGN_OR_RETURN(void* source, PeerRun(symmetric_src, pe, "Reduce"));
    sources.push_back(source);
  }
  void* acl_stream = Resolve(stream);
  // dst starts as one source: itself when reducing in place over a set that holds this rank, else the first one.
  std::size_t first = 0;
  const auto own = std::find(pes.begin(), pes.end(), rank_);
  if (dst == symmetric_src && own != pes.end()) {
    first = static_cast<std::size_t>(own - pes.begin());
  } else {
    for (std::size_t offset = 0; offset < bytes; offset += options_.max_transfer_bytes) {
      const std::size_t n = std::min(options_.max_transfer_bytes, bytes - offset);
      aclshmemx_getmem_on_stream(static_cast<char*>(dst) + offset,
                                 const_cast<char*>(static_cast<const char*>(symmetric_src)) + offset, n, pes[0],
                                 acl_stream);
    }
  }
  std::shared_ptr<aclTensor> out = Tensor(dst, count, acl_dtype);
  if (!out) return DeviceError("aclCreateTensor failed: " + what);
  for (std::size_t k = 0; k < sources.size(); ++k) {
    if (k == first) continue;
    const std::string step = what + " source_pe=" + std::to_string(pes[k]);
    if (op == ReduceOp::kSum || op == ReduceOp::kAvg) {
      HP_RETURN_IF_ERROR(EnqueueAdd(dst, sources[k], count, dtype, acl_stream, step));
      continue;
    }
    std::shared_ptr<aclTensor> other = Tensor(sources[k], count, acl_dtype);
    if (!other) return DeviceError("aclCreateTensor failed: " + what);
    AclnnCall call;
    call.descriptors = {out, other};
    if (op == ReduceOp::kMax) {
      call.prepare_name = "aclnnMaximumGetWorkspaceSize";
      call.launch_name = "aclnnMaximum";
      call.prepare = [out, other](std::uint64_t* size, aclOpExecutor** executor) {
        return aclnnMaximumGetWorkspaceSize(out.get(), other.get(), out.get(), size, executor);
      };
      call.launch = aclnnMaximum;
    } else {
      call.prepare_name = "aclnnMinimumGetWorkspaceSize";
      call.launch_name = "aclnnMinimum";
      call.prepare = [out, other](std::uint64_t* size, aclOpExecutor** executor) {
        return aclnnMinimumGetWorkspaceSize(out.get(), other.get(), out.get(), size, executor);
      };
      call.launch = aclnnMinimum;
    }
    HP_RETURN_IF_ERROR(RunAclnn(call, acl_stream, step));
  }
  if (op == ReduceOp::kAvg) {
    HP_RETURN_IF_ERROR(EnqueueDivide(dst, count, dtype, static_cast<float>(pes.size()), acl_stream, what + " step=avg"));
  }
  return Completed(stream, acl_stream, std::move(keep), what);
}

// ---- low-precision wire formats: aclnnCast into and out of float16/bfloat16 -----------------------------------------

Status AscendDevice::CheckWireFormat(ops::LowFormat format) const {
  switch (format) {
    case ops::LowFormat::kFloat16:
    case ops::LowFormat::kBFloat16:
      return Status::Ok();
    case ops::LowFormat::kFloat8E4M3Fn:
    case ops::LowFormat::kFloat8E5M2:
      return DeviceError(std::string("low-precision communication in ") + ops::LowFormatName(format) +
                         " needs a block-scaled fp8 cast kernel (a scale per block, then a cast to fp8) on the NPU, "
                         "which CANN's operator library does not have (aclnnCast has no scale, and the Atlas A2/910B "
                         "has no fp8 type): device=ascend format=" + ops::LowFormatName(format) +
                         " (use float16 or bfloat16)");
  }
  return InvalidArgument("`format` must be a wire format, but got " + std::to_string(static_cast<int>(format)));
}

namespace {
DataType WireDataType(ops::LowFormat format) {
  return format == ops::LowFormat::kBFloat16 ? DataType::kBFloat16 : DataType::kFloat16;   // CheckWireFormat's
}
}  // namespace

// The checks every wire operation shares: ready, a format this device carries, a dtype wider than it.
Status AscendDevice::CheckWireCall(const char* op, ops::LowFormat format, DataType dtype) const {
  HP_RETURN_IF_ERROR(RequireReady(op));
  HP_RETURN_IF_ERROR(CheckWireFormat(format));
  if (*ops::LowFormatRefusal(format, dtype, ReduceOp::kSum) != '\0') {
    return InvalidArgument(std::string("`dtype` must be a floating-point dtype wider than ") +
                           ops::LowFormatName(format) + ", but got " + DataTypeName(dtype));
  }
  return Status::Ok();
}

Status AscendDevice::EnqueueCast(void* dst, DataType to_dtype, const void* src, DataType from_dtype,
                                 std::size_t count, void* acl_stream, const std::string& what) {
  aclDataType from = ACL_DT_UNDEFINED, to = ACL_DT_UNDEFINED;
  (void)ToAclDataType(from_dtype, &from);
  (void)ToAclDataType(to_dtype, &to);
  std::shared_ptr<aclTensor> in = Tensor(const_cast<void*>(src), count, from);
  std::shared_ptr<aclTensor> out = Tensor(dst, count, to);
  if (!in || !out) return DeviceError("aclCreateTensor failed: " + what);
  AclnnCall call;
  call.descriptors = {in, out};
  call.prepare_name = "aclnnCastGetWorkspaceSize";
  call.launch_name = "aclnnCast";
  call.prepare = [in, out, to](std::uint64_t* size, aclOpExecutor** executor) {
    return aclnnCastGetWorkspaceSize(in.get(), to, out.get(), size, executor);
  };
  call.launch = aclnnCast;
  return RunAclnn(call, acl_stream, what);
}

Status AscendDevice::EnqueueAdd(void* out, const void* other, std::size_t count, DataType dtype, void* acl_stream,
                                const std::string& what) {
  aclDataType acl_dtype = ACL_DT_UNDEFINED;
  (void)ToAclDataType(dtype, &acl_dtype);
  std::shared_ptr<aclTensor> self = Tensor(out, count, acl_dtype);
  std::shared_ptr<aclTensor> term = Tensor(const_cast<void*>(other), count, acl_dtype);
  std::shared_ptr<aclScalar> alpha = IsFloatingPoint(dtype) ? Scalar(1.0f) : IntScalar(1);
  if (!self || !term) return DeviceError("aclCreateTensor failed: " + what);
  if (!alpha) return DeviceError("aclCreateScalar failed: " + what);
  AclnnCall call;
  call.descriptors = {self, term, alpha};
  call.prepare_name = "aclnnInplaceAddGetWorkspaceSize";
  call.launch_name = "aclnnInplaceAdd";
  call.prepare = [self, term, alpha](std::uint64_t* size, aclOpExecutor** executor) {
    return aclnnInplaceAddGetWorkspaceSize(self.get(), term.get(), alpha.get(), size, executor);
  };
  call.launch = aclnnInplaceAdd;
  return RunAclnn(call, acl_stream, what);
}

Status AscendDevice::EnqueueDivide(void* out, std::size_t count, DataType dtype, float divisor, void* acl_stream,
                                   const std::string& what) {
  aclDataType acl_dtype = ACL_DT_UNDEFINED;
  (void)ToAclDataType(dtype, &acl_dtype);
  std::shared_ptr<aclTensor> self = Tensor(out, count, acl_dtype);
  std::shared_ptr<aclScalar> by = Scalar(divisor);
  if (!self) return DeviceError("aclCreateTensor failed: " + what);
  if (!by) return DeviceError("aclCreateScalar failed: " + what);
  AclnnCall call;
  call.descriptors = {self, by};
  call.prepare_name = "aclnnInplaceDivsGetWorkspaceSize";
  call.launch_name = "aclnnInplaceDivs";
  call.prepare = [self, by](std::uint64_t* size, aclOpExecutor** executor) {
    return aclnnInplaceDivsGetWorkspaceSize(self.get(), by.get(), size, executor);
  };
  call.launch = aclnnInplaceDivs;
  return RunAclnn(call, acl_stream, what);
}

Result<void*> AscendDevice::PeerRun(const void* symmetric, int pe, const char* op) const {
  if (pe == rank_) return const_cast<void*>(symmetric);
  return PeerInPlace(symmetric, pe, op);
}

Status AscendDevice::Encode(ops::LowFormat format, DataType dtype, const void* src, std::size_t count, WireRun dst,
                            StreamHandle stream, KeepAlive keep) {
  HP_RETURN_IF_ERROR(CheckWireCall("Encode", format, dtype));
  if (count == 0) return Status::Ok();
  const std::string what = std::string("op=Encode format=") + ops::LowFormatName(format) + " dtype=" +
                           DataTypeName(dtype) + " count=" + std::to_string(count);
  void* acl_stream = Resolve(stream);
  HP_RETURN_IF_ERROR(EnqueueCast(dst.codes, WireDataType(format), src, dtype, count, acl_stream, what));
  return Completed(stream, acl_stream, std::move(keep), what);
}

Status AscendDevice::Decode(ops::LowFormat format, WireRun symmetric_src, int pe, std::size_t count, DataType dtype,
                            void* out, StreamHandle stream, KeepAlive keep) {
  HP_RETURN_IF_ERROR(CheckWireCall("Decode", format, dtype));
  HP_RETURN_IF_ERROR(CheckPe(pe));
  if (count == 0) return Status::Ok();
  const std::string what = std::string("op=Decode format=") + ops::LowFormatName(format) + " dtype=" +
                           DataTypeName(dtype) + " count=" + std::to_string(count) + " pe=" + std::to_string(pe);
  HP_ASSIGN_OR_RETURN(void* codes, PeerRun(symmetric_src.codes, pe, "Decode"));
  void* acl_stream = Resolve(stream);
  HP_RETURN_IF_ERROR(EnqueueCast(out, dtype, codes, WireDataType(format), count, acl_stream, what));
  return Completed(stream, acl_stream, std::move(keep), what);
}

Status AscendDevice::ReduceEncoded(ops::LowFormat format, DataType dtype, ReduceOp op, const void* own,
                                   WireRun symmetric_src, const std::vector<int>& pes, std::size_t count, void* out,
                                   WireRun reencode, StreamHandle stream, KeepAlive keep) {
  HP_RETURN_IF_ERROR(CheckWireCall("ReduceEncoded", format, dtype));
  const DataType acc = dtype;   // float32 or float64 here: the 16-bit dtypes are no wider than the formats
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg) {
    return InvalidArgument(std::string("`op` must be sum or avg, but got ") + ReduceOpName(op));
  }
  if (pes.empty()) return InvalidArgument("`pes` must name at least one pe, but got none");
  for (int pe : pes) HP_RETURN_IF_ERROR(CheckPe(pe));
  if (count == 0) return Status::Ok();
  const std::string what = std::string("op=ReduceEncoded format=") + ops::LowFormatName(format) + " dtype=" +
                           DataTypeName(dtype) + " reduce_op=" + ReduceOpName(op) + " count=" + std::to_string(count) +
                           " pes=" + std::to_string(pes.size());
  std::vector<void*> sources;
  for (int pe : pes) {
    HP_ASSIGN_OR_RETURN(void* codes, PeerRun(symmetric_src.codes, pe, "ReduceEncoded"));
    sources.push_back(codes);
  }
  void* acl_stream = Resolve(stream);
  const DataType wire = WireDataType(format);
  // 1. `out` starts as the first term: the first source decoded (own, when separate, is added to it: two terms add
  //    the same either way round), or `own` itself when it is `out`.
  std::size_t next = 0;
  if (own != out) {
    HP_RETURN_IF_ERROR(EnqueueCast(out, acc, sources[0], wire, count, acl_stream, what + " step=decode source=0"));
    next = 1;
    if (own != nullptr) HP_RETURN_IF_ERROR(EnqueueAdd(out, own, count, acc, acl_stream, what + " step=add own"));
  }
  // 2. Every other source is decoded into scratch NPU memory and added (aclnnInplaceAdd takes one dtype).
  if (next < sources.size()) {
    const std::size_t bytes = count * DataTypeSize(dtype);
    void* scratch = nullptr;
    HP_RETURN_IF_ERROR(FromAclError(aclrtMalloc(&scratch, bytes, ACL_MEM_MALLOC_HUGE_FIRST), "aclrtMalloc",
                                    "scratch_bytes=" + std::to_string(bytes) + " " + what));
    {
      std::lock_guard<std::mutex> lock(mu_);
      kept_[acl_stream].push_back(std::shared_ptr<void>(scratch, [](void* p) { (void)aclrtFree(p); }));
    }
    for (std::size_t k = next; k < sources.size(); ++k) {
      const std::string step = what + " source=" + std::to_string(k);
      HP_RETURN_IF_ERROR(EnqueueCast(scratch, acc, sources[k], wire, count, acl_stream, step));
      HP_RETURN_IF_ERROR(EnqueueAdd(out, scratch, count, acc, acl_stream, step));
    }
  }
  const std::size_t terms = sources.size() + (own != nullptr ? 1 : 0);
  if (op == ReduceOp::kAvg) {
    HP_RETURN_IF_ERROR(EnqueueDivide(out, count, acc, static_cast<float>(terms), acl_stream, what + " step=avg"));
  }
  // 3. Re-encoded: the codes every peer decodes, and their decoding here, so that every rank ends alike.
  if (reencode.codes != nullptr) {
    HP_RETURN_IF_ERROR(EnqueueCast(reencode.codes, wire, out, acc, count, acl_stream, what + " step=reencode"));
    HP_RETURN_IF_ERROR(EnqueueCast(out, acc, reencode.codes, wire, count, acl_stream, what + " step=decode reencoded"));
  }
  return Completed(stream, acl_stream, std::move(keep), what);
}


}  // namespace hp::shmem::ascend
