"""Exceptions of the SHMEM runtime, for every framework handler (no framework is imported here).

Broken contracts raise ``ValueError``/``TypeError`` ("`x` must be y, but got z"). Facts about state raise a
:class:`ShmemError` subclass ("<fact>: key=value ..."), whose ``code`` names the runtime status code.

Every error of the runtime is also a ``RuntimeError``, as upstream hyper-parallel raises them: a broken contract
is a :class:`ShmemValueError` or :class:`ShmemTypeError` (a ``ShmemError`` and a ``ValueError``/``TypeError``), so
``except ValueError`` and upstream's ``except RuntimeError`` both catch it. Errors raised by a call of the runtime
face also carry upstream's fixed fields: as attributes (``error_code``, ``operation``, ``phase``,
``cann_error_code``) and as one note in upstream's form (``[HYPER_PARALLEL_SHMEM_ERROR] error_code=DOUBLE_FREE
operation=free phase=Validation cann_error_code=None message=...``), which tracebacks print and
``pytest.raises(match=...)`` searches. ``str(error)`` stays the project's message.
"""

from __future__ import annotations

import re
from typing import Optional

# Upstream's `error_code` for each of the runtime's status codes (upstream's ErrorCode names). Codes upstream has
# no equivalent for keep the project's name.
_UPSTREAM_CODES = {
    "INVALID_ARGUMENT": "INVALID_ARGUMENT",
    "TYPE_ERROR": "INVALID_ARGUMENT",
    "STATE_ERROR": "INVALID_STATE",
    "TIMEOUT": "TIMEOUT",
    "DEVICE_ERROR": "CANN_ERROR",
    "OUT_OF_MEMORY": "OUT_OF_MEMORY",
    "MISMATCH": "MISMATCH",
    "INTERNAL": "INTERNAL",
}
# Upstream's phase: "CannCall" when the device (CANN, or the host device's OS calls) failed or ran out of time or
# memory, "Validation" when the call was refused before reaching it.
_DEVICE_PHASE_CODES = frozenset({"TIMEOUT", "DEVICE_ERROR", "OUT_OF_MEMORY"})
# The runtime's bootstrap: the bytes it exchanges over the framework's process group (torch.distributed, MindSpore's
# communication), on any device. Its failures are the framework's, not the device's: their phase is the project's
# "Bootstrap" (upstream has none), and a failed exchange is the project's BOOTSTRAP_ERROR rather than upstream's
# CANN_ERROR (a timeout stays TIMEOUT). Every bootstrap message begins so (bindings' bootstraps, _lifecycle.py).
_BOOTSTRAP = re.compile(r"^bootstrap ")
# A state error about memory that was already freed (or belongs to an ended lifecycle): upstream's DOUBLE_FREE,
# raised alike by a repeated free and by put/get/signal on the stale tensor.
_FREED = re.compile(
    r"tensor of a freed symmetric allocation|allocation was already freed|allocation is not active: .*state=freed"
    r"|symmetric allocation of an earlier lifecycle"
)
# Configuration variables: a bad value of one is upstream's INVALID_CONFIG.
_CONFIG = re.compile(r"^`(HYPER_PARALLEL_SHMEM_|SYMMETRIC_MEMORY_)")
_CANN_CODE = re.compile(r"cann_error_code=(-?\d+)")
_NOT_INITIALISED = "shmem runtime is not initialised"
# Upstream's hint on a call made without a runtime reference.
_ACQUIRE_HINT = "Call shmem.acquire() before using SHMEM capabilities."
_PREFIX = "[HYPER_PARALLEL_SHMEM_ERROR]"


def type_name(value: object) -> str:
    """The short type name an error message gives a value of the wrong type."""
    return type(value).__name__


class ShmemError(RuntimeError):
    """A failure of the SHMEM runtime; ``code`` is the runtime's status code name.

    The upstream fields (:attr:`error_code`, :attr:`phase`, :attr:`cann_error_code`) follow from the code and the
    message; :attr:`operation` is set by the call that raised it (None outside one).
    """

    code = "INTERNAL"
    operation: Optional[str] = None

    @property
    def error_code(self) -> str:
        """Upstream's error code: INVALID_ARGUMENT, INVALID_STATE, INVALID_CONFIG, DOUBLE_FREE, TIMEOUT, ..."""
        return upstream_error_code(self)

    @property
    def phase(self) -> str:
        """Upstream's phase: ``"CannCall"`` (the device failed) or ``"Validation"`` (refused before it); the
        project's ``"Bootstrap"`` when the runtime's exchange over the framework's process group failed."""
        return upstream_phase(self)

    @property
    def cann_error_code(self) -> Optional[int]:
        """CANN's return code when the device is ascend and CANN failed the call, else None."""
        return upstream_cann_error_code(self)


