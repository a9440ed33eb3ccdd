#include "bindings/torch/team_entries.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings/torch/allocations.h"
#include "bindings/torch/arguments.h"
#include "bindings/torch/call_support.h"
#include "bindings/torch/fast_call.h"
#include "bindings/torch/py_bootstrap.h"
#include "bindings/torch/status_error.h"
#include "runtime/numberings.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace hp::shmem::torch_binding {
namespace {

// Whether a call on these arguments may skip torch's dispatcher: plain tensors (no subclass), nothing that autograd
// would record, no dispatch mode (a fake-tensor mode) and no functorch transform active. The one check the
// collectives' fast path makes on every eager call, in C++ because in Python it costs a sizeable part of a small
// call (docs/perf.md, "Figures behind the code's constants").
bool PlainEager(PyObject* const* arguments, Py_ssize_t count) {
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) return false;
  const c10::DispatchKeySet included = c10::impl::tls_local_dispatch_key_set().included_;
  if (included.has(c10::DispatchKey::FuncTorchDynamicLayerFrontMode) ||
      included.has(c10::DispatchKey::FuncTorchDynamicLayerBackMode)) {
    return false;
  }
  const bool grad = at::GradMode::is_enabled();
  for (Py_ssize_t i = 0; i < count; ++i) {
    if (!THPVariable_CheckExact(arguments[i])) return false;
    if (grad && THPVariable_Unpack(arguments[i]).requires_grad()) return false;
  }
  return true;
}

PyObject* PlainEagerEntry(PyObject* /*module*/, PyObject* const* arguments, Py_ssize_t count) {
  if (PlainEager(arguments, count)) Py_RETURN_TRUE;
  Py_RETURN_FALSE;
}

// A tensor's element type as the engine names it in fingerprints ("float32"). The name is Python's, asked once
// per dtype (the GIL guards the cache): the collectives call this on every call.
ElementType ElementTypeOf(const at::Tensor& tensor) {
  static auto* names = new std::map<at::ScalarType, std::string>();   // never destroyed, as ErrorClasses
  const at::ScalarType scalar_type = tensor.scalar_type();
  auto it = names->find(scalar_type);
  if (it == names->end()) {
    std::string name = DtypeName(scalar_type);
    if (name.rfind("torch.", 0) == 0) name = name.substr(6);
    it = names->emplace(scalar_type, std::move(name)).first;
  }
  ElementType type;
  type.name = it->second;
  type.bytes = static_cast<std::size_t>(tensor.element_size());
  return type;
}

// `serves` (a node team's whole team, Runtime::CreateTeam): None or empty for any other team.
std::uint64_t TeamCreate(py::handle pes_arg, int group_rank, py::object all_gather, py::object barrier,
                         py::handle serves_arg) {
  const std::vector<int> pes = PesArg(pes_arg);
  const std::vector<int> serves = serves_arg.is_none() ? std::vector<int>{} : PesArg(serves_arg, "serves");
  PyBootstrap bootstrap(group_rank, static_cast<int>(pes.size()), std::move(all_gather), std::move(barrier));
  Result<std::uint64_t> team = StateError("team was not created");
  {
    py::gil_scoped_release nogil;   // the bootstrap takes the GIL back for each exchange
    team = R().CreateTeam(pes, bootstrap, serves);
  }
  return ValueOrThrow(std::move(team));
}

py::tuple TeamDescribe(std::uint64_t team) {
  const TeamView view = ValueOrThrow(R().DescribeTeam(team));
  return py::make_tuple(view.pes, view.me, view.slot, view.staging_bytes);
}

// What a call is for (the runtime's call_roles numbering).
CallRole RoleArg(int role) { return ValueOrThrow(CallRoleFromNumber(role)); }

// Resolves a collective's arguments with `resolve`; a check that fails there (a freed tensor, a bad dtype) is refused
// collectively: this rank still enters the call's first sync, so that every member fails with the same error naming
// this rank, instead of leaving them waiting for a call that will not come.
template <typename Resolve>
auto Collectively(std::uint64_t team, Collective collective, StreamHandle stream, CallRole role, Resolve&& resolve) {
  try {
    return resolve();
  } catch (const StatusError& e) {
    Status refused;
    {
      py::gil_scoped_release nogil;
      refused = R().Refuse(team, collective, e.status(), OnStream(stream), role);
    }
    // No team to refuse through (no runtime, a released team): nobody waits for this call; the error is this rank's.
    const bool reported = refused.code() == e.status().code() && refused.message().rfind(e.status().message(), 0) == 0;
    throw StatusError(reported ? std::move(refused) : e.status());
  }
}

