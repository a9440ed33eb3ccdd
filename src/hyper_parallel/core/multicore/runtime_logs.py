"""The runtime's log records in Python's :mod:`logging`, for every face (no framework is imported here).

The package logs under the ``hyper_parallel`` logger; the C++ runtime's records under ``hyper_parallel.shmem``,
each with the rank that wrote it as the record's ``rank`` attribute. Configure them as any library's loggers::

    logging.basicConfig(level=logging.INFO)                 # every record at INFO and above, through the root
    logging.getLogger("hyper_parallel").setLevel(logging.ERROR)

What the runtime writes at all is ``HYPER_PARALLEL_SHMEM_LOG_LEVEL`` (0 or DEBUG: every allocation and free with
its call site; 1 or INFO: lifecycles and devices initialised and shut down; 2 or WARNING, the default: what went
wrong without failing a call; 3 or ERROR: leaked allocations and failures). While nothing sets its level, the
``hyper_parallel.shmem`` logger follows that variable; while no handler anywhere would take a record (logging not
configured), a fallback handler prints it to stderr as the runtime always did: ``[hyper_parallel.shmem WARNING
rank=0] ...``.

The runtime queues its records and one thread of this module hands them to logging, within milliseconds: the
threads that write them (a call that released the GIL, a tensor's deleter, a stream's worker) may hold the
runtime's locks and must never wait for the GIL. :func:`flush` hands over what is queued now, on the calling thread;
what is still queued when the interpreter exits is handed over then.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Optional

LOGGER_NAME = "hyper_parallel"
RUNTIME_LOGGER_NAME = "hyper_parallel.shmem"
# The runtime's levels (LogLevel in ccsrc/runtime/config.h: 0 debug .. 3 error) as logging's.
_LEVELS = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)
# How long the forwarding thread waits in the runtime for a record before it looks at its stop flag again: stopping
# wakes it at once, so this only bounds a wait that nothing ended.
_WAIT_MS = 1000


@dataclass(frozen=True)
class RuntimeLogSource:
    """One copy of the runtime whose records a face forwards (the torch binding's, the C ABI library's).

    Attributes:
        forward: ``forward(on)`` turns forwarding on (the copy queues its records) or off (what is still queued goes
            to stderr, and so do later records).
        wait: ``wait(timeout_ms)``: waits up to ``timeout_ms`` without holding the GIL for a record to be queued;
            True when one is. Takes nothing.
        take: ``take()``: the queued records as (level, rank, message), oldest first, without waiting.
        level: ``level()``: the level below which the runtime writes nothing (0 debug .. 3 error).
    """

    forward: Callable[[bool], None]
    wait: Callable[[int], bool]
    take: Callable[[], list[tuple[int, int, str]]]
    level: Callable[[], int]


def runtime_logger() -> logging.Logger:
    """The logger of the C++ runtime's records (``hyper_parallel.shmem``)."""
    return logging.getLogger(RUNTIME_LOGGER_NAME)


def level_of(runtime_level: int) -> int:
    """The :mod:`logging` level of one of the runtime's levels (0 debug .. 3 error).

    Args:
        runtime_level: a level as the runtime numbers it.

    Returns:
        ``logging.DEBUG``, ``INFO``, ``WARNING`` or ``ERROR``.

    Raises:
        ValueError: ``runtime_level`` is not 0, 1, 2 or 3.
    """
    if not 0 <= runtime_level < len(_LEVELS):
        raise ValueError(f"`runtime_level` must be one of 0, 1, 2, 3, but got {runtime_level}")
    return _LEVELS[runtime_level]


class _StderrFallback(logging.Handler):
    """Prints a record of the package to stderr in the runtime's own format, only while no other handler would take
    it: logging not configured at all keeps the runtime's lines where they always were, and configuring it moves
    them there."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("[%(name)s %(levelname)s rank=%(rank)s] %(message)s"))

    def _others_would_handle(self, record: logging.LogRecord) -> bool:
        logger: Optional[logging.Logger] = logging.getLogger(record.name)
        while logger is not None:
            if any(handler is not self for handler in logger.handlers):
                return True
            if not logger.propagate:
                return False
            logger = logger.parent
        return False

    def emit(self, record: logging.LogRecord) -> None:
        if self._others_would_handle(record):
            return
        if not hasattr(record, "rank"):
            record.rank = "?"
        stream = sys.stderr
        try:
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:   # noqa: BLE001  (logging's rule: a handler never raises into the caller)
            self.handleError(record)


_FALLBACK = _StderrFallback()
logging.getLogger(LOGGER_NAME).addHandler(_FALLBACK)


class _Forwarder:
    """Hands one runtime copy's queued records to logging, on a thread of its own or on a caller's (:meth:`flush`)."""

    def __init__(self, source: RuntimeLogSource) -> None:
        self.source = source
        self._lock = threading.Lock()   # one taker at a time keeps the queue's order
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._level_set: Optional[int] = None   # the level this module gave the runtime's logger, while it owns it

    def start(self) -> None:
        self.source.forward(True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="hyper_parallel.shmem log records", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.flush()
        self.source.forward(False)   # wakes the thread's wait; what came since the flush goes to stderr
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self._thread = None

    def flush(self) -> None:
        with self._lock:   # what one taker took is logged before another takes more: the order holds
            for level, rank, message in self.source.take():
                self.emit(level, rank, message)

    def emit(self, level: int, rank: int, message: str) -> None:
        logger = runtime_logger()
        self._follow_runtime_level(logger)
        python_level = _LEVELS[level] if 0 <= level < len(_LEVELS) else logging.ERROR
        if logger.isEnabledFor(python_level):
            logger.log(python_level, "%s", message, extra={"rank": rank})

    def _follow_runtime_level(self, logger: logging.Logger) -> None:
        """While nothing else set the runtime logger's level, it is the runtime's (HYPER_PARALLEL_SHMEM_LOG_LEVEL):
        records the runtime was asked for are not dropped by the root's default WARNING."""
        if logger.level not in (logging.NOTSET, self._level_set):
            self._level_set = None   # somebody set it: theirs from now on
            return
        level = level_of(self.source.level())
        if logger.level != level:
            logger.setLevel(level)
        self._level_set = level

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.source.wait(_WAIT_MS):
                    self.flush()
            except Exception:   # noqa: BLE001  (a failing handler must not end the forwarding of later records)
                logging.getLogger(LOGGER_NAME).exception("forwarding the runtime's log records failed")


_forwarders: dict[str, _Forwarder] = {}
_forwarders_lock = threading.Lock()


def forward(name: str, source: RuntimeLogSource) -> None:
    """Starts handing the records of one copy of the runtime to logging, once per copy and process.

    Args:
        name: the copy ("torch binding", "C ABI").
        source: its forwarding calls.
    """
    with _forwarders_lock:
        forwarder = _forwarders.get(name)
        if forwarder is None:
            forwarder = _Forwarder(source)
            _forwarders[name] = forwarder
            forwarder.start()


def flush() -> None:
    """Hands every record the runtime has queued so far to logging, on the calling thread."""
    for forwarder in list(_forwarders.values()):
        forwarder.flush()


def _stop_all() -> None:
    for forwarder in list(_forwarders.values()):
        forwarder.stop()


def _restart_in_child() -> None:
    """A forked child has the runtime's queue but not the thread that takes it."""
    for forwarder in _forwarders.values():
        forwarder._lock = threading.Lock()
        forwarder.start()


atexit.register(_stop_all)
os.register_at_fork(after_in_child=_restart_in_child)
