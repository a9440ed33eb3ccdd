// The Runtime's teams and their collectives: the team pool, team creation and release, and each collective's checks
// (refused collectively) before the engine runs it (runtime.h, collectives/engine.h).
#include "runtime/runtime.h"

#include <algorithm>
#include "runtime/interrupt.h"
#include "runtime/logging.h"

namespace hp::shmem {

Status Runtime::ReserveTeamPool() {
  std::lock_guard<std::mutex> lock(mu_);
  if (teams_.ready()) return Status::Ok();
  QuiesceBeforeCollective();
  const TeamPoolLayout layout = TeamPoolLayout::For(device_->heap_size(), max_node_size_);
  auto local = device_->Allocate(layout.total_bytes, 4096);
  CheckRecord mine{};
  mine.op = static_cast<std::uint32_t>(CheckOp::kTeamPool);
  mine.status = static_cast<std::int32_t>(local.status().code());
  mine.bytes = layout.total_bytes;
  mine.alignment = 4096;
  mine.offset = local.ok() ? reinterpret_cast<std::uintptr_t>(local.value()) - device_->heap_base() : 0;
  auto undo = [&] {
    if (local.ok()) (void)device_->Free(local.value());
  };
  auto all = Exchange(mine);
  if (!all.ok()) {
    undo();
    return all.status();
  }
  mine.sequence = check_sequence_;
  for (int r : node_pes_) {
    const CheckRecord& theirs = all.value()[static_cast<std::size_t>(r)];
    if (theirs.status != 0) {
      undo();
      return Status(static_cast<StatusCode>(theirs.status),
                    "team pool does not fit the symmetric heap: rank=" + std::to_string(r) + " pool_bytes=" +
                        std::to_string(layout.total_bytes) + " heap_size=" + std::to_string(device_->heap_size()) +
                        " (raise HYPER_PARALLEL_SHMEM_HEAP_SIZE)");
    }
    if (theirs.op != mine.op || theirs.bytes != mine.bytes || theirs.offset != mine.offset) {
      undo();
      return Mismatch("ranks disagree on the team pool: rank=" + std::to_string(rank_) + " " + Describe(mine) +
                      ", rank=" + std::to_string(r) + " " + Describe(theirs));
    }
  }
  // Cleared through the device (the heap may be device memory), a piece at a time; the creation's exchange that
  // follows orders it before any peer writes into it.
  const std::vector<char> zeros(std::min<std::size_t>(layout.total_bytes, 1 << 20));
  for (std::size_t off = 0; off < layout.total_bytes; off += zeros.size()) {
    Status cleared = device_->CopyToHeap(static_cast<char*>(local.value()) + off, zeros.data(),
                                         std::min(zeros.size(), layout.total_bytes - off));
    if (!cleared.ok()) {
      undo();
      return cleared;
    }
  }
  team_pool_ = local.value();
  teams_.Reset(team_pool_, layout, lifecycle_.load(), node_pes_);
  {
    std::lock_guard<std::mutex> identity_lock(identity_mu_);
    identity_.internal_reserved += device_->ReservedBytes(team_pool_);
  }
  return Status::Ok();
}

Result<std::uint64_t> Runtime::CreateTeam(const std::vector<int>& pes, Bootstrap& bootstrap,
                                          const std::vector<int>& serves) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("team_create")));
  const auto n = static_cast<int>(pes.size());
  if (n == 0) return Record(InvalidArgument("`pes` must name at least one pe, but got none"));
  for (int i = 0; i < n; ++i) {
    const int pe = pes[static_cast<std::size_t>(i)];
    HP_RETURN_IF_ERROR(Record(CheckPe(pe, ("pes[" + std::to_string(i) + "]").c_str())));
    if (nodes_[static_cast<std::size_t>(pe)] != nodes_[static_cast<std::size_t>(rank_)]) {
      return Record(InvalidArgument(std::string("`pes` must lie on this rank's node (") + device_->name() +
                                    " device: a team's members map each other's heaps), but got pes[" +
                                    std::to_string(i) + "]=" + std::to_string(pe) + " on node " +
                                    std::to_string(nodes_[static_cast<std::size_t>(pe)]) + ", this rank (" +
                                    std::to_string(rank_) + ") on node " +
                                    std::to_string(nodes_[static_cast<std::size_t>(rank_)])));
    }
    for (int j = 0; j < i; ++j) {
      if (pes[static_cast<std::size_t>(j)] == pe) {
        return Record(InvalidArgument("`pes` must be distinct, but got " + std::to_string(pe) + " at positions " +
                                      std::to_string(j) + " and " + std::to_string(i)));
      }
    }
  }
  for (std::size_t i = 0; i < serves.size(); ++i) {
    HP_RETURN_IF_ERROR(Record(CheckPe(serves[i], ("serves[" + std::to_string(i) + "]").c_str())));
    for (std::size_t j = 0; j < i; ++j) {
      if (serves[j] == serves[i]) {
        return Record(InvalidArgument("`serves` must be distinct, but got " + std::to_string(serves[i]) +
                                      " at positions " + std::to_string(j) + " and " + std::to_string(i)));
      }
    }
  }
  for (std::size_t i = 0; i < pes.size() && !serves.empty(); ++i) {
    if (std::find(serves.begin(), serves.end(), pes[i]) == serves.end()) {
      return Record(InvalidArgument("`serves` must hold every pe of `pes`, but got none equal to pes[" +
                                    std::to_string(i) + "]=" + std::to_string(pes[i])));
    }
  }
  if (bootstrap.world_size() != n || bootstrap.rank() < 0 || bootstrap.rank() >= n ||
      pes[static_cast<std::size_t>(bootstrap.rank())] != rank_) {
    return Record(InvalidArgument("`pes` must list this rank (" + std::to_string(rank_) + ") at the group rank of its "
                                  "bootstrap (" + std::to_string(bootstrap.rank()) + " of " +
                                  std::to_string(bootstrap.world_size()) + "), but got " + std::to_string(n) + " pes"));
  }
  if (!teams_.ready()) {
    if (pes != node_pes_) {
      return Record(StateError("the root team must be created first: op=team_create group_size=" + std::to_string(n) +
                               " root_size=" + std::to_string(world_size_) + " node_size=" +
                               std::to_string(node_pes_.size()) +
                               " (create the team of every rank of the node, in root order, on every rank first)"));
    }
    HP_RETURN_IF_ERROR(Record(ReserveTeamPool()));
  }
  InterruptsBlocked no_interrupts;   // the bootstrap takes Python's lock: see interrupt.h
  auto team = teams_.Create(*device_, pes, bootstrap.rank(), bootstrap, serves);
  if (!team.ok()) return Record(team.status());
  return team.value()->id;
}