void TeamBarrier(std::uint64_t team, StreamHandle stream, int role) {
  HP_PROFILED_RANGE("barrier");
  const CallRole call_role = RoleArg(role);
  py::gil_scoped_release nogil;
  ThrowIfError(R().TeamBarrier(team, OnStream(stream), call_role));
}

void TeamAllGather(std::uint64_t team, py::handle output_arg, py::handle input_arg, StreamHandle stream, int role) {
  HP_PROFILED_RANGE("all_gather");
  const CallRole call_role = RoleArg(role);
  struct Args {
    ElementType type;
    void* out;
    std::size_t out_bytes;
    const void* in;
    std::size_t in_bytes;
    KeepAlive keep;
  };
  Args a = Collectively(team, Collective::kAllGather, stream, call_role, [&] {
    const at::Tensor& output = TensorArg(output_arg, "output");
    const at::Tensor& input = TensorArg(input_arg, "input");
    return Args{ElementTypeOf(input), DataPointer(output, "output"), ByteSize(output), DataPointer(input, "input"),
                ByteSize(input), Keep(stream, output, input)};
  });
  py::gil_scoped_release nogil;
  ThrowIfError(R().AllGather(team, a.out, a.out_bytes, a.in, a.in_bytes, a.type, OnStream(stream), std::move(a.keep),
                             call_role));
}

// A wire format (the runtime's wire_formats numbering, as fingerprints carry it).
std::optional<ops::LowFormat> WireArg(int wire) { return ValueOrThrow(WireFromNumber(wire)); }

// `input_arg`: None (in place) or the tensor whose values are reduced into `tensor`.
void TeamAllReduce(std::uint64_t team, py::handle tensor_arg, py::handle input_arg, int op, StreamHandle stream,
                   int wire, int role) {
  HP_PROFILED_RANGE("all_reduce");
  const CallRole call_role = RoleArg(role);
  struct Args {
    DataType dtype;
    std::optional<ops::LowFormat> format;
    void* ptr;
    std::size_t bytes;
    const void* in;
    KeepAlive keep;
  };
  Args a = Collectively(team, Collective::kAllReduce, stream, call_role, [&] {
    const at::Tensor& tensor = TensorArg(tensor_arg, "tensor");
    Args args{ReduceDtypeArg(tensor, tensor), WireArg(wire), DataPointer(tensor, "tensor"), ByteSize(tensor), nullptr,
              nullptr};
    if (input_arg.is_none()) {
      args.keep = Keep(stream, tensor);
      return args;
    }
    const at::Tensor& input = TensorArg(input_arg, "input");
    if (input.scalar_type() != tensor.scalar_type()) {
      throw StatusError(TypeError("`input` must have the dtype of `tensor` (" + DtypeName(tensor.scalar_type()) +
                                  "), but got " + DtypeName(input.scalar_type())));
    }
    if (ByteSize(input) != ByteSize(tensor)) {
      throw StatusError(InvalidArgument("`input` must have the " + std::to_string(ByteSize(tensor)) +
                                        " bytes of `tensor`, but got " + std::to_string(ByteSize(input))));
    }
    args.in = DataPointer(input, "input");
    args.keep = Keep(stream, tensor, input);
    return args;
  });
  py::gil_scoped_release nogil;
  ThrowIfError(R().AllReduce(team, a.ptr, a.bytes, a.dtype, static_cast<ReduceOp>(op), OnStream(stream),
                             std::move(a.keep), a.format, a.in, call_role));
}

