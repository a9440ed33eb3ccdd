"""``hp-shmem-perf``'s MindSpore sibling: our collectives on ordinary ``mindspore.Tensor``s beside MindSpore's own
(``mindspore.mint.distributed``, the mccl backend on CPU), in the same processes, interleaved per size.

Run one process per rank under MindSpore's launcher (docs/perf.md, "MindSpore")::

    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=msrun-logs --join=True \\
        python -m hyper_parallel.perf.mindspore --op all -b 8 -e 16M -f 4 --json perf-mindspore.json

The method is the torch tool's (:mod:`hyper_parallel.perf.timing`: the same timed loop, medians over ``-r`` repeats
of the slowest rank's loop), its accounting (:data:`hyper_parallel.perf.ops.OPS`' sizes and bus factors) and its
table (:mod:`hyper_parallel.perf.report`). What differs:

* MindSpore's CPU operators are queued and run later, so both sides synchronize
  (:func:`hyper_parallel.platform.mindspore.tensors.synchronize`) after their barrier and before the clock stops:
  every timed loop covers the work it queued.
* Ours is one group of columns, out of place except all_reduce (in place on both sides: mccl's all_reduce and
  ``symm.shmem_allreduce`` work in place only). all_reduce's timed buffers hold zeros, so that sums repeated in
  place stay finite; its check runs on a fresh buffer of known values.
* mccl is checked once per op against the same numpy reference as ours before it is timed; where it raises or
  differs (reduce_scatter and all_to_all on CPU: their kernels are not registered), its columns stay empty and the
  table says why.
* The slowest rank's times are gathered with ``all_gather_object`` (mccl's), outside any timed region.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Optional, Sequence

import numpy as np

import mindspore as ms
from mindspore import communication
from mindspore.mint import distributed as md

from hyper_parallel.perf.config import run_heap_size
from hyper_parallel.perf.ops import OPS, OpSpec
from hyper_parallel.perf.report import Row, Table, footer, write_json
from hyper_parallel.perf.timing import Side, measure, time_per_operation_us
from hyper_parallel.perf.units import DTYPE_BYTES, DTYPE_LABELS, DTYPES, parse_size, size_sweep

TOOL = "hp-shmem-perf-mindspore"
OP_NAMES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier")
OURS, MCCL = "ours", "mccl"
_MIB = 1 << 20

# What each side runs, for the table's heading (r: this rank, b: elements per block = count / n).
OURS_RUNS = {
    "all_reduce": "symm.shmem_allreduce(buffer, 'sum'), in place",
    "all_gather": "symm.shmem_allgather(output, input)",
    "reduce_scatter": "symm.shmem_reduce_scatter(output, input, 'sum')",
    "all_to_all": "symm.shmem_alltoall(send blocks, receive, [b] * n)",
    "barrier": "symm.barrier()",
}
MCCL_RUNS = {
    "all_reduce": "mint.distributed.all_reduce(buffer), in place",
    "all_gather": "mint.distributed.all_gather(n outputs, input) (the list form)",
    "reduce_scatter": "mint.distributed.reduce_scatter(output, n input blocks)",
    "all_to_all": "mint.distributed.all_to_all(n outputs, n send blocks)",
    "barrier": "mint.distributed.barrier()",
}


def heap_bytes(largest: int) -> int:
    """The symmetric heap each rank needs: four times the largest row plus 64 MiB, in whole MiB (the torch tool's
    :func:`hyper_parallel.perf.runner.heap_bytes`, whose module imports torch: room for staging and scratch)."""
    return -(-(4 * largest + 64 * _MIB) // _MIB) * _MIB


def values(rank: int, count: int, dtype: Any) -> np.ndarray:
    """Rank ``rank``'s known input: small integers in [-8, 8], exact in every type and in a sum over 8 ranks."""
    return ((np.arange(count, dtype=np.int64) * 7 + rank * 13) % 17 - 8).astype(dtype)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line (the torch tool's flags that apply here).

    Args:
        argv: the arguments (``sys.argv[1:]`` when None).

    Returns:
        The parsed flags, with ``ops`` (the op names in order) and ``sizes`` (bytes) added.

    Raises:
        SystemExit: a bad flag (status 2, argparse style).
    """
    parser = argparse.ArgumentParser(
        prog="python -m hyper_parallel.perf.mindspore",
        description="HyperParallel SHMEM's collectives on MindSpore tensors beside MindSpore's mccl ones "
                    "(run under msrun, one process per rank).")
    parser.add_argument("--op", default="all_reduce",
                        help=f"comma-separated ops of {', '.join(OP_NAMES)}, or all (default: all_reduce)")
    parser.add_argument("-b", dest="min_bytes", default="8", help="smallest size: 8, 1K, 64M (default 8)")
    parser.add_argument("-e", dest="max_bytes", default="16M", help="largest size (default 16M)")
    parser.add_argument("-f", dest="factor", type=int, default=2, help="factor between sizes (default 2)")
    parser.add_argument("-n", dest="iterations", type=int, default=20, help="timed operations per loop (default 20)")
    parser.add_argument("-w", dest="warmup", type=int, default=5, help="untimed operations per size and side first "
                                                                       "(default 5)")
    parser.add_argument("-r", dest="repeat", type=int, default=3, help="timed loops per size and side, interleaved; "
                                                                       "the median is reported (default 3)")
    dtypes = sorted(name for name, torch_name in DTYPES.items() if torch_name != "bfloat16")
    parser.add_argument("-d", dest="dtype", default="float", choices=dtypes, help="element type (default float)")
    parser.add_argument("-c", dest="check", type=int, default=1, choices=(0, 1),
                        help="count wrong elements once per size (default 1)")
    parser.add_argument("--json", dest="json_path", default=None, help="write the settings and every row here")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.op.split(",") if name.strip()]
    args.ops = list(OP_NAMES) if names == ["all"] else names
    unknown = [name for name in args.ops if name not in OP_NAMES]
    if not args.ops or unknown:
        parser.error(f"`--op` must be `all` or names of {', '.join(OP_NAMES)}, but got {args.op!r}")
    for flag, value in (("-n", args.iterations), ("-r", args.repeat)):
        if value < 1:
            parser.error(f"`{flag}` must be at least 1, but got {value}")
    if args.warmup < 0:
        parser.error(f"`-w` must be at least 0, but got {args.warmup}")
    try:
        args.sizes = size_sweep(parse_size(args.min_bytes), parse_size(args.max_bytes), args.factor)
    except ValueError as error:
        parser.error(str(error))
    args.dtype = DTYPES[args.dtype]
    return args


def _max_over_ranks(elapsed: list[list[float]]) -> list[list[float]]:
    """Every timed loop's slowest rank (collective; mccl's all_gather_object, outside any timed region)."""
    everyone: list[Any] = [None] * md.get_world_size()
    md.all_gather_object(everyone, elapsed)
    return np.max(np.array(everyone, dtype=np.float64), axis=0).tolist()


def _sum_over_ranks(value: int) -> int:
    everyone: list[Any] = [None] * md.get_world_size()
    md.all_gather_object(everyone, int(value))
    return sum(everyone)


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


class Case:
    """One size of one op on this rank: known inputs, our side and mccl's, and the numpy reference.

    Args:
        name: the op.
        count: the row's element count (a multiple of n for the ops that split).
        dtype: the numpy dtype name (``float32``).
        rank, nranks: this rank and the world's size.
    """

    def __init__(self, name: str, count: int, dtype: str, rank: int, nranks: int) -> None:
        import hyper_parallel.core.symmetric_memory as symm

        self.symm = symm
        self.name, self.count, self.rank, self.nranks = name, count, rank, nranks
        self.np_dtype = np.dtype(dtype)
        block = count // nranks if OPS[name].split_by_ranks else count
        self.block = block
        inputs = [values(r, count if name in ("all_reduce", "reduce_scatter", "all_to_all") else block, self.np_dtype)
                  for r in range(nranks)]
        self.input_np = inputs[rank]
        if name == "all_reduce":
            self.want = np.sum(np.stack(inputs), axis=0, dtype=self.np_dtype)
        elif name == "all_gather":
            self.want = np.concatenate(inputs)
        elif name == "reduce_scatter":
            self.want = np.sum(np.stack(inputs), axis=0, dtype=self.np_dtype)[rank * block:(rank + 1) * block]
        elif name == "all_to_all":
            self.want = np.concatenate([data[rank * block:(rank + 1) * block] for data in inputs])
        else:
            self.want = None
        self.ours_buffers = self._buffers()
        self.mccl_buffers = self._buffers()
        if name == "all_reduce":   # timed in place: zeros stay finite however often they are summed
            for buffers in (self.ours_buffers, self.mccl_buffers):
                buffers["output"] = self._tensor(np.zeros(count, self.np_dtype))

    def _tensor(self, array: np.ndarray) -> ms.Tensor:
        return ms.Tensor(np.ascontiguousarray(array))

    def _buffers(self) -> dict[str, Any]:
        """Fresh tensors of this rank's known input and zeroed outputs."""
        name, n, block = self.name, self.nranks, self.block
        if name == "all_reduce":
            return {"output": self._tensor(self.input_np)}
        if name == "all_gather":
            return {"input": self._tensor(self.input_np), "output": self._tensor(np.zeros(self.count, self.np_dtype)),
                    "outputs": [self._tensor(np.zeros(block, self.np_dtype)) for _ in range(n)]}
        if name == "reduce_scatter":
            return {"input": self._tensor(self.input_np), "output": self._tensor(np.zeros(block, self.np_dtype)),
                    "blocks": [self._tensor(self.input_np[j * block:(j + 1) * block]) for j in range(n)]}
        if name == "all_to_all":
            return {"blocks": [self._tensor(self.input_np[j * block:(j + 1) * block]) for j in range(n)],
                    "output": self._tensor(np.zeros(self.count, self.np_dtype)),
                    "outputs": [self._tensor(np.zeros(block, self.np_dtype)) for _ in range(n)]}
        return {}

    def run_ours(self, buffers: Optional[dict[str, Any]] = None) -> None:
        """One operation of ours (on ``buffers``, the timed ones by default)."""
        symm, b = self.symm, buffers or self.ours_buffers
        if self.name == "all_reduce":
            symm.shmem_allreduce(b["output"], "sum")
        elif self.name == "all_gather":
            symm.shmem_allgather(b["output"], b["input"])
        elif self.name == "reduce_scatter":
            symm.shmem_reduce_scatter(b["output"], b["input"], "sum")
        elif self.name == "all_to_all":
            symm.shmem_alltoall(b["blocks"], b["output"], [self.block] * self.nranks)
        else:
            symm.barrier()

    def run_mccl(self, buffers: Optional[dict[str, Any]] = None) -> None:
        """One operation of mccl's (queued: complete after :func:`synchronize`)."""
        b = buffers or self.mccl_buffers
        if self.name == "all_reduce":
            md.all_reduce(b["output"])
        elif self.name == "all_gather":
            md.all_gather(b["outputs"], b["input"])
        elif self.name == "reduce_scatter":
            md.reduce_scatter(b["output"], b["blocks"])
        elif self.name == "all_to_all":
            md.all_to_all(b["outputs"], b["blocks"])
        else:
            md.barrier()

    def wrong(self, run: Callable[[dict[str, Any]], None], result: str) -> int:
        """This rank's elements that differ from the numpy reference after one operation on fresh buffers of the
        known inputs (0 for the barrier, which has no result)."""
        if self.want is None:
            run({})
            return 0
        from hyper_parallel.platform.mindspore.tensors import synchronize

        buffers = self._buffers()
        run(buffers)
        synchronize()
        got = buffers[result]
        got = np.concatenate([t.asnumpy() for t in got]) if isinstance(got, list) else got.asnumpy()
        if got.shape != self.want.shape:
            return int(self.want.size)
        return int(np.count_nonzero(got != self.want))


