// The runtime's C ABI (hp_shmem.h) over the process-wide Runtime: what the torch binding does with tensors, done
// with plain addresses, for handlers that cannot link the runtime's C++ ABI (MindSpore's).
//
// Every function: clears this thread's last error, checks what the runtime cannot (null pointers, C enum values:
// capi/arguments.h), runs the runtime's call on the default stream with nothing to keep alive (the host device
// finishes before it returns), and turns the Status into its code and message (capi/call.h). No exception crosses the
// C boundary.
#include "capi/hp_shmem.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "capi/arguments.h"
#include "capi/c_bootstrap.h"
#include "capi/call.h"
#include "ops/host/codec.h"
#include "ops/reduce_op.h"
#include "ops/wire_format.h"
#include "runtime/collectives/engine.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/device_factory.h"
#include "runtime/logging.h"
#include "runtime/numberings.h"
#include "runtime/registry.h"
#include "runtime/runtime.h"
#include "runtime/status.h"
#include "runtime/team.h"

namespace hp::shmem::capi {
namespace {

Runtime& R() { return Runtime::Instance(); }

// Copies `json` into the caller's buffer (hp_shmem_debug_state_json's protocol).
Status CopyJson(const std::string& json, char* buffer, std::size_t capacity, std::size_t* needed) {
  HP_RETURN_IF_ERROR(NonNull(needed, "needed"));
  if (capacity > 0) HP_RETURN_IF_ERROR(NonNull(buffer, "buffer"));
  *needed = json.size() + 1;
  if (capacity >= json.size() + 1) {
    std::memcpy(buffer, json.c_str(), json.size() + 1);
  } else if (capacity > 0) {
    buffer[0] = '\0';   // never a truncated document that looks whole
  }
  return Status::Ok();
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
using hp::shmem::capi::Code;
using hp::shmem::capi::CBootstrap;
using hp::shmem::capi::NonNegative;
using hp::shmem::capi::NonNull;
using hp::shmem::capi::NonNullData;
using hp::shmem::capi::R;

extern "C" {

int hp_shmem_abi_version(void) { return HP_SHMEM_ABI_VERSION; }

const char* hp_shmem_last_error(void) { return hp::shmem::capi::LastError().c_str(); }

// Reads nothing of this thread's state: it leaves the last error alone, so that a caller may name the status of the
// call that failed before reading that call's message.
const char* hp_shmem_status_name(int status) {
  if (status < HP_SHMEM_OK || status > HP_SHMEM_INTERRUPTED) return "UNKNOWN";
  return hp::shmem::StatusCodeName(static_cast<hp::shmem::StatusCode>(status));
}

int hp_shmem_numberings_json(char* buffer, size_t capacity, size_t* needed) {
  return Call([&]() -> Status {
    return hp::shmem::capi::CopyJson(hp::shmem::NumberingsJson(), buffer, capacity, needed);
  });
}

int hp_shmem_read_config_json(char* buffer, size_t capacity, size_t* needed) {
  return Call([&]() -> Status {
    HP_ASSIGN_OR_RETURN(const Config config, hp::shmem::ParseConfig(hp::shmem::ProcessEnv()));
    return hp::shmem::capi::CopyJson(hp::shmem::ConfigJson(config), buffer, capacity, needed);
  });
}

int hp_shmem_low_precision_default(int* wire) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNull(wire, "wire"));
    HP_ASSIGN_OR_RETURN(const std::optional<hp::shmem::ops::LowFormat> format, R().LowPrecisionDefault());
    *wire = hp::shmem::WireNumber(format);
    return Status::Ok();
  });
}

int hp_shmem_log_level(void) {
  hp::shmem::capi::LastError().clear();
  return static_cast<int>(hp::shmem::Logger::Level());
}

int hp_shmem_init(const hp_shmem_bootstrap* bootstrap, size_t heap_size) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(CBootstrap::Check(bootstrap));
    HP_ASSIGN_OR_RETURN(const Config config, hp::shmem::ConfigForInit(heap_size));
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
  hp::shmem::capi::LastError().clear();
  return static_cast<int>(R().state());
}

int hp_shmem_rank(void) {
  hp::shmem::capi::LastError().clear();
  return R().rank();
}

