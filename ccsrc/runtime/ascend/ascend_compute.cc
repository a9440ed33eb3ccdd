// The ascend device's compute on the NPU: CANN's operator library (aclnn, two phases) for the reductions and the
// low-precision casts. Everything here is enqueued on a stream; peers' copies are read in place through
// aclshmem_ptr, so only the PEs of this rank's node (MTE) can be sources. The data plane (init, memory, put/get,
// signals, streams) is ascend_device.cc.
//
// Sums are one aclnnAddN over every source instead of n-1 aclnnInplaceAdd: one launch (each CANN operator is its own
// launch with its own host tiling) and one pass over the sources instead of n-1 passes over dst. aclnnAddN takes
// INT32, INT64, FLOAT16, BFLOAT16 and FLOAT32 only, and runs on the 910B and 910_93 only (ADD_N_DTYPE_SUPPORT_LIST and
// CheckArch in ops-math math/add_n/op_api/aclnn_add_n.cpp): float64, int8 and uint8, and other SoCs, keep the pairwise
// adds. CANN's library has no n-ary maximum or minimum (aclnnMaximum and aclnnMinimum take two tensors): max and min
// stay pairwise. aclnnAddN sums into an intermediate in its workspace and then copies it into out (l0op::AddN, then
// l0op::ViewCopy), so out may be one of the sources; the workspace holds that intermediate, so one launch sums at most
// kMaxSumBytes and a longer range takes several.
#include <algorithm>
#include <functional>
#include <limits>

#include "runtime/ascend/ascend_device.h"
#include "runtime/ascend/cann_api.h"
#include "runtime/ascend/cann_status.h"

