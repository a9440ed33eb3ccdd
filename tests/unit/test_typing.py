"""The package is typed (``py.typed``): ``mypy --strict`` accepts its public faces and a user's script that calls
every public function, and finds each typed as torch's users see it (``tests/typecheck/public_api_use.py`` asserts
the types with ``assert_type``, so an ``Any`` where a ``torch.Tensor`` belongs fails)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import hyper_parallel

_TESTS = pathlib.Path(__file__).resolve().parents[1]
# The public faces checked as modules of the installed package, and the user's script.
_MODULES = ("hyper_parallel.core.symmetric_memory", "hyper_parallel.core.multicore.shmem",
            "hyper_parallel.core.multicore.runtime_logs", "typecheck.public_api_use")
_TIMEOUT_S = 600


def test_the_package_says_it_is_typed():
    assert (pathlib.Path(hyper_parallel.__file__).parent / "py.typed").is_file()


def test_mypy_strict_accepts_the_public_faces_and_a_users_calls(tmp_path):
    command = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--cache-dir", str(tmp_path)]
    for module in _MODULES:
        command += ["-m", module]
    env = {**os.environ, "MYPYPATH": str(_TESTS)}
    done = subprocess.run(command, cwd=_TESTS, capture_output=True, text=True, env=env, timeout=_TIMEOUT_S,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"no issues found in {len(_MODULES)} source files" in done.stdout, done.stdout