Status Runtime::ReleaseTeam(std::uint64_t team) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("team_release")));
  return Record(teams_.Release(*device_, team));
}

Result<std::shared_ptr<Team>> Runtime::LiveTeam(std::uint64_t team, const char* op) const {
  HP_RETURN_IF_ERROR(RequireInitialized(op));
  return teams_.Find(team);
}

Result<TeamView> Runtime::DescribeTeam(std::uint64_t team) const {
  auto found = LiveTeam(team, "team");
  if (!found.ok()) return Record(found.status());
  const Team& t = *found.value();
  return TeamView{t.pes, t.me, t.slot, t.staging_bytes()};
}

// Runs `body` on the live team with its lock held, counted as a call in flight.
#define HP_WITH_TEAM(team_id, op, engine, stream, keep, role)             \
  OperationScope scope(*this);                                            \
  auto hp_found = LiveTeam(team_id, op);                                  \
  if (!hp_found.ok()) return Record(hp_found.status());                   \
  std::lock_guard<std::mutex> hp_team_lock(hp_found.value()->mu);         \
  CollectiveEngine engine(*device_, *hp_found.value(), stream, keep, role, config_.strict_checks)

// The first failed check of a collective is refused collectively (every member fails with it); none runs `call`.
#define HP_REFUSE_IF_ERROR(engine, collective, check)                      \
  do {                                                                     \
    ::hp::shmem::Status hp_check_ = (check);                               \
    if (!hp_check_.ok()) return Record((engine).Refuse((collective), hp_check_)); \
  } while (0)

