#include "runtime/numberings.h"

#include "ops/reduce_op.h"
#include "runtime/device.h"
#include "runtime/json_writer.h"
#include "runtime/runtime.h"

namespace hp::shmem {
namespace {

template <typename Enum, typename NameOf>
Numbering Number(const char* name, std::initializer_list<Enum> values, NameOf name_of) {
  Numbering numbering{name, {}};
  for (const Enum value : values) numbering.values.emplace_back(name_of(value), static_cast<int>(value));
  return numbering;
}

std::vector<Numbering> MakeNumberings() {
  std::vector<Numbering> all;
  Numbering codes{"status_codes", {}};
  for (int c = static_cast<int>(StatusCode::kOk); c <= static_cast<int>(StatusCode::kInterrupted); ++c) {
    codes.values.emplace_back(StatusCodeName(static_cast<StatusCode>(c)), c);
  }
  all.push_back(std::move(codes));
  all.push_back(Number("dtypes",
                       {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
                        DataType::kInt8, DataType::kUInt8, DataType::kInt32, DataType::kInt64},
                       DataTypeName));
  all.push_back(Number("reduce_ops", {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}, ReduceOpName));
  all.push_back(Number("signal_ops", {SignalOp::kSet, SignalOp::kAdd}, SignalOpName));
  all.push_back(Number("compare_ops",
                       {CompareOp::kEq, CompareOp::kNe, CompareOp::kGt, CompareOp::kGe, CompareOp::kLt, CompareOp::kLe},
                       CompareOpName));
  Numbering wires{"wire_formats", {{"full", static_cast<int>(kWireFull)}}};
  for (int f = 0; f < ops::kLowFormats; ++f) {
    const auto format = static_cast<ops::LowFormat>(f);
    wires.values.emplace_back(ops::LowFormatName(format), WireNumber(format));
  }
  all.push_back(std::move(wires));
  all.push_back(Number("call_roles",
                       {CallRole::kForward, CallRole::kBackward, CallRole::kFusedGather, CallRole::kFusedScatter},
                       CallRoleName));
  all.push_back(Number("collectives",
                       {Collective::kBarrier, Collective::kAllGather, Collective::kAllReduce,
                        Collective::kReduceScatter, Collective::kAllToAll, Collective::kFusedAllGatherMatmul,
                        Collective::kFusedMatmulReduceScatter, Collective::kRelease,
                        Collective::kMoeDispatch, Collective::kMoeCombine},
                       CollectiveName));
  all.push_back(Number("lifecycle_states",
                       {LifecycleState::kUninitialized, LifecycleState::kInitialized, LifecycleState::kFailed},
                       LifecycleStateName));
  return all;
}

}  // namespace

const std::vector<Numbering>& Numberings() {
  static const auto* numberings = new std::vector<Numbering>(MakeNumberings());   // never destroyed
  return *numberings;
}

std::string NumberingsJson() {
  JsonWriter json;
  json.BeginObject();
  for (const Numbering& numbering : Numberings()) {
    json.Key(numbering.name);
    json.BeginObject();
    for (const auto& [name, number] : numbering.values) {
      json.Key(name.c_str());
      json.Signed(number);
    }
    json.EndObject();
  }
  json.EndObject();
  return json.text();
}

Result<std::optional<ops::LowFormat>> WireFromNumber(int wire) {
  if (wire == static_cast<int>(kWireFull)) return std::optional<ops::LowFormat>();
  if (ops::IsLowFormat(wire - 1)) return std::optional<ops::LowFormat>(static_cast<ops::LowFormat>(wire - 1));
  return InvalidArgument("`wire` must be one of 0 (full), 1 (float8_e4m3fn), 2 (float8_e5m2), 3 (float16), "
                         "4 (bfloat16), but got " + std::to_string(wire));
}

int WireNumber(std::optional<ops::LowFormat> wire) {
  return wire.has_value() ? static_cast<int>(*wire) + 1 : static_cast<int>(kWireFull);
}

Result<CallRole> CallRoleFromNumber(int role) {
  if (role >= static_cast<int>(CallRole::kForward) && role <= static_cast<int>(CallRole::kFusedScatter)) {
    return static_cast<CallRole>(role);
  }
  return InvalidArgument("`role` must be one of 0 (forward), 1 (backward), 2 (fused_gather), 3 (fused_scatter), "
                         "but got " + std::to_string(role));
}

}  // namespace hp::shmem
