"""The command line: nccl-tests' flags, checked into a :class:`Config` before any rank starts (torch-free)."""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from hyper_parallel.perf.ops import OPS, OpSpec
from hyper_parallel.perf.units import (
    DTYPE_BYTES,
    DTYPE_LABELS,
    DTYPES,
    LOW_PRECISION_BYTES,
    REDUCE_OPS,
    parse_size,
    size_sweep,
)

PROG = "hp-shmem-perf"
BASELINES = ("gloo", "mpi")  # --baseline: a comma-separated list of these, or none
PROGRESS_MODES = ("auto", "on", "off")
MOE_ROUTINGS = ("uniform", "skewed")  # --moe-routing
PEER_ACROSS = "across"  # --peer: the lowest rank on another node than rank 0's


@dataclass(frozen=True)
class Config:
    """The validated settings of a run (every rank parses the same command line into the same Config).

    Attributes:
        ops: the operations, measured one after the other in the same processes (``--op a,b`` or ``all``).
        nproc: local ranks to start, or None under torchrun (or another launcher that sets RANK/WORLD_SIZE).
        min_bytes, max_bytes, factor: the sweep (``-b``, ``-e``, ``-f``).
        iterations: timed operations per loop (``-n``).
        warmup: untimed operations per side and size first (``-w``).
        repeat: timed rounds per size; the median round is reported (``-r``).
        dtype: the torch dtype name (``float32``).
        redop: the reduction (``-o``).
        check: whether to count wrong elements (``-c``).
        baseline: ``"gloo"`` or None.
        mpi: ``--baseline gloo,mpi``: MPI is timed too (through mpi4py, under mpiexec), beside gloo.
        json_path, plot_path: where to write the rows and the plot, or None.
        progress: ``"auto"`` (a terminal), ``"on"`` or ``"off"``.
        mm_k, mm_n: the fused ops' matmul dimensions (``--mm-k``, ``--mm-n``): all-gather + matmul multiplies
            (n·m) x k by k x N, matmul + reduce-scatter (n·m) x k by k x N, with m from the row's size.
        low_precision: ``--low-precision``: the dtype name all_reduce and reduce_scatter also run in (a group of
            columns of their own), or None.
        ordinary_tensors: ``--ordinary-tensors``: the collectives run every form of ours (out of place, in place,
            low precision) on ordinary torch tensors instead of symmetric ones: the engine reads them straight out of
            the peers' processes where the host device reaches them, and stages them otherwise.
        moe_hidden, moe_topk, moe_experts, moe_routing, moe_align: the MoE ops' tokens (``--moe-hidden`` elements
            each), the experts each token goes to (``--moe-topk``), the experts per rank (``--moe-experts``), how
            tokens choose them (``--moe-routing``: uniform, or skewed towards the first experts) and the alignment of
            each expert's region in dispatch's output (``--moe-align`` rows).
        peer: ``--peer``: the one-sided ops' partner of rank 0, a rank number (``"1"``) or ``"across"`` (the lowest
            rank on another node than rank 0's, found once the runtime knows the nodes).
    """

    ops: tuple[OpSpec, ...]
    nproc: Optional[int]
    min_bytes: int
    max_bytes: int
    factor: int
    iterations: int
    warmup: int
    repeat: int
    dtype: str
    redop: str
    check: bool
    baseline: Optional[str]
    json_path: Optional[str]
    plot_path: Optional[str]
    progress: str
    mm_k: int = 2048
    mm_n: int = 2048
    low_precision: Optional[str] = None
    ordinary_tensors: bool = False
    mpi: bool = False
    moe_hidden: int = 1024
    moe_topk: int = 2
    moe_experts: int = 4
    moe_routing: str = "uniform"
    moe_align: int = 1
    peer: str = "1"

    @property
    def element_bytes(self) -> int:
        """Bytes per element of ``dtype``."""
        return DTYPE_BYTES[self.dtype]

    @property
    def min_ranks(self) -> int:
        """The fewest ranks every op of the run can work with."""
        return max(op.min_ranks for op in self.ops)

    def dtype_label(self, op: OpSpec) -> str:
        """The type column of ``op``'s rows: nccl-tests' name of ``dtype`` (``float``), or the op's own."""
        return DTYPE_LABELS[self.dtype] if op.sized else op.fixed_type

    def redop_label(self, op: OpSpec) -> str:
        """The redop column of ``op``'s rows: the reduction, or ``none`` for ops that do not reduce."""
        return self.redop if op.reduces else "none"

    def row_elements(self, op: OpSpec) -> int:
        """Elements of one matrix row of a fused op's size (``--mm-k`` or ``--mm-n``), of one token's top-k rows for
        an MoE op; 1 for the other ops."""
        if op.routed:
            return self.moe_hidden * self.moe_topk
        return {"k": self.mm_k, "n": self.mm_n}.get(op.matmul_dim, 1)

    def sizes(self, op: OpSpec) -> list[int]:
        """The requested sizes of ``op`` in bytes; one fixed size for ops that move no payload of their own."""
        if not op.sized:
            return [op.fixed_bytes]
        return size_sweep(self.min_bytes, self.max_bytes, self.factor)

    def settings(self, nranks: int) -> dict[str, Any]:
        """The run's settings as plain values, for the JSON file and the table's header."""
        return {
            "ops": [op.name for op in self.ops],
            "nranks": nranks,
            "min_bytes": self.min_bytes,
            "max_bytes": self.max_bytes,
            "factor": self.factor,
            "iterations": self.iterations,
            "warmup": self.warmup,
            "repeat": self.repeat,
            "dtype": self.dtype,
            "type": DTYPE_LABELS[self.dtype],
            "redop": self.redop,
            "check": self.check,
            "baseline": self.baseline,
            "mm_k": self.mm_k,
            "mm_n": self.mm_n,
            "low_precision": self.low_precision,
            "ordinary_tensors": self.ordinary_tensors,
            "mpi": self.mpi,
            "moe_hidden": self.moe_hidden,
            "moe_topk": self.moe_topk,
            "moe_experts": self.moe_experts,
            "moe_routing": self.moe_routing,
            "moe_align": self.moe_align,
            "peer_requested": self.peer,
        }


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, with nccl-tests' flag names.

    Returns:
        The parser (its values still need :func:`config_from_args`).
    """
    parser = argparse.ArgumentParser(
        prog=PROG,
        allow_abbrev=False,
        description="nccl-tests-style bandwidth and latency of HyperParallel SHMEM, "
        "with torch.distributed's gloo (and, under mpiexec, MPI) measured beside it in the same processes.",
        epilog="ops: " + "; ".join(f"{spec.name}: {spec.summary}" for spec in OPS.values()),
    )
    parser.add_argument("--op", default="all_reduce", metavar="OP[,OP...]",
                        help=f"the operations, one after the other: {', '.join(OPS)}, or all: every op but the "
                             "fused ones (default all_reduce)")
    parser.add_argument("--nproc", type=int, default=None,
                        help="local ranks to start (default 2; omit under torchrun)")
    parser.add_argument("-b", "--minbytes", type=_size, default=parse_size("8"), metavar="SIZE",
                        help="smallest size, e.g. 8, 1K, 64M (default 8)")
    parser.add_argument("-e", "--maxbytes", type=_size, default=parse_size("64M"), metavar="SIZE",
                        help="largest size (default 64M)")
    parser.add_argument("-f", "--stepfactor", type=int, default=2, metavar="N",
                        help="multiplication factor between sizes (default 2)")
    parser.add_argument("-n", "--iters", type=int, default=20, metavar="N",
                        help="timed operations per loop (default 20)")
    parser.add_argument("-w", "--warmup_iters", type=int, default=5, metavar="N",
                        help="untimed operations first, per size and side (default 5)")
    parser.add_argument("-r", "--repeat", type=int, default=3, metavar="N",
                        help="timed loops per size and side, interleaved; the median is reported (default 3)")
    parser.add_argument("-d", "--datatype", default="float", metavar="TYPE",
                        help=f"element type: {', '.join(DTYPES)} (default float)")
    parser.add_argument("-o", "--redop", default="sum", metavar="OP",
                        help=f"reduction of all_reduce and reduce_scatter: {', '.join(REDUCE_OPS)} (default sum)")
    parser.add_argument("-c", "--check", type=int, default=1, metavar="0|1",
                        help="count wrong elements against gloo once per size, outside the timing (default 1)")
    parser.add_argument("--baseline", default="gloo", metavar="NAME[,NAME]",
                        help="the transports timed beside ours: gloo, gloo,mpi (MPI as well, under mpiexec; "
                             "needs mpi4py) or none (default gloo)")
    parser.add_argument("--mm-k", dest="mm_k", type=int, default=2048, metavar="K",
                        help="fused ops: the inner matmul dimension; a row of fused_all_gather_matmul's size "
                             "(the gathered matrix) has K elements (default 2048)")
    parser.add_argument("--mm-n", dest="mm_n", type=int, default=2048, metavar="N",
                        help="fused ops: the columns of the product; a row of fused_matmul_reduce_scatter's size "
                             "(the partial products) has N elements (default 2048)")
    parser.add_argument("--moe-hidden", dest="moe_hidden", type=int, default=1024, metavar="H",
                        help="MoE ops: elements of one token (default 1024)")
    parser.add_argument("--moe-topk", dest="moe_topk", type=int, default=2, metavar="K",
                        help="MoE ops: the experts each token goes to (default 2)")
    parser.add_argument("--moe-experts", dest="moe_experts", type=int, default=4, metavar="E",
                        help="MoE ops: experts per rank (default 4)")
    parser.add_argument("--moe-routing", dest="moe_routing", default="uniform", metavar="MODE",
                        help="MoE ops: how tokens choose experts: uniform, or skewed (the first experts more often, "
                             "as a Zipf law; default uniform)")
    parser.add_argument("--moe-align", dest="moe_align", type=int, default=1, metavar="A",
                        help="moe_dispatch: each expert's region of the output starts at a multiple of A rows "
                             "(all_to_all_vdev_2d's major_align; default 1)")
    parser.add_argument("--peer", default="1", metavar="RANK|across",
                        help="one-sided ops (put, get, put_with_signal, signal_pingpong): rank 0's partner, a rank, or "
                             "across: the lowest rank on another node than rank 0's (default 1)")
    parser.add_argument("--low-precision", dest="low_precision", default=None, metavar="DTYPE",
                        help="all_reduce and reduce_scatter: also time ours in place travelling in DTYPE "
                             f"({', '.join(LOW_PRECISION_BYTES)}), beside full precision (default: off)")
    parser.add_argument("--ordinary-tensors", dest="ordinary_tensors", action="store_true",
                        help="collectives: run ours (every form) on ordinary torch tensors instead of symmetric "
                             "ones")
    parser.add_argument("--json", dest="json_path", default=None, metavar="FILE", help="write every row to FILE")
    parser.add_argument("--plot", dest="plot_path", default=None, metavar="FILE.png",
                        help="draw bus bandwidth and time against size, log-log (needs matplotlib)")
    parser.add_argument("--progress", default="auto", metavar="MODE",
                        help="progress bar on stderr of rank 0: auto (when a terminal), on, off (default auto)")
    return parser


def _choice(flag: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"`{flag}` must be one of {', '.join(choices)}, but got {value!r}")
    return value


def _at_least(flag: str, value: int, minimum: int) -> int:
    if value < minimum:
        raise ValueError(f"`{flag}` must be at least {minimum}, but got {value}")
    return value


def _ops(text: str) -> tuple[OpSpec, ...]:
    """The ``--op`` list: comma-separated names in the order given (duplicates dropped), or ``all`` (every op but
    the fused ones, whose rows are matmuls: they run when named)."""
    if text == "all":
        return tuple(op for op in OPS.values() if op.in_all)
    names = [name.strip() for name in text.split(",")]
    for name in names:
        if name not in OPS:
            raise ValueError(f"`--op` must be all or a comma-separated list of {', '.join(OPS)}, but got {name!r}")
    return tuple(OPS[name] for name in dict.fromkeys(names))


def _baselines(text: str, ops: tuple[OpSpec, ...], dtype: str) -> tuple[Optional[str], bool]:
    """The ``--baseline`` list: ``none``, ``gloo`` or ``gloo,mpi`` (in any order).

    Returns:
        ``(gloo or None, whether MPI is timed)``.
    """
    if text == "none":
        return None, False
    names = [name.strip() for name in text.split(",")]
    for name in names:
        if name not in BASELINES:
            raise ValueError(f"`--baseline` must be none or a comma-separated list of {', '.join(BASELINES)}, "
                             f"but got {name!r}")
    if "mpi" not in names:
        return "gloo", False
    # MPI's #wrong is counted against gloo's output, and its columns sit beside gloo's.
    if "gloo" not in names:
        raise ValueError(f"`--baseline mpi` must come with gloo (`--baseline gloo,mpi`), but got {text!r}")
    takers = [op.name for op in OPS.values() if op.mpi is not None]
    if not any(op.mpi is not None for op in ops):
        raise ValueError(f"`--baseline mpi` must come with `--op` {', '.join(takers)}, "
                         f"but got {','.join(op.name for op in ops)}")
    if dtype == "bfloat16":  # numpy, through which mpi4py reads torch's tensors, has no bfloat16
        raise ValueError(f"`--baseline mpi` must have a `-d` that numpy has, but got {dtype}")
    if importlib.util.find_spec("mpi4py") is None:
        raise ValueError("`--baseline mpi` must have mpi4py installed (pip install mpi4py mpich), "
                         "but got none")
    return "gloo", True


def _check_low_precision(name: str, ops: tuple[OpSpec, ...], dtype: str, redop: str) -> None:
    """Raises ValueError unless ``--low-precision NAME`` can apply: an op that runs in it, ``-o`` sum or avg, and a
    floating-point ``-d`` wider than it (what ``low_precision_dtype`` accepts)."""
    _choice("--low-precision", name, list(LOW_PRECISION_BYTES))
    takers = [op.name for op in OPS.values() if op.low_precision]
    if not any(op.low_precision for op in ops):
        raise ValueError(f"`--low-precision` must come with `--op` {' or '.join(takers)}, "
                         f"but got {','.join(op.name for op in ops)}")
    if redop not in ("sum", "avg"):
        raise ValueError(f"`--low-precision` must have `-o` sum or avg, but got {redop!r}")
    if not dtype.startswith(("float", "bfloat")) or LOW_PRECISION_BYTES[name] >= DTYPE_BYTES[dtype]:
        raise ValueError(f"`--low-precision` must be narrower than a floating-point `-d` ({dtype}), but got {name}")


def _check_peer(text: str, nproc: Optional[int]) -> None:
    """Raises ValueError unless ``--peer`` is ``across`` or a rank other than 0 (below ``--nproc`` when given)."""
    if text == PEER_ACROSS:
        return
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"`--peer` must be {PEER_ACROSS} or a rank of at least 1, but got {text!r}")
    if nproc is not None and int(text) >= nproc:
        raise ValueError(f"`--peer` must be a rank below `--nproc` ({nproc}), but got {text}")


def config_from_args(args: argparse.Namespace) -> Config:
    """Checks the parsed flags against each other.

    Args:
        args: what :func:`build_parser` parsed.

    Returns:
        The run's Config.

    Raises:
        ValueError: a flag out of range or inconsistent, with "`-b` must be ..., but got ..." messages.
    """
    ops = _ops(args.op)
    dtype = DTYPES[_choice("-d", args.datatype, list(DTYPES))]
    redop = _choice("-o", args.redop, REDUCE_OPS)
    baseline, mpi = _baselines(args.baseline, ops, dtype)
    progress = _choice("--progress", args.progress, PROGRESS_MODES)
    if args.nproc is not None:
        _at_least("--nproc", args.nproc, max(op.min_ranks for op in ops))
    if any(op.sized for op in ops):
        size_sweep(args.minbytes, args.maxbytes, args.stepfactor)  # raises on a bad sweep
    _at_least("-n", args.iters, 1)
    _at_least("-w", args.warmup_iters, 0)
    _at_least("-r", args.repeat, 1)
    _choice("-c", str(args.check), ("0", "1"))
    if any(op.reduces for op in ops) and redop == "avg" and not dtype.startswith(("float", "bfloat")):
        raise ValueError(f"`-o avg` must have a floating-point `-d`, but got {args.datatype}")
    _at_least("--mm-k", args.mm_k, 1)
    _at_least("--mm-n", args.mm_n, 1)
    _at_least("--moe-hidden", args.moe_hidden, 1)
    _at_least("--moe-topk", args.moe_topk, 1)
    _at_least("--moe-experts", args.moe_experts, 1)
    _at_least("--moe-align", args.moe_align, 1)
    moe_routing = _choice("--moe-routing", args.moe_routing, MOE_ROUTINGS)
    _check_peer(args.peer, args.nproc)
    for op in ops:
        if op.sum_only and redop != "sum":
            raise ValueError(f"`-o` must be sum for {op.name} (torch's all-reduce sums only), but got {redop!r}")
        if op.fused and not dtype.startswith(("float", "bfloat")):
            raise ValueError(f"`-d` must be a floating-point type for {op.name}, but got {args.datatype}")
        if op.fused and op.reduces and redop not in ("sum", "avg"):
            raise ValueError(f"`-o` must be sum or avg for {op.name}, but got {redop!r}")
    if args.low_precision is not None:
        _check_low_precision(args.low_precision, ops, dtype, redop)
    if args.ordinary_tensors and not any(op.takes_ordinary_tensors for op in ops):
        takers = [op.name for op in OPS.values() if op.takes_ordinary_tensors]
        raise ValueError(f"`--ordinary-tensors` must come with `--op` {', '.join(takers)} or all, "
                         f"but got {','.join(op.name for op in ops)}")
    if args.plot_path is not None and importlib.util.find_spec("matplotlib") is None:
        raise ValueError("`--plot` must have matplotlib installed (pip install matplotlib), "
                         "but got none")
    return Config(
        ops=ops,
        nproc=args.nproc,
        min_bytes=args.minbytes,
        max_bytes=args.maxbytes,
        factor=args.stepfactor,
        iterations=args.iters,
        warmup=args.warmup_iters,
        repeat=args.repeat,
        dtype=dtype,
        redop=redop,
        check=args.check == 1,
        baseline=baseline,
        json_path=args.json_path,
        plot_path=args.plot_path,
        progress=progress,
        mm_k=args.mm_k,
        mm_n=args.mm_n,
        low_precision=args.low_precision,
        ordinary_tensors=args.ordinary_tensors,
        mpi=mpi,
        moe_hidden=args.moe_hidden,
        moe_topk=args.moe_topk,
        moe_experts=args.moe_experts,
        moe_routing=moe_routing,
        moe_align=args.moe_align,
        peer=args.peer,
    )


def parse_config(argv: Optional[Sequence[str]] = None) -> Config:
    """Parses and checks a command line; a bad one exits like argparse (usage, the message, status 2).

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        The run's Config.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return config_from_args(args)
    except ValueError as error:
        parser.error(str(error))
        raise  # parser.error exits; this keeps type checkers content


