"""The user's call site of an allocation, for the runtime's DEBUG logs (framework-free, for every handler)."""

from __future__ import annotations

import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def user_call_site(enabled: bool) -> str:
    """``file:line in function`` of the first frame outside the ``hyper_parallel`` package, or "" unless ``enabled``.

    Args:
        enabled: whether the runtime logs allocations (HYPER_PARALLEL_SHMEM_LOG_LEVEL=0): walking the stack costs
            something, so callers compute it only then.

    Returns:
        The call site, or "".
    """
    if not enabled:
        return ""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep):
        frame = frame.f_back
    if frame is None:
        return ""
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
