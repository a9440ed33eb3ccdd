// The runtime's C ABI (hp_shmem.h) over the process-wide Runtime: what the torch binding does with tensors, done
// with plain addresses, for handlers that cannot link the runtime's C++ ABI (MindSpore's).
//
// Every function: clears this thread's last error, checks what the runtime cannot (null pointers, C enum values),
// runs the runtime's call on the default stream with nothing to keep alive (the host device finishes before it
// returns), and turns the Status into its code and message. No exception crosses the C boundary.
#include "capi/hp_shmem.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ops/reduce_op.h"
#include "ops/wire_format.h"
#include "runtime/bootstrap.h"
#include "runtime/collectives/engine.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/device_factory.h"
#include "runtime/registry.h"
#include "runtime/runtime.h"
#include "runtime/status.h"
#include "runtime/team.h"

namespace hp::shmem::capi {
namespace {

// ---- the header's numbers are the runtime's ----

constexpr int Code(StatusCode code) { return static_cast<int>(code); }
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

Runtime& R() { return Runtime::Instance(); }

thread_local std::string t_last_error;

// Runs `body` (returning a Status) and turns it into the C result: the code, and the message in t_last_error.
template <typename Body>
int Call(Body&& body) noexcept {
  t_last_error.clear();
  try {
    const Status status = body();
    if (status.ok()) return HP_SHMEM_OK;
    t_last_error = status.message();
    return Code(status.code());
  } catch (const std::bad_alloc&) {
    t_last_error = "out of host memory inside the C ABI: what=std::bad_alloc";
    return HP_SHMEM_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    t_last_error = std::string("an exception reached the C ABI: what=") + e.what();
    return HP_SHMEM_INTERNAL;
  } catch (...) {
    t_last_error = "an exception of unknown type reached the C ABI";
    return HP_SHMEM_INTERNAL;
  }
}

// ---- argument checks the runtime cannot make ----

Status NonNull(const void* pointer, const char* name) {
  if (pointer != nullptr) return Status::Ok();
  return InvalidArgument(std::string("`") + name + "` must be a non-null pointer, but got NULL");
}

// A data buffer: NULL only with zero bytes (an empty framework tensor has no data pointer).
Status NonNullData(const void* pointer, std::size_t bytes, const char* name) {
  return bytes == 0 ? Status::Ok() : NonNull(pointer, name);
}

Status NonNegative(int value, const char* name) {
  if (value >= 0) return Status::Ok();
  return InvalidArgument(std::string("`") + name + "` must be >= 0, but got " + std::to_string(value));
}

Result<DataType> DtypeArg(int dtype, const char* name = "dtype") {
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

// -1: the tensor's own dtype; otherwise an ops::LowFormat.
Result<CallRole> RoleArg(int role) {
  if (role < HP_SHMEM_ROLE_FORWARD || role > HP_SHMEM_ROLE_FUSED_SCATTER) {
    return hp::shmem::InvalidArgument("`role` must be an hp_shmem_role, but got " + std::to_string(role));
  }
  return static_cast<CallRole>(role);
}

Result<std::optional<ops::LowFormat>> WireArg(int wire) {
  if (wire == -1) return std::optional<ops::LowFormat>();
  if (ops::IsLowFormat(wire)) return std::optional<ops::LowFormat>(static_cast<ops::LowFormat>(wire));
  return InvalidArgument("`wire` must be one of -1 (the tensor's own dtype), 0 (float8_e4m3fn), 1 (float8_e5m2), "
                         "2 (float16), 3 (bfloat16), but got " + std::to_string(wire));
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

// ---- the bootstrap over C callbacks ----

class CBootstrap final : public Bootstrap {
 public:
  explicit CBootstrap(const hp_shmem_bootstrap& callbacks) : callbacks_(callbacks) {}

  // The contract of the struct itself; rank and world size are the runtime's checks.
  static Status Check(const hp_shmem_bootstrap* bootstrap) {
    HP_RETURN_IF_ERROR(NonNull(bootstrap, "bootstrap"));
    if (bootstrap->all_gather == nullptr) {
      return InvalidArgument("`bootstrap->all_gather` must be a non-null function pointer, but got NULL");
    }
    if (bootstrap->barrier == nullptr) {
      return InvalidArgument("`bootstrap->barrier` must be a non-null function pointer, but got NULL");
    }
    return Status::Ok();
  }

  int rank() const override { return callbacks_.rank; }
  int world_size() const override { return callbacks_.world_size; }

  Status AllGather(const void* in, std::size_t bytes, void* out) override {
    char error[kErrorBytes] = {};
    const int code = callbacks_.all_gather(callbacks_.context, in, bytes, out, error, sizeof(error));
    return FromCallback(code, error, "all_gather");
  }

  Status Barrier() override {
    char error[kErrorBytes] = {};
    const int code = callbacks_.barrier(callbacks_.context, error, sizeof(error));
    return FromCallback(code, error, "barrier");
  }

 private:
  static constexpr std::size_t kErrorBytes = 1024;

  // The callback's code and message; a code outside the header's is a device error (the framework failed).
  static Status FromCallback(int code, char* error, const char* what) {
    if (code == HP_SHMEM_OK) return Status::Ok();
    error[kErrorBytes - 1] = '\0';   // a callback that ignored error_bytes still ends here
    std::string message(error);
    if (message.empty()) {
      message = std::string("bootstrap ") + what + " callback failed without a message: code=" + std::to_string(code);
    }
    if (code < HP_SHMEM_INVALID_ARGUMENT || code > HP_SHMEM_INTERRUPTED) {
      return DeviceError(message + " (bootstrap " + what + " returned unknown code=" + std::to_string(code) + ")");
    }
    return Status(static_cast<StatusCode>(code), std::move(message));
  }

  hp_shmem_bootstrap callbacks_;
};

// ---- debug_state as JSON ----

class JsonWriter {
 public:
  void Key(const char* key) {
    Separator();
    Quoted(key);
    out_ += ':';
    after_key_ = true;
  }
  void String(const std::string& value) {
    Separator();
    Quoted(value);
  }
  void Unsigned(std::uint64_t value) { Raw(std::to_string(value)); }
  void Signed(std::int64_t value) { Raw(std::to_string(value)); }
  void Bool(bool value) { Raw(value ? "true" : "false"); }
  void Double(double value) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.17g", value);   // round-trips; config values are finite
    std::string number(text);
    // Stays a float for the reader (10.0, as the torch binding gives Python, not 10).
    if (number.find_first_of(".e") == std::string::npos) number += ".0";
    Raw(number);
  }
  void BeginObject() { Open('{'); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('['); }
  void EndArray() { Close(']'); }
  const std::string& text() const { return out_; }

 private:
  // `value` as a JSON string: quotes, backslashes and control characters escaped, other bytes (UTF-8) as they are.
  void Quoted(const std::string& value) {
    out_ += '"';
    for (const char c : value) {
      switch (c) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\n': out_ += "\\n"; break;
        case '\r': out_ += "\\r"; break;
        case '\t': out_ += "\\t"; break;
        case '\b': out_ += "\\b"; break;
        case '\f': out_ += "\\f"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
            out_ += escaped;
          } else {
            out_ += c;
          }
      }
    }
    out_ += '"';
  }
  void Raw(const std::string& text) {
    Separator();
    out_ += text;
  }
  void Open(char c) {
    Separator();
    out_ += c;
    first_ = true;
  }
  void Close(char c) {
    out_ += c;
    first_ = false;
  }
  // A comma before every value or key but the first of its container; none between a key and its value.
  void Separator() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_) out_ += ',';
    first_ = false;
  }

  std::string out_;
  bool first_ = true;
  bool after_key_ = false;
};