def resolve_peer(requested: str, nodes: Sequence[int]) -> int:
    """The one-sided ops' partner of rank 0 for ``--peer``, given the node of every rank (the same on every rank).

    Args:
        requested: ``--peer``: a rank (``"1"``) or ``"across"``.
        nodes: ``debug_state()["nodes"]``: the node of every rank.

    Returns:
        The peer's rank: the one asked for, or the lowest rank on another node than rank 0's.

    Raises:
        ValueError: the rank is not in the world, or no rank lies on another node than rank 0's.
    """
    if requested == PEER_ACROSS:
        across = [rank for rank, node in enumerate(nodes) if node != nodes[0]]
        if not across:
            raise ValueError(f"`--peer {PEER_ACROSS}` must have a rank on another node than rank 0's, but got "
                             f"nodes={list(nodes)}")
        return across[0]
    peer = int(requested)
    if not 1 <= peer < len(nodes):
        raise ValueError(f"`--peer` must be a rank from 1 to {len(nodes) - 1}, but got {peer}")
    return peer


def run_heap_size(runtime_config: dict, needed: int) -> Optional[int]:
    """The heap a run acquires: ``needed`` bytes, unless the user chose a size (a heap variable the runtime read).

    Args:
        runtime_config: the runtime's configuration (``shmem.read_config()``).
        needed: what the run's rows need (:func:`heap_bytes`).

    Returns:
        ``needed``, or None for the user's choice (the runtime's configuration).
    """
    return needed if runtime_config["heap_size_source"] == "default" else None
