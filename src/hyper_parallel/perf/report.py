"""The results: one :class:`Row` per size, printed in nccl-tests' layout, written as JSON, drawn as a plot.

Nothing here imports torch or talks to other ranks; rank 0 feeds it the rows.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Callable, NamedTuple, Optional, TextIO

from hyper_parallel.perf.ops import OPS, InPlace, OpSpec

SCHEMA_VERSION = 6  # 2: the in_place_* fields; all_reduce's out-of-place row is a copy, then the reduction
# 3: the low_precision_* fields (--low-precision); 4: the mpi_* fields (--baseline gloo,mpi); 5: all_reduce's
# out-of-place row is the engine's out-of-place all_reduce (no copy); 6: the floor_* fields (the remote transport's own
# put or get) and the peer's route in the settings


@dataclass(frozen=True)
class Row:
    """One size of one op. Times are per operation in µs; bandwidths in GB/s (10**9 B/s), as nccl-tests.

    The unprefixed time, bandwidths and ``wrong`` are ours out of place; ``in_place_*`` ours in place (None for
    ops with no in-place form); ``baseline_*`` gloo's, out of place (None without a baseline); ``memcpy_*`` the
    single-core copy (None for ops without a memcpy reference); ``low_precision_*`` ours in place travelling in
    ``--low-precision`` (None without it), whose ``low_precision_wrong`` counts elements beyond the documented
    error bound; ``mpi_*`` MPI's, out of place (None without ``--baseline gloo,mpi`` and for the ops that have no
    MPI side), whose ``mpi_wrong`` counts its elements that differ from gloo's; ``floor_*`` the remote transport's
    own put or get of the same bytes (None where the op has no floor or no network transport reaches the peer),
    whose ``floor_wrong`` counts the elements it moved wrongly. The ``wrong`` fields are None when the check was off.
    """

    op: str
    size: int
    count: int
    type: str
    redop: str
    time_us: float
    algbw: float
    busbw: float
    wrong: Optional[int]
    baseline_time_us: Optional[float] = None
    baseline_algbw: Optional[float] = None
    baseline_busbw: Optional[float] = None
    memcpy_time_us: Optional[float] = None
    memcpy_algbw: Optional[float] = None
    in_place_time_us: Optional[float] = None
    in_place_algbw: Optional[float] = None
    in_place_busbw: Optional[float] = None
    in_place_wrong: Optional[int] = None
    low_precision_time_us: Optional[float] = None
    low_precision_algbw: Optional[float] = None
    low_precision_busbw: Optional[float] = None
    low_precision_wrong: Optional[int] = None
    mpi_time_us: Optional[float] = None
    mpi_algbw: Optional[float] = None
    mpi_busbw: Optional[float] = None
    mpi_wrong: Optional[int] = None
    floor_time_us: Optional[float] = None
    floor_algbw: Optional[float] = None
    floor_wrong: Optional[int] = None

    @property
    def speedup(self) -> Optional[float]:
        """The baseline's time over ours out of place (above 1: ours is faster)."""
        return _time_ratio(self.baseline_time_us, self.time_us)

    @property
    def in_place_speedup(self) -> Optional[float]:
        """The baseline's (out-of-place) time over ours in place."""
        return _time_ratio(self.baseline_time_us, self.in_place_time_us)

    @property
    def mpi_speedup(self) -> Optional[float]:
        """MPI's time over ours out of place (above 1: ours is faster)."""
        return _time_ratio(self.mpi_time_us, self.time_us)

    @property
    def mpi_in_place_speedup(self) -> Optional[float]:
        """MPI's (out-of-place) time over ours in place."""
        return _time_ratio(self.mpi_time_us, self.in_place_time_us)

    @property
    def low_precision_gain(self) -> Optional[float]:
        """Ours in place at full precision over ours in place in low precision (above 1: low precision is faster)."""
        return _time_ratio(self.in_place_time_us, self.low_precision_time_us)

    @property
    def memcpy_fraction(self) -> Optional[float]:
        """Our bandwidth as a fraction of the single-core memcpy's (the memcpy's time over ours)."""
        return _time_ratio(self.memcpy_time_us, self.time_us)

    @property
    def over_floor(self) -> Optional[float]:
        """Our time over the transport floor's (1: ours costs nothing on top of the transport)."""
        return _time_ratio(self.time_us, self.floor_time_us)

    def to_json(self) -> dict[str, Any]:
        """Every field, plus ``speedup``, ``in_place_speedup``, ``low_precision_gain``, ``memcpy_fraction``,
        ``mpi_speedup``, ``mpi_in_place_speedup`` and ``over_floor``."""
        return {**asdict(self), "speedup": self.speedup, "in_place_speedup": self.in_place_speedup,
                "low_precision_gain": self.low_precision_gain, "memcpy_fraction": self.memcpy_fraction,
                "mpi_speedup": self.mpi_speedup, "mpi_in_place_speedup": self.mpi_in_place_speedup,
                "over_floor": self.over_floor}