class ShmemValueError(ShmemError, ValueError):
    """A broken contract on a value (``pe`` out of range, byte counts that differ, a bad alignment, ...)."""

    code = "INVALID_ARGUMENT"


class ShmemTypeError(ShmemError, TypeError):
    """A broken contract on a type or dtype."""

    code = "TYPE_ERROR"


class ShmemStateError(ShmemError):
    """The call is not valid in the current state (no runtime, a freed tensor, live allocations at shutdown)."""

    code = "STATE_ERROR"


class ShmemTimeoutError(ShmemError):
    """A wait, barrier or bootstrap step ran past ``HYPER_PARALLEL_SHMEM_TIMEOUT_SEC``."""

    code = "TIMEOUT"


class ShmemOutOfMemoryError(ShmemError):
    """The symmetric heap, or the shared-memory filesystem behind it, cannot hold the request."""

    code = "OUT_OF_MEMORY"


class ShmemMismatchError(ShmemError):
    """Ranks disagree on a collective call (allocation order or sizes differ between ranks)."""

    code = "MISMATCH"


class ShmemDeviceError(ShmemError):
    """The device or the operating system failed a call."""

    code = "DEVICE_ERROR"


def project_code(error: BaseException) -> str:
    """The runtime's status code name an error stands for (a ShmemError's own; ValueError INVALID_ARGUMENT, TypeError
    TYPE_ERROR).

    Args:
        error: the exception.

    Returns:
        The name, as the runtime spells it (runtime/status.h).
    """
    return _project_code(error)


def _project_code(error: BaseException) -> str:
    code = getattr(type(error), "code", None)
    if isinstance(code, str):
        return code
    return "TYPE_ERROR" if isinstance(error, TypeError) else "INVALID_ARGUMENT"


def upstream_error_code(error: BaseException) -> str:
    """Upstream's ``error_code`` of an error of the runtime (a ShmemError, or a ValueError/TypeError).

    Args:
        error: the exception.

    Returns:
        The code name in upstream's vocabulary (DOUBLE_FREE, INVALID_STATE, INVALID_CONFIG, ...), or the project's
        code name where upstream has none (OUT_OF_MEMORY, MISMATCH, INTERNAL, BOOTSTRAP_ERROR).
    """
    code = _project_code(error)
    message = str(error)
    if code == "DEVICE_ERROR" and _BOOTSTRAP.search(message):
        return "BOOTSTRAP_ERROR"
    if code == "STATE_ERROR" and _FREED.search(message):
        return "DOUBLE_FREE"
    if code in ("INVALID_ARGUMENT", "TYPE_ERROR") and _CONFIG.search(message):
        return "INVALID_CONFIG"
    return _UPSTREAM_CODES.get(code, code)


def upstream_phase(error: BaseException) -> str:
    """Upstream's ``phase`` of an error: ``"CannCall"`` or ``"Validation"``, or the project's ``"Bootstrap"`` for a
    failure or timeout of the runtime's exchange over the framework's process group.

    Args:
        error: the exception.

    Returns:
        The phase name.
    """
    code = _project_code(error)
    if code in ("DEVICE_ERROR", "TIMEOUT") and _BOOTSTRAP.search(str(error)):
        return "Bootstrap"
    return "CannCall" if code in _DEVICE_PHASE_CODES else "Validation"


def upstream_cann_error_code(error: BaseException) -> Optional[int]:
    """CANN's return code named in the message (``cann_error_code=-7``), or None.

    Args:
        error: the exception.

    Returns:
        The code, or None.
    """
    found = _CANN_CODE.search(str(error))
    return int(found.group(1)) if found else None


def upstream_fields_line(error_code: str, operation: Optional[str], phase: str, cann_error_code: Optional[int],
                         message: str) -> str:
    """Upstream's one-line error form: ``[HYPER_PARALLEL_SHMEM_ERROR] error_code=... message=...``.

    Args:
        error_code: upstream's code name.
        operation: the operation (``allocate``, ``free``, ``put``, ...), or None.
        phase: ``"Validation"``, ``"CannCall"`` or ``"Bootstrap"``.
        cann_error_code: CANN's return code, or None.
        message: the message.

    Returns:
        The line.
    """
    return (f"{_PREFIX} error_code={error_code} operation={operation} phase={phase} "
            f"cann_error_code={cann_error_code} message={message}")