namespace {
ElementType ReducibleType(DataType dtype) {
  ElementType type;
  type.name = DataTypeName(dtype);
  type.bytes = DataTypeSize(dtype);
  type.reducible = true;
  type.reduce_type = dtype;
  return type;
}

Status CheckReduceOp(DataType dtype, ReduceOp op) {
  if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) {
    return InvalidArgument(std::string("`op` must be sum, max or min for ") + DataTypeName(dtype) + ", but got avg");
  }
  return Status::Ok();
}

// The wire format must apply to the reduction and be one the device carries.
Status CheckWire(const Device& device, std::optional<ops::LowFormat> wire, DataType dtype, ReduceOp op) {
  if (!wire.has_value()) return Status::Ok();
  const std::string refusal = ops::LowFormatRefusal(*wire, dtype, op);
  if (!refusal.empty()) {
    return InvalidArgument("`low_precision_dtype` must be " + refusal + " (dtype=" + DataTypeName(dtype) +
                           " op=" + ReduceOpName(op) + "), but got " + ops::LowFormatName(*wire));
  }
  return device.CheckWireFormat(*wire);
}

Status CheckWholeElements(std::size_t bytes, DataType dtype, const char* what) {
  if (bytes % DataTypeSize(dtype) == 0) return Status::Ok();
  return InvalidArgument(std::string("`") + what + "` must hold whole " + DataTypeName(dtype) + " elements, but got " +
                         std::to_string(bytes) + " bytes");
}

Status CheckAllGather(const Team& team, const void* output, std::size_t output_bytes, const void* input,
                      std::size_t input_bytes) {
  const auto n = static_cast<std::size_t>(team.size());
  const std::size_t expected = input_bytes * n;
  if (expected / n != input_bytes || output_bytes != expected) {
    return InvalidArgument("`output` must have group_size * input bytes (" + std::to_string(n) + " * " +
                           std::to_string(input_bytes) + " = " + std::to_string(expected) + "), but got " +
                           std::to_string(output_bytes));
  }
  const auto* out = static_cast<const char*>(output);
  const auto* in = static_cast<const char*>(input);
  const char* slot = out + static_cast<std::size_t>(team.me) * input_bytes;
  if (in != slot && in < out + output_bytes && out < in + input_bytes) {
    // Peers write every other part while this rank still reads its input: only its own part is safe in place.
    return InvalidArgument("`input` must not overlap `output` except as this rank's own part (offset " +
                           std::to_string(slot - out) + "), but got an input at offset " + std::to_string(in - out) +
                           " of the output");
  }
  return Status::Ok();
}

Status CheckAllReduce(const Device& device, const void* tensor, std::size_t bytes, DataType dtype, ReduceOp op,
                      std::optional<ops::LowFormat> wire, const void* input) {
  HP_RETURN_IF_ERROR(CheckReduceOp(dtype, op));
  HP_RETURN_IF_ERROR(CheckWire(device, wire, dtype, op));
  HP_RETURN_IF_ERROR(CheckWholeElements(bytes, dtype, "tensor"));
  const auto* out = static_cast<const char*>(tensor);
  const auto* in = input == nullptr ? out : static_cast<const char*>(input);
  if (in != out && in < out + bytes && out < in + bytes) {
    return InvalidArgument("`input` must be `tensor` itself or not overlap it, but got an overlap at byte " +
                           std::to_string(in < out ? out - in : in - out));
  }
  return Status::Ok();
}

Status CheckReduceScatter(const Device& device, const Team& team, const void* output, std::size_t output_bytes,
                          const void* input, std::size_t input_bytes, DataType dtype, ReduceOp op,
                          std::optional<ops::LowFormat> wire) {
  HP_RETURN_IF_ERROR(CheckReduceOp(dtype, op));
  HP_RETURN_IF_ERROR(CheckWire(device, wire, dtype, op));
  HP_RETURN_IF_ERROR(CheckWholeElements(output_bytes, dtype, "output"));
  const auto n = static_cast<std::size_t>(team.size());
  if (input_bytes != n * output_bytes) {
    return InvalidArgument("`input` must have group_size * output bytes (" + std::to_string(n) + " * " +
                           std::to_string(output_bytes) + "), but got " + std::to_string(input_bytes));
  }
  const auto* out = static_cast<const char*>(output);
  const auto* in = static_cast<const char*>(input);
  const char* mine = in + static_cast<std::size_t>(team.me) * output_bytes;
  if (out != mine && out < in + input_bytes && in < out + output_bytes) {
    return InvalidArgument("`output` must be this rank's part of `input` or not overlap it, but got an overlap "
                           "at byte " + std::to_string(out - in) + " of the input");
  }
  return Status::Ok();
}