def _time_ratio(numerator_us: Optional[float], denominator_us: Optional[float]) -> Optional[float]:
    """``numerator_us / denominator_us``, or None when either is missing or the denominator is not positive."""
    if numerator_us is None or denominator_us is None or denominator_us <= 0:
        return None
    return numerator_us / denominator_us


def format_time_us(value: float) -> str:
    """nccl-tests' time format: two decimals below 100 µs, one below 10 ms, none above."""
    if value >= 10000:
        return f"{value:.0f}"
    if value >= 100:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _fixed2(value: float) -> str:
    return f"{value:.2f}"


def _in_place(format_value: Callable[[Any], str], field: str) -> Callable[[Row], str]:
    """A cell of the in-place group: ``field`` of the row, formatted."""
    return lambda row: format_value(getattr(row, field))


def _wrong(value: Optional[int]) -> str:
    return "N/A" if value is None else str(value)


def _ratio(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.1f}x"


def _percent(value: Optional[float]) -> str:
    return "" if value is None else f"{100 * value:.0f}%"


class Column(NamedTuple):
    """A column of the table: its two header lines, width, and how to print its value from a row."""

    title: str
    unit: str
    width: int
    value: Callable[[Row], str]


_LEADING = [
    Column("size", "(B)", 12, lambda row: str(row.size)),
    Column("count", "(elements)", 12, lambda row: str(row.count)),
    Column("type", "", 8, lambda row: row.type),
    Column("redop", "", 6, lambda row: row.redop),
]
_OURS = [
    Column("time", "(us)", 9, lambda row: format_time_us(row.time_us)),
    Column("algbw", "(GB/s)", 7, lambda row: _fixed2(row.algbw)),
    Column("busbw", "(GB/s)", 7, lambda row: _fixed2(row.busbw)),
    Column("#wrong", "", 9, lambda row: _wrong(row.wrong)),
]
_IN_PLACE = [
    Column("time", "(us)", 9, _in_place(format_time_us, "in_place_time_us")),
    Column("algbw", "(GB/s)", 7, _in_place(_fixed2, "in_place_algbw")),
    Column("busbw", "(GB/s)", 7, _in_place(_fixed2, "in_place_busbw")),
    Column("#wrong", "", 9, _in_place(_wrong, "in_place_wrong")),
]
# Ours in place in --low-precision, and full precision's in-place time over it.
_LOW_PRECISION = [
    Column("time", "(us)", 9, _in_place(format_time_us, "low_precision_time_us")),
    Column("algbw", "(GB/s)", 7, _in_place(_fixed2, "low_precision_algbw")),
    Column("busbw", "(GB/s)", 7, _in_place(_fixed2, "low_precision_busbw")),
    Column("#wrong", "", 9, _in_place(_wrong, "low_precision_wrong")),
    Column("gain", "(full/lo)", 10, _in_place(_ratio, "low_precision_gain")),
]
def _optional(format_value: Callable[[Any], str], field: str) -> Callable[[Row], str]:
    """A cell that may be missing: ``field`` of the row formatted, or blank when None (a baseline the framework
    cannot run for that op: MindSpore's mccl reduce_scatter on CPU)."""
    return lambda row: "" if getattr(row, field) is None else format_value(getattr(row, field))


