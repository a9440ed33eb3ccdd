"""The benchmarked operations as each rank runs them: ours (out of place and in place), the gloo baseline, the
memcpy reference, the check.

A case is built for one row (one op at one size) on every rank. Our side works on symmetric tensors (the
copy-free path, like nccl-tests' registered buffers); the gloo side works on ordinary tensors of the same shape
and the same contents. ``fill`` puts identical inputs into both, and ``wrong_elements`` compares our output with
gloo's after one operation of each; ``prepare_in_place`` then lays the same inputs out for the in-place form, and
``wrong_elements_in_place`` compares its output with the same gloo output (gloo runs out of place only).
With ``--baseline gloo,mpi`` the ops that have an MPI side (``OpSpec.mpi``) also run it through mpi4py on numpy
views of gloo's input tensors, into outputs of its own that ``wrong_elements_mpi`` compares with gloo's.
"""

from __future__ import annotations

import abc

import importlib
from types import ModuleType
from typing import Any, Callable, ClassVar, NamedTuple, Optional

import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from hyper_parallel.perf.mpi import MpiSide
from hyper_parallel.perf.ops import OPS, InPlace, OpSpec

SYMMETRIC_MEMORY_MODULE = "hyper_parallel.core.symmetric_memory"

DIST_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
}


class PerfSetupError(RuntimeError):
    """The benchmark cannot run as asked (a missing API, too few ranks); raised identically on every rank."""


class RankInfo(NamedTuple):
    """What every case needs to know about its rank and the run.

    Attributes:
        rank: this process's rank.
        nranks: the world size.
        dtype: the element type (``-d``).
        redop: the reduction (``-o``), for the ops that reduce.
        mm_k, mm_n: the fused ops' matmul dimensions (``--mm-k``, ``--mm-n``).
        low_precision: the dtype of ``--low-precision``, or None.
        ordinary_tensors: ``--ordinary-tensors``: every form of ours of the collectives runs on ordinary torch
            tensors.
        moe_hidden, moe_topk, moe_experts, moe_routing, moe_align: the MoE ops' ``--moe-*`` settings.
        peer: rank 0's partner in the one-sided ops (``--peer``, resolved against the nodes).
    """

    rank: int
    nranks: int
    dtype: torch.dtype
    redop: str
    mm_k: int = 2048
    mm_n: int = 2048
    low_precision: Optional[torch.dtype] = None
    ordinary_tensors: bool = False
    moe_hidden: int = 1024
    moe_topk: int = 2
    moe_experts: int = 4
    moe_routing: str = "uniform"
    moe_align: int = 1
    peer: int = 1


def symmetric_memory_api(op_name: str) -> ModuleType:
    """Imports the user API ``hyper_parallel.core.symmetric_memory``.

    Args:
        op_name: the op that needs it (named in the error).

    Returns:
        The module.

    Raises:
        PerfSetupError: it cannot be imported.
    """
    try:
        return importlib.import_module(SYMMETRIC_MEMORY_MODULE)
    except ImportError as error:
        raise PerfSetupError(f"`--op {op_name}` needs {SYMMETRIC_MEMORY_MODULE}: {error}") from error


def input_pattern(count: int, dtype: torch.dtype, rank: int, salt: int = 0) -> torch.Tensor:
    """Deterministic inputs that differ per rank: small integers 1..4, exact in every dtype.

    Small values keep sums exact for the world sizes this tool runs, so that ours and gloo's results can be
    compared closely whatever order either reduces in.

    Args:
        count: number of elements.
        dtype: their type.
        rank: whose inputs (each rank's differ).
        salt: another variation, for ops with more than one input per rank.

    Returns:
        A new 1-D tensor.
    """
    return ((torch.arange(count, dtype=torch.int64) + 3 * rank + salt) % 4 + 1).to(dtype)


def count_wrong(ours: torch.Tensor, reference: torch.Tensor, *, exact: bool) -> int:
    """The number of elements of ``ours`` that differ from ``reference``.

    Args:
        ours: our result.
        reference: gloo's result for the same inputs.
        exact: compare bit for bit (integers, min/max, data movement); otherwise floating-point results within
            a tolerance that fits the dtype.

    Returns:
        The count of wrong elements.
    """
    if exact or not reference.is_floating_point():
        return int(torch.count_nonzero(ours != reference).item())
    rtol = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-5}.get(reference.dtype, 1e-12)
    close = torch.isclose(ours.double(), reference.double(), rtol=rtol, atol=0.0, equal_nan=True)
    return int(torch.count_nonzero(~close).item())


