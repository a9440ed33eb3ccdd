"""The torch handler as the user API sees it, without a process group: the handler protocol, the seam that binds
it, the straight torch checked path's refusals with upstream's fields, and torch's low-precision names."""

from __future__ import annotations

import pytest
import torch

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.core.multicore.errors import ShmemTypeError, ShmemValueError
from hyper_parallel.core.symmetric_memory import _framework, checks, protocol
from hyper_parallel.platform.torch import low_precision
from hyper_parallel.platform.torch.handler import HANDLER

_NOTE = "[HYPER_PARALLEL_SHMEM_ERROR] error_code={} operation={} phase=Validation cann_error_code=None message={}"


def test_the_torch_handler_implements_the_protocol():
    assert protocol.mismatches(HANDLER) == []
    assert isinstance(HANDLER, protocol.Handler)
    assert isinstance(HANDLER.facts, protocol.TensorFacts) and isinstance(HANDLER.calls, protocol.Calls)
    assert isinstance(HANDLER.fast, protocol.FastCalls)


def test_the_protocol_check_names_what_a_handler_lacks():
    class Calls(HANDLER.calls):
        put = staticmethod(lambda target, src: None)   # two arguments where the user API passes seven

    class Partial:
        name, facts, calls, fast = "partial", HANDLER.facts, Calls, None

    assert protocol.mismatches(Partial()) == [
        "handler.register_operators: missing",
        "calls.put: takes (target, src), but the protocol passes 7 arguments",
    ]


def test_the_user_api_is_bound_to_the_torch_handler_through_the_seam():
    assert _framework.FRAMEWORK == "torch" and symm.FRAMEWORK == "torch"
    assert _framework.handler() is HANDLER and symm.API.handler is HANDLER
    assert symm.shmem_allreduce == symm.API.shmem_allreduce and symm.debug_state == symm.API.debug_state
    assert hasattr(torch.ops.hyper_parallel_shmem, "all_reduce_")   # the handler's operators are registered


@pytest.mark.parametrize("call,cls,operation,message", [
    (lambda: symm.shmem_allreduce(torch.ones(3), op="prod"), ShmemValueError, "shmem_allreduce",
     "`op` must be one of 'sum', 'avg', 'max', 'min', but got 'prod'"),
    (lambda: symm.shmem_allgather(torch.ones(4), [1.0]), ShmemTypeError, "shmem_allgather",
     "`input_tensor` must be a torch.Tensor, but got list"),
    (lambda: symm.empty((2, -1)), ShmemValueError, "empty",
     "`shape` must have non-negative dimensions, but got (2, -1)"),
    (lambda: symm.shmem_allreduce(torch.ones(3), group="dp"), ShmemTypeError, "shmem_allreduce",
     "`group` must be a torch.distributed.ProcessGroup or None, but got str"),
    (lambda: symm.shmem_allreduce(torch.ones(3), low_precision_dtype=torch.float32), ShmemValueError,
     "shmem_allreduce", "`low_precision_dtype` must be one of float16, bfloat16, float8_e4m3fn, float8_e5m2, but got "
     "torch.float32"),
])
def test_contract_errors_carry_upstreams_fields(call, cls, operation, message):
    with pytest.raises(cls) as info:
        call()
    error = info.value
    assert str(error) == message
    assert isinstance(error, RuntimeError) and isinstance(error, ValueError if cls is ShmemValueError else TypeError)
    assert (error.error_code, error.operation, error.phase, error.cann_error_code) == (
        "INVALID_ARGUMENT", operation, "Validation", None)
    assert error.__notes__ == [_NOTE.format("INVALID_ARGUMENT", operation, message)]


def test_torch_low_precision_names_are_the_shared_wire_names():
    assert tuple(low_precision.LOW_PRECISION_DTYPES) == checks.LOW_PRECISION_NAMES
    with pytest.raises(ValueError, match=r"^`low_precision_dtype` must be one of float16, bfloat16, float8_e4m3fn, "
                                         r"float8_e5m2 or 'none', but got 'fp8'$"):
        low_precision.wire("fp8", torch.float32, "sum")
    assert low_precision.wire(" Torch.BFloat16 ", torch.float32, "sum") == "bfloat16"
    assert low_precision.wire(torch.float8_e5m2, torch.float32, "avg") == "float8_e5m2"
    assert low_precision.wire("none", torch.float32, "sum") == low_precision.FULL
    assert low_precision.wire(None, torch.float32, "sum") == low_precision.DEFAULT
    with pytest.raises(ValueError, match=r"^`low_precision_dtype` must be None for op 'max' \(low precision applies "
                                         r"to 'sum' and 'avg'\), but got float16$"):
        low_precision.wire("float16", torch.float32, "max")
    assert low_precision.chosen(low_precision.FULL, torch.float32, "sum") is None
    assert low_precision.chosen("float16", torch.float32, "sum") == "float16"


def test_the_environments_default_applies_only_where_it_can(monkeypatch):
    monkeypatch.setenv(low_precision.ENV_VAR, "bfloat16")
    assert low_precision.chosen(low_precision.DEFAULT, torch.float32, "sum") == "bfloat16"
    assert low_precision.chosen(low_precision.DEFAULT, torch.float32, "max") is None
    assert low_precision.chosen(low_precision.DEFAULT, torch.float16, "sum") is None   # not narrower
    assert low_precision.chosen(low_precision.DEFAULT, torch.int32, "sum") is None
    monkeypatch.setenv(low_precision.ENV_VAR, "float7")
    with pytest.raises(ValueError, match=r"^`SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE` must be one of float16, "):
        low_precision.default(torch.float32, "sum")
