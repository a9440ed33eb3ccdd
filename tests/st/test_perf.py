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
import shutil
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
# MPICH's mpiexec from the `mpi` extra (`make deps` installs it) sits beside this interpreter.
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
needs_mpi = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None or MPIEXEC is None,
                               reason="mpi4py and mpiexec are not installed (pip install mpi4py mpich)")
MPI_COLUMNS = ["mpi.time", "mpi.algbw", "mpi.busbw", "mpi.#wrong", "mpi.speedup"]
MPI_IN_PLACE_SPEEDUP_COLUMNS = ["mpi.in.speedup"]


def perf(*args: str, env: dict[str, str] | None = None, launcher: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Runs ``[LAUNCHER] python -m hyper_parallel.perf ARGS`` and returns its completed process (text output)."""
    environment = dict(os.environ)
    environment.setdefault("HYPER_PARALLEL_SHMEM_TIMEOUT_SEC", "60")
    if launcher:  # mpiexec ends every rank after this long: no rank outlives a run that timed out
        environment.setdefault("MPIEXEC_TIMEOUT", str(RUN_TIMEOUT_S - 20))
    environment.update(env or {})
    return subprocess.run([*launcher, sys.executable, "-m", "hyper_parallel.perf", *args], capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, env=environment)


def expect_success(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def layout(spec: OpSpec, baseline: bool = True, mpi: bool = False) -> list[str]:
    """The names of ``spec``'s columns, in the table's order (``mpi``: with MPI's group, where the op has one)."""
    in_place = spec.in_place is not InPlace.ABSENT
    columns = COLUMNS + (IN_PLACE_COLUMNS if in_place else [])
    if baseline:
        columns += BASELINE_COLUMNS + (IN_PLACE_SPEEDUP_COLUMNS if in_place else [])
    if mpi and spec.mpi is not None:
        columns += MPI_COLUMNS + (MPI_IN_PLACE_SPEEDUP_COLUMNS if in_place else [])
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
    # One node: the one-sided ops' peer is rank 1 through shared memory, and there is no transport floor.
    assert "# one-sided ops: rank 0 and rank 1 (on rank 0's node, reached through node)" in result.stdout
    assert "# transport floor: absent: the peer (rank 1) is on rank 0's node" in result.stdout

    document = json.loads(json_path.read_text())
    assert document["tool"] == "hp-shmem-perf" and document["schema"] == 6
    settings = document["settings"]
    assert (settings["peer"], settings["peer_crosses_nodes"], settings["peer_transport"], settings["floor"]) == (
        1, False, "node", None)
    assert settings["floor_absent"].startswith("the peer (rank 1) is on rank 0's node")
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
        assert [entry[key] for key in ("mpi_time_us", "mpi_wrong", "mpi_speedup")] == [None] * 3  # MPI not asked for
        assert [entry[key] for key in ("floor_time_us", "floor_wrong", "over_floor")] == [None] * 3  # one node
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


TORCH_SYMM_MEM_OPS = ["moe_dispatch", "moe_combine", "symm_mem_one_shot_all_reduce", "symm_mem_two_shot_all_reduce"]
# Tokens of 16 floats routed to 2 of 2 x 3 experts, skewed, expert regions aligned to 4 rows.
MOE_FLAGS = ["--moe-hidden", "16", "--moe-topk", "2", "--moe-experts", "3", "--moe-routing", "skewed",
             "--moe-align", "4"]


@needs_symmetric_memory
def test_torch_symmetric_memory_ops_report_with_no_wrong_elements(tmp_path) -> None:
    """MoE dispatch and combine through torch's symmetric memory beside gloo (torchtitan's path), and torch's
    all-reduce beside shmem_allreduce: every row checked, sized in whole tokens."""
    json_path = tmp_path / "torch_symm_mem.json"
    result = perf("--op", ",".join(TORCH_SYMM_MEM_OPS), "--nproc", "2", "-b", "1K", "-e", "64K", "-f", "8", "-n", "2",
                  "-w", "1", "-r", "1", "--progress", "off", *MOE_FLAGS, "--json", str(json_path))
    expect_success(result)
    blocks = tables(result.stdout)
    assert list(blocks) == TORCH_SYMM_MEM_OPS
    for op, (titles, rows) in blocks.items():
        columns = layout(OPS[op])
        assert titles == titles_of(columns), op
        assert [int(row[0]) for row in rows] == [1024, 8192, 65536], op
        for row in rows:
            cells = dict(zip(columns, row))
            assert cells["#wrong"] == "0", f"wrong elements in {op}: {row}"
            assert cells["redop"] == ("sum" if OPS[op].reduces else "none")
            assert float(cells["time"]) > 0 and float(cells["gloo.time"]) > 0 and cells["speedup"].endswith("x")
    # torch's all-reduce is timed beside this library's own, the MoE ops beside gloo
    assert result.stdout.count("# shmem_allreduce: symm.shmem_allreduce in place") == 2
    assert result.stdout.count("# gloo: ") == 2
    document = json.loads(json_path.read_text())
    settings = document["settings"]
    assert [settings[key] for key in ("moe_hidden", "moe_topk", "moe_experts", "moe_routing", "moe_align")] == [
        16, 2, 3, "skewed", 4]
    for entry in document["rows"]:
        assert entry["wrong"] == 0
        if OPS[entry["op"]].routed:
            assert entry["count"] % (16 * 2) == 0  # whole tokens, each with its two rows


@needs_mpi
@needs_symmetric_memory
def test_moe_ops_time_mpi_alltoallv_under_mpiexec(tmp_path) -> None:
    """``--baseline gloo,mpi``: MoE dispatch and combine get MPI's columns (Alltoall of the splits, Alltoallv of
    the tokens), checked against gloo's output."""
    result = perf("--op", "moe_dispatch,moe_combine", "--baseline", "gloo,mpi", "-b", "1K", "-e", "8K", "-f", "8",
                  "-n", "2", "-w", "1", "-r", "1", "--progress", "off", *MOE_FLAGS, launcher=(MPIEXEC, "-n", "2"))
    expect_success(result)
    blocks = tables(result.stdout)
    assert list(blocks) == ["moe_dispatch", "moe_combine"]
    for op, (titles, rows) in blocks.items():
        columns = layout(OPS[op], mpi=True)
        assert titles == titles_of(columns), op
        for row in rows:
            cells = dict(zip(columns, row))
            assert cells["#wrong"] == "0" and cells["mpi.#wrong"] == "0", f"wrong elements in {op}: {row}"


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
def test_ordinary_tensors_run_every_form_of_ours_off_the_heap(tmp_path) -> None:
    """``--ordinary-tensors``: the out-of-place, in-place and low-precision groups of the collectives run on ordinary
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
    assert result.stdout.count("# ordinary: ours on ordinary torch tensors (not symmetric") == 2
    assert result.stdout.count("# in place, ordinary: the in-place call on ordinary torch tensors") == 2
    assert "shmem, out-of-place, ordinary" in result.stdout
    assert result.stdout.count("# in place, ordinary, bfloat16: the in-place call with low_precision_dtype") == 2
    assert "shmem, in-place, ordinary, bfloat16" in result.stdout
    document = json.loads(json_path.read_text())
    assert document["settings"]["ordinary_tensors"] is True
    assert all(entry["in_place_wrong"] == 0 and entry["low_precision_wrong"] == 0 for entry in document["rows"])


def test_ordinary_tensors_move_the_other_collectives_correctly(tmp_path) -> None:
    """``--ordinary-tensors`` with all_gather, all_to_all and send_recv: ours on ordinary tensors, every element
    checked against gloo's, in place too."""
    json_path = tmp_path / "ordinary.json"
    result = perf("--op", "all_gather,all_to_all,send_recv", "--nproc", "2", *QUICK, "--ordinary-tensors",
                  "--json", str(json_path))
    expect_success(result)
    assert result.stdout.count("# ordinary: ours on ordinary torch tensors (not symmetric") == 3
    rows = json.loads(json_path.read_text())["rows"]
    assert {row["op"] for row in rows} == {"all_gather", "all_to_all", "send_recv"}
    assert all(row["wrong"] == 0 and row.get("in_place_wrong") in (0, None) for row in rows), rows


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
# MPI beside gloo, under mpiexec.
# --------------------------------------------------------------------------

MPI_OPS = ["barrier", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "signal_pingpong", "put",
           "get", "put_with_signal"]


@needs_mpi
@needs_symmetric_memory
def test_mpi_is_timed_beside_gloo_under_mpiexec_with_no_wrong_elements(tmp_path) -> None:
    """``mpiexec -n 2 ... --baseline gloo,mpi``: the ops with an MPI side get MPI's group of columns, checked
    against gloo's output; the one-sided ops have none; the JSON and the plot carry MPI's values."""
    json_path, plot_path = tmp_path / "mpi.json", tmp_path / "mpi.png"
    result = perf("--op", ",".join(MPI_OPS), "--baseline", "gloo,mpi", "-b", "8", "-e", "64K", "-f", "64", "-n", "2",
                  "-w", "1", "-r", "1", "--progress", "off", "--json", str(json_path), "--plot", str(plot_path),
                  launcher=(MPIEXEC, "-n", "2"))
    expect_success(result)
    assert re.search(r"  baseline gloo  mpi MPICH \S+$", result.stdout.splitlines()[0])
    blocks = tables(result.stdout)
    assert list(blocks) == MPI_OPS
    for op, (titles, rows) in blocks.items():
        spec = OPS[op]
        columns = layout(spec, mpi=True)
        assert titles == titles_of(columns), op
        assert rows, op
        for row in rows:
            cells = dict(zip(columns, row))
            assert len(row) == len(columns), row
            assert cells["#wrong"] == "0" and cells.get("in.#wrong", "0") == "0", f"wrong elements in {op}: {row}"
            if spec.mpi is not None:
                assert cells["mpi.#wrong"] == "0", f"MPI's wrong elements in {op}: {row}"
                assert float(cells["mpi.time"]) > 0 and cells["mpi.speedup"].endswith("x")
        assert (f"# MPI, out of place: {spec.mpi}" in result.stdout or f"# MPI: {spec.mpi}" in result.stdout) == (
            spec.mpi is not None), op
    assert result.stdout.count("# Out of bounds values : 0 OK") == len(MPI_OPS)
    assert result.stdout.count("# Avg bus bandwidth of MPI : ") == len([op for op in MPI_OPS if OPS[op].mpi])

    document = json.loads(json_path.read_text())
    assert document["schema"] == 6
    assert document["settings"]["mpi"] is True and document["settings"]["mpi_library"].startswith("MPICH")
    assert document["settings"]["nranks"] == 2
    for entry in document["rows"]:
        spec = OPS[entry["op"]]
        assert entry["wrong"] == 0 and entry["baseline_time_us"] > 0
        if spec.mpi is None:
            assert [entry[key] for key in ("mpi_time_us", "mpi_busbw", "mpi_wrong", "mpi_speedup")] == [None] * 4
            continue
        assert entry["mpi_wrong"] == 0 and entry["mpi_time_us"] > 0
        assert entry["mpi_busbw"] == pytest.approx(entry["mpi_algbw"] * spec.bus_factor(2))
        if entry["size"]:
            assert entry["mpi_algbw"] == pytest.approx(entry["size"] / entry["mpi_time_us"] / 1e3)
        assert entry["mpi_speedup"] == pytest.approx(entry["mpi_time_us"] / entry["time_us"])
        if spec.in_place is InPlace.SUPPORTED:
            assert entry["in_place_wrong"] == 0
            assert entry["mpi_in_place_speedup"] == pytest.approx(entry["mpi_time_us"] / entry["in_place_time_us"])
    assert {entry["op"] for entry in document["rows"] if entry["mpi_time_us"] is not None} == {
        op for op in MPI_OPS if OPS[op].mpi}
    assert plot_path.read_bytes()[:8] == PNG_MAGIC


@needs_mpi
@needs_symmetric_memory
def test_mpi_checks_every_reduction_and_type(tmp_path) -> None:
    """MPI's reductions (avg: a sum, then a division) and a 16-bit type give gloo's result."""
    for args in (["-o", "avg", "-d", "half"], ["-o", "max", "-d", "int32"], ["-o", "min", "-d", "double"]):
        result = perf("--op", "all_reduce,reduce_scatter", "--baseline", "gloo,mpi", *QUICK, *args,
                      launcher=(MPIEXEC, "-n", "2"))
        expect_success(result)
        for op, (titles, rows) in tables(result.stdout).items():
            columns = layout(OPS[op], mpi=True)
            assert titles == titles_of(columns), (op, args)
            assert all(dict(zip(columns, row))["mpi.#wrong"] == "0" for row in rows), (op, args, rows)


@needs_mpi
@needs_symmetric_memory
@pytest.mark.parametrize("nranks", [3, 8])
def test_mpi_in_an_odd_and_an_oversubscribed_world(nranks: int, tmp_path) -> None:
    """3 ranks (send_recv's last rank idles on every side) and 8 ranks on this machine's 2 cores."""
    json_path = tmp_path / "rows.json"
    ops = ["barrier", "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv"]
    # 96 B and 6 KiB of float split into whole blocks at 3 and at 8 ranks.
    result = perf("--op", ",".join(ops), "--baseline", "gloo,mpi", "-b", "96", "-e", "6K", "-f", "64", "-n", "2",
                  "-w", "1", "-r", "1", "--progress", "off", "--json", str(json_path),
                  launcher=(MPIEXEC, "-n", str(nranks)))
    expect_success(result)
    document = json.loads(json_path.read_text())
    assert document["settings"]["nranks"] == nranks
    rows = document["rows"]
    assert [(row["op"], row["size"]) for row in rows] == [("barrier", 0)] + [
        (op, size) for op in ops[1:] for size in (96, 6144)]
    for row in rows:
        assert row["wrong"] == 0 and row["mpi_wrong"] == 0 and row["mpi_time_us"] > 0, row
        assert row["mpi_busbw"] == pytest.approx(row["mpi_algbw"] * OPS[row["op"]].bus_factor(nranks))


@pytest.mark.parametrize(
    "args, env, message",
    [(["--nproc", "2"], {}, "`--baseline mpi` must run under mpiexec (mpiexec -n N python -m hyper_parallel.perf "
                            "...), but got `--nproc 2`"),
     ([], {"RANK": "0", "WORLD_SIZE": "2"}, "`--baseline mpi` must run under mpiexec (mpiexec -n N python -m "
                                            "hyper_parallel.perf ...), but got a launcher's RANK and WORLD_SIZE")],
)
@needs_mpi
def test_mpi_outside_mpiexec_is_refused_before_any_rank_starts(args: list[str], env: dict[str, str],
                                                                message: str) -> None:
    result = perf("--op", "barrier", "--baseline", "gloo,mpi", *args, env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == f"hp-shmem-perf: error: {message}"
    assert result.stdout == ""


@needs_mpi
def test_nproc_must_match_mpiexecs_world_size() -> None:
    result = perf("--op", "barrier", "--nproc", "3", launcher=(MPIEXEC, "-n", "2"))
    assert result.returncode == 2
    assert result.stderr.count("hp-shmem-perf: error: `--nproc` must match mpiexec's world size (2), but got 3") == 1


@needs_mpi
@needs_symmetric_memory
def test_without_mpi_baseline_mpiexec_only_starts_the_ranks(tmp_path) -> None:
    """Under mpiexec without ``--baseline gloo,mpi``, the ranks meet through MPI and the table has no MPI group."""
    json_path = tmp_path / "rows.json"
    result = perf("--op", "barrier,all_gather", *QUICK, "--json", str(json_path), launcher=(MPIEXEC, "-n", "2"))
    expect_success(result)
    blocks = tables(result.stdout)
    assert blocks["all_gather"][0] == titles_of(layout(OPS["all_gather"]))
    document = json.loads(json_path.read_text())
    assert document["settings"]["nranks"] == 2 and document["settings"]["mpi"] is False
    assert all(entry["mpi_time_us"] is None and entry["wrong"] == 0 for entry in document["rows"])


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


# After mpi4py started MPI, the process holds MPICH's own libucs when MPICH's wheel brings one; the package's UCX (the
# `ucx` extra) then cannot load, and importing the package says why and what to do. Anywhere else it imports.
_IMPORT_AFTER_MPI = """
from mpi4py import MPI
maps = open("/proc/self/maps").read().splitlines()
print("foreign_libucs", any("libucs.so" in line and "libucx" not in line for line in maps))
try:
    import hyper_parallel.core.multicore.shmem
    print("imported")
except ImportError as error:
    print("refused", error)
"""


@needs_mpi
def test_importing_the_package_after_mpi_either_works_or_names_the_other_ucx() -> None:
    """The perf tool imports the package before MPI (the test above runs it under mpiexec); a script that does not
    gets a clear ImportError where MPICH's UCX is loaded and the package's cannot be, and a working import elsewhere."""
    result = subprocess.run([sys.executable, "-c", _IMPORT_AFTER_MPI], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    foreign = lines[0] == "foreign_libucs True"
    if foreign and importlib.util.find_spec("libucx") is not None:
        assert lines[1].startswith("refused UCX's libraries cannot be loaded: another UCX is already loaded in this "
                                   "process (MPICH's wheel brings its own; import hyper_parallel before mpi4py"), lines
    else:
        assert lines[1] == "imported", lines