def _mccl_unavailable(case: Case) -> Optional[str]:
    """Why mccl's side of ``case``'s op cannot be a baseline (it raises, or its result is wrong on some rank), or
    None when it works. Decided together: every rank gets the same answer (collective)."""
    result = "outputs" if case.name in ("all_gather", "all_to_all") else "output"
    try:
        wrong = case.wrong(case.run_mccl, result)
        reason = f"wrong results ({wrong} elements on rank {case.rank})" if wrong else None
    except Exception as error:  # noqa: BLE001 (MindSpore raises RuntimeError for a kernel it lacks on CPU)
        reason = _first_line(error)
    everyone: list[Any] = [None] * case.nranks
    md.all_gather_object(everyone, reason)
    reasons = [r for r in everyone if r is not None]
    return reasons[0] if reasons else None


def measure_row(spec: OpSpec, nbytes: int, args: argparse.Namespace, rank: int, nranks: int,
                mccl_reason: Optional[str]) -> Optional[Row]:
    """Measures and checks one size of one op (collective).

    Args:
        spec: the op.
        nbytes: the requested size.
        args: the run's flags.
        rank, nranks: this rank and the world's size.
        mccl_reason: why mccl is not timed for this op, or None to time it.

    Returns:
        The row (the same on every rank), or None when the size rounds down to nothing.
    """
    from hyper_parallel.platform.mindspore.tensors import synchronize

    element_bytes = DTYPE_BYTES[args.dtype]
    count = spec.element_count(nbytes, element_bytes, nranks)
    if spec.sized and count == 0:
        return None
    row_bytes = count * element_bytes if spec.sized else spec.fixed_bytes
    case = Case(spec.name, count, args.dtype, rank, nranks)
    wrong = _sum_over_ranks(case.wrong(case.run_ours, "output")) if args.check else None

    def ours_barrier() -> None:
        case.symm.barrier()   # synchronizes MindSpore's queue first

    def mccl_barrier() -> None:
        synchronize()
        md.barrier()
        synchronize()

    sides = [Side(OURS, case.run_ours, ours_barrier, synchronize)]
    if mccl_reason is None:
        sides.append(Side(MCCL, case.run_mccl, mccl_barrier, synchronize))
    slowest = _max_over_ranks(measure(sides, args.iterations, args.warmup, args.repeat))
    times = {side.name: time_per_operation_us([round_[index] for round_ in slowest], args.iterations,
                                              spec.time_divisor)
             for index, side in enumerate(sides)}
    algbw, busbw = spec.bandwidths(row_bytes, times[OURS] * 1e-6, nranks)
    fields: dict[str, Any] = {}
    if MCCL in times:
        mccl_algbw, mccl_busbw = spec.bandwidths(row_bytes, times[MCCL] * 1e-6, nranks)
        fields = {"baseline_time_us": times[MCCL], "baseline_algbw": mccl_algbw, "baseline_busbw": mccl_busbw}
    return Row(op=spec.name, size=row_bytes, count=count,
               type=DTYPE_LABELS[args.dtype] if spec.sized else spec.fixed_type,
               redop="sum" if spec.reduces else "none", time_us=times[OURS], algbw=algbw, busbw=busbw, wrong=wrong,
               **fields)


