"""One owner of the configuration: the runtime's ``Config`` reads every variable (the user API's alias and
low-precision default included) for both faces, reports it in ``debug_state()["config"]``, and takes per-acquire
choices as arguments; nothing writes ``os.environ``. The enums' numberings come from the runtime too.

The torch face is the binding (``shmem``); the MindSpore face is the C ABI (``c_runtime``), which runs here without
MindSpore over a one-rank bootstrap of plain callables. Each lifecycle below is one process's alone (one PE).
"""

from __future__ import annotations

import os

import pytest

from hyper_parallel.core.multicore import c_runtime, shmem
from hyper_parallel.core.multicore.shmem._binding import C

HEAP = "HYPER_PARALLEL_SHMEM_HEAP_SIZE"
ALIAS = "SYMMETRIC_MEMORY_HEAP_SIZE"
LOW = "SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE"
MiB = 1 << 20
CONFLICT = ("`SYMMETRIC_MEMORY_HEAP_SIZE` must equal `HYPER_PARALLEL_SHMEM_HEAP_SIZE` when both are set, but got "
            "'24M' and '32M'")
BAD_LOW = ("`SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE` must be one of float16, bfloat16, float8_e4m3fn, float8_e5m2 or "
           "'none', but got 'float7'")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The variables of these tests unset, and put back afterwards."""
    for name in (HEAP, ALIAS, LOW):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _one_rank() -> c_runtime.Bootstrap:
    return c_runtime.Bootstrap(0, 1, lambda payload: payload, lambda: None)


@pytest.mark.parametrize("read", [shmem.read_config, c_runtime.read_config], ids=["binding", "c_abi"])
def test_the_alias_is_read_by_the_runtime_and_a_conflict_is_an_error(env, read) -> None:
    env.setenv(ALIAS, "24M")
    assert read()["heap_size"] == 24 * MiB
    env.setenv(HEAP, "24M")
    assert read()["heap_size"] == 24 * MiB   # both set, equal: fine
    env.setenv(HEAP, "32M")
    with pytest.raises(ValueError) as info:
        read()
    assert str(info.value) == CONFLICT


def test_acquire_reads_the_alias_reports_it_and_leaves_the_environment_alone(env) -> None:
    env.setenv(ALIAS, "24M")
    before = dict(os.environ)
    shmem.acquire()
    try:
        assert dict(os.environ) == before
        config = shmem.debug_state()["config"]
        assert config["heap_size"] == config["heap_size_bytes"] == 24 * MiB
        assert config["heap_size_source"] == ALIAS
        assert config["low_precision_dtype"] == ""
    finally:
        shmem.release()
    assert dict(os.environ) == before


def test_acquire_refuses_a_conflicting_alias_and_starts_nothing(env) -> None:
    env.setenv(ALIAS, "24M")
    env.setenv(HEAP, "32M")
    with pytest.raises(ValueError) as info:
        shmem.acquire()
    assert str(info.value) == CONFLICT
    assert shmem.debug_state()["state"] == "uninitialized"


def test_an_acquires_heap_size_is_an_argument_of_the_runtime(env) -> None:
    env.setenv(HEAP, "48M")
    before = dict(os.environ)
    shmem.acquire(heap_size_bytes=20 * MiB)
    try:
        assert shmem.debug_state()["config"]["heap_size"] == 20 * MiB
        assert shmem.debug_state()["config"]["heap_size_source"] == "heap_size_bytes"
        assert dict(os.environ) == before
    finally:
        shmem.release()
    with pytest.raises(ValueError) as info:
        shmem.acquire(heap_size_bytes=4096)
    assert str(info.value) == "`heap_size_bytes` must be at least 1 MiB, but got 4096"
    assert dict(os.environ) == before


def test_the_low_precision_default_is_read_once_per_lifecycle_by_the_runtime(env) -> None:
    env.setenv(HEAP, "16M")
    env.setenv(LOW, " BFloat16 ")
    assert shmem.low_precision_default() == "bfloat16"   # no lifecycle: the environment's, read by the runtime
    shmem.acquire()
    try:
        env.setenv(LOW, "float7")
        assert shmem.low_precision_default() == "bfloat16"   # the lifecycle's, read when it started
        assert shmem.debug_state()["config"]["low_precision_dtype"] == " BFloat16 "
    finally:
        shmem.release()
    with pytest.raises(ValueError) as info:
        shmem.low_precision_default()
    assert str(info.value) == BAD_LOW
    env.setenv(LOW, "none")
    assert shmem.low_precision_default() is None


def test_the_c_abi_face_reads_the_same_configuration_from_the_runtime(env) -> None:
    env.setenv(ALIAS, "16M")
    env.setenv(LOW, "float16")
    before = dict(os.environ)
    c_runtime.init(_one_rank())
    try:
        assert dict(os.environ) == before
        assert c_runtime.debug_state()["config"]["heap_size"] == 16 * MiB
        env.setenv(LOW, "float7")
        assert c_runtime.low_precision_default() == "float16"   # read once, when the lifecycle started
    finally:
        c_runtime.shutdown(_one_rank())
    with pytest.raises(ValueError) as info:
        c_runtime.low_precision_default()
    assert str(info.value) == BAD_LOW
    env.setenv(LOW, "float8_e5m2")
    assert c_runtime.low_precision_default() == "float8_e5m2"
    c_runtime.init(_one_rank(), 20 * MiB)   # an explicit heap over the alias's
    try:
        assert c_runtime.debug_state()["config"]["heap_size"] == 20 * MiB
    finally:
        c_runtime.shutdown(_one_rank())
    assert os.environ.get(HEAP) is None and os.environ[ALIAS] == "16M"


def test_every_face_reads_the_runtimes_one_numbering() -> None:
    numberings = c_runtime.numberings()
    assert set(numberings) == {"status_codes", "dtypes", "reduce_ops", "signal_ops", "compare_ops", "wire_formats",
                               "call_roles", "collectives", "lifecycle_states"}
    for name, numbering in numberings.items():
        assert getattr(C, name)() == numbering, name
    assert numberings["wire_formats"] == {"full": 0, "float8_e4m3fn": 1, "float8_e5m2": 2, "float16": 3,
                                          "bfloat16": 4}
    assert shmem.REDUCE_OPS == numberings["reduce_ops"] and shmem.COLLECTIVES == numberings["collectives"]
    assert dict(shmem.CALL_ROLES) == numberings["call_roles"]
