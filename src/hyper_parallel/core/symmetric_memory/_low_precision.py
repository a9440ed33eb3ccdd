"""Low-precision communication with high-precision accumulation (seed 004 §1.5.2).

``shmem_allreduce`` and ``shmem_reduce_scatter`` take ``low_precision_dtype``: float16, bfloat16,
float8_e4m3fn or float8_e5m2 (a ``torch.dtype`` or its name). Every value a rank sends is cast down to it
before it travels, and the receiver accumulates in the tensor's own precision (float32 at least: float16 and
bfloat16 tensors accumulate in float32).

**Which calls it applies to.** ``SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE`` (a name above; empty or ``none``: off)
sets the default of every call (read once per runtime lifecycle, when the first call after ``symm.empty`` or a
collective acquired the runtime needs it, like the heap size; every rank must set the same); a call's argument
overrides it, and ``low_precision_dtype="none"`` turns it off
for one call. The default applies silently where it can: 'sum' and 'avg' of a floating-point tensor whose dtype
is wider than the low dtype (float32 and float64 with any of them; float16 and bfloat16 with the fp8 ones).
Everything else (max/min, integers, a float16 tensor with a bfloat16 default) runs in full precision. An
*explicit* argument that cannot apply is an error (``ValueError``: "`low_precision_dtype` must be ..., but got
..."), as is an unknown name or dtype (``ValueError``; ``TypeError`` for a value that is neither a dtype nor a
string); the environment variable's value is checked the same way, when a call first needs it. All of it is
checked before anything is written.

**Algorithm.** Both collectives run through the group's staging area, in pieces: a piece uses one half of the
area (alternating, like the one-step full-precision path, so that no closing sync is needed), cut into one
*slot* per group rank.

* all_reduce, two-shot (two syncs per piece): (1) each rank casts the parts of the piece that other ranks own
  into its slots for them; sync; (2) the owner of each part adds every peer's decoded slot of it to its own part
  (kept in full precision), divides by n for 'avg', casts the result *once* into its own slot and decodes that
  slot into its tensor; sync; (3) every rank decodes each peer's reduced part with the same code, so every rank
  ends with bit-identical values.
* all_reduce of a message up to 256 KiB (at most half the staging area) that fits one slot, one step: each rank
  casts its whole tensor into its slot; sync; every rank decodes every rank's slot and adds them in group-rank
  order (the same values in the same order everywhere: bit-identical). Every value is cast once.
* reduce_scatter (one sync per piece): each rank casts every part but its own into its slot for that part's
  owner; sync; the owner adds the decoded slots of every peer to its own part, in full precision, and divides
  by n for 'avg'. The result keeps the accumulator's precision (rounded once into a float16/bfloat16 output).

Each owner's step is one call of the host codec's ``reduce_encoded``, which decodes, sums, divides and re-encodes a
128-element block at a time in L1, reading the peers' slots in place, straight from their memory
(:func:`shmem.peer_tensor`), never through a copy.

**Wire format of a slot** (``m`` elements of the low dtype, ``m`` at most the slot's capacity): for the fp8
dtypes, first one float32 scale per block of :data:`BLOCK` (128) elements, padded to 64 bytes, then the ``m``
fp8 bytes; element ``i`` is ``fp8[i] * scale[i // 128]``. The scale of a block is the power of two ``2**e``
closest above ``absmax / fp8_max`` (fp8_max: 448 for e4m3fn, 57344 for e5m2; e clamped to at least -126), so
that scaling is exact and nothing overflows. A block holding inf or NaN (or, for e4m3fn, a value of magnitude
at least ``448 * 2**119``) gets a NaN scale: the whole block arrives as NaN. float16 and bfloat16 slots are the
plain cast: float16 saturates to inf beyond 65504 like ``Tensor.half()``. Blocks are aligned 128-element windows
of the flattened tensor (all_reduce) or of the output (reduce_scatter).

**Error bound** (what the tests assert, element by element, on random data). With n the group size, ``x_i`` the
inputs, ``S = sum(x_i)`` and ``A = sum(|x_i|)`` (both divided by n for 'avg'), ``M`` the largest ``A`` in the
element's block, and the result ``r``::

    two-shot all_reduce:                |r - S| <= (2u + u**2 + 2n * 2**-23 + 2u_t) * A + 2n * tau(M) + tau_t
    reduce_scatter, one-step all_reduce: |r - S| <= (u + 2n * 2**-23 + 2u_t) * A + 2n * tau(M) + tau_t

``u`` is the unit roundoff of the low dtype (float16 2**-11, bfloat16 2**-8, float8_e4m3fn 2**-4,
float8_e5m2 2**-3) and ``tau`` its underflow term per cast: float16 ``2**-25``, bfloat16 ``2**-134``,
float8_e4m3fn ``2**-9 / 448 * M + 2**-136``, float8_e5m2 ``2**-16 / 57344 * M + 2**-143`` (half the smallest
subnormal, times the block's scale). ``u_t, tau_t`` are those of the tensor's own dtype when it is float16 or
bfloat16 (its final rounding), 0 for float32 and float64. Where it comes from: every value is cast down once on
its way to the owner (``|error| <= u*|x_i| + tau``), the sum runs in float32 or float64 (n - 1 additions: the
``2**-23`` terms, which also cover a float64 value's double rounding through float32 in torch's casts), and the
two-shot all_reduce casts the reduced value down once more for the way back (the second ``u``, and ``u**2`` for
the first error carried into it). Non-finite inputs, float16 overflow and the NaN blocks above are outside the
bound. :func:`error_bound` computes it.

**Speed.** Everything runs on the calling thread, a piece at a time (it stays in cache), in the host codec
(:mod:`hyper_parallel.core.multicore.shmem.codec`: vectorised C++, bit-identical to torch's casts on the same
definition): one pass to encode, one for the owner's decode-sum-re-encode step, one per peer to decode. The codec
writes the slots with non-temporal stores, so that a peer on another die reads them from memory instead of pulling
each line out of this core's cache. On the host device, whose "link" is the same memory the casts read and write,
it pays for tensors outside symmetric memory, whose full-precision call copies them through the staging area
anyway: 64 MiB float32 on 2 ranks of a 2-core VM, reduce_scatter 1.2-1.3x faster, all_reduce 1.0-1.2x, about 3x
when the two cores sit on different dies. It does not beat the copy-free full-precision path of a symmetric tensor
(0.4-0.9x for all_reduce). ``docs/perf.md`` has the measurements (``hp-shmem-perf --low-precision DTYPE
[--ordinary-tensors]``). On a non-default SHMEM stream the op waits for the stream at each step, since the casts run
on the host thread.

The group's ranks must agree on the dtype (the argument, or the environment variable), like on ``op``.
"""

