"""Low-precision communication with high-precision accumulation: torch's choice of a call's wire format, and the
algorithm and error bound of the runtime's engine that runs it.

``shmem_allreduce`` and ``shmem_reduce_scatter`` take ``low_precision_dtype``: float16, bfloat16,
float8_e4m3fn or float8_e5m2 (a ``torch.dtype`` or its name). Every value a rank sends is cast down to it
before it travels, and the receiver accumulates in the tensor's own precision (float32 at least: float16 and
bfloat16 tensors accumulate in float32).

**Which calls it applies to.** ``SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE`` (a name above; empty or ``none``: off)
sets the default of every call (read by the runtime once per lifecycle, when it starts, like the heap size;
every rank must set the same); a call's argument
overrides it, and ``low_precision_dtype="none"`` turns it off
for one call. The default applies silently where it can: 'sum' and 'avg' of a floating-point tensor whose dtype
is wider than the low dtype (float32 and float64 with any of them; float16 and bfloat16 with the fp8 ones).
Everything else (max/min, integers, a float16 tensor with a bfloat16 default) runs in full precision. An
*explicit* argument that cannot apply is an error (``ValueError``: "`low_precision_dtype` must be ..., but got
..."), as is an unknown name or dtype (``ValueError``; ``TypeError`` for a value that is neither a dtype nor a
string); the environment variable's value is checked by the runtime, with the same message, by every call that
takes the default. All of it is checked before anything is written.

**Algorithm** (the runtime's collective engine, ``ccsrc/runtime/collectives/low_precision.cc``, over the
device's ``Encode``/``Decode``/``ReduceEncoded``: the vectorised host codec on the host device, ``aclnnCast`` on
ascend, which carries float16 and bfloat16 only). Both collectives run through the group's staging area: a call
uses the staging half of its parity, cut into one *slot* per group rank.

* all_reduce, two-shot (two syncs per piece): (1) each rank casts the parts of the piece that other ranks own
  into its slots for them; sync; (2) the owner of each part adds every peer's decoded slot of it to its own part
  (kept in full precision), divides by n for 'avg', casts the result *once* into its own slot and decodes that
  slot into its tensor; sync; (3) every rank decodes each peer's reduced part with the same code, so every rank
  ends with bit-identical values.
* all_reduce up to the one-step size (256 KiB, at most half the staging area) whose values fit the half: each rank
  casts its whole tensor into its half before the call's first sync; after it, every rank decodes every rank's
  codes and adds them in group-rank order (the same values in the same order everywhere: bit-identical). Every
  value is cast once.
* reduce_scatter (one sync per piece, pieces alternating between the halves): each rank casts every part but its
  own into its slot for that part's owner; sync; the owner adds the decoded slots of every peer to its own part,
  in full precision, and divides by n for 'avg'. The result keeps the accumulator's precision (rounded once into a
  float16/bfloat16 output).

Each owner's step is one ``ReduceEncoded`` of the device, which on the host decodes, sums, divides and re-encodes a
128-element block at a time in L1, reading the peers' slots in place, straight from their memory, never through a
copy. A group of one rank runs in full precision (nothing travels).

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

**Speed.** On the host device the codec runs on the calling thread (on a non-default SHMEM stream, on the
stream's worker), a piece at a time (it stays in cache): one pass to encode, one for the owner's
decode-sum-re-encode step, one per peer to decode. The codec writes the slots with non-temporal stores, so that a
peer on another die reads them from memory instead of pulling each line out of this core's cache. On the host
device, whose "link" is the same memory the casts read and write, it pays for tensors outside symmetric memory,
whose full-precision call copies them through the staging area anyway; it does not beat the copy-free
full-precision path of a symmetric tensor. ``docs/perf.md`` has the measurements (``hp-shmem-perf
--low-precision DTYPE [--ordinary-tensors]``).

The group's ranks must agree on the dtype (the argument, or the environment variable), like on ``op``.
"""

from __future__ import annotations

import weakref
from typing import Optional

import torch

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.multicore.errors import ShmemTypeError, ShmemValueError, type_name
from hyper_parallel.core.multicore.shmem import codec
from hyper_parallel.core.symmetric_memory import checks
from hyper_parallel.platform.torch import context, tensors