void WriteAllocations(JsonWriter& json, const char* key, const std::vector<AllocationInfo>& allocations) {
  json.Key(key);
  json.BeginArray();
  for (const AllocationInfo& info : allocations) {
    json.BeginObject();
    json.Key("allocation_id");
    json.Unsigned(info.id);
    json.Key("lifecycle");
    json.Unsigned(info.lifecycle);
    json.Key("base");
    json.Unsigned(info.base);
    json.Key("offset");
    json.Unsigned(info.offset);
    json.Key("bytes");
    json.Unsigned(info.bytes);
    json.Key("reserved");
    json.Unsigned(info.reserved);
    json.Key("state");
    json.String(AllocationStateName(info.state));
    json.Key("call_site");
    json.String(info.call_site);
    json.EndObject();
  }
  json.EndArray();
}

// The keys of the torch binding's debug_state (module.cc DebugState), so that one Python reader serves both
// handlers; allocations add their "state".
std::string DebugStateJson(const DebugSnapshot& s) {
  JsonWriter json;
  json.BeginObject();
  json.Key("state");
  json.String(LifecycleStateName(s.state));
  json.Key("lifecycle");
  json.Unsigned(s.lifecycle);
  json.Key("rank");
  json.Signed(s.rank);
  json.Key("world_size");
  json.Signed(s.world_size);
  json.Key("device");
  json.String(s.device);
  json.Key("config");
  json.BeginObject();
  json.Key("heap_size");
  json.Unsigned(s.config.heap_size);
  json.Key("timeout_sec");
  json.Double(s.config.timeout_sec);
  json.Key("log_level");
  json.Signed(static_cast<int>(s.config.log_level));
  json.Key("device");
  json.String(s.config.device);
  json.EndObject();
  json.Key("heap_base");
  json.Unsigned(s.heap_base);
  json.Key("heap_size");
  json.Unsigned(s.heap_size);
  json.Key("allocated");
  json.Unsigned(s.allocated);
  json.Key("max_allocated");
  json.Unsigned(s.max_allocated);
  json.Key("remaining");
  json.Unsigned(s.remaining);
  WriteAllocations(json, "active_allocations", s.active);
  WriteAllocations(json, "leaked_allocations", s.leaked);
  json.Key("latest_failure");
  json.String(s.latest_failure);
  json.Key("calls_in_flight");
  json.Unsigned(s.in_flight);
  json.Key("live_teams");
  json.Unsigned(s.live_teams);
  json.Key("reaches_peer_memory");
  json.Bool(s.reaches_peer_memory);
  json.Key("nodes");
  json.BeginArray();
  for (const int node : s.nodes) json.Signed(node);
  json.EndArray();
  json.EndObject();
  return json.text();
}

}  // namespace
}  // namespace hp::shmem::capi

