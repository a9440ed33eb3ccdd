"""Starts N local ranks of the tool (``--nproc N``) and watches them: one failing rank stops them all.

Each rank is this same command run as ``python -m hyper_parallel.perf``, joined to the others by a FileStore in
a private temporary folder (no port to pick, so parallel runs never collide). The launcher itself imports no
torch.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Sequence

from hyper_parallel.perf.config import PROG

STORE_ENV = "HYPER_PARALLEL_PERF_STORE"  # also read by the ranks (runner.py)
PARENT_ENV = "HYPER_PARALLEL_PERF_PARENT"
_POLL_S = 0.05
# How long the other ranks get to report their own errors after one rank failed, before they are stopped.
_FAILURE_GRACE_S = 3.0
_TERMINATE_GRACE_S = 2.0


def _stop(processes: list[subprocess.Popen]) -> None:
    """Terminates the ranks still running (SIGTERM, then SIGKILL), each by its own pid."""
    running = [process for process in processes if process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _TERMINATE_GRACE_S
    for process in running:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _watch(processes: list[subprocess.Popen]) -> int:
    """Waits for every rank; once one fails, gives the others a moment, then stops them.

    Returns:
        0 when every rank succeeded, else the first failing rank's exit status (1 if a signal ended it).
    """
    failed_rank = None
    failed_at = 0.0
    status = 0
    while any(process.poll() is None for process in processes):
        if failed_rank is None:
            for rank, process in enumerate(processes):
                code = process.poll()
                if code not in (None, 0):
                    failed_rank, failed_at, status = rank, time.monotonic(), code if code > 0 else 1
                    break
        elif time.monotonic() - failed_at > _FAILURE_GRACE_S:
            _stop(processes)
            break
        time.sleep(_POLL_S)
    if failed_rank is None:
        for rank, process in enumerate(processes):
            if process.returncode != 0:
                failed_rank, status = rank, process.returncode if process.returncode > 0 else 1
                break
    if failed_rank is not None:
        print(f"{PROG}: rank {failed_rank} failed (exit status {processes[failed_rank].returncode})",
              file=sys.stderr, flush=True)
    return status


def launch_local(nproc: int, argv: Sequence[str]) -> int:
    """Runs ``python -m hyper_parallel.perf ARGV`` as ranks 0..nproc-1 of one gloo group and waits for them.

    Args:
        nproc: the number of ranks.
        argv: the command line to pass on (the ranks parse it again).

    Returns:
        The exit status for the tool: 0, or the first failing rank's.
    """
    folder = tempfile.mkdtemp(prefix="hp-shmem-perf-")
    environment = dict(os.environ)
    environment.update({STORE_ENV: os.path.join(folder, "store"), PARENT_ENV: str(os.getpid()),
                        "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
                        "MASTER_ADDR": "127.0.0.1"})
    processes: list[subprocess.Popen] = []
    try:
        for rank in range(nproc):
            environment.update(RANK=str(rank), LOCAL_RANK=str(rank))
            processes.append(subprocess.Popen([sys.executable, "-m", "hyper_parallel.perf", *argv],
                                              env=dict(environment)))
        return _watch(processes)
    except KeyboardInterrupt:
        _stop(processes)
        return 130
    finally:
        _stop(processes)
        shutil.rmtree(folder, ignore_errors=True)