from __future__ import annotations

import os
import weakref
from typing import Optional

import torch

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.multicore.shmem import codec as wire
from hyper_parallel.core.multicore.shmem.errors import ShmemStateError
from hyper_parallel.core.symmetric_memory import _context
from hyper_parallel.core.symmetric_memory._context import GroupChannel, flush_for_host_read

ENV_VAR = "SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE"

LOW_PRECISION_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
# Names that turn low precision off (the environment variable's, or a call's override of it).
_OFF = ("", "none")
# Elements per fp8 scale (the host codec's block).
BLOCK = wire.BLOCK
# The dtypes that travel with block scales (the others are a plain cast).
_SCALED = (torch.float8_e4m3fn, torch.float8_e5m2)
_ALIGN = 64
_SUM_OPS = ("sum", "avg")


def _names() -> str:
    return ", ".join(LOW_PRECISION_DTYPES)


def _parse(value: object, what: str) -> Optional[torch.dtype]:
    """A low-precision dtype from a dtype or its name; None for an off name ("none", "").

    Raises:
        TypeError: neither a dtype nor a string.
        ValueError: a dtype or name outside :data:`LOW_PRECISION_DTYPES`.
    """
    if isinstance(value, torch.dtype):
        if value in LOW_PRECISION_DTYPES.values():
            return value
        raise ValueError(f"`{what}` must be one of {_names()}, but got {value}")
    if isinstance(value, str):
        name = value.strip().lower()
        if name in _OFF:
            return None
        dtype = LOW_PRECISION_DTYPES.get(name.removeprefix("torch."))
        if dtype is None:
            raise ValueError(f"`{what}` must be one of {_names()} or 'none', but got {value!r}")
        return dtype
    raise TypeError(f"`{what}` must be a torch.dtype, its name or None, but got {type(value).__name__}")


