// send/recv through the receiver's mailbox (collectives/engine.h, team.h for the mailbox's layout).

#include <algorithm>

#include "runtime/collectives/engine.h"
#include "runtime/collectives/paths.h"

namespace hp::shmem {

using namespace collectives;   // paths.h: what every family shares

Status CollectiveEngine::Send(const Buffer& data, int peer) {
  op_name_ = "send";
  if (!team_.broken.empty()) {
    return StateError("team cannot run collectives any more: op=send " + team_.Describe() + " reason=" + team_.broken);
  }
  const std::size_t total = data.bytes;
  const std::size_t payload = team_.mailbox_payload_bytes();
  const int pe = team_.pes[static_cast<std::size_t>(peer)];
  std::uint64_t seq = team_.sent_pieces[static_cast<std::size_t>(peer)];
  const std::uint64_t first = seq + 1;
  const auto* bytes = static_cast<const char*>(data.address);
  for (std::size_t off = 0; off < std::max<std::size_t>(total, 1); off += payload) {
    ++seq;
    auto fail = [&](Status status) {
      if (seq == first) return status;   // nothing of the message left: a retry starts it again
      team_.sent_pieces[static_cast<std::size_t>(peer)] = seq - 1;
      return Broken(status, "send");
    };
    // The piece is free once the receiver took the piece that used it kMailboxPieces pieces ago.
    if (seq > kMailboxPieces) {
      Status free = device_.WaitSignal(team_.Acked(peer), device_.native_signal_width(), CompareOp::kGe,
                                       team_.signal_base + static_cast<std::int64_t>(seq - kMailboxPieces), stream_);
      if (!free.ok()) {
        return fail(Status(free.code(), "send timed out waiting for a peer: " + team_.Describe() + " missing_ranks=[" +
                                            std::to_string(pe) + "] (" + free.message() + ")"));
      }
    }
    char* piece = team_.MailboxPiece(team_.me, static_cast<int>(seq % kMailboxPieces));
    // The header is written into this rank's own copy of the piece (never a destination: no rank sends to itself),
    // then travels heap to heap. The stream must be done with the previous use of that copy.
    if (stream_ != kDefaultStream) HP_RETURN_IF_ERROR(fail(device_.SynchronizeStream(stream_)));
    const std::uint64_t header[2] = {total, seq};
    HP_RETURN_IF_ERROR(fail(device_.CopyToHeap(piece, header, sizeof(header))));
    HP_RETURN_IF_ERROR(fail(Put(piece, piece, sizeof(header), peer)));
    const std::size_t length = std::min(payload, total > off ? total - off : 0);
    const std::size_t at = total <= kMailboxInlineBytes ? sizeof(header) : kMailboxHeaderBytes;
    if (length > 0) HP_RETURN_IF_ERROR(fail(Put(piece + at, bytes + off, length, peer)));
    HP_RETURN_IF_ERROR(fail(device_.Signal(team_.Sent(team_.me), device_.native_signal_width(),
                                           team_.signal_base + static_cast<std::int64_t>(seq), SignalOp::kSet, pe, stream_)));
  }
  team_.sent_pieces[static_cast<std::size_t>(peer)] = seq;
  return Status::Ok();
}

Status CollectiveEngine::Recv(const Buffer& data, int peer) {
  op_name_ = "recv";
  if (!team_.broken.empty()) {
    return StateError("team cannot run collectives any more: op=recv " + team_.Describe() + " reason=" + team_.broken);
  }
  const int pe = team_.pes[static_cast<std::size_t>(peer)];
  const std::size_t payload = team_.mailbox_payload_bytes();
  std::uint64_t seq = team_.received_pieces[static_cast<std::size_t>(peer)] + 1;
  const std::uint64_t first = seq;
  auto wait_piece = [&]() -> Status {
    Status arrived = device_.WaitSignal(team_.Sent(peer), device_.native_signal_width(), CompareOp::kGe,
                                        team_.signal_base + static_cast<std::int64_t>(seq), stream_);
    if (arrived.ok() && stream_ != kDefaultStream) arrived = device_.SynchronizeStream(stream_);
    if (arrived.ok()) return arrived;
    return Status(arrived.code(), "recv timed out waiting for a peer: " + team_.Describe() + " missing_ranks=[" +
                                      std::to_string(pe) + "] (" + arrived.message() + ")");
  };
  auto fail = [&](Status status) {
    if (seq == first) return status;
    return Broken(status, "recv");
  };
  HP_RETURN_IF_ERROR(wait_piece());
  std::uint64_t header[2] = {0, 0};
  HP_RETURN_IF_ERROR(device_.CopyFromHeap(header, team_.MailboxPiece(peer, static_cast<int>(seq % kMailboxPieces)),
                                          sizeof(header)));
  const std::size_t total = header[0];
  const bool fits = total == data.bytes;
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
    HP_RETURN_IF_ERROR(fail(device_.Signal(team_.Acked(team_.me), device_.native_signal_width(),
                                           team_.signal_base + static_cast<std::int64_t>(seq), SignalOp::kSet, pe, stream_)));
    team_.received_pieces[static_cast<std::size_t>(peer)] = seq;
  }
  if (!fits) {
    return InvalidArgument("`tensor` must have the " + std::to_string(total) + " bytes rank " + std::to_string(peer) +
                           " sent, but got " + std::to_string(data.bytes) + " bytes");
  }
  return Status::Ok();
}

}  // namespace hp::shmem
