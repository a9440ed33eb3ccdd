"""Argument checks done in Python; messages in the project's contract form.

Tensors, PEs and signal values are checked by the binding (C++), on the hot path of every data-plane call.
"""

from __future__ import annotations

from hyper_parallel.core.multicore.errors import ShmemTypeError, ShmemValueError


def check_choice(name: str, value: object, choices: dict) -> int:
    """Maps ``value`` through ``choices``.

    Args:
        name: the argument's name, for the message.
        value: what the caller passed.
        choices: the accepted values and what each maps to.

    Returns:
        The mapped value.

    Raises:
        ShmemValueError: ``value`` is not one of the keys (a ValueError).
    """
    try:
        return choices[value]
    except (KeyError, TypeError):
        options = ", ".join(repr(c) for c in choices)
        raise ShmemValueError(f"`{name}` must be one of {options}, but got {value!r}") from None


def keyword_alias(name: str, value: object, alias: str, alias_value: object, default: object) -> tuple:
    """Resolves a keyword argument that has a second name (upstream hyper-parallel's), given as None when unused.

    Args:
        name: the project's name of the argument (``op``).
        value: what the caller passed under ``name`` (None: not passed).
        alias: upstream's name of the same argument (``operation``).
        alias_value: what the caller passed under ``alias`` (None: not passed).
        default: the value when neither was passed.

    Returns:
        ``(the name the caller used, the value)``: the name goes into error messages.

    Raises:
        ShmemTypeError: both names were passed (a TypeError, as Python raises for a repeated argument).
    """
    if alias_value is None:
        return name, default if value is None else value
    if value is not None:
        raise ShmemTypeError(
            f"`{name}` and `{alias}` must not both be given (they name the same argument), "
            f"but got {name}={value!r} and {alias}={alias_value!r}"
        )
    return alias, alias_value