using hp::shmem::AllocationInfo;
using hp::shmem::CallRole;
using hp::shmem::Collective;
using hp::shmem::CompareOp;
using hp::shmem::Config;
using hp::shmem::DataType;
using hp::shmem::Device;
using hp::shmem::ElementType;
using hp::shmem::kDefaultStream;
using hp::shmem::ReduceOp;
using hp::shmem::Result;
using hp::shmem::SignalOp;
using hp::shmem::SignalWidth;
using hp::shmem::Status;
using hp::shmem::capi::Call;
using hp::shmem::capi::CBootstrap;
using hp::shmem::capi::NonNegative;
using hp::shmem::capi::NonNull;
using hp::shmem::capi::NonNullData;
using hp::shmem::capi::R;

extern "C" {

int hp_shmem_abi_version(void) { return HP_SHMEM_ABI_VERSION; }

const char* hp_shmem_last_error(void) { return hp::shmem::capi::t_last_error.c_str(); }

// Reads nothing of this thread's state: it leaves the last error alone, so that a caller may name the status of the
// call that failed before reading that call's message.
const char* hp_shmem_status_name(int status) {
  if (status < HP_SHMEM_OK || status > HP_SHMEM_INTERRUPTED) return "UNKNOWN";
  return hp::shmem::StatusCodeName(static_cast<hp::shmem::StatusCode>(status));
}

int hp_shmem_init(const hp_shmem_bootstrap* bootstrap) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(CBootstrap::Check(bootstrap));
    HP_ASSIGN_OR_RETURN(const Config config, hp::shmem::ParseConfig(hp::shmem::ProcessEnv()));
    HP_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, hp::shmem::MakeDevice(config));
    CBootstrap adapter(*bootstrap);
    return R().Init(config, std::move(device), adapter);
  });
}

int hp_shmem_shutdown(const hp_shmem_bootstrap* bootstrap) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(CBootstrap::Check(bootstrap));
    CBootstrap adapter(*bootstrap);
    return R().Shutdown(adapter);
  });
}

int hp_shmem_state(void) {
  hp::shmem::capi::t_last_error.clear();
  return static_cast<int>(R().state());
}

int hp_shmem_rank(void) {
  hp::shmem::capi::t_last_error.clear();
  return R().rank();
}

int hp_shmem_world_size(void) {
  hp::shmem::capi::t_last_error.clear();
  return R().world_size();
}

