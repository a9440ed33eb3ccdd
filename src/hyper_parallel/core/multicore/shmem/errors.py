"""Exceptions of the SHMEM runtime.

Broken contracts raise the builtin ``ValueError``/``TypeError`` ("`x` must be y, but got z"). Facts about state
raise a :class:`ShmemError` subclass ("<fact>: key=value ..."), whose ``code`` names the runtime status code.
"""

from __future__ import annotations


class ShmemError(RuntimeError):
    """A failure of the SHMEM runtime; ``code`` is the runtime's status code name."""

    code = "INTERNAL"


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


def _register(binding) -> None:
    """Tells the binding which Python class to raise for each runtime status code."""
    codes = binding.status_codes()
    classes = {
        "INVALID_ARGUMENT": ValueError,
        "TYPE_ERROR": TypeError,
        "STATE_ERROR": ShmemStateError,
        "TIMEOUT": ShmemTimeoutError,
        "OUT_OF_MEMORY": ShmemOutOfMemoryError,
        "MISMATCH": ShmemMismatchError,
        "DEVICE_ERROR": ShmemDeviceError,
        "INTERNAL": ShmemError,
        "INTERRUPTED": KeyboardInterrupt,  # normally the pending KeyboardInterrupt itself surfaces
    }
    binding.set_error_classes({codes[name]: cls for name, cls in classes.items()})
