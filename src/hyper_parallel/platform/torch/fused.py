"""torch's fused compute-communication ops, pipelined (the user API checked the shapes and the signal first):
all-gather + matmul and matmul + reduce-scatter.

**all_gather_matmul** (``gather_out = all_gather(a)``, ``c = gather_out @ b``). Each rank's rows of ``a`` travel
in blocks of ``block_size`` rows on a communication stream: for every block, a put into each peer's
``gather_out`` followed by a signal that tells the peer how many blocks have landed (same-stream order makes
the data visible before the signal). Meanwhile the calling thread multiplies the rows it already has, its own
rows straight from ``a``, then each peer's blocks in the order they arrive (me-1, me-2, ...: the peers push in
rotated order, so rank me-1 writes to this rank first). The matmul of one block runs while the next blocks
are still in flight, instead of after the whole gather. The stream only pays where a core is free for its
worker: where the local ranks and their torch threads fill the cores, the calling thread issues each block's
puts itself, right before multiplying that block (still cached from the put), and peers still start on a block
as soon as it lands, without a barrier behind the whole gather.

**matmul_reduce_scatter** (``reduce_scatter(x1 @ x2)`` over dim 0). Every rank computes the partial product
of each peer's rows into its own symmetric scratch, in rotated order (step r works for rank me + r, so no two
ranks finish a block for the same target at the same step), and signals that peer as soon as its block is
ready. Its own rows come last. In a group of two, they are one ``addmm`` whose addend is the peer's partial
product of them, read in place from the peer's memory (:func:`shmem.peer_tensor`): this rank's own partial
product never goes through memory and the sum needs no pass of its own, which is where the fusion saves time
on the host device. In larger groups, each rank computes its own partial product too and reduces its rows
straight from every rank's scratch with the runtime's reduction. Either way float16/bfloat16 accumulate in
float32 and round once, and a rank starts on its rows as soon as its peers' signals say they are ready, not
after a barrier behind everyone's whole matmul.

Signals need no resetting: each rank zeroes its own entries of ``signal`` on entry, before the op's first sync
(nobody writes into a peer before that sync, and every write of the previous call into this rank landed
before this rank returned from it). That first sync publishes the heap offsets of the symmetric tensors and
the shapes, so a mismatch between ranks raises the same ``ValueError`` on every rank before any data moves.
The op's own calls of the team run with the roles "fused_gather" and "fused_scatter": they never pair with another
rank's plain collective. A check of this rank's that fails (a tensor outside the heap, an overlap, a bad block) is
refused through the team: every rank raises it.
"""

from __future__ import annotations

import os
import weakref
from typing import Optional

import torch

import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.multicore.errors import ShmemStateError, ShmemTypeError, ShmemValueError, type_name
from hyper_parallel.core.symmetric_memory import checks
from hyper_parallel.platform.torch import collectives, context, groups
from hyper_parallel.platform.torch.context import heap_offset, is_symmetric


# The automatic block: about this many blocks per rank (enough to overlap the first block's transfer with the
# local matmul and the later ones with the peers' matmuls, few enough that each put and signal is worth it)...
_AUTO_BLOCKS_PER_RANK = 4
# ...but no block under this many bytes of `a`: below it the per-block costs (a put and a signal per peer, a
# wait and a matmul call) outweigh what the overlap gains. Nor fewer rows than `b` has columns: every block's matmul
# streams all of `b` again, which costs (relative to the block's matmul) about 1/rows, while the communication it
# could hide costs about 1/columns. docs/perf.md ("The fused ops' blocks") has the measurements behind both.
_MIN_AUTO_BLOCK_BYTES = 1 << 20

# One communication stream per group's team, created on first use and kept (a stream is a worker thread:
# creating one per call would cost more than a small op). Keyed weakly: a team dropped by shutdown() takes its
# stream with it.
_comm_streams: "weakref.WeakKeyDictionary[shmem.Team, shmem.Stream]" = weakref.WeakKeyDictionary()
_is_compiling = torch.compiler.is_compiling
# The fused ops' ranges in torch.profiler's traces, named as the binding names the collectives' (call_support.h).
_RANGE_PREFIX = "hyper_parallel_shmem::"
_plain_eager = shmem.plain_eager


# Whether all_gather_matmul pushes on its communication stream: None decides by the cores (below); tests set it.
_push_on_stream: Optional[bool] = None