_BASELINE = [
    Column("time", "(us)", 9, _optional(format_time_us, "baseline_time_us")),
    Column("algbw", "(GB/s)", 7, _optional(_fixed2, "baseline_algbw")),
    Column("busbw", "(GB/s)", 7, _optional(_fixed2, "baseline_busbw")),
]
_SPEEDUP = Column("speedup", "", 8, lambda row: _ratio(row.speedup))
# With an in-place group: the baseline's time over ours out of place, and over ours in place.
_SPEEDUPS = [
    _SPEEDUP._replace(unit="(out)", width=9),
    Column("speedup", "(in)", 9, _in_place(_ratio, "in_place_speedup")),
]
# MPI, out of place, and its time over ours out of place (and over ours in place, where the op has that form).
_MPI = [
    Column("time", "(us)", 9, _in_place(format_time_us, "mpi_time_us")),
    Column("algbw", "(GB/s)", 7, _in_place(_fixed2, "mpi_algbw")),
    Column("busbw", "(GB/s)", 7, _in_place(_fixed2, "mpi_busbw")),
    Column("#wrong", "", 9, _in_place(_wrong, "mpi_wrong")),
]
_MPI_SPEEDUP = Column("speedup", "", 8, _in_place(_ratio, "mpi_speedup"))
_MPI_SPEEDUPS = [
    _MPI_SPEEDUP._replace(unit="(out)", width=9),
    Column("speedup", "(in)", 9, _in_place(_ratio, "mpi_in_place_speedup")),
]
# The remote transport's own put or get, and our time over it.
_FLOOR = [
    Column("time", "(us)", 9, _in_place(format_time_us, "floor_time_us")),
    Column("algbw", "(GB/s)", 7, _in_place(_fixed2, "floor_algbw")),
    Column("#wrong", "", 9, _in_place(_wrong, "floor_wrong")),
    Column("ours/", "floor", 7, _in_place(_ratio, "over_floor")),
]
_MEMCPY = [
    Column("time", "(us)", 9, lambda row: format_time_us(row.memcpy_time_us)),
    Column("algbw", "(GB/s)", 7, lambda row: _fixed2(row.memcpy_algbw)),
    Column("ours/", "memcpy", 7, lambda row: _percent(row.memcpy_fraction)),
]


