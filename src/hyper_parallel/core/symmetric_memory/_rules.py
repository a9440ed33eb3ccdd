"""The user API's argument rules that need no framework: the tables of ops, ranks, shapes, counts.

Every framework path checks its arguments with these, so that the same bad call raises the same message on torch
and on MindSpore.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Optional

from hyper_parallel.core.multicore.call_site import user_call_site

SIGNAL_OPS = {0: "set", 1: "add"}
# Seed 000 numbers EQ, GT, LT; the rest extend it.
COMPARE_OPS = {0: "eq", 1: "gt", 2: "lt", 3: "ne", 4: "ge", 5: "le"}
REDUCE_OPS = ("sum", "avg", "max", "min")
BACKWARD_MODES = ("identity", "allreduce")
LOW_PRECISION_NAMES = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
_OFF = ("", "none")
_LOG_DEBUG = ("0", "DEBUG")


def type_name(value: object) -> str:
    """The short type name used in error messages."""
    return type(value).__name__


def choice(value: object, name: str, choices: dict) -> str:
    """The name of an op given by its number in ``choices``.

    Raises:
        ValueError: not one of the numbers.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value not in choices:
        listed = ", ".join(f"{k} ({v.upper()})" for k, v in choices.items())
        raise ValueError(f"`{name}` must be one of {listed}, but got {value!r}")
    return choices[value]


def integer(value: object, name: str) -> int:
    """A Python int (frameworks unwrap their one-element tensors first).

    Raises:
        TypeError: not an int.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(f"`{name}` must be an int or a one-element integer tensor, but got {type_name(value)}")


def rank_in_group(value: int, name: str, size: int) -> int:
    """A rank inside a group of ``size`` ranks.

    Raises:
        ValueError: outside [0, size).
    """
    if not 0 <= value < size:
        raise ValueError(f"`{name}` must be in [0, {size}), but got {value}")
    return value


def shape(value: object) -> tuple:
    """A shape from an int or a sequence of non-negative ints.

    Raises:
        TypeError: neither.
        ValueError: a negative dimension.
    """
    dims = (value,) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(dims, (str, bytes)) or not isinstance(dims, Sequence) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"`shape` must be an int or a sequence of ints, but got {value!r}")
    if any(d < 0 for d in dims):
        raise ValueError(f"`shape` must have non-negative dimensions, but got {tuple(dims)}")
    return tuple(dims)


def low_precision_name(value: object, what: str) -> Optional[str]:
    """A low-precision wire format from its name; None for an off name ("none", "").

    Raises:
        TypeError: not a string.
        ValueError: an unknown name.
    """
    if not isinstance(value, str):
        raise TypeError(f"`{what}` must be a dtype, its name or None, but got {type_name(value)}")
    name = value.strip().lower()
    if name in _OFF:
        return None
    for prefix in ("torch.", "mindspore."):
        name = name.removeprefix(prefix)
    if name not in LOW_PRECISION_NAMES:
        raise ValueError(f"`{what}` must be one of {', '.join(LOW_PRECISION_NAMES)} or 'none', but got {value!r}")
    return name


def call_site() -> str:
    """The user's call site, only when HYPER_PARALLEL_SHMEM_LOG_LEVEL asks for DEBUG logs (the runtime logs it with
    the allocation)."""
    level = os.environ.get("HYPER_PARALLEL_SHMEM_LOG_LEVEL", "").strip().upper()
    return user_call_site(level in _LOG_DEBUG)


def require_symmetric(symmetric: bool, name: str, address: int) -> None:
    """Raises ValueError unless the tensor ``name`` at ``address`` is ``symmetric`` (inside a symmetric allocation).

    Raises:
        ValueError: it is not.
    """
    if not symmetric:
        raise ValueError(f"`{name}` must be a symmetric tensor from symm.empty, but got an ordinary tensor at "
                         f"{address:#x}")


def rendezvous_mismatch(rows: Sequence[Sequence[int]]) -> Optional[str]:
    """The message when the group's ranks passed different tensors to ``rendezvous``, or None when they agree.

    Args:
        rows: each group rank's (heap offset, bytes); offset -1 for a tensor outside the heap.
    """
    if rows[0][0] >= 0 and all(list(row) == list(rows[0]) for row in rows):
        return None
    shown = ", ".join(f"rank{r}=(offset={o}, bytes={b})" for r, (o, b) in enumerate(rows))
    return (f"`tensor` must be the same symmetric tensor on every rank of the group (from symm.empty; offset -1: "
            f"not symmetric), but got {shown}")


def view_bytes(offset: int, numel: int, itemsize: int, buffer_size: int) -> tuple:
    """The byte range ``[begin, end)`` of a view of ``numel`` elements starting at element ``offset`` of a
    symmetric tensor of ``buffer_size`` bytes (``SymmetricMemory.get_buffer``).

    Raises:
        ValueError: the view runs past the tensor's end.
    """
    begin = offset * itemsize
    end = begin + numel * itemsize
    if end > buffer_size:
        raise ValueError(f"`sizes` and `storage_offset` must lie inside the tensor ({buffer_size} bytes), but got "
                         f"bytes [{begin}, {end})")
    return begin, end
