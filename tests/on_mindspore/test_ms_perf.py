"""``python -m hyper_parallel.perf.mindspore`` on 2 real ranks (msrun, mccl on CPU): every op on three tiny sizes;
the output's structure and its checks (no wrong element), never its timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import ms_job
from hyper_parallel.perf import mindspore as ms_perf
from hyper_parallel.perf.ops import OPS

_HERE = os.path.dirname(os.path.abspath(__file__))
NRANKS = 2
SIZES = [8, 64, 512]   # -b 8 -e 512 -f 8
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@pytest.fixture(scope="module")
def perf(tmp_path_factory):
    """The tool's JSON document and the job's output of one run of every op."""
    path = str(tmp_path_factory.mktemp("ms-perf") / "perf.json")
    result = ms_job.run(os.path.join(_HERE, "ms_perf_rank.py"), NRANKS, timeout=400,
                        env={"HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "30"},
                        args=("--op", "all", "-b", "8", "-e", "512", "-f", "8", "-n", "2", "-w", "1", "-r", "2",
                              "--json", path))
    assert result.returncode == 0 and not result.timed_out, result.logs[-8000:]
    assert os.path.exists(path), result.logs[-8000:]
    with open(path) as f:
        return json.load(f), result.logs


def test_document_and_settings(perf):
    document, _ = perf
    assert document["tool"] == "hp-shmem-perf-mindspore"
    assert document["schema"] >= 5
    settings = document["settings"]
    assert settings["nranks"] == NRANKS and settings["type"] == "float" and settings["baseline"] == "mccl"
    assert settings["ops"] == list(ms_perf.OP_NAMES)
    assert (settings["min_bytes"], settings["max_bytes"], settings["factor"]) == (8, 512, 8)
    assert (settings["iterations"], settings["warmup"], settings["repeat"]) == (2, 1, 2)


def test_rows_every_op_and_size_checked_and_none_wrong(perf):
    document, _ = perf
    by_op: dict = {}
    for row in document["rows"]:
        by_op.setdefault(row["op"], []).append(row)
    assert list(by_op) == list(ms_perf.OP_NAMES)
    for name in COLLECTIVES:
        rows = by_op[name]
        spec = OPS[name]
        assert [row["size"] for row in rows] == SIZES, name   # 8 B of float splits into 2 ranks' blocks
        for row in rows:
            assert row["count"] == row["size"] // 4 and row["type"] == "float"
            assert row["redop"] == ("sum" if spec.reduces else "none")
            assert row["wrong"] == 0, row
            assert row["time_us"] > 0
            algbw, busbw = spec.bandwidths(row["size"], row["time_us"] * 1e-6, NRANKS)
            assert row["algbw"] == pytest.approx(algbw) and row["busbw"] == pytest.approx(busbw)
    (barrier,) = by_op["barrier"]
    assert (barrier["size"], barrier["count"], barrier["type"], barrier["wrong"]) == (0, 0, "none", 0)


def test_mccl_columns_present_or_explained(perf):
    document, _ = perf
    unavailable = document["settings"]["baseline_unavailable"]
    # mccl's all_reduce, list-form all_gather and barrier work on CPU: they must have been timed.
    assert not set(unavailable) & {"all_reduce", "all_gather", "barrier"}, unavailable
    for row in document["rows"]:
        if row["op"] in unavailable:
            assert unavailable[row["op"]], row["op"]   # a reason, as the table prints it
            assert row["baseline_time_us"] is None and row["speedup"] is None
        else:
            assert row["baseline_time_us"] > 0
            assert row["speedup"] == pytest.approx(row["baseline_time_us"] / row["time_us"])
            algbw, busbw = OPS[row["op"]].bandwidths(row["size"], row["baseline_time_us"] * 1e-6, NRANKS)
            assert row["baseline_algbw"] == pytest.approx(algbw) and row["baseline_busbw"] == pytest.approx(busbw)


def test_table_printed_by_rank_zero(perf):
    document, logs = perf
    assert "# hp-shmem-perf-mindspore: nranks 2  type float" in logs
    for name in ms_perf.OP_NAMES:
        assert f"# {name}: {ms_perf.OURS_RUNS[name]}" in logs
    for name, reason in document["settings"]["baseline_unavailable"].items():
        assert f"# mccl: none: {ms_perf.MCCL_RUNS[name]} fails on this backend: {reason}" in logs
    verdicts = [line.strip() for line in logs.splitlines() if line.startswith("# Out of bounds values")]
    assert len(verdicts) >= len(ms_perf.OP_NAMES) and set(verdicts) == {"# Out of bounds values : 0 OK"}, verdicts


@pytest.mark.parametrize("argv, message", [
    (["-b", "1K", "-e", "8"], "`-e` must be at least `-b` (1024), but got 8"),
    (["--op", "put"], "`--op` must be `all` or names of"),
    (["-n", "0"], "`-n` must be at least 1, but got 0"),
    (["-d", "bfloat16"], "invalid choice: 'bfloat16'"),
])
def test_bad_flags_stop_before_any_rank_joins(argv, message):
    proc = subprocess.run([sys.executable, "-m", "hyper_parallel.perf.mindspore", *argv], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_parse_args_sizes_and_ops():
    args = ms_perf.parse_args(["--op", "barrier,all_gather", "-b", "1K", "-e", "64K", "-f", "4", "-d", "int32"])
    assert args.ops == ["barrier", "all_gather"]
    assert args.sizes == [1024, 4096, 16384, 65536]
    assert args.dtype == "int32"
    assert ms_perf.heap_bytes(16 << 20) == 128 << 20


def test_check_counts_wrong_elements():
    # An operation that leaves the output as it was: every element the reference expects non-zero is wrong.
    case = ms_perf.Case("all_gather", 16, "float32", rank=0, nranks=2)
    assert case.wrong(lambda buffers: None, "output") == int((case.want != 0).sum()) > 0


def test_timing_and_report_are_torch_free_and_serve_mindspore():
    from hyper_parallel.perf.report import Row, Table
    from hyper_parallel.perf.timing import Side, timed_loop

    assert "torch" not in sys.modules
    events = []
    side = Side("mccl", lambda: events.append("run"), lambda: events.append("barrier"),
                lambda: events.append("complete"))
    assert timed_loop(side, 2) >= 0 and events == ["barrier", "run", "run", "complete"]
    row = Row(op="reduce_scatter", size=64, count=16, type="float", redop="sum", time_us=10.0, algbw=0.0064,
              busbw=0.0032, wrong=0)
    table = Table("mccl", memcpy=False)
    line = table.line(row)
    assert line.split() == ["64", "16", "float", "sum", "10.00", "0.01", "0.00", "0"]   # mccl's cells blank
    assert len(line.rstrip()) < len(table.header()[1])