Status CheckAllToAll(const Team& team, const std::vector<std::pair<const void*, std::size_t>>& sends,
                     std::size_t receive_bytes, const std::vector<std::uint64_t>& receive_counts,
                     const ElementType& type) {
  const auto n = static_cast<std::size_t>(team.size());
  if (sends.size() != n || receive_counts.size() != n) {
    return InvalidArgument("`sends` and `receive_counts` must have one entry per group rank (" + std::to_string(n) +
                           "), but got " + std::to_string(sends.size()) + " and " +
                           std::to_string(receive_counts.size()));
  }
  std::uint64_t total = 0;
  for (std::uint64_t c : receive_counts) total += c;
  if (total * type.bytes > receive_bytes) {
    return InvalidArgument("`sum(receive_counts)` must fit the receive buffer (" +
                           std::to_string(receive_bytes / type.bytes) + " elements), but got " + std::to_string(total));
  }
  for (std::size_t j = 0; j < n; ++j) {
    if (sends[j].second % type.bytes != 0) {
      return InvalidArgument("`sends[" + std::to_string(j) + "]` must hold whole " + type.name + " elements, but got " +
                             std::to_string(sends[j].second) + " bytes");
    }
  }
  return Status::Ok();
}

Status CheckPeer(const Team& team, int peer) {
  if (peer >= 0 && peer < team.size() && peer != team.me) return Status::Ok();
  return InvalidArgument("`peer` must be another group rank in [0, " + std::to_string(team.size()) +
                         ") than this one (" + std::to_string(team.me) + "), but got " + std::to_string(peer));
}
}  // namespace

Status Runtime::TeamBarrier(std::uint64_t team, StreamHandle stream, CallRole role) {
  HP_WITH_TEAM(team, "team_barrier", engine, stream, nullptr, role);
  return Record(engine.Barrier());
}

Status Runtime::AllGather(std::uint64_t team, void* output, std::size_t output_bytes, const void* input,
                          std::size_t input_bytes, const ElementType& type, StreamHandle stream, KeepAlive keep,
                          CallRole role) {
  HP_WITH_TEAM(team, "all_gather", engine, stream, std::move(keep), role);
  HP_REFUSE_IF_ERROR(engine, Collective::kAllGather,
                     CheckAllGather(*hp_found.value(), output, output_bytes, input, input_bytes));
  return Record(engine.AllGather(Resolve(output, output_bytes), Resolve(input, input_bytes), type));
}

Status Runtime::AllReduce(std::uint64_t team, void* tensor, std::size_t bytes, DataType dtype, ReduceOp op,
                          StreamHandle stream, KeepAlive keep, std::optional<ops::LowFormat> wire, const void* input,
                          CallRole role) {
  HP_WITH_TEAM(team, "all_reduce", engine, stream, std::move(keep), role);
  HP_REFUSE_IF_ERROR(engine, Collective::kAllReduce, CheckAllReduce(*device_, tensor, bytes, dtype, op, wire, input));
  const Buffer values = Resolve(input == nullptr ? tensor : input, bytes);
  if (wire.has_value()) {
    return Record(engine.AllReduceLowPrecision(Resolve(tensor, bytes), values, ReducibleType(dtype), op, *wire));
  }
  return Record(engine.AllReduce(Resolve(tensor, bytes), values, ReducibleType(dtype), op));
}

