"""One rank's run: join the process group, acquire the runtime, measure every size, and (rank 0) report.

Every rank runs the same sequence of collectives: allocate a row's buffers, check once (out of place, then in
place where the op has that form), time the interleaved sides, combine the times and the wrong counts over gloo,
free the buffers.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any, NamedTuple, Optional

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from hyper_parallel.platform.torch import symm_mem_backend
from hyper_parallel.perf.cases import (
    CASES,
    SYMMETRIC_MEMORY_MODULE,
    Case,
    InPlaceCase,
    LowPrecisionCase,
    PerfSetupError,
    RankInfo,
    symmetric_memory_api,
)
from hyper_parallel.perf.config import Config, resolve_peer, run_heap_size
from hyper_parallel.perf.launch import STORE_ENV
from hyper_parallel.perf.mpi import MpiSide, comm_world, library_version, mpi_side
from hyper_parallel.perf.ops import OpSpec
from hyper_parallel.perf.progress import Progress
from hyper_parallel.perf.report import Reporter, Row
from hyper_parallel.perf.timing import Side, measure, slowest_rank, time_per_operation_us
from hyper_parallel.perf.units import format_size

OURS, IN_PLACE, MEMCPY, MPI = "ours", "in_place", "memcpy", "mpi"  # the sides' names (the baseline's is its own)
FLOOR = "floor"  # the remote transport's own put or get (OpSpec.transport_floor)
NETWORK_TRANSPORTS = ("ucx",)  # debug_state()["transports"] values that are a transport to another node
LOW_PRECISION = "low_precision"
_MIB = 1 << 20


def timeout_seconds() -> float:
    """The runtime's wait limit (``HYPER_PARALLEL_SHMEM_TIMEOUT_SEC``, read by the runtime), used for gloo's waits as
    well.

    Raises:
        ValueError: the variable is not a positive number (the runtime's message).
    """
    return float(shmem.read_config()["timeout_sec"])


def heap_bytes(config: Config, nranks: int = 1) -> int:
    """The symmetric heap each rank needs: four times the largest row plus 64 MiB, in whole MiB.

    Our side of a row holds at most two buffers of the row's size (all_reduce's and all_to_all's input and output;
    the in-place forms reuse them); the rest is room for the collectives' own scratch and the allocator's alignment.
    An MoE op's receive buffer holds every rank's tokens (n rows' worth, for the worst routing), beside its input and
    the previous row's buffers, which torch's API frees at the next allocation: n + 3 rows.
    """
    largest = max(max(config.sizes(op)) for op in config.ops)
    rows = max(4, nranks + 3) if any(op.routed for op in config.ops) else 4
    return -(-(rows * largest + 64 * _MIB) // _MIB) * _MIB


def init_process_group() -> None:
    """Joins the gloo process group: through the launcher's FileStore, or torchrun's ``env://`` variables."""
    timeout = timedelta(seconds=timeout_seconds())
    store_path = os.environ.get(STORE_ENV)
    if store_path:
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)


class PeerRoute(NamedTuple):
    """How rank 0 reaches the one-sided ops' peer (the same on every rank: rank 0's view, broadcast).

    Attributes:
        peer: the peer's rank.
        crosses_nodes: whether it lies on another node than rank 0.
        transport: what carries rank 0's one-sided calls to it (``debug_state()["transports"]``: ``node``, ``ucx``,
            ``none``).
        floor_absent: why the transport floor column is absent ("" when it is timed).
    """

    peer: int
    crosses_nodes: bool
    transport: str
    floor_absent: str

    def settings(self) -> dict[str, Any]:
        """The route as the JSON's settings and the table's header have it."""
        return {"peer": self.peer, "peer_crosses_nodes": self.crosses_nodes, "peer_transport": self.transport,
                "floor": self.transport if not self.floor_absent else None, "floor_absent": self.floor_absent or None}


def peer_route(requested: str) -> PeerRoute:
    """Resolves ``--peer`` against the runtime's nodes and rank 0's transports (collective over gloo).

    Raises:
        PerfSetupError: the peer cannot be resolved, or it lies on another node that no transport reaches (on every
            rank alike).
    """
    state = shmem.debug_state()
    try:
        peer = resolve_peer(requested, state["nodes"])
    except ValueError as error:
        raise PerfSetupError(str(error)) from None
    crosses = state["nodes"][peer] != state["nodes"][0]
    views = [state["transports"][peer]]
    dist.broadcast_object_list(views, src=0)
    transport = views[0]
    if crosses and transport not in NETWORK_TRANSPORTS:
        raise PerfSetupError(f"`--peer` must be reached from rank 0 by a transport across nodes for the one-sided "
                             f"ops, but got transport={transport} peer={peer} (a package built without UCX: pip "
                             f"install hyper-parallel-shmem[ucx], then build it again)")
    absent = "" if transport in NETWORK_TRANSPORTS else \
        f"the peer (rank {peer}) is on rank 0's node: reached through shared memory ({transport}), no network"
    return PeerRoute(peer=peer, crosses_nodes=crosses, transport=transport, floor_absent=absent)


def _check(case: Case, low_precision: bool = False, floor: bool = False) -> list[int]:
    """This rank's wrong elements (collective): ours out of place against gloo on the same inputs, then, where the
    op runs in place, ours in place against the same gloo output, then (``low_precision``) ours in place in low
    precision against the exact result within the documented bound, then (a case with an MPI side) MPI against
    the same gloo output, then (``floor``) the transport's own transfer into the same outputs.

    Returns:
        ``[out-of-place wrong]``, ``[out-of-place wrong, in-place wrong]``, or those and the low-precision wrong;
        then the floor's wrong (``floor``); MPI's wrong last where the case has an MPI side.
    """
    case.fill()
    shmem.barrier()  # no rank writes into a peer's buffers before that peer has filled them
    case.run_ours()
    shmem.barrier()  # one-sided writes by other ranks are visible after it
    case.run_baseline()
    wrong = [case.wrong_elements()]
    mpi_wrong = []
    if case.mpi is not None:  # now, while gloo's output is the one of these inputs (a later fill zeroes it)
        case.run_mpi()
        mpi_wrong.append(case.wrong_elements_mpi())
    if isinstance(case, InPlaceCase):
        case.prepare_in_place()
        shmem.barrier()  # as above, for the in-place layout
        case.run_ours_in_place()
        shmem.barrier()
        wrong.append(case.wrong_elements_in_place())
    if low_precision:
        case.fill()  # the in-place form consumed the inputs
        case.prepare_in_place()
        shmem.barrier()
        case.run_ours_low_precision()
        shmem.barrier()
        wrong.append(case.wrong_elements_low_precision())
    if floor:
        for ours, _ in case.outputs:  # gloo's outputs stay as they are: the floor's result must equal them too
            ours.zero_()
        shmem.barrier()
        case.run_floor()
        shmem.barrier()
        wrong.append(case.wrong_elements())
    return wrong + mpi_wrong


def _sum_over_ranks(values: list[int]) -> list[int]:
    totals = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(totals)
    return [int(total) for total in totals.tolist()]


def measure_row(config: Config, spec: OpSpec, info: RankInfo, nbytes: int, progress: Progress,
                mpi: Optional[MpiSide] = None, route: Optional[PeerRoute] = None) -> Optional[Row]:
    """Measures one op at one size on every rank (collective).

    Args:
        config: the run.
        spec: the op.
        info: this rank.
        nbytes: the requested size; it is rounded down as nccl-tests rounds it.
        progress: advanced once per timed round.
        mpi: MPI's side (``--baseline gloo,mpi``), timed and checked for the ops that have one; None: no MPI.
        route: how rank 0 reaches the one-sided ops' peer; the transport floor is timed where it has one.

    Returns:
        The row (the same on every rank), or None when the size rounds down to nothing.

    Raises:
        PerfSetupError: the op needs an API that is missing.
    """
    count = spec.element_count(nbytes, config.element_bytes, info.nranks, config.row_elements(spec))
    if spec.sized and count == 0:
        progress.advance(config.repeat)
        return None
    row_bytes = count * config.element_bytes if spec.sized else spec.fixed_bytes
    case = CASES[spec.name](info, count, mpi)
    low_precision = info.low_precision is not None and isinstance(case, LowPrecisionCase)
    floor = spec.transport_floor and route is not None and not route.floor_absent
    try:
        wrong = _check(case, low_precision, floor) if config.check else []
        sides = [Side(OURS, case.run_ours, shmem.barrier)]
        if isinstance(case, InPlaceCase):
            sides.append(Side(IN_PLACE, case.run_ours_in_place, shmem.barrier))
        if low_precision:
            sides.append(Side(LOW_PRECISION, case.run_ours_low_precision, shmem.barrier))
        if config.baseline is not None:
            # An op whose baseline is a sequence on this library (the fused ops' unfused one, shmem_allreduce for
            # torch's all-reduce) lines it up by its own barrier too.
            own = spec.baseline_label is not None
            sides.append(Side(config.baseline, case.run_baseline, shmem.barrier if own else dist.barrier))
        if case.mpi is not None:
            # One-sided MPI: the target makes MPI's progress only inside an MPI call (over TCP, MPICH's RMA is carried
            # out by the target's progress engine): every rank ends the loop in MPI_Barrier, so that the target
            # serves rank 0's operations while it waits there (as osu_put_latency's target waits in MPI).
            complete = case.mpi.comm.Barrier if spec.one_sided else None
            sides.append(Side(MPI, case.run_mpi, case.mpi.comm.Barrier, complete))
        if spec.memcpy_reference:
            sides.append(Side(MEMCPY, case.run_memcpy, shmem.barrier))
        if floor:
            sides.append(Side(FLOOR, case.run_floor, shmem.barrier))
        slowest = slowest_rank(measure(sides, config.iterations, config.warmup, config.repeat, progress.advance))
        wrong = _sum_over_ranks(wrong) if wrong else []
    finally:
        case.close()

    times = {
        side.name: time_per_operation_us([round_[index] for round_ in slowest], config.iterations, spec.time_divisor)
        for index, side in enumerate(sides)
    }

    def timed(side: str) -> tuple[float, float, float]:
        """(time, algbw, busbw) of a side."""
        return (times[side], *spec.bandwidths(row_bytes, times[side] * 1e-6, info.nranks))

    time_us, algbw, busbw = timed(OURS)
    fields: dict[str, Optional[float]] = {"wrong": wrong[0] if wrong else None}
    if IN_PLACE in times:
        fields.update(zip(("in_place_time_us", "in_place_algbw", "in_place_busbw"), timed(IN_PLACE)))
        fields.update(in_place_wrong=wrong[1] if wrong else None)
    if LOW_PRECISION in times:
        fields.update(zip(("low_precision_time_us", "low_precision_algbw", "low_precision_busbw"),
                          timed(LOW_PRECISION)))
        fields.update(low_precision_wrong=wrong[2] if wrong else None)
    if config.baseline is not None:
        fields.update(zip(("baseline_time_us", "baseline_algbw", "baseline_busbw"), timed(config.baseline)))
    if MPI in times:
        fields.update(zip(("mpi_time_us", "mpi_algbw", "mpi_busbw"), timed(MPI)))
        fields.update(mpi_wrong=wrong[-1] if wrong else None)
    if MEMCPY in times:
        fields.update(zip(("memcpy_time_us", "memcpy_algbw"), timed(MEMCPY)))
    if FLOOR in times:
        fields.update(zip(("floor_time_us", "floor_algbw"), timed(FLOOR)))
        fields.update(floor_wrong=(wrong[-2] if MPI in times else wrong[-1]) if wrong else None)
    return Row(op=spec.name, size=row_bytes, count=count, type=config.dtype_label(spec), redop=config.redop_label(spec),
               time_us=time_us, algbw=algbw, busbw=busbw, **fields)


def run_rank(config: Config) -> list[Row]:
    """Runs the whole benchmark as one rank: joins the gloo group, measures every op and size; rank 0 reports.

    Args:
        config: the run.

    Returns:
        The rows (on every rank).

    Raises:
        PerfSetupError: too few ranks, an op needs an API that is missing, or (``config.mpi``) MPI's world is not
            gloo's (the same on every rank).
        ShmemError, RuntimeError: a failure of any transport.
    """
    init_process_group()
    rank, nranks = dist.get_rank(), dist.get_world_size()
    if nranks < config.min_ranks:
        names = ", ".join(op.name for op in config.ops if op.min_ranks > nranks)
        raise PerfSetupError(f"`--op {names}` must run on at least {config.min_ranks} ranks, but got {nranks}")
    mpi = None
    if config.mpi:
        world = comm_world()
        if (world.Get_rank(), world.Get_size()) != (rank, nranks):
            raise PerfSetupError(f"`--baseline mpi` must run in MPI's world (rank {world.Get_rank()} of "
                                 f"{world.Get_size()}), but got gloo's rank {rank} of {nranks}")
        mpi = mpi_side(config.redop)
    for spec in config.ops:
        if spec.needs_symmetric_memory:
            symmetric_memory_api(spec.name)  # fail before any allocation, on every rank alike
    torch.set_num_threads(1)  # one core per rank: the memcpy reference is single-core, and gloo gets no extra
    info = RankInfo(rank=rank, nranks=nranks, dtype=getattr(torch, config.dtype), redop=config.redop,
                    mm_k=config.mm_k, mm_n=config.mm_n,
                    low_precision=None if config.low_precision is None else getattr(torch, config.low_precision),
                    ordinary_tensors=config.ordinary_tensors, moe_hidden=config.moe_hidden,
                    moe_topk=config.moe_topk, moe_experts=config.moe_experts, moe_routing=config.moe_routing,
                    moe_align=config.moe_align)

    steps = sum(len(config.sizes(spec)) for spec in config.ops) * config.repeat
    progress_on = rank == 0 and (config.progress == "on" or (config.progress == "auto" and sys.stderr.isatty()))
    progress = Progress(total=steps, enabled=progress_on)
    shmem.acquire(heap_size_bytes=run_heap_size(shmem.read_config(), heap_bytes(config, nranks)))
    route = peer_route(config.peer) if any(spec.one_sided for spec in config.ops) else None
    if route is not None:
        info = info._replace(peer=route.peer)
    reporter = None
    if rank == 0:
        settings = config.settings(nranks)
        if config.mpi:
            settings["mpi_library"] = library_version()
        if route is not None:
            settings.update(route.settings())
        reporter = Reporter(settings, config.json_path, config.plot_path, sys.stdout, before_line=progress.clear)
        reporter.start()

    rows = []
    for spec in config.ops:
        if reporter is not None:
            reporter.start_op(spec)
        for nbytes in config.sizes(spec):
            progress.set_label(f"{spec.name} {format_size(nbytes)}B")
            row = measure_row(config, spec, info, nbytes, progress, mpi, route)
            if row is None:
                continue
            rows.append(row)
            if reporter is not None:
                reporter.add(row)
        if reporter is not None:
            reporter.finish_op()
    progress.clear()
    symmetric_memory = sys.modules.get(SYMMETRIC_MEMORY_MODULE)
    if symmetric_memory is not None:
        symmetric_memory.shutdown()  # its workspace and runtime reference (a no-op when it was never used)
    symm_mem_backend.shutdown()  # the reference of torch's symmetric memory, once it freed what it let go of
    shmem.release()
    if reporter is not None:
        reporter.finish()
    dist.barrier()
    dist.destroy_process_group()
    return rows
