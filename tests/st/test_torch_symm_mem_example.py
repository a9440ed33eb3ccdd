"""``examples/torch_symm_mem_cpu.py`` runs the way its README command starts it: a script written for torch's
symmetric-memory API, unchanged, under ``torch.distributed.run`` with gloo, once this package is imported."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import hyper_parallel

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_EXAMPLE = os.path.join(_REPO, "examples", "torch_symm_mem_cpu.py")
_TIMEOUT_S = 240


def test_torch_symm_mem_example_under_torchrun(tmp_path) -> None:
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(hyper_parallel.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env.update({"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "60",
                "OMP_NUM_THREADS": "1"})
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", _EXAMPLE]
    # A session of its own, so that a hang kills torchrun's ranks too.
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"the example did not finish in {_TIMEOUT_S} s\nstdout:\n{stdout}\nstderr:\n{stderr}") \
            from None
    assert proc.returncode == 0, f"exit code {proc.returncode}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    assert "torch.distributed._symmetric_memory on CPU over HYPER_PARALLEL_SHMEM: 2 ranks OK" in stdout, stdout
