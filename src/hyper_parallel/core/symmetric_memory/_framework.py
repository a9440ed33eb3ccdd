"""Which framework's handler the user API runs on, chosen once at import, and the one seam through which the user
API reaches a handler.

``HYPER_PARALLEL_PLATFORM`` (upstream hyper-parallel's variable: ``torch`` or ``mindspore``) decides when set.
Otherwise the framework the program has already imported, when exactly one of the two is; otherwise torch when it
is installed, else MindSpore. The chosen framework's handler is ``hyper_parallel.platform.<framework>.handler``'s
``HANDLER`` (:class:`~hyper_parallel.core.symmetric_memory.protocol.Handler`): :func:`handler` is the only place
the user API imports anything of ``hyper_parallel.platform``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

VARIABLE = "HYPER_PARALLEL_PLATFORM"
FRAMEWORKS = ("torch", "mindspore")


def choose() -> str:
    """The framework of this process's user API.

    Returns:
        'torch' or 'mindspore'.

    Raises:
        ValueError: ``HYPER_PARALLEL_PLATFORM`` names another framework.
        ImportError: neither framework is installed.
    """
    chosen = os.environ.get(VARIABLE, "").strip().lower()
    if chosen:
        if chosen not in FRAMEWORKS:
            raise ValueError(f"`{VARIABLE}` must be one of {', '.join(FRAMEWORKS)}, but got {chosen!r}")
        return chosen
    imported = [name for name in FRAMEWORKS if name in sys.modules]
    if len(imported) == 1:
        return imported[0]
    for name in FRAMEWORKS:
        if importlib.util.find_spec(name) is not None:
            return name
    raise ImportError("hyper_parallel.core.symmetric_memory needs torch or mindspore, but neither is installed")


FRAMEWORK = choose()


def handler() -> Any:
    """The handler of :data:`FRAMEWORK` (imports it: the framework's package and the runtime's library it uses).

    Returns:
        ``hyper_parallel.platform.<FRAMEWORK>.handler.HANDLER``.
    """
    return importlib.import_module(f"hyper_parallel.platform.{FRAMEWORK}.handler").HANDLER
