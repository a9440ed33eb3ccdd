"""Argument checks done in Python; messages in the project's contract form.

Tensors, PEs and signal values are checked by the binding (C++), on the hot path of every data-plane call.
"""

from __future__ import annotations


def type_name(value: object) -> str:
    """The short type name used in error messages."""
    return type(value).__name__


def check_choice(name: str, value: object, choices: dict) -> int:
    """Maps ``value`` through ``choices``.

    Args:
        name: the argument's name, for the message.
        value: what the caller passed.
        choices: the accepted values and what each maps to.

    Returns:
        The mapped value.

    Raises:
        ValueError: ``value`` is not one of the keys.
    """
    try:
        return choices[value]
    except (KeyError, TypeError):
        options = ", ".join(repr(c) for c in choices)
        raise ValueError(f"`{name}` must be one of {options}, but got {value!r}") from None