int hp_shmem_world_size(void) {
  hp::shmem::capi::LastError().clear();
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

int hp_shmem_put_with_signal(void* symmetric_dst, const void* src, size_t dst_bytes, size_t src_bytes,
                             void* symmetric_signal, int signal_bytes, int64_t value, int signal_op, int pe) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNullData(symmetric_dst, dst_bytes, "symmetric_dst"));
    HP_RETURN_IF_ERROR(NonNullData(src, src_bytes, "src"));
    HP_RETURN_IF_ERROR(NonNull(symmetric_signal, "symmetric_signal"));
    HP_ASSIGN_OR_RETURN(const SignalWidth width, hp::shmem::capi::SignalWidthArg(signal_bytes));
    HP_ASSIGN_OR_RETURN(const SignalOp op, hp::shmem::capi::SignalOpArg(signal_op));
    return R().PutWithSignal(symmetric_dst, src, dst_bytes, src_bytes, symmetric_signal, width, value, op, pe,
                             kDefaultStream, nullptr);
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

int hp_shmem_exchange_messages(uint64_t tag, hp_shmem_message_exchange* exchanges, size_t count) {
  std::string first_failure;
  const int code = Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNullData(exchanges, count, "exchanges"));
    std::vector<hp::shmem::MessageExchange> batch(count);
    for (std::size_t i = 0; i < count; ++i) {
      batch[i].pe = exchanges[i].pe;
      batch[i].send = exchanges[i].send;
      batch[i].send_bytes = exchanges[i].send_bytes;
      batch[i].receive = exchanges[i].receive;
      batch[i].receive_capacity = exchanges[i].receive_capacity;
    }
    HP_RETURN_IF_ERROR(R().ExchangeMessages(tag, batch.data(), count));
    for (std::size_t i = 0; i < count; ++i) {
      exchanges[i].received = batch[i].received;
      exchanges[i].status = batch[i].status.ok() ? HP_SHMEM_OK : Code(batch[i].status.code());
      if (!batch[i].status.ok() && first_failure.empty()) first_failure = batch[i].status.message();
    }
    return Status::Ok();
  });
  if (code == HP_SHMEM_OK) hp::shmem::capi::LastError() = first_failure;
  return code;
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

int hp_shmem_node_team_create(const int* pes, int npes, const int* serves, int nserves,
                              const hp_shmem_bootstrap* bootstrap, uint64_t* team) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNegative(npes, "npes"));
    if (npes > 0) HP_RETURN_IF_ERROR(NonNull(pes, "pes"));
    HP_RETURN_IF_ERROR(NonNegative(nserves, "nserves"));
    // An empty list would make a plain team: a node team always serves a team.
    if (nserves == 0) return hp::shmem::InvalidArgument("`nserves` must be at least 1, but got 0");
    HP_RETURN_IF_ERROR(NonNull(serves, "serves"));
    HP_RETURN_IF_ERROR(CBootstrap::Check(bootstrap));
    HP_RETURN_IF_ERROR(NonNull(team, "team"));
    const std::vector<int> members(pes, pes + npes);
    const std::vector<int> whole(serves, serves + nserves);
    CBootstrap adapter(*bootstrap);
    HP_ASSIGN_OR_RETURN(const std::uint64_t created, R().CreateTeam(members, adapter, whole));
    *team = created;
    return Status::Ok();
  });
}

int hp_shmem_team_release(uint64_t team) {
  return Call([&]() -> Status { return R().ReleaseTeam(team); });
}

int hp_shmem_team_barrier(uint64_t team, int role) {
  return Call([&]() -> Status {
    HP_ASSIGN_OR_RETURN(const CallRole call_role, hp::shmem::CallRoleFromNumber(role));
    return R().TeamBarrier(team, kDefaultStream, call_role);
  });
}

