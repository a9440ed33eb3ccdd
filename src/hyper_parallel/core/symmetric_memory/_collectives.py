"""Collectives (seeds 000 and 004) written over the runtime's one-sided primitives.

Every algorithm picks one of three paths, the same on every rank:

* **one step** for small messages: each rank stages its data in the half of its slot's staging area that the
  previous small op left alone, one sync, then peers pull from it or reduce straight from it;
* **copy-free** when every rank passes the same symmetric tensor (ranks publish its heap offset with the op's
  first sync, ``GroupChannel.publish``): peers push into it, pull from it or reduce straight from it;
* **staged** otherwise: ranks copy their data into their staging area and peers read it from there, in pieces
  of the staging size.

A rank only writes into a peer's memory, or reads it, between two syncs of the group (``GroupChannel.sync``):
the first says every rank has entered the op (so its buffers are free and its inputs ready), the last says
every rank is done with its peers' memory. The one-step path skips the closing sync by alternating between
the two halves of the staging area (``flip``).

Every call is enqueued on the current SHMEM stream. The calls that read what peers published (large
collectives choosing their path, all_to_all's counts, recv's message size) first wait for that stream. A
group's collectives must not run on two streams at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.symmetric_memory import _args, _autograd, _context, _groups, _low_precision
from hyper_parallel.core.symmetric_memory._context import MAILBOX_SLOTS, GroupChannel, heap_offset, is_symmetric



def _bytes(t: torch.Tensor) -> torch.Tensor:
    """The flat bytes of a contiguous tensor."""
    return t.reshape(-1).view(torch.uint8)


def _chunk(count: int, parts: int, index: int) -> tuple:
    """Bounds of part ``index`` when ``count`` elements are cut into ``parts`` near-equal parts."""
    step = -(-count // parts)
    lo = min(index * step, count)
    return lo, min(lo + step, count)


def _check_group_multiple(whole: torch.Tensor, whole_name: str, part: torch.Tensor, part_name: str, n: int) -> None:
    """Raises ValueError unless ``whole`` has ``n`` times the elements of ``part`` (one part per group rank)."""
    if whole.numel() != n * part.numel():
        raise ValueError(
            f"`{whole_name}.numel()` must be {n} x {part_name}.numel() ({n * part.numel()}), but got {whole.numel()}"
        )


def _same_symmetric(rows: list, column: int) -> bool:
    """Whether every rank published the same heap offset (not -1: an ordinary tensor) in ``column``: only then may
    peers address each other's copies of it."""
    first = rows[0][column]
    return first >= 0 and all(row[column] == first for row in rows)


def _is_part(part: torch.Tensor, whole: torch.Tensor, index: int) -> bool:
    """Whether the non-empty ``part`` is exactly part ``index`` of ``whole`` (contiguous tensors), judged from their
    views' metadata alone (torch.compile traces it; the operators check addresses)."""
    def root(t: torch.Tensor) -> torch.Tensor:
        return t if t._base is None else t._base

    if not part.numel() or root(part) is not root(whole):
        return False
    offset = part.storage_offset() * part.element_size() - whole.storage_offset() * whole.element_size()
    return offset == index * part.numel() * part.element_size()


def _precision_name(low_precision_dtype: object, dtype: torch.dtype, op: str) -> str:
    """``low_precision_dtype`` as the operators take it, checked: "" (None) leaves the environment's default to
    the operator, which reads it (environment reads stay out of traced code); an explicit value is checked here,
    before anything runs."""
    if low_precision_dtype is None:
        return ""
    precision = _low_precision.resolve(low_precision_dtype, dtype, op)
    return "none" if precision is None else str(precision).removeprefix("torch.")


def _copy_local(dst: torch.Tensor, src: torch.Tensor, ch: GroupChannel) -> None:
    """A stream-ordered local copy between tensors of which one is symmetric."""
    if dst.data_ptr() == src.data_ptr():
        return
    if is_symmetric(dst):
        shmem.put(dst, src, ch.my_pe)
    else:
        shmem.get(dst, src, ch.my_pe)


