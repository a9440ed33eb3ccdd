"""MPI jobs across simulated nodes: MPICH's ``mpiexec`` (hydra) on this machine, its proxies inside the nodes.

simulated_nodes.py starts torchrun in every node; an MPI job needs hydra's proxy there instead. Each node here runs
one placeholder process (started by torchrun, which sets the node up) that waits until the job is over; hydra's
``ssh`` launcher is then pointed (``-launcher-exec``) at a script that enters node k's namespaces
(``nsenter -t PID -m -u -p``, PID: the node's PID 1) and runs the proxy there, so every MPI rank lives in its node:
its /dev/shm, its hostname, its processes. The network namespace is this machine's: the proxies reach ``mpiexec``
at ``-localhost 127.0.0.1``.

For MPICH's UCX, ``UCX_NET_DEVICES=lo`` must not be set: MPICH's UCX then fails at MPI_Init ("no active messages
transport ... no route to ..."); ``UCX_TLS=tcp,self`` alone works, and serves this package's UCX as well.

Command line (the program's arguments follow ``--``; ``mpiexec``'s exit status is the tool's)::

    python tests/st/simulated_mpi.py --nodes 2 --nproc-per-node 1 -- python -m hyper_parallel.perf ...
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Mapping, Optional, Sequence

from simulated_nodes import SimulatedJob, node_name

# Waits in the node until the file named by its argument appears, or for at most its second argument in seconds.
_PLACEHOLDER = """import os, sys, time
ready, stop, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])
open(ready + os.environ["GROUP_RANK"], "w").close()
deadline = time.monotonic() + limit
while not os.path.exists(stop) and time.monotonic() < deadline:
    time.sleep(0.1)
"""
_READY_TIMEOUT_S = 60


def mpiexec_path() -> Optional[str]:
    """MPICH's ``mpiexec`` beside this interpreter (the ``mpich`` wheel puts it there), else the one on PATH."""
    return shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")


def _launcher_script(pids: Sequence[int]) -> str:
    """hydra's ``-launcher-exec``: called as ``SCRIPT [ssh options] HOST COMMAND...``; runs COMMAND in node HOST."""
    cases = "\n".join(f"    {node_name(k)}) pid={pid} ;;" for k, pid in enumerate(pids))
    return f"""#!/bin/bash
while [ $# -gt 0 ]; do
  case "$1" in
{cases}
    *) shift; continue ;;
  esac
  shift
  exec nsenter -t "$pid" -m -u -p -- /bin/bash -c "$*"
done
echo "simulated_mpi: no simulated node among the launcher's arguments" >&2
exit 2
"""


def run_mpiexec(nodes: int, nproc_per_node: int, program: Sequence[str], timeout: float,
                env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
    """Runs ``program`` as ``nodes * nproc_per_node`` MPI ranks, ``nproc_per_node`` in each simulated node.

    Args:
        nodes, nproc_per_node: the job's shape; rank r lies on node ``r // nproc_per_node``.
        program: the command every rank runs (``[python, -m, module, ...]``).
        timeout: seconds for the whole job (``MPIEXEC_TIMEOUT`` as well: hydra ends the ranks).
        env: the ranks' environment (default: this process's; every variable is passed on, ``-genvall``).

    Returns:
        ``mpiexec``'s completed process, its output text (stdout and stderr together).

    Raises:
        FileNotFoundError: no ``mpiexec`` is installed.
        subprocess.SubprocessError: a node did not get ready within its time.
        subprocess.TimeoutExpired: the job ran past ``timeout``.
    """
    mpiexec = mpiexec_path()
    if mpiexec is None:
        raise FileNotFoundError("simulated MPI jobs must have MPICH's mpiexec (pip install mpich), but got none")
    environment = {**(env if env is not None else os.environ), "MPIEXEC_TIMEOUT": str(int(timeout))}
    with tempfile.TemporaryDirectory(prefix="simulated-mpi-") as directory:
        placeholder = os.path.join(directory, "placeholder.py")
        ready, stop = os.path.join(directory, "ready"), os.path.join(directory, "stop")
        with open(placeholder, "w", encoding="utf-8") as f:
            f.write(_PLACEHOLDER)
        with SimulatedJob(nodes, 1, [placeholder, ready, stop, str(timeout + _READY_TIMEOUT_S)]) as job:
            job.start()
            deadline = time.monotonic() + _READY_TIMEOUT_S
            while not all(os.path.exists(f"{ready}{k}") for k in range(nodes)):
                if time.monotonic() > deadline or any(code is not None for code in job.poll()):
                    outputs = "\n".join(job.output(k) for k in range(nodes))
                    raise subprocess.SubprocessError(f"simulated nodes did not get ready for MPI: "
                                                     f"timeout_s={_READY_TIMEOUT_S}\n{outputs}")
                time.sleep(0.1)
            launcher = os.path.join(directory, "launch.sh")
            with open(launcher, "w", encoding="utf-8") as f:
                f.write(_launcher_script([job.namespace_pid(k) for k in range(nodes)]))
            os.chmod(launcher, 0o755)
            hosts = ",".join(node_name(k) for k in range(nodes))
            command = [mpiexec, "-launcher", "ssh", "-launcher-exec", launcher, "-localhost", "127.0.0.1",
                       "-hosts", hosts, "-ppn", str(nproc_per_node), "-n", str(nodes * nproc_per_node), "-genvall",
                       *program]
            try:
                return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      timeout=timeout, env=environment)
            finally:
                open(stop, "w").close()
                job.wait(timeout=30)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line: runs the program after ``--`` under mpiexec across simulated nodes, prints its output."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- then the command every rank runs")
    args = parser.parse_args(argv)
    program = args.program[1:] if args.program[:1] == ["--"] else args.program
    if not program:
        parser.error("the command every rank runs must follow --, but got none")
    result = run_mpiexec(args.nodes, args.nproc_per_node, program, args.timeout)
    print(result.stdout, end="")
    print(f"simulated_mpi: mpiexec exited {result.returncode}: {shlex.join(program)}", file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