int hp_shmem_all_gather(uint64_t team, void* output, size_t output_bytes, const void* input, size_t input_bytes,
                        const hp_shmem_element_type* type, int role) {
  return Call([&]() -> Status {
    HP_ASSIGN_OR_RETURN(const CallRole call_role, hp::shmem::CallRoleFromNumber(role));
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
    HP_ASSIGN_OR_RETURN(const CallRole call_role, hp::shmem::CallRoleFromNumber(role));
    DataType type{};
    ReduceOp op{};
    std::optional<hp::shmem::ops::LowFormat> format;
    const Status args = [&]() -> Status {
      HP_RETURN_IF_ERROR(NonNullData(tensor, bytes, "tensor"));
      HP_ASSIGN_OR_RETURN(type, hp::shmem::capi::DtypeArg(dtype));
      HP_ASSIGN_OR_RETURN(op, hp::shmem::capi::ReduceOpArg(reduce_op));
      HP_ASSIGN_OR_RETURN(format, hp::shmem::WireFromNumber(wire));
      return Status::Ok();
    }();
    if (!args.ok()) return R().Refuse(team, Collective::kAllReduce, args, kDefaultStream, call_role);
    return R().AllReduce(team, tensor, bytes, type, op, kDefaultStream, nullptr, format, input, call_role);
  });
}

