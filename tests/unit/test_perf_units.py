"""Unit tests of hp-shmem-perf's pure parts: sizes, nccl-tests' accounting, the command line, the table.

No rank is started here (tests/st/test_perf.py runs the tool).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from hyper_parallel.perf.cases import CASES, InPlaceCase, count_wrong, input_pattern
from hyper_parallel.perf import config as config_module
from hyper_parallel.perf.config import build_parser, config_from_args, parse_config, resolve_peer, run_heap_size
from hyper_parallel.perf.mpi import under_mpiexec
from hyper_parallel.perf.ops import OPS, InPlace
from hyper_parallel.perf.progress import render_bar
from hyper_parallel.perf.report import Row, Table, footer, format_time_us, write_json, write_plot
from hyper_parallel.perf.timing import time_per_operation_us
from hyper_parallel.perf.units import format_size, parse_size, size_sweep

# --------------------------------------------------------------------------
# units.py
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [("8", 8), ("0", 0), ("1K", 1024), ("1k", 1024), ("64M", 64 << 20), ("2G", 2 << 30), ("1T", 1 << 40),
     ("4KB", 4096), ("4KiB", 4096), ("16B", 16), (" 32M ", 32 << 20)],
)
def test_parse_size_reads_binary_suffixes_like_nccl_tests(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "M", "1.5M", "-1", "1X", "1 K B", "iB", "8iB"])
def test_parse_size_rejects_anything_else_with_the_value_in_the_message(text: str) -> None:
    with pytest.raises(ValueError, match=r"size must be a whole number of bytes .*, but got " + repr(text)):
        parse_size(text)


def test_format_size_uses_the_largest_exact_unit() -> None:
    assert [format_size(n) for n in (8, 1024, 1536, 64 << 20, 3 << 30)] == ["8", "1K", "1536", "64M", "3G"]


def test_size_sweep_multiplies_while_within_the_maximum() -> None:
    assert size_sweep(8, 64 << 20, 8) == [8 * 8**k for k in range(8)]  # 128M would pass -e
    assert size_sweep(4, 64 << 20, 8)[-1] == 64 << 20
    assert size_sweep(1024, 1024, 2) == [1024]


@pytest.mark.parametrize(
    "args, message",
    [((0, 8, 2), "`-b` must be at least 1 byte, but got 0"),
     ((16, 8, 2), "`-e` must be at least `-b` (16), but got 8"),
     ((8, 64, 1), "`-f` must be at least 2, but got 1")],
)
def test_size_sweep_rejects_bad_bounds(args: tuple, message: str) -> None:
    with pytest.raises(ValueError) as error:
        size_sweep(*args)
    assert str(error.value) == message


# --------------------------------------------------------------------------
# ops.py: nccl-tests' accounting
# --------------------------------------------------------------------------


@pytest.mark.parametrize("nranks", [2, 3, 4, 8])
def test_bus_factors_are_nccl_tests_definitions(nranks: int) -> None:
    # all_reduce.cu: 2(n-1)/n; all_gather.cu, reduce_scatter.cu, alltoall.cu: (n-1)/n; sendrecv.cu: 1.
    expected = {
        "all_reduce": 2 * (nranks - 1) / nranks,
        "all_gather": (nranks - 1) / nranks,
        "reduce_scatter": (nranks - 1) / nranks,
        "all_to_all": (nranks - 1) / nranks,
        "send_recv": 1.0,
        "put": 1.0,
        "get": 1.0,
        "put_with_signal": 1.0,
        "signal_pingpong": 1.0,
        "barrier": 1.0,
        # the fused ops are sized like the collective they contain
        "fused_all_gather_matmul": (nranks - 1) / nranks,
        "fused_matmul_reduce_scatter": (nranks - 1) / nranks,
        # dispatch and combine are all-to-alls of one rank's routed tokens; torch's all-reduce is an all-reduce
        "moe_dispatch": (nranks - 1) / nranks,
        "moe_combine": (nranks - 1) / nranks,
        "symm_mem_one_shot_all_reduce": 2 * (nranks - 1) / nranks,
        "symm_mem_two_shot_all_reduce": 2 * (nranks - 1) / nranks,
    }
    assert set(expected) == set(OPS)
    for name, factor in expected.items():
        assert math.isclose(OPS[name].bus_factor(nranks), factor), name


def test_bandwidths_are_size_over_time_in_decimal_gigabytes() -> None:
    algbw, busbw = OPS["all_reduce"].bandwidths(64 << 20, 0.01, 2)
    assert math.isclose(algbw, (64 << 20) / 0.01 / 1e9)
    assert math.isclose(busbw, algbw)  # 2(n-1)/n = 1 at n = 2
    algbw, busbw = OPS["all_gather"].bandwidths(1_000_000_000, 1.0, 4)
    assert (algbw, busbw) == (1.0, 0.75)
    assert OPS["barrier"].bandwidths(0, 1e-6, 2) == (0.0, 0.0)


def test_element_counts_round_split_ops_down_to_whole_blocks() -> None:
    # nccl-tests sizes all_gather/reduce_scatter/all_to_all by their whole buffer of n blocks.
    assert OPS["all_gather"].element_count(60, 4, 4) == 12
    assert OPS["reduce_scatter"].element_count(64, 4, 4) == 16
    assert OPS["all_to_all"].element_count(8, 4, 4) == 0  # too small to give every rank an element
    assert OPS["all_reduce"].element_count(60, 4, 4) == 15
    assert OPS["put"].element_count(7, 4, 2) == 1
    assert OPS["signal_pingpong"].element_count(1 << 20, 4, 2) == 1  # one signal, whatever -b says
    assert OPS["barrier"].element_count(1 << 20, 4, 2) == 0


def test_fused_ops_count_whole_matrix_rows_on_every_rank() -> None:
    # 2 ranks, k = 2048 fp32: a row of the gathered matrix is 8 KiB, so 32 MiB is 2048 rows per rank (the issue's
    # case), and anything under one row per rank is skipped.
    gather = OPS["fused_all_gather_matmul"]
    assert gather.element_count(32 << 20, 4, 2, row_elements=2048) == 2 * 2048 * 2048
    assert gather.element_count((32 << 20) + 5000, 4, 2, row_elements=2048) == 2 * 2048 * 2048
    assert gather.element_count(8 << 10, 4, 2, row_elements=2048) == 0
    scatter = OPS["fused_matmul_reduce_scatter"]
    assert scatter.element_count(4 * (3 * 4 * 16 + 20), 4, 3, row_elements=16) == 3 * 4 * 16  # 4 rows per rank
    config = parse_config(["--op", "fused_all_gather_matmul,fused_matmul_reduce_scatter,all_gather",
                           "--mm-k", "64", "--mm-n", "32"])
    assert [config.row_elements(op) for op in config.ops] == [64, 32, 1]
    assert (config.mm_k, config.mm_n) == (64, 32)
    assert (parse_config([]).mm_k, parse_config([]).mm_n) == (2048, 2048)


def test_moe_ops_count_whole_tokens_with_all_their_rows() -> None:
    # hidden 16 fp32 and top-2: a token is 2 rows of 64 B; 1000 B hold 7 tokens, 100 B none.
    config = parse_config(["--op", "moe_dispatch,moe_combine,all_to_all", "--moe-hidden", "16", "--moe-topk", "2"])
    assert [config.row_elements(op) for op in config.ops] == [32, 32, 1]
    for spec in config.ops[:2]:
        assert spec.routed and not spec.in_all and not spec.takes_ordinary_tensors and spec.mpi is not None
        assert spec.element_count(1000, 4, 2, row_elements=32) == 7 * 32
        assert spec.element_count(100, 4, 2, row_elements=32) == 0
    defaults = parse_config([])
    assert (defaults.moe_hidden, defaults.moe_topk, defaults.moe_experts, defaults.moe_routing,
            defaults.moe_align) == (1024, 2, 4, "uniform", 1)


def test_torch_all_reduce_ops_sum_beside_shmem_allreduce() -> None:
    for name in ("symm_mem_one_shot_all_reduce", "symm_mem_two_shot_all_reduce"):
        spec = OPS[name]
        assert spec.sum_only and spec.reduces and spec.baseline_label == "shmem_allreduce" and not spec.in_all
        assert spec.mpi is None and spec.needs_symmetric_memory


def test_moe_routing_gives_every_token_distinct_experts() -> None:
    from hyper_parallel.perf.cases import RankInfo, moe_routing

    info = RankInfo(rank=1, nranks=4, dtype=torch.float32, redop="sum", moe_topk=2, moe_experts=3)
    uniform = moe_routing(info, 600)
    assert len(uniform) == 12 and sum(uniform) == 1200
    assert max(uniform) < 2 * min(uniform)  # about 100 each
    assert moe_routing(info, 600) == uniform  # seeded by the rank: the same plan every run
    skewed = moe_routing(info._replace(moe_routing="skewed"), 600)
    assert sum(skewed) == 1200 and skewed[0] > 2 * skewed[-1]  # Zipf: the first experts get the most
    # top-k distinct: no expert can take more than one copy of a token
    assert max(moe_routing(info._replace(moe_topk=12), 5)) == 5
    assert moe_routing(info, 0) == [0] * 12


def test_dispatch_layout_aligns_every_experts_region() -> None:
    from hyper_parallel.perf.cases import MoeDispatchCase, RankInfo

    case = MoeDispatchCase.__new__(MoeDispatchCase)  # the layout only: no buffers, no ranks
    case.info = RankInfo(rank=0, nranks=2, dtype=torch.float32, redop="sum", moe_experts=3, moe_align=4)
    # [source][expert] rows received: expert 0 gets 3 + 2, expert 1 none, expert 2 gets 1 + 4
    starts = case.dispatch_layout([[3, 0, 1], [2, 0, 4]])
    # regions at 0, 8 (5 rows round up to 8) and 12 (expert 1's region is empty and still takes 4 rows)
    assert starts == [[0, 8, 12], [3, 8, 13]]


def test_moe_heap_holds_every_ranks_tokens() -> None:
    from hyper_parallel.perf.runner import heap_bytes

    config = parse_config(["--op", "moe_dispatch", "-b", "1M", "-e", "1M"])
    assert heap_bytes(config, 8) == (11 << 20) + (64 << 20)  # n + 3 rows
    assert heap_bytes(parse_config(["--op", "all_reduce", "-b", "1M", "-e", "1M"]), 8) == (4 << 20) + (64 << 20)


def test_fused_ops_have_an_unfused_baseline_and_run_only_when_named() -> None:
    fused = [spec for spec in OPS.values() if spec.fused]
    assert [spec.name for spec in fused] == ["fused_all_gather_matmul", "fused_matmul_reduce_scatter"]
    for spec in fused:
        assert spec.baseline_label == "unfused" and not spec.in_all and spec.needs_symmetric_memory
        assert "speedup: unfused time / fused time" in spec.baseline
    assert not any(spec.fused or spec.baseline_label for spec in OPS.values() if spec.in_all)
    header = Table("unfused", memcpy=False).header()[0]
    assert header[1:].split() == ["hyper_parallel.shmem", "unfused"]


def test_the_collectives_have_nccl_tests_in_place_group() -> None:
    in_place = {name: spec.in_place for name, spec in OPS.items()}
    assert in_place == {
        "all_gather": InPlace.SUPPORTED, "all_reduce": InPlace.SUPPORTED, "reduce_scatter": InPlace.SUPPORTED,
        "all_to_all": InPlace.SUPPORTED,
        "put": InPlace.ABSENT, "get": InPlace.ABSENT, "put_with_signal": InPlace.ABSENT,
        "signal_pingpong": InPlace.ABSENT, "barrier": InPlace.ABSENT,
        "send_recv": InPlace.ABSENT, "fused_all_gather_matmul": InPlace.ABSENT,
        "fused_matmul_reduce_scatter": InPlace.ABSENT, "moe_dispatch": InPlace.ABSENT, "moe_combine": InPlace.ABSENT,
        "symm_mem_one_shot_all_reduce": InPlace.ABSENT, "symm_mem_two_shot_all_reduce": InPlace.ABSENT,
    }
    for name, spec in OPS.items():
        assert bool(spec.in_place_summary) == (spec.in_place is not InPlace.ABSENT), name
        runs_in_place = issubclass(CASES[name], InPlaceCase)
        assert runs_in_place == (spec.in_place is InPlace.SUPPORTED), name


def test_fixed_size_ops_have_one_size() -> None:
    config = parse_config(["--op", "barrier,signal_pingpong,put", "-b", "1K", "-e", "4K"])
    barrier, signal, put = config.ops
    assert (config.sizes(barrier), config.dtype_label(barrier)) == ([0], "none")
    assert (config.sizes(signal), config.dtype_label(signal)) == ([8], "int64")
    assert (config.sizes(put), config.dtype_label(put)) == ([1024, 2048, 4096], "float")


# --------------------------------------------------------------------------
# config.py
# --------------------------------------------------------------------------


def test_defaults_match_the_readme_sweep() -> None:
    config = parse_config([])
    assert ([op.name for op in config.ops], config.nproc, config.min_bytes, config.max_bytes, config.factor) == (
        ["all_reduce"], None, 8, 64 << 20, 2)
    assert (config.iterations, config.warmup, config.repeat, config.dtype, config.redop) == (20, 5, 3, "float32", "sum")
    op = config.ops[0]
    assert (config.check, config.baseline, config.dtype_label(op), config.redop_label(op)) == (
        True, "gloo", "float", "sum")
    assert config.redop_label(OPS["put"]) == "none"  # put does not reduce


def test_op_lists_keep_their_order_and_all_means_the_whole_table() -> None:
    assert [op.name for op in parse_config(["--op", "barrier,put,barrier"]).ops] == ["barrier", "put"]
    assert [op.name for op in parse_config(["--op", "all"]).ops] == [name for name in OPS if OPS[name].in_all]
    assert "fused_all_gather_matmul" not in [op.name for op in parse_config(["--op", "all"]).ops]
    assert parse_config(["--op", "all"]).min_ranks == 2


@pytest.mark.parametrize(
    "argv, message",
    [(["--op", "scatter"], "`--op` must be all or a comma-separated list of put, get, put_with_signal, signal_pingpong, barrier, "
                           "all_gather, all_reduce, reduce_scatter, all_to_all, send_recv, fused_all_gather_matmul, "
                           "fused_matmul_reduce_scatter, moe_dispatch, moe_combine, symm_mem_one_shot_all_reduce, "
                           "symm_mem_two_shot_all_reduce, but got 'scatter'"),
     (["--op", "put,all"], "`--op` must be all or a comma-separated list of put, get, put_with_signal, signal_pingpong, barrier, "
                           "all_gather, all_reduce, reduce_scatter, all_to_all, send_recv, fused_all_gather_matmul, "
                           "fused_matmul_reduce_scatter, moe_dispatch, moe_combine, symm_mem_one_shot_all_reduce, "
                           "symm_mem_two_shot_all_reduce, but got 'all'"),
     (["-b", "0"], "`-b` must be at least 1 byte, but got 0"),
     (["-b", "1M", "-e", "1K"], "`-e` must be at least `-b` (1048576), but got 1024"),
     (["-f", "1"], "`-f` must be at least 2, but got 1"),
     (["-n", "0"], "`-n` must be at least 1, but got 0"),
     (["-w", "-1"], "`-w` must be at least 0, but got -1"),
     (["-r", "0"], "`-r` must be at least 1, but got 0"),
     (["-d", "complex64"], "`-d` must be one of int8, uint8, int32, int64, half, float16, bfloat16, float, "
                           "float32, double, float64, but got 'complex64'"),
     (["-o", "xor"], "`-o` must be one of sum, min, max, avg, but got 'xor'"),
     (["-o", "avg", "-d", "int32"], "`-o avg` must have a floating-point `-d`, but got int32"),
     (["-c", "2"], "`-c` must be one of 0, 1, but got '2'"),
     (["--baseline", "ucx"], "`--baseline` must be none or a comma-separated list of gloo, mpi, but got 'ucx'"),
     (["--baseline", "gloo,none"], "`--baseline` must be none or a comma-separated list of gloo, mpi, "
                                   "but got 'none'"),
     (["--baseline", "mpi"], "`--baseline mpi` must come with gloo (`--baseline gloo,mpi`), but got 'mpi'"),
     (["--op", "put_with_signal,fused_all_gather_matmul", "--baseline", "gloo,mpi"],
      "`--baseline mpi` must come with `--op` put, get, barrier, all_gather, all_reduce, reduce_scatter, all_to_all, "
      "send_recv, moe_dispatch, moe_combine, but got put_with_signal,fused_all_gather_matmul"),
     (["--baseline", "gloo,mpi", "-d", "bfloat16"], "`--baseline mpi` must have a `-d` that numpy has, "
                                                    "but got bfloat16"),
     (["--progress", "yes"], "`--progress` must be one of auto, on, off, but got 'yes'"),
     (["--op", "barrier,put", "--nproc", "1"], "`--nproc` must be at least 2, but got 1"),
     (["--mm-k", "0"], "`--mm-k` must be at least 1, but got 0"),
     (["--mm-n", "-2"], "`--mm-n` must be at least 1, but got -2"),
     (["--op", "fused_all_gather_matmul", "-d", "int32"],
      "`-d` must be a floating-point type for fused_all_gather_matmul, but got int32"),
     (["--op", "fused_matmul_reduce_scatter", "-o", "max"],
      "`-o` must be sum or avg for fused_matmul_reduce_scatter, but got 'max'"),
     (["--op", "symm_mem_two_shot_all_reduce", "-o", "avg"],
      "`-o` must be sum for symm_mem_two_shot_all_reduce (torch's all-reduce sums only), but got 'avg'"),
     (["--moe-topk", "0"], "`--moe-topk` must be at least 1, but got 0"),
     (["--moe-hidden", "0"], "`--moe-hidden` must be at least 1, but got 0"),
     (["--moe-experts", "0"], "`--moe-experts` must be at least 1, but got 0"),
     (["--moe-align", "0"], "`--moe-align` must be at least 1, but got 0"),
     (["--moe-routing", "zipf"], "`--moe-routing` must be one of uniform, skewed, but got 'zipf'")],
)
def test_bad_flags_exit_like_argparse_with_the_rule_and_the_value(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: hp-shmem-perf")
    assert err.rstrip().endswith(f"hp-shmem-perf: error: {message}")


def test_low_precision_applies_to_the_reductions_and_is_a_setting() -> None:
    config = parse_config(["--op", "all_gather,reduce_scatter", "--low-precision", "float8_e5m2", "-o", "avg"])
    assert config.low_precision == "float8_e5m2" and config.settings(2)["low_precision"] == "float8_e5m2"
    assert parse_config([]).low_precision is None and parse_config([]).settings(2)["low_precision"] is None
    assert parse_config(["-d", "double", "--low-precision", "bfloat16"]).low_precision == "bfloat16"
    assert [name for name, op in OPS.items() if op.low_precision] == ["all_reduce", "reduce_scatter"]


def test_ordinary_tensors_apply_to_the_collectives_and_are_a_setting() -> None:
    config = parse_config(["--op", "all_gather,all_reduce", "--ordinary-tensors"])
    assert config.ordinary_tensors and config.settings(2)["ordinary_tensors"] is True
    assert not parse_config([]).ordinary_tensors and parse_config([]).settings(2)["ordinary_tensors"] is False
    assert [name for name, op in OPS.items() if op.takes_ordinary_tensors] == [
        "all_gather", "all_reduce", "reduce_scatter", "all_to_all", "send_recv"]


@pytest.mark.parametrize(
    "argv, message",
    [(["--op", "put,barrier", "--ordinary-tensors"],
      "`--ordinary-tensors` must come with `--op` all_gather, all_reduce, reduce_scatter, all_to_all, send_recv or "
      "all, but got put,barrier"),
     (["--low-precision", "fp8"], "`--low-precision` must be one of float16, bfloat16, float8_e4m3fn, float8_e5m2, "
                                  "but got 'fp8'"),
     (["--op", "all_gather", "--low-precision", "float16"],
      "`--low-precision` must come with `--op` all_reduce or reduce_scatter, but got all_gather"),
     (["--low-precision", "bfloat16", "-o", "max"], "`--low-precision` must have `-o` sum or avg, but got 'max'"),
     (["--low-precision", "float16", "-d", "half"],
      "`--low-precision` must be narrower than a floating-point `-d` (float16), but got float16"),
     (["--low-precision", "float8_e4m3fn", "-d", "int32"],
      "`--low-precision` must be narrower than a floating-point `-d` (int32), but got float8_e4m3fn")],
)
def test_bad_low_precision_flags_exit_like_argparse(argv: list[str], message: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(f"hp-shmem-perf: error: {message}")


def test_unparsable_values_are_argparse_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config(["-b", "1.5M"])
    assert "argument -b/--minbytes: size must be a whole number of bytes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_config(["--nproc", "two"])
    assert "argument --nproc: invalid int value: 'two'" in capsys.readouterr().err


def test_config_from_args_raises_value_error_for_programmatic_use() -> None:
    args = build_parser().parse_args(["-f", "0"])
    with pytest.raises(ValueError, match=r"^`-f` must be at least 2, but got 0$"):
        config_from_args(args)


def test_mpi_is_timed_in_addition_to_gloo_and_is_a_setting() -> None:
    for spelling in ("gloo,mpi", "mpi,gloo", "gloo, mpi", "gloo,mpi,gloo"):
        config = parse_config(["--op", "all_reduce,put", "--baseline", spelling])
        assert (config.baseline, config.mpi) == ("gloo", True), spelling
        assert (config.settings(2)["baseline"], config.settings(2)["mpi"]) == ("gloo", True)
    assert (parse_config([]).mpi, parse_config([]).settings(2)["mpi"]) == (False, False)
    assert (parse_config(["--baseline", "none"]).baseline, parse_config(["--baseline", "none"]).mpi) == (None, False)
    assert parse_config(["--baseline", "gloo,gloo"]).baseline == "gloo"
    assert [name for name, op in OPS.items() if op.mpi is not None] == [
        "put", "get", "barrier", "all_gather", "all_reduce", "reduce_scatter", "all_to_all", "send_recv", "moe_dispatch",
        "moe_combine"]


def test_mpi_without_mpi4py_is_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real_find_spec = config_module.importlib.util.find_spec
    monkeypatch.setattr(config_module.importlib.util, "find_spec",
                        lambda name, *args: None if name == "mpi4py" else real_find_spec(name, *args))
    with pytest.raises(SystemExit):
        parse_config(["--baseline", "gloo,mpi"])
    assert capsys.readouterr().err.rstrip().endswith(
        "hp-shmem-perf: error: `--baseline mpi` must have mpi4py installed (pip install mpi4py mpich), "
        "but got none")
    assert not parse_config([]).mpi  # gloo alone never needs it


@pytest.mark.parametrize(
    "environ, expected",
    [({"PMI_RANK": "0", "PMI_SIZE": "2"}, True),  # MPICH's hydra, Intel MPI
     ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, True),  # Open MPI
     ({"PMIX_RANK": "0", "PMIX_SIZE": "4"}, True),
     ({"PMI_RANK": "0"}, False),
     ({"RANK": "0", "WORLD_SIZE": "2"}, False),  # torchrun
     ({}, False)],
)
def test_under_mpiexec_reads_the_launchers_variables(environ: dict[str, str], expected: bool) -> None:
    assert under_mpiexec(environ) is expected


def test_one_sided_ops_run_against_the_peer_and_put_get_pws_have_a_transport_floor() -> None:
    one_sided = [name for name, op in OPS.items() if op.one_sided]
    assert one_sided == ["put", "get", "put_with_signal", "signal_pingpong"]
    assert [name for name, op in OPS.items() if op.transport_floor] == ["put", "get", "put_with_signal"]
    assert not any(OPS[name].takes_ordinary_tensors for name in one_sided)  # peers address their buffers
    pws = OPS["put_with_signal"]
    assert (pws.sized, pws.min_ranks, pws.mpi, pws.needs_symmetric_memory, pws.in_all) == (True, 2, None, True, True)
    assert pws.bandwidths(1000, 1e-6, 4) == (1.0, 1.0)  # the message over the time, whatever the world


def test_peer_is_a_rank_or_the_lowest_rank_on_another_node() -> None:
    assert parse_config([]).peer == "1" and parse_config([]).settings(2)["peer_requested"] == "1"
    assert parse_config(["--peer", "across"]).peer == "across"
    assert parse_config(["--peer", "3", "--nproc", "4"]).peer == "3"
    assert resolve_peer("across", [0, 0, 2, 2]) == 2
    assert resolve_peer("across", [0, 1, 1]) == 1
    assert resolve_peer("1", [0, 0, 2, 2]) == 1 and resolve_peer("3", [0, 0, 2, 2]) == 3
    with pytest.raises(ValueError, match=r"`--peer across` must have a rank on another node than rank 0's, "
                                         r"but got nodes=\[0, 0\]"):
        resolve_peer("across", [0, 0])
    with pytest.raises(ValueError, match="`--peer` must be a rank from 1 to 1, but got 2"):
        resolve_peer("2", [0, 0])


@pytest.mark.parametrize(
    "argv, message",
    [(["--peer", "0"], "`--peer` must be across or a rank of at least 1, but got '0'"),
     (["--peer", "next"], "`--peer` must be across or a rank of at least 1, but got 'next'"),
     (["--peer", "-1"], "`--peer` must be across or a rank of at least 1, but got '-1'"),
     (["--peer", "2", "--nproc", "2"], "`--peer` must be a rank below `--nproc` (2), but got 2")],
)
def test_bad_peers_exit_like_argparse(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(f"hp-shmem-perf: error: {message}")


def test_settings_are_plain_values() -> None:
    settings = parse_config(["--op", "all_gather,put", "-d", "bfloat16", "--json", "x.json"]).settings(4)
    json.dumps(settings)  # serialisable
    assert settings["ops"] == ["all_gather", "put"] and settings["nranks"] == 4
    assert (settings["type"], settings["dtype"], settings["baseline"]) == ("bfloat16", "bfloat16", "gloo")
    assert "json_path" not in settings


# --------------------------------------------------------------------------
# timing.py
# --------------------------------------------------------------------------


def test_time_per_operation_is_the_median_round_per_iteration_in_microseconds() -> None:
    assert time_per_operation_us([0.004, 0.002, 0.1], 20) == pytest.approx(200.0)  # median 0.004 / 20
    assert time_per_operation_us([0.004], 20, divisor=2) == pytest.approx(100.0)  # half a round trip
    with pytest.raises(ValueError, match="at least one round of at least one iteration, but got 0 rounds of 20"):
        time_per_operation_us([], 20)


# --------------------------------------------------------------------------
# report.py and progress.py
# --------------------------------------------------------------------------


def _row(**overrides) -> Row:
    fields = dict(op="put", size=67108864, count=16777216, type="float", redop="none", time_us=7815.5,
                  algbw=8.59, busbw=8.59, wrong=0, baseline_time_us=29482.0, baseline_algbw=2.28,
                  baseline_busbw=2.28, memcpy_time_us=4996.3, memcpy_algbw=13.43)
    fields.update(overrides)
    return Row(**fields)


def test_format_time_follows_nccl_tests_precision() -> None:
    assert [format_time_us(v) for v in (1.234, 99.994, 123.45, 9999.94, 29482.4)] == [
        "1.23", "99.99", "123.5", "9999.9", "29482"]


def test_table_has_nccl_tests_columns_then_the_baseline_and_memcpy() -> None:
    table = Table("gloo", memcpy=True)
    groups, titles, units = table.header()
    assert titles.startswith("#") and units.startswith("#") and groups.startswith("#")
    assert titles[1:].split() == ["size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong",
                              "time", "algbw", "busbw", "speedup", "time", "algbw", "ours/"]
    assert units[1:].split() == ["(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)", "(us)", "(GB/s)", "(GB/s)",
                             "(us)", "(GB/s)", "memcpy"]
    assert groups[1:].split() == ["hyper_parallel.shmem", "gloo", "memcpy,", "1", "core"]
    line = table.line(_row())
    assert line.split() == ["67108864", "16777216", "float", "none", "7815.5", "8.59", "8.59", "0",
                            "29482", "2.28", "2.28", "3.8x", "4996.3", "13.43", "64%"]
    assert len(line) == len(titles) == len(units)  # values sit under their titles


def _collective_row(**overrides) -> Row:
    fields = dict(op="all_gather", size=67108864, count=16777216, memcpy_time_us=None, memcpy_algbw=None,
                  in_place_time_us=5895.9, in_place_algbw=11.38, in_place_busbw=5.69, in_place_wrong=0)
    fields.update(overrides)
    return _row(**fields)


def test_in_place_group_sits_between_ours_and_the_baseline_with_a_speedup_each() -> None:
    table = Table("gloo", memcpy=False, in_place=True)
    groups, titles, units = table.header()
    assert titles[1:].split() == ["size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong",
                                  "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "speedup", "speedup"]
    assert units[1:].split() == ["(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)", "(us)", "(GB/s)", "(GB/s)",
                                 "(us)", "(GB/s)", "(GB/s)", "(out)", "(in)"]
    assert groups[1:].split() == ["shmem,", "out-of-place", "shmem,", "in-place", "gloo,", "out-of-place"]
    line = table.line(_collective_row())
    assert line.split() == ["67108864", "16777216", "float", "none", "7815.5", "8.59", "8.59", "0",
                            "5895.9", "11.38", "5.69", "0", "29482", "2.28", "2.28", "3.8x", "5.0x"]
    assert len(line) == len(titles) == len(units) <= 160



def test_low_precision_group_follows_the_in_place_group_with_its_gain() -> None:
    table = Table("gloo", memcpy=False, in_place=True, low_precision="bfloat16")
    groups, titles, units = table.header()
    assert titles[1:].split()[12:17] == ["time", "algbw", "busbw", "#wrong", "gain"]
    assert units[1:].split()[8:12] == ["(us)", "(GB/s)", "(GB/s)", "(full/lo)"]
    assert "shmem, in-place, bfloat16" in groups
    row = _collective_row(low_precision_time_us=11791.8, low_precision_algbw=5.69, low_precision_busbw=2.85,
                          low_precision_wrong=0)
    line = table.line(row)
    assert line.split()[12:17] == ["11792", "5.69", "2.85", "0", "0.5x"]
    assert len(line) == len(titles) == len(units)
    assert row.low_precision_gain == pytest.approx(5895.9 / 11791.8)
    assert _collective_row().low_precision_gain is None
    assert footer([row, _collective_row(low_precision_busbw=1.15, low_precision_wrong=2)])[:4] == [
        "# Out of bounds values : 2 FAILED", "# Avg bus bandwidth    : 8.59 GB/s",
        "# Avg bus bandwidth in place : 5.69 GB/s", "# Avg bus bandwidth in place, low precision : 2 GB/s"]


def test_ordinary_tensors_name_every_group_of_ours() -> None:
    groups = Table("gloo", memcpy=False, in_place=True, low_precision="float16", ordinary_tensors=True).header()[0]
    assert "shmem, in-place, ordinary" in groups and "shmem, in-place, ordinary, float16" in groups
    assert "shmem, out-of-place, ordinary" in groups


def test_json_rows_carry_the_low_precision_fields(tmp_path) -> None:
    path = tmp_path / "rows.json"
    write_json(str(path), {}, [_collective_row(low_precision_time_us=2000.0, low_precision_algbw=33.5,
                                               low_precision_busbw=16.8, low_precision_wrong=0), _row()])
    low, plain = json.loads(path.read_text())["rows"]
    assert (low["low_precision_time_us"], low["low_precision_busbw"], low["low_precision_wrong"]) == (2000.0, 16.8, 0)
    assert low["low_precision_gain"] == pytest.approx(5895.9 / 2000.0)
    assert [plain[key] for key in ("low_precision_time_us", "low_precision_wrong", "low_precision_gain")] == [None] * 3


def _mpi_row(**overrides) -> Row:
    fields = dict(mpi_time_us=9000.0, mpi_algbw=7.46, mpi_busbw=3.73, mpi_wrong=0)
    fields.update(overrides)
    return _collective_row(**fields)


def test_floor_group_sits_before_memcpy_with_our_time_over_it(tmp_path) -> None:
    table = Table("gloo", memcpy=True, mpi=True, floor="ucx")
    groups, titles, units = table.header()
    assert groups[1:].split()[-6:] == ["MPI", "ucx", "floor", "memcpy,", "1", "core"]
    assert titles[1:].split()[-7:] == ["time", "algbw", "#wrong", "ours/", "time", "algbw", "ours/"]
    assert units[1:].split()[-6:] == ["(us)", "(GB/s)", "floor", "(us)", "(GB/s)", "memcpy"]
    row = _row(floor_time_us=3907.75, floor_algbw=17.17, floor_wrong=0, mpi_time_us=9000.0, mpi_algbw=7.46,
               mpi_busbw=7.46, mpi_wrong=0)
    assert row.over_floor == pytest.approx(2.0)
    line = table.line(row)
    assert line.split()[-7:] == ["3907.8", "17.17", "0", "2.0x", "4996.3", "13.43", "64%"]
    assert len(line) == len(titles) == len(units)
    assert footer([row, _row(floor_time_us=1.0, floor_algbw=1.0, floor_wrong=3, mpi_busbw=1.0)])[0] == \
        "# Out of bounds values : 3 FAILED"
    assert _row().over_floor is None and "floor" not in Table("gloo", memcpy=True).header()[0]
    path = tmp_path / "floor.json"
    write_json(str(path), {"peer": 2, "peer_crosses_nodes": True, "peer_transport": "ucx", "floor": "ucx"}, [row])
    document = json.loads(path.read_text())
    assert document["schema"] == 6 and document["settings"]["peer_crosses_nodes"] is True
    assert (document["rows"][0]["floor_time_us"], document["rows"][0]["floor_wrong"]) == (3907.75, 0)
    assert document["rows"][0]["over_floor"] == pytest.approx(2.0)


def test_mpi_group_follows_the_baseline_with_a_speedup_for_each_of_ours() -> None:
    table = Table("gloo", memcpy=False, in_place=True, mpi=True)
    groups, titles, units = table.header()
    assert titles[1:].split()[17:] == ["time", "algbw", "busbw", "#wrong", "speedup", "speedup"]
    assert units[1:].split()[13:] == ["(us)", "(GB/s)", "(GB/s)", "(out)", "(in)"]
    assert groups[1:].split()[-2:] == ["MPI,", "out-of-place"]
    line = table.line(_mpi_row())
    assert line.split()[17:] == ["9000.0", "7.46", "3.73", "0", "1.2x", "1.5x"]
    assert len(line) == len(titles) == len(units)
    assert _mpi_row().mpi_speedup == pytest.approx(9000.0 / 7815.5)
    assert _mpi_row().mpi_in_place_speedup == pytest.approx(9000.0 / 5895.9)
    assert _collective_row().mpi_speedup is None and _collective_row().mpi_in_place_speedup is None


def test_mpi_group_without_an_in_place_form_has_one_speedup_and_n_a_unchecked() -> None:
    table = Table("gloo", memcpy=False, mpi=True)
    groups, titles, _ = table.header()
    assert titles[1:].split()[8:] == ["time", "algbw", "busbw", "speedup", "time", "algbw", "busbw", "#wrong",
                                      "speedup"]
    assert groups[1:].split() == ["hyper_parallel.shmem", "gloo", "MPI"]
    row = _row(op="send_recv", memcpy_time_us=None, memcpy_algbw=None, mpi_time_us=15631.0, mpi_algbw=4.29,
               mpi_busbw=4.29, mpi_wrong=None)
    assert table.line(row).split()[12:] == ["15631", "4.29", "4.29", "N/A", "2.0x"]


def test_footer_counts_mpi_wrong_values_and_averages_mpi_bus_bandwidth() -> None:
    assert footer([_mpi_row(mpi_wrong=2, mpi_busbw=1.0), _mpi_row(mpi_busbw=3.0)]) == [
        "# Out of bounds values : 2 FAILED", "# Avg bus bandwidth    : 8.59 GB/s",
        "# Avg bus bandwidth in place : 5.69 GB/s", "# Avg bus bandwidth of the baseline : 2.28 GB/s",
        "# Avg bus bandwidth of MPI : 2 GB/s"]


def test_json_rows_carry_the_mpi_fields(tmp_path) -> None:
    path = tmp_path / "rows.json"
    write_json(str(path), {"mpi": True}, [_mpi_row(), _row()])
    with_mpi, without = json.loads(path.read_text())["rows"]
    assert (with_mpi["mpi_time_us"], with_mpi["mpi_algbw"], with_mpi["mpi_busbw"], with_mpi["mpi_wrong"]) == (
        9000.0, 7.46, 3.73, 0)
    assert with_mpi["mpi_speedup"] == pytest.approx(9000.0 / 7815.5)
    assert with_mpi["mpi_in_place_speedup"] == pytest.approx(9000.0 / 5895.9)
    assert [without[key] for key in ("mpi_time_us", "mpi_algbw", "mpi_busbw", "mpi_wrong", "mpi_speedup",
                                     "mpi_in_place_speedup")] == [None] * 6


def test_plot_draws_mpi_and_leaves_out_its_missing_latency_bar(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "mpi.png"
    barrier = _row(op="barrier", size=0, count=0, algbw=0.0, busbw=0.0, time_us=4.0, baseline_time_us=250.0,
                   baseline_algbw=0.0, baseline_busbw=0.0, memcpy_time_us=None, memcpy_algbw=None, mpi_time_us=9.0,
                   mpi_algbw=0.0, mpi_busbw=0.0, mpi_wrong=0)
    pingpong = _row(op="signal_pingpong", size=8, count=1, memcpy_time_us=None, memcpy_algbw=None)  # no MPI side
    write_plot(str(path), "mpi", [_mpi_row(), _mpi_row(size=1024), barrier, pingpong], "gloo")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_in_place_wrong_is_n_a_in_capitals_when_the_check_is_off() -> None:
    table = Table(None, memcpy=False, in_place=True)
    assert table.header()[1][1:].split()[-4:] == ["time", "algbw", "busbw", "#wrong"]
    assert table.line(_collective_row(wrong=None, in_place_wrong=None)).split()[-5:] == [
        "N/A", "5895.9", "11.38", "5.69", "N/A"]


def test_table_without_baseline_or_check() -> None:
    table = Table(None, memcpy=False)
    titles = table.header()[1]
    assert titles[1:].split() == ["size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"]
    row = _row(wrong=None, baseline_time_us=None, baseline_algbw=None, baseline_busbw=None,
               memcpy_time_us=None, memcpy_algbw=None)
    assert table.line(row).split()[-1] == "N/A"
    assert row.speedup is None and row.memcpy_fraction is None


def test_footer_counts_wrong_values_and_averages_bus_bandwidth() -> None:
    assert footer([_row(busbw=2.0), _row(busbw=4.0)]) == [
        "# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 3 GB/s",
        "# Avg bus bandwidth of the baseline : 2.28 GB/s"]
    assert footer([_row(wrong=3)])[0] == "# Out of bounds values : 3 FAILED"


def test_footer_counts_in_place_wrong_values_and_averages_in_place_bus_bandwidth() -> None:
    rows = [_collective_row(in_place_busbw=1.0), _collective_row(wrong=1, in_place_wrong=2, in_place_busbw=2.0)]
    assert footer(rows) == [
        "# Out of bounds values : 3 FAILED", "# Avg bus bandwidth    : 8.59 GB/s",
        "# Avg bus bandwidth in place : 1.5 GB/s", "# Avg bus bandwidth of the baseline : 2.28 GB/s"]


def test_json_has_settings_and_every_row(tmp_path) -> None:
    path = tmp_path / "rows.json"
    write_json(str(path), {"op": "put", "nranks": 2}, [_row(), _row(size=8)])
    document = json.loads(path.read_text())
    assert document["tool"] == "hp-shmem-perf" and document["schema"] == 6
    assert document["settings"] == {"op": "put", "nranks": 2}
    first = document["rows"][0]
    assert first["size"] == 67108864 and first["wrong"] == 0
    assert first["speedup"] == pytest.approx(29482.0 / 7815.5)
    assert first["memcpy_fraction"] == pytest.approx(4996.3 / 7815.5)
    assert [first[key] for key in ("in_place_time_us", "in_place_algbw", "in_place_busbw", "in_place_wrong",
                                   "in_place_speedup")] == [None] * 5  # put has no in-place form


def test_json_rows_carry_the_in_place_fields(tmp_path) -> None:
    path = tmp_path / "rows.json"
    write_json(str(path), {}, [_collective_row()])
    row = json.loads(path.read_text())["rows"][0]
    assert (row["in_place_time_us"], row["in_place_algbw"], row["in_place_busbw"], row["in_place_wrong"]) == (
        5895.9, 11.38, 5.69, 0)
    assert row["in_place_speedup"] == pytest.approx(29482.0 / 5895.9)
    assert row["speedup"] == pytest.approx(29482.0 / 7815.5)  # both against the same out-of-place gloo time


def test_progress_bar_text() -> None:
    assert render_bar(7, 20, "64M", 12.4, width=10) == "[###.......]  7/20  35%  64M  12s"
    assert render_bar(30, 20, "", 0, width=4) == "[####] 20/20 100%    0s"


# --------------------------------------------------------------------------
# cases.py: inputs and the comparison
# --------------------------------------------------------------------------


def test_input_pattern_differs_per_rank_and_is_exact_in_every_dtype() -> None:
    for dtype in (torch.int8, torch.float16, torch.bfloat16, torch.float32):
        zero, one = input_pattern(8, dtype, 0), input_pattern(8, dtype, 1)
        assert zero.dtype == dtype and not torch.equal(zero, one)
        assert set(zero.tolist()) <= {1, 2, 3, 4}


def test_count_wrong_is_exact_for_moves_and_tolerant_for_float_reductions() -> None:
    reference = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert count_wrong(reference.clone(), reference, exact=True) == 0
    assert count_wrong(reference + torch.tensor([0, 4e-6, 0, 1]), reference, exact=True) == 2
    assert count_wrong(reference + torch.tensor([0, 4e-6, 0, 1]), reference, exact=False) == 1
    ints = torch.tensor([1, 2, 3], dtype=torch.int32)
    assert count_wrong(ints + torch.tensor([0, 0, 1], dtype=torch.int32), ints, exact=False) == 1


def test_a_run_sizes_the_heap_unless_the_user_chose_one() -> None:
    assert run_heap_size({"heap_size_source": "default"}, 96 << 20) == 96 << 20
    for source in ("HYPER_PARALLEL_SHMEM_HEAP_SIZE", "SYMMETRIC_MEMORY_HEAP_SIZE"):
        assert run_heap_size({"heap_size_source": source}, 96 << 20) is None, source