class Table:
    """The table's layout for one op: which column groups it has.

    Args:
        baseline: the name of the baseline (``"gloo"``) or None for none.
        memcpy: whether rows carry the memcpy reference.
        in_place: whether the op has nccl-tests' in-place group; the baseline then gets a speedup for each of
            our two groups.
        low_precision: the ``--low-precision`` dtype of an op that runs in it: a group after the in-place one
            (ours in place in that dtype, and full precision's in-place time over it), or None.
        ordinary_tensors: whether our groups ran on ordinary tensors (``--ordinary-tensors``); their names say
            so.
        mpi: whether rows carry MPI's group (``--baseline gloo,mpi``, an op with an MPI side): after the
            baseline's, with a speedup for each of our groups as the baseline has.
        floor: the name of the remote transport whose own put or get the rows carry (``"ucx"``), or None.
    """

    def __init__(self, baseline: Optional[str], memcpy: bool, in_place: bool = False,
                 low_precision: Optional[str] = None, ordinary_tensors: bool = False, mpi: bool = False,
                 floor: Optional[str] = None) -> None:
        self.groups: list[tuple[str, list[Column]]] = [("", _LEADING)]
        ordinary = ", ordinary" if ordinary_tensors else ""
        in_place_name = f"shmem, in-place{ordinary}"
        if in_place:
            self.groups += [(f"shmem, out-of-place{ordinary}", _OURS), (in_place_name, _IN_PLACE)]
        else:
            self.groups.append((f"hyper_parallel.shmem{ordinary}", _OURS))
        if low_precision is not None:
            self.groups.append((f"{in_place_name}, {low_precision}", _LOW_PRECISION))
        if baseline is not None:
            if in_place:
                self.groups.append((f"{baseline}, out-of-place", _BASELINE + _SPEEDUPS))
            else:
                self.groups.append((baseline, _BASELINE + [_SPEEDUP]))
        if mpi:
            if in_place:
                self.groups.append(("MPI, out-of-place", _MPI + _MPI_SPEEDUPS))
            else:
                self.groups.append(("MPI", _MPI + [_MPI_SPEEDUP]))
        if floor is not None:
            self.groups.append((f"{floor} floor", _FLOOR))
        if memcpy:
            self.groups.append(("memcpy, 1 core", _MEMCPY))

    def _join(self, cells: list[list[str]]) -> str:
        parts = []
        for (_, columns), group_cells in zip(self.groups, cells):
            parts.append("".join(cell.rjust(column.width) for column, cell in zip(columns, group_cells)))
        return "  ".join(parts)

    def header(self) -> list[str]:
        """The three header lines (group names, column titles, units), each starting with nccl-tests' ``#``.

        The ``#`` takes the place of the first column's leading blank, so the titles stay over their values.
        """
        group_line = "  ".join(name.center(sum(column.width for column in columns)) for name, columns in self.groups)
        titles = self._join([[column.title for column in columns] for _, columns in self.groups])
        units = self._join([[column.unit for column in columns] for _, columns in self.groups])
        return ["#" + line[1:] for line in (group_line.rstrip(), titles, units)]

    def line(self, row: Row) -> str:
        """One row, aligned under the header."""
        return self._join([[column.value(row) for column in columns] for _, columns in self.groups])


def footer(rows: list[Row]) -> list[str]:
    """nccl-tests' closing lines: wrong values (out of place, in place, low precision, MPI) and the average bus
    bandwidth (ours out of place, ours in place where the op has that form, the baseline's, MPI's)."""
    wrong = sum((row.wrong or 0) + (row.in_place_wrong or 0) + (row.low_precision_wrong or 0) + (row.mpi_wrong or 0)
                + (row.floor_wrong or 0) for row in rows)
    checked = any(row.wrong is not None for row in rows)
    lines = [f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}" if checked
             else "# Out of bounds values : N/A (check off)"]
    if rows:
        lines.append(f"# Avg bus bandwidth    : {sum(row.busbw for row in rows) / len(rows):.4g} GB/s")
        if rows[0].in_place_busbw is not None:
            in_place_avg = sum(row.in_place_busbw for row in rows) / len(rows)
            lines.append(f"# Avg bus bandwidth in place : {in_place_avg:.4g} GB/s")
        if rows[0].low_precision_busbw is not None:
            low_avg = sum(row.low_precision_busbw for row in rows) / len(rows)
            lines.append(f"# Avg bus bandwidth in place, low precision : {low_avg:.4g} GB/s")
        if rows[0].baseline_busbw is not None:
            baseline_avg = sum(row.baseline_busbw for row in rows) / len(rows)
            lines.append(f"# Avg bus bandwidth of the baseline : {baseline_avg:.4g} GB/s")
        if rows[0].mpi_busbw is not None:
            mpi_avg = sum(row.mpi_busbw for row in rows) / len(rows)
            lines.append(f"# Avg bus bandwidth of MPI : {mpi_avg:.4g} GB/s")
    return lines


