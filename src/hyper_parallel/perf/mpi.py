"""MPI beside gloo (``--baseline gloo,mpi``): running under mpiexec, and the MPI side of the timed operations.

Under ``mpiexec -n N python -m hyper_parallel.perf ...`` the ranks learn their rank and the world size from MPI's
COMM_WORLD and join the gloo group through a FileStore in a private folder that rank 0 creates and broadcasts
over MPI (no port to pick). The MPI columns then time MPICH (or whatever MPI mpi4py was built against) through
mpi4py, on numpy views of gloo's ordinary tensors.

Importing this module imports neither torch nor mpi4py: mpi4py initialises MPI when ``mpi4py.MPI`` is imported,
which only a rank started by mpiexec does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Mapping, NamedTuple, Optional

# What each launcher family tells its processes: MPICH's hydra and Intel MPI (PMI), Open MPI, PMIx launchers.
_LAUNCHER_ENV = (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("PMIX_RANK", "PMIX_SIZE"))
MPIEXEC_HINT = "mpiexec -n N python -m hyper_parallel.perf ..."


def under_mpiexec(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether this process was started by an MPI launcher (mpiexec, mpirun).

    Args:
        environ: the environment to read (default ``os.environ``).

    Returns:
        True when one launcher family's rank and size variables are both set.
    """
    environ = os.environ if environ is None else environ
    return any(rank in environ and size in environ for rank, size in _LAUNCHER_ENV)


def comm_world() -> Any:
    """MPI's COMM_WORLD (imports ``mpi4py.MPI``, which initialises MPI once per process).

    Returns:
        ``mpi4py.MPI.COMM_WORLD``.
    """
    from mpi4py import MPI

    return MPI.COMM_WORLD


class MpiWorld(NamedTuple):
    """This rank's place in the MPI world, and the gloo group's meeting point.

    Attributes:
        rank, size: from COMM_WORLD.
        store_path: the FileStore's path, the same on every rank.
        folder: the private folder holding it, which rank 0 removes after the run (None on the other ranks).
    """

    rank: int
    size: int
    store_path: str
    folder: Optional[str]


def join_mpi_world() -> MpiWorld:
    """Collective over COMM_WORLD: rank 0 creates a private folder for gloo's FileStore and broadcasts its path.

    Returns:
        This rank's :class:`MpiWorld`.
    """
    comm = comm_world()
    rank, size = comm.Get_rank(), comm.Get_size()
    folder = tempfile.mkdtemp(prefix="hp-shmem-perf-mpi-") if rank == 0 else None
    path = comm.bcast(None if folder is None else os.path.join(folder, "store"), root=0)
    return MpiWorld(rank=rank, size=size, store_path=path, folder=folder)


def remove_store(world: MpiWorld) -> None:
    """Rank 0 removes the FileStore's folder once every rank has left the gloo group (collective over MPI)."""
    comm_world().Barrier()
    if world.folder is not None:
        shutil.rmtree(world.folder, ignore_errors=True)


class MpiSide(NamedTuple):
    """What a case needs to run its MPI side.

    Attributes:
        comm: COMM_WORLD (an ``mpi4py.MPI.Comm``); its ``Barrier`` lines the ranks up before each MPI loop.
        op: the MPI reduction of ``-o`` (``MPI.SUM`` for avg, whose division follows the call).
        average: whether ``-o`` is avg.
    """

    comm: Any
    op: Any
    average: bool


def mpi_side(redop: str) -> MpiSide:
    """The MPI side of a run whose reduction is ``redop``.

    Args:
        redop: ``sum``, ``min``, ``max`` or ``avg`` (MPI has no average: a sum, then a division).

    Returns:
        The :class:`MpiSide` over COMM_WORLD.
    """
    from mpi4py import MPI

    ops = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.SUM}
    return MpiSide(comm=MPI.COMM_WORLD, op=ops[redop], average=redop == "avg")


def library_version() -> str:
    """The first line of the MPI library's version string (``MPICH 5.0.2``), for the table's header and the JSON."""
    from mpi4py import MPI

    return " ".join(MPI.Get_library_version().splitlines()[0].split()).replace(" Version:", "")
