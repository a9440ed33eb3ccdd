"""The runtime's log records reach Python's logging (core/multicore/runtime_logs.py), from both copies of the runtime:
the torch binding's and the C ABI library's (MindSpore's face). Each case runs in a fresh interpreter of its own: a
lifecycle of one PE, without torch.distributed, and logging configured (or not) as a user's script would."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from hyper_parallel.core.multicore import runtime_logs

_TIMEOUT_S = 120

# Collects every record of the package as (logger, level, rank, message), printed as JSON at the end.
_COLLECT = """
    import json, logging
    records = []
    class Collect(logging.Handler):
        def emit(self, record):
            records.append((record.name, record.levelname, getattr(record, "rank", None), record.getMessage()))
"""


def _run(script: str, log_level: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("HYPER_PARALLEL_SHMEM_LOG_LEVEL", None)
    if log_level is not None:
        env["HYPER_PARALLEL_SHMEM_LOG_LEVEL"] = log_level
    env["HYPER_PARALLEL_SHMEM_HEAP_SIZE"] = "4M"
    for launcher_variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(launcher_variable, None)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, env=env,
                          timeout=_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    return done


def _records(done: subprocess.CompletedProcess) -> list:
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_runtimes_records_reach_the_package_logger_with_their_rank():
    done = _run(_COLLECT + """
    logging.getLogger("hyper_parallel").addHandler(Collect())
    from hyper_parallel.core.multicore import runtime_logs, shmem
    shmem.acquire()
    shmem.release()
    runtime_logs.flush()
    print(json.dumps(records))
    """, log_level="INFO")
    records = _records(done)
    started = [r for r in records if r[3].startswith("shmem runtime initialised: lifecycle=")]
    ended = [r for r in records if r[3].startswith("shmem runtime shut down: lifecycle=")]
    assert len(started) == 1 and len(ended) == 1, records
    assert started[0][:3] == ["hyper_parallel.shmem", "INFO", 0]
    assert "[hyper_parallel.shmem" not in done.stderr   # a handler took them: nothing on stderr beside it


def test_a_record_reaches_logging_without_any_further_call():
    # A symmetric tensor that dies without free is logged by its deleter; the forwarding thread hands it over while
    # the script only waits.
    done = _run(_COLLECT + """
    logging.getLogger("hyper_parallel").addHandler(Collect())
    import time, torch
    from hyper_parallel.core.multicore import shmem
    shmem.acquire()
    t = shmem.empty(4, dtype=torch.float32)
    del t
    deadline = time.monotonic() + 30
    while not records and time.monotonic() < deadline:
        time.sleep(0.01)
    print(json.dumps(records))
    """)
    leaked = [r for r in _records(done) if "symmetric allocation leaked" in r[3]]
    assert len(leaked) == 1, done.stdout
    assert leaked[0][:3] == ["hyper_parallel.shmem", "ERROR", 0]


def test_without_logging_configured_the_lines_are_the_runtimes_own_on_stderr():
    done = _run("""
    from hyper_parallel.core.multicore import shmem
    shmem.acquire()
    shmem.release()
    """, log_level="0")
    lines = [line for line in done.stderr.splitlines() if line.startswith("[hyper_parallel.shmem ")]
    assert any(line.startswith("[hyper_parallel.shmem INFO rank=0] shmem runtime initialised: ") for line in lines), \
        done.stderr
    # Each record once: the fallback and the runtime never both print it.
    assert len(lines) == len(set(lines)), done.stderr


def test_configured_logging_formats_them_and_they_are_printed_once():
    done = _run("""
    import logging, sys
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG, format="LOGGED %(name)s|%(levelname)s|%(message)s")
    from hyper_parallel.core.multicore import shmem
    shmem.acquire()
    shmem.release()
    """, log_level="INFO")
    assert "LOGGED hyper_parallel.shmem|INFO|shmem runtime initialised: lifecycle=" in done.stderr, done.stderr
    assert "[hyper_parallel.shmem INFO" not in done.stderr, done.stderr


def test_the_runtime_logger_follows_the_variable_until_a_user_sets_its_level():
    done = _run(_COLLECT + """
    import torch
    logging.getLogger("hyper_parallel").addHandler(Collect())
    from hyper_parallel.core.multicore import runtime_logs, shmem
    shmem.acquire()
    t = shmem.empty(4, dtype=torch.float32)
    shmem.free(t)
    runtime_logs.flush()
    followed = logging.getLogger("hyper_parallel.shmem").level
    debug_records = [r for r in records if r[1] == "DEBUG"]
    logging.getLogger("hyper_parallel.shmem").setLevel(logging.ERROR)
    del records[:]
    t = shmem.empty(4, dtype=torch.float32)
    shmem.free(t)
    shmem.release()
    runtime_logs.flush()
    print(json.dumps([followed, debug_records, records]))
    """, log_level="DEBUG")
    followed, debug_records, after_user_level = _records(done)
    assert followed == logging.DEBUG
    assert any(r[3].startswith("op=Empty ") for r in debug_records), debug_records
    assert any(r[3].startswith("op=Free ") for r in debug_records), debug_records
    assert after_user_level == []   # the user's ERROR holds: no DEBUG or INFO record passes


def test_the_c_abi_librarys_records_reach_logging_too():
    done = _run(_COLLECT + """
    logging.getLogger("hyper_parallel").addHandler(Collect())
    from hyper_parallel.core.multicore import c_runtime, runtime_logs
    bootstrap = c_runtime.Bootstrap(0, 1, lambda payload: payload, lambda: None)
    c_runtime.init(bootstrap)
    c_runtime.shutdown(bootstrap)
    runtime_logs.flush()
    print(json.dumps(records))
    """, log_level="INFO")
    records = _records(done)
    assert any(r[:3] == ["hyper_parallel.shmem", "INFO", 0] and r[3].startswith("shmem runtime initialised: ")
               for r in records), records


@pytest.mark.parametrize("runtime_level,expected", [(0, logging.DEBUG), (1, logging.INFO), (2, logging.WARNING),
                                                    (3, logging.ERROR)])
def test_levels_map_one_to_one(runtime_level, expected):
    assert runtime_logs.level_of(runtime_level) == expected


def test_an_unknown_level_is_named():
    with pytest.raises(ValueError, match=r"`runtime_level` must be one of 0, 1, 2, 3, but got 7"):
        runtime_logs.level_of(7)
