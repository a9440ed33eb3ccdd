"""A one-line progress bar on a terminal's stderr (rank 0 only), out of the way of the table on stdout."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


def render_bar(done: int, total: int, label: str, elapsed_s: float, width: int = 30) -> str:
    """The bar's text: ``[#######.......]  7/20  35%  64M  12s``.

    Args:
        done: steps finished.
        total: all steps (at least 1).
        label: what runs now (the size).
        elapsed_s: seconds since the start.
        width: characters inside the brackets.

    Returns:
        One line without a line end.
    """
    total = max(total, 1)
    done = min(max(done, 0), total)
    filled = width * done // total
    return (f"[{'#' * filled}{'.' * (width - filled)}] {done:>{len(str(total))}}/{total} "
            f"{100 * done // total:3d}%  {label}  {elapsed_s:.0f}s")


class Progress:
    """Counts steps and redraws the bar in place; does nothing unless enabled.

    Args:
        total: the number of steps of the sweep.
        enabled: draw at all (rank 0, with ``--progress`` or a terminal on stderr).
        stream: where to draw (stderr).
    """

    def __init__(self, total: int, enabled: bool, stream: Optional[TextIO] = None) -> None:
        self.total = total
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.label = ""
        self.start = time.monotonic()
        self._drawn = False

    def set_label(self, label: str) -> None:
        """Names the step in progress and redraws."""
        self.label = label
        self._draw()

    def advance(self, steps: int = 1) -> None:
        """Counts finished steps and redraws."""
        self.done += steps
        self._draw()

    def clear(self) -> None:
        """Erases the bar so that a table line can be printed; the next step draws it again."""
        if self.enabled and self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._drawn = False

    def _draw(self) -> None:
        if not self.enabled:
            return
        self.stream.write("\r\033[K" + render_bar(self.done, self.total, self.label, time.monotonic() - self.start))
        self.stream.flush()
        self._drawn = True