class SymmetricBuffers:
    """Hands out symmetric tensors for one case and frees them all at once (collective, in the same order).

    Args:
        api: the user API ``symmetric_memory`` to allocate through, or None for the runtime face.
    """

    def __init__(self, api: ModuleType | None) -> None:
        self._api = api
        self._tensors: list[torch.Tensor] = []

    def empty(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        """A new symmetric 1-D tensor (collective), zeroed so that its pages are mapped before any timing."""
        if self._api is None:
            tensor = shmem.empty(count, dtype=dtype)
        else:
            tensor = self._api.empty((count,), dtype=dtype)
        tensor.zero_()
        self._tensors.append(tensor)
        return tensor

    def free_all(self) -> None:
        """Frees every tensor handed out, newest first."""
        free = shmem.free if self._api is None else self._api.free
        while self._tensors:
            free(self._tensors.pop())


class Case(abc.ABC):
    """One row's operation on this rank: subclasses allocate in ``setup`` and define ours and gloo's run.

    Buffers come in pairs, ours (symmetric) and gloo's (ordinary) of the same size: ``input_pair`` pairs get the
    same deterministic inputs before the check, ``output_pair`` pairs are zeroed then and compared after it.
    Ops that also run in place derive from :class:`InPlaceCase`; their in-place form reuses the out-of-place
    buffers (views of them), so it costs no heap. Ops with a memcpy reference define ``run_memcpy``.
    Every rank calls every method the same number of times (ranks with no part in an op return at once), so
    that collectives, signal epochs and point-to-point pairs stay matched.

    Ops with an MPI side (``OpSpec.mpi``) define ``setup_mpi`` (numpy views of gloo's inputs, outputs of its own
    from :meth:`mpi_output`) and ``run_mpi``; they run only when the case is given an :class:`MpiSide`.
    """

    spec: ClassVar[OpSpec]

    def __init__(self, info: RankInfo, count: int, mpi: Optional[MpiSide] = None) -> None:
        """Allocates the case's buffers (collective).

        Args:
            info: the rank and the run's dtype and reduction.
            count: the row's element count (``OpSpec.element_count``).
            mpi: MPI's communicator and reduction, to time MPI as well (``--baseline gloo,mpi``); ignored by the
                ops that have no MPI side.

        Raises:
            PerfSetupError: the op needs an API that is missing.
        """
        self.info = info
        self.count = count
        self.symm = symmetric_memory_api(self.spec.name) if self.spec.needs_symmetric_memory else None
        self.buffers = SymmetricBuffers(self.symm)
        self.inputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.in_place_outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.mpi_outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.setup()
        self.mpi = mpi if self.spec.mpi is not None else None
        if self.mpi is not None:
            self.setup_mpi()

    @property
    def block(self) -> int:
        """Elements per rank's block, for ops whose size is n blocks."""
        return self.count // self.info.nranks

    def own_block(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's block of ``tensor`` (a view), for ops whose size is n blocks."""
        return tensor[self.info.rank * self.block:(self.info.rank + 1) * self.block]

    def ours(self, count: int) -> torch.Tensor:
        """Our side's tensor of ``count`` elements: symmetric, or ordinary for a collective under
        ``--ordinary-tensors``."""
        if self.info.ordinary_tensors and self.spec.takes_ordinary_tensors:
            return torch.zeros(count, dtype=self.info.dtype)
        return self.buffers.empty(count, self.info.dtype)

    def input_pair(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Ours (:meth:`ours`) and an ordinary tensor of ``count`` elements that ``fill`` gives the same inputs."""
        pair = (self.ours(count), torch.zeros(count, dtype=self.info.dtype))
        self.inputs.append(pair)
        return pair

    def output_pair(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Ours (:meth:`ours`) and an ordinary tensor of ``count`` elements that ``wrong_elements`` compares."""
        pair = (self.ours(count), torch.zeros(count, dtype=self.info.dtype))
        self.outputs.append(pair)
        return pair

    def mpi_output(self, baseline: torch.Tensor) -> torch.Tensor:
        """An ordinary tensor like gloo's output ``baseline``, for MPI's result, that ``wrong_elements_mpi``
        compares with it."""
        tensor = torch.zeros_like(baseline)
        self.mpi_outputs.append((tensor, baseline))
        return tensor

    @abc.abstractmethod
    def setup(self) -> None:
        """Allocates the pairs (and anything else the op needs)."""

    def fill(self) -> None:
        """Zeroes the outputs, then writes the same inputs into ours and gloo's (before the check).

        In that order, so that an in-place op's buffer, both input and output, ends up holding the inputs.
        """
        for ours, baseline in self.outputs + self.mpi_outputs:
            ours.zero_()
            baseline.zero_()
        for salt, (ours, baseline) in enumerate(self.inputs):
            data = input_pattern(ours.numel(), self.info.dtype, self.info.rank, salt)
            ours.copy_(data)
            baseline.copy_(data)

    @abc.abstractmethod
    def run_ours(self) -> None:
        """One out-of-place operation through HyperParallel SHMEM."""

    @abc.abstractmethod
    def run_baseline(self) -> None:
        """One operation through torch.distributed on gloo."""

    def _count_wrong(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
        """Wrong elements of ours against gloo's, bit for bit except floating-point sums and averages."""
        exact = not self.spec.reduces or self.info.redop in ("min", "max")
        return sum(count_wrong(ours, baseline, exact=exact) for ours, baseline in pairs)

    def wrong_elements(self) -> int:
        """Wrong elements of this rank's outputs after one ``run_ours`` and one ``run_baseline``.

        Bit for bit, except floating-point sums and averages, whose order of additions may differ.
        """
        return self._count_wrong(self.outputs)

    def wrong_elements_mpi(self) -> int:
        """Wrong elements of MPI's outputs against gloo's, after one ``run_baseline`` and one ``run_mpi`` (the same
        rules as :meth:`wrong_elements`)."""
        return self._count_wrong(self.mpi_outputs)

    def _mpi_average(self, output: torch.Tensor) -> None:
        """``-o avg``: MPI has no average, so its sum is divided here (a view of the numpy buffer MPI wrote)."""
        if self.mpi.average:
            output.div_(self.info.nranks)

    def close(self) -> None:
        """Frees the symmetric tensors (collective)."""
        self.buffers.free_all()


class InPlaceCase(Case):
    """A collective that also runs in place (``InPlace.SUPPORTED``): ``setup`` lists in ``in_place_outputs`` which
    of our tensors hold the in-place result, each beside gloo's out-of-place output it must equal."""

    @abc.abstractmethod
    def run_ours_in_place(self) -> None:
        """One in-place operation through HyperParallel SHMEM."""

    @abc.abstractmethod
    def prepare_in_place(self) -> None:
        """Lays out the inputs ``fill`` wrote for the in-place form, in this rank's own buffers (before its check).

        Called after the out-of-place check, which leaves the inputs as ``fill`` wrote them.
        """

    def wrong_elements_in_place(self) -> int:
        """Wrong elements of this rank's in-place result after one ``run_ours_in_place``, against gloo's output."""
        return self._count_wrong(self.in_place_outputs)


class LowPrecisionCase(InPlaceCase):
    """A reduction that also runs in place in ``--low-precision`` (``OpSpec.low_precision``). Its check compares
    the result with the exact reduction of the deterministic inputs (rebuilt for every rank) within the error
    bound the library documents (``_low_precision.error_bound``), not bit for bit and not against gloo.

    With ``--ordinary-tensors`` its in-place and low-precision forms run on an ordinary torch tensor instead of the
    symmetric one (:meth:`in_place_tensor`): the call a user makes on, say, gradients that torch allocated.
    """

    def in_place_tensor(self, symmetric: torch.Tensor) -> torch.Tensor:
        """The tensor of the in-place and low-precision forms: ``symmetric``, or an ordinary one like it."""
        return torch.zeros_like(symmetric) if self.info.ordinary_tensors else symmetric

    @abc.abstractmethod
    def run_ours_low_precision(self) -> None:
        """One in-place operation through HyperParallel SHMEM, travelling in ``info.low_precision``."""

    @abc.abstractmethod
    def low_precision_result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's result of the in-place form, and the float64 exact reduction and sum of magnitudes of the
        inputs ``fill`` wrote, in the result's layout."""

    @property
    def two_shot(self) -> bool:
        """Whether the result was cast down twice (all_reduce's documented bound covers both of its paths)."""
        return False

    def wrong_elements_low_precision(self) -> int:
        """Elements of the low-precision result beyond the documented bound (after ``fill``, ``prepare_in_place``
        and one ``run_ours_low_precision``)."""
        from hyper_parallel.platform.torch.low_precision import error_bound

        ours, exact, magnitudes = self.low_precision_result()
        if self.info.redop == "avg":
            exact = exact / self.info.nranks
        bound = error_bound(self.info.low_precision, ours.dtype, self.info.redop, self.info.nranks, magnitudes,
                            two_shot=self.two_shot)
        beyond = (ours.to(torch.float64) - exact).abs() > bound
        return int(torch.count_nonzero(beyond | ours.isnan()).item())

    def inputs_of_every_rank(self, count: int) -> list[torch.Tensor]:
        """The float64 inputs ``fill`` gives each rank's first input (``count`` elements)."""
        return [input_pattern(count, self.info.dtype, rank).to(torch.float64) for rank in range(self.info.nranks)]


class _OneSidedCase(Case):
    """Rank 0 moves the row's bytes between its memory and its peer's (``RankInfo.peer``); every other rank idles.

    ``run_floor`` times the remote transport's own transfer of the same bytes between the same buffers (the floor
    column, where the peer is reached through one).
    """

    writes: ClassVar[bool]  # rank 0 writes into the peer (put) or reads from it (get)

    @property
    def source_rank(self) -> int:
        """Whose data is moved."""
        return 0 if self.writes else self.info.peer

    @property
    def dest_rank(self) -> int:
        """Where it lands."""
        return self.info.peer if self.writes else 0

    def setup(self) -> None:
        self.src, self.base_src = self.input_pair(self.count)
        self.dst, self.base_dst = self.output_pair(self.count)

    def run_baseline(self) -> None:
        if self.info.rank == self.source_rank:
            dist.send(self.base_src, self.dest_rank)
        elif self.info.rank == self.dest_rank:
            dist.recv(self.base_dst, self.source_rank)

    def run_floor(self) -> None:
        """One transfer of the remote transport alone (rank 0): the same bytes, buffers and peer as ours."""
        if self.info.rank == 0:
            if self.writes:
                shmem.remote_transport_transfer(True, self.dst, self.src, self.info.peer)
            else:
                shmem.remote_transport_transfer(False, self.src, self.dst, self.info.peer)

    def wrong_elements(self) -> int:
        return super().wrong_elements() if self.info.rank == self.dest_rank else 0


class _PutGetCase(_OneSidedCase):
    """put and get: beside a single-core memcpy of the same bytes, and MPI's one-sided RMA.

    The MPI side works on a window of ``MPI_Win_allocate`` of the row's bytes on every rank, locked once for the whole
    row (``MPI_Win_lock_all``): the window's memory is MPI's, as the symmetric heap is ours, so that MPICH may use its
    shared memory or registered memory. (A window of ``MPI_Win_create`` on gloo's tensors needs the target's MPI
    progress: a passive target that is not in an MPI call makes every flush wait for it.)
    """

    def run_memcpy(self) -> None:
        if self.info.rank == 0:
            self.base_dst.copy_(self.base_src)

    def setup_mpi(self) -> None:
        from mpi4py import MPI

        nbytes = self.count * self.base_src.element_size()
        self.window = MPI.Win.Allocate(nbytes, disp_unit=1, comm=self.mpi.comm)
        # The window's memory as a tensor: the put's destination (compared with gloo's), or the get's source (the
        # peer's inputs, written by ``fill``).
        self.window_tensor = torch.frombuffer(self.window.tomemory(), dtype=self.info.dtype, count=self.count) \
            if self.count else torch.zeros(0, dtype=self.info.dtype)
        self.window.Lock_all()
        if self.writes:
            self.mpi_outputs.append((self.window_tensor, self.base_dst))
            self.mpi_source = self.base_src.numpy()
        else:
            self.mpi_received = self.mpi_output(self.base_dst)
            self.mpi_target = self.mpi_received.numpy()

    def fill(self) -> None:
        super().fill()
        if self.mpi is not None:
            self.window.Sync()  # the window's memory is also written through the tensor (the separate model)
            if not self.writes:
                self.window_tensor.copy_(self.base_src)
            self.window.Sync()
            self.mpi.comm.Barrier()  # the peer's window holds what it must before rank 0 reads or writes it

    def run_mpi(self) -> None:
        if self.info.rank == 0:
            if self.writes:
                self.window.Put(self.mpi_source, self.info.peer)
            else:
                self.window.Get(self.mpi_target, self.info.peer)
            self.window.Flush(self.info.peer)

    def wrong_elements_mpi(self) -> int:
        self.window.Sync()
        self.mpi.comm.Barrier()  # rank 0's flushes are complete on every target before anyone compares
        self.window.Sync()
        return super().wrong_elements_mpi() if self.info.rank == self.dest_rank else 0

    def close(self) -> None:
        if self.mpi is not None:
            self.window.Unlock_all()
            del self.window_tensor  # the window's memory goes with it
            self.window.Free()
        super().close()


class PutCase(_PutGetCase):
    """``put``: rank 0 writes its symmetric ``src`` into the peer's ``dst``."""

    spec = OPS["put"]
    writes = True

    def run_ours(self) -> None:
        if self.info.rank == 0:
            shmem.put(self.dst, self.src, self.info.peer)


class GetCase(_PutGetCase):
    """``get``: rank 0 reads the peer's symmetric ``src`` into its own ``dst``."""

    spec = OPS["get"]
    writes = False

    def run_ours(self) -> None:
        if self.info.rank == 0:
            shmem.get(self.dst, self.src, self.info.peer)


class PutWithSignalCase(_OneSidedCase):
    """``put_with_signal``: rank 0 writes its symmetric ``src`` into the peer's ``dst`` and sets the peer's signal to
    the call's epoch (``symm.shmem_put_with_signal``, signal op set), both on the peer when the call returns.

    Every rank counts the epochs (every rank runs every operation), so the peer checks its signal against its own
    count. The floor is the transport's put of the data alone.
    """

    spec = OPS["put_with_signal"]
    writes = True
    _SIGNAL_SET = 0  # the user API's signal_op for set

    def setup(self) -> None:
        super().setup()
        self.signal = self.buffers.empty(1, torch.int64)
        self.epoch = 0

    def run_ours(self) -> None:
        self.epoch += 1
        if self.info.rank == 0:
            self.symm.shmem_put_with_signal(self.dst, 0, self.src, 0, self.count, self.signal, 0, self.epoch,
                                            self._SIGNAL_SET, self.info.peer)

    def wrong_elements(self) -> int:
        if self.info.rank != self.dest_rank:
            return 0
        return super().wrong_elements() + int(int(self.signal.item()) != self.epoch)


class SignalPingPongCase(Case):
    """``signal_pingpong``: rank 0 raises the peer's signal, the peer waits for it and raises rank 0's.

    Signals carry increasing epochs (never reset); gloo passes the same epochs in one-element messages.
    """

    spec = OPS["signal_pingpong"]

    def setup(self) -> None:
        self.signal = self.buffers.empty(1, torch.int64)
        shmem.barrier()  # every rank's zeroed signal before the first epoch
        self.epoch = 0
        self.base_epoch = 0
        self.base_message = torch.zeros(1, dtype=torch.int64)

    def run_ours(self) -> None:
        rank, peer = self.info.rank, self.info.peer
        if rank not in (0, peer):
            return
        self.epoch += 1
        if rank == 0:
            shmem.signal(self.signal, self.epoch, peer)
            shmem.wait_signal(self.signal, self.epoch, cmp="ge")
        else:
            shmem.wait_signal(self.signal, self.epoch, cmp="ge")
            shmem.signal(self.signal, self.epoch, 0)

    def run_baseline(self) -> None:
        rank, peer = self.info.rank, self.info.peer
        if rank not in (0, peer):
            return
        self.base_epoch += 1
        if rank == 0:
            self.base_message.fill_(self.base_epoch)
            dist.send(self.base_message, peer)
            dist.recv(self.base_message, peer)
        else:
            dist.recv(self.base_message, 0)
            dist.send(self.base_message, 0)

    def wrong_elements(self) -> int:
        if self.info.rank not in (0, self.info.peer):
            return 0
        return int(int(self.signal.item()) != self.epoch) + int(int(self.base_message.item()) != self.base_epoch)


class BarrierCase(Case):
    """``barrier``: ours against ``dist.barrier``."""

    spec = OPS["barrier"]

    def setup(self) -> None:
        pass

    def run_ours(self) -> None:
        shmem.barrier()

    def run_baseline(self) -> None:
        dist.barrier()

    def setup_mpi(self) -> None:
        pass

    def run_mpi(self) -> None:
        self.mpi.comm.Barrier()


class AllGatherCase(InPlaceCase):
    """``all_gather``: a block per rank into an output of n blocks; in place, the input is this rank's block of
    the output."""

    spec = OPS["all_gather"]

    def setup(self) -> None:
        self.input, self.base_input = self.input_pair(self.block)
        self.output, self.base_output = self.output_pair(self.count)
        self.output_own_block = self.own_block(self.output)
        self.in_place_outputs = [(self.output, self.base_output)]

    def run_ours(self) -> None:
        self.symm.shmem_allgather(self.output, self.input)

    def run_ours_in_place(self) -> None:
        self.symm.shmem_allgather(self.output, self.output_own_block)

    def prepare_in_place(self) -> None:
        self.output.zero_()  # so that the out-of-place result cannot pass for the in-place one
        self.output_own_block.copy_(self.input)

    def run_baseline(self) -> None:
        dist.all_gather_single(self.base_output, self.base_input)

    def setup_mpi(self) -> None:
        self.mpi_input, self.mpi_receive = self.base_input.numpy(), self.mpi_output(self.base_output).numpy()

    def run_mpi(self) -> None:
        self.mpi.comm.Allgather(self.mpi_input, self.mpi_receive)


class AllReduceCase(LowPrecisionCase):
    """``all_reduce``: out of place, the input reduced into the output by the runtime face's
    ``Team.all_reduce(output, input=input)`` on the root team, with no copy (``shmem_allreduce`` and
    ``dist.all_reduce`` work in place only; gloo's row copies the input into the output first); in place,
    ``shmem_allreduce`` on the output as it is (or an ordinary tensor holding the input, with
    ``--ordinary-tensors``)."""

    spec = OPS["all_reduce"]

    def setup(self) -> None:
        self.input, self.base_input = self.input_pair(self.count)
        self.output, self.base_output = self.output_pair(self.count)
        self.reduced = self.in_place_tensor(self.output)
        self.in_place_outputs = [(self.reduced, self.base_output)]
        self.team = shmem.root_team()

    def run_ours(self) -> None:
        self.team.all_reduce(self.output, op=self.info.redop, input=self.input)

    def run_ours_in_place(self) -> None:
        self.symm.shmem_allreduce(self.reduced, op=self.info.redop)

    def run_ours_low_precision(self) -> None:
        self.symm.shmem_allreduce(self.reduced, op=self.info.redop, low_precision_dtype=self.info.low_precision)

    @property
    def two_shot(self) -> bool:
        return True

    def low_precision_result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        inputs = torch.stack(self.inputs_of_every_rank(self.count))
        return self.reduced, inputs.sum(0), inputs.abs().sum(0)

    def prepare_in_place(self) -> None:
        self.reduced.copy_(self.input)

    def run_baseline(self) -> None:
        self.base_output.copy_(self.base_input)
        dist.all_reduce(self.base_output, op=DIST_REDUCE_OPS[self.info.redop])

    def setup_mpi(self) -> None:
        self.mpi_result = self.mpi_output(self.base_output)
        self.mpi_input, self.mpi_receive = self.base_input.numpy(), self.mpi_result.numpy()

    def run_mpi(self) -> None:  # MPI reduces out of place itself: no copy
        self.mpi.comm.Allreduce(self.mpi_input, self.mpi_receive, op=self.mpi.op)
        self._mpi_average(self.mpi_result)


class ReduceScatterCase(LowPrecisionCase):
    """``reduce_scatter``: n blocks per rank in, the reduction of block i out on rank i; in place, the output is
    this rank's block of the input (an ordinary tensor holding the input, with ``--ordinary-tensors``)."""

    spec = OPS["reduce_scatter"]

    def setup(self) -> None:
        self.input, self.base_input = self.input_pair(self.count)
        self.output, self.base_output = self.output_pair(self.block)
        self.in_place_input = self.in_place_tensor(self.input)
        self.in_place_own_block = self.own_block(self.in_place_input)
        self.in_place_outputs = [(self.in_place_own_block, self.base_output)]

    def run_ours(self) -> None:
        self.symm.shmem_reduce_scatter(self.output, self.input, op=self.info.redop)

    def run_ours_in_place(self) -> None:
        self.symm.shmem_reduce_scatter(self.in_place_own_block, self.in_place_input, op=self.info.redop)

    def run_ours_low_precision(self) -> None:
        self.symm.shmem_reduce_scatter(self.in_place_own_block, self.in_place_input, op=self.info.redop,
                                       low_precision_dtype=self.info.low_precision)

    def low_precision_result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        blocks = torch.stack([self.own_block(t) for t in self.inputs_of_every_rank(self.count)])
        return self.in_place_own_block, blocks.sum(0), blocks.abs().sum(0)

    def prepare_in_place(self) -> None:
        # The symmetric input is still as ``fill`` wrote it (the out-of-place form only reads it); an ordinary one
        # gets a copy of it.
        if self.in_place_input is not self.input:
            self.in_place_input.copy_(self.input)

    def run_baseline(self) -> None:
        dist.reduce_scatter_single(self.base_output, self.base_input, op=DIST_REDUCE_OPS[self.info.redop])

    def setup_mpi(self) -> None:
        self.mpi_result = self.mpi_output(self.base_output)
        self.mpi_input, self.mpi_receive = self.base_input.numpy(), self.mpi_result.numpy()

    def run_mpi(self) -> None:
        self.mpi.comm.Reduce_scatter_block(self.mpi_input, self.mpi_receive, op=self.mpi.op)
        self._mpi_average(self.mpi_result)


class AllToAllCase(InPlaceCase):
    """``all_to_all``: block j of rank i's send buffer lands in block i of rank j's output; in place, the send
    blocks are the blocks of the (symmetric) output itself."""

    spec = OPS["all_to_all"]

    def setup(self) -> None:
        self.send, self.base_send = self.input_pair(self.count)
        self.receive, self.base_receive = self.output_pair(self.count)
        self.send_blocks = list(self.send.split(self.block))
        self.receive_blocks = list(self.receive.split(self.block))
        self.receive_counts = [self.block] * self.info.nranks
        self.in_place_outputs = [(self.receive, self.base_receive)]

    def run_ours(self) -> None:
        self.symm.shmem_alltoall(self.send_blocks, self.receive, self.receive_counts)

    def run_ours_in_place(self) -> None:
        self.symm.shmem_alltoall(self.receive_blocks, self.receive, self.receive_counts)

    def prepare_in_place(self) -> None:
        self.receive.copy_(self.send)

    def run_baseline(self) -> None:
        dist.all_to_all_single(self.base_receive, self.base_send)

    def setup_mpi(self) -> None:
        self.mpi_send, self.mpi_receive = self.base_send.numpy(), self.mpi_output(self.base_receive).numpy()

    def run_mpi(self) -> None:
        self.mpi.comm.Alltoall(self.mpi_send, self.mpi_receive)


class SendRecvCase(Case):
    """``send_recv``: ranks 2i and 2i+1 exchange a message; with an odd world the last rank idles."""

    spec = OPS["send_recv"]

    def setup(self) -> None:
        self.peer = self.info.rank ^ 1
        self.send, self.base_send = self.input_pair(self.count)
        self.receive, self.base_receive = self.output_pair(self.count)

    def _exchange(self, send: Callable[[Any, int], None], recv: Callable[[Any, int], None],
                  send_buffer: Any, receive_buffer: Any) -> None:
        """The pair's exchange with any transport's send and recv (torch tensors, or numpy arrays for MPI)."""
        if self.peer >= self.info.nranks:
            return
        if self.info.rank % 2 == 0:
            send(send_buffer, self.peer)
            recv(receive_buffer, self.peer)
        else:
            recv(receive_buffer, self.peer)
            send(send_buffer, self.peer)

    def run_ours(self) -> None:
        self._exchange(self.symm.shmem_send, self.symm.shmem_recv, self.send, self.receive)

    def run_baseline(self) -> None:
        self._exchange(dist.send, dist.recv, self.base_send, self.base_receive)

    def setup_mpi(self) -> None:
        self.mpi_send, self.mpi_receive = self.base_send.numpy(), self.mpi_output(self.base_receive).numpy()
        comm = self.mpi.comm
        self._mpi_send = lambda buffer, peer: comm.Send(buffer, dest=peer)
        self._mpi_recv = lambda buffer, peer: comm.Recv(buffer, source=peer)

    def run_mpi(self) -> None:
        self._exchange(self._mpi_send, self._mpi_recv, self.mpi_send, self.mpi_receive)


class _FusedCase(Case):
    """A fused compute-communication op beside its unfused sequence on this library (the baseline side).

    Inputs are ordinary tensors on both sides (only what peers address is symmetric, so the heap holds no matrix
    bigger than the row's size); the symmetric tensors are made here. Results are compared with tolerance: the
    fused op multiplies block by block, which may round differently from one matmul of the whole.
    """

    def matrix_pair(self, rows: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Two ordinary (rows, columns) matrices that ``fill`` gives the same inputs (views of flat tensors)."""
        pair = (torch.zeros(rows * columns, dtype=self.info.dtype), torch.zeros(rows * columns, dtype=self.info.dtype))
        self.inputs.append(pair)
        return pair[0].view(rows, columns), pair[1].view(rows, columns)

    def symmetric_matrix(self, rows: int, columns: int) -> torch.Tensor:
        return self.buffers.empty(rows * columns, self.info.dtype).view(rows, columns)

    def signal(self) -> torch.Tensor:
        return self.buffers.empty(self.info.nranks, torch.int64)

    def wrong_elements(self) -> int:
        return sum(count_wrong(ours, baseline, exact=False) for ours, baseline in self.outputs)


class FusedAllGatherMatmulCase(_FusedCase):
    """``fused_all_gather_matmul``: m x k rows per rank gathered and multiplied by a k x N matrix; the baseline
    gathers with ``shmem_allgather`` into a symmetric tensor, then multiplies."""

    spec = OPS["fused_all_gather_matmul"]

    def setup(self) -> None:
        n, k, columns = self.info.nranks, self.info.mm_k, self.info.mm_n
        rows = self.count // (n * k)
        self.a, self.base_a = self.matrix_pair(rows, k)
        self.b, self.base_b = self.matrix_pair(k, columns)
        self.gather_out, self.base_gather_out = self.symmetric_matrix(n * rows, k), self.symmetric_matrix(n * rows, k)
        self.c = torch.zeros(n * rows, columns, dtype=self.info.dtype)
        self.base_c = torch.zeros_like(self.c)
        self.outputs = [(self.gather_out, self.base_gather_out), (self.c, self.base_c)]
        self.signal_tensor = self.signal()

    def run_ours(self) -> None:
        self.symm.fused_all_gather_matmul(self.a, self.b, self.c, self.gather_out, self.signal_tensor)

    def run_baseline(self) -> None:
        self.symm.shmem_allgather(self.base_gather_out, self.base_a)
        torch.mm(self.base_gather_out, self.base_b, out=self.base_c)


class FusedMatmulReduceScatterCase(_FusedCase):
    """``fused_matmul_reduce_scatter``: (n·m) x k times k x N, rows reduce-scattered; the baseline multiplies into
    a symmetric tensor, then reduce-scatters it with ``shmem_reduce_scatter`` into a new tensor, as the fused op
    returns one (so that the speedup is the fusion's, not the first touch of a fresh output's pages)."""

    spec = OPS["fused_matmul_reduce_scatter"]

    def setup(self) -> None:
        n, k, columns = self.info.nranks, self.info.mm_k, self.info.mm_n
        rows = self.count // columns
        self.x1, self.base_x1 = self.matrix_pair(rows, k)
        self.x2, self.base_x2 = self.matrix_pair(k, columns)
        self.partial, self.base_partial = self.symmetric_matrix(rows, columns), self.symmetric_matrix(rows, columns)
        self.result = torch.zeros(rows // n, columns, dtype=self.info.dtype)
        self.base_result = torch.zeros_like(self.result)
        self.outputs = [(self.result, self.base_result)]
        self.signal_tensor = self.signal()

    def run_ours(self) -> None:  # the op returns a new tensor: kept, not copied
        self.result = self.symm.fused_matmul_reduce_scatter(self.x1, self.x2, self.partial, self.signal_tensor,
                                                            reduce_op=self.info.redop)

    def wrong_elements(self) -> int:
        return count_wrong(self.result, self.base_result, exact=False)

    def run_baseline(self) -> None:
        torch.mm(self.base_x1, self.base_x2, out=self.base_partial)
        self.base_result = torch.empty_like(self.result)
        self.symm.shmem_reduce_scatter(self.base_result, self.base_partial, op=self.info.redop)


class _TorchSymmMemCase(Case):
    """An op of torch's own symmetric-memory API (``torch.ops.symm_mem``) on this library's backend for it: its
    symmetric tensors come from ``torch.distributed._symmetric_memory.empty`` (collective over the root, like every
    allocation of the runtime) and are freed once the case lets go of them, at the next allocation."""

    def torch_empty(self, *shape: int, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """A zeroed symmetric tensor of torch's API (its pages mapped before any timing)."""
        import torch.distributed._symmetric_memory as symm_mem

        tensor = symm_mem.empty(*shape, dtype=dtype or self.info.dtype, device="cpu")
        tensor.zero_()
        return tensor

    @property
    def group_name(self) -> str:
        return dist.group.WORLD.group_name


class _TorchAllReduceCase(_TorchSymmMemCase):
    """torch's all-reduce on its symmetric tensor beside ``symm.shmem_allreduce`` in place on one of this library's
    (the baseline side); both sum the same inputs."""

    def setup(self) -> None:
        self.buffer = self.torch_empty(self.count)
        self.base_buffer = self.buffers.empty(self.count, self.info.dtype)
        self.inputs.append((self.buffer, self.base_buffer))
        self.world_name = self.group_name  # looked up once, as a caller keeps its group's name

    def run_baseline(self) -> None:
        self.symm.shmem_allreduce(self.base_buffer, op="sum")


class TorchOneShotAllReduceCase(_TorchAllReduceCase):
    """``symm_mem_one_shot_all_reduce``: ``torch.ops.symm_mem.one_shot_all_reduce_out`` into an ordinary output."""

    spec = OPS["symm_mem_one_shot_all_reduce"]

    def setup(self) -> None:
        super().setup()
        self.output = torch.zeros(self.count, dtype=self.info.dtype)
        self.outputs.append((self.output, self.base_buffer))

    def run_ours(self) -> None:
        torch.ops.symm_mem.one_shot_all_reduce_out(self.buffer, "sum", self.world_name, self.output)


class TorchTwoShotAllReduceCase(_TorchAllReduceCase):
    """``symm_mem_two_shot_all_reduce``: ``torch.ops.symm_mem.two_shot_all_reduce_`` in place."""

    spec = OPS["symm_mem_two_shot_all_reduce"]

    def setup(self) -> None:
        super().setup()
        self.outputs.append((self.buffer, self.base_buffer))

    def run_ours(self) -> None:
        torch.ops.symm_mem.two_shot_all_reduce_(self.buffer, "sum", self.world_name)


def moe_routing(info: RankInfo, tokens: int) -> list[int]:
    """How many of this rank's tokens go to each of the n x E experts (rank-major: expert e of rank r is r·E + e).

    Each token picks ``moe_topk`` distinct experts, uniformly or with Zipf weights (1 / (g + 1): the first experts of
    the first ranks get most tokens), from a generator seeded by the rank: the same plan on every run.

    Raises:
        PerfSetupError: more experts per token than there are.
    """
    experts = info.nranks * info.moe_experts
    if info.moe_topk > experts:
        raise PerfSetupError(f"`--moe-topk` must be at most the {experts} experts of {info.nranks} ranks "
                             f"(--moe-experts {info.moe_experts}), but got {info.moe_topk}")
    if tokens == 0:
        return [0] * experts
    weights = (torch.ones(experts) if info.moe_routing == "uniform"
               else 1.0 / torch.arange(1, experts + 1, dtype=torch.float64))
    generator = torch.Generator().manual_seed(1000 + info.rank)
    choices = torch.multinomial(weights.expand(tokens, experts), info.moe_topk, replacement=False,
                                generator=generator)
    return torch.bincount(choices.flatten(), minlength=experts).tolist()


class _MoeCase(_TorchSymmMemCase):
    """MoE dispatch or combine on torch's symmetric memory, beside what a CPU user does without it.

    A row is t tokens per rank of ``moe_hidden`` elements, each sent to ``moe_topk`` experts: the t x top-k rows
    (``count`` elements) already ordered by expert, rank-major (the order a router's sort leaves them in).
    """

    @property
    def hidden(self) -> int:
        return self.info.moe_hidden

    def plan(self) -> None:
        """This rank's routing, and the rows it sends to and receives from every rank (for the baselines)."""
        n, experts = self.info.nranks, self.info.moe_experts
        self.rows = self.count // self.hidden
        self.splits = moe_routing(self.info, self.rows // self.info.moe_topk)
        self.in_splits = torch.tensor(self.splits, dtype=torch.int64)
        # Every rank's plan is known from its seed: the receive side of the baselines' checks needs no exchange.
        every = [moe_routing(self.info._replace(rank=r), self.rows // self.info.moe_topk) for r in range(n)]
        me = self.info.rank
        self.received = [[every[s][me * experts + e] for e in range(experts)] for s in range(n)]  # [source][e]
        # The worst case every rank must hold: all tokens of every rank, plus each expert's alignment padding.
        self.capacity = n * self.rows + experts * self.info.moe_align

    def dispatch_layout(self, received: list[list[int]]) -> list[list[int]]:
        """Where chunk (source, e) starts in dispatch's expert-major output (all_to_all_vdev_2d's layout)."""
        n, experts, align = self.info.nranks, self.info.moe_experts, self.info.moe_align
        starts = [[0] * experts for _ in range(n)]
        at = 0
        for e in range(experts):
            region = at
            for s in range(n):
                starts[s][e] = at
                at += received[s][e]
            total = at - region
            at = region + max(-(-total // align) * align, align)
        return starts


class MoeDispatchCase(_MoeCase):
    """``moe_dispatch``: ``all_to_all_vdev_2d`` of the routed tokens; the baselines exchange the splits, read them on
    the host, exchange the tokens rank to rank and copy every chunk into the expert-major layout."""

    spec = OPS["moe_dispatch"]

    def setup(self) -> None:
        self.plan()
        self.tokens = self.torch_empty(self.rows, self.hidden)
        self.base_tokens = torch.zeros(self.rows, self.hidden, dtype=self.info.dtype)
        self.inputs.append((self.tokens.view(-1), self.base_tokens.view(-1)))
        self.experts_out = self.torch_empty(self.capacity, self.hidden)
        self.base_out = torch.zeros(self.capacity, self.hidden, dtype=self.info.dtype)
        self.outputs.append((self.experts_out.view(-1), self.base_out.view(-1)))
        self.splits_offsets = torch.zeros(2, len(self.splits), dtype=torch.int64)
        self.base_counts = torch.zeros(len(self.splits), dtype=torch.int64)
        self.base_staging = torch.zeros(self.info.nranks * self.rows, self.hidden, dtype=self.info.dtype)

    def run_ours(self) -> None:
        torch.ops.symm_mem.all_to_all_vdev_2d(self.tokens, self.experts_out, self.in_splits, self.splits_offsets,
                                              self.group_name, major_align=self.info.moe_align)

    def _exchange_and_lay_out(self, counts: torch.Tensor, out: torch.Tensor,
                              exchange: Callable[[list[int], list[int]], None]) -> None:
        """From the received splits (``counts``, read on the host: the sync a CPU user pays), the token exchange
        ``exchange(receive_rows, send_rows)`` into the staging buffer, then a copy per chunk into ``out``."""
        n, experts = self.info.nranks, self.info.moe_experts
        received = counts.view(n, experts).tolist()
        receive_rows = [sum(row) for row in received]
        send_rows = [sum(self.splits[r * experts:(r + 1) * experts]) for r in range(n)]
        exchange(receive_rows, send_rows)
        starts = self.dispatch_layout(received)
        at = 0
        for s in range(n):
            for e in range(experts):
                rows = received[s][e]
                out[starts[s][e]:starts[s][e] + rows].copy_(self.base_staging[at:at + rows])
                at += rows

    def run_baseline(self) -> None:
        dist.all_to_all_single(self.base_counts, self.in_splits)

        def exchange(receive_rows: list[int], send_rows: list[int]) -> None:
            dist.all_to_all_single(self.base_staging[:sum(receive_rows)], self.base_tokens, receive_rows, send_rows)

        self._exchange_and_lay_out(self.base_counts, self.base_out, exchange)

    def setup_mpi(self) -> None:
        self.mpi_out = self.mpi_output(self.base_out)
        self.mpi_counts = torch.zeros_like(self.base_counts)

    def run_mpi(self) -> None:
        comm, hidden = self.mpi.comm, self.hidden
        comm.Alltoall(self.in_splits.numpy(), self.mpi_counts.numpy())

        def exchange(receive_rows: list[int], send_rows: list[int]) -> None:
            receive = [rows * hidden for rows in receive_rows]
            send = [rows * hidden for rows in send_rows]
            comm.Alltoallv([self.base_tokens.numpy(), (send, _displacements(send))],
                           [self.base_staging.numpy(), (receive, _displacements(receive))])

        self._exchange_and_lay_out(self.mpi_counts, self.mpi_out, exchange)


class MoeCombineCase(_MoeCase):
    """``moe_combine``: ``all_to_all_vdev_2d_offset`` of the experts' tokens back to their ranks (dispatch's layout,
    made once before the timing); the baselines copy every chunk into rank-major order and exchange it on the sizes
    dispatch left on the host."""

    spec = OPS["moe_combine"]

    def setup(self) -> None:
        self.plan()
        n, experts = self.info.nranks, self.info.moe_experts
        tokens = self.torch_empty(self.rows, self.hidden)
        self.experts_in = self.torch_empty(self.capacity, self.hidden)
        self.dispatched = torch.zeros(2, len(self.splits), dtype=torch.int64)
        torch.ops.symm_mem.all_to_all_vdev_2d(tokens, self.experts_in, self.in_splits, self.dispatched,
                                              self.group_name, major_align=self.info.moe_align)
        del tokens
        self.base_experts_in = torch.zeros(self.capacity, self.hidden, dtype=self.info.dtype)
        self.inputs.append((self.experts_in.view(-1), self.base_experts_in.view(-1)))
        self.back = self.torch_empty(self.rows, self.hidden)
        self.base_back = torch.zeros(self.rows, self.hidden, dtype=self.info.dtype)
        self.outputs.append((self.back.view(-1), self.base_back.view(-1)))
        self.splits_offsets = torch.zeros(2, len(self.splits), dtype=torch.int64)
        # What dispatch left on the host: the chunks this rank holds, per (expert, source), and the rows back.
        self.starts = self.dispatch_layout(self.received)
        self.send_rows = [sum(self.received[s]) for s in range(n)]
        self.receive_rows = [sum(self.splits[r * experts:(r + 1) * experts]) for r in range(n)]
        self.base_staging = torch.zeros(sum(self.send_rows), self.hidden, dtype=self.info.dtype)

    def run_ours(self) -> None:
        torch.ops.symm_mem.all_to_all_vdev_2d_offset(self.experts_in, self.back, self.dispatched, self.splits_offsets,
                                                     self.group_name)

    def _pack(self) -> None:
        """Rank-major order for the exchange: for every destination, its chunks expert after expert."""
        at = 0
        for s in range(self.info.nranks):
            for e in range(self.info.moe_experts):
                rows = self.received[s][e]
                self.base_staging[at:at + rows].copy_(self.base_experts_in[self.starts[s][e]:self.starts[s][e] + rows])
                at += rows

    def run_baseline(self) -> None:
        self._pack()
        dist.all_to_all_single(self.base_back, self.base_staging, self.receive_rows, self.send_rows)

    def setup_mpi(self) -> None:
        self.mpi_back = self.mpi_output(self.base_back)
        self.mpi_send = [rows * self.hidden for rows in self.send_rows]
        self.mpi_receive = [rows * self.hidden for rows in self.receive_rows]

    def run_mpi(self) -> None:
        self._pack()
        self.mpi.comm.Alltoallv([self.base_staging.numpy(), (self.mpi_send, _displacements(self.mpi_send))],
                                [self.mpi_back.numpy(), (self.mpi_receive, _displacements(self.mpi_receive))])


def _displacements(counts: list[int]) -> list[int]:
    """Exclusive prefix sums: where each rank's part starts (MPI_Alltoallv's displacements)."""
    starts, at = [], 0
    for count in counts:
        starts.append(at)
        at += count
    return starts


CASES: dict[str, type[Case]] = {
    case.spec.name: case
    for case in (
        PutCase,
        GetCase,
        PutWithSignalCase,
        SignalPingPongCase,
        BarrierCase,
        AllGatherCase,
        AllReduceCase,
        ReduceScatterCase,
        AllToAllCase,
        SendRecvCase,
        FusedAllGatherMatmulCase,
        FusedMatmulReduceScatterCase,
        MoeDispatchCase,
        MoeCombineCase,
        TorchOneShotAllReduceCase,
        TorchTwoShotAllReduceCase,
    )
}
assert CASES.keys() == OPS.keys(), "every op of the table needs a case"
assert all(issubclass(case, InPlaceCase) == (case.spec.in_place is InPlace.SUPPORTED)
           for case in CASES.values()), "exactly the ops whose in-place form is supported run in place"
assert all(issubclass(case, LowPrecisionCase) == case.spec.low_precision
           for case in CASES.values()), "exactly the ops that run in low precision have a low-precision form"
assert all(hasattr(case, "run_memcpy") == case.spec.memcpy_reference
           for case in CASES.values()), "exactly the ops with a memcpy reference time one"
assert all(hasattr(case, "run_mpi") == hasattr(case, "setup_mpi") == (case.spec.mpi is not None)
           for case in CASES.values()), "exactly the ops with an MPI side run one"
assert all(hasattr(case, "run_floor") == case.spec.transport_floor
           for case in CASES.values()), "exactly the ops with a transport floor time one"
