"""Which framework's handler the user API runs on, chosen once at import (seed 000 §7).

``HYPER_PARALLEL_PLATFORM`` (upstream hyper-parallel's variable: ``torch`` or ``mindspore``) decides when set.
Otherwise the framework the program has already imported, when exactly one of the two is; otherwise torch when it
is installed, else MindSpore.
"""

from __future__ import annotations

import importlib.util
import os
import sys

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
