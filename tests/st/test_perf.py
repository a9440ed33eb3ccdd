"""System tests of ``hp-shmem-perf``: the tool runs as a subprocess, starts its own ranks, and is read back.

Each run measures several ops in one set of ranks (``--op all``) over a tiny sweep, so the module pays for
starting torch in the ranks only a few times; what is asserted is behaviour (columns, files, zero wrong
elements, clear errors), never speed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from hyper_parallel.perf.ops import OPS, InPlace, OpSpec

RUN_TIMEOUT_S = 180
SYMMETRIC_MEMORY = "hyper_parallel.core.symmetric_memory"
# A quick sweep: 3 sizes (8 B, 512 B, 32 KiB), 2 timed operations, one round.
QUICK = ["-b", "8", "-e", "32K", "-f", "64", "-n", "2", "-w", "1", "-r", "1", "--progress", "off"]
# Each column named by its group where its title repeats; the table's titles are the part after the dot.
COLUMNS = ["size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"]
IN_PLACE_COLUMNS = ["in.time", "in.algbw", "in.busbw", "in.#wrong"]
BASELINE_COLUMNS = ["gloo.time", "gloo.algbw", "gloo.busbw", "speedup"]
IN_PLACE_SPEEDUP_COLUMNS = ["in.speedup"]
MEMCPY_COLUMNS = ["memcpy.time", "memcpy.algbw", "ours/"]
LOW_PRECISION_COLUMNS = ["lo.time", "lo.algbw", "lo.busbw", "lo.#wrong", "lo.gain"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EVERY_OP = [name for name, spec in OPS.items() if spec.in_all]  # what `--op all` runs: all but the fused ops
FUSED_OPS = ["fused_all_gather_matmul", "fused_matmul_reduce_scatter"]

needs_symmetric_memory = pytest.mark.skipif(
    importlib.util.find_spec(SYMMETRIC_MEMORY) is None, reason=f"{SYMMETRIC_MEMORY} is not installed"
)


def perf(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Runs ``python -m hyper_parallel.perf ARGS`` and returns its completed process (text output)."""
    environment = dict(os.environ)
    environment.setdefault("HYPER_PARALLEL_SHMEM_TIMEOUT_SEC", "60")
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "hyper_parallel.perf", *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env=environment)