void TeamReduceScatter(std::uint64_t team, py::handle output_arg, py::handle input_arg, int op, StreamHandle stream,
                       int wire, int role) {
  HP_PROFILED_RANGE("reduce_scatter");
  const CallRole call_role = RoleArg(role);
  struct Args {
    DataType dtype;
    std::optional<ops::LowFormat> format;
    void* out;
    std::size_t out_bytes;
    const void* in;
    std::size_t in_bytes;
    KeepAlive keep;
  };
  Args a = Collectively(team, Collective::kReduceScatter, stream, call_role, [&] {
    const at::Tensor& output = TensorArg(output_arg, "output");
    const at::Tensor& input = TensorArg(input_arg, "input");
    return Args{ReduceDtypeArg(output, input), WireArg(wire), DataPointer(output, "output"), ByteSize(output),
                DataPointer(input, "input"), ByteSize(input), Keep(stream, output, input)};
  });
  py::gil_scoped_release nogil;
  ThrowIfError(R().ReduceScatter(team, a.out, a.out_bytes, a.in, a.in_bytes, a.dtype, static_cast<ReduceOp>(op),
                                 OnStream(stream), std::move(a.keep), a.format, call_role));
}

// "sends[j]", the name of a sequence's item in messages.
std::string IndexedName(const char* name, std::size_t index) {
  return std::string(name) + "[" + std::to_string(index) + "]";
}

void TeamAllToAll(std::uint64_t team, py::handle send_args, py::handle receive_arg, py::handle receive_counts_arg,
                  StreamHandle stream, int role) {
  HP_PROFILED_RANGE("all_to_all");
  const CallRole call_role = RoleArg(role);
  struct Args {
    ElementType type;
    std::vector<std::pair<const void*, std::size_t>> views;
    std::vector<std::uint64_t> receive_counts;
    void* out;
    std::size_t out_bytes;
    KeepAlive keep;
  };
  Args a = Collectively(team, Collective::kAllToAll, stream, call_role, [&] {
    const at::Tensor& receive = TensorArg(receive_arg, "receive");
    Args args{ElementTypeOf(receive), {}, {}, nullptr, ByteSize(receive), nullptr};
    if (!PyList_Check(send_args.ptr()) && !PyTuple_Check(send_args.ptr())) {
      throw StatusError(TypeError("`sends` must be a list or tuple of tensors, but got " + PyTypeName(send_args)));
    }
    if (!PyList_Check(receive_counts_arg.ptr()) && !PyTuple_Check(receive_counts_arg.ptr())) {
      throw StatusError(TypeError("`receive_counts` must be a list or tuple of ints, but got " +
                                  PyTypeName(receive_counts_arg)));
    }
    const auto nsends = static_cast<std::size_t>(PySequence_Fast_GET_SIZE(send_args.ptr()));
    PyObject** send_items = PySequence_Fast_ITEMS(send_args.ptr());
    args.views.reserve(nsends);
    for (std::size_t j = 0; j < nsends; ++j) {
      const std::string name = IndexedName("sends", j);   // short: no allocation
      const at::Tensor& send = TensorArg(send_items[j], name.c_str());
      args.views.emplace_back(DataPointer(send, name.c_str()), ByteSize(send));
    }
    const auto ncounts = static_cast<std::size_t>(PySequence_Fast_GET_SIZE(receive_counts_arg.ptr()));
    PyObject** count_items = PySequence_Fast_ITEMS(receive_counts_arg.ptr());
    args.receive_counts.resize(ncounts);
    for (std::size_t i = 0; i < ncounts; ++i) {
      int overflow = 0;
      const long long count =
          PyLong_CheckExact(count_items[i]) ? PyLong_AsLongLongAndOverflow(count_items[i], &overflow) : -1;
      args.receive_counts[i] = static_cast<std::uint64_t>(
          count >= 0 && overflow == 0 ? count
                                      : IntArg(count_items[i], IndexedName("receive_counts", i).c_str(), 0,
                                               std::numeric_limits<std::int64_t>::max(), "[0, 9223372036854775807]"));
    }
    args.out = DataPointer(receive, "receive");
    if (stream != kDefaultStream) {   // the sends and the receive buffer live until the stream ran the call
      std::vector<at::Tensor> held{receive};
      for (std::size_t j = 0; j < nsends; ++j) held.push_back(THPVariable_Unpack(send_items[j]));
      args.keep = std::make_shared<const std::vector<at::Tensor>>(std::move(held));
    }
    return args;
  });
  py::gil_scoped_release nogil;
  ThrowIfError(R().AllToAll(team, a.views, a.out, a.out_bytes, a.receive_counts, a.type, OnStream(stream),
                            std::move(a.keep), call_role));
}