def _applies(low: torch.dtype, dtype: torch.dtype, op: str) -> Optional[str]:
    """Why ``low`` cannot carry a reduction of ``dtype`` with ``op`` (a rule for the message), or None."""
    if op not in _SUM_OPS:
        return f"None for op {op!r} (low precision applies to 'sum' and 'avg')"
    if not dtype.is_floating_point:
        return f"None for the integer dtype {dtype} (low precision applies to floating-point tensors)"
    if low.itemsize >= dtype.itemsize:
        return f"narrower than the tensor's dtype {dtype} ({dtype.itemsize} bytes)"
    return None


# The environment's default, parsed, and the runtime lifecycle it was read in (a weak reference to the API's
# state): reading os.environ costs about a microsecond, a third of a small all-reduce.
_default_cache: list = [None, None]


def _default() -> Optional[torch.dtype]:
    """:data:`ENV_VAR`'s dtype (None: off), read once per runtime lifecycle (again before one is acquired).

    Raises:
        ValueError: an unknown name (not cached: every call that needs the default raises).
    """
    state = _context.active()
    if state is not None and _default_cache[0] is not None and _default_cache[0]() is state:
        return _default_cache[1]
    text = os.environ.get(ENV_VAR)
    low = _parse(text, ENV_VAR) if text else None
    if state is not None:
        _default_cache[:] = [weakref.ref(state), low]
    return low


def resolve(value: Optional[object], dtype: torch.dtype, op: str) -> Optional[torch.dtype]:
    """The dtype a reduction of ``dtype`` with ``op`` travels in, or None for full precision.

    Args:
        value: the call's ``low_precision_dtype``: a dtype of :data:`LOW_PRECISION_DTYPES`, its name, ``"none"``
            (full precision whatever the environment says), or None (the default of :data:`ENV_VAR`).
        dtype: the tensor's dtype.
        op: the checked reduction ('sum', 'avg', 'max' or 'min').

    Returns:
        The low-precision dtype, or None. The environment's default is None where it cannot apply.

    Raises:
        TypeError: ``value`` is neither a dtype nor a string.
        ValueError: an unknown dtype or name (the call's or the environment's), or an explicit ``value`` that
            cannot apply to ``dtype`` and ``op``.
    """
    if value is None:
        low = _default()
        return low if low is not None and _applies(low, dtype, op) is None else None
    low = _parse(value, "low_precision_dtype")
    if low is None:
        return None
    rule = _applies(low, dtype, op)
    if rule is not None:
        raise ValueError(f"`low_precision_dtype` must be {rule}, but got {low}")
    return low


# The bound's constants (module docstring): unit roundoff and the underflow term per cast, of each low dtype and
# of the 16-bit tensor dtypes' own final rounding.
_UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float8_e4m3fn: 2.0**-4,
                  torch.float8_e5m2: 2.0**-3}
_UNDERFLOW = {torch.float16: (0.0, 2.0**-25), torch.bfloat16: (0.0, 2.0**-134),  # (times M, absolute)
              torch.float8_e4m3fn: (2.0**-9 / 448, 2.0**-136), torch.float8_e5m2: (2.0**-16 / 57344, 2.0**-143)}
_ACCUMULATION = 2.0**-23


