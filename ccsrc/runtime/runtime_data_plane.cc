// The Runtime's one-sided data plane: put, get, signal, wait, reduce, peer addresses, MoE's row codec and the node
// barrier, each checked, then handed to the device (runtime.h).
#include "runtime/runtime.h"

#include <algorithm>
#include <utility>

#include "ops/wire_format.h"
#include "runtime/logging.h"
#include "runtime/transfer.h"

namespace hp::shmem {

namespace {
Status CheckSameBytes(std::size_t dst_bytes, std::size_t src_bytes) {
  if (src_bytes == dst_bytes) return Status::Ok();
  return InvalidArgument("`src` must have as many bytes as `dst` (" + std::to_string(dst_bytes) + "), but got " +
                         std::to_string(src_bytes));
}

// The MoE row codec's arguments: values that may travel in `format`, and memory wherever there are values.
Status CheckRowCodec(ops::LowFormat format, DataType dtype, const void* wide, const char* wide_name,
                     const void* wire, const char* wire_name, std::size_t rows) {
  if (!ops::IsLowFormat(static_cast<int>(format))) {
    return InvalidArgument("`format` must be a wire format, but got " + std::to_string(static_cast<int>(format)));
  }
  if (*ops::LowFormatRefusal(format, dtype, ReduceOp::kSum) != '\0') {
    return InvalidArgument(std::string("`dtype` must be a floating-point dtype wider than ") +
                           ops::LowFormatName(format) + ", but got " + DataTypeName(dtype));
  }
  if (rows == 0) return Status::Ok();
  for (const auto& [pointer, name] : {std::pair{wide, wide_name}, std::pair{wire, wire_name}}) {
    if (pointer == nullptr) {
      return InvalidArgument(std::string("`") + name + "` must be memory of " + std::to_string(rows) +
                             " rows, but got a null pointer");
    }
  }
  return Status::Ok();
}
}  // namespace

Status Runtime::TransferChunks(std::size_t bytes, const std::function<Status(std::size_t, std::size_t)>& fn) {
  return ForEachChunk(bytes, device_->max_transfer_bytes(), [&](const Chunk& chunk) { return fn(chunk.offset, chunk.bytes); });
}

Status Runtime::CheckTransfer(const char* op, int pe, std::size_t dst_bytes, std::size_t src_bytes,
                              const void* symmetric, const char* symmetric_name) const {
  HP_RETURN_IF_ERROR(RequireInitialized(op));
  HP_RETURN_IF_ERROR(CheckPe(pe, "pe"));
  HP_RETURN_IF_ERROR(CheckOnNode(pe, op, /*remote_ok=*/true));
  HP_RETURN_IF_ERROR(CheckSameBytes(dst_bytes, src_bytes));
  return ResolveSymmetric(symmetric, dst_bytes, symmetric_name).status();
}

Status Runtime::CheckSignal(const void* symmetric_signal, SignalWidth width) const {
  const auto bytes = static_cast<std::size_t>(width);
  HP_RETURN_IF_ERROR(ResolveSymmetric(symmetric_signal, bytes, "signal_tensor").status());
  if (reinterpret_cast<std::uintptr_t>(symmetric_signal) % bytes != 0) {   // atomics and futexes need it
    return InvalidArgument("`signal_tensor` must be aligned to " + std::to_string(bytes) + " bytes, but got address " +
                           Hex(reinterpret_cast<std::uintptr_t>(symmetric_signal)));
  }
  return Status::Ok();
}

Status Runtime::Put(const void* symmetric_dst, const void* src, std::size_t dst_bytes, std::size_t src_bytes, int pe,
                    StreamHandle stream, KeepAlive keep) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(CheckTransfer("put", pe, dst_bytes, src_bytes, symmetric_dst, "dst")));
  auto* to = static_cast<char*>(const_cast<void*>(symmetric_dst));
  const auto* from = static_cast<const char*>(src);
  return Record(TransferChunks(dst_bytes, [&](std::size_t offset, std::size_t n) {
    return device_->Put(to + offset, from + offset, n, pe, stream, keep);
  }));
}

Status Runtime::Get(void* dst, const void* symmetric_src, std::size_t dst_bytes, std::size_t src_bytes, int pe,
                    StreamHandle stream, KeepAlive keep) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(CheckTransfer("get", pe, dst_bytes, src_bytes, symmetric_src, "src")));
  auto* to = static_cast<char*>(dst);
  const auto* from = static_cast<const char*>(symmetric_src);
  return Record(TransferChunks(dst_bytes, [&](std::size_t offset, std::size_t n) {
    return device_->Get(to + offset, from + offset, n, pe, stream, keep);
  }));
}