int hp_shmem_allocate(size_t bytes, size_t alignment, const char* call_site, hp_shmem_allocation* out) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNull(out, "out"));
    HP_ASSIGN_OR_RETURN(const AllocationInfo info,
                        R().Allocate(bytes, alignment, call_site == nullptr ? std::string() : std::string(call_site)));
    out->id = info.id;
    out->address = reinterpret_cast<void*>(info.base);
    out->bytes = info.bytes;
    out->heap_offset = info.offset;
    return Status::Ok();
  });
}

int hp_shmem_free(uint64_t allocation_id, const char* call_site) {
  return Call([&]() -> Status {
    return R().Free(allocation_id, call_site == nullptr ? std::string() : std::string(call_site));
  });
}

int hp_shmem_peer_address(const void* symmetric, size_t bytes, int pe, void** out) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNull(symmetric, "symmetric"));
    HP_RETURN_IF_ERROR(NonNull(out, "out"));
    HP_ASSIGN_OR_RETURN(void* const address, R().PeerAddress(symmetric, bytes, pe, "symmetric"));
    *out = address;
    return Status::Ok();
  });
}

int hp_shmem_put(void* symmetric_dst, const void* src, size_t dst_bytes, size_t src_bytes, int pe) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNullData(symmetric_dst, dst_bytes, "symmetric_dst"));
    HP_RETURN_IF_ERROR(NonNullData(src, src_bytes, "src"));
    return R().Put(symmetric_dst, src, dst_bytes, src_bytes, pe, kDefaultStream, nullptr);
  });
}

int hp_shmem_get(void* dst, const void* symmetric_src, size_t dst_bytes, size_t src_bytes, int pe) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNullData(dst, dst_bytes, "dst"));
    HP_RETURN_IF_ERROR(NonNullData(symmetric_src, src_bytes, "symmetric_src"));
    return R().Get(dst, symmetric_src, dst_bytes, src_bytes, pe, kDefaultStream, nullptr);
  });
}

int hp_shmem_signal(void* symmetric_signal, int signal_bytes, int64_t value, int signal_op, int pe) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNull(symmetric_signal, "symmetric_signal"));
    HP_ASSIGN_OR_RETURN(const SignalWidth width, hp::shmem::capi::SignalWidthArg(signal_bytes));
    HP_ASSIGN_OR_RETURN(const SignalOp op, hp::shmem::capi::SignalOpArg(signal_op));
    return R().Signal(symmetric_signal, width, value, op, pe, kDefaultStream);
  });
}

int hp_shmem_wait_signal(const void* symmetric_signal, int signal_bytes, int compare_op, int64_t value) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNull(symmetric_signal, "symmetric_signal"));
    HP_ASSIGN_OR_RETURN(const SignalWidth width, hp::shmem::capi::SignalWidthArg(signal_bytes));
    HP_ASSIGN_OR_RETURN(const CompareOp cmp, hp::shmem::capi::CompareOpArg(compare_op));
    return R().WaitSignal(symmetric_signal, width, cmp, value, kDefaultStream);
  });
}

int hp_shmem_barrier(void) {
  return Call([&]() -> Status { return R().Barrier(kDefaultStream); });
}

int hp_shmem_reduce(void* dst, size_t dst_bytes, const void* symmetric_src, size_t src_bytes, int dtype,
                    int reduce_op, const int* pes, int npes) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNullData(dst, dst_bytes, "dst"));
    HP_RETURN_IF_ERROR(NonNullData(symmetric_src, src_bytes, "symmetric_src"));
    HP_RETURN_IF_ERROR(NonNegative(npes, "npes"));
    if (npes > 0) HP_RETURN_IF_ERROR(NonNull(pes, "pes"));
    HP_ASSIGN_OR_RETURN(const DataType type, hp::shmem::capi::DtypeArg(dtype));
    HP_ASSIGN_OR_RETURN(const ReduceOp op, hp::shmem::capi::ReduceOpArg(reduce_op));
    const std::vector<int> members(pes, pes + npes);
    return R().Reduce(dst, dst_bytes, symmetric_src, src_bytes, type, op, members, kDefaultStream, nullptr);
  });
}

