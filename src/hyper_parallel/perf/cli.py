"""``hp-shmem-perf`` (and ``python -m hyper_parallel.perf``): parse, then launch local ranks or run as one.

* ``--nproc N`` (default 2) outside a launcher: start N local ranks and wait for them.
* Under torchrun (RANK and WORLD_SIZE set), or as a rank the tool started: run the benchmark here.
* Under mpiexec: run the benchmark here, rank and world size from MPI, the gloo group met through a FileStore
  whose path rank 0 broadcasts over MPI. ``--baseline gloo,mpi`` (MPI's columns) runs only so.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
import traceback
from typing import Optional, Sequence

from hyper_parallel.perf.config import PROG, Config, parse_config
from hyper_parallel.perf.launch import PARENT_ENV, STORE_ENV, launch_local
from hyper_parallel.perf.mpi import MPIEXEC_HINT, join_mpi_world, remove_store, under_mpiexec

DEFAULT_NPROC = 2
_PARENT_POLL_S = 1.0
_SYMMETRIC_MEMORY = "hyper_parallel.core.symmetric_memory"


def _watch_parent(parent_pid: int) -> None:
    """Ends this rank once the launcher is gone, so that no rank outlives a killed run."""
    while True:
        time.sleep(_PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(70)


def _run_as_rank(config: Config) -> int:
    """Runs the benchmark in this process; any failure ends it at once with status 1 (never a hang at exit).

    A setup error is the same on every rank, so only rank 0 prints it; any other error is printed by the rank
    that hit it, with its traceback.
    """
    from hyper_parallel.perf.cases import PerfSetupError  # torch is imported only in ranks
    from hyper_parallel.perf.runner import run_rank

    rank = os.environ.get("RANK", "?")
    parent = os.environ.get(PARENT_ENV)
    if parent is not None:
        threading.Thread(target=_watch_parent, args=(int(parent),), daemon=True, name="perf-parent-watch").start()
    try:
        run_rank(config)
    except PerfSetupError as error:
        if rank == "0":
            print(f"{PROG}: error: {error}", file=sys.stderr, flush=True)
        os._exit(1)
    except BaseException as error:  # noqa: BLE001 - every failure must end the rank, Ctrl-C included
        details = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        print(f"{PROG}: rank {rank} failed: {type(error).__name__}: {error}\n{details}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    return 0


def _run_under_mpiexec(config: Config) -> int:
    """Runs as one rank of mpiexec's world: joins it, points the gloo group at rank 0's FileStore, runs, cleans up."""
    if importlib.util.find_spec("mpi4py") is None:
        print(f"{PROG}: error: a run under mpiexec must have mpi4py installed "
              "(pip install mpi4py mpich), but got none", file=sys.stderr)
        return 2
    # The package first: with the `ucx` extra it loads UCX's libraries, which must come before MPICH's wheel loads its
    # own older ones when MPI starts (the first libucs in a process serves both).
    importlib.import_module("hyper_parallel.core.multicore.shmem")
    world = join_mpi_world()
    if config.nproc is not None and config.nproc != world.size:
        if world.rank == 0:
            print(f"{PROG}: error: `--nproc` must match mpiexec's world size ({world.size}), but got {config.nproc}",
                  file=sys.stderr)
        remove_store(world)
        return 2
    os.environ.update({STORE_ENV: world.store_path, "RANK": str(world.rank), "WORLD_SIZE": str(world.size),
                       "MASTER_ADDR": "127.0.0.1"})
    status = _run_as_rank(config)
    remove_store(world)
    return status


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The console script.

    Args:
        argv: the arguments (default ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 1 when a rank failed, 2 for a bad command line (from argparse).
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    config = parse_config(arguments)
    if STORE_ENV not in os.environ and under_mpiexec():
        return _run_under_mpiexec(config)
    if config.mpi:
        started = ("a launcher's RANK and WORLD_SIZE" if "RANK" in os.environ and "WORLD_SIZE" in os.environ
                   else f"`--nproc {config.nproc or DEFAULT_NPROC}`")
        print(f"{PROG}: error: `--baseline mpi` must run under mpiexec ({MPIEXEC_HINT}), but got {started}",
              file=sys.stderr)
        return 2
    under_launcher = STORE_ENV in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)
    if under_launcher:
        world = int(os.environ["WORLD_SIZE"])
        if config.nproc is not None and config.nproc != world:
            print(f"{PROG}: error: `--nproc` must match the launcher's WORLD_SIZE ({world}), but got {config.nproc}",
                  file=sys.stderr)
            return 2
        return _run_as_rank(config)
    needing = [op.name for op in config.ops if op.needs_symmetric_memory]
    if needing and importlib.util.find_spec(_SYMMETRIC_MEMORY) is None:
        print(f"{PROG}: error: `--op {','.join(needing)}` needs {_SYMMETRIC_MEMORY}, which is not installed",
              file=sys.stderr)
        return 1
    return launch_local(config.nproc or DEFAULT_NPROC, arguments)