def expect_success(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def layout(spec: OpSpec, baseline: bool = True) -> list[str]:
    """The names of ``spec``'s columns, in the table's order."""
    in_place = spec.in_place is not InPlace.ABSENT
    columns = COLUMNS + (IN_PLACE_COLUMNS if in_place else [])
    if baseline:
        columns += BASELINE_COLUMNS + (IN_PLACE_SPEEDUP_COLUMNS if in_place else [])
    return columns + (MEMCPY_COLUMNS if spec.memcpy_reference else [])


def titles_of(columns: list[str]) -> list[str]:
    return [name.split(".")[-1] for name in columns]


def tables(stdout: str) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Each op's column titles and data rows, from the tool's output (one block per op)."""
    blocks: dict[str, tuple[list[str], list[list[str]]]] = {}
    op = None
    for line in stdout.splitlines():
        heading = re.match(r"^# (\w+): ", line)
        if heading and heading.group(1) in OPS:
            op = heading.group(1)
            blocks[op] = ([], [])
        elif op and line.lstrip("#").split()[:1] == ["size"]:
            blocks[op][0].extend(line.lstrip("#").split())
        elif op and line.strip() and not line.startswith("#"):
            blocks[op][1].append(line.split())
    return blocks


# --------------------------------------------------------------------------
# Every op, 2 ranks, every output format.
# --------------------------------------------------------------------------


@needs_symmetric_memory
def test_every_op_reports_every_format_with_no_wrong_elements(tmp_path) -> None:
    json_path, plot_path = tmp_path / "all.json", tmp_path / "all.png"
    result = perf("--op", "all", "--nproc", "2", *QUICK, "--json", str(json_path), "--plot", str(plot_path))
    expect_success(result)

    blocks = tables(result.stdout)
    assert list(blocks) == EVERY_OP
    for op, (titles, rows) in blocks.items():
        spec = OPS[op]
        columns = layout(spec)
        assert titles == titles_of(columns), op
        assert rows, op
        for row in rows:
            assert len(row) == len(columns), row
            cells = dict(zip(columns, row))
            assert cells["#wrong"] == "0", f"wrong elements in {op}: {row}"
            assert float(cells["time"]) > 0 and float(cells["gloo.time"]) > 0 and cells["speedup"].endswith("x")
            if spec.in_place is InPlace.SUPPORTED:
                assert cells["in.#wrong"] == "0", f"wrong elements in place in {op}: {row}"
                assert float(cells["in.time"]) > 0 and cells["in.speedup"].endswith("x")
        if spec.sized:
            assert [int(row[0]) for row in rows] == [8, 512, 32768], op
            assert all(row[2] == "float" for row in rows)
            assert all(row[3] == ("sum" if spec.reduces else "none") for row in rows)
        else:
            assert [int(row[0]) for row in rows] == [spec.fixed_bytes], op
            assert rows[0][2] == spec.fixed_type
    assert result.stdout.count("# Out of bounds values : 0 OK") == len(EVERY_OP)

    document = json.loads(json_path.read_text())
    assert document["tool"] == "hp-shmem-perf" and document["schema"] == 3
    settings = document["settings"]
    assert (settings["ops"], settings["nranks"], settings["type"], settings["iterations"], settings["baseline"]) == (
        EVERY_OP, 2, "float", 2, "gloo")
    assert [entry["op"] for entry in document["rows"]] == [op for op, (_, rows) in blocks.items() for _ in rows]
    for entry in document["rows"]:
        spec = OPS[entry["op"]]
        assert entry["wrong"] == 0 and entry["time_us"] > 0 and entry["baseline_time_us"] > 0
        if entry["size"]:
            assert entry["algbw"] == pytest.approx(entry["size"] / entry["time_us"] / 1e3)
        assert entry["busbw"] == pytest.approx(entry["algbw"] * spec.bus_factor(2))
        assert entry["speedup"] == pytest.approx(entry["baseline_time_us"] / entry["time_us"])
        if spec.in_place is InPlace.SUPPORTED:
            assert entry["in_place_wrong"] == 0 and entry["in_place_time_us"] > 0
            assert entry["in_place_busbw"] == pytest.approx(entry["in_place_algbw"] * spec.bus_factor(2))
            assert entry["in_place_speedup"] == pytest.approx(entry["baseline_time_us"] / entry["in_place_time_us"])
        else:  # no in-place group: null here
            assert [entry[key] for key in ("in_place_time_us", "in_place_busbw", "in_place_wrong",
                                           "in_place_speedup")] == [None] * 4
        if spec.memcpy_reference:
            assert entry["memcpy_time_us"] > 0
            assert entry["memcpy_fraction"] == pytest.approx(entry["memcpy_time_us"] / entry["time_us"])
        else:
            assert entry["memcpy_time_us"] is None and entry["memcpy_fraction"] is None
    assert plot_path.read_bytes()[:8] == PNG_MAGIC


@needs_symmetric_memory
def test_fused_ops_report_against_the_unfused_sequence(tmp_path) -> None:
    json_path = tmp_path / "fused.json"
    result = perf("--op", ",".join(FUSED_OPS), "--nproc", "2", "-b", "4K", "-e", "64K", "-f", "4", "-n", "2", "-w", "1",
                  "-r", "1", "--progress", "off", "--mm-k", "64", "--mm-n", "32", "-o", "avg", "--json", str(json_path))
    expect_success(result)
    blocks = tables(result.stdout)
    assert list(blocks) == FUSED_OPS
    for op, (titles, rows) in blocks.items():
        assert titles == titles_of(layout(OPS[op])), op
        assert [int(row[0]) for row in rows] == [4096, 16384, 65536], op
        for row in rows:
            cells = dict(zip(layout(OPS[op]), row))
            assert cells["#wrong"] == "0", f"wrong elements in {op}: {row}"
            assert cells["redop"] == ("avg" if op == "fused_matmul_reduce_scatter" else "none")
            assert float(cells["time"]) > 0 and float(cells["gloo.time"]) > 0 and cells["speedup"].endswith("x")
        # The baseline columns are the unfused sequence on this library, and say so.
        assert f"# {op}: symm.{op}: " in result.stdout
    assert result.stdout.count("# unfused: ") == 2 and "# gloo" not in result.stdout
    group_lines = [line for line in result.stdout.splitlines() if "hyper_parallel.shmem" in line]
    assert len(group_lines) == 2 and all(line.split()[-1] == "unfused" for line in group_lines)
    document = json.loads(json_path.read_text())
    assert (document["settings"]["mm_k"], document["settings"]["mm_n"]) == (64, 32)
    for entry in document["rows"]:
        assert entry["wrong"] == 0 and entry["count"] == entry["size"] // 4
        assert entry["speedup"] == pytest.approx(entry["baseline_time_us"] / entry["time_us"])


@needs_symmetric_memory
def test_low_precision_group_beside_full_precision_within_the_bound(tmp_path) -> None:
    """``--low-precision``: all_reduce and reduce_scatter get a group of columns for ours in place in that dtype,
    checked against the documented error bound; the other ops are unchanged."""
    json_path = tmp_path / "low.json"
    result = perf("--op", "all_reduce,reduce_scatter,all_gather", "--nproc", "2", "-b", "1K", "-e", "1M", "-f", "32",
                  "-n", "2", "-w", "1", "-r", "1", "--progress", "off", "--low-precision", "float8_e4m3fn",
                  "-o", "avg", "--json", str(json_path))
    expect_success(result)
    blocks = tables(result.stdout)
    assert "low precision float8_e4m3fn" in result.stdout.splitlines()[0]
    for op in ("all_reduce", "reduce_scatter"):
        columns = COLUMNS + IN_PLACE_COLUMNS + LOW_PRECISION_COLUMNS + BASELINE_COLUMNS + IN_PLACE_SPEEDUP_COLUMNS
        titles, rows = blocks[op]
        assert titles == titles_of(columns), op
        assert [int(row[0]) for row in rows] == [1024, 32768, 1048576], op
        for row in rows:
            cells = dict(zip(columns, row))
            assert cells["lo.#wrong"] == "0" and float(cells["lo.time"]) > 0 and cells["lo.gain"].endswith("x")
        assert "# in place, float8_e4m3fn: the in-place call with low_precision_dtype=float8_e4m3fn" in result.stdout
    assert blocks["all_gather"][0] == titles_of(layout(OPS["all_gather"]))  # no low-precision group
    assert result.stdout.count("# Avg bus bandwidth in place, low precision : ") == 2
    document = json.loads(json_path.read_text())
    assert document["settings"]["low_precision"] == "float8_e4m3fn"
    for entry in document["rows"]:
        if entry["op"] == "all_gather":
            assert entry["low_precision_time_us"] is None and entry["low_precision_gain"] is None
        else:
            assert entry["low_precision_wrong"] == 0
            assert entry["low_precision_busbw"] == pytest.approx(entry["low_precision_algbw"]
                                                                 * OPS[entry["op"]].bus_factor(2))
            assert entry["low_precision_gain"] == pytest.approx(entry["in_place_time_us"]
                                                                / entry["low_precision_time_us"])


@needs_symmetric_memory
def test_ordinary_tensors_run_the_in_place_and_low_precision_forms_off_the_heap(tmp_path) -> None:
    """``--ordinary-tensors``: the in-place and low-precision groups of all_reduce and reduce_scatter run on ordinary
    torch tensors (the staged paths), say so, and are checked like the symmetric ones."""
    json_path = tmp_path / "ordinary.json"
    result = perf("--op", "all_reduce,reduce_scatter", "--nproc", "2", "-b", "1K", "-e", "1M", "-f", "32",
                  "-n", "2", "-w", "1", "-r", "1", "--progress", "off", "--low-precision", "bfloat16",
                  "--ordinary-tensors", "--json", str(json_path))
    expect_success(result)
    assert result.stdout.splitlines()[0].endswith("low precision bfloat16  ordinary tensors")
    blocks = tables(result.stdout)
    columns = COLUMNS + IN_PLACE_COLUMNS + LOW_PRECISION_COLUMNS + BASELINE_COLUMNS + IN_PLACE_SPEEDUP_COLUMNS
    for op in ("all_reduce", "reduce_scatter"):
        titles, rows = blocks[op]
        assert titles == titles_of(columns), op
        for row in rows:
            cells = dict(zip(columns, row))
            assert cells["#wrong"] == cells["in.#wrong"] == cells["lo.#wrong"] == "0", (op, row)
    assert result.stdout.count("# in place, ordinary: the in-place call on ordinary torch tensors") == 2
    assert result.stdout.count("# in place, ordinary, bfloat16: the in-place call with low_precision_dtype") == 2
    assert "shmem, in-place, ordinary, bfloat16" in result.stdout
    document = json.loads(json_path.read_text())
    assert document["settings"]["ordinary_tensors"] is True
    assert all(entry["in_place_wrong"] == 0 and entry["low_precision_wrong"] == 0 for entry in document["rows"])


def test_without_baseline_or_check_the_gloo_columns_go(tmp_path) -> None:
    plot_path = tmp_path / "barrier.png"
    result = perf("--op", "barrier,get,reduce_scatter", "--nproc", "2", *QUICK, "--baseline", "none", "-c", "0",
                  "--plot", str(plot_path))
    expect_success(result)
    blocks = tables(result.stdout)
    assert blocks["barrier"][0] == COLUMNS
    assert blocks["get"][0] == titles_of(COLUMNS + MEMCPY_COLUMNS)
    assert blocks["reduce_scatter"][0] == titles_of(COLUMNS + IN_PLACE_COLUMNS)
    for op, (_, rows) in blocks.items():
        wrong_columns = [index for index, name in enumerate(layout(OPS[op], baseline=False)) if "#wrong" in name]
        assert all(row[index] == "N/A" for row in rows for index in wrong_columns), op
    assert "# Out of bounds values : N/A (check off)" in result.stdout
    assert plot_path.read_bytes()[:8] == PNG_MAGIC


# --------------------------------------------------------------------------
# 4 ranks on 2 cores.
# --------------------------------------------------------------------------


@needs_symmetric_memory
def test_four_ranks_complete(tmp_path) -> None:
    json_path = tmp_path / "rows.json"
    result = perf("--op", "barrier,all_gather,all_reduce", "--nproc", "4", *QUICK, "--json", str(json_path))
    expect_success(result)
    document = json.loads(json_path.read_text())
    assert document["settings"]["nranks"] == 4
    rows = document["rows"]
    assert all(row["wrong"] == 0 for row in rows)
    assert all(row["in_place_wrong"] == 0 for row in rows if row["op"] != "barrier")
    # 8 B of float cannot be split into 4 blocks: nccl-tests skips such a size too.
    assert [row["size"] for row in rows if row["op"] == "all_gather"] == [512, 32768]
    assert [row["size"] for row in rows if row["op"] == "all_reduce"] == [8, 512, 32768]
    for row in rows:
        factor = {"all_gather": 3 / 4, "all_reduce": 2 * 3 / 4, "barrier": 1.0}[row["op"]]
        assert row["busbw"] == pytest.approx(row["algbw"] * factor)
        if row["op"] != "barrier":
            assert row["in_place_busbw"] == pytest.approx(row["in_place_algbw"] * factor)


# --------------------------------------------------------------------------
# Errors: clear messages, non-zero exits, no hangs.
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [(["-b", "64M", "-e", "1M"], "hp-shmem-perf: error: `-e` must be at least `-b` (67108864), but got 1048576"),
     (["--op", "put,broadcast"], "hp-shmem-perf: error: `--op` must be all or a comma-separated list of put, get,"),
     (["-b", "8Q"], "argument -b/--minbytes: size must be a whole number of bytes with an optional K/M/G/T suffix, "
                    "but got '8Q'")],
)
def test_bad_flags_fail_before_any_rank_starts(args: list[str], message: str) -> None:
    result = perf(*args)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: hp-shmem-perf")
    assert message in result.stderr
    assert result.stdout == ""


def test_nproc_must_match_a_launchers_world_size() -> None:
    result = perf("--op", "barrier", "--nproc", "4", env={"RANK": "0", "WORLD_SIZE": "2"})
    assert result.returncode == 2
    assert "`--nproc` must match the launcher's WORLD_SIZE (2), but got 4" in result.stderr


def test_a_failing_rank_ends_the_run_with_its_error() -> None:
    # A heap far too small for the row: the allocation fails, and no rank may hang.
    result = perf("--op", "put", "--nproc", "2", "-b", "4M", "-e", "4M", "-n", "1", "-w", "0", "-r", "1",
                  env={"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "1M"})
    assert result.returncode == 1
    assert "hp-shmem-perf: rank 0 failed: ShmemOutOfMemoryError" in result.stderr
    assert re.search(r"hp-shmem-perf: rank \d failed \(exit status 1\)$", result.stderr.rstrip())