def write_json(path: str, settings: dict[str, Any], rows: list[Row], tool: str = "hp-shmem-perf") -> None:
    """Writes the run's settings and every row to ``path``.

    Schema: ``{"tool": "hp-shmem-perf", "schema": 6, "settings": {...}, "rows": [Row.to_json(), ...]}``.

    Args:
        path: the file to (over)write.
        settings: the run's settings (op, nranks, dtype, iterations, ...).
        rows: the rows in size order.
        tool: the ``tool`` field: which tool wrote the file (``hp-shmem-perf-mindspore`` for the MindSpore one).

    Raises:
        OSError: the file cannot be written.
    """
    document = {"tool": tool, "schema": SCHEMA_VERSION, "settings": settings,
                "rows": [row.to_json() for row in rows]}
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(document, stream, indent=2)
        stream.write("\n")


class _Series(NamedTuple):
    """One line of a plot: its label and colour (the same for an implementation in every panel), and a row's
    bus bandwidth and time."""

    label: str
    color: str
    bandwidth: Callable[[Row], Optional[float]]
    time_us: Callable[[Row], Optional[float]]


def _series(rows: list[Row], baseline: Optional[str]) -> list[_Series]:
    """The lines for ours (out of place, and in place where the op runs in place), the baseline, MPI and memcpy,
    where the rows have them."""
    if rows and rows[0].in_place_time_us is not None:
        series = [
            _Series("shmem, out-of-place", "C0", lambda row: row.busbw, lambda row: row.time_us),
            _Series("shmem, in-place", "C3", lambda row: row.in_place_busbw, lambda row: row.in_place_time_us),
        ]
    else:
        series = [_Series("hyper_parallel.shmem", "C0", lambda row: row.busbw, lambda row: row.time_us)]
    if rows and rows[0].low_precision_time_us is not None:
        series.append(_Series("shmem, in-place, low precision", "C4", lambda row: row.low_precision_busbw,
                              lambda row: row.low_precision_time_us))
    if baseline is not None:
        series.append(_Series(baseline, "C1", lambda row: row.baseline_busbw, lambda row: row.baseline_time_us))
    if any(row.mpi_time_us is not None for row in rows):
        series.append(_Series("MPI", "C5", lambda row: row.mpi_busbw, lambda row: row.mpi_time_us))
    if rows and rows[0].floor_time_us is not None:
        series.append(_Series("transport floor", "C6", lambda row: row.floor_algbw, lambda row: row.floor_time_us))
    if rows and rows[0].memcpy_time_us is not None:
        series.append(_Series("memcpy, 1 core", "C2", lambda row: row.memcpy_algbw, lambda row: row.memcpy_time_us))
    return series


def _baseline_name(baseline: Optional[str], op: OpSpec) -> Optional[str]:
    """What an op's baseline columns are called: the ``--baseline`` transport, or the op's own (``unfused``)."""
    return None if baseline is None else op.baseline_label or baseline


def _draw_sweep(name: str, rows: list[Row], baseline: Optional[str], bandwidth_axes: Any, time_axes: Any) -> None:
    sizes = [row.size for row in rows]
    for line in _series(rows, _baseline_name(baseline, OPS[name])):
        for axes, value in ((bandwidth_axes, line.bandwidth), (time_axes, line.time_us)):
            axes.plot(sizes, [value(row) for row in rows], marker="o", markersize=3, label=line.label,
                      color=line.color)
    for axes, ylabel in ((bandwidth_axes, "bus bandwidth (GB/s)"), (time_axes, "time (µs)")):
        axes.set_title(name)
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xlabel("size (B)")
        axes.set_ylabel(ylabel)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize="small")


