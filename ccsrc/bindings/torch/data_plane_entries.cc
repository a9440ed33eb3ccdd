#include "bindings/torch/data_plane_entries.h"

#include <torch/csrc/Dtype.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bindings/torch/allocations.h"
#include "bindings/torch/arguments.h"
#include "bindings/torch/call_support.h"
#include "bindings/torch/status_error.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace hp::shmem::torch_binding {
namespace {

SignalWidth WidthOf(const at::Tensor& signal) {
  return signal.element_size() == 8 ? SignalWidth::k64 : SignalWidth::k32;
}

at::Tensor EmptyTensor(const std::vector<std::int64_t>& sizes, py::object dtype, std::size_t alignment,
                       std::string call_site) {
  if (!THPDtype_Check(dtype.ptr())) {
    throw StatusError(TypeError("`dtype` must be a torch.dtype, but got " + std::string(py::str(py::type::of(dtype)))));
  }
  const c10::ScalarType scalar_type = reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
  py::gil_scoped_release nogil;
  return Empty(sizes, scalar_type, alignment, std::move(call_site));
}

void FreeTensor(py::handle tensor_arg, const std::string& call_site) {
  const at::Tensor& tensor = TensorArg(tensor_arg, "tensor");
  py::gil_scoped_release nogil;
  Free(tensor, call_site);
}

at::Tensor PeerTensorOf(py::handle tensor_arg, py::handle pe_arg) {
  const at::Tensor& tensor = StridedTensorArg(tensor_arg, "tensor");
  const int pe = PeArg(pe_arg);
  return PeerTensor(tensor, pe);
}

// put and get: the same arguments and checks, the data flowing one way or the other (`Transfer`: Runtime::Put, whose
// `dst` is symmetric, or Runtime::Get, whose `src` is).
template <auto Transfer>
void OneSided(py::handle dst_arg, py::handle src_arg, py::handle pe_arg, StreamHandle stream) {
  constexpr bool kPut = std::is_same_v<decltype(Transfer), decltype(&Runtime::Put)>;   // their signatures differ
  ProfiledRange range(kPut ? "hyper_parallel_shmem::put" : "hyper_parallel_shmem::get");
  const at::Tensor& dst = TensorArg(dst_arg, "dst");
  const at::Tensor& src = TensorArg(src_arg, "src");
  const int pe = PeArg(pe_arg);
  void* dst_ptr = DataPointer(dst, "dst");
  const void* src_ptr = DataPointer(src, "src");
  KeepAlive keep = Keep(stream, dst, src);
  py::gil_scoped_release nogil;
  ThrowIfError((R().*Transfer)(dst_ptr, src_ptr, ByteSize(dst), ByteSize(src), pe, OnStream(stream), std::move(keep)));
}

// The perf tool's floor (Runtime::RemoteTransportTransfer): `symmetric`'s bytes on `pe` written from `local` (`put`)
// or read into it, through the remote transport alone.
void RemoteTransportTransfer(bool put, py::handle symmetric_arg, py::handle local_arg, py::handle pe_arg) {
  const at::Tensor& symmetric = TensorArg(symmetric_arg, "symmetric");
  const at::Tensor& local = TensorArg(local_arg, "local");
  const int pe = PeArg(pe_arg);
  if (ByteSize(local) != ByteSize(symmetric)) {
    throw StatusError(InvalidArgument("`local` must have as many bytes as `symmetric` (" +
                                      std::to_string(ByteSize(symmetric)) + "), but got " +
                                      std::to_string(ByteSize(local))));
  }
  void* symmetric_ptr = DataPointer(symmetric, "symmetric");
  void* local_ptr = DataPointer(local, "local");
  py::gil_scoped_release nogil;
  ThrowIfError(R().RemoteTransportTransfer(put, symmetric_ptr, local_ptr, ByteSize(symmetric), pe));
}

// The phase across nodes of teams that span nodes (Runtime::ExchangeMessages): under `tag`, for each `(pe, send,
// receive)` of `exchanges`, `send`'s bytes to `pe` (None: nothing) and the next message from `pe` into `receive`
// (None: nothing), all posted at once. Returns, per exchange, `(received length, failure)`: failure is "" where it
// completed, else the message naming its PE. Bad input raises, with nothing posted.
py::list ExchangeMessages(std::uint64_t tag, py::sequence exchanges_arg) {
  std::vector<MessageExchange> exchanges(py::len(exchanges_arg));
  // An empty tensor's data pointer may be null, which the runtime reads as "no message": an empty message is sent
  // from, or received into, a byte of its own.
  char empty = 0;
  for (std::size_t i = 0; i < exchanges.size(); ++i) {
    const py::tuple entry = exchanges_arg[i].cast<py::tuple>();
    if (entry.size() != 3) {
      throw py::value_error("`exchanges` must hold (pe, send, receive) triples, but entry " + std::to_string(i) +
                            " has " + std::to_string(entry.size()) + " items");
    }
    MessageExchange& exchange = exchanges[i];
    exchange.pe = PeArg(entry[0]);
    if (!entry[1].is_none()) {
      const at::Tensor& tensor = CpuTensorArg(entry[1], "send");
      exchange.send_bytes = ByteSize(tensor);
      exchange.send = exchange.send_bytes > 0 ? tensor.data_ptr() : &empty;
    }
    if (!entry[2].is_none()) {
      const at::Tensor& tensor = CpuTensorArg(entry[2], "receive");
      exchange.receive_capacity = ByteSize(tensor);
      exchange.receive = exchange.receive_capacity > 0 ? tensor.data_ptr() : &empty;
    }
  }
  {
    py::gil_scoped_release nogil;
    ThrowIfError(R().ExchangeMessages(tag, exchanges.data(), exchanges.size()));
  }
  py::list outcomes;
  for (const MessageExchange& exchange : exchanges) {
    outcomes.append(py::make_tuple(exchange.received, exchange.status.ok() ? "" : exchange.status.message()));
  }
  return outcomes;
}

void Signal(py::handle signal_arg, py::handle value_arg, py::handle pe_arg, int op, StreamHandle stream) {
  HP_PROFILED_RANGE("signal");
  const at::Tensor& signal = TensorArg(signal_arg, "signal_tensor");
  const std::int64_t value = SignalValueArg(signal, value_arg);
  const int pe = PeArg(pe_arg);
  void* ptr = DataPointer(signal, "signal_tensor");
  py::gil_scoped_release nogil;
  ThrowIfError(R().Signal(ptr, WidthOf(signal), value, static_cast<SignalOp>(op), pe, OnStream(stream)));
}

// Runtime::PutWithSignal: put's arguments and checks, then signal's, as one operation.
void PutWithSignal(py::handle dst_arg, py::handle src_arg, py::handle signal_arg, py::handle value_arg,
                   py::handle pe_arg, int op, StreamHandle stream) {
  HP_PROFILED_RANGE("put_with_signal");
  const at::Tensor& dst = TensorArg(dst_arg, "dst");
  const at::Tensor& src = TensorArg(src_arg, "src");
  const at::Tensor& signal = TensorArg(signal_arg, "signal_tensor");
  const std::int64_t value = SignalValueArg(signal, value_arg);
  const int pe = PeArg(pe_arg);
  void* dst_ptr = DataPointer(dst, "dst");
  const void* src_ptr = DataPointer(src, "src");
  void* signal_ptr = DataPointer(signal, "signal_tensor");
  KeepAlive keep = Keep(stream, dst, src);
  py::gil_scoped_release nogil;
  ThrowIfError(R().PutWithSignal(dst_ptr, src_ptr, ByteSize(dst), ByteSize(src), signal_ptr, WidthOf(signal), value,
                                 static_cast<SignalOp>(op), pe, OnStream(stream), std::move(keep)));
}

void WaitSignal(py::handle signal_arg, py::handle value_arg, int cmp, StreamHandle stream) {
  HP_PROFILED_RANGE("wait_signal");
  const at::Tensor& signal = TensorArg(signal_arg, "signal_tensor");
  const std::int64_t value = SignalValueArg(signal, value_arg);
  void* ptr = DataPointer(signal, "signal_tensor");
  py::gil_scoped_release nogil;
  ThrowIfError(R().WaitSignal(ptr, WidthOf(signal), static_cast<CompareOp>(cmp), value, OnStream(stream)));
}

void Reduce(py::handle dst_arg, py::handle src_arg, int op, py::handle pes_arg, StreamHandle stream) {
  HP_PROFILED_RANGE("reduce");
  const at::Tensor& dst = TensorArg(dst_arg, "dst");
  const at::Tensor& src = TensorArg(src_arg, "src");
  const DataType dtype = ReduceDtypeArg(dst, src);
  const std::vector<int> pes = PesArg(pes_arg);
  void* dst_ptr = DataPointer(dst, "dst");
  const void* src_ptr = DataPointer(src, "src");
  KeepAlive keep = Keep(stream, dst, src);
  py::gil_scoped_release nogil;
  ThrowIfError(R().Reduce(dst_ptr, ByteSize(dst), src_ptr, ByteSize(src), dtype, static_cast<ReduceOp>(op), pes,
                          OnStream(stream), std::move(keep)));
}

void Barrier(StreamHandle stream) {
  HP_PROFILED_RANGE("barrier");
  py::gil_scoped_release nogil;
  ThrowIfError(R().Barrier(OnStream(stream)));
}

}  // namespace

