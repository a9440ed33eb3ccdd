"""The MindSpore path's parts that need no second rank: framework choice, the C ABI's loading, tensors over raw
memory (and how a freed one is told from a live one), and the refusal before MindSpore's communication is
initialised."""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.core.multicore import c_runtime
from hyper_parallel.core.multicore.errors import ShmemStateError
from hyper_parallel.core.multicore.errors import ShmemTypeError, ShmemValueError
from hyper_parallel.core.symmetric_memory import _framework, protocol
from hyper_parallel.platform.mindspore import tensors
from hyper_parallel.platform.mindspore.calls import CAbiCalls
from hyper_parallel.platform.mindspore.handler import HANDLER


def test_the_user_api_is_mindspores_here():
    assert _framework.FRAMEWORK == "mindspore" and symm.FRAMEWORK == "mindspore"
    assert _framework.handler() is HANDLER and symm.API.handler is HANDLER
    assert symm.empty == symm.API.empty and symm.shmem_allreduce == symm.API.shmem_allreduce
    assert isinstance(symm.API.calls, CAbiCalls) and symm.API.fast is None
    assert {"rendezvous", "SymmetricMemory", "shmem_alltoall", "debug_state"} <= set(symm.__all__)
    assert symm.is_shmem_available() is True


def test_the_mindspore_handler_implements_the_protocol():
    assert protocol.mismatches(HANDLER) == []
    assert isinstance(HANDLER, protocol.Handler)
    assert isinstance(HANDLER.facts, protocol.TensorFacts) and isinstance(HANDLER.calls, protocol.Calls)


@pytest.mark.parametrize("call,cls,operation,message", [
    (lambda: symm.shmem_allreduce(ms.Tensor(np.ones(3, np.float32)), op="prod"), ShmemValueError, "shmem_allreduce",
     "`op` must be one of 'sum', 'avg', 'max', 'min', but got 'prod'"),
    (lambda: symm.shmem_allgather(ms.Tensor(np.ones(4, np.float32)), [1.0]), ShmemTypeError, "shmem_allgather",
     "`input_tensor` must be a mindspore.Tensor, but got list"),
    (lambda: symm.empty((2, -1)), ShmemValueError, "empty",
     "`shape` must have non-negative dimensions, but got (2, -1)"),
    (lambda: symm.shmem_allreduce(ms.Tensor(np.ones(3, np.float32)), group=3), ShmemTypeError, "shmem_allreduce",
     "`group` must be a MindSpore group name (str) or None, but got int"),
])
def test_contract_errors_carry_upstreams_fields(call, cls, operation, message):
    with pytest.raises(cls) as info:
        call()
    error = info.value
    assert str(error) == message and isinstance(error, RuntimeError)
    assert (error.error_code, error.operation, error.phase, error.cann_error_code) == (
        "INVALID_ARGUMENT", operation, "Validation", None)
    assert error.__notes__ == [f"[HYPER_PARALLEL_SHMEM_ERROR] error_code=INVALID_ARGUMENT operation={operation} "
                               f"phase=Validation cann_error_code=None message={message}"]


def test_debug_state_without_a_runtime_speaks_both_vocabularies():
    state = symm.debug_state()
    assert state["state"] == "uninitialized" and state["state"] == "Uninitialized"
    assert state["config"] is None and state["reference_count"] == 0 and state["root_ranks"] == []
    assert state["latest_failure"]["error_code"] is None
    with pytest.raises(TypeError, match="must not be modified"):
        state["state"] = "initialized"


def test_an_unknown_platform_is_refused(monkeypatch):
    monkeypatch.setenv(_framework.VARIABLE, "jax")
    with pytest.raises(ValueError, match=r"^`HYPER_PARALLEL_PLATFORM` must be one of torch, mindspore, but got 'jax'$"):
        _framework.choose()
    monkeypatch.setenv(_framework.VARIABLE, "MindSpore")
    assert _framework.choose() == "mindspore"


def test_the_c_abi_library_loads_with_its_version():
    lib = c_runtime.library()
    assert lib.hp_shmem_abi_version() == c_runtime.ABI_VERSION
    assert lib.hp_shmem_status_name(6) == b"MISMATCH"
    assert c_runtime.state() == "uninitialized"


def test_a_missing_library_is_named(monkeypatch):
    monkeypatch.setattr(c_runtime, "library_path", lambda: "/nonexistent/libhp_shmem_c.so")
    c_runtime.library.cache_clear()
    try:
        with pytest.raises(ShmemStateError, match=r"^the runtime's C ABI library cannot be loaded: "
                                                  r"path=/nonexistent/libhp_shmem_c.so reason="):
            c_runtime.library()
        assert symm.is_shmem_available() is False
    finally:
        monkeypatch.undo()
        c_runtime.library.cache_clear()
    assert symm.is_shmem_available() is True


def test_the_low_precision_default_is_the_runtimes(monkeypatch):
    """The handler asks the runtime (which reads SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE once per lifecycle, and while
    none is active on each call) and never the environment itself; an explicit argument never takes the default."""
    monkeypatch.setenv("SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE", " BFloat16 ")
    assert HANDLER.calls.wire(None, ms.float32, "sum") == "bfloat16"
    assert HANDLER.calls.wire(None, ms.float32, "max") is None   # where it cannot apply: full precision, silently
    monkeypatch.setenv("SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE", "float7")
    with pytest.raises(ShmemValueError) as info:
        HANDLER.calls.wire(None, ms.float32, "sum")
    assert str(info.value) == ("`SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE` must be one of float16, bfloat16, "
                               "float8_e4m3fn, float8_e5m2 or 'none', but got 'float7'")
    assert HANDLER.calls.wire("float16", ms.float32, "sum") == "float16"