# What a handler writes as ``op=`` in a message when only the public function above it knows the call the user made
# (a check shared by every function, such as "torch.distributed is not initialised"): :func:`attach_fields` puts the
# function's name in its place.
UNNAMED_CALL = "op=<call>"


def attach_fields(error: BaseException, operation: str) -> None:
    """Gives an error raised by a call of the runtime face upstream's fields, once (the innermost call wins).

    Sets ``operation`` (a ShmemError computes the other fields; a plain ValueError/TypeError gets them as
    attributes) and adds upstream's one-line form as a note. ``str(error)`` is left as it is, but for a message that
    names its call :data:`UNNAMED_CALL`, which then names ``operation``.

    Args:
        error: the exception being raised.
        operation: upstream's name of the call (``initialize``, ``allocate``, ``free``, ``put``, ``get``,
            ``signal``, ``wait_signal``, ``barrier``, ``all_gather``, ``shutdown``) or the project's own.
    """
    if not isinstance(error, (ShmemError, ValueError, TypeError)) or getattr(error, "_upstream_noted", False):
        return
    if error.args and isinstance(error.args[0], str) and UNNAMED_CALL in error.args[0]:
        error.args = (error.args[0].replace(UNNAMED_CALL, f"op={operation}"), *error.args[1:])
    error_code = upstream_error_code(error)
    phase = upstream_phase(error)
    cann_error_code = upstream_cann_error_code(error)
    error.operation = operation
    if not isinstance(error, ShmemError):
        error.error_code = error_code
        error.phase = phase
        error.cann_error_code = cann_error_code
    message = str(error)
    if error_code == "INVALID_STATE" and message.startswith(_NOT_INITIALISED):
        message = f"{message}; {_ACQUIRE_HINT}"
    error.add_note(upstream_fields_line(error_code, operation, phase, cann_error_code, message))
    error._upstream_noted = True


# The class raised for each runtime status code name (runtime/status.h), by every handler.
CLASSES_BY_CODE = {
    "INVALID_ARGUMENT": ShmemValueError,
    "TYPE_ERROR": ShmemTypeError,
    "STATE_ERROR": ShmemStateError,
    "TIMEOUT": ShmemTimeoutError,
    "OUT_OF_MEMORY": ShmemOutOfMemoryError,
    "MISMATCH": ShmemMismatchError,
    "DEVICE_ERROR": ShmemDeviceError,
    "INTERNAL": ShmemError,
    "INTERRUPTED": KeyboardInterrupt,  # normally the pending KeyboardInterrupt itself surfaces
}


# What happened on a rank, as the number that the ranks exchange when they check an allocation or a free across
# nodes (the torch root's and MindSpore's handler's checks): nothing wrong, or the kind of its failure.
AGREED, OUT_OF_MEMORY_KIND, MISMATCH_KIND, FAILED_KIND = 0, 1, 2, 3
_CLASSES_BY_KIND = {OUT_OF_MEMORY_KIND: ShmemOutOfMemoryError, MISMATCH_KIND: ShmemMismatchError,
                    FAILED_KIND: ShmemStateError}


def failure_kind(error: BaseException) -> int:
    """The kind of ``error`` as a rank reports it to the others: OUT_OF_MEMORY_KIND, MISMATCH_KIND or FAILED_KIND."""
    if isinstance(error, ShmemOutOfMemoryError):
        return OUT_OF_MEMORY_KIND
    if isinstance(error, ShmemMismatchError):
        return MISMATCH_KIND
    return FAILED_KIND


def failure_class(kind: int) -> type:
    """The class the other ranks raise for a rank's failure of ``kind`` (a :func:`failure_kind`)."""
    return _CLASSES_BY_KIND[kind]


def register_binding(binding) -> None:
    """Tells a binding which Python class to raise for each runtime status code.

    Args:
        binding: a module with ``status_codes()`` (name -> int) and ``set_error_classes(dict)``.
    """
    codes = binding.status_codes()
    binding.set_error_classes({codes[name]: cls for name, cls in CLASSES_BY_CODE.items()})