def _ops():
    return torch.ops.hyper_parallel_shmem


def _peers(team: shmem.Team) -> tuple:
    """The team's other ranks in rotated order (me+1, me+2, ...): no two ranks start by writing to the same peer."""
    return tuple((team.rank + r) % team.size for r in range(1, team.size))


def _comm_stream(team: shmem.Team) -> Optional[shmem.Stream]:
    """The team's communication stream, or None when the calling thread should issue the pushes itself.

    A stream runs its pushes beside the matmuls only if a core is free for it. Where the machine's local ranks
    and their torch threads already fill the cores, its worker would take turns with the matmul on the same
    core, evicting the matmul's cache, and a peer would wait for a push until the worker got its turn: there the
    calling thread pushes each block itself right before multiplying it (docs/perf.md, "The fused ops' blocks").
    """
    on_stream = _push_on_stream
    if on_stream is None:
        local_ranks = len(shmem.debug_state()["root_ranks"])
        on_stream = _cores() > local_ranks * torch.get_num_threads()
    if not on_stream:
        return None
    stream = _comm_streams.get(team)
    if stream is None:
        stream = shmem.Stream()
        _comm_streams[team] = stream
    return stream


def _cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# --------------------------------------------------------------------------
# Argument checks.
# --------------------------------------------------------------------------


def _symmetric(t: torch.Tensor, name: str) -> None:
    """Raises ValueError unless ``t`` lies in the symmetric heap (an empty tensor needs not: nobody addresses it)."""
    if t.numel():
        checks.require_symmetric(is_symmetric(t, name), name, context.address(t, name))