def error_bound(low: torch.dtype, dtype: torch.dtype, op: str, n: int, abs_sum: torch.Tensor,
                two_shot: bool = True) -> torch.Tensor:
    """The documented bound on ``|result - exact|`` of each element (module docstring).

    Args:
        low: the low-precision dtype.
        dtype: the tensor's dtype.
        op: 'sum' or 'avg'.
        n: the group size.
        abs_sum: ``sum(|x_i|)`` over the ranks' inputs, element by element (flat, in the result's layout: the
            all-reduced tensor, or this rank's reduce_scatter output); float64 is best.
        two_shot: the two-shot all_reduce's bound (two casts), else reduce_scatter's and the one-step
            all_reduce's (one cast).

    Returns:
        The bound of each element, in ``abs_sum``'s dtype.

    Raises:
        ValueError: ``low`` or ``op`` outside what low precision supports.
    """
    if low not in _UNIT_ROUNDOFF:
        raise ValueError(f"`low` must be one of {_names()}, but got {low}")
    if op not in _SUM_OPS:
        raise ValueError(f"`op` must be 'sum' or 'avg', but got {op!r}")
    a = abs_sum.reshape(-1) / n if op == "avg" else abs_sum.reshape(-1)
    count = a.numel()
    padded = a.new_zeros(_round_up(count, BLOCK))
    padded[:count] = a
    block_max = padded.view(-1, BLOCK).amax(1).repeat_interleave(BLOCK)[:count]
    u = _UNIT_ROUNDOFF[low]
    narrow = dtype in (torch.float16, torch.bfloat16)  # rounded once more into the tensor
    u_t, tau_t = (_UNIT_ROUNDOFF[dtype], _UNDERFLOW[dtype][1]) if narrow else (0.0, 0.0)
    relative, absolute = _UNDERFLOW[low]
    coefficient = (2 * u + u * u if two_shot else u) + 2 * n * _ACCUMULATION + 2 * u_t
    return coefficient * a + 2 * n * (relative * block_max + absolute) + tau_t


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


