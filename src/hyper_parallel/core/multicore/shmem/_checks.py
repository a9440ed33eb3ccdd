"""Argument checks shared by the runtime's entry points; messages in the project's contract form."""

from __future__ import annotations

import torch


def type_name(value: object) -> str:
    """The short type name used in error messages."""
    return type(value).__name__


def check_tensor(name: str, value: object) -> torch.Tensor:
    """Checks that ``value`` is a contiguous CPU tensor (the host device's memory).

    Args:
        name: the argument's name, for the message.
        value: what the caller passed.

    Returns:
        ``value``.

    Raises:
        TypeError: not a tensor.
        ValueError: not on the CPU, or not contiguous.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, but got {type_name(value)}")
    if value.device.type != "cpu":
        raise ValueError(f"`{name}` must be a cpu tensor (the host device), but got a tensor on {value.device}")
    if not value.is_contiguous():
        raise ValueError(
            f"`{name}` must be contiguous, but got a tensor of shape {list(value.shape)} "
            f"and strides {list(value.stride())}"
        )
    return value


def check_int(name: str, value: object) -> int:
    """Checks that ``value`` is an int (not a bool); returns it.

    Raises:
        TypeError: not an int.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int, but got {type_name(value)}")
    return value


def check_choice(name: str, value: object, choices: dict) -> int:
    """Maps ``value`` through ``choices``; returns the mapped value.

    Raises:
        ValueError: ``value`` is not one of the keys.
    """
    try:
        return choices[value]
    except (KeyError, TypeError):
        options = ", ".join(repr(c) for c in choices)
        raise ValueError(f"`{name}` must be one of {options}, but got {value!r}") from None


_SIGNAL_RANGES = {torch.int32: (-(2**31), 2**31 - 1), torch.int64: (-(2**63), 2**63 - 1)}


def check_signal(name: str, signal: object, value: object) -> int:
    """Checks a signal tensor (one int32 or int64 element) and a value that fits its dtype.

    Returns:
        ``value`` as an int.

    Raises:
        TypeError: not a tensor, a wrong dtype, or a non-int value.
        ValueError: not one element, not on the CPU, or a value out of the dtype's range.
    """
    check_tensor(name, signal)
    if signal.dtype not in _SIGNAL_RANGES:
        raise TypeError(f"`{name}` must be an int32 or int64 tensor, but got {signal.dtype}")
    if signal.numel() != 1:
        raise ValueError(f"`{name}` must have exactly one element, but got {signal.numel()}")
    check_int("value", value)
    low, high = _SIGNAL_RANGES[signal.dtype]
    if not low <= value <= high:
        raise ValueError(f"`value` must fit in {signal.dtype} [{low}, {high}], but got {value}")
    return value