int hp_shmem_team_create(const int* pes, int npes, const hp_shmem_bootstrap* bootstrap, uint64_t* team) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNegative(npes, "npes"));
    if (npes > 0) HP_RETURN_IF_ERROR(NonNull(pes, "pes"));
    HP_RETURN_IF_ERROR(CBootstrap::Check(bootstrap));
    HP_RETURN_IF_ERROR(NonNull(team, "team"));
    const std::vector<int> members(pes, pes + npes);
    CBootstrap adapter(*bootstrap);
    HP_ASSIGN_OR_RETURN(const std::uint64_t created, R().CreateTeam(members, adapter));
    *team = created;
    return Status::Ok();
  });
}

int hp_shmem_team_release(uint64_t team) {
  return Call([&]() -> Status { return R().ReleaseTeam(team); });
}

int hp_shmem_team_barrier(uint64_t team, int role) {
  return Call([&]() -> Status {
    HP_ASSIGN_OR_RETURN(const CallRole call_role, hp::shmem::capi::RoleArg(role));
    return R().TeamBarrier(team, kDefaultStream, call_role);
  });
}

int hp_shmem_all_gather(uint64_t team, void* output, size_t output_bytes, const void* input, size_t input_bytes,
                        const hp_shmem_element_type* type, int role) {
  return Call([&]() -> Status {
    HP_ASSIGN_OR_RETURN(const CallRole call_role, hp::shmem::capi::RoleArg(role));
    std::optional<ElementType> element;
    const Status args = [&]() -> Status {
      HP_RETURN_IF_ERROR(NonNullData(output, output_bytes, "output"));
      HP_RETURN_IF_ERROR(NonNullData(input, input_bytes, "input"));
      HP_ASSIGN_OR_RETURN(element, hp::shmem::capi::ElementTypeArg(type));
      return Status::Ok();
    }();
    if (!args.ok()) return R().Refuse(team, Collective::kAllGather, args, kDefaultStream, call_role);
    return R().AllGather(team, output, output_bytes, input, input_bytes, *element, kDefaultStream, nullptr, call_role);
  });
}

int hp_shmem_all_reduce(uint64_t team, void* tensor, const void* input, size_t bytes, int dtype, int reduce_op,
                        int wire, int role) {
  return Call([&]() -> Status {
    HP_ASSIGN_OR_RETURN(const CallRole call_role, hp::shmem::capi::RoleArg(role));
    DataType type{};
    ReduceOp op{};
    std::optional<hp::shmem::ops::LowFormat> format;
    const Status args = [&]() -> Status {
      HP_RETURN_IF_ERROR(NonNullData(tensor, bytes, "tensor"));
      HP_ASSIGN_OR_RETURN(type, hp::shmem::capi::DtypeArg(dtype));
      HP_ASSIGN_OR_RETURN(op, hp::shmem::capi::ReduceOpArg(reduce_op));
      HP_ASSIGN_OR_RETURN(format, hp::shmem::capi::WireArg(wire));
      return Status::Ok();
    }();
    if (!args.ok()) return R().Refuse(team, Collective::kAllReduce, args, kDefaultStream, call_role);
    return R().AllReduce(team, tensor, bytes, type, op, kDefaultStream, nullptr, format, input, call_role);
  });
}

int hp_shmem_reduce_scatter(uint64_t team, void* output, size_t output_bytes, const void* input, size_t input_bytes,
                            int dtype, int reduce_op, int wire, int role) {
  return Call([&]() -> Status {
    HP_ASSIGN_OR_RETURN(const CallRole call_role, hp::shmem::capi::RoleArg(role));
    DataType type{};
    ReduceOp op{};
    std::optional<hp::shmem::ops::LowFormat> format;
    const Status args = [&]() -> Status {
      HP_RETURN_IF_ERROR(NonNullData(output, output_bytes, "output"));
      HP_RETURN_IF_ERROR(NonNullData(input, input_bytes, "input"));
      HP_ASSIGN_OR_RETURN(type, hp::shmem::capi::DtypeArg(dtype));
      HP_ASSIGN_OR_RETURN(op, hp::shmem::capi::ReduceOpArg(reduce_op));
      HP_ASSIGN_OR_RETURN(format, hp::shmem::capi::WireArg(wire));
      return Status::Ok();
    }();
    if (!args.ok()) return R().Refuse(team, Collective::kReduceScatter, args, kDefaultStream, call_role);
    return R().ReduceScatter(team, output, output_bytes, input, input_bytes, type, op, kDefaultStream, nullptr,
                             format, call_role);
  });
}