int hp_shmem_reduce_scatter(uint64_t team, void* output, size_t output_bytes, const void* input, size_t input_bytes,
                            int dtype, int reduce_op, int wire, int role) {
  return Call([&]() -> Status {
    HP_ASSIGN_OR_RETURN(const CallRole call_role, hp::shmem::CallRoleFromNumber(role));
    DataType type{};
    ReduceOp op{};
    std::optional<hp::shmem::ops::LowFormat> format;
    const Status args = [&]() -> Status {
      HP_RETURN_IF_ERROR(NonNullData(output, output_bytes, "output"));
      HP_RETURN_IF_ERROR(NonNullData(input, input_bytes, "input"));
      HP_ASSIGN_OR_RETURN(type, hp::shmem::capi::DtypeArg(dtype));
      HP_ASSIGN_OR_RETURN(op, hp::shmem::capi::ReduceOpArg(reduce_op));
      HP_ASSIGN_OR_RETURN(format, hp::shmem::WireFromNumber(wire));
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
    HP_ASSIGN_OR_RETURN(const CallRole call_role, hp::shmem::CallRoleFromNumber(role));
    std::optional<ElementType> element;
    std::vector<std::pair<const void*, std::size_t>> views;
    std::vector<std::uint64_t> counts;
    const Status args = [&]() -> Status {
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

int hp_shmem_moe_exchange(uint64_t team, int direction, int experts, const void* input, int64_t input_rows,
                          void* output, int64_t output_rows, size_t row_bytes, const int64_t* in_splits,
                          const int64_t* in_offsets, int64_t major_align, int64_t* out_splits, int64_t* out_offsets,
                          int role) {
  return Call([&]() -> Status {
    HP_ASSIGN_OR_RETURN(const CallRole call_role, hp::shmem::CallRoleFromNumber(role));
    const bool combine = direction == 1;
    const Collective collective = combine ? Collective::kMoeCombine : Collective::kMoeDispatch;
    const Status args = [&]() -> Status {
      if (direction != 0 && direction != 1) {
        return hp::shmem::InvalidArgument("`direction` must be 0 (dispatch) or 1 (combine), but got " +
                                          std::to_string(direction));
      }
      HP_RETURN_IF_ERROR(NonNull(in_splits, "in_splits"));
      HP_RETURN_IF_ERROR(NonNull(out_splits, "out_splits"));
      HP_RETURN_IF_ERROR(NonNull(out_offsets, "out_offsets"));
      return Status::Ok();
    }();
    if (!args.ok()) return R().Refuse(team, collective, args, kDefaultStream, call_role);
    hp::shmem::MoeExchangeArgs x;
    x.op = combine ? "moe_combine" : "moe_dispatch";
    x.team = team;
    x.direction = combine ? hp::shmem::MoeDirection::kCombine : hp::shmem::MoeDirection::kDispatch;
    x.experts = experts;
    x.input = input;
    x.input_rows = input_rows;
    x.output = output;
    x.output_rows = output_rows;
    x.row_bytes = row_bytes;
    x.in_splits = in_splits;
    x.in_offsets = in_offsets;
    x.major_align = major_align;
    x.out_splits = out_splits;
    x.out_offsets = out_offsets;
    x.role = call_role;
    return R().MoeExchange(x, kDefaultStream, nullptr);
  });
}

static_assert(HP_SHMEM_MOE_ROW_HEADER == hp::shmem::kMoeRowHeader, "the C ABI's MoE row is the engine's");

int hp_shmem_moe_row(int direction, int experts, int members, const int64_t* in_splits, const int64_t* in_offsets,
                     int64_t input_rows, int64_t output_rows, int64_t* row, size_t row_capacity) {
  return Call([&]() -> Status {
    HP_ASSIGN_OR_RETURN(const hp::shmem::MoeExchangeArgs x,
                        hp::shmem::MoeStepArgs(direction, experts, 0, input_rows, output_rows));
    if (members < 1) {
      return hp::shmem::InvalidArgument("`members` must be positive, but got " + std::to_string(members));
    }
    const std::size_t nsplits = static_cast<std::size_t>(members) * static_cast<std::size_t>(experts);
    HP_RETURN_IF_ERROR(NonNull(in_splits, "in_splits"));
    HP_RETURN_IF_ERROR(NonNull(row, "row"));
    const std::size_t length = hp::shmem::kMoeRowHeader + 2 * nsplits;
    if (row_capacity < length) {
      return hp::shmem::InvalidArgument("`row_capacity` must be at least " + std::to_string(length) +
                                        " values, but got " + std::to_string(row_capacity));
    }
    const std::vector<std::int64_t> published = hp::shmem::MoePublishedRow(x, members, in_splits, in_offsets, -1);
    std::copy(published.begin(), published.end(), row);
    return Status::Ok();
  });
}

int hp_shmem_moe_plan(int direction, int experts, int64_t major_align, int members, const int64_t* rows,
                      size_t row_length, int me, int64_t* splits, int64_t* offsets, int64_t* from) {
  return Call([&]() -> Status {
    HP_ASSIGN_OR_RETURN(const hp::shmem::MoeExchangeArgs x,
                        hp::shmem::MoeStepArgs(direction, experts, major_align, 0, 0));
    if (members < 1) {
      return hp::shmem::InvalidArgument("`members` must be positive, but got " + std::to_string(members));
    }
    for (const auto& [pointer, name] : {std::pair<const void*, const char*>{rows, "rows"}, {splits, "splits"},
                                        {offsets, "offsets"}, {from, "from"}}) {
      HP_RETURN_IF_ERROR(NonNull(pointer, name));
    }
    std::vector<std::vector<std::int64_t>> every(static_cast<std::size_t>(members));
    for (std::size_t r = 0; r < every.size(); ++r) every[r].assign(rows + r * row_length, rows + (r + 1) * row_length);
    HP_ASSIGN_OR_RETURN(const hp::shmem::MoeLayout layout, hp::shmem::PlanMoeExchange(x, every, me));
    std::copy(layout.splits.begin(), layout.splits.end(), splits);
    std::copy(layout.offsets.begin(), layout.offsets.end(), offsets);
    std::copy(layout.from.begin(), layout.from.end(), from);
    return Status::Ok();
  });
}

int hp_shmem_wire_row_bytes(int wire, size_t row_elems, size_t* bytes) {
  return Call([&]() -> Status {
    HP_ASSIGN_OR_RETURN(const hp::shmem::ops::LowFormat format, hp::shmem::capi::LowWireArg(wire));
    HP_RETURN_IF_ERROR(NonNull(bytes, "bytes"));
    *bytes = hp::shmem::ops::WireRowBytes(format, row_elems);
    return Status::Ok();
  });
}

int hp_shmem_encode_rows(int wire, int dtype, const void* src, size_t rows, size_t row_elems, void* dst) {
  return Call([&]() -> Status {
    HP_ASSIGN_OR_RETURN(const hp::shmem::ops::LowFormat format, hp::shmem::capi::LowWireArg(wire));
    HP_ASSIGN_OR_RETURN(const DataType type, hp::shmem::capi::CodecDtypeArg(dtype));
    HP_RETURN_IF_ERROR(NonNullData(src, rows * row_elems * hp::shmem::DataTypeSize(type), "src"));
    HP_RETURN_IF_ERROR(NonNullData(dst, rows * hp::shmem::ops::WireRowBytes(format, row_elems), "dst"));
    if (!hp::shmem::ops::HostEncodeRows(format, type, src, rows, row_elems, dst)) {
      return hp::shmem::Internal("the host codec refused checked arguments: encode_rows");
    }
    return Status::Ok();
  });
}

int hp_shmem_decode_rows(int wire, const void* src, size_t rows, size_t row_elems, int dtype, void* out) {
  return Call([&]() -> Status {
    HP_ASSIGN_OR_RETURN(const hp::shmem::ops::LowFormat format, hp::shmem::capi::LowWireArg(wire));
    HP_ASSIGN_OR_RETURN(const DataType type, hp::shmem::capi::CodecDtypeArg(dtype));
    HP_RETURN_IF_ERROR(NonNullData(src, rows * hp::shmem::ops::WireRowBytes(format, row_elems), "src"));
    HP_RETURN_IF_ERROR(NonNullData(out, rows * row_elems * hp::shmem::DataTypeSize(type), "out"));
    if (!hp::shmem::ops::HostDecodeRows(format, src, rows, row_elems, type, out)) {
      return hp::shmem::Internal("the host codec refused checked arguments: decode_rows");
    }
    return Status::Ok();
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
    HP_ASSIGN_OR_RETURN(const CallRole call_role, hp::shmem::CallRoleFromNumber(role));
    if (status <= HP_SHMEM_OK || status > HP_SHMEM_INTERRUPTED) {
      return hp::shmem::InvalidArgument("`status` must be a failure code of hp_shmem_status, but got " +
                                        std::to_string(status));
    }
    return R().Refuse(team, static_cast<Collective>(collective), Status(static_cast<hp::shmem::StatusCode>(status), message),
                      kDefaultStream, call_role);
  });
}

int hp_shmem_agree(uint64_t team, int collective, const char* dtype, size_t element_bytes, uint64_t count,
                   int reduce_op, int wire, int peer, const int64_t* values, size_t value_count, int role,
                   int64_t* rows, size_t rows_capacity, size_t* row_lengths, size_t members) {
  return Call([&]() -> Status {
    HP_RETURN_IF_ERROR(NonNull(dtype, "dtype"));
    HP_RETURN_IF_ERROR(NonNullData(values, value_count, "values"));
    HP_RETURN_IF_ERROR(NonNullData(row_lengths, members, "row_lengths"));
    HP_ASSIGN_OR_RETURN(const CallRole call_role, hp::shmem::CallRoleFromNumber(role));
    // Every member publishes as many values as this one (the engine's staging holds equal shares).
    if (rows_capacity < members * value_count) {
      return hp::shmem::InvalidArgument("`rows_capacity` must hold members x value_count = " +
                                        std::to_string(members * value_count) + " values, but got " +
                                        std::to_string(rows_capacity));
    }
    if (rows_capacity > 0) HP_RETURN_IF_ERROR(NonNull(rows, "rows"));
    const hp::shmem::Fingerprint fingerprint = hp::shmem::CallFingerprint(
        static_cast<std::uint32_t>(collective), static_cast<std::uint32_t>(reduce_op), static_cast<std::uint32_t>(wire),
        peer, count, element_bytes, dtype, call_role);
    HP_ASSIGN_OR_RETURN(const std::vector<std::vector<std::int64_t>> agreed,
                        R().Agree(team, fingerprint, std::vector<std::int64_t>(values, values + value_count),
                                  kDefaultStream));
    if (agreed.size() != members) {
      return hp::shmem::InvalidArgument("`members` must be the team's size " + std::to_string(agreed.size()) +
                                        ", but got " + std::to_string(members));
    }
    std::size_t at = 0;
    for (std::size_t i = 0; i < members; ++i) {
      if (at + agreed[i].size() > rows_capacity) {
        return hp::shmem::InvalidArgument("`rows_capacity` must hold every member's values (" +
                                          std::to_string(at + agreed[i].size()) + " so far), but got " +
                                          std::to_string(rows_capacity));
      }
      std::copy(agreed[i].begin(), agreed[i].end(), rows + at);
      row_lengths[i] = agreed[i].size();
      at += agreed[i].size();
    }
    return Status::Ok();
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
    if (R().state() == hp::shmem::LifecycleState::kInitialized) (void)R().CheckDeferred();   // records what it finds
    return hp::shmem::capi::CopyJson(hp::shmem::SnapshotJson(R().Snapshot()), buffer, capacity, needed);
  });
}

}  // extern "C"