// MoE dispatch (`direction` 0) or combine (1): rows of `input` (dim 0) to the members' experts, `out_splits_offsets`
// (2 x n*experts int64) receiving the layout (runtime/collectives/moe.h). `in_offsets_arg`: None (the chunks are
// packed in split order) or the n*experts int64 first rows of the chunks.
void TeamMoeExchange(std::uint64_t team, int direction, py::handle input_arg, py::handle output_arg,
                     py::handle in_splits_arg, py::handle in_offsets_arg, py::handle out_splits_offsets_arg,
                     int experts, std::int64_t major_align, StreamHandle stream, int role) {
  HP_PROFILED_RANGE("moe_exchange");
  const CallRole call_role = RoleArg(role);
  const bool combine = direction == 1;
  struct Args {
    MoeExchangeArgs x;
    KeepAlive keep;
  };
  Args a = Collectively(team, combine ? Collective::kMoeCombine : Collective::kMoeDispatch, stream, call_role, [&] {
    if (direction != 0 && direction != 1) {
      throw StatusError(InvalidArgument("`direction` must be 0 (dispatch) or 1 (combine), but got " +
                                        std::to_string(direction)));
    }
    const at::Tensor& input = TensorArg(input_arg, "input");
    const at::Tensor& output = TensorArg(output_arg, "output");
    const at::Tensor& in_splits = TensorArg(in_splits_arg, "in_splits");
    const at::Tensor& table = TensorArg(out_splits_offsets_arg, "out_splits_offsets");
    auto row_numel = [](const at::Tensor& t) { return c10::multiply_integers(t.sizes().slice(1)); };
    if (input.dim() < 1 || output.dim() < 1 || input.scalar_type() != output.scalar_type() ||
        row_numel(input) != row_numel(output)) {
      throw StatusError(InvalidArgument("`output` must have the dtype and row size of `input` (rows along dim 0), "
                                        "but got input " + DtypeName(input.scalar_type()) + IntList(input.sizes()) +
                                        " and output " + DtypeName(output.scalar_type()) + IntList(output.sizes())));
    }
    const TeamView view = ValueOrThrow(R().DescribeTeam(team));
    const auto nsplits = static_cast<std::int64_t>(view.pes.size()) * experts;
    auto check_table = [&](const at::Tensor& t, const char* name, std::int64_t numel) {
      if (t.scalar_type() != at::kLong || t.numel() != numel) {
        throw StatusError(InvalidArgument(std::string("`") + name + "` must be " + std::to_string(numel) +
                                          " int64 values (group size x experts), but got " +
                                          DtypeName(t.scalar_type()) + IntList(t.sizes())));
      }
    };
    check_table(in_splits, "in_splits", nsplits);
    check_table(table, "out_splits_offsets", 2 * nsplits);
    Args args;
    args.x.op = combine ? "moe_combine" : "moe_dispatch";
    args.x.team = team;
    args.x.direction = combine ? MoeDirection::kCombine : MoeDirection::kDispatch;
    args.x.experts = experts;
    args.x.input = DataPointer(input, "input");
    args.x.input_rows = input.size(0);
    args.x.output = DataPointer(output, "output");
    args.x.output_rows = output.size(0);
    args.x.row_bytes = static_cast<std::size_t>(row_numel(input)) * static_cast<std::size_t>(input.element_size());
    args.x.in_splits = static_cast<const std::int64_t*>(DataPointer(in_splits, "in_splits"));
    if (!in_offsets_arg.is_none()) {
      const at::Tensor& in_offsets = TensorArg(in_offsets_arg, "in_offsets");
      check_table(in_offsets, "in_offsets", nsplits);
      args.x.in_offsets = static_cast<const std::int64_t*>(DataPointer(in_offsets, "in_offsets"));
    }
    args.x.major_align = major_align;
    args.x.out_splits = static_cast<std::int64_t*>(DataPointer(table, "out_splits_offsets"));
    args.x.out_offsets = args.x.out_splits + nsplits;
    args.x.role = call_role;
    args.keep = Keep(stream, input, output, in_splits, table);
    return args;
  });
  py::gil_scoped_release nogil;
  ThrowIfError(R().MoeExchange(a.x, OnStream(stream), std::move(a.keep)));
}

