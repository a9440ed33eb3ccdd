// send/recv through the receiver's mailbox (collectives/engine.h, team.h for the mailbox's layout).

#include <algorithm>
#include <cstring>

#include "runtime/collectives/engine.h"
#include "runtime/collectives/paths.h"

namespace hp::shmem {

using namespace collectives;   // paths.h: what every family shares

namespace {

std::string DtypeOf(const MailboxHeader& header) {
  return std::string(header.dtype, strnlen(header.dtype, sizeof(header.dtype)));
}

}  // namespace

std::int64_t CollectiveEngine::ReadSignal(const void* symmetric_signal) {
  if (device_.native_signal_width() == SignalWidth::k32) {
    std::int32_t narrow = 0;
    return device_.CopyFromHeap(&narrow, symmetric_signal, sizeof(narrow)).ok() ? narrow : 0;
  }
  std::int64_t wide = 0;
  return device_.CopyFromHeap(&wide, symmetric_signal, sizeof(wide)).ok() ? wide : 0;
}

Status CollectiveEngine::ReportRefusal(int peer) {
  const std::int64_t refused = ReadSignal(team_.Refused(peer));
  std::int64_t& seen = team_.refusals_seen[static_cast<std::size_t>(peer)];
  if (refused == 0 || refused == seen) return Status::Ok();
  seen = refused;
  return InvalidArgument("a message this rank sent must match the receive buffer of rank " +
                         std::to_string(team_.pes[static_cast<std::size_t>(peer)]) +
                         " in dtype and size, but that rank refused it (its recv raised, naming both): op=" +
                         op_name() + " " + team_.Describe());
}

Status CollectiveEngine::Send(const Buffer& data, int peer, const ElementType& type) {
  op_name_ = "send";
  if (!team_.broken.empty()) {
    return StateError("team cannot run collectives any more: op=send " + team_.Describe() + " reason=" + team_.broken);
  }
  HP_RETURN_IF_ERROR(ReportRefusal(peer));
  const std::size_t total = data.bytes;
  const std::size_t payload = team_.mailbox_payload_bytes();
  const int pe = team_.pes[static_cast<std::size_t>(peer)];
  std::uint64_t seq = team_.sent_pieces[static_cast<std::size_t>(peer)];
  const std::uint64_t first = seq + 1;
  MailboxHeader header{};
  header.bytes = total;
  std::strncpy(header.dtype, type.name.c_str(), sizeof(header.dtype) - 1);
  const auto* bytes = static_cast<const char*>(data.address);
  for (std::size_t off = 0; off < std::max<std::size_t>(total, 1); off += payload) {
    ++seq;
    auto fail = [&](Status status) {
      if (seq == first) return status;   // nothing of the message left: a retry starts it again
      team_.sent_pieces[static_cast<std::size_t>(peer)] = seq - 1;
      return Broken(status, "send", Next::kUnknown);
    };
    // The piece is free once the receiver took the piece that used it kMailboxPieces pieces ago (the same word: it
    // holds that piece's value until the receiver's ack of this one).
    if (seq - team_.first_counter > kMailboxPieces) {
      Status free = device_.WaitSignal(team_.Acked(peer, seq), device_.native_signal_width(), CompareOp::kEq,
                                       SignalValue(seq - kMailboxPieces), stream_);
      if (!free.ok()) {
        return fail(Status(free.code(), "send timed out waiting for a peer: " + team_.Describe() + " missing_ranks=[" +
                                            std::to_string(pe) + "] (" + free.message() + ")"));
      }
    }
    char* piece = team_.MailboxPiece(team_.me, static_cast<int>(seq % kMailboxPieces));
    // The header is written into this rank's own copy of the piece (never a destination: no rank sends to itself),
    // then travels heap to heap. The stream must be done with the previous use of that copy.
    if (stream_ != kDefaultStream) HP_RETURN_IF_ERROR(fail(device_.SynchronizeStream(stream_)));
    header.piece = seq;
    HP_RETURN_IF_ERROR(fail(device_.CopyToHeap(piece, &header, sizeof(header))));
    HP_RETURN_IF_ERROR(fail(Put(piece, piece, sizeof(header), peer)));
    const std::size_t length = std::min(payload, total > off ? total - off : 0);
    const std::size_t at = total <= kMailboxInlineBytes ? sizeof(header) : kMailboxHeaderBytes;
    if (length > 0) HP_RETURN_IF_ERROR(fail(Put(piece + at, bytes + off, length, peer)));
    HP_RETURN_IF_ERROR(fail(device_.Signal(team_.Sent(team_.me, seq), device_.native_signal_width(), SignalValue(seq),
                                           SignalOp::kSet, pe, stream_)));
  }
  team_.sent_pieces[static_cast<std::size_t>(peer)] = seq;
  return Status::Ok();
}

Status CollectiveEngine::Recv(const Buffer& data, int peer, const ElementType& type) {
  op_name_ = "recv";
  if (!team_.broken.empty()) {
    return StateError("team cannot run collectives any more: op=recv " + team_.Describe() + " reason=" + team_.broken);
  }
  HP_RETURN_IF_ERROR(ReportRefusal(peer));
  const int pe = team_.pes[static_cast<std::size_t>(peer)];
  const std::size_t payload = team_.mailbox_payload_bytes();
  std::uint64_t seq = team_.received_pieces[static_cast<std::size_t>(peer)] + 1;
  const std::uint64_t first = seq;
  auto wait_piece = [&]() -> Status {
    Status arrived = device_.WaitSignal(team_.Sent(peer, seq), device_.native_signal_width(), CompareOp::kEq,
                                        SignalValue(seq), stream_);
    if (arrived.ok() && stream_ != kDefaultStream) arrived = device_.SynchronizeStream(stream_);
    if (arrived.ok()) return arrived;
    return Status(arrived.code(), "recv timed out waiting for a peer: " + team_.Describe() + " missing_ranks=[" +
                                      std::to_string(pe) + "] (" + arrived.message() + ")");
  };
  auto fail = [&](Status status) {
    if (seq == first) return status;
    return Broken(status, "recv", Next::kUnknown);
  };
  HP_RETURN_IF_ERROR(wait_piece());
  MailboxHeader header{};
  HP_RETURN_IF_ERROR(device_.CopyFromHeap(&header, team_.MailboxPiece(peer, static_cast<int>(seq % kMailboxPieces)),
                                          sizeof(header)));
  const std::size_t total = header.bytes;
  const bool same_type = DtypeOf(header) == type.name;
  const bool fits = same_type && total == data.bytes;
  auto* bytes = static_cast<char*>(data.address);
  std::size_t index = 0;
  for (std::size_t off = 0; off < std::max<std::size_t>(total, 1); off += payload, ++index) {
    if (index > 0) {
      ++seq;
      HP_RETURN_IF_ERROR(fail(wait_piece()));
    }
    char* piece = team_.MailboxPiece(peer, static_cast<int>(seq % kMailboxPieces));
    const std::size_t length = std::min(payload, total > off ? total - off : 0);
    const std::size_t at = total <= kMailboxInlineBytes ? sizeof(header) : kMailboxHeaderBytes;   // as Send put it
    if (fits && length > 0) HP_RETURN_IF_ERROR(fail(Get(bytes + off, piece + at, length, team_.me)));
    HP_RETURN_IF_ERROR(fail(device_.Signal(team_.Acked(team_.me, seq), device_.native_signal_width(), SignalValue(seq),
                                           SignalOp::kSet, pe, stream_)));
    team_.received_pieces[static_cast<std::size_t>(peer)] = seq;
  }
  if (fits) return Status::Ok();
  // Drained and refused: the sender learns of it at its next send or recv with this rank.
  HP_RETURN_IF_ERROR(device_.Signal(team_.Refused(team_.me), device_.native_signal_width(), SignalValue(first),
                                    SignalOp::kSet, pe, stream_));
  const std::string sent = DtypeOf(header) + " message of " + std::to_string(total) + " bytes";
  const std::string got = type.name + " of " + std::to_string(data.bytes) + " bytes";
  const std::string rule = "`tensor` must be a receive buffer for the " + sent + " rank " +
                           std::to_string(pe) + " sent, but got " + got;
  return same_type ? InvalidArgument(rule) : TypeError(rule);
}

}  // namespace hp::shmem