def _draw_latencies(rows: list[Row], baseline: Optional[str], axes: Any) -> None:
    """Grouped bars of the fixed-size ops' times (barrier, signal_pingpong), one group per op."""
    series = _series(rows, baseline)
    width = 0.8 / len(series)
    for index, line in enumerate(series):
        # A latency op without this side (signal_pingpong has no MPI bar) leaves its place empty.
        bars = [(position + index * width, line.time_us(row)) for position, row in enumerate(rows)
                if line.time_us(row) is not None]
        positions, values = [position for position, _ in bars], [value for _, value in bars]
        axes.bar(positions, values, width=width, label=line.label, color=line.color)
        for position, value in zip(positions, values):
            axes.annotate(format_time_us(value), (position, value), ha="center", va="bottom", fontsize="small")
    axes.set_xticks([position + 0.4 - width / 2 for position in range(len(rows))], [row.op for row in rows])
    axes.set_yscale("log")
    axes.set_ylabel("time (µs)")
    axes.set_title("latency")
    axes.legend(fontsize="small")


def write_plot(path: str, title: str, rows: list[Row], baseline: Optional[str]) -> None:
    """Draws, per op, bus bandwidth and time against size (log-log), ours (out of place, and in place where the op
    runs in place) beside the baseline (and MPI, and memcpy).

    Ops of one fixed size (barrier, signal_pingpong) share a bar chart of their times instead.

    Args:
        path: the image file; its extension picks the format (``.png``).
        title: the figure's title.
        rows: the rows of every op, each op's in size order.
        baseline: the baseline's name, or None.

    Raises:
        ImportError: matplotlib is missing (``pip install matplotlib``).
        OSError: the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_op: dict[str, list[Row]] = {}
    for row in rows:
        by_op.setdefault(row.op, []).append(row)
    sweeps = [(name, op_rows) for name, op_rows in by_op.items() if OPS[name].sized]
    fixed = [op_rows[0] for name, op_rows in by_op.items() if not OPS[name].sized]
    panels = len(sweeps) + (1 if fixed else 0)
    columns = 2 if panels == 1 else 4  # a panel is two axes: bandwidth and time (or the bars and nothing)
    grid_rows = -(-panels // (columns // 2))
    figure, axes = plt.subplots(grid_rows, columns, figsize=(4.6 * columns, 3.6 * grid_rows), squeeze=False)
    cells = [axes[r][c:c + 2] for r in range(grid_rows) for c in range(0, columns, 2)]
    for (name, op_rows), (bandwidth_axes, time_axes) in zip(sweeps, cells):
        _draw_sweep(name, op_rows, baseline, bandwidth_axes, time_axes)
    if fixed:
        bars, unused = cells[len(sweeps)]
        _draw_latencies(fixed, baseline, bars)
        unused.set_visible(False)
    for bandwidth_axes, time_axes in cells[panels:]:
        bandwidth_axes.set_visible(False)
        time_axes.set_visible(False)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


class Reporter:
    """Rank 0's output of a run: a block per op (header, each row as soon as it is measured, footer), then the
    JSON and the plot of every row.

    Args:
        settings: the run's settings (:meth:`Config.settings`), shown in the header and written to the JSON.
        json_path, plot_path: the files to write at the end, or None.
        out: the table's stream (stdout).
        before_line: called before each printed line (erases the progress bar).
    """

    def __init__(
        self,
        settings: dict[str, Any],
        json_path: Optional[str],
        plot_path: Optional[str],
        out: TextIO,
        before_line: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.baseline: Optional[str] = settings["baseline"]
        self.json_path = json_path
        self.plot_path = plot_path
        self.out = out
        self.before_line = before_line
        self.rows: list[Row] = []
        self._op_rows: list[Row] = []
        self._table = Table(self.baseline, memcpy=False)

    def _print(self, lines: list[str]) -> None:
        self.before_line()
        for line in lines:
            print(line, file=self.out)
        self.out.flush()

    def start(self) -> None:
        """Prints the run's settings."""
        settings = self.settings
        self._print([
            f"# hp-shmem-perf: nranks {settings['nranks']}  type {settings['type']}"
            f"  iterations {settings['iterations']}  warmup {settings['warmup']}  repeat {settings['repeat']}"
            f"  baseline {settings['baseline'] or 'none'}"
            + (f"  mpi {settings.get('mpi_library', 'on')}" if settings.get("mpi") else "")
            + (f"  low precision {settings['low_precision']}" if settings.get("low_precision") else "")
            + ("  ordinary tensors" if settings.get("ordinary_tensors") else ""),
            "# time: the median over repeats of the slowest rank's time per operation",
        ] + self._route_lines())

    def _route_lines(self) -> list[str]:
        """The one-sided ops' peer and its route, where the run has one."""
        settings = self.settings
        if "peer" not in settings:
            return []
        crosses = "another node" if settings["peer_crosses_nodes"] else "rank 0's node"
        lines = [f"# one-sided ops: rank 0 and rank {settings['peer']} (on {crosses}, reached through "
                 f"{settings['peer_transport']})"]
        if settings.get("floor_absent"):
            lines.append(f"# transport floor: absent: {settings['floor_absent']}")
        return lines

    def start_op(self, op: OpSpec) -> None:
        """Prints an op's heading and column header."""
        has_in_place = op.in_place is not InPlace.ABSENT
        baseline = _baseline_name(self.baseline, op)
        low_precision = self.settings.get("low_precision") if op.low_precision else None
        ordinary = bool(self.settings.get("ordinary_tensors")) and op.takes_ordinary_tensors
        mpi = bool(self.settings.get("mpi")) and op.mpi is not None
        floor = self.settings.get("floor") if op.transport_floor else None
        self._table = Table(baseline, op.memcpy_reference, in_place=has_in_place, low_precision=low_precision,
                            ordinary_tensors=ordinary, mpi=mpi, floor=floor)
        self._op_rows = []
        lines = ["#", f"# {op.name}: {op.summary}"]
        if ordinary:
            lines.append("# ordinary: ours on ordinary torch tensors (not symmetric: read straight out of the peers' "
                         "tensors where the host device reaches them, through the staging area otherwise)")
            if has_in_place:
                lines.append("# in place, ordinary: the in-place call on ordinary torch tensors")
        elif has_in_place:
            lines.append(f"# in place: {op.in_place_summary}")
        if low_precision is not None:
            lines.append(f"# in place{', ordinary' if ordinary else ''}, {low_precision}: the in-place call with "
                         f"low_precision_dtype={low_precision}; #wrong: elements beyond its documented error bound")
        if baseline is not None:
            lines.append(f"# {baseline}{', out of place' if has_in_place else ''}: {op.baseline}")
        if mpi:
            moves = f", on gloo's input tensors; #wrong: its elements that differ from gloo's" if op.sized else ""
            lines.append(f"# MPI{', out of place' if has_in_place else ''}: {op.mpi}{moves}")
        if floor is not None:
            lines.append(f"# {floor} floor: the transport's own {'get' if op.name == 'get' else 'put'} of the same bytes "
                         "(RemoteTransport::Put/Get: the operation, then the endpoint's flush), no runtime checks, "
                         "streams or tensors; ours/floor: our time over it")
        self._print(lines + self._table.header())

    def add(self, row: Row) -> None:
        """Prints a measured row and keeps it for the footer and the files."""
        self.rows.append(row)
        self._op_rows.append(row)
        self._print([self._table.line(row)])

    def finish_op(self) -> None:
        """Prints the footer of the op's rows."""
        self._print(footer(self._op_rows))

    def finish(self) -> None:
        """Writes the JSON and the plot that were asked for."""
        if self.json_path is not None:
            write_json(self.json_path, self.settings, self.rows)
        if self.plot_path is not None:
            title = f"hp-shmem-perf: {self.settings['nranks']} ranks, {self.settings['type']}"
            write_plot(self.plot_path, title, self.rows, self.baseline)
