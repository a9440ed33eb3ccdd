// all_reduce in full precision: one step, copy-free two-shot, one-shot out of a symmetric input, peer-memory two-shot,
// staged (collectives/engine.h).

#include <algorithm>

#include "runtime/collectives/engine.h"
#include "runtime/collectives/paths.h"

namespace hp::shmem {

using namespace collectives;   // paths.h: what every family shares

Status CollectiveEngine::AllReduce(const Buffer& output, const Buffer& input, const ElementType& type, ReduceOp op) {
  const std::size_t count = output.bytes / type.bytes;
  HP_ASSIGN_OR_RETURN(Fingerprint f, Begin(Collective::kAllReduce, &type, count, static_cast<std::uint32_t>(op) + 1, -1));
  f.where[0] = output.heap_offset;
  f.where[1] = input.heap_offset;
  f.address[0] = Published(output.address);
  f.address[1] = Published(input.address);
  const int n = team_.size();
  const int me = team_.me;
  const std::size_t es = type.bytes;
  char* out = static_cast<char*>(output.address);
  const char* in = static_cast<const char*>(input.address);
  if (count > 0 && output.bytes <= OneStepBytes(true)) {   // one sync: every rank reduces every staged copy
    char* stage = team_.StagingHalf(Parity());
    HP_RETURN_IF_ERROR(BeforeOpen(Put(stage, in, output.bytes, me)));
    HP_RETURN_IF_ERROR(Open(f).status());
    return Broken(Reduce(out, stage, count, type, op), "reduce", Next::kCallEnd);
  }
  HP_ASSIGN_OR_RETURN(std::vector<Fingerprint> rows, Open(f));
  if (count == 0) return Status::Ok();
  if (Deferred() ? output.heap_offset >= 0 : SameSymmetric(rows, 0)) {
    // Two-shot in place: reduce this rank's part from every peer's copy, then push it to them (or, with deferred
    // checks, let them pull it: nobody writes a peer's tensor).
    if (in != out) {   // the peers reduce out of this rank's output: it holds the input first
      HP_RETURN_IF_ERROR(Broken(device_.Copy(out, in, output.bytes, stream_, keep_), "copy"));
      HP_RETURN_IF_ERROR(Sync());
    }
    const auto [lo, hi] = Part(count, n, me);
    char* part = out + lo * es;
    if (hi > lo) HP_RETURN_IF_ERROR(Broken(Reduce(part, part, hi - lo, type, op), "reduce"));
    if (!Deferred()) {
      for (int r = 1; r < n && hi > lo; ++r) {
        HP_RETURN_IF_ERROR(Broken(Put(part, part, (hi - lo) * es, (me + r) % n), "push"));
      }
      return Sync();
    }
    HP_RETURN_IF_ERROR(Sync());
    for (int r = 1; r < n; ++r) {
      const int p = (me + r) % n;
      const auto [plo, phi] = Part(count, n, p);
      if (phi > plo) HP_RETURN_IF_ERROR(Broken(Get(out + plo * es, out + plo * es, (phi - plo) * es, p), "pull"));
    }
    return Sync();
  }
  // The input is one symmetric buffer, the output is not: the input's copies are read straight out of the heap.
  const bool symmetric_input = Deferred() ? input.heap_offset >= 0 : SameSymmetric(rows, 1);
  if (symmetric_input && n == 2) {
    // One-shot: each rank reduces the whole message out of both members' copies (in group-rank order, so the ranks'
    // results are bit-identical). Between two members that touches three message sizes of memory where two-shot
    // through the staging touches three and a half, and it needs no middle sync; the closing sync keeps every input
    // unchanged until the peer has read it.
    HP_RETURN_IF_ERROR(Broken(Reduce(out, in, count, type, op), "reduce"));
    return Sync();
  }
  if (!symmetric_input && !Deferred() && EveryAddress(rows, 0) && EveryAddress(rows, 1)) {
    // Two-shot between the tensors: this rank's part of the output reduced out of every rank's input, then the
    // others' parts pulled out of their outputs. An input is read only before the middle sync, and in place only its
    // owner's part of it is written before then.
    const auto [lo, hi] = Part(count, n, me);
    HP_RETURN_IF_ERROR(Broken(ReducePeerMemory(out + lo * es, rows, 1, lo * es, hi - lo, type, op), "reduce"));
    HP_RETURN_IF_ERROR(Sync());
    for (int r = 1; r < n; ++r) {
      const int p = (me + r) % n;
      const auto [plo, phi] = Part(count, n, p);
      if (phi > plo) {
        HP_RETURN_IF_ERROR(Broken(GetPeerMemory(out + plo * es, rows[static_cast<std::size_t>(p)].address[0] + plo * es,
                                                (phi - plo) * es, p),
                                  "pull"));
      }
    }
    return Sync();
  }
  // Staged: each piece of the input is reduced part by part into the ranks' staging areas (out of every rank's
  // staged copy of it, or straight out of the peers' copies of a symmetric input: one copy and one sync fewer), then
  // every rank pulls the reduced parts straight into its output.
  const std::size_t piece = team_.staging_bytes() / es;
  char* stage = team_.Staging();
  for (std::size_t off = 0; off < count; off += piece) {
    const std::size_t length = std::min(piece, count - off);
    if (!symmetric_input) {
      HP_RETURN_IF_ERROR(Broken(Put(stage, in + off * es, length * es, me), "stage"));
      HP_RETURN_IF_ERROR(Sync());
    }
    const auto [lo, hi] = Part(length, n, me);
    const char* source = symmetric_input ? in + off * es : stage;
    HP_RETURN_IF_ERROR(Broken(Reduce(stage + lo * es, source + lo * es, hi - lo, type, op), "reduce"));
    HP_RETURN_IF_ERROR(Sync());
    for (int r = 1; r <= n; ++r) {
      const int p = (me + r) % n;
      const auto [plo, phi] = Part(length, n, p);
      if (phi > plo) HP_RETURN_IF_ERROR(Broken(Get(out + (off + plo) * es, stage + plo * es, (phi - plo) * es, p), "pull"));
    }
    HP_RETURN_IF_ERROR(Sync());
  }
  return Status::Ok();
}

}  // namespace hp::shmem