Status Runtime::RemoteTransportTransfer(bool put, void* symmetric, void* local, std::size_t bytes, int pe) {
  OperationScope scope(*this);
  const char* op = put ? "remote_transport_put" : "remote_transport_get";
  HP_RETURN_IF_ERROR(RequireInitialized(op));
  HP_RETURN_IF_ERROR(CheckPe(pe, "pe"));
  HP_RETURN_IF_ERROR(CheckInOwnHeap(*device_, symmetric, bytes, "symmetric"));
  return device_->RemoteTransportTransfer(put, symmetric, local, bytes, pe);
}

Status Runtime::ExchangeMessages(std::uint64_t tag, MessageExchange* exchanges, std::size_t count) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(RequireInitialized("exchange_messages"));
  for (std::size_t i = 0; i < count; ++i) HP_RETURN_IF_ERROR(CheckPe(exchanges[i].pe, "pe"));
  return device_->ExchangeMessages(tag, exchanges, count);
}

Status Runtime::Signal(const void* symmetric_signal, SignalWidth width, std::int64_t value, SignalOp op, int pe,
                       StreamHandle stream) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("signal")));
  HP_RETURN_IF_ERROR(Record(CheckPe(pe, "pe")));
  HP_RETURN_IF_ERROR(Record(CheckOnNode(pe, "signal", /*remote_ok=*/device_->signals_remotely(op))));
  HP_RETURN_IF_ERROR(Record(CheckSignal(symmetric_signal, width)));
  return Record(device_->Signal(const_cast<void*>(symmetric_signal), width, value, op, pe, stream));
}

Status Runtime::PutWithSignal(const void* symmetric_dst, const void* src, std::size_t dst_bytes, std::size_t src_bytes,
                              const void* symmetric_signal, SignalWidth width, std::int64_t value, SignalOp op, int pe,
                              StreamHandle stream, KeepAlive keep) {
  OperationScope scope(*this);
  // Put's checks, then Signal's, all before anything is written.
  HP_RETURN_IF_ERROR(Record(CheckTransfer("put_with_signal", pe, dst_bytes, src_bytes, symmetric_dst, "dst")));
  HP_RETURN_IF_ERROR(Record(CheckOnNode(pe, "put_with_signal", /*remote_ok=*/device_->signals_remotely(op))));
  HP_RETURN_IF_ERROR(Record(CheckSignal(symmetric_signal, width)));
  auto* to = static_cast<char*>(const_cast<void*>(symmetric_dst));
  const auto* from = static_cast<const char*>(src);
  // Every chunk but the last is a Put; the last carries the signal (zero bytes: the signal alone).
  const std::size_t max_chunk = device_->max_transfer_bytes();
  const std::size_t head = max_chunk == 0 || dst_bytes <= max_chunk ? 0 : (dst_bytes - 1) / max_chunk * max_chunk;
  HP_RETURN_IF_ERROR(Record(TransferChunks(head, [&](std::size_t offset, std::size_t n) {
    return device_->Put(to + offset, from + offset, n, pe, stream, keep);
  })));
  return Record(device_->PutWithSignal(to + head, from + head, dst_bytes - head, const_cast<void*>(symmetric_signal),
                                       width, value, op, pe, stream, std::move(keep)));
}

Status Runtime::WaitSignal(const void* symmetric_signal, SignalWidth width, CompareOp cmp, std::int64_t value,
                           StreamHandle stream) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("wait_signal")));
  HP_RETURN_IF_ERROR(Record(CheckSignal(symmetric_signal, width)));
  return Record(device_->WaitSignal(const_cast<void*>(symmetric_signal), width, cmp, value, stream));
}