def shmem_allgather(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                    group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """Gathers every rank's ``input_tensor`` into ``output_tensor``, in group-rank order (collective).

    Args:
        output_tensor: group-size times the input's elements, same dtype. The same symmetric tensor on every
            rank: peers push into it directly (large messages); otherwise it is filled from staged copies.
        input_tensor: this rank's contribution. It may be this rank's part of ``output_tensor`` (in place).
        group: a ProcessGroup inside the root (None: WORLD).

    Returns:
        ``output_tensor``.

    Raises:
        TypeError: differing dtypes, a non-tensor.
        ValueError: sizes that do not match, or an input overlapping the output elsewhere than its own part.
        ShmemTimeoutError: a rank did not take part in time.
    """
    output = _args.tensor(output_tensor, "output_tensor")
    data = _args.tensor(input_tensor, "input_tensor")
    _args.same_dtype(data, "input_tensor", output, "output_tensor")
    group_name = _groups.name(group)
    _check_group_multiple(output, "output_tensor", data, "input_tensor", _groups.size(group))
    if _autograd.tracks(input_tensor) and _is_part(data, output, _groups.rank(group)):
        raise ValueError("`input_tensor` must not be a view of `output_tensor` when it requires grad, but got "
                         "this rank's part of it (autograd cannot differentiate an in-place all_gather)")
    _autograd.call("all_gather_", _all_gather_op, (input_tensor,), output_tensor, input_tensor, group_name)
    return output_tensor


def _channel(group_name: str, op: str) -> GroupChannel:
    """The channel of the group an operator was given by name, registering the group on its first collective."""
    return _context.channel(_groups.resolve(group_name), op)


def _all_gather_op(output: torch.Tensor, input: torch.Tensor, group_name: str) -> None:
    """The operator ``all_gather_``: the checks that need the runtime or addresses, then :func:`_all_gather`."""
    ch = _channel(group_name, "shmem_allgather")
    _check_all_gather_overlap(output, input, ch.me)
    _all_gather(output, input, ch)


def _check_all_gather_overlap(output: torch.Tensor, data: torch.Tensor, me: int) -> None:
    """Raises ValueError unless ``data`` is group rank ``me``'s part of ``output`` or lies outside it."""
    src, out = _bytes(data), _bytes(output)
    c = src.numel()
    mine = out[me * c:(me + 1) * c]
    if _args.overlaps(src, out) and src.data_ptr() != mine.data_ptr():
        raise ValueError("`input_tensor` must be this rank's part of `output_tensor` or not overlap it, but got "
                         f"an overlap at byte {src.data_ptr() - out.data_ptr()} of the output")


def _all_gather(output: torch.Tensor, data: torch.Tensor, ch: GroupChannel) -> None:
    """all_gather on checked arguments."""
    src, out = _bytes(data), _bytes(output)
    c = src.numel()
    mine = out[ch.me * c:(ch.me + 1) * c]
    if c == 0:
        return
    ring = ch.peers + (ch.me,)
    if c <= ch.one_shot_bytes:  # one sync: stage in the half the next small op leaves alone, peers pull from it
        stage = ch.one_shot_stage(torch.uint8, c)
        shmem.put(stage, src, ch.my_pe)
        ch.sync()
        for p in ring:
            if p != ch.me or src.data_ptr() != mine.data_ptr():
                shmem.get(out[p * c:(p + 1) * c], stage, ch.pes[p])
        return
    where = ch.publish(ch.flip(), [heap_offset(out), heap_offset(src)])  # also: every rank has entered
    if _same_symmetric(where, 0):  # push into the peers' outputs
        for p in ch.peers:
            shmem.put(mine, src, ch.pes[p])
        _copy_local(mine, src, ch)
        ch.sync()
    elif _same_symmetric(where, 1):  # pull from the peers' inputs
        for p in ring:
            shmem.get(out[p * c:(p + 1) * c], src, ch.pes[p])
        ch.sync()
    else:
        piece = ch.staging.numel()
        for off in range(0, c, piece):
            length = min(piece, c - off)
            stage = ch.staging[:length]
            shmem.put(stage, src[off:off + length], ch.my_pe)
            ch.sync()
            for p in ring:
                shmem.get(out[p * c + off:p * c + off + length], stage, ch.pes[p])
            ch.sync()


def shmem_allreduce(tensor: torch.Tensor, op: str = "sum", group: Optional[dist.ProcessGroup] = None,
                    low_precision_dtype: Optional[torch.dtype] = None, backward: str = "identity") -> torch.Tensor:
    """Reduces ``tensor`` across the group, in place: every rank ends with bit-identical values (collective).

    Small tensors (up to 256 KiB, or half the staging area if smaller) take one step: each rank reads every
    peer's staged copy. Larger ones reduce-scatter then all-gather: the same symmetric ``tensor`` on every rank
    is reduced in place with no copies, anything else through the staging area. float16/bfloat16 accumulate in
    float32.

    Args:
        tensor: a contiguous CPU tensor of float32, float64, float16, bfloat16, int8, uint8, int32 or int64.
        op: 'sum', 'avg' (floating point only), 'max' or 'min'.
        group: a ProcessGroup inside the root (None: WORLD).
        low_precision_dtype: travel in this dtype (float16, bfloat16, float8_e4m3fn or float8_e5m2, or its name;
            fp8 with a power-of-two scale per 128-element block) and accumulate in the tensor's dtype (float32 at
            least). None: the default set by ``SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE``, which applies only where it
            can, else full precision; 'none': full precision whatever the environment says. It applies to 'sum'
            and 'avg' on floating-point tensors wider than it (an explicit dtype elsewhere is a ValueError); see
            :mod:`~hyper_parallel.core.symmetric_memory._low_precision` for the algorithm and the error bounds.
        backward: the gradient when ``tensor`` requires grad. 'identity' (default): ``grad_in = grad_out``
            (scaled by 1/n for 'avg'), right when the computation after the all-reduce is replicated on every
            rank, so every rank's ``grad_out`` is already the full gradient (tensor parallelism). 'allreduce':
            ``grad_in = all_reduce(grad_out)`` (same op), right when ranks go on to compute different losses.

    Returns:
        ``tensor`` (in the autograd graph when it requires grad).

    Raises:
        TypeError: an unsupported dtype.
        ValueError: an unknown op or backward, 'avg' on integers, a low-precision dtype that does not apply,
            'max'/'min' on a tensor that requires grad.
        ShmemTimeoutError: a rank did not take part in time.
    """
    t = _args.tensor(tensor, "tensor")
    op = _args.reduce_op(op, t.dtype)
    precision = _precision_name(low_precision_dtype, t.dtype, op)
    mode = _autograd.backward_mode(backward)
    _autograd.call("all_reduce_", _all_reduce_op, (tensor,), tensor, op, _groups.name(group), precision, mode)
    return tensor


def _all_reduce_op(tensor: torch.Tensor, op: str, group_name: str, low_precision_dtype: str, backward: str) -> None:
    """The operator ``all_reduce_`` (``backward`` is autograd's): the environment's low-precision default, the
    channel, then :func:`_all_reduce`."""
    precision = _low_precision.resolve(low_precision_dtype or None, tensor.dtype, op)
    _all_reduce(tensor, op, _channel(group_name, "shmem_allreduce"), precision)


def _all_reduce(t: torch.Tensor, op: str, ch: GroupChannel, precision: Optional[torch.dtype] = None) -> None:
    """all_reduce on checked arguments (``precision``: the low-precision dtype to travel in, or None)."""
    count = t.numel()
    if count == 0 or ch.size == 1:
        return
    if precision is not None:
        _low_precision.all_reduce(t, op, ch, precision)
        return
    if t.nbytes <= ch.one_shot_bytes:
        stage = ch.one_shot_stage(t.dtype, count)
        shmem.put(stage, t, ch.my_pe)
        ch.sync()
        shmem.reduce(t, stage, ch.pes, op=op)
        return
    flat = t.view(-1)
    if _same_symmetric(ch.publish(ch.flip(), [heap_offset(flat)]), 0):  # also: every rank has entered
        _reduce_mine_and_share(flat, ch, op)
        ch.sync()
        return
    # Staged: each piece is reduced part by part in the ranks' staging areas, then every rank pulls the reduced
    # parts straight into its tensor (one copy less than pushing them back and copying the piece out).
    piece = ch.staging.numel() // t.element_size()
    for off in range(0, count, piece):
        length = min(piece, count - off)
        stage = ch.staging_view(t.dtype, 0, length)
        shmem.put(stage, flat[off:off + length], ch.my_pe)
        ch.sync()
        lo, hi = _chunk(length, ch.size, ch.me)
        if hi > lo:
            shmem.reduce(stage[lo:hi], stage[lo:hi], ch.pes, op=op)
        ch.sync()
        for p in ch.peers + (ch.me,):
            lo, hi = _chunk(length, ch.size, p)
            if hi > lo:
                shmem.get(flat[off + lo:off + hi], stage[lo:hi], ch.pes[p])
        ch.sync()


def _reduce_mine_and_share(buffer: torch.Tensor, ch: GroupChannel, op: str) -> None:
    """Two-shot on a symmetric tensor: reduce this rank's part from every peer in place, push it to them."""
    lo, hi = _chunk(buffer.numel(), ch.size, ch.me)
    if hi == lo:
        return
    part = buffer[lo:hi]
    shmem.reduce(part, part, ch.pes, op=op)
    for p in ch.peers:
        shmem.put(part, part, ch.pes[p])


def shmem_reduce_scatter(output_tensor: torch.Tensor, input_tensor: torch.Tensor, op: str = "sum",
                         group: Optional[dist.ProcessGroup] = None,
                         low_precision_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Reduces ``input_tensor`` across the group; rank r keeps part r of the result (collective).

    Args:
        output_tensor: 1/group-size of the input's elements, same dtype.
        input_tensor: group-size equal parts. The same symmetric tensor on every rank: peers reduce from it
            directly (large messages); otherwise it is staged.
        op: 'sum', 'avg' (floating point only), 'max' or 'min'.
        group: a ProcessGroup inside the root (None: WORLD).
        low_precision_dtype: as in :func:`shmem_allreduce`.

    Returns:
        ``output_tensor`` (in the autograd graph when the input requires grad: the gradient of the input is the
        all_gather of the output's, scaled by 1/n for 'avg').

    Raises:
        TypeError: differing or unsupported dtypes.
        ValueError: sizes that do not match, an unknown op, an output overlapping the input elsewhere than this
            rank's part, a low-precision dtype that does not apply, 'max'/'min' on an input that requires grad.
        ShmemTimeoutError: a rank did not take part in time.
    """
    output = _args.tensor(output_tensor, "output_tensor")
    data = _args.tensor(input_tensor, "input_tensor")
    _args.same_dtype(output, "output_tensor", data, "input_tensor")
    op = _args.reduce_op(op, data.dtype)
    precision = _precision_name(low_precision_dtype, data.dtype, op)
    group_name = _groups.name(group)
    _check_group_multiple(data, "input_tensor", output, "output_tensor", _groups.size(group))
    _autograd.call("reduce_scatter_", _reduce_scatter_op, (input_tensor,), output_tensor, input_tensor, op,
                   group_name, precision)
    return output_tensor


def _reduce_scatter_op(output: torch.Tensor, input: torch.Tensor, op: str, group_name: str,
                       low_precision_dtype: str) -> None:
    """The operator ``reduce_scatter_``: the low-precision default, the channel, the overlap check, then
    :func:`_reduce_scatter`."""
    precision = _low_precision.resolve(low_precision_dtype or None, input.dtype, op)
    ch = _channel(group_name, "shmem_reduce_scatter")
    _check_reduce_scatter_overlap(output, input, ch.me)
    _reduce_scatter(output, input, op, ch, precision)


def _check_reduce_scatter_overlap(output: torch.Tensor, data: torch.Tensor, me: int) -> None:
    """Raises ValueError unless ``output`` is group rank ``me``'s part of ``data`` or lies outside it."""
    out, src = output.view(-1), data.view(-1)
    c = out.numel()
    mine = src[me * c:(me + 1) * c]
    if _args.overlaps(out, src) and out.data_ptr() != mine.data_ptr():
        raise ValueError("`output_tensor` must be this rank's part of `input_tensor` or not overlap it, but got an "
                         f"overlap at byte {out.data_ptr() - src.data_ptr()} of the input")


def _reduce_scatter(output: torch.Tensor, data: torch.Tensor, op: str, ch: GroupChannel,
                    precision: Optional[torch.dtype] = None) -> None:
    """reduce_scatter on checked arguments (``precision`` as in :func:`_all_reduce`)."""
    n = ch.size
    out, src = output.view(-1), data.view(-1)
    c = out.numel()
    if c == 0:
        return
    if precision is not None:
        _low_precision.reduce_scatter(out, src, op, ch, precision)
        return
    mine = src[ch.me * c:(ch.me + 1) * c]
    if src.numel() * data.element_size() <= ch.one_shot_bytes:  # one sync, as in all_reduce
        stage = ch.one_shot_stage(data.dtype, src.numel())
        shmem.put(stage, src, ch.my_pe)
        ch.sync()
        shmem.reduce(out, stage[ch.me * c:(ch.me + 1) * c], ch.pes, op=op)
        return
    if _same_symmetric(ch.publish(ch.flip(), [heap_offset(src)]), 0):  # reduce straight from the peers' inputs
        shmem.reduce(out, mine, ch.pes, op=op)
        ch.sync()
        return
    region = (ch.staging.numel() // n) // 64 * 64
    piece = region // data.element_size()
    for off in range(0, c, piece):
        length = min(piece, c - off)
        for j in range(n):
            shmem.put(ch.staging_view(data.dtype, j * region, length), src[j * c + off:j * c + off + length], ch.my_pe)
        ch.sync()
        shmem.reduce(out[off:off + length], ch.staging_view(data.dtype, ch.me * region, length), ch.pes, op=op)
        ch.sync()


def _receive_counts(receive_list: object, n: int) -> list:
    if isinstance(receive_list, torch.Tensor):
        if receive_list.dim() != 1 or receive_list.dtype.is_floating_point or receive_list.dtype == torch.bool:
            raise TypeError(f"`receive_list` must be a sequence of {n} ints or a 1-D integer tensor, "
                            f"but got a tensor of shape {tuple(receive_list.shape)} and dtype {receive_list.dtype}")
        receive_list = receive_list.tolist()
    if not isinstance(receive_list, Sequence) or isinstance(receive_list, (str, bytes)):
        raise TypeError(f"`receive_list` must be a sequence of {n} ints, but got {type(receive_list).__name__}")
    if len(receive_list) != n:
        raise ValueError(f"`receive_list` must have one count per rank of the group ({n}), but got {len(receive_list)}")
    return [_args.count(v, f"receive_list[{i}]") for i, v in enumerate(receive_list)]


def shmem_alltoall(send_tensor_list: Sequence[torch.Tensor], receive_tensor: torch.Tensor, receive_list: Sequence[int],
                   group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """Sends ``send_tensor_list[j]`` to rank j; ``receive_tensor`` gets every rank's part in rank order (collective).

    The counts are exchanged through symmetric memory (no framework collective) and checked on every rank
    before any data moves: a mismatch raises the same error everywhere and writes nothing. Small parts travel
    with the counts. When every rank passes the same symmetric ``receive_tensor``, senders push into it; when
    the send tensors are, on every rank, the blocks of that tensor where the same peer's part lands (in place),
    each pair of ranks swaps its two blocks, moving half the bytes. Anything else is staged.

    Args:
        send_tensor_list: one contiguous tensor per group rank (any sizes, the dtype of ``receive_tensor``); they
            may be views of ``receive_tensor``.
        receive_tensor: the destination; the part from rank i starts after the counts from ranks < i. The
            same symmetric tensor on every rank: senders push into it directly (large messages); otherwise it is
            filled through the staging area.
        receive_list: the element count expected from each rank (ints or a 1-D integer tensor); their sum must
            fit ``receive_tensor``. Elements, not bytes: upstream hyper-parallel's documentation writes bytes, but
            its code offsets ``receive_tensor`` by these counts as elements, and this follows the code.
        group: a ProcessGroup inside the root (None: WORLD).

    Returns:
        ``receive_tensor``.

    Raises:
        TypeError: differing dtypes, non-tensors.
        ValueError: a list of the wrong length, counts past ``receive_tensor``'s end, or counts that disagree
            with what the senders send.
        ShmemTimeoutError: a rank did not take part in time.
    """
    receive = _args.tensor(receive_tensor, "receive_tensor")
    group_name = _groups.name(group)
    n = _groups.size(group)
    if isinstance(send_tensor_list, torch.Tensor) or not isinstance(send_tensor_list, Sequence):
        raise TypeError(
            f"`send_tensor_list` must be a sequence of {n} tensors, but got {type(send_tensor_list).__name__}"
        )
    if len(send_tensor_list) != n:
        raise ValueError(f"`send_tensor_list` must have one tensor per rank of the group ({n}), "
                         f"but got {len(send_tensor_list)}")
    for j, t in enumerate(send_tensor_list):
        t = _args.tensor(t, f"send_tensor_list[{j}]")
        _args.same_dtype(t, f"send_tensor_list[{j}]", receive, "receive_tensor")
    receives = _receive_counts(receive_list, n)
    if sum(receives) > receive.numel():
        raise ValueError(f"`sum(receive_list)` must be at most receive_tensor.numel() ({receive.numel()}), "
                         f"but got {sum(receives)}")
    sends = list(send_tensor_list)
    _autograd.call("all_to_all_", _all_to_all_op, sends, receive_tensor, sends, receives, group_name)
    return receive_tensor


def _all_to_all_op(receive: torch.Tensor, sends: list, receive_counts: list, group_name: str) -> None:
    """The operator ``all_to_all_``: the channel, then :func:`_all_to_all`."""
    ch = _channel(group_name, "shmem_alltoall")
    _all_to_all([_bytes(t) for t in sends], receive, list(receive_counts), ch)


def _all_to_all(sends: list, receive: torch.Tensor, receives: list, ch: GroupChannel) -> None:
    """all_to_all on checked arguments: ``sends`` as flat bytes, ``receives`` as element counts."""
    n, me = ch.size, ch.me
    esize = receive.element_size()
    out = _bytes(receive)
    # Where the receive tensor lies: -1 when it is an ordinary tensor, else 2 x its heap offset, plus 1 when the
    # send tensors alias it block for block (in place). Peers may address it only if every rank's is the same.
    starts = [sum(receives[:i]) * esize for i in range(n)]
    where = -1
    if is_symmetric(out):
        in_place = all(sends[j].numel() == receives[j] * esize and sends[j].data_ptr() == out.data_ptr() + starts[j]
                       for j in range(n))
        where = 2 * (out.data_ptr() - _context.state().heap_base) + int(in_place)
    parity = ch.flip()
    # Small parts travel with the counts (one sync in all): into the receiver's staging half of this parity, in a
    # region per sender. They are used only if every rank's parts fit.
    eager = max(t.numel() for t in sends) <= ch.eager_region_bytes
    region_of_mine = ch.eager_regions[parity][me]
    if eager:
        for p in ch.peers + (me,):
            shmem.put(region_of_mine[:sends[p].numel()], sends[p], ch.pes[p])
    table = ch.publish(parity, [t.numel() // esize for t in sends] + receives + [where])
    sent = [r[:n] for r in table]  # sent[i][j]: elements rank i sends to rank j
    expected = [r[n:2 * n] for r in table]  # expected[j][i]: elements rank j expects from rank i
    wheres = {r[2 * n] for r in table}
    for i in range(n):
        for j in range(n):
            if sent[i][j] != expected[j][i]:
                raise ValueError(f"`send_tensor_list[{j}]` of rank {i} must have the {expected[j][i]} elements rank "
                                 f"{j} expects in its receive_list[{i}], but got {sent[i][j]}")
    ring = ch.peers + (me,)
    if max(max(r) for r in sent) * esize <= ch.eager_region_bytes:
        for i in ring:
            length = sent[i][me] * esize
            if length:
                shmem.get(out[starts[i]:starts[i] + length], ch.eager_regions[parity][i][:length], ch.my_pe)
        return
    same_tensor = min(wheres) >= 0 and len({w // 2 for w in wheres}) == 1
    if same_tensor and wheres == {max(wheres) | 1}:  # in place everywhere
        _swap_blocks(out, starts, expected, sent, esize, ch)
    elif same_tensor and wheres == {min(wheres) & ~1}:  # the same symmetric tensor everywhere: push into it
        for j in ring:
            start = sum(expected[j][:me]) * esize
            shmem.put(out[start:start + sends[j].numel()], sends[j], ch.pes[j])
    else:  # staged (also safe where the send tensors alias the receive tensor: parts are staged before use)
        region = (ch.staging.numel() // n) // 64 * 64
        largest = max(max(r) for r in sent) * esize
        for off in range(0, largest, region):
            for j in ring:
                piece = sends[j][off:off + region]
                shmem.put(ch.staging[me * region:me * region + piece.numel()], piece, ch.pes[j])
            ch.sync()
            for i in ring:
                length = max(0, min(region, sent[i][me] * esize - off))
                if length:
                    shmem.get(out[starts[i] + off:starts[i] + off + length],
                              ch.staging[i * region:i * region + length], ch.my_pe)
            ch.sync()
        return
    ch.sync()


# Bytes one swap step holds in the staging area: small enough to stay in the core's cache between its two copies.
_SWAP_CHUNK_BYTES = 256 << 10


def _swap_blocks(out: torch.Tensor, starts: list, expected: list, sent: list, esize: int, ch: GroupChannel) -> None:
    """In-place all_to_all: block j of this rank and block ``me`` of rank j trade places, for every peer j.

    Each pair of ranks splits the work: the lower rank swaps the first half of the two blocks, the higher one
    the second half, through a cache-sized chunk of its staging area. Every byte is read once and written once,
    half the traffic of an out-of-place exchange.
    """
    me = ch.me
    chunk = min(_SWAP_CHUNK_BYTES, ch.staging.numel())
    for j in ch.peers:
        length = sent[me][j] * esize
        mine = out[starts[j]:starts[j] + length]
        theirs_start = sum(expected[j][:me]) * esize  # my block's place in rank j's copy of the tensor
        theirs = out[theirs_start:theirs_start + length]
        half = length // 2
        lo, hi = (0, half) if me < j else (half, length)
        for a in range(lo, hi, chunk):
            b = min(a + chunk, hi)
            held = ch.staging[:b - a]
            shmem.put(held, mine[a:b], ch.my_pe)
            shmem.get(mine[a:b], theirs[a:b], ch.pes[j])
            shmem.put(theirs[a:b], held, ch.pes[j])


def shmem_send(tensor: torch.Tensor, dst_rank: int,
               group: Optional[dist.ProcessGroup] = None) -> Optional[torch.Tensor]:
    """Sends ``tensor`` to ``dst_rank``, which receives it with :func:`shmem_recv` (point to point).

    Messages travel through the receiver's mailbox in pieces, up to four in flight: a small message returns
    at once (the tensor may be reused), a larger one waits while the receiver lags four pieces behind.
    Messages between two ranks arrive in the order they were sent.

    Args:
        tensor: a contiguous CPU tensor.
        dst_rank: a rank of ``group`` other than this one.
        group: a ProcessGroup inside the root (None: WORLD) that ran a collective (or ``barrier``) before.

    Returns:
        None; when ``tensor`` requires grad, a zero scalar in the autograd graph instead: its backward receives
        the gradient of ``tensor`` from ``dst_rank`` (whose :func:`shmem_recv` result sends it back in its own
        backward). Add it to the loss or call ``.backward()`` on it.

    Raises:
        ValueError: ``dst_rank`` outside the group or this rank itself.
        ShmemStateError: ``group`` never ran a collective, so it has no channel.
        ShmemTimeoutError: the receiver did not drain a piece in time.
    """
    _args.tensor(tensor, "tensor")
    dst = _args.integer(dst_rank, "dst_rank")
    token = _autograd.call("send", _send_op, (tensor,), tensor, dst, _groups.name(group))
    return token if _autograd.tracks(tensor) else None


def _send_op(tensor: torch.Tensor, dst: int, group_name: str) -> torch.Tensor:
    """The operator ``send``: the group's channel (it must exist), the peer check, :func:`_send`; returns the
    gradient's token, a zero scalar."""
    ch = _context.registered_channel(_groups.resolve(group_name), "shmem_send")
    _send(tensor, _peer_rank(dst, "dst_rank", ch), ch)
    return tensor.new_zeros(())


def _send(tensor: torch.Tensor, dst: int, ch: GroupChannel) -> None:
    """send on checked arguments (``dst``: a group rank)."""
    data = _bytes(tensor)
    pe = ch.pes[dst]
    total = data.numel()
    header_value = torch.tensor([total], dtype=torch.int64, device=data.device)
    seq = ch.sent_messages[dst]
    for off in range(0, max(total, 1), ch.mailbox_payload_bytes):
        seq += 1
        # The slot is free once the receiver acknowledged the piece that used it MAILBOX_SLOTS pieces ago.
        ch.wait_for_peer(ch.acked[dst], seq - MAILBOX_SLOTS, dst)
        header, payload = ch.mailbox_slot(ch.me, seq)
        piece = data[off:off + ch.mailbox_payload_bytes]
        shmem.put(header, header_value, pe)
        shmem.put(payload[:piece.numel()], piece, pe)
        shmem.signal(ch.sent[ch.me], seq, pe)
    ch.sent_messages[dst] = seq


def shmem_recv(tensor: torch.Tensor, src_rank: int, group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """Receives the next message ``src_rank`` sent with :func:`shmem_send` into ``tensor``.

    Args:
        tensor: a contiguous CPU tensor of the message's byte size.
        src_rank: a rank of ``group`` other than this one.
        group: a ProcessGroup inside the root (None: WORLD) that ran a collective (or ``barrier``) before.

    Returns:
        ``tensor``. When ``tensor`` requires grad (a leaf made with ``requires_grad=True``), a new tensor with the
        message (``tensor`` holds it too) in the autograd graph instead: its backward sends the gradient back to
        ``src_rank`` (whose :func:`shmem_send` result receives it) and leaves it in ``tensor.grad`` as well.

    Raises:
        ValueError: ``src_rank`` outside the group or this rank, or a message of another size (the message is
            drained, so the sender is not left waiting, and ``tensor`` is left unchanged).
        ShmemStateError: ``group`` never ran a collective.
        ShmemTimeoutError: nothing arrived in time.
    """
    _args.tensor(tensor, "tensor")
    src = _args.integer(src_rank, "src_rank")
    group_name = _groups.name(group)
    if _autograd.tracks(tensor):
        if not tensor.is_leaf:
            raise ValueError("`tensor` must be a leaf (a receive buffer made with requires_grad=True) when it "
                             f"requires grad, but got the output of {type(tensor.grad_fn).__name__}")
        received = torch.ops.hyper_parallel_shmem.recv(tensor, src, group_name)
        with torch.no_grad():
            tensor.copy_(received)
        return received
    _autograd.call("recv_", _recv_op, (tensor,), tensor, src, group_name)
    return tensor


def _recv_op(tensor: torch.Tensor, src: int, group_name: str) -> None:
    """The operator ``recv_``: the group's channel (it must exist), the peer check, then :func:`_recv`."""
    ch = _context.registered_channel(_groups.resolve(group_name), "shmem_recv")
    _recv(tensor, _peer_rank(src, "src_rank", ch), ch)


def _recv_new_op(like: torch.Tensor, src: int, group_name: str) -> torch.Tensor:
    """The operator ``recv``: the message in a new tensor like ``like``."""
    out = torch.empty_like(like)
    _recv_op(out, src, group_name)
    return out


def _recv(tensor: torch.Tensor, src: int, ch: GroupChannel) -> None:
    """recv on checked arguments (``src``: a group rank)."""
    data = _bytes(tensor)
    pe = ch.pes[src]
    seq = ch.received_messages[src] + 1
    ch.wait_for_peer(ch.sent[src], seq, src)
    _context.flush_for_host_read()
    header, _ = ch.mailbox_slot(src, seq)
    total = int(header.item())
    fits = total == data.numel()
    for index, off in enumerate(range(0, max(total, 1), ch.mailbox_payload_bytes)):
        if index:
            seq += 1
            ch.wait_for_peer(ch.sent[src], seq, src)
        _, payload = ch.mailbox_slot(src, seq)
        length = min(ch.mailbox_payload_bytes, total - off)
        if fits and length > 0:
            shmem.get(data[off:off + length], payload[:length], ch.my_pe)
        shmem.signal(ch.acked[ch.me], seq, pe)
    ch.received_messages[src] = seq
    if not fits:
        raise ValueError(f"`tensor` must have the {total} bytes rank {src} sent, but got {data.numel()} bytes")


def _peer_rank(value: object, name: str, ch: GroupChannel) -> int:
    rank = _args.rank_in_group(value, name, ch.size)
    if rank == ch.me:
        raise ValueError(f"`{name}` must be another rank than this one ({ch.me}), but got {rank}")
    return rank