def _signal(signal: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` entries of a checked signal (an int32/int64 tensor of at least ``n``), which must be
    symmetric."""
    _symmetric(signal, "signal")
    return signal.view(-1)[:n]


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory of two contiguous tensors overlaps."""
    a_lo, b_lo = a.data_ptr(), b.data_ptr()
    a_hi = a_lo + a.numel() * a.element_size()
    b_hi = b_lo + b.numel() * b.element_size()
    return a_lo < b_hi and b_lo < a_hi and a.numel() > 0 and b.numel() > 0


def _required(value: Optional[torch.Tensor], name: str) -> None:
    """The pipelines write ``c`` and ``signal``: on torch they are tensors (MindSpore's unpipelined path takes
    None)."""
    if value is None:
        raise ShmemTypeError(f"`{name}` must be a torch.Tensor, but got NoneType")


def _disjoint(t: torch.Tensor, name: str, others: dict) -> None:
    for other_name, other in others.items():
        if _overlaps(t, other):
            raise ShmemValueError(f"`{name}` must not overlap `{other_name}`, but got an overlap at byte "
                                  f"{t.data_ptr() - other.data_ptr()} of `{other_name}`")


def _block_rows(block_size: object, m: int, row_bytes: int, columns: int) -> int:
    """The rows per block: ``block_size``, or for None about a quarter of ``m``, but at least 1 MiB of rows and at
    least ``columns`` (``b``'s) rows.

    Raises:
        TypeError: ``block_size`` is neither None nor an int.
        ValueError: ``block_size`` is not positive.
    """
    if block_size is None:
        at_least = max(-(-_MIN_AUTO_BLOCK_BYTES // max(row_bytes, 1)), columns)
        return max(1, -(-m // _AUTO_BLOCKS_PER_RANK), at_least)
    if isinstance(block_size, bool) or not isinstance(block_size, int):
        raise ShmemTypeError(f"`block_size` must be a positive int or None, but got {type_name(block_size)}")
    if block_size <= 0:
        raise ShmemValueError(f"`block_size` must be a positive int or None, but got {block_size}")
    return block_size


def _agree(rows: list, names: list) -> None:
    """Raises the same ValueError on every rank unless every rank published the same values.

    ``rows[i]`` holds group rank i's published values; ``names[j]`` names column j. The first two columns are the
    heap offsets of the op's two symmetric tensors, the rest are sizes.
    """
    for column, name in enumerate(names):
        values = [row[column] for row in rows]
        if len(set(values)) == 1:
            continue
        if column < 2:
            offsets = ", ".join("ordinary" if v < 0 else hex(v) for v in values)
            raise ShmemValueError(f"`{name}` must be the same symmetric tensor on every rank of the group, but got "
                                  f"heap offsets [{offsets}] by group rank")
        raise ShmemValueError(f"`{name}` must be the same on every rank of the group, but got {values} by group rank")


def _entry(team: shmem.Team, collective: str, signal: torch.Tensor, values: list, names: list, role: str) -> None:
    """Zeroes this rank's signal entries, then publishes ``values`` (the team's fingerprinted sync of
    ``collective``, with the op's ``role``) and checks they agree.

    The zeroing comes first: after the sync peers may raise this rank's signals.
    """
    me = team.pes[team.rank]
    for i in range(team.size):
        shmem.signal(signal[i:i + 1], 0, me)
    _agree(team.agree(collective, values, role=role), names)


# --------------------------------------------------------------------------
# all-gather + matmul.
# --------------------------------------------------------------------------


def all_gather_matmul(a: torch.Tensor, b: torch.Tensor, c: Optional[torch.Tensor], gather_out: torch.Tensor,
                      signal: Optional[torch.Tensor], block_size: Optional[int], group: Optional[dist.ProcessGroup],
                      dims: tuple) -> tuple:
    """``fused_all_gather_matmul`` on checked shapes and signal (``dims``: m, k and b's columns): ``c`` and
    ``signal`` are required here (the pipeline writes into them), then the block, and the pipeline (through its
    operator where autograd or torch.compile needs it)."""
    m, k, columns = dims
    try:
        _required(c, "c")
        _required(signal, "signal")
        block = _block_rows(block_size, m, k * a.element_size(), columns)
    except (ValueError, TypeError) as error:
        collectives.refuse(group, "fused_all_gather_matmul", error)
    if _is_compiling() or not _plain_eager(a, b):
        _ops().fused_all_gather_matmul_(a, b, c, gather_out, signal, block, groups.name(group))
    else:
        _placed_all_gather_matmul(a, b, c, gather_out, signal, block, context.team(group))
    return gather_out, c


def _all_gather_matmul_op(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, gather_out: torch.Tensor,
                          signal: torch.Tensor, block_size: int, group_name: str) -> None:
    """The operator ``fused_all_gather_matmul_``."""
    _placed_all_gather_matmul(a, b, c, gather_out, signal, block_size, context.team(groups.resolve(group_name)))


def _placed_all_gather_matmul(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, gather_out: torch.Tensor,
                              signal: torch.Tensor, block: int, team: shmem.Team) -> None:
    """The placement checks (refused through the team), then :func:`_all_gather_matmul`."""
    with torch.profiler.record_function(_RANGE_PREFIX + "fused_all_gather_matmul"):
        try:
            sig = _signal(signal, team.size)
            _check_all_gather_matmul_placement(a, b, c, gather_out, sig, team.rank)
        except (ValueError, ShmemStateError) as error:
            team.refuse("fused_all_gather_matmul", error)
        _all_gather_matmul(a, b, c, gather_out, sig, block, team)


def _check_all_gather_matmul_placement(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, gather_out: torch.Tensor,
                                       signal: torch.Tensor, me: int) -> None:
    """Raises ValueError unless ``gather_out`` (and ``signal``, checked by :func:`_signal`) lie in the symmetric
    heap and no two tensors overlap, except ``a`` being group rank ``me``'s rows of ``gather_out``; ShmemStateError
    for a freed one."""
    for t, name in ((a, "a"), (b, "b"), (c, "c")):
        context.address(t, name)
    _symmetric(gather_out, "gather_out")
    m = a.shape[0]
    own_rows = gather_out[me * m:(me + 1) * m]
    if _overlaps(a, gather_out) and a.data_ptr() != own_rows.data_ptr():
        raise ShmemValueError("`a` must be this rank's rows of `gather_out` or not overlap it, but got an overlap at "
                              f"byte {a.data_ptr() - gather_out.data_ptr()} of `gather_out`")
    _disjoint(c, "c", {"a": a, "b": b, "gather_out": gather_out, "signal": signal})
    _disjoint(gather_out, "gather_out", {"b": b, "signal": signal})
    _disjoint(signal, "signal", {"a": a, "b": b})


def _all_gather_matmul(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, gather_out: torch.Tensor,
                       signal: torch.Tensor, block: int, team: shmem.Team) -> None:
    """all_gather_matmul on checked arguments (``block``: rows per block)."""
    n, me = team.size, team.rank
    m, k = a.shape
    signal = signal.view(-1)
    own = slice(me * m, (me + 1) * m)
    context.flush_for_host_read()  # the matmuls are torch ops on this thread: earlier SHMEM work must be done
    if team.spans_nodes:
        # Peers on other nodes are out of one-sided reach: the team's hierarchical all_gather, then one matmul.
        team.all_gather(gather_out, a.contiguous(), role="fused_gather")
        torch.mm(gather_out.view(n * m, k), b, out=c)
        return
    with shmem.stream(None):
        if n > 1:
            _entry(team, "fused_all_gather_matmul", signal,
                   [heap_offset(gather_out), heap_offset(signal), m, k, b.shape[1]],
                   ["gather_out", "signal", "a.shape[0]", "a.shape[1]", "b.shape[1]"], "fused_gather")
        blocks = [(lo, min(lo + block, m)) for lo in range(0, m, block)]
        copy_own = m > 0 and gather_out[own].data_ptr() != a.data_ptr()  # (not when `a` is its own rows already)
        comm = _comm_stream(team) if n > 1 else None
        if comm is not None:
            with comm:
                for index, (lo, hi) in enumerate(blocks):
                    _push_block(a, gather_out, signal, index, lo, hi, team)
                if copy_own:
                    shmem.put(gather_out[own], a, team.pes[me])
        try:
            for index, (lo, hi) in enumerate(blocks):  # own rows straight from `a`, while peers' rows travel
                if comm is None:
                    _push_block(a, gather_out, signal, index, lo, hi, team)
                    if copy_own:
                        gather_out[me * m + lo:me * m + hi].copy_(a[lo:hi])
                torch.mm(a[lo:hi], b, out=c[me * m + lo:me * m + hi])  # `a[lo:hi]` is still in cache from the push
            for r in range(1, n):  # peers in arrival order: rank me - 1 pushes to this rank first
                src = (me - r) % n
                for index, (lo, hi) in enumerate(blocks):
                    shmem.wait_signal(signal[src:src + 1], index + 1, cmp="ge")
                    rows = slice(src * m + lo, src * m + hi)
                    torch.mm(gather_out[rows], b, out=c[rows])
        finally:
            if comm is not None:
                comm.synchronize()  # `a` may be reused once this returns; errors of the pushes surface here


def _push_block(a: torch.Tensor, gather_out: torch.Tensor, signal: torch.Tensor, index: int, lo: int, hi: int,
                team: shmem.Team) -> None:
    """Puts rows ``lo:hi`` of ``a`` into every peer's ``gather_out``, each followed by the signal that block
    ``index`` has landed (put and signal are ordered on one stream: the data is visible first)."""
    me = team.rank
    rows = gather_out[me * a.shape[0] + lo:me * a.shape[0] + hi]
    for p in _peers(team):
        shmem.put(rows, a[lo:hi], team.pes[p])
        shmem.signal(signal[me:me + 1], index + 1, team.pes[p])


# --------------------------------------------------------------------------
# matmul + reduce-scatter.
# --------------------------------------------------------------------------


def matmul_reduce_scatter(x1: torch.Tensor, x2: torch.Tensor, symm_tensor: torch.Tensor,
                          signal: Optional[torch.Tensor], reduce_op: str, group: Optional[dist.ProcessGroup],
                          dims: tuple) -> torch.Tensor:
    """``fused_matmul_reduce_scatter`` on checked shapes and signal (``signal`` is required here), through its
    operator where autograd or torch.compile needs it."""
    del dims   # the pipeline reads the shapes again (the operator's fake kernel too)
    try:
        _required(signal, "signal")
    except TypeError as error:
        collectives.refuse(group, "fused_matmul_reduce_scatter", error)
    if _is_compiling() or not _plain_eager(x1, x2):
        return _ops().fused_matmul_reduce_scatter(x1, x2, symm_tensor, signal, reduce_op, groups.name(group))
    return _placed_matmul_reduce_scatter(x1, x2, symm_tensor, signal, reduce_op, context.team(group))


def _matmul_reduce_scatter_op(x1: torch.Tensor, x2: torch.Tensor, symm_tensor: torch.Tensor, signal: torch.Tensor,
                              reduce_op: str, group_name: str) -> torch.Tensor:
    """The operator ``fused_matmul_reduce_scatter``."""
    return _placed_matmul_reduce_scatter(x1, x2, symm_tensor, signal, reduce_op,
                                         context.team(groups.resolve(group_name)))


def _placed_matmul_reduce_scatter(x1: torch.Tensor, x2: torch.Tensor, symm_tensor: torch.Tensor,
                                  signal: torch.Tensor, reduce_op: str, team: shmem.Team) -> torch.Tensor:
    """The placement checks (refused through the team), then :func:`_matmul_reduce_scatter`."""
    with torch.profiler.record_function(_RANGE_PREFIX + "fused_matmul_reduce_scatter"):
        try:
            sig = _signal(signal, team.size)
            _check_matmul_reduce_scatter_placement(x1, x2, symm_tensor, sig)
        except (ValueError, ShmemStateError) as error:
            team.refuse("fused_matmul_reduce_scatter", error)
        return _matmul_reduce_scatter(x1, x2, symm_tensor, sig, reduce_op, team)


def _check_matmul_reduce_scatter_placement(x1: torch.Tensor, x2: torch.Tensor, symm_tensor: torch.Tensor,
                                           signal: torch.Tensor) -> None:
    """Raises ValueError unless ``symm_tensor`` (and ``signal``, checked by :func:`_signal`) lie in the symmetric
    heap and overlap neither each other nor the inputs; ShmemStateError for a freed one."""
    for t, name in ((x1, "x1"), (x2, "x2")):
        context.address(t, name)
    _symmetric(symm_tensor, "symm_tensor")
    _disjoint(symm_tensor, "symm_tensor", {"x1": x1, "x2": x2, "signal": signal})
    _disjoint(signal, "signal", {"x1": x1, "x2": x2})


def _matmul_reduce_scatter(x1: torch.Tensor, x2: torch.Tensor, symm_tensor: torch.Tensor, signal: torch.Tensor,
                           reduce_op: str, team: shmem.Team) -> torch.Tensor:
    """matmul_reduce_scatter on checked arguments; returns the new (M / size, N) result."""
    n, me = team.size, team.rank
    rows, k = x1.shape
    columns = x2.shape[1]
    signal = signal.view(-1)
    m = rows // n
    result = torch.empty((m, columns), dtype=x1.dtype, device=x1.device)
    context.flush_for_host_read()  # the matmuls are torch ops on this thread: earlier SHMEM work must be done
    if team.spans_nodes:
        # Peers on other nodes are out of one-sided reach: one matmul, then the team's hierarchical reduce_scatter.
        product = symm_tensor.view(rows, columns)
        torch.mm(x1, x2, out=product)
        team.reduce_scatter(result, product, reduce_op, role="fused_scatter")
        return result
    with shmem.stream(None):
        if n == 1:
            torch.mm(x1, x2, out=result)  # the sum or average of one product is the product
            return result
        _entry(team, "fused_matmul_reduce_scatter", signal,
               [heap_offset(symm_tensor), heap_offset(signal), rows, k, columns],
               ["symm_tensor", "signal", "x1.shape[0]", "x1.shape[1]", "x2.shape[1]"], "fused_scatter")
        partial = symm_tensor.view(rows, columns)
        for r in range(1, n):  # rotated: no two ranks finish a block for the same target at the same step
            target = (me + r) % n
            block = slice(target * m, (target + 1) * m)
            torch.mm(x1[block], x2, out=partial[block])
            shmem.signal(signal[me:me + 1], 1, team.pes[target])  # "your rows are ready in my memory"
        mine = slice(me * m, (me + 1) * m)
        if n == 2:
            # The peer's partial product of these rows is the matmul's addend, read in place from its memory: this
            # rank's own product never goes through memory, and the sum costs no pass of its own.
            peer = 1 - me
            shmem.wait_signal(signal[peer:peer + 1], 1, cmp="ge")
            if result.numel():
                scale = 0.5 if reduce_op == "avg" else 1.0
                torch.addmm(shmem.peer_tensor(partial[mine], team.pes[peer]), x1[mine], x2, beta=scale, alpha=scale,
                            out=result)
        else:
            torch.mm(x1[mine], x2, out=partial[mine])
            for s in _peers(team):
                shmem.wait_signal(signal[s:s + 1], 1, cmp="ge")
            if result.numel():
                shmem.reduce(result.view(-1), partial[mine].reshape(-1), team.pes, op=reduce_op)
        team.barrier("fused_scatter")  # peers are done reading this rank's partial products before it returns
    return result
