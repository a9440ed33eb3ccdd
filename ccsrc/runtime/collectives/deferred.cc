// Deferred checks: the protocol on a device that does not arbitrate (an NPU's, whose heap the host reads only by
// stopping the stream). A call's first sync runs on the stream like the rest of the call; the fingerprints, count rows
// and message headers the members published are read back without waiting (Device::ReadLater) and compared once the
// stream has run that far: at this rank's next call on the team, at a synchronize of the stream (Runtime), and at
// debug_state. No collective synchronizes the stream or copies to or from the heap with the host waiting.
//
// What a deferred call may do, so that a mismatch found later harms nothing but the call's own outputs:
//   - a rank writes its own outputs, its own staging and mailbox copies, and, on a peer, only the slots assigned to
//     it (its row of the tables, its region of a receiver's mailbox);
//   - it reads peers' memory where they published (staging, symmetric tensors at its own tensors' heap offsets: the
//     fingerprints say whether the members agree on those offsets);
//   - it decides its path from its own arguments: members whose fingerprints agree decide alike.
// A mismatch found later is reported on every member (they all read the same tables) and breaks the team: its members
// may have run different numbers of syncs since. A refusal is reported the same way, and the team runs on.

#include <algorithm>
#include <cstring>

#include "runtime/collectives/engine.h"
#include "runtime/collectives/paths.h"