Status Runtime::ReduceScatter(std::uint64_t team, void* output, std::size_t output_bytes, const void* input,
                              std::size_t input_bytes, DataType dtype, ReduceOp op, StreamHandle stream,
                              KeepAlive keep, std::optional<ops::LowFormat> wire, CallRole role) {
  HP_WITH_TEAM(team, "reduce_scatter", engine, stream, std::move(keep), role);
  HP_REFUSE_IF_ERROR(engine, Collective::kReduceScatter,
                     CheckReduceScatter(*device_, *hp_found.value(), output, output_bytes, input, input_bytes, dtype,
                                        op, wire));
  if (wire.has_value()) {
    return Record(engine.ReduceScatterLowPrecision(Resolve(output, output_bytes), Resolve(input, input_bytes),
                                                   ReducibleType(dtype), op, *wire));
  }
  return Record(engine.ReduceScatter(Resolve(output, output_bytes), Resolve(input, input_bytes), ReducibleType(dtype), op));
}

Status Runtime::AllToAll(std::uint64_t team, const std::vector<std::pair<const void*, std::size_t>>& sends,
                         void* receive, std::size_t receive_bytes, const std::vector<std::uint64_t>& receive_counts,
                         const ElementType& type, StreamHandle stream, KeepAlive keep, CallRole role) {
  HP_WITH_TEAM(team, "all_to_all", engine, stream, std::move(keep), role);
  HP_REFUSE_IF_ERROR(engine, Collective::kAllToAll,
                     CheckAllToAll(*hp_found.value(), sends, receive_bytes, receive_counts, type));
  std::vector<Buffer> buffers;
  buffers.reserve(sends.size());
  for (const auto& send : sends) buffers.push_back(Buffer{const_cast<void*>(send.first), send.second, -1});
  return Record(engine.AllToAll(buffers, Resolve(receive, receive_bytes), receive_counts, type));
}

Status Runtime::Send(std::uint64_t team, const void* data, std::size_t bytes, const ElementType& type, int peer,
                     StreamHandle stream, KeepAlive keep) {
  HP_WITH_TEAM(team, "send", engine, stream, std::move(keep), CallRole::kForward);
  HP_RETURN_IF_ERROR(Record(CheckPeer(*hp_found.value(), peer)));
  return Record(engine.Send(Buffer{const_cast<void*>(data), bytes, -1}, peer, type));
}

Status Runtime::Recv(std::uint64_t team, void* data, std::size_t bytes, const ElementType& type, int peer,
                     StreamHandle stream, KeepAlive keep) {
  HP_WITH_TEAM(team, "recv", engine, stream, std::move(keep), CallRole::kForward);
  HP_RETURN_IF_ERROR(Record(CheckPeer(*hp_found.value(), peer)));
  return Record(engine.Recv(Buffer{data, bytes, -1}, peer, type));
}

Result<std::vector<std::vector<std::int64_t>>> Runtime::Agree(std::uint64_t team, const Fingerprint& fingerprint,
                                                              const std::vector<std::int64_t>& values,
                                                              StreamHandle stream) {
  HP_WITH_TEAM(team, "agree", engine, stream, nullptr, static_cast<CallRole>(fingerprint.role));
  const std::size_t limit =
      CollectiveEngine::AgreeCapacity(max_node_size_, hp_found.value()->size(), hp_found.value()->staging_bytes());
  if (values.size() > limit) {
    return Record(engine.Refuse(static_cast<Collective>(fingerprint.collective),
                                InvalidArgument("`values` must have at most " + std::to_string(limit) +
                                                " entries, but got " + std::to_string(values.size()))));
  }
  auto rows = engine.Agree(fingerprint, values);
  if (!rows.ok()) return Record(rows.status());
  return rows;
}

Status Runtime::Refuse(std::uint64_t team, Collective collective, const Status& refusal, StreamHandle stream,
                       CallRole role) {
  if (refusal.ok()) return Record(InvalidArgument("`refusal` must be a failure, but got OK"));
  HP_WITH_TEAM(team, "refuse", engine, stream, nullptr, role);
  return Record(engine.Refuse(collective, refusal));
}

Status Runtime::GiveUp(std::uint64_t team, const Status& why) {
  if (why.ok()) return Record(InvalidArgument("`why` must be a failure, but got OK"));
  HP_WITH_TEAM(team, "give_up", engine, kDefaultStream, nullptr, CallRole::kForward);
  return Record(engine.GiveUp(why));
}

#undef HP_REFUSE_IF_ERROR
#undef HP_WITH_TEAM

}  // namespace hp::shmem