int hp_shmem_all_to_all(uint64_t team, const void* const* sends, const size_t* send_bytes, int nsends, void* receive,
                        size_t receive_bytes, const uint64_t* receive_counts, int ncounts,
                        const hp_shmem_element_type* type, int role) {
  return Call([&]() -> Status {
    HP_ASSIGN_OR_RETURN(const CallRole call_role, hp::shmem::capi::RoleArg(role));
    std::optional<ElementType> element;
    std::vector<std::pair<const void*, std::size_t>> views;
    std::vector<std::uint64_t> counts;
    const Status args = [&]() -> Status {
    HP_RETURN_IF_ERROR(NonNegative(nsends, "nsends"));
    HP_RETURN_IF_ERROR(NonNegative(ncounts, "ncounts"));
      HP_RETURN_IF_ERROR(NonNegative(nsends, "nsends"));
      HP_RETURN_IF_ERROR(NonNegative(ncounts, "ncounts"));
      if (nsends > 0) {
        HP_RETURN_IF_ERROR(NonNull(sends, "sends"));
        HP_RETURN_IF_ERROR(NonNull(send_bytes, "send_bytes"));
      }
      if (ncounts > 0) HP_RETURN_IF_ERROR(NonNull(receive_counts, "receive_counts"));
      HP_RETURN_IF_ERROR(NonNullData(receive, receive_bytes, "receive"));
      HP_ASSIGN_OR_RETURN(element, hp::shmem::capi::ElementTypeArg(type));
      views.reserve(static_cast<std::size_t>(nsends));
      for (int j = 0; j < nsends; ++j) {
        if (sends[j] == nullptr && send_bytes[j] > 0) {
          return hp::shmem::InvalidArgument("`sends[" + std::to_string(j) + "]` must be a non-null pointer, but got NULL");
        }
        views.emplace_back(sends[j], send_bytes[j]);
      }
      counts.assign(receive_counts, receive_counts + ncounts);
      return Status::Ok();
    }();
    if (!args.ok()) return R().Refuse(team, Collective::kAllToAll, args, kDefaultStream, call_role);
    return R().AllToAll(team, views, receive, receive_bytes, counts, *element, kDefaultStream, nullptr, call_role);
  });
}

int hp_shmem_send(uint64_t team, const void* data, size_t bytes, const hp_shmem_element_type* type, int peer) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNullData(data, bytes, "data"));
    HP_ASSIGN_OR_RETURN(const ElementType element, hp::shmem::capi::ElementTypeArg(type));
    return R().Send(team, data, bytes, element, peer, kDefaultStream, nullptr);
  });
}

int hp_shmem_recv(uint64_t team, void* data, size_t bytes, const hp_shmem_element_type* type, int peer) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNullData(data, bytes, "data"));
    HP_ASSIGN_OR_RETURN(const ElementType element, hp::shmem::capi::ElementTypeArg(type));
    return R().Recv(team, data, bytes, element, peer, kDefaultStream, nullptr);
  });
}

int hp_shmem_refuse(uint64_t team, int collective, int status, const char* message, int role) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNull(message, "message"));
    HP_ASSIGN_OR_RETURN(const CallRole call_role, hp::shmem::capi::RoleArg(role));
    if (status <= HP_SHMEM_OK || status > HP_SHMEM_INTERRUPTED) {
      return hp::shmem::InvalidArgument("`status` must be a failure code of hp_shmem_status, but got " +
                                        std::to_string(status));
    }
    return R().Refuse(team, static_cast<Collective>(collective), Status(static_cast<hp::shmem::StatusCode>(status), message),
                      kDefaultStream, call_role);
  });
}

int hp_shmem_give_up(uint64_t team, const char* message) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNull(message, "message"));
    (void)R().GiveUp(team, hp::shmem::StateError(message));
    return Status::Ok();
  });
}

int hp_shmem_debug_state_json(char* buffer, size_t capacity, size_t* needed) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNull(needed, "needed"));
    if (capacity > 0) HP_RETURN_IF_ERROR(NonNull(buffer, "buffer"));
    const std::string json = hp::shmem::capi::DebugStateJson(R().Snapshot());
    *needed = json.size() + 1;
    if (capacity >= json.size() + 1) {
      std::memcpy(buffer, json.c_str(), json.size() + 1);
    } else if (capacity > 0) {
      buffer[0] = '\0';   // never a truncated document that looks whole
    }
    return Status::Ok();
  });
}

}  // extern "C"
