"""Unit tests of upstream hyper-parallel's vocabulary beside the project's, without a process group or a runtime.

Covers the error classes (every runtime error is a RuntimeError; contract errors stay ValueError/TypeError) and
upstream's fixed fields on them, ``debug_state()``'s dual values (:class:`shmem.StateName`,
:class:`shmem.Failure`), the keyword aliases ``operation=``/``comparison=``, and the refusals of the module-level
``acquire()``/``release()``/``host_barrier()`` that need no runtime.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hyper_parallel.core.multicore import shmem
from hyper_parallel.core.multicore.shmem._checks import keyword_alias
from hyper_parallel.core.multicore import snapshot
from hyper_parallel.core.multicore.errors import attach_fields

_NOTE = "[HYPER_PARALLEL_SHMEM_ERROR] error_code={} operation={} phase={} cann_error_code={} message={}"


# --------------------------------------------------------------------------
# Error classes and fields
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls,base,code,phase",
    [
        (shmem.ShmemValueError, ValueError, "INVALID_ARGUMENT", "Validation"),
        (shmem.ShmemTypeError, TypeError, "INVALID_ARGUMENT", "Validation"),
        (shmem.ShmemStateError, shmem.ShmemError, "INVALID_STATE", "Validation"),
        (shmem.ShmemTimeoutError, shmem.ShmemError, "TIMEOUT", "CannCall"),
        (shmem.ShmemDeviceError, shmem.ShmemError, "CANN_ERROR", "CannCall"),
        (shmem.ShmemOutOfMemoryError, shmem.ShmemError, "OUT_OF_MEMORY", "CannCall"),
        (shmem.ShmemMismatchError, shmem.ShmemError, "MISMATCH", "Validation"),
        (shmem.ShmemError, RuntimeError, "INTERNAL", "Validation"),
    ],
)
def test_every_error_is_a_runtime_error_with_upstream_code_and_phase(cls, base, code, phase) -> None:
    error = cls("a fact: key=1")
    assert isinstance(error, RuntimeError) and isinstance(error, shmem.ShmemError) and isinstance(error, base)
    assert (error.error_code, error.phase, error.cann_error_code, error.operation) == (code, phase, None, None)


@pytest.mark.parametrize(
    "message",
    [
        "tensor of a freed symmetric allocation: argument=dst (storage of allocation_id=3 was freed)",
        "allocation was already freed: allocation_id=7",
        "allocation is not active: allocation_id=7 state=freed",
    ],
)
def test_freed_memory_is_upstream_double_free(message) -> None:
    assert shmem.ShmemStateError(message).error_code == "DOUBLE_FREE"
    assert shmem.ShmemStateError("allocation was leaked (its storage was released before free)").error_code == (
        "INVALID_STATE")


def test_configuration_and_cann_codes() -> None:
    bad_heap = shmem.ShmemValueError("`HYPER_PARALLEL_SHMEM_HEAP_SIZE` must be at least 1 MiB, but got 100")
    assert bad_heap.error_code == "INVALID_CONFIG"
    device = shmem.ShmemDeviceError("aclshmem_malloc failed: cann_error_code=-7 (ACLSHMEM_TIMEOUT_ERROR)")
    assert (device.error_code, device.phase, device.cann_error_code) == ("CANN_ERROR", "CannCall", -7)


def test_a_bootstrap_failure_is_labelled_a_bootstrap_error_not_the_device() -> None:
    # The bootstrap's exchange over the framework's process group failed: not CANN, on any device.
    failed = shmem.ShmemDeviceError("bootstrap all_gather over the root ProcessGroup failed: RuntimeError: Numpy is "
                                    "not available")
    assert (failed.error_code, failed.phase, failed.cann_error_code) == ("BOOTSTRAP_ERROR", "Bootstrap", None)
    attach_fields(failed, "initialize")
    assert failed.__notes__ == [_NOTE.format("BOOTSTRAP_ERROR", "initialize", "Bootstrap", None, str(failed))]
    timed_out = shmem.ShmemTimeoutError("bootstrap timed out: op=acquire_shmem timeout_sec=2 (Rank 1 failed)")
    assert (timed_out.error_code, timed_out.phase) == ("TIMEOUT", "Bootstrap")
    recorded = shmem.Failure("DEVICE_ERROR: bootstrap barrier over the group failed: KeyError: 'x'", 0)
    assert (recorded["error_code"], recorded["phase"]) == ("BOOTSTRAP_ERROR", "Bootstrap")
    # The device's own failures keep upstream's labels.
    device = shmem.ShmemDeviceError("mmap of a peer's heap failed: errno=12 (Cannot allocate memory)")
    assert (device.error_code, device.phase) == ("CANN_ERROR", "CannCall")


def test_attach_fields_adds_one_note_and_keeps_the_message() -> None:
    error = shmem.ShmemStateError("shmem runtime is not initialised: op=put (call acquire_shmem() first)")
    attach_fields(error, "put")
    attach_fields(error, "outer")  # the innermost call wins
    assert str(error) == "shmem runtime is not initialised: op=put (call acquire_shmem() first)"
    assert error.operation == "put"
    assert error.__notes__ == [_NOTE.format("INVALID_STATE", "put", "Validation", None, str(error)
                                            + "; Call shmem.acquire() before using SHMEM capabilities.")]
    plain = ValueError("`x` must be 1, but got 2")  # a plain contract error gets the fields as attributes
    attach_fields(plain, "allocate")
    assert (plain.error_code, plain.operation, plain.phase, plain.cann_error_code) == (
        "INVALID_ARGUMENT", "allocate", "Validation", None)
    interrupt = KeyboardInterrupt()
    attach_fields(interrupt, "barrier")
    assert not hasattr(interrupt, "__notes__")


def test_calls_without_a_runtime_carry_the_fields() -> None:
    signal = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="error_code=INVALID_STATE operation=wait_signal") as info:
        shmem.wait_signal(signal, 1, comparison="ge")
    assert isinstance(info.value, shmem.ShmemStateError)
    with pytest.raises(ValueError, match="error_code=INVALID_ARGUMENT operation=signal phase=Validation") as info:
        shmem.signal(signal, 1, 0, operation="mul")
    assert str(info.value) == "`operation` must be one of 'set', 'add', but got 'mul'"
    with pytest.raises(TypeError, match="operation=allocate") as info:
        shmem.empty(4, dtype="float32")
    assert isinstance(info.value, RuntimeError) and str(info.value) == "`dtype` must be a torch.dtype, but got str"
    with pytest.raises(ValueError, match="operation=allocate"):
        shmem.empty(4, alignment=-64)


# --------------------------------------------------------------------------
# Keyword aliases
# --------------------------------------------------------------------------


def test_keyword_alias() -> None:
    assert keyword_alias("op", None, "operation", None, "set") == ("op", "set")
    assert keyword_alias("op", "add", "operation", None, "set") == ("op", "add")
    assert keyword_alias("op", None, "operation", "add", "set") == ("operation", "add")
    with pytest.raises(TypeError) as info:
        keyword_alias("op", "set", "operation", "add", "set")
    assert str(info.value) == ("`op` and `operation` must not both be given (they name the same argument), "
                               "but got op='set' and operation='add'")


def test_signal_aliases_are_checked_before_the_runtime() -> None:
    signal = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(TypeError, match="must not both be given"):
        shmem.signal(signal, 1, 0, op="add", operation="add")
    with pytest.raises(ValueError) as info:
        shmem.wait_signal(signal, 1, comparison="==")
    assert str(info.value) == "`comparison` must be one of 'eq', 'ne', 'gt', 'ge', 'lt', 'le', but got '=='"
    with pytest.raises(TypeError) as info:
        shmem.barrier(blocking="yes")
    assert str(info.value) == "`blocking` must be a bool, but got str"


# --------------------------------------------------------------------------
# debug_state's dual values
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "project,upstream", [("uninitialized", "Uninitialized"), ("initialized", "Ready"), ("failed", "Finalized")]
)
def test_state_name_answers_both_vocabularies(project, upstream) -> None:
    state = shmem.StateName(project)
    assert state == project and state == upstream and not (state != upstream) and state.upstream == upstream
    assert str(state) == project and repr(state) == repr(project) and hash(state) == hash(project)
    assert {project: 1}[state] == 1  # look-ups go by the project's name
    others = {"uninitialized", "initialized", "failed", "Uninitialized", "Ready", "Finalized"} - {project, upstream}
    assert all(state != other for other in others)
    assert shmem.StateName(project) == shmem.StateName(project)
    clone = pickle.loads(pickle.dumps(state))
    assert type(clone) is shmem.StateName and clone == upstream


def test_failure_reads_upstream_fields() -> None:
    failure = shmem.Failure("TIMEOUT: wait_signal timed out: op=wait_signal expected=1 observed=0", 3)
    assert failure.startswith("TIMEOUT: ") and failure[:7] == "TIMEOUT" and failure[0] == "T"
    assert failure.fields() == {
        "operation": "wait_signal",
        "phase": "CannCall",
        "root_rank": 3,
        "error_code": "TIMEOUT",
        "cann_error_code": None,
        "message": "wait_signal timed out: op=wait_signal expected=1 observed=0",
    }
    assert failure["error_code"] == "TIMEOUT" and failure.get("nothing", 5) == 5 and list(failure.keys()) == [
        "operation", "phase", "root_rank", "error_code", "cann_error_code", "message"]
    freed = shmem.Failure("STATE_ERROR: allocation was already freed: allocation_id=4", 0)
    assert freed["error_code"] == "DOUBLE_FREE" and freed["operation"] is None
    empty_op = shmem.Failure("STATE_ERROR: shmem runtime is not initialised: op=empty state=uninitialized", None)
    assert empty_op["operation"] == "allocate"
    nothing = shmem.Failure("", None)
    assert not nothing and nothing == "" and all(value is None for value in nothing.fields().values())
    for clone in (pickle.loads(pickle.dumps(failure)), copy.deepcopy(failure)):
        assert type(clone) is shmem.Failure and clone == failure and clone["root_rank"] == 3


@given(code=st.sampled_from(["INVALID_ARGUMENT", "TYPE_ERROR", "STATE_ERROR", "TIMEOUT", "OUT_OF_MEMORY",
                             "MISMATCH", "DEVICE_ERROR", "INTERNAL"]),
       message=st.text(min_size=1, max_size=60).filter(lambda text: ": " not in text))
def test_failure_fields_of_any_recorded_status(code, message) -> None:
    failure = shmem.Failure(f"{code}: {message}", 1)
    fields = failure.fields()
    assert fields["message"] == message and fields["root_rank"] == 1
    assert fields["phase"] in ("Validation", "CannCall", "Bootstrap")
    assert fields["error_code"] in {"INVALID_ARGUMENT", "INVALID_CONFIG", "INVALID_STATE", "DOUBLE_FREE", "TIMEOUT",
                                    "OUT_OF_MEMORY", "MISMATCH", "CANN_ERROR", "INTERNAL", "BOOTSTRAP_ERROR"}


def test_debug_state_without_a_runtime_in_both_vocabularies() -> None:
    state = shmem.debug_state()
    assert state["state"] == "uninitialized" and state["state"] == "Uninitialized"
    for key in ("config", "active_allocations", "root_rank", "root_size", "allocated_count", "allocated_bytes",
                "remaining_bytes", "max_allocated_bytes", "device_index", "device_model", "soc_name"):
        assert state[key] is None, key
    assert state["reference_count"] == 0 and state["leaked_allocations"] == []
    clone = pickle.loads(pickle.dumps(state))
    assert clone == state and type(clone["state"]) is shmem.StateName


# --------------------------------------------------------------------------
# Module-level lifecycle: refusals that need no runtime
# --------------------------------------------------------------------------


def test_release_and_host_barrier_without_a_runtime() -> None:
    with pytest.raises(shmem.ShmemStateError) as info:
        shmem.release()
    assert str(info.value).startswith("no reference taken by shmem.acquire() is left to release: op=release")
    assert info.value.operation == "shutdown"
    with pytest.raises(RuntimeError, match="operation=host_barrier"):
        shmem.host_barrier()


def test_a_user_api_call_without_distributed_names_the_call_made() -> None:
    import hyper_parallel.core.symmetric_memory as symm

    with pytest.raises(shmem.ShmemStateError) as info:
        symm.empty(4)
    assert str(info.value) == "torch.distributed is not initialised: op=empty (call init_process_group() first)"
    assert info.value.operation == "empty" and info.value.error_code == "INVALID_STATE"
    with pytest.raises(shmem.ShmemStateError) as info:
        symm.shmem_allreduce(torch.ones(2))
    assert str(info.value).startswith("torch.distributed is not initialised: op=shmem_allreduce ("), info.value
    assert "operation=shmem_allreduce" in "".join(info.value.__notes__)


def test_a_placeholder_call_name_is_the_operation_attached() -> None:
    error = shmem.ShmemStateError("group is gone: op=<call> group=tp")
    attach_fields(error, "shmem_put")
    assert str(error) == "group is gone: op=shmem_put group=tp"
    untouched = shmem.ShmemStateError("group is gone: op=barrier")
    attach_fields(untouched, "shmem_put")
    assert str(untouched) == "group is gone: op=barrier"


def test_acquire_refusals_without_distributed(monkeypatch) -> None:
    with pytest.raises(shmem.ShmemStateError, match="torch.distributed is not initialised") as info:
        shmem.acquire_shmem()  # the runtime face's own call needs torch.distributed to start a lifecycle
    assert info.value.operation == "initialize" and info.value.error_code == "INVALID_STATE"
    assert shmem.acquire_shmem.__doc__.startswith("Returns a reference to the process's SHMEM runtime")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError) as info:
        shmem.acquire(heap_size_bytes=True)
    assert str(info.value) == "`heap_size_bytes` must be a positive int, but got True"
    monkeypatch.setenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE", "lots")
    with pytest.raises(ValueError) as info:
        shmem.acquire()
    assert info.value.error_code == "INVALID_CONFIG" and info.value.operation == "initialize"
    monkeypatch.delenv("HYPER_PARALLEL_SHMEM_HEAP_SIZE")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(shmem.ShmemStateError, match="WORLD_SIZE=4"):
        shmem.acquire()
    assert shmem.debug_state()["state"] == "Uninitialized" and shmem.debug_state()["reference_count"] == 0


# --------------------------------------------------------------------------
# symmetric_memory.is_shmem_available
# --------------------------------------------------------------------------


def test_is_shmem_available_follows_the_configured_device(monkeypatch) -> None:
    import hyper_parallel.core.symmetric_memory as symm

    monkeypatch.delenv("HYPER_PARALLEL_SHMEM_DEVICE", raising=False)
    assert symm.is_shmem_available() is True  # the host device is built into every wheel
    monkeypatch.setenv("HYPER_PARALLEL_SHMEM_DEVICE", "ascend")
    built = shmem._binding.C.built_devices
    assert symm.is_shmem_available() is ("ascend" in built)
    monkeypatch.setenv("HYPER_PARALLEL_SHMEM_DEVICE", "tpu")
    assert symm.is_shmem_available() is False  # a malformed variable: False, and acquire names it
    assert shmem.debug_state()["state"] == "Uninitialized"


def test_data_engine_names_what_moves_the_bytes_of_each_device() -> None:
    """Upstream's config key: CANN SHMEM's MTE on an NPU (the only engine upstream accepts), the CPU on the host."""
    assert snapshot.data_engine("host") == "cpu" and snapshot.data_engine("ascend") == "mte"
    raw = {"state": "initialized", "lifecycle": 3, "rank": 1, "world_size": 2, "device": "ascend",
           "config": {"heap_size": 1 << 20, "timeout_sec": 5.0, "log_level": 1, "device": "ascend"},
           "heap_size": 1 << 20, "allocated": 128, "max_allocated": 128, "remaining": (1 << 20) - 128,
           "heap_base": 0x7000, "active_allocations": [{"allocation_id": 4, "base": 0x7000, "offset": 0, "bytes": 100,
                                                        "reserved": 128, "lifecycle": 3, "call_site": ""}],
           "leaked_allocations": [], "latest_failure": "", "calls_in_flight": 0, "live_teams": 1,
           "reaches_peer_memory": False, "nodes": [0, 0],
           "transports": ["self", "node"]}
    state = snapshot.project(raw, [0, 1], 1)
    assert state["config"]["data_engine"] == "mte" and state["config"]["heap_size_bytes"] == 1 << 20
    assert (state["root_rank"], state["root_size"], state["allocated_bytes"], state["remaining_bytes"]) == (
        1, 2, 100, (1 << 20) - 100)
    assert state["active_allocations"][0]["allocation_base"] == 0x7000 and state["reference_count"] == 1