ENV_VAR = "SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE"

# Keyed by the wire formats' names (checks.LOW_PRECISION_NAMES), which the calls pass down to the runtime face.
LOW_PRECISION_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
# Elements per fp8 scale (the host codec's block).
BLOCK = codec.BLOCK
_SUM_OPS = ("sum", "avg")
# A call's wire when it names none: the environment's default, resolved where the call runs.
DEFAULT = ""
# A call's wire that turns low precision off.
FULL = "none"


def _names() -> str:
    return ", ".join(LOW_PRECISION_DTYPES)


def _parse(value: object, what: str) -> Optional[str]:
    """A low-precision wire format's name from a dtype or its name; None for an off name ("none", "").

    Raises:
        ShmemTypeError: neither a dtype nor a string.
        ShmemValueError: a dtype or name outside :data:`LOW_PRECISION_DTYPES`.
    """
    if isinstance(value, torch.dtype):
        name = str(value).removeprefix("torch.")
        if name in LOW_PRECISION_DTYPES:
            return name
        raise ShmemValueError(f"`{what}` must be one of {_names()}, but got {value}")
    if isinstance(value, str):
        return checks.low_precision_name(value, what)   # the names both frameworks take
    raise ShmemTypeError(f"`{what}` must be a torch.dtype, its name or None, but got {type_name(value)}")


def _rule(name: str, dtype: torch.dtype, op: str) -> Optional[str]:
    """Why the wire format ``name`` cannot carry a reduction of ``dtype`` with ``op`` (a rule for the message), or
    None."""
    return checks.low_precision_rule(tensors, LOW_PRECISION_DTYPES[name].itemsize, dtype, op)


# The runtime's default, and the handler's state (a weak reference) of the lifecycle it was asked in: the runtime reads
# :data:`ENV_VAR` once per lifecycle, and asking it on every call would cost a part of a small all-reduce.
_default_cache: list = [None, None]


def _default_name() -> Optional[str]:
    """:data:`ENV_VAR`'s wire format (None: off), as the runtime read it for this lifecycle (before one is acquired:
    the environment's, read by the runtime on each call).

    Raises:
        ShmemValueError: an unknown name (not cached: every call that needs the default raises).
    """
    state = context.active()
    if state is not None and _default_cache[0] is not None and _default_cache[0]() is state:
        return _default_cache[1]
    name = shmem.low_precision_default()
    if state is not None:
        _default_cache[:] = [weakref.ref(state), name]
    return name


def default(dtype: torch.dtype, op: str) -> Optional[str]:
    """The environment's default wire format for a reduction of ``dtype`` with ``op``, where it applies, else None
    (full precision).

    Raises:
        ShmemValueError: the environment names an unknown dtype.
    """
    name = _default_name()
    return name if name is not None and _rule(name, dtype, op) is None else None


def wire(value: Optional[object], dtype: torch.dtype, op: str) -> str:
    """A call's ``low_precision_dtype`` as the calls pass it down, checked: :data:`DEFAULT` for None (the
    environment's default, resolved where the call runs: environment reads stay out of traced code), :data:`FULL`
    for an off name, else the wire format's name.

    Raises:
        ShmemTypeError: ``value`` is neither a dtype nor a string.
        ShmemValueError: an unknown dtype or name, or one that cannot apply to ``dtype`` and ``op``.
    """
    if value is None:
        return DEFAULT
    name = _parse(value, "low_precision_dtype")
    if name is None:
        return FULL
    rule = _rule(name, dtype, op)
    if rule is not None:
        raise ShmemValueError(f"`low_precision_dtype` must be {rule}, but got {name}")
    return name


def chosen(wire_value: str, dtype: torch.dtype, op: str) -> Optional[str]:
    """The wire format a call passed as :func:`wire` made it travels in: the environment's default for
    :data:`DEFAULT`, None (full precision) for :data:`FULL`, else the name itself."""
    if not wire_value:
        return default(dtype, op)
    return None if wire_value == FULL else wire_value


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
        raise ShmemValueError(f"`low` must be one of {_names()}, but got {low}")
    if op not in _SUM_OPS:
        raise ShmemValueError(f"`op` must be 'sum' or 'avg', but got {op!r}")
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