class _Codec:
    """Encodes values into a slot and names a slot's encoded run, for one (group, low dtype).

    A slot is a uint8 tensor: for fp8, ``scale_bytes`` of float32 block scales then the fp8 bytes; for float16 and
    bfloat16, the 16-bit codes. The host codec (:mod:`hyper_parallel.core.multicore.shmem.codec`) encodes,
    decodes, and sums (``reduce_encoded``).
    """

    def __init__(self, low: torch.dtype, slot_bytes: int) -> None:
        self.low = low
        self.itemsize = low.itemsize
        self.scaled = low in _SCALED
        if self.scaled:
            # The most elements (a whole number of blocks) whose scales and bytes fit the slot.
            capacity = int(slot_bytes // (self.itemsize + 4 / BLOCK)) // BLOCK * BLOCK
            while capacity and _round_up(capacity // BLOCK * 4, _ALIGN) + capacity * self.itemsize > slot_bytes:
                capacity -= BLOCK
            self.scale_bytes = _round_up(capacity // BLOCK * 4, _ALIGN)
        else:
            capacity = slot_bytes // self.itemsize // BLOCK * BLOCK
            self.scale_bytes = 0
        self.capacity = capacity
        self.slot_bytes = slot_bytes
        self.slots: list = []  # [parity][group rank]: views of the group's staging halves, set by _codec
        self.peer_slots: list = []  # [parity][group rank][peer]: every peer's copy of them, set by _codec

    def run(self, slot: torch.Tensor, count: int) -> wire.EncodedRun:
        """The first ``count`` values of a slot as an encoded run: (its scales, or None for 16-bit; its codes)."""
        codes = slot[self.scale_bytes:self.scale_bytes + count * self.itemsize].view(self.low)
        return (slot[:wire.scale_count(count) * 4].view(torch.float32) if self.scaled else None), codes

    def encode(self, values: torch.Tensor, slot: torch.Tensor) -> None:
        """Casts ``values`` (at most ``capacity``) down into ``slot``, for the peers to read."""
        wire.encode(values, self.run(slot, values.numel()))

    def decode(self, slot: torch.Tensor, out: torch.Tensor) -> None:
        """Decodes ``out.numel()`` elements of ``slot`` into ``out``."""
        wire.decode(self.run(slot, out.numel()), out, accumulate=False)


# Codecs per group channel (dropped with it) and (low dtype, slot bytes).
_codecs: "weakref.WeakKeyDictionary[GroupChannel, dict]" = weakref.WeakKeyDictionary()


def _codec(ch: GroupChannel, low: torch.dtype) -> _Codec:
    """The channel's codec for ``low``: one slot per group rank in half the staging.

    Raises:
        ShmemStateError: a slot cannot hold one block (a staging area too small for the group).
    """
    slot_bytes = ch.staging.numel() // 2 // ch.size // _ALIGN * _ALIGN
    key = (low, slot_bytes)
    codecs = _codecs.setdefault(ch, {})
    codec = codecs.get(key)
    if codec is None:
        codec = _Codec(low, slot_bytes)
        if codec.capacity == 0:
            raise ShmemStateError(f"the staging area is too small for low-precision communication: "
                                  f"staging_bytes={ch.staging.numel()} group_size={ch.size} dtype={low}")
        half = ch.staging.numel() // 2
        # The slots' views, made once: slicing costs about a microsecond, as much as a small message's cast.
        codec.slots = [[ch.staging[parity * half + index * slot_bytes:][:slot_bytes] for index in range(ch.size)]
                       for parity in (0, 1)]
        # And every peer's copy of them, which the decoders read in place (no copy into this rank first).
        codec.peer_slots = [[[ch.peer_staging(peer)[parity * half + index * slot_bytes:][:slot_bytes]
                              for peer in range(ch.size)] for index in range(ch.size)] for parity in (0, 1)]
        codecs[key] = codec
    return codec


def _slot(ch: GroupChannel, parity: int, index: int, codec: _Codec) -> torch.Tensor:
    """Slot ``index`` of the staging half ``parity`` (a symmetric uint8 view)."""
    return codec.slots[parity][index]


def _peer_slot(codec: _Codec, parity: int, index: int, peer: int) -> torch.Tensor:
    """Slot ``index`` of ``peer``'s staging half ``parity``, read in place from the peer's memory (a sync after
    the peer wrote it orders the reads)."""
    return codec.peer_slots[parity][index][peer]


def all_reduce(t: torch.Tensor, op: str, ch: GroupChannel, precision: torch.dtype) -> None:
    """all_reduce of ``t`` in place ('sum' or 'avg'), travelling in ``precision`` (collective over ``ch``).

    One step in groups of two and for messages up to the one-step size, two-shot otherwise (module docstring).

    Args:
        t: a contiguous floating-point tensor wider than ``precision``, at least one element.
        op: 'sum' or 'avg'.
        ch: the group's channel (more than one rank).
        precision: the low-precision dtype (from :func:`resolve`).

    Raises:
        ShmemStateError: the staging area is too small for the group.
        ShmemTimeoutError: a rank did not take part in time.
    """
    flat = t.view(-1)
    codec = _codec(ch, precision)
    _open(ch, "all_reduce", t.dtype, flat.numel(), op, precision)
    if t.nbytes <= ch.one_shot_bytes and flat.numel() <= codec.capacity:
        _all_reduce_one_step(flat, op, ch, codec)
    else:
        _all_reduce_two_shot(flat, op, ch, codec)
    ch.sync()  # peers are done with this rank's staging before the group's next call writes it


def _all_reduce_one_step(flat: torch.Tensor, op: str, ch: GroupChannel, codec: _Codec) -> None:
    """Each rank casts a piece once into its own slot; after one sync every rank decodes every rank's slot and
    sums them in group-rank order (so every rank adds the same values in the same order)."""
    count, n, me = flat.numel(), ch.size, ch.me
    for off in range(0, count, codec.capacity):
        length = min(codec.capacity, count - off)
        piece = flat[off:off + length]
        parity = ch.flip()
        mine = _slot(ch, parity, me, codec)
        codec.encode(piece, mine)
        ch.sync()
        flush_for_host_read()
        runs = [codec.run(mine if p == me else _peer_slot(codec, parity, p, p), length) for p in range(n)]
        wire.reduce_encoded(piece, None, runs, op=op)


def _all_reduce_two_shot(flat: torch.Tensor, op: str, ch: GroupChannel, codec: _Codec) -> None:
    """Each part of a piece is reduced by its owner from its own values and the peers' casts of it, cast once more,
    and decoded from those same bytes by every rank, the owner included (one pass of the host codec)."""
    count, n, me = flat.numel(), ch.size, ch.me
    for off in range(0, count, n * codec.capacity):
        length = min(n * codec.capacity, count - off)
        step = _round_up(-(-length // n), BLOCK)  # parts start on block boundaries
        bounds = [(off + min(p * step, length), off + min((p + 1) * step, length)) for p in range(n)]
        parity = ch.flip()
        for q in ch.peers:
            lo, hi = bounds[q]
            if hi > lo:
                codec.encode(flat[lo:hi], _slot(ch, parity, q, codec))
        ch.sync()
        flush_for_host_read()
        lo, hi = bounds[me]
        if hi > lo:
            part = flat[lo:hi]
            sources = [codec.run(_peer_slot(codec, parity, me, p), hi - lo) for p in ch.peers]
            # The bytes every peer decodes, and their decoding in this rank's part: identical results everywhere.
            wire.reduce_encoded(part, part, sources, op=op, reencode=codec.run(_slot(ch, parity, me, codec), hi - lo))
        ch.sync()
        flush_for_host_read()
        for p in ch.peers:
            lo, hi = bounds[p]
            if hi > lo:
                codec.decode(_peer_slot(codec, parity, p, p), flat[lo:hi])


def reduce_scatter(out: torch.Tensor, src: torch.Tensor, op: str, ch: GroupChannel, precision: torch.dtype) -> None:
    """reduce_scatter of ``src`` into ``out`` ('sum' or 'avg'), travelling in ``precision`` (collective).

    Args:
        out: this rank's flat output, at least one element; it may be this rank's part of ``src``.
        src: the flat input, group-size times ``out``'s elements, of ``out``'s dtype.
        op: 'sum' or 'avg'.
        ch: the group's channel.
        precision: the low-precision dtype (from :func:`resolve`).

    Raises:
        ShmemStateError: the staging area is too small for the group.
        ShmemTimeoutError: a rank did not take part in time.
    """
    c, n, me = out.numel(), ch.size, ch.me
    mine = src[me * c:(me + 1) * c]
    if n == 1:  # nothing travels: the sum (or average) of one rank is its input
        if out.data_ptr() != mine.data_ptr():
            out.copy_(mine)
        return
    codec = _codec(ch, precision)
    _open(ch, "reduce_scatter", out.dtype, c, op, precision)
    for off in range(0, c, codec.capacity):
        length = min(codec.capacity, c - off)
        parity = ch.flip()
        for q in ch.peers:
            codec.encode(src[q * c + off:q * c + off + length], _slot(ch, parity, q, codec))
        ch.sync()
        flush_for_host_read()
        sources = [codec.run(_peer_slot(codec, parity, me, p), length) for p in ch.peers]
        wire.reduce_encoded(out[off:off + length], mine[off:off + length], sources, op=op)
    ch.sync()  # peers are done with this rank's staging before the group's next call writes it


def _open(ch: GroupChannel, collective: str, dtype: torch.dtype, count: int, op: str, precision: torch.dtype) -> None:
    """The call's first sync: every rank of the group agrees on the collective, dtype, count, op and wire format
    (a rank in full precision, or in another low dtype, makes every rank raise ShmemMismatchError), and every rank
    has finished the group's previous call, so the staging area is free."""
    flush_for_host_read()  # the host writes the staging next: earlier work of the stream first
    ch.team.agree(collective, dtype=dtype, count=count, op=op, wire=precision)
