"""Host streams: ordered queues of SHMEM operations that run beside the calling thread.

On the host device the default stream is the calling thread itself: an operation is complete when the call
returns, so torch CPU ops and SHMEM ops stay in program order. A :class:`Stream` runs what is enqueued on it in
order on a worker thread, so communication overlaps the caller's computation; ``synchronize()`` and
``wait_stream()`` order it against the rest, as with CUDA streams. (On the ascend device, where the binding is
built against CANN, the default stream is torch_npu's current stream and a Stream is an ACL stream.)
"""

from __future__ import annotations

import threading
from typing import Optional

from hyper_parallel.core.multicore.shmem._binding import C
from hyper_parallel.core.multicore.shmem._lifecycle import require_root, root_info
from hyper_parallel.core.multicore.errors import ShmemStateError

#: The runtime's handle of the default stream (the calling thread on the host device).
DEFAULT_HANDLE = 0
_current = threading.local()
# `with stream:` blocks open in any thread. While there are none, every thread is on the default stream, and the
# hot path skips the thread-local lookup (which costs more than a small put).
_open_contexts = 0
_open_contexts_lock = threading.Lock()


class Stream:
    """An ordered queue of SHMEM operations run by a worker thread (the host device's stream).

    Use it as a context manager to make it the current stream of this thread: every put, get, signal,
    wait_signal, barrier and all_gather issued inside is enqueued on it and the call returns at once. Errors of
    enqueued operations are raised by ``synchronize()``.
    """

    def __init__(self) -> None:
        root = require_root("Stream")
        self._lifecycle = root.lifecycle
        self._handle = C.create_stream()
        self._destroyed = False

    @classmethod
    def _default(cls) -> "Stream":
        stream = cls.__new__(cls)
        stream._lifecycle = None
        stream._handle = DEFAULT_HANDLE
        stream._destroyed = False
        return stream

    @property
    def is_default(self) -> bool:
        """Whether this is the default stream (the calling thread)."""
        return self._handle == DEFAULT_HANDLE

    def handle(self) -> int:
        """The runtime's handle of this stream, checked to belong to the active lifecycle (internal).

        Raises:
            ShmemStateError: the stream was destroyed or belongs to an earlier lifecycle.
        """
        if self._handle == DEFAULT_HANDLE:
            return DEFAULT_HANDLE
        root = require_root("stream")
        if self._destroyed or root.lifecycle != self._lifecycle:
            raise ShmemStateError(
                f"stream is no longer usable: destroyed={self._destroyed} "
                f"stream_lifecycle={self._lifecycle} lifecycle={root.lifecycle}"
            )
        return self._handle

    def synchronize(self) -> None:
        """Waits until everything enqueued so far has run.

        Raises:
            ShmemError: the first enqueued operation that failed since the last synchronize (its own subclass,
                e.g. ShmemTimeoutError); operations after it were skipped.
        """
        C.synchronize_stream(self.handle())

    def wait_stream(self, other: "Stream") -> None:
        """Makes work enqueued on this stream from now on wait for the work enqueued on ``other`` so far.

        On the default stream this blocks the caller until ``other`` has caught up.

        Args:
            other: the stream to wait for.

        Raises:
            TypeError: ``other`` is not a Stream.
        """
        if not isinstance(other, Stream):
            raise TypeError(f"`other` must be a Stream, but got {type(other).__name__}")
        C.stream_wait_stream(self.handle(), other.handle())

    def destroy(self) -> None:
        """Waits for the stream's work, then releases its worker (idempotent; not collective).

        Raises:
            ShmemError: an enqueued operation failed (the stream is released all the same).
        """
        if self._handle == DEFAULT_HANDLE or self._destroyed:
            return
        handle = self.handle()
        try:
            C.synchronize_stream(handle)
        finally:
            self._destroyed = True
            C.destroy_stream(handle)

    def __del__(self) -> None:
        # Like a CUDA stream: work already queued still runs; the worker goes once it is done. Never raises,
        # never waits, runs no collective.
        try:
            if self._handle == DEFAULT_HANDLE or self._destroyed:
                return
            root = root_info()
            if root is not None and root.lifecycle == self._lifecycle:
                self._destroyed = True
                C.destroy_stream(self._handle)
        except Exception:  # interpreter shutdown: modules may already be gone
            pass

    def __enter__(self) -> "Stream":
        global _open_contexts
        _stack().append(self)
        with _open_contexts_lock:
            _open_contexts += 1
        return self

    def __exit__(self, *exc_info) -> None:
        global _open_contexts
        _stack().pop()
        with _open_contexts_lock:
            _open_contexts -= 1

    def __repr__(self) -> str:
        if self.is_default:
            return "Stream(default)"
        return f"Stream(handle={self._handle:#x}, lifecycle={self._lifecycle}, destroyed={self._destroyed})"


_DEFAULT_STREAM = Stream._default()


def _stack() -> list:
    stack = getattr(_current, "stack", None)
    if stack is None:
        stack = _current.stack = []
    return stack


def default_stream() -> Stream:
    """The default stream: operations run on the calling thread and are complete when they return."""
    return _DEFAULT_STREAM


def current_stream() -> Stream:
    """The stream this thread enqueues on: the innermost ``with stream:`` block, else the default stream."""
    stack = getattr(_current, "stack", None)
    return stack[-1] if stack else _DEFAULT_STREAM


def current_handle() -> int:
    """The runtime handle of the current stream (internal, on every data-plane call)."""
    if not _open_contexts:
        return DEFAULT_HANDLE
    stack = getattr(_current, "stack", None)
    return stack[-1].handle() if stack else DEFAULT_HANDLE


def stream(s: Optional[Stream]):
    """Context manager that makes ``s`` current (``None``: the default stream), like ``torch.cuda.stream``.

    Args:
        s: the stream, or None.

    Returns:
        A context manager.

    Raises:
        TypeError: ``s`` is neither a Stream nor None.
    """
    if s is None:
        return _DEFAULT_STREAM
    if not isinstance(s, Stream):
        raise TypeError(f"`s` must be a Stream or None, but got {type(s).__name__}")
    return s