void TeamSend(std::uint64_t team, py::handle tensor_arg, int peer, StreamHandle stream) {
  HP_PROFILED_RANGE("send");
  const at::Tensor& tensor = TensorArg(tensor_arg, "tensor");
  const ElementType type = ElementTypeOf(tensor);
  const void* ptr = DataPointer(tensor, "tensor");
  KeepAlive keep = Keep(stream, tensor);
  py::gil_scoped_release nogil;
  ThrowIfError(R().Send(team, ptr, ByteSize(tensor), type, peer, OnStream(stream), std::move(keep)));
}

void TeamRecv(std::uint64_t team, py::handle tensor_arg, int peer, StreamHandle stream) {
  HP_PROFILED_RANGE("recv");
  const at::Tensor& tensor = TensorArg(tensor_arg, "tensor");
  const ElementType type = ElementTypeOf(tensor);
  void* ptr = DataPointer(tensor, "tensor");
  KeepAlive keep = Keep(stream, tensor);
  py::gil_scoped_release nogil;
  ThrowIfError(R().Recv(team, ptr, ByteSize(tensor), type, peer, OnStream(stream), std::move(keep)));
}

std::vector<std::vector<std::int64_t>> TeamAgree(std::uint64_t team, int collective, const std::string& dtype,
                                                 std::uint64_t element_bytes, std::uint64_t count, int reduce_op,
                                                 int wire, int peer, const std::vector<std::int64_t>& values,
                                                 StreamHandle stream, int role) {
  const Fingerprint fingerprint =
      CallFingerprint(static_cast<std::uint32_t>(collective), static_cast<std::uint32_t>(reduce_op),
                      static_cast<std::uint32_t>(wire), peer, count, element_bytes, dtype, RoleArg(role));
  Result<std::vector<std::vector<std::int64_t>>> rows = StateError("agree did not run");
  {
    py::gil_scoped_release nogil;
    rows = R().Agree(team, fingerprint, values, OnStream(stream));
  }
  return ValueOrThrow(std::move(rows));
}

// MoE across nodes (the phases of core/multicore/hierarchy.py): what this rank publishes of its call, and its layout
// from every member's published row, as the engine's exchange computes them (collectives/moe.h).
std::vector<std::int64_t> MoeRow(int direction, int experts, int members, const std::vector<std::int64_t>& in_splits,
                                 const std::optional<std::vector<std::int64_t>>& in_offsets, std::int64_t input_rows,
                                 std::int64_t output_rows) {
  const MoeExchangeArgs x = ValueOrThrow(MoeStepArgs(direction, experts, 0, input_rows, output_rows));
  const auto nsplits = static_cast<std::size_t>(std::max(members, 0)) * static_cast<std::size_t>(experts);
  if (members < 1 || in_splits.size() != nsplits || (in_offsets && in_offsets->size() != nsplits)) {
    throw StatusError(InvalidArgument("`in_splits` and `in_offsets` must hold members x experts = " +
                                      std::to_string(nsplits) + " values, but got " +
                                      std::to_string(in_splits.size()) + " and " +
                                      (in_offsets ? std::to_string(in_offsets->size()) : std::string("none"))));
  }
  return MoePublishedRow(x, members, in_splits.data(), in_offsets ? in_offsets->data() : nullptr, -1);
}

py::tuple MoePlan(int direction, int experts, std::int64_t major_align,
                  const std::vector<std::vector<std::int64_t>>& rows, int me) {
  const MoeExchangeArgs x = ValueOrThrow(MoeStepArgs(direction, experts, major_align, 0, 0));
  const MoeLayout layout = ValueOrThrow(PlanMoeExchange(x, rows, me));
  return py::make_tuple(layout.splits, layout.offsets, layout.from);
}

// A refusal of the call `collective` that the Python side decided (a destroyed group, a freed tensor): raised on
// every member, naming this rank. `code`: a status code of status_codes().
void TeamRefuse(std::uint64_t team, int collective, int code, const std::string& message, StreamHandle stream,
                int role) {
  const CallRole call_role = RoleArg(role);
  if (code <= 0 || code > static_cast<int>(StatusCode::kInterrupted)) {
    throw StatusError(InvalidArgument("`code` must be a failure code of status_codes(), but got " + std::to_string(code)));
  }
  Status refused;
  {
    py::gil_scoped_release nogil;
    refused = R().Refuse(team, static_cast<Collective>(collective), Status(static_cast<StatusCode>(code), message),
                         OnStream(stream), call_role);
  }
  ThrowIfError(std::move(refused));
}