void RegisterDataPlane(py::module_& m) {
  m.def("empty", &EmptyTensor, py::arg("sizes"), py::arg("dtype"), py::arg("alignment"), py::arg("call_site"));
  m.def("free", &FreeTensor, py::arg("tensor"), py::arg("call_site"));
  m.def("peer_tensor", &PeerTensorOf, py::arg("tensor"), py::arg("pe"));
  m.def("put", &OneSided<&Runtime::Put>, py::arg("dst"), py::arg("src"), py::arg("pe"), py::arg("stream"));
  m.def("get", &OneSided<&Runtime::Get>, py::arg("dst"), py::arg("src"), py::arg("pe"), py::arg("stream"));
  m.def("remote_transport_transfer", &RemoteTransportTransfer, py::arg("put"), py::arg("symmetric"), py::arg("local"),
        py::arg("pe"));
  m.def("exchange_messages", &ExchangeMessages, py::arg("tag"), py::arg("exchanges"));
  m.def("signal", &Signal, py::arg("signal"), py::arg("value"), py::arg("pe"), py::arg("op"), py::arg("stream"));
  m.def("put_with_signal", &PutWithSignal, py::arg("dst"), py::arg("src"), py::arg("signal"), py::arg("value"),
        py::arg("pe"), py::arg("op"), py::arg("stream"));
  m.def("wait_signal", &WaitSignal, py::arg("signal"), py::arg("value"), py::arg("cmp"), py::arg("stream"));
  m.def("reduce", &Reduce, py::arg("dst"), py::arg("src"), py::arg("op"), py::arg("pes"), py::arg("stream"));
  m.def("barrier", &Barrier, py::arg("stream"));
}

}  // namespace hp::shmem::torch_binding