Status Runtime::CheckReduce(const void* dst, std::size_t dst_bytes, const void* symmetric_src, std::size_t src_bytes,
                            DataType dtype, ReduceOp op, const std::vector<int>& pes) const {
  HP_RETURN_IF_ERROR(RequireInitialized("reduce"));
  if (pes.empty()) return InvalidArgument("`pes` must name at least one pe, but got none");
  for (std::size_t i = 0; i < pes.size(); ++i) {
    if (!CheckPe(pes[i], "pes").ok()) return CheckPe(pes[i], ("pes[" + std::to_string(i) + "]").c_str());
    HP_RETURN_IF_ERROR(CheckOnNode(pes[i], "reduce"));
    for (std::size_t j = 0; j < i; ++j) {
      if (pes[j] == pes[i]) {
        return InvalidArgument("`pes` must be distinct, but got " + std::to_string(pes[i]) + " at positions " +
                               std::to_string(j) + " and " + std::to_string(i));
      }
    }
  }
  HP_RETURN_IF_ERROR(CheckSameBytes(dst_bytes, src_bytes));
  const std::size_t element = DataTypeSize(dtype);
  if (src_bytes % element != 0) {
    return InvalidArgument(std::string("`src` must hold whole ") + DataTypeName(dtype) + " elements (" +
                           std::to_string(element) + " bytes each), but got " + std::to_string(src_bytes) + " bytes");
  }
  if (op == ReduceOp::kAvg && !IsFloatingPoint(dtype)) {
    return InvalidArgument(std::string("`op` must be sum, max or min for ") + DataTypeName(dtype) + ", but got avg");
  }
  HP_RETURN_IF_ERROR(ResolveSymmetric(symmetric_src, src_bytes, "src").status());
  const auto to = reinterpret_cast<std::uintptr_t>(dst);
  const auto from = reinterpret_cast<std::uintptr_t>(symmetric_src);
  if (to != from && to < from + src_bytes && from < to + dst_bytes) {
    // In place works because a block of dst is written after its sources are read; a shifted dst would read
    // what it has already written.
    return InvalidArgument("`dst` must be `src` itself or not overlap it, but got bytes [" + Hex(to) + "," +
                           Hex(to + dst_bytes) + ") against src [" + Hex(from) + "," + Hex(from + src_bytes) + ")");
  }
  return Status::Ok();
}

Status Runtime::Reduce(void* dst, std::size_t dst_bytes, const void* symmetric_src, std::size_t src_bytes,
                       DataType dtype, ReduceOp op, const std::vector<int>& pes, StreamHandle stream, KeepAlive keep) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(CheckReduce(dst, dst_bytes, symmetric_src, src_bytes, dtype, op, pes)));
  if (dst_bytes == 0) return Status::Ok();
  return Record(device_->Reduce(dst, symmetric_src, dst_bytes / DataTypeSize(dtype), dtype, op, pes, stream,
                                std::move(keep)));
}

Result<void*> Runtime::PeerAddress(const void* symmetric, std::size_t bytes, int pe, const char* what) const {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("peer_tensor")));
  HP_RETURN_IF_ERROR(Record(CheckPe(pe, "pe")));
  HP_RETURN_IF_ERROR(Record(CheckOnNode(pe, "peer_tensor")));
  HP_RETURN_IF_ERROR(Record(ResolveSymmetric(symmetric, bytes, what).status()));
  Result<void*> peer = device_->PeerAddress(symmetric, pe);
  if (!peer.ok()) return Record(peer.status());
  return peer;
}

Status Runtime::EncodeRows(ops::LowFormat format, DataType dtype, const void* src, std::size_t rows,
                           std::size_t row_elems, void* dst, StreamHandle stream, KeepAlive keep) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("encode_rows")));
  HP_RETURN_IF_ERROR(Record(CheckRowCodec(format, dtype, src, "src", dst, "dst", rows)));
  if (rows == 0) return Status::Ok();
  return Record(device_->EncodeRows(format, dtype, src, rows, row_elems, dst, stream, std::move(keep)));
}

Status Runtime::DecodeRows(ops::LowFormat format, const void* src, std::size_t rows, std::size_t row_elems,
                           DataType dtype, void* out, StreamHandle stream, KeepAlive keep) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("decode_rows")));
  HP_RETURN_IF_ERROR(Record(CheckRowCodec(format, dtype, out, "out", src, "src", rows)));
  if (rows == 0) return Status::Ok();
  return Record(device_->DecodeRows(format, src, rows, row_elems, dtype, out, stream, std::move(keep)));
}

Status Runtime::Barrier(StreamHandle stream) {
  OperationScope scope(*this);
  HP_RETURN_IF_ERROR(Record(RequireInitialized("barrier")));
  return Record(device_->Barrier(stream));
}

}  // namespace hp::shmem
