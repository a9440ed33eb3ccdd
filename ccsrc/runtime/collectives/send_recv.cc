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
  HP_RETURN_IF_ERROR(Deferred() ? CheckDeferred(/*take=*/true) : ReportRefusal(peer));
  const std::size_t total = data.bytes;
  const std::size_t payload = team_.mailbox_payload_bytes();
  std::uint64_t seq = team_.sent_pieces[static_cast<std::size_t>(peer)];
  const std::uint64_t first = seq + 1;
  MailboxHeader header{};
  header.piece = first;
  header.bytes = total;
  std::strncpy(header.dtype, type.name.c_str(), sizeof(header.dtype) - 1);
  if (Deferred()) team_.sent_messages[static_cast<std::size_t>(peer)].push_back(header);
  const auto* bytes = static_cast<const char*>(data.address);
  for (std::size_t off = 0; off < std::max<std::size_t>(total, 1); off += payload) {
    ++seq;
    const std::size_t length = std::min(payload, total > off ? total - off : 0);
    const Status sent = SendPiece(peer, seq, header, bytes + off, length);
    if (sent.ok()) continue;
    if (seq == first) return sent;   // nothing of the message left: a retry starts it again
    team_.sent_pieces[static_cast<std::size_t>(peer)] = seq - 1;
    return Broken(sent, "send", Next::kUnknown);
  }
  team_.sent_pieces[static_cast<std::size_t>(peer)] = seq;
  return Status::Ok();
}

Status CollectiveEngine::Recv(const Buffer& data, int peer, const ElementType& type) {
  op_name_ = "recv";
  if (!team_.broken.empty()) {
    return StateError("team cannot run collectives any more: op=recv " + team_.Describe() + " reason=" + team_.broken);
  }
  HP_RETURN_IF_ERROR(Deferred() ? CheckDeferred(/*take=*/true) : ReportRefusal(peer));
  const int pe = team_.pes[static_cast<std::size_t>(peer)];
  const std::size_t payload = team_.mailbox_payload_bytes();
  std::uint64_t seq = team_.received_pieces[static_cast<std::size_t>(peer)] + 1;
  const std::uint64_t first = seq;
  auto timed_out = [&](const Status& status) {
    return Status(status.code(), "recv timed out waiting for a peer: " + team_.Describe() + " missing_ranks=[" +
                                     std::to_string(pe) + "] (" + status.message() + ")");
  };
  MailboxHeader header{};
  bool fits = true;
  if (Deferred()) {
    // What arrives is this rank's to expect: the header is read back and compared later (deferred.cc).
    header.piece = first;
    header.bytes = data.bytes;
    std::strncpy(header.dtype, type.name.c_str(), sizeof(header.dtype) - 1);
  } else {
    // The first piece's header says what the message is: a message of another dtype or size is drained and refused.
    Status arrived = device_.WaitSignal(team_.Sent(peer, seq), device_.native_signal_width(), CompareOp::kEq,
                                        SignalValue(seq), stream_);
    if (arrived.ok() && stream_ != kDefaultStream) arrived = device_.SynchronizeStream(stream_);
    if (!arrived.ok()) return timed_out(arrived);
    HP_RETURN_IF_ERROR(device_.CopyFromHeap(&header, team_.MailboxPiece(peer, static_cast<int>(seq % kMailboxPieces)),
                                            sizeof(header)));
    fits = DtypeOf(header) == type.name && header.bytes == data.bytes;
  }
  const std::size_t total = header.bytes;
  auto* bytes = static_cast<char*>(data.address);
  for (std::size_t off = 0; off < std::max<std::size_t>(total, 1); off += payload, ++seq) {
    const std::size_t length = std::min(payload, total > off ? total - off : 0);
    const Status taken = RecvPiece(peer, seq, header, fits ? bytes + off : nullptr, fits ? length : 0);
    if (!taken.ok()) {
      if (seq == first) return taken.code() == StatusCode::kTimeout ? timed_out(taken) : taken;
      return Broken(taken.code() == StatusCode::kTimeout ? timed_out(taken) : taken, "recv", Next::kUnknown);
    }
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
  return DtypeOf(header) == type.name ? InvalidArgument(rule) : TypeError(rule);
}

}  // namespace hp::shmem