def run(args: argparse.Namespace) -> list[Row]:
    """Measures every op and size as one rank; rank 0 prints the table as rows come and writes the JSON.

    Args:
        args: the parsed flags (:func:`parse_args`).

    Returns:
        Every row (on every rank).
    """
    rank, nranks = md.get_rank(), md.get_world_size()
    out = sys.stdout

    def say(lines: list[str]) -> None:
        if rank == 0:
            print("\n".join(lines), file=out, flush=True)

    say([f"# {TOOL}: nranks {nranks}  type {DTYPE_LABELS[args.dtype]}  iterations {args.iterations}"
         f"  warmup {args.warmup}  repeat {args.repeat}  baseline mccl (mindspore {ms.__version__})",
         "# time: the median over repeats of the slowest rank's time per operation; both sides synchronize "
         "MindSpore's queue before the clock stops",
         "# ours on ordinary mindspore.Tensors; speedup: mccl's time / ours"])
    rows: list[Row] = []
    unavailable: dict[str, str] = {}
    for name in args.ops:
        spec = OPS[name]
        sizes = args.sizes if spec.sized else [spec.fixed_bytes]
        counts = [spec.element_count(size, DTYPE_BYTES[args.dtype], nranks) for size in sizes]
        probe_count = next((count for count in counts if count > 0), 0) if spec.sized else 0
        reason = _mccl_unavailable(Case(name, probe_count, args.dtype, rank, nranks)) \
            if probe_count or not spec.sized else None
        if reason is not None:
            unavailable[name] = reason
        table = Table("mccl", memcpy=False)
        lines = ["#", f"# {name}: {OURS_RUNS[name]}"]
        lines.append(f"# mccl: {MCCL_RUNS[name]}" if reason is None
                     else f"# mccl: none: {MCCL_RUNS[name]} fails on this backend: {reason}")
        say(lines + table.header())
        op_rows = []
        for size in sizes:
            row = measure_row(spec, size, args, rank, nranks, reason)
            if row is not None:
                op_rows.append(row)
                say([table.line(row)])
        say(footer(op_rows))
        rows += op_rows
    if rank == 0 and args.json_path is not None:
        settings = {"nranks": nranks, "type": DTYPE_LABELS[args.dtype], "iterations": args.iterations,
                    "warmup": args.warmup, "repeat": args.repeat, "baseline": "mccl", "framework": "mindspore",
                    "mindspore_version": ms.__version__, "ops": args.ops, "min_bytes": args.sizes[0],
                    "max_bytes": args.sizes[-1], "factor": args.factor, "check": bool(args.check),
                    "baseline_unavailable": unavailable}
        write_json(args.json_path, settings, rows, tool=TOOL)
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The tool's entry point on one rank: parses the flags, joins MindSpore's world (mccl), runs, shuts down.

    Args:
        argv: the arguments (``sys.argv[1:]`` when None).

    Returns:
        The exit status (0).

    Raises:
        SystemExit: a bad flag (status 2).
    """
    args = parse_args(argv)
    communication.init()
    from hyper_parallel.platform.mindspore.handler import HANDLER

    from hyper_parallel.core.multicore import c_runtime

    HANDLER.calls.acquire(run_heap_size(c_runtime.read_config(), heap_bytes(args.sizes[-1])))
    run(args)
    import hyper_parallel.core.symmetric_memory as symm

    md.barrier()
    symm.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