// This rank gives up the team's next sync (a failure of its own across nodes): members waiting there fail with
// `message`. Raises nothing itself.
void TeamGiveUp(std::uint64_t team, const std::string& message) {
  py::gil_scoped_release nogil;
  (void)R().GiveUp(team, StateError(message));
}

constexpr const char* kAllGatherArgs[] = {"team", "output", "input", "stream", "role"};
constexpr const char* kAllToAllArgs[] = {"team", "sends", "receive", "receive_counts", "stream", "role"};
constexpr const char* kPointToPointArgs[] = {"team", "tensor", "peer", "stream"};
constexpr const char* kAllReduceArgs[] = {"team", "tensor", "input", "op", "stream", "wire", "role"};
constexpr const char* kReduceScatterArgs[] = {"team", "output", "input", "op", "stream", "wire", "role"};

}  // namespace

void RegisterTeams(py::module_& m) {
  AddFastFunction(m, "plain_eager", &PlainEagerEntry,
                  "plain_eager(*tensors): whether a call on them may skip torch's dispatcher");
  m.def("team_create", &TeamCreate, py::arg("pes"), py::arg("group_rank"), py::arg("all_gather"), py::arg("barrier"),
        py::arg("serves") = py::none());
  m.def("team_release", [](std::uint64_t team) { ThrowIfError(R().ReleaseTeam(team)); }, py::arg("team"));
  m.def("team_describe", &TeamDescribe, py::arg("team"));
  m.def("team_barrier", &TeamBarrier, py::arg("team"), py::arg("stream"), py::arg("role") = 0);
  AddFastFunction(m, "all_gather", &FastEntry<&TeamAllGather, kAllGatherArgs, 1>,
                  "all_gather(team, output, input, stream, role=0)");
  AddFastFunction(m, "all_reduce", &FastEntry<&TeamAllReduce, kAllReduceArgs, 1>,
                  "all_reduce(team, tensor, input, op, stream, wire, role=0)");
  AddFastFunction(m, "reduce_scatter", &FastEntry<&TeamReduceScatter, kReduceScatterArgs, 1>,
                  "reduce_scatter(team, output, input, op, stream, wire, role=0)");
  AddFastFunction(m, "all_to_all", &FastEntry<&TeamAllToAll, kAllToAllArgs, 1>,
                  "all_to_all(team, sends, receive, receive_counts, stream, role=0)");
  AddFastFunction(m, "send", &FastEntry<&TeamSend, kPointToPointArgs>, "send(team, tensor, peer, stream)");
  AddFastFunction(m, "recv", &FastEntry<&TeamRecv, kPointToPointArgs>, "recv(team, tensor, peer, stream)");
  m.def("moe_exchange", &TeamMoeExchange, py::arg("team"), py::arg("direction"), py::arg("input"), py::arg("output"),
        py::arg("in_splits"), py::arg("in_offsets"), py::arg("out_splits_offsets"), py::arg("experts"),
        py::arg("major_align"), py::arg("stream"), py::arg("role") = 0);
  m.def("agree", &TeamAgree, py::arg("team"), py::arg("collective"), py::arg("dtype"), py::arg("element_bytes"),
        py::arg("count"),
        py::arg("reduce_op"), py::arg("wire"), py::arg("peer"), py::arg("values"), py::arg("stream"), py::arg("role") = 0);
  m.def("refuse", &TeamRefuse, py::arg("team"), py::arg("collective"), py::arg("code"), py::arg("message"),
        py::arg("stream"), py::arg("role") = 0);
  m.def("give_up", &TeamGiveUp, py::arg("team"), py::arg("message"));
  m.def("moe_row", &MoeRow, py::arg("direction"), py::arg("experts"), py::arg("members"), py::arg("in_splits"),
        py::arg("in_offsets"), py::arg("input_rows"), py::arg("output_rows"));
  m.def("moe_plan", &MoePlan, py::arg("direction"), py::arg("experts"), py::arg("major_align"), py::arg("rows"),
        py::arg("me"));
}

}  // namespace hp::shmem::torch_binding