namespace hp::shmem {

using namespace collectives;   // paths.h: what every family shares

namespace {

std::string DtypeText(const MailboxHeader& header) {
  return std::string(header.dtype, strnlen(header.dtype, sizeof(header.dtype)));
}

std::string DescribeMessage(const MailboxHeader& header) {
  return DtypeText(header) + " message of " + std::to_string(header.bytes) + " bytes";
}

}  // namespace

Status CollectiveEngine::OpenDeferred(Fingerprint fingerprint, const std::vector<std::int64_t>* counts,
                                      const std::string* statement) {
  // 1. This rank's call, numbered and staged from host memory in stream order into its own tables, then put into
  //    every peer's.
  const Status published = PublishCall(fingerprint, counts, statement, /*in_stream_order=*/true);
  const int n = team_.size();
  const int parity = static_cast<int>(team_.epoch & 1);
  if (!published.ok()) return Broken(published, "publish the call", Next::kUnknown);
  // 2. The sync, on the stream.
  const Status arrived = Arrive();
  if (!arrived.ok()) return SyncFailed(arrived, /*first=*/true);
  // 3. The tables, read back once the stream has passed the sync (the count table first: when the fingerprints have
  //    arrived, so have the counts).
  DeferredCheck check;
  check.kind = DeferredCheck::Kind::kCall;
  check.op = op_name();
  check.mine = fingerprint;
  if (counts != nullptr) {
    HP_ASSIGN_OR_RETURN(check.counts, device_.ReadLater(team_.CountRow(Parity(), 0),
                                                        static_cast<std::size_t>(n) * team_.layout->count_row_bytes(),
                                                        stream_));
    check.count_values = counts->size();
  }
  HP_ASSIGN_OR_RETURN(check.read, device_.ReadLater(team_.Table(parity), team_.layout->table_bytes, stream_));
  team_.deferred_checks.push_back(std::move(check));
  return Status::Ok();
}

Status CollectiveEngine::CompareCall(const DeferredCheck& check, const std::vector<char>& table,
                                     const std::vector<std::int64_t>& counts) {
  const int n = team_.size();
  const auto* rows = reinterpret_cast<const Fingerprint*>(table.data());
  auto statement = [&](int r) {
    const char* text = table.data() + static_cast<std::size_t>(n) * sizeof(Fingerprint) +
                       static_cast<std::size_t>(r) * kStatementBytes;
    return std::string(text, strnlen(text, kStatementBytes));
  };
  const std::string call = check.op + " (call " + std::to_string(check.mine.sequence) + ")";
  for (int r = 0; r < n; ++r) {
    if (rows[r].epoch != check.mine.epoch) {
      team_.broken = "a member did not publish its call at the sync it passed";
      return StateError("team is out of step: op=" + call + " " + team_.Describe() + " rank " +
                        std::to_string(team_.pes[static_cast<std::size_t>(r)]) +
                        " did not publish its call at that sync (it ran another number of syncs); create a new group");
    }
  }
  int refusers = 0;
  int first_refuser = -1;
  for (int r = 0; r < n; ++r) {
    if (rows[r].refusal == 0) continue;
    ++refusers;
    if (first_refuser < 0) first_refuser = r;
  }
  if (refusers == n) return Status::Ok();   // every member refused, and said so at once: in step
  if (refusers > 0) {
    // Members that refused returned after the first sync; the others ran the call on: they may have run different
    // numbers of syncs since.
    team_.broken = "members refused a call that others ran (call " + std::to_string(check.mine.sequence) + ")";
    if (check.mine.refusal != 0) {
      return StateError("team is out of step: op=" + call + " " + team_.Describe() + " this rank refused the call, "
                        "which other members ran; create a new group");
    }
    const int r = first_refuser;
    return Status(static_cast<StatusCode>(rows[r].refusal),
                  statement(r) + " (refused by rank " + std::to_string(team_.pes[static_cast<std::size_t>(r)]) +
                      ": op=" + call + " " + team_.Describe() + "; found after the call ran on the stream: its "
                      "outputs are not to be trusted, and the team is out of step: create a new group)");
  }
  for (int r = 0; r < n; ++r) {
    std::string differs = FingerprintDifference(check.mine, rows[r]);
    // Paths were chosen from each rank's own arguments: members must agree on where their tensors lie too.
    if (differs.empty() && !std::equal(std::begin(check.mine.where), std::end(check.mine.where), rows[r].where)) {
      differs = "symmetric tensors at different heap offsets";
    }
    if (!differs.empty()) {
      team_.broken = "members disagreed on call " + std::to_string(check.mine.sequence) + " (" + differs + ")";
      return Mismatch("ranks disagree on a collective (" + differs + "): " + team_.Describe() + " rank " +
                      std::to_string(team_.my_pe()) + " calls " + DescribeFingerprint(check.mine) + ", rank " +
                      std::to_string(team_.pes[static_cast<std::size_t>(r)]) + " calls " + DescribeFingerprint(rows[r]) +
                      " (found after the call ran on the stream: its outputs are not to be trusted, and the team is "
                      "out of step: create a new group)");
    }
  }
  if (check.count_values > 0) {   // all_to_all: every member sends what its receiver expects
    const std::size_t stride = team_.layout->count_row_bytes() / sizeof(std::int64_t);
    const auto un = static_cast<std::size_t>(n);
    for (std::size_t i = 0; i < un; ++i) {
      for (std::size_t j = 0; j < un; ++j) {
        const std::int64_t sent = counts[i * stride + j];
        const std::int64_t expected = counts[j * stride + un + i];
        if (sent != expected) {
          return InvalidArgument("`send_tensor_list[" + std::to_string(j) + "]` of rank " + std::to_string(i) +
                                 " must have the " + std::to_string(expected) + " elements rank " + std::to_string(j) +
                                 " expects in its receive_list[" + std::to_string(i) + "], but got " +
                                 std::to_string(sent) + " (found after " + call + " ran on the stream: its output is "
                                 "not to be trusted)");
        }
      }
    }
  }
  return Status::Ok();
}

Status CollectiveEngine::CheckDeferred(bool take) {
  const int n = team_.size();
  while (!team_.deferred_checks.empty()) {
    DeferredCheck& check = team_.deferred_checks.front();
    Status verdict;
    if (check.kind == DeferredCheck::Kind::kCall) {
      std::vector<std::int64_t> counts;
      if (check.counts != 0) {
        counts.resize(static_cast<std::size_t>(n) * team_.layout->count_row_bytes() / sizeof(std::int64_t));
        auto ready = device_.TakeRead(check.counts, counts.data());
        if (!ready.ok()) {
          verdict = ready.status();
        } else if (!ready.value()) {
          break;
        }
        check.counts = 0;   // taken: a second pass reads only the table
      }
      if (verdict.ok()) {
        std::vector<char> table(team_.layout->table_bytes);
        auto ready = device_.TakeRead(check.read, table.data());
        if (!ready.ok()) {
          verdict = ready.status();
        } else if (!ready.value()) {
          break;
        } else {
          verdict = CompareCall(check, table, counts);
        }
      }
    } else {
      MailboxHeader seen{};
      auto ready = device_.TakeRead(check.read, &seen);
      if (!ready.ok()) {
        verdict = ready.status();
      } else if (!ready.value()) {
        break;
      } else if (seen.bytes != check.expected.bytes || DtypeText(seen) != DtypeText(check.expected)) {
        const std::string peer = std::to_string(team_.pes[static_cast<std::size_t>(check.peer)]);
        const bool same_type = DtypeText(seen) == DtypeText(check.expected);
        const std::string rule =
            check.kind == DeferredCheck::Kind::kMessage
                ? "`tensor` must be a receive buffer for the " + DescribeMessage(seen) + " rank " + peer +
                      " sent, but got " + DtypeText(check.expected) + " of " + std::to_string(check.expected.bytes) +
                      " bytes"
                : "a message this rank sent (" + DescribeMessage(check.expected) +
                      ") must match the receive buffer of rank " + peer + ", but that rank expected a " +
                      DescribeMessage(seen);
        // Found after the message moved: the receiver's buffer holds what fit, and the mailbox may be out of step.
        team_.broken = "a message and its receive buffer disagreed (" + rule + ")";
        verdict = Status(same_type ? StatusCode::kInvalidArgument : StatusCode::kTypeError,
                         rule + " (found after the message moved on the stream: op=" + check.op + " " +
                             team_.Describe() + "; the team's mailbox is out of step: create a new group)");
      }
    }
    team_.deferred_checks.pop_front();
    if (!verdict.ok() && team_.deferred_failure.ok()) team_.deferred_failure = verdict;
  }
  if (!take || team_.deferred_failure.ok()) return Status::Ok();
  Status failure = std::move(team_.deferred_failure);
  team_.deferred_failure = Status::Ok();
  return failure;
}

// ---- the mailbox, one piece at a time -----------------------------------------------------------------------------

Status CollectiveEngine::SendPiece(int peer, std::uint64_t seq, const MailboxHeader& header, const char* payload,
                                   std::size_t length) {
  const int pe = team_.pes[static_cast<std::size_t>(peer)];
  // The piece is free once the receiver took the piece that used it kMailboxPieces pieces ago (the same word holds
  // that piece's value until the receiver's ack of this one).
  if (seq - team_.first_counter > kMailboxPieces) {
    HP_RETURN_IF_ERROR(device_.WaitSignal(team_.Acked(peer, seq), device_.native_signal_width(), CompareOp::kEq,
                                          SignalValue(seq - kMailboxPieces), stream_));
    if (Deferred()) {
      // The receiver wrote its receipt of that piece before acknowledging it: read it back, and compare it with the
      // message it began (if it began one) once the read has run.
      auto& sent = team_.sent_messages[static_cast<std::size_t>(peer)];
      while (!sent.empty() && sent.front().piece < seq - kMailboxPieces) sent.pop_front();
      if (!sent.empty() && sent.front().piece == seq - kMailboxPieces) {
        DeferredCheck check;
        check.kind = DeferredCheck::Kind::kReceipt;
        check.op = op_name();
        check.peer = peer;
        check.expected = sent.front();
        sent.pop_front();
        HP_ASSIGN_OR_RETURN(check.read, device_.ReadLater(team_.Receipt(peer, seq), sizeof(MailboxHeader), stream_));
        team_.deferred_checks.push_back(std::move(check));
      }
    }
  }
  char* piece = team_.MailboxPiece(team_.me, static_cast<int>(seq % kMailboxPieces));
  // The header is written into this rank's own copy of the piece (never a destination: no rank sends to itself), then
  // travels heap to heap.
  MailboxHeader stamped = header;
  stamped.piece = seq;
  if (Deferred()) {
    HP_RETURN_IF_ERROR(device_.StageFromHost(piece, &stamped, sizeof(stamped), stream_));
  } else {
    if (stream_ != kDefaultStream) HP_RETURN_IF_ERROR(device_.SynchronizeStream(stream_));   // done with its last use
    HP_RETURN_IF_ERROR(device_.CopyToHeap(piece, &stamped, sizeof(stamped)));
  }
  HP_RETURN_IF_ERROR(Put(piece, piece, sizeof(stamped), peer));
  const std::size_t at = header.bytes <= kMailboxInlineBytes ? sizeof(MailboxHeader) : kMailboxHeaderBytes;
  if (length > 0) HP_RETURN_IF_ERROR(Put(piece + at, payload, length, peer));
  return device_.Signal(team_.Sent(team_.me, seq), device_.native_signal_width(), SignalValue(seq), SignalOp::kSet, pe,
                        stream_);
}

Status CollectiveEngine::RecvPiece(int peer, std::uint64_t seq, const MailboxHeader& expected, char* payload,
                                   std::size_t length) {
  const int pe = team_.pes[static_cast<std::size_t>(peer)];
  HP_RETURN_IF_ERROR(device_.WaitSignal(team_.Sent(peer, seq), device_.native_signal_width(), CompareOp::kEq,
                                        SignalValue(seq), stream_));
  char* piece = team_.MailboxPiece(peer, static_cast<int>(seq % kMailboxPieces));
  const std::size_t at = expected.bytes <= kMailboxInlineBytes ? sizeof(MailboxHeader) : kMailboxHeaderBytes;
  if (length > 0) HP_RETURN_IF_ERROR(Get(payload, piece + at, length, team_.me));
  if (Deferred() && expected.piece == seq) {
    // A message's first piece: what arrived is read back for this rank's deferred check, and what this rank expected
    // goes back to the sender as its receipt (into the sender's slot for this rank), before the ack that frees the
    // piece.
    DeferredCheck check;
    check.kind = DeferredCheck::Kind::kMessage;
    check.op = op_name();
    check.peer = peer;
    check.expected = expected;
    HP_ASSIGN_OR_RETURN(check.read, device_.ReadLater(piece, sizeof(MailboxHeader), stream_));
    team_.deferred_checks.push_back(std::move(check));
    MailboxHeader* receipt = team_.Receipt(team_.me, seq);
    HP_RETURN_IF_ERROR(device_.StageFromHost(receipt, &expected, sizeof(expected), stream_));
    HP_RETURN_IF_ERROR(Put(receipt, receipt, sizeof(expected), peer));
  }
  return device_.Signal(team_.Acked(team_.me, seq), device_.native_signal_width(), SignalValue(seq), SignalOp::kSet,
                        pe, stream_);
}

Status CollectiveEngine::AllToAllPairwise(const std::vector<Buffer>& sends, const Buffer& receive,
                                          const std::vector<std::uint64_t>& receive_counts, const ElementType& type) {
  const int n = team_.size();
  const int me = team_.me;
  const std::size_t es = type.bytes;
  const std::size_t payload = team_.mailbox_payload_bytes();
  char* out = static_cast<char*>(receive.address);
  std::vector<std::size_t> starts(static_cast<std::size_t>(n), 0);
  for (std::size_t i = 1; i < starts.size(); ++i) starts[i] = starts[i - 1] + receive_counts[i - 1] * es;
  const std::size_t received = starts.back() + receive_counts.back() * es;
  // Sends that overlap the receive buffer other than as their own block would be overwritten by a part received
  // before they left: they go out of this rank's staging area, copied there first.
  std::vector<const char*> from(sends.size());
  std::size_t staged = 0;
  for (std::size_t j = 0; j < sends.size(); ++j) {
    from[j] = static_cast<const char*>(sends[j].address);
    const bool own_block = from[j] == out + starts[j];
    if (own_block || !Overlaps(sends[j].address, sends[j].bytes, out, received)) continue;
    HP_RETURN_IF_ERROR(Broken(device_.Copy(team_.Staging() + staged, sends[j].address, sends[j].bytes, stream_, keep_),
                              "stage a send", Next::kUnknown));
    from[j] = team_.Staging() + staged;
    staged += (sends[j].bytes + 63) / 64 * 64;
  }
  // This rank's own part: one local copy.
  char* own_place = out + starts[static_cast<std::size_t>(me)];
  if (from[static_cast<std::size_t>(me)] != own_place) {
    HP_RETURN_IF_ERROR(Broken(device_.Copy(own_place, from[static_cast<std::size_t>(me)],
                                           sends[static_cast<std::size_t>(me)].bytes, stream_, keep_),
                              "copy the own part", Next::kUnknown));
  }
  // Step r pairs this rank with (r - me) mod n, which pairs back with it: the two exchange their parts, pieces
  // interleaved, so that neither waits for a piece the other has not sent (each piece's flow control waits only on
  // pieces enqueued earlier on the peer's stream), and a part swapped in place leaves before what replaces it lands.
  for (int r = 0; r < n; ++r) {
    const int peer = ((r - me) % n + n) % n;
    if (peer == me) continue;
    const auto up = static_cast<std::size_t>(peer);
    MailboxHeader outgoing{};
    outgoing.bytes = sends[up].bytes;
    std::strncpy(outgoing.dtype, type.name.c_str(), sizeof(outgoing.dtype) - 1);
    MailboxHeader incoming{};
    incoming.bytes = receive_counts[up] * es;
    std::strncpy(incoming.dtype, type.name.c_str(), sizeof(incoming.dtype) - 1);
    std::uint64_t& sent = team_.sent_pieces[up];
    std::uint64_t& taken = team_.received_pieces[up];
    outgoing.piece = sent + 1;
    incoming.piece = taken + 1;
    team_.sent_messages[up].push_back(outgoing);
    const std::size_t send_pieces = std::max<std::size_t>((outgoing.bytes + payload - 1) / payload, 1);
    const std::size_t recv_pieces = std::max<std::size_t>((incoming.bytes + payload - 1) / payload, 1);
    for (std::size_t k = 0; k < std::max(send_pieces, recv_pieces); ++k) {
      const std::size_t off = k * payload;
      if (k < send_pieces) {
        const std::size_t length = std::min(payload, outgoing.bytes > off ? outgoing.bytes - off : 0);
        HP_RETURN_IF_ERROR(Broken(SendPiece(peer, ++sent, outgoing, from[up] + off, length), "send", Next::kUnknown));
      }
      if (k < recv_pieces) {
        const std::size_t length = std::min(payload, incoming.bytes > off ? incoming.bytes - off : 0);
        HP_RETURN_IF_ERROR(Broken(RecvPiece(peer, ++taken, incoming, out + starts[up] + off, length), "recv",
                                  Next::kUnknown));
      }
    }
  }
  return Status::Ok();
}

}  // namespace hp::shmem
