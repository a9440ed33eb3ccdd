"""Sizes, data types and reduction operators as the command line names them (nccl-tests' spellings).

Nothing here imports torch: the launcher validates its arguments before any rank (and torch) starts.
"""

from __future__ import annotations

import re

_SIZE_PATTERN = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_SIZE_SUFFIXES = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

# Command-line name -> torch dtype attribute. nccl-tests' names first, torch's as aliases.
DTYPES: dict[str, str] = {
    "int8": "int8",
    "uint8": "uint8",
    "int32": "int32",
    "int64": "int64",
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
    "double": "float64",
    "float64": "float64",
}

# The name a dtype is reported under (nccl-tests' "type" column).
DTYPE_LABELS: dict[str, str] = {
    "int8": "int8",
    "uint8": "uint8",
    "int32": "int32",
    "int64": "int64",
    "float16": "half",
    "bfloat16": "bfloat16",
    "float32": "float",
    "float64": "double",
}

DTYPE_BYTES: dict[str, int] = {
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "int64": 8,
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
}

# What shmem_allreduce and shmem_reduce_scatter support (no product, unlike nccl-tests).
REDUCE_OPS: tuple[str, ...] = ("sum", "min", "max", "avg")

# ``--low-precision``: the dtypes all_reduce and reduce_scatter can travel in (``low_precision_dtype``), and their
# element sizes (a low dtype must be narrower than ``-d``).
LOW_PRECISION_BYTES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def parse_size(text: str) -> int:
    """Parses a byte count the way nccl-tests' ``-b``/``-e`` do: ``8``, ``1K``, ``64M``, ``1G`` (powers of 1024).

    ``KB``/``KiB`` spellings and a plain ``B`` suffix are accepted too; case does not matter.

    Args:
        text: the size as typed.

    Returns:
        The size in bytes.

    Raises:
        ValueError: not a non-negative integer with an optional K/M/G/T suffix.
    """
    match = _SIZE_PATTERN.match(text) if isinstance(text, str) else None
    if match is None or (match.group(3) and match.group(3).lower() == "ib" and not match.group(2)):
        raise ValueError(f"size must be a whole number of bytes with an optional K/M/G/T suffix, but got {text!r}")
    return int(match.group(1)) * _SIZE_SUFFIXES[match.group(2).lower()]


def format_size(nbytes: int) -> str:
    """``nbytes`` in the largest binary unit that divides it exactly: ``64M``, ``1536K``, ``8``."""
    for suffix, unit in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)


def size_sweep(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """The sizes nccl-tests visits: ``min_bytes``, times ``factor`` each step, while at most ``max_bytes``.

    Args:
        min_bytes: the first size (``-b``), at least 1.
        max_bytes: the largest size allowed (``-e``), at least ``min_bytes``.
        factor: the multiplier between steps (``-f``), at least 2.

    Returns:
        The sizes in increasing order.

    Raises:
        ValueError: a bound or the factor out of range.
    """
    if min_bytes < 1:
        raise ValueError(f"`-b` must be at least 1 byte, but got {min_bytes}")
    if max_bytes < min_bytes:
        raise ValueError(f"`-e` must be at least `-b` ({min_bytes}), but got {max_bytes}")
    if factor < 2:
        raise ValueError(f"`-f` must be at least 2, but got {factor}")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes
