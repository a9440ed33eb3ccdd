"""The table of benchmarked operations: what each measures and how nccl-tests counts its bytes.

This module is torch-free so that the launcher can validate ``--op`` before any rank starts; the code that runs
each operation lives in :mod:`hyper_parallel.perf.cases`.

Accounting (nccl-tests' ``*GetBw`` functions): the ``size`` of a row is the bytes nccl-tests reports for it, and
``algbw = size / time``, ``busbw = algbw * bus_factor(nranks)``:

===========================  ==========================================  =================
op                           size                                        bus factor
===========================  ==========================================  =================
all_reduce                   the buffer (input = output in size)         2 (n - 1) / n
all_gather                   the whole output (n inputs)                 (n - 1) / n
reduce_scatter               the whole input (n outputs)                 (n - 1) / n
all_to_all                   the whole send buffer (n blocks)            (n - 1) / n
send_recv, put, get          the message                                 1
put_with_signal              the message (its 8-byte signal not counted) 1
signal_pingpong              the 8-byte signal                           1
barrier                      0                                           1
fused_all_gather_matmul      the gathered matrix: (n x m) x k elements   (n - 1) / n
fused_matmul_reduce_scatter  the partial products: (n x m) x N elements  (n - 1) / n
moe_dispatch, moe_combine    the routed tokens of one rank (t x top-k    (n - 1) / n
                             rows of --moe-hidden elements)
symm_mem_*_all_reduce        the buffer                                  2 (n - 1) / n
===========================  ==========================================  =================

The fused ops are sized like the collective they contain (all_gather's whole output, reduce_scatter's whole
input), so their rows line up with all_gather's and reduce_scatter's: a row of ``size`` bytes has m rows per rank,
of k elements (all-gather + matmul, ``--mm-k``) or N elements (matmul + reduce-scatter, ``--mm-n``); the other
matmul dimension is the other flag. Their time includes the matmuls, so their bandwidths are the data moved over
the whole time: compare their times (the speedup column), not their bandwidths with the collectives'. Their
baseline is the unfused sequence on this library, not gloo, and ``--op all`` leaves them out (their rows are
matmuls: seconds each at the sizes the collectives sweep to).

The MoE ops are torch's own (``torch.ops.symm_mem.all_to_all_vdev_2d`` and ``all_to_all_vdev_2d_offset`` on the host
device's backend for torch's symmetric memory): a row of ``size`` bytes is t tokens of each rank, each routed to
``--moe-topk`` of the n x ``--moe-experts`` experts (``--moe-routing`` uniform, or skewed towards the first experts),
so t x top-k rows of ``--moe-hidden`` elements leave every rank; the splits stay in a tensor. Their baseline is what a
CPU user does without symmetric memory (torchtitan's path): the splits exchanged with ``dist.all_to_all_single`` and
read on the host, the tokens exchanged with ``dist.all_to_all_single`` on those sizes, then laid out expert-major (a
copy per chunk); with ``--baseline gloo,mpi`` MPI's ``Alltoall`` of the splits and ``Alltoallv`` of the tokens, laid
out the same way. Combine sends the tokens back with the splits dispatch left (no host read). torch's one-shot and
two-shot all-reduce through that backend (``symm_mem_one_shot_all_reduce``, ``symm_mem_two_shot_all_reduce``) have this
library's ``symm.shmem_allreduce`` (in place) as their baseline: torch's API against the user API, on one engine.

The one-sided ops (put, get, put_with_signal, signal_pingpong) run between rank 0 and its peer (``--peer``: rank 1, a
rank number, or ``across``: the lowest rank on another node than rank 0's). Where the peer lies on another node and
the host device reaches it through a network transport (``debug_state()["transports"]``: ``ucx``), put, get and
put_with_signal also time the transport's floor (``OpSpec.transport_floor``): ``RemoteTransport::Put``/``Get`` itself
(UCX's put or get, then its endpoint flush) on the same endpoints and heap, without the runtime's checks, streams or
tensors, reached through the runtime's perf-only entry ``remote_transport_transfer``. With ``--baseline gloo,mpi``,
put and get also time MPI's one-sided RMA on a window of ``MPI_Win_allocate`` (passive target: ``MPI_Win_lock_all``
once, then ``MPI_Put``/``MPI_Get`` and ``MPI_Win_flush`` per operation).

The collectives also have nccl-tests' in-place group of columns (:class:`InPlace`): all_gather, all_reduce and
reduce_scatter and all_to_all run in place as well. With ``--baseline gloo,mpi`` the collectives, barrier and
send_recv also time MPI (``OpSpec.mpi``) on gloo's ordinary tensors, out of place.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable


def _ring_reduce_factor(nranks: int) -> float:
    return 2.0 * (nranks - 1) / nranks


def _ring_factor(nranks: int) -> float:
    return (nranks - 1) / nranks


def _unit_factor(nranks: int) -> float:
    return 1.0


class InPlace(enum.Enum):
    """Whether an op's table has nccl-tests' in-place group of columns, and what it holds."""

    ABSENT = "absent"
    """No in-place group: point-to-point and fixed-size ops."""
    SUPPORTED = "supported"
    """The op is timed and checked in place as well."""


@dataclass(frozen=True)
class OpSpec:
    """One benchmarked operation.

    Attributes:
        name: the ``--op`` value.
        summary: one line for ``--help`` and the docs.
        baseline: what the gloo column runs.
        bus_factor: nranks -> nccl-tests' bus-bandwidth factor.
        split_by_ranks: the size is n equal blocks (all_gather, reduce_scatter, all_to_all): the element count is
            rounded down to a multiple of n, as nccl-tests does.
        fixed_bytes: the size of an operation that moves no payload of its own (barrier: 0, signal: 8); such
            an op has one row whatever ``-b``/``-e`` say. None for sized operations.
        fixed_type: the type column of such an op (``int64`` for the signal, ``none`` for the barrier).
        min_ranks: the fewest ranks it needs.
        needs_symmetric_memory: it runs through ``hyper_parallel.core.symmetric_memory`` (the user API) rather
            than the runtime face.
        reduces: it takes ``-o``.
        memcpy_reference: its rows also time a single-core memcpy of the same bytes.
        time_divisor: the reported time is the timed loop's time per iteration divided by this (2 for a
            ping-pong: one-way latency, half a round trip).
        in_place: whether the op has an in-place group of columns, and whether it runs in place.
        in_place_summary: one line on the in-place form (or why there is none), for the table's heading.
        matmul_dim: for a fused compute-communication op, the matmul dimension its rows span: ``"k"`` (a row of
            all-gather + matmul's gathered matrix has ``--mm-k`` elements) or ``"n"`` (a row of matmul +
            reduce-scatter's partial products has ``--mm-n``); None for the communication ops.
        baseline_label: the heading of the baseline's columns when the baseline is not the ``--baseline``
            transport: ``"unfused"`` for the fused ops, whose baseline is the unfused sequence on this library.
        in_all: whether ``--op all`` runs it.
        low_precision: whether ``--low-precision`` adds a group of columns: the op run in place in that dtype.
        mpi: what the MPI columns run (``--baseline gloo,mpi``, through mpi4py on gloo's ordinary tensors), or None
            for the ops that have no MPI columns (put_with_signal, signal_pingpong, the fused ops).
        routed: an MoE op: its size is tokens routed to experts (``--moe-*``), whole tokens with all their top-k rows.
        sum_only: it reduces with 'sum' only (torch's all-reduce of its symmetric-memory API).
        one_sided: it runs between rank 0 and the peer of ``--peer``; the other ranks idle.
        transport_floor: its rows also time the remote transport's own put or get of the same bytes (the floor
            column), where the peer is reached through one.
    """

    name: str
    summary: str
    baseline: str
    bus_factor: Callable[[int], float]
    split_by_ranks: bool = False
    fixed_bytes: int | None = None
    fixed_type: str = "none"
    min_ranks: int = 1
    needs_symmetric_memory: bool = False
    reduces: bool = False
    memcpy_reference: bool = False
    time_divisor: int = 1
    in_place: InPlace = InPlace.ABSENT
    in_place_summary: str = ""
    matmul_dim: str | None = None
    baseline_label: str | None = None
    in_all: bool = True
    low_precision: bool = False
    mpi: str | None = None
    routed: bool = False
    sum_only: bool = False
    one_sided: bool = False
    transport_floor: bool = False

    @property
    def fused(self) -> bool:
        """Whether it is a fused compute-communication op (sized by the matmul's shape, an unfused baseline)."""
        return self.matmul_dim is not None

    @property
    def sized(self) -> bool:
        """Whether the op sweeps ``-b`` .. ``-e`` (False: one row of ``fixed_bytes``)."""
        return self.fixed_bytes is None

    @property
    def takes_ordinary_tensors(self) -> bool:
        """Whether ``--ordinary-tensors`` applies: the sized collectives (they take any tensor), not the one-sided
        or fused ops, whose buffers peers address."""
        return self.mpi is not None and self.sized and not self.routed and not self.one_sided

    def element_count(self, nbytes: int, element_bytes: int, nranks: int, row_elements: int = 1) -> int:
        """The elements a row of about ``nbytes`` moves, rounded down as nccl-tests rounds it.

        Args:
            nbytes: the requested size in bytes.
            element_bytes: bytes per element of the data type.
            nranks: the number of ranks.
            row_elements: for the fused ops, the elements of one matrix row (``--mm-k`` or ``--mm-n``): the count
                is rounded down to whole rows on every rank; for the MoE ops, the elements of one token's top-k
                rows: the count is rounded down to whole tokens.

        Returns:
            The total element count of the row's ``size`` (0 when the size is too small to split).
        """
        if not self.sized:
            return 1 if self.fixed_bytes else 0  # one signal, or nothing
        count = nbytes // element_bytes
        if self.split_by_ranks:
            count -= count % (nranks * row_elements)
        else:
            count -= count % row_elements
        return count

    def bandwidths(self, nbytes: int, seconds: float, nranks: int) -> tuple[float, float]:
        """nccl-tests' algorithm and bus bandwidths of a row.

        Args:
            nbytes: the row's size in bytes.
            seconds: the time per operation.
            nranks: the number of ranks.

        Returns:
            ``(algbw, busbw)`` in GB/s (10**9 bytes per second); zeros for a zero time or size.
        """
        if seconds <= 0 or nbytes <= 0:
            return 0.0, 0.0
        algbw = nbytes / seconds / 1e9
        return algbw, algbw * self.bus_factor(nranks)


def _put_or_get(name: str, summary: str, baseline: str, mpi: str) -> OpSpec:
    """put or get: one-sided between rank 0 and the peer, a message of the row's size, beside a single-core memcpy,
    the transport floor and MPI's one-sided RMA."""
    return OpSpec(name=name, summary=summary, baseline=baseline, mpi=mpi, bus_factor=_unit_factor, min_ranks=2,
                  memcpy_reference=True, one_sided=True, transport_floor=True)


OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in (
        _put_or_get(
            "put",
            summary="rank 0 writes into the peer's symmetric buffer (shmem.put, one-sided)",
            baseline="dist.send on rank 0, dist.recv on the peer",
            mpi="MPI_Put + MPI_Win_flush on a window of MPI_Win_allocate (passive target, MPI_Win_lock_all once)",
        ),
        _put_or_get(
            "get",
            summary="rank 0 reads the peer's symmetric buffer (shmem.get, one-sided)",
            baseline="dist.send on the peer, dist.recv on rank 0",
            mpi="MPI_Get + MPI_Win_flush on a window of MPI_Win_allocate (passive target, MPI_Win_lock_all once)",
        ),
        OpSpec(
            name="put_with_signal",
            summary="rank 0's symm.shmem_put_with_signal to the peer: the data, then the peer's signal set to the "
                    "call's epoch; time: rank 0's call, which returns once both are on the peer (the peer idles)",
            baseline="dist.send of the same bytes on rank 0, dist.recv on the peer",
            bus_factor=_unit_factor,
            min_ranks=2,
            needs_symmetric_memory=True,
            one_sided=True,
            transport_floor=True,
        ),
        OpSpec(
            name="signal_pingpong",
            summary="rank 0 signals the peer, which waits and signals back; time is half the round trip",
            baseline="a one-element dist.send/dist.recv ping-pong",
            bus_factor=_unit_factor,
            fixed_bytes=8,
            fixed_type="int64",
            min_ranks=2,
            time_divisor=2,
            one_sided=True,
        ),
        OpSpec(
            name="barrier",
            summary="a barrier over all ranks",
            baseline="dist.barrier",
            mpi="MPI_Barrier",
            bus_factor=_unit_factor,
            fixed_bytes=0,
        ),
        OpSpec(
            name="all_gather",
            summary="every rank's block into every rank's output",
            baseline="dist.all_gather_single",
            mpi="MPI_Allgather",
            bus_factor=_ring_factor,
            split_by_ranks=True,
            needs_symmetric_memory=True,
            in_place=InPlace.SUPPORTED,
            in_place_summary="the input is this rank's block of the symmetric output",
        ),
        OpSpec(
            name="all_reduce",
            summary="reduction of every rank's input into its output: shmem.Team.all_reduce(output, input=input), no "
                    "copy (shmem_allreduce works in place only)",
            baseline="a copy into the output, then dist.all_reduce on it",
            mpi="MPI_Allreduce from the input into the output (avg: MPI_SUM, then a division)",
            bus_factor=_ring_reduce_factor,
            needs_symmetric_memory=True,
            reduces=True,
            in_place=InPlace.SUPPORTED,
            in_place_summary="shmem_allreduce on the buffer itself, no copy",
            low_precision=True,
        ),
        OpSpec(
            name="reduce_scatter",
            summary="reduction of every rank's input, block i to rank i",
            baseline="dist.reduce_scatter_single",
            mpi="MPI_Reduce_scatter_block (avg: MPI_SUM, then a division)",
            bus_factor=_ring_factor,
            split_by_ranks=True,
            needs_symmetric_memory=True,
            reduces=True,
            in_place=InPlace.SUPPORTED,
            in_place_summary="the output is this rank's block of the symmetric input",
            low_precision=True,
        ),
        OpSpec(
            name="all_to_all",
            summary="block j of rank i's send buffer to block i of rank j's output",
            baseline="dist.all_to_all_single",
            mpi="MPI_Alltoall",
            bus_factor=_ring_factor,
            split_by_ranks=True,
            needs_symmetric_memory=True,
            in_place=InPlace.SUPPORTED,
            in_place_summary="the send blocks are the blocks of the symmetric output (a pairwise swap)",
        ),
        OpSpec(
            name="send_recv",
            summary="pairs (2i, 2i+1) exchange a message: the even rank sends then receives, the odd one the reverse",
            baseline="dist.send/dist.recv in the same order",
            mpi="MPI_Send/MPI_Recv in the same order",
            bus_factor=_unit_factor,
            min_ranks=2,
            needs_symmetric_memory=True,
        ),
        OpSpec(
            name="fused_all_gather_matmul",
            summary="symm.fused_all_gather_matmul: gather every rank's m x k block, multiply by a k x N matrix",
            baseline="symm.shmem_allgather into a symmetric tensor, then torch.mm (speedup: unfused time / fused time)",
            bus_factor=_ring_factor,
            split_by_ranks=True,
            needs_symmetric_memory=True,
            matmul_dim="k",
            baseline_label="unfused",
            in_all=False,
        ),
        OpSpec(
            name="fused_matmul_reduce_scatter",
            summary="symm.fused_matmul_reduce_scatter: multiply (n x m) x k by k x N, reduce-scatter the rows",
            baseline="torch.mm into a symmetric tensor, then symm.shmem_reduce_scatter into a new tensor "
                     "(speedup: unfused time / fused time)",
            bus_factor=_ring_factor,
            split_by_ranks=True,
            needs_symmetric_memory=True,
            reduces=True,
            matmul_dim="n",
            baseline_label="unfused",
            in_all=False,
        ),
        OpSpec(
            name="moe_dispatch",
            summary="torch.ops.symm_mem.all_to_all_vdev_2d: each rank's routed tokens (rank-major by expert) to the "
                    "experts' ranks, expert-major there (regions aligned to --moe-align), the splits in a tensor",
            baseline="dist.all_to_all_single of the splits, read on the host, dist.all_to_all_single of the tokens, "
                     "then a copy per chunk into the expert-major layout",
            mpi="MPI_Alltoall of the splits, MPI_Alltoallv of the tokens, then the same layout",
            bus_factor=_ring_factor,
            routed=True,
            in_all=False,
        ),
        OpSpec(
            name="moe_combine",
            summary="torch.ops.symm_mem.all_to_all_vdev_2d_offset: the experts' tokens (dispatch's layout) back to "
                    "the ranks they came from, rank-major there",
            baseline="a copy per chunk into rank-major order, then dist.all_to_all_single on the sizes dispatch "
                     "left on the host",
            mpi="the same copies, then MPI_Alltoallv",
            bus_factor=_ring_factor,
            routed=True,
            in_all=False,
        ),
        OpSpec(
            name="symm_mem_one_shot_all_reduce",
            summary="torch.ops.symm_mem.one_shot_all_reduce_out on the host device's backend for torch's symmetric "
                    "memory: a symmetric input summed into an ordinary output",
            baseline="symm.shmem_allreduce in place on a symmetric buffer",
            bus_factor=_ring_reduce_factor,
            needs_symmetric_memory=True,
            reduces=True,
            sum_only=True,
            baseline_label="shmem_allreduce",
            in_all=False,
        ),
        OpSpec(
            name="symm_mem_two_shot_all_reduce",
            summary="torch.ops.symm_mem.two_shot_all_reduce_ on the host device's backend for torch's symmetric "
                    "memory: a symmetric buffer summed in place",
            baseline="symm.shmem_allreduce in place on a symmetric buffer",
            bus_factor=_ring_reduce_factor,
            needs_symmetric_memory=True,
            reduces=True,
            sum_only=True,
            baseline_label="shmem_allreduce",
            in_all=False,
        ),
    )
}