namespace hp::shmem::ascend {
namespace {

// The most one aclnnAddN sums: its workspace holds its intermediate sum, and each stream keeps the largest workspace
// it needed.
constexpr std::size_t kMaxSumBytes = std::size_t{32} << 20;
// Stream buffers grow to a power of two from this size, so that a run of growing calls allocates a few times only.
constexpr std::size_t kMinStreamBufferBytes = std::size_t{64} << 10;

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

Result<void*> AscendDevice::StreamBuffer(void* acl_stream, StreamBufferKind kind, std::size_t bytes,
                                         const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceBuffer& buffer = stream_buffers_[acl_stream][static_cast<std::size_t>(kind)];
  if (buffer.bytes >= bytes) return buffer.data;
  std::size_t capacity = kMinStreamBufferBytes;
  while (capacity < bytes && capacity <= std::numeric_limits<std::size_t>::max() / 2) capacity *= 2;
  capacity = std::max(capacity, bytes);
  void* data = nullptr;
  HP_RETURN_IF_ERROR(FromAclError(aclrtMalloc(&data, capacity, ACL_MEM_MALLOC_HUGE_FIRST), "aclrtMalloc",
                                  std::string(kind == StreamBufferKind::kWorkspace ? "workspace" : "scratch") +
                                      "_bytes=" + std::to_string(capacity) + " " + what));
  if (buffer.data != nullptr) {
    // Calls enqueued on the stream before may still use the outgrown buffer: it goes with them (kept_), freed once the
    // stream has run past them.
    kept_[acl_stream].push_back(std::shared_ptr<void>(buffer.data, [](void* p) { (void)aclrtFree(p); }));
  }
  buffer = DeviceBuffer{data, capacity};
  return data;
}

Status AscendDevice::RunAclnn(AclnnCall& call, void* acl_stream, const std::string& what) {
  // Operators on one stream run one after another: they share its workspace.
  std::lock_guard<std::recursive_mutex> enqueue(enqueue_mu_);
  std::uint64_t workspace_bytes = 0;
  aclOpExecutor* executor = nullptr;
  HP_RETURN_IF_ERROR(FromAclnnStatus(call.prepare(&workspace_bytes, &executor), call.prepare_name, what));
  void* workspace = nullptr;
  if (workspace_bytes > 0) {
    HP_ASSIGN_OR_RETURN(workspace, StreamBuffer(acl_stream, StreamBufferKind::kWorkspace, workspace_bytes, what));
  }
  HP_RETURN_IF_ERROR(
      FromAclnnStatus(call.launch(workspace, workspace_bytes, executor, acl_stream), call.launch_name, what));
  // The operator runs later on the stream: its descriptors live until the stream has run past it.
  std::lock_guard<std::mutex> lock(mu_);
  auto& kept = kept_[acl_stream];
  for (KeepAlive& descriptor : call.descriptors) kept.push_back(std::move(descriptor));
  return Status::Ok();
}

bool AscendDevice::SumsInOneOperator(DataType dtype) const {
  const bool on_soc = soc_name_.rfind("Ascend910B", 0) == 0 || soc_name_.rfind("Ascend910_93", 0) == 0;
  switch (dtype) {
    case DataType::kInt32: case DataType::kInt64: case DataType::kFloat16: case DataType::kBFloat16:
    case DataType::kFloat32:
      return on_soc;
    default:
      return false;
  }
}

Status AscendDevice::EnqueueSum(void* out, const std::vector<void*>& sources, std::size_t count, DataType dtype,
                                void* acl_stream, const std::string& what) {
  aclDataType acl_dtype = ACL_DT_UNDEFINED;
  (void)ToAclDataType(dtype, &acl_dtype);
  const std::size_t element = DataTypeSize(dtype);
  const std::size_t per_launch = kMaxSumBytes / element;
  for (std::size_t done = 0; done < count; done += per_launch) {
    const std::size_t n = std::min(per_launch, count - done);
    const std::size_t offset = done * element;
    // The list owns its tensors (aclDestroyTensorList destroys each): they are made for it and never destroyed alone.
    std::vector<aclTensor*> terms;
    for (void* source : sources) {
      const std::int64_t dims[1] = {static_cast<std::int64_t>(n)};
      const std::int64_t strides[1] = {1};
      aclTensor* term = aclCreateTensor(dims, 1, acl_dtype, strides, 0, ACL_FORMAT_ND, dims, 1,
                                        static_cast<char*>(source) + offset);
      if (term == nullptr) {
        for (aclTensor* made : terms) (void)aclDestroyTensor(made);
        return DeviceError("aclCreateTensor failed: " + what);
      }
      terms.push_back(term);
    }
    aclTensorList* made = aclCreateTensorList(terms.data(), terms.size());
    if (made == nullptr) {
      for (aclTensor* term : terms) (void)aclDestroyTensor(term);
      return DeviceError("aclCreateTensorList failed: " + what);
    }
    std::shared_ptr<aclTensorList> list(made, [](aclTensorList* l) { (void)aclDestroyTensorList(l); });
    std::shared_ptr<aclTensor> sum = Tensor(static_cast<char*>(out) + offset, n, acl_dtype);
    if (!sum) return DeviceError("aclCreateTensor failed: " + what);
    AclnnCall call{"aclnnAddNGetWorkspaceSize", "aclnnAddN",
                   [list, sum](std::uint64_t* size, aclOpExecutor** executor) {
                     return aclnnAddNGetWorkspaceSize(list.get(), sum.get(), size, executor);
                   },
                   aclnnAddN, {list, sum}};
    HP_RETURN_IF_ERROR(RunAclnn(call, acl_stream, what));
  }
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
  if ((op == ReduceOp::kSum || op == ReduceOp::kAvg) && sources.size() > 1 && SumsInOneOperator(dtype)) {
    HP_RETURN_IF_ERROR(EnqueueSum(dst, sources, count, dtype, acl_stream, what));
    if (op == ReduceOp::kAvg) {
      HP_RETURN_IF_ERROR(
          EnqueueDivide(dst, count, dtype, static_cast<float>(pes.size()), acl_stream, what + " step=avg"));
    }
    return Completed(stream, acl_stream, std::move(keep), what);
  }
  // Pairwise: dst starts as one source (itself when reducing in place over a set that holds this rank, else the first
  // one), and every other source is combined into it.
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
    const bool max = op == ReduceOp::kMax;
    AclnnCall call{max ? "aclnnMaximumGetWorkspaceSize" : "aclnnMinimumGetWorkspaceSize",
                   max ? "aclnnMaximum" : "aclnnMinimum",
                   [out, other, max](std::uint64_t* size, aclOpExecutor** executor) {
                     return max ? aclnnMaximumGetWorkspaceSize(out.get(), other.get(), out.get(), size, executor)
                                : aclnnMinimumGetWorkspaceSize(out.get(), other.get(), out.get(), size, executor);
                   },
                   max ? aclnnMaximum : aclnnMinimum, {out, other}};
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
  AclnnCall call{"aclnnCastGetWorkspaceSize", "aclnnCast",
                 [in, out, to](std::uint64_t* size, aclOpExecutor** executor) {
                   return aclnnCastGetWorkspaceSize(in.get(), to, out.get(), size, executor);
                 },
                 aclnnCast, {in, out}};
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
  AclnnCall call{"aclnnInplaceAddGetWorkspaceSize", "aclnnInplaceAdd",
                 [self, term, alpha](std::uint64_t* size, aclOpExecutor** executor) {
                   return aclnnInplaceAddGetWorkspaceSize(self.get(), term.get(), alpha.get(), size, executor);
                 },
                 aclnnInplaceAdd, {self, term, alpha}};
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
  AclnnCall call{"aclnnInplaceDivsGetWorkspaceSize", "aclnnInplaceDivs",
                 [self, by](std::uint64_t* size, aclOpExecutor** executor) {
                   return aclnnInplaceDivsGetWorkspaceSize(self.get(), by.get(), size, executor);
                 },
                 aclnnInplaceDivs, {self, by}};
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

// A float16 or bfloat16 wire row is the plain cast of its values (ops/wire_format.h: no scale), so `rows` rows are
// one cast of rows x row_elems values, as Encode's and Decode's runs are.
Status AscendDevice::EncodeRows(ops::LowFormat format, DataType dtype, const void* src, std::size_t rows,
                                std::size_t row_elems, void* dst, StreamHandle stream, KeepAlive keep) {
  HP_RETURN_IF_ERROR(CheckWireCall("EncodeRows", format, dtype));
  const std::size_t count = rows * row_elems;
  if (count == 0) return Status::Ok();
  const std::string what = std::string("op=EncodeRows format=") + ops::LowFormatName(format) + " dtype=" +
                           DataTypeName(dtype) + " rows=" + std::to_string(rows) + " row_elems=" +
                           std::to_string(row_elems);
  void* acl_stream = Resolve(stream);
  HP_RETURN_IF_ERROR(EnqueueCast(dst, WireDataType(format), src, dtype, count, acl_stream, what));
  return Completed(stream, acl_stream, std::move(keep), what);
}

Status AscendDevice::DecodeRows(ops::LowFormat format, const void* src, std::size_t rows, std::size_t row_elems,
                                DataType dtype, void* out, StreamHandle stream, KeepAlive keep) {
  HP_RETURN_IF_ERROR(CheckWireCall("DecodeRows", format, dtype));
  const std::size_t count = rows * row_elems;
  if (count == 0) return Status::Ok();
  const std::string what = std::string("op=DecodeRows format=") + ops::LowFormatName(format) + " dtype=" +
                           DataTypeName(dtype) + " rows=" + std::to_string(rows) + " row_elems=" +
                           std::to_string(row_elems);
  void* acl_stream = Resolve(stream);
  HP_RETURN_IF_ERROR(EnqueueCast(out, dtype, src, WireDataType(format), count, acl_stream, what));
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
  // The scratch buffer is the stream's: no other call may enqueue on it between a decode and its add.
  std::lock_guard<std::recursive_mutex> enqueue(enqueue_mu_);
  // 1. `out` starts as the first term: the first source decoded (own, when separate, is added to it: two terms add
  //    the same either way round), or `own` itself when it is `out`.
  std::size_t next = 0;
  if (own != out) {
    HP_RETURN_IF_ERROR(EnqueueCast(out, acc, sources[0], wire, count, acl_stream, what + " step=decode source=0"));
    next = 1;
    if (own != nullptr) HP_RETURN_IF_ERROR(EnqueueAdd(out, own, count, acc, acl_stream, what + " step=add own"));
  }
  // 2. Every other source is decoded into the stream's scratch buffer and added (aclnnInplaceAdd takes one dtype).
  if (next < sources.size()) {
    HP_ASSIGN_OR_RETURN(void* scratch,
                        StreamBuffer(acl_stream, StreamBufferKind::kScratch, count * DataTypeSize(dtype), what));
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