def test_calls_before_mindspore_communication_is_initialised_are_refused():
    code = ("import mindspore, hyper_parallel.core.symmetric_memory as symm\n"
            "try:\n    symm.empty(4)\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "ShmemStateError mindspore communication is not initialised (call mindspore.communication.init() on " \
           "every rank first): op=empty" in out.stdout, out.stdout + out.stderr


_DTYPES = [ms.float32, ms.float64, ms.float16, ms.bfloat16, ms.int8, ms.uint8, ms.int16, ms.int32, ms.int64]


@settings(max_examples=60, deadline=None)
@given(dtype=st.sampled_from(_DTYPES), shape=st.lists(st.integers(0, 5), min_size=0, max_size=3))
def test_a_wrapped_tensor_shares_the_memory_it_wraps(dtype, shape):
    info = tensors.dtype_info(dtype)
    count = int(np.prod(shape)) if shape else 1
    raw = (ctypes.c_byte * max(count * info.itemsize, 1))()
    address = ctypes.addressof(raw)
    t, array = tensors.wrap(address, shape, dtype)
    assert tuple(t.shape) == tuple(shape) and t.dtype == dtype
    if count == 0:
        return
    assert array.ctypes.data == address   # the array the tensor (and every view of it) keeps alive
    assert tensors.address(t) == address and tensors.nbytes(t) == count * info.itemsize
    view = np.frombuffer(raw, dtype=info.numpy, count=count)
    view[:] = np.arange(count) % 7            # written through memory, read through MindSpore
    got = t.astype(ms.float32).asnumpy().reshape(-1) if dtype == ms.bfloat16 else t.asnumpy().reshape(-1)
    expected = (np.arange(count) % 7).astype(info.numpy)
    if dtype == ms.bfloat16:   # the uint16 pattern k is a tiny bfloat16; compare bits instead
        assert np.array_equal(t.view(ms.uint16).asnumpy().reshape(-1), expected)
    else:
        assert np.array_equal(got, expected)


def test_a_freed_tensor_and_every_view_of_it_are_told_from_a_live_tensor_over_the_same_memory():
    """What the handler relies on in MindSpore 2.10 (docs/mindspore.md): views share their tensor's storage, a
    storage over memory MindSpore does not own goes to 0 bytes on resize_(0) and keeps its memory, and a new tensor
    over the same memory has a storage of its own. Re-check on a MindSpore upgrade."""
    raw = (ctypes.c_byte * 64)()
    address = ctypes.addressof(raw)
    x, array = tensors.wrap(address, (4, 4), ms.float32)
    x.copy_(ms.Tensor(np.arange(16, dtype=np.float32).reshape(4, 4)))
    tensors.synchronize()
    before = {"slice": x[1:3], "row": x[2], "flat": x.reshape(-1)[5:9], "transposed": x.T, "int32": x.view(ms.int32)}
    assert all(tensors.freed(v) is None for v in (x, *before.values()))
    assert tensors.readable_numel(x) == 16 and tensors.readable_numel(before["slice"]) == 8
    tensors.invalidate([(x, array)], allocation_id=41, lifecycle=3)
    after = {"slice": x[0:1], "flat": x.reshape(-1)}
    for name, view in {"x": x, **before, **after}.items():
        assert tensors.freed(view) == "allocation_id=41 lifecycle=3", name
        assert tensors.readable_numel(view) is None, name   # the primitives' fast path leaves it to the checks
        with pytest.raises(ShmemStateError) as info:
            tensors.check_tensor(view, "tensor")
        assert str(info.value) == ("tensor of a freed symmetric allocation: argument=tensor (symmetric allocation was "
                                   "freed: allocation_id=41 lifecycle=3 (this tensor and every view of it are invalid "
                                   "after symm.free))"), name
    # The memory stays where it was: only the storage's byte count is gone.
    assert tensors.address(before["slice"]) == address + 16
    assert np.frombuffer(raw, dtype=np.float32)[5] == 5.0
    # The same memory handed out again: the new tensor and its views are live, the old ones stay freed.
    y, y_array = tensors.wrap(address, (16,), ms.float32)
    assert tensors.freed(y) is None and tensors.freed(y[3:7]) is None
    assert tensors.readable_numel(y) == 16
    assert tensors.freed(before["row"]) == "allocation_id=41 lifecycle=3"
    # Freed again, with views of both allocations alive: a view is named by both (its storage cannot tell which).
    tensors.invalidate([(y, y_array)], allocation_id=42, lifecycle=3)
    assert tensors.freed(y[1:2]) == "allocation_id=41 lifecycle=3 or allocation_id=42 lifecycle=3"
    # Once no tensor over an allocation lives, it is forgotten: its array was kept alive by the views only.
    del x, array, before, after, view, info
    gc.collect()
    assert tensors.freed(y) == "allocation_id=42 lifecycle=3"
    assert tensors.freed(ms.Tensor(np.zeros(0, np.float32))) is None


def test_an_unsupported_dtype_is_named():
    with pytest.raises(TypeError, match=r"^`dtype` must be one of .*, but got Complex64$"):
        tensors.dtype_info(ms.complex64)


def test_signal_pads_are_not_used_here_as_on_torch():
    with pytest.raises(NotImplementedError, match=r"^set_signal_pad_size is not supported: size=1024 \(signal pads "
                                                  r"are not part of this library: a signal is a symmetric tensor"):
        symm.set_signal_pad_size(1024)
    with pytest.raises(NotImplementedError, match=r"^get_signal_pad_size is not supported \(signal pads are not "):
        symm.get_signal_pad_size()
