"""System-test cases of the user API (``hyper_parallel.core.symmetric_memory``), written once for every framework.

Each case is ``case(fw)``: it runs on every rank of a job and raises AssertionError, naming what differs, on a wrong
value or a wrong error. ``fw`` is the framework's adapter (:class:`Framework`): torch's lives next to the gloo
runner (``tests/st/symm_fw_torch.py``, run by ``tests/st/test_symm_shared_cases.py``), MindSpore's next to the msrun
runner (``tests/on_mindspore/ms_fw.py``, run by ``ms_cases.py`` and asserted by ``test_ms_symm.py``).

Numpy builds every input and checks every result; the references are independent of the code under test: numpy on
inputs every rank can rebuild, or the framework's own collectives (gloo, mccl). Error messages are compared whole
where both frameworks give the same text (the rules in ``symmetric_memory/checks.py``); the framework's part of a
message (``torch.Tensor``, a dtype's printed name) comes from the adapter.

This module imports no framework (it is imported in both environments) and is no test module of pytest's.
"""

from __future__ import annotations

import os
import re
import zlib
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

SET, ADD = 0, 1
EQ, GT, LT = 0, 1, 2


class Framework(Protocol):
    """What a framework supplies to the cases (one instance per rank and job)."""

    name: str          # "torch" or "mindspore"
    symm: Any          # hyper_parallel.core.symmetric_memory
    rank: int
    world: int
    tensor_type: str   # how messages name the tensor class: "torch.Tensor", "mindspore.Tensor"
    group_type: str    # how messages name a group: "a torch.distributed.ProcessGroup", "a MindSpore group name (str)"

    def dtype(self, name: str) -> Any:
        """The framework's dtype of numpy-style ``name`` ("float32", "bfloat16", "int64", ...)."""

    def dtype_text(self, name: str) -> str:
        """How error messages print that dtype (str of it: "torch.float32", "Float32")."""

    def qualified_dtype(self, name: str) -> str:
        """The dtype's qualified name in messages ("torch.int32", "mindspore.int32")."""

    def tensor(self, a: np.ndarray, dtype: Optional[str] = None) -> Any:
        """An ordinary tensor holding ``a`` (converted to ``dtype`` when given: "bfloat16" goes through float32)."""

    def numpy(self, t: Any) -> np.ndarray:
        """``t``'s values (bfloat16 as float32)."""

    def sub_group(self, groups: Sequence[Sequence[int]]) -> Any:
        """The group, among ``groups`` (disjoint lists of world ranks, covering the world), that holds this rank;
        called by every rank with the same ``groups``."""

    def all_gather(self, a: np.ndarray) -> list:
        """Every rank's ``a`` (same shape and dtype everywhere), over the framework's own collectives."""

    def all_reduce(self, a: np.ndarray) -> np.ndarray:
        """The sum over the world of every rank's ``a``, by the framework's own all_reduce."""

    def barrier(self) -> None:
        """The framework's own barrier over the world."""

    def debug_state(self) -> dict:
        """The runtime's ``debug_state()``."""

    def grad(self, fn: Callable[..., Any], inputs: Sequence[Any]) -> list:
        """The gradients (numpy) of the scalar ``fn(*inputs)`` with respect to each of ``inputs``."""

    def zeros_like_output(self, shape: Sequence[int], dtype: str = "float32") -> Any:
        """A zero tensor fit to be a collective's output inside ``fn`` of :meth:`grad`."""

    def synchronize(self) -> None:
        """Waits for the tensor work this rank queued (MindSpore queues copy_; torch runs it at once)."""


CASES: dict = {}


def case(fn: Callable[[Framework], None]) -> Callable[[Framework], None]:
    """Registers ``fn`` as a shared case under its name."""
    CASES[fn.__name__] = fn
    return fn


def run(fw: Framework, name: str) -> None:
    """Runs case ``name`` on this rank, then checks that it left no allocation of its own behind (an earlier case
    that failed may have: that one is reported there).

    Raises:
        AssertionError: the case failed, or left symmetric allocations active.
    """
    def active() -> dict:
        return {a["allocation_id"]: a for a in fw.debug_state()["active_allocations"] or ()}   # None: no runtime

    before = active()
    CASES[name](fw)
    left = [a for i, a in active().items() if i not in before]
    assert not left, f"case {name} left allocations active: {left}"


# ---------------------------------------------------------------------------------------------------- helpers
def values(rank: int, n: int, dtype: str = "float32", salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s deterministic input of ``n`` elements: small integers, exact in every dtype and in sums of a few
    ranks (bfloat16 inputs are built as float32)."""
    return ((np.arange(n) * 7 + rank * 13 + salt) % 17 - 8).astype(np.float32 if dtype == "bfloat16" else dtype)


def caught(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Optional[BaseException]:
    """What ``fn(*args, **kwargs)`` raised, or None."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 (the caller checks it)
        return e
    return None


def expect(kind: Any, fn: Callable[..., Any], *args: Any, message: Optional[str] = None, prefix: Optional[str] = None,
           contains: Sequence[str] = (), **kwargs: Any) -> str:
    """Runs ``fn(*args, **kwargs)``, which must raise an exception of class ``kind`` (a class name, or a tuple of
    them: the exception's class or one of its bases, by name) whose message is ``message``, starts with ``prefix``
    and holds each of ``contains``; returns the message.
    """
    e = caught(fn, *args, **kwargs)
    # arguments by type only: printing a freed tensor raises
    call = f"{getattr(fn, '__name__', fn)}({', '.join(type(a).__name__ for a in args)})"
    assert e is not None, f"{call} raised nothing, but {kind} was expected"
    text = str(e)
    names = [c.__name__ for c in type(e).__mro__]
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    assert set(kinds) & set(names), f"{call} raised {type(e).__name__} (bases {names}), not {kind}: {text!r}"
    if message is not None:
        assert text == message, f"{call}: message\n  {text!r}\nexpected\n  {message!r}"
    if prefix is not None:
        assert text.startswith(prefix), f"{call}: message\n  {text!r}\ndoes not start with\n  {prefix!r}"
    for needle in contains:
        assert needle in text, f"{call}: {needle!r} not in message {text!r}"
    return text


def refused(fw: Framework, op: str, by: int = 0, ranks: Optional[Sequence[int]] = None) -> str:
    """The end of every rank's message when a collective was refused (a check failed on rank ``by``, the lowest group
    rank whose check failed): the engine's call ``op`` and the team's ranks (default: the world)."""
    team = ",".join(map(str, range(fw.world) if ranks is None else ranks))
    return f" (refused by rank {by}: op={op} team_ranks=[{team}]; every member fails this call)"


def same_on_every_rank(fw: Framework, text: str, what: str) -> None:
    """Every rank of the world holds this very ``text`` (an error message every rank raised)."""
    digests = fw.all_gather(np.array([zlib.crc32(text.encode())], np.int64))
    assert len({int(d[0]) for d in digests}) == 1, f"{what}: the ranks raised different messages; this one: {text!r}"


def equal(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """``got`` equals ``want`` element for element (and in shape)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    assert bad.size == 0, (f"{what}: {bad.size} of {want.size} elements differ, first at {bad[:5].tolist()}: got "
                           f"{got.reshape(-1)[bad[:5]].tolist()}, expected {want.reshape(-1)[bad[:5]].tolist()}")


def within(got: np.ndarray, want: np.ndarray, bound: Any, what: str) -> None:
    """``|got - want| <= bound`` elementwise (``bound`` a scalar or an array of ``want``'s shape)."""
    err = np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))
    bound = np.broadcast_to(np.asarray(bound, np.float64), err.shape)
    bad = np.flatnonzero((err > bound).reshape(-1))
    assert bad.size == 0, (f"{what}: {bad.size} of {err.size} elements off, first at {bad[:5].tolist()}: error "
                           f"{err.reshape(-1)[bad[:5]].tolist()} > bound {bound.reshape(-1)[bad[:5]].tolist()}")


def symmetric(fw: Framework, a: np.ndarray, dtype: Optional[str] = None) -> Any:
    """A symmetric tensor (``symm.empty``) holding ``a``, of ``dtype`` (default: ``a``'s)."""
    dtype = dtype or a.dtype.name
    t = fw.symm.empty(a.shape, dtype=fw.dtype(dtype))
    t.copy_(fw.tensor(a, dtype))
    return t


def heap_bytes(text: str) -> int:
    """The bytes of a heap size written as the runtime's variables take it: digits and an optional K/M/G suffix."""
    match = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    assert match, f"heap size {text!r} is not digits with an optional K, M or G"
    return int(match.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[match.group(2)]


# ---------------------------------------------------------------------------------------------------- memory
@case
def empty_and_free(fw: Framework) -> None:
    symm = fw.symm
    # allocations are reserved in 64-byte granules (the runtime face's alignment)
    for name, shape, granule_bytes in (("float32", (4, 8), 128), ("bfloat16", (16,), 64), ("int64", (3, 5), 128),
                                       ("int8", (7,), 64)):
        t = symm.empty(shape, dtype=fw.dtype(name))
        assert tuple(t.shape) == shape and t.dtype == fw.dtype(name), (name, t.shape, t.dtype)
        before = fw.debug_state()["allocated"]
        symm.free(t)
        freed = before - fw.debug_state()["allocated"]
        assert freed == granule_bytes, f"freeing {name}{shape} gave back {freed} bytes, expected {granule_bytes}"
    t = symm.empty(10)
    assert t.dtype == fw.dtype("float32") and tuple(t.shape) == (10,), (t.dtype, t.shape)
    symm.free(t)
    # torch refuses a freed tensor as state (ShmemStateError), MindSpore as an argument (ValueError): both say so
    expect(("ValueError", "ShmemStateError"), symm.free, t, contains=["freed"])
    expect("ValueError", symm.free, fw.tensor(np.zeros(4, np.float32)))
    expect("ValueError", symm.empty, (2, -1), message="`shape` must have non-negative dimensions, but got (2, -1)")


@case
def heap_size_from_the_environment(fw: Framework) -> None:
    """The job sets the runtime's variable or the user API's alias, SYMMETRIC_MEMORY_HEAP_SIZE (which MindSpore's
    path copies into the variable)."""
    given = {v: os.environ[v] for v in ("HYPER_PARALLEL_SHMEM_HEAP_SIZE", "SYMMETRIC_MEMORY_HEAP_SIZE")
             if v in os.environ}
    assert len(set(given.values())) == 1, f"the job must set one heap size, but set {given}"
    t = fw.symm.empty(1)
    size = fw.debug_state()["heap_size"]
    fw.symm.free(t)
    text = next(iter(given.values()))
    assert size == heap_bytes(text), f"heap_size {size} from {given}, expected {heap_bytes(text)}"


@case
def allocation_mismatch(fw: Framework) -> None:
    """Ranks asking for different sizes all fail alike, and the runtime stays usable."""
    expect("ShmemMismatchError", fw.symm.empty, 64 if fw.rank == 0 else 128, dtype=fw.dtype("float32"))
    expect("RuntimeError", fw.symm.empty, 64 if fw.rank == 0 else 128, dtype=fw.dtype("float32"))
    assert not fw.debug_state()["active_allocations"], fw.debug_state()
    after = fw.symm.empty(8)
    fw.symm.free(after)


@case
def shutdown_refused_then_done(fw: Framework) -> None:
    symm = fw.symm
    live = symm.empty(4)
    expect("ShmemStateError", symm.shutdown)
    symm.free(live)
    symm.shutdown()
    assert fw.debug_state()["state"] == "uninitialized", fw.debug_state()
    again = symm.empty(4)   # a later empty starts afresh
    symm.free(again)
    symm.shutdown()


@case
def upstreams_vocabulary_for_diagnosis(fw: Framework) -> None:
    """A refused call carries upstream hyper-parallel's fields (diagnostics parse its note), and ``debug_state()``
    answers upstream's keys, ``config["data_engine"]`` included: the host device moves bytes with the CPU."""
    symm = fw.symm
    # a collective's refusal is the runtime's call, on every rank: its operation is the runtime's name for it
    message = "`op` must be one of 'sum', 'avg', 'max', 'min', but got 'prod'" + refused(fw, "all_reduce")
    error = caught(symm.shmem_allreduce, fw.tensor(values(fw.rank, 4)), op="prod")
    assert isinstance(error, ValueError) and isinstance(error, RuntimeError), repr(error)
    assert type(error).__name__ == "ShmemValueError", type(error).__mro__
    fields = (error.error_code, error.operation, error.phase, error.cann_error_code)
    assert fields == ("INVALID_ARGUMENT", "all_reduce", "Validation", None), fields
    assert error.__notes__ == ["[HYPER_PARALLEL_SHMEM_ERROR] error_code=INVALID_ARGUMENT operation=all_reduce "
                               f"phase=Validation cann_error_code=None message={message}"], error.__notes__
    error = caught(symm.shmem_alltoall, [fw.tensor(values(fw.rank, 1))] * fw.world, fw.tensor(values(0, 1)),
                   "1" * fw.world)
    assert isinstance(error, TypeError) and (error.error_code, error.operation) == (
        "INVALID_ARGUMENT", "all_to_all"), (repr(error), getattr(error, "operation", None))
    # a check that fails before the group is known stays this rank's, named by the public function
    error = caught(symm.shmem_allreduce, fw.tensor(values(fw.rank, 4)), group=7)
    assert isinstance(error, TypeError) and (error.error_code, error.operation) == (
        "INVALID_ARGUMENT", "shmem_allreduce"), (repr(error), getattr(error, "operation", None))
    t = symm.empty(4)
    try:
        state = symm.debug_state()
        assert state["state"] == "Ready" and state["root_rank"] == fw.rank and state["root_size"] == fw.world, state
        assert state["reference_count"] >= 1 and state["allocated_count"] >= 1, state
        config = state["config"]
        assert config["data_engine"] == "cpu" and config["bootstrap_endpoint_base"] is None, config
        assert config["heap_size_bytes"] == state["heap_size"], config
    finally:
        symm.free(t)


# ---------------------------------------------------------------------------------------------------- primitives
@case
def put_get_ring(fw: Framework) -> None:
    symm, rank, world, n = fw.symm, fw.rank, fw.world, 1000
    buf = symmetric(fw, np.zeros(n, np.float32))
    symm.barrier()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    symm.shmem_put(buf, 0, fw.tensor(values(rank, n)), 0, n, nxt)
    symm.barrier()
    equal(fw.numpy(buf), values(prev, n), "put into the next rank")
    pulled = fw.tensor(np.zeros(n, np.float32))
    symm.shmem_get(pulled, 0, buf, 0, n, nxt)   # nxt's copy holds this rank's values
    equal(fw.numpy(pulled), values(rank, n), "get from the next rank")
    # offsets and sizes as one-element tensors
    part = fw.tensor(np.zeros(10, np.float32))
    symm.shmem_get(part, fw.tensor(np.array([2], np.int64)), buf, fw.tensor(np.array([100], np.int64)),
                   fw.tensor(np.array([8], np.int32)), rank)
    equal(fw.numpy(part), np.concatenate([np.zeros(2, np.float32), values(prev, n)[100:108]]), "get of a window")
    symm.barrier()
    symm.free(buf)


@case
def example_one_put_with_signal(fw: Framework) -> None:
    """The API's first example (examples/symm_producer_consumer.py): rank 0 produces, rank 1 consumes."""
    symm = fw.symm
    data_buf = symm.empty(4096, dtype=fw.dtype("float16"))
    signal = symmetric(fw, np.zeros(1, np.int32))
    symm.barrier()
    local = np.random.default_rng(5).standard_normal(4096).astype(np.float16)

    def one(value: int, dtype: Any = np.int64) -> Any:
        return fw.tensor(np.array([value], dtype))

    if fw.rank == 0:
        symm.shmem_put_with_signal(target=data_buf, target_offset=one(0), src=fw.tensor(local), src_offset=one(0),
                                   size=one(4096), signal=signal, signal_offset=one(0),
                                   signal_value=one(1, np.int32), signal_op=SET, target_rank=1)
    elif fw.rank == 1:
        symm.shmem_wait_for_signal(depend_tensor=data_buf, signal=signal, signal_offset=one(0),
                                   compare_value=one(1, np.int32), compare_op=EQ)
        equal(fw.numpy(data_buf), local, "the consumer's data once the signal is there")
    symm.barrier()
    symm.free(signal)
    symm.free(data_buf)


@case
def signal_ops_and_compares(fw: Framework) -> None:
    symm, rank, world = fw.symm, fw.rank, fw.world
    sig = symmetric(fw, np.zeros(4, np.int64))
    symm.barrier()
    for peer in range(world):
        symm.shmem_signal_op(sig, 1, 1, ADD, peer)       # every rank adds 1 on every rank
    symm.shmem_wait_for_signal(None, sig, 1, world, EQ)
    symm.shmem_wait_for_signal(None, sig, 1, world - 1, GT)
    symm.shmem_wait_for_signal(None, sig, 1, world + 1, LT)
    symm.barrier()
    symm.shmem_signal_op(sig, 2, 42, SET, (rank + 1) % world)
    symm.shmem_wait_for_signal(None, sig, 2, 42, EQ)
    # nobody raises element 3: the wait ends with the runtime's timeout, saying what it saw
    expect("ShmemTimeoutError", symm.shmem_wait_for_signal, None, sig, 3, 5, EQ, contains=["observed=0"])
    symm.barrier()
    equal(fw.numpy(sig), np.array([0, world, 42, 0]), "the signals")
    symm.barrier()
    symm.free(sig)


@case
def bad_primitive_arguments(fw: Framework) -> None:
    """Every refused call names its argument in the project's form, and writes nothing."""
    symm, world = fw.symm, fw.world
    buf = symmetric(fw, np.zeros(16, np.float32))
    sig = symmetric(fw, np.zeros(2, np.int32))
    src = fw.tensor(np.ones(16, np.float32))
    symm.barrier()
    f32, f64 = fw.dtype_text("float32"), fw.dtype_text("float64")
    expect("TypeError", symm.shmem_put, [1.0], 0, src, 0, 4, 0,
           message=f"`target` must be a {fw.tensor_type}, but got list")
    expect("ValueError", symm.shmem_put, buf, 10, src, 0, 8, 0,
           message="`target_offset + size` must be at most target.numel() (16), but got 10 + 8 = 18")
    expect("ValueError", symm.shmem_put, buf, 0, src, 12, 8, 0,
           prefix="`src_offset + size` must be at most src.numel() (16)")
    expect("ValueError", symm.shmem_put, buf, -1, src, 0, 8, 0,
           message="`target_offset` must be non-negative, but got -1")
    expect("TypeError", symm.shmem_put, buf, 0, fw.tensor(np.ones(16, np.float64)), 0, 4, 0,
           message=f"`src` must have the dtype of `target` ({f32}), but got {f64}")
    expect("ValueError", symm.shmem_put, buf, 0, src, 0, 4, world,
           message=f"`target_rank` must be in [0, {world}), but got {world}")
    expect("ValueError", symm.shmem_signal_op, sig, 0, 1, 7, 0,
           message="`signal_op` must be one of 0 (SET), 1 (ADD), but got 7")
    expect("ValueError", symm.shmem_wait_for_signal, None, sig, 0, 1, 9, prefix="`compare_op` must be one of 0 (EQ), "
           "1 (GT), 2 (LT)")
    expect("TypeError", symm.shmem_signal_op, buf, 0, 1, SET, 0,
           message=(f"`signal` must have dtype {fw.qualified_dtype('int32')} or {fw.qualified_dtype('int64')}, but "
                    f"got {f32}"))
    expect("ValueError", symm.shmem_signal_op, sig, 2, 1, SET, 0, prefix="`signal_offset + size` must be at most "
           "signal.numel() (2)")
    expect("ValueError", symm.shmem_put, fw.tensor(np.zeros(16, np.float32)), 0, src, 0, 4, 0,
           prefix="`target` must be a symmetric tensor from symm.empty, but got an ordinary tensor at 0x")
    expect("TypeError", symm.shmem_put, buf, 1.5, src, 0, 4, 0,
           message="`target_offset` must be an int or a one-element integer tensor, but got float")
    expect("TypeError", symm.shmem_put, buf, fw.tensor(np.array([1, 2], np.int64)), src, 0, 4, 0,
           prefix="`target_offset` must be an int or a one-element integer tensor")
    expect("TypeError", symm.shmem_signal_op, sig, 0, 1.5, SET, 0,
           message="`signal_value` must be an int or a one-element integer tensor, but got float")
    expect("TypeError", symm.shmem_wait_for_signal, [1], sig, 0, 1, EQ,
           message=f"`depend_tensor` must be a {fw.tensor_type} or None, but got list")
    symm.barrier()
    equal(fw.numpy(buf), np.zeros(16, np.float32), "the target after refused calls")
    equal(fw.numpy(sig), np.zeros(2, np.int32), "the signal after refused calls")
    symm.barrier()
    symm.free(sig)
    symm.free(buf)


# ---------------------------------------------------------------------------------------------------- collectives
@case
def all_gather(fw: Framework) -> None:
    symm, rank, world = fw.symm, fw.rank, fw.world
    for name, n in (("float32", 33), ("float32", 70000), ("int64", 5), ("bfloat16", 300), ("float16", 0)):
        dst = fw.tensor(np.zeros(n * world, np.float32), name)
        returned = symm.shmem_allgather(dst, fw.tensor(values(rank, n, name), name))
        want = np.concatenate([values(r, n, name) for r in range(world)])
        equal(fw.numpy(returned), want, f"all_gather {name} x{n}: returned")
        equal(fw.numpy(dst), want, f"all_gather {name} x{n}: output")
    sym = symm.empty(64 * world, dtype=fw.dtype("float32"))
    symm.shmem_allgather(sym, fw.tensor(values(rank, 64)))
    equal(fw.numpy(sym), np.concatenate([values(r, 64) for r in range(world)]), "all_gather into a symmetric output")
    symm.barrier()
    symm.free(sym)
    expect("ValueError", symm.shmem_allgather, fw.tensor(np.zeros(5, np.float32)), fw.tensor(values(rank, 3)),
           message=f"`output_tensor.numel()` must be {world} x input_tensor.numel() ({3 * world}), but got 5"
                   + refused(fw, "all_gather"))
    expect("TypeError", symm.shmem_allgather, fw.tensor(np.zeros(3 * world, np.float64)), fw.tensor(values(rank, 3)),
           prefix="`input_tensor` must have the dtype of `output_tensor`")


@case
def all_reduce(fw: Framework) -> None:
    symm, rank, world = fw.symm, fw.rank, fw.world
    for dtype in ("float32", "float64", "int32", "int64", "int8", "bfloat16"):
        for op in ("sum", "max", "min", "avg"):
            if op == "avg" and dtype.startswith("int"):
                continue
            for n in (17, 100000):
                t = fw.tensor(values(rank, n, dtype), dtype)
                assert symm.shmem_allreduce(t, op) is t, "shmem_allreduce returns its tensor"
                stack = np.stack([values(r, n, dtype) for r in range(world)]).astype(np.float64)
                exact = {"sum": stack.sum(0), "max": stack.max(0), "min": stack.min(0), "avg": stack.sum(0) / world}[op]
                if op == "avg":
                    # the exact sum divided once: one rounding of the result's dtype
                    unit = {"float32": 2.0**-24, "float64": 2.0**-53, "bfloat16": 2.0**-8}[dtype]
                    within(fw.numpy(t), exact, unit * np.abs(exact), f"all_reduce {dtype} {op} x{n}")
                else:   # small integers: exact in every dtype
                    equal(fw.numpy(t), exact.astype(np.float32 if dtype == "bfloat16" else dtype),
                          f"all_reduce {dtype} {op} x{n}")
    s = symmetric(fw, values(rank, 4096))
    symm.shmem_allreduce(s, "sum")
    equal(fw.numpy(s), sum(values(r, 4096) for r in range(world)), "all_reduce of a symmetric tensor")
    symm.barrier()
    symm.free(s)
    i32 = fw.dtype_text("int32")
    expect("ValueError", symm.shmem_allreduce, fw.tensor(values(rank, 4, "int32")), "avg",
           message=f"`op` must be 'sum', 'max' or 'min' for the integer dtype {i32}, but got 'avg'"
                   + refused(fw, "all_reduce"))
    expect("ValueError", symm.shmem_allreduce, fw.tensor(values(rank, 4)), "prod",
           message="`op` must be one of 'sum', 'avg', 'max', 'min', but got 'prod'" + refused(fw, "all_reduce"))
    expect("ValueError", symm.shmem_allreduce, fw.tensor(values(rank, 4)), "sum", None, None, "sideways",
           message="`backward` must be one of 'identity', 'allreduce', but got 'sideways'" + refused(fw, "all_reduce"))


@case
def all_reduce_matches_the_framework(fw: Framework) -> None:
    """Against the framework's own all_reduce (gloo, mccl) and the exact sum on the same float32 inputs, and the
    same bits on every rank."""
    symm, rank, world, n = fw.symm, fw.rank, fw.world, 50000
    a = np.random.default_rng(100 + rank).standard_normal(n).astype(np.float32)
    ours = fw.tensor(a)
    symm.shmem_allreduce(ours, "sum")
    everyone = np.stack(fw.all_gather(a)).astype(np.float64)
    exact, magnitude = everyone.sum(0), np.abs(everyone).sum(0)
    # a float32 sum of `world` terms in any order is within (world - 1) roundings of the sum of magnitudes
    bound = (world - 1) * 2.0**-24 * magnitude
    within(fw.numpy(ours), exact, bound, "all_reduce against the exact sum")
    within(fw.numpy(ours), fw.all_reduce(a), 2 * bound, "all_reduce against the framework's")
    copies = fw.all_gather(fw.numpy(ours))
    for r, other in enumerate(copies):
        assert other.tobytes() == copies[0].tobytes(), f"rank {r}'s all_reduce result differs from rank 0's"


@case
def low_precision(fw: Framework) -> None:
    """``low_precision_dtype=`` and SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE: each value rounded once when encoded and
    the partial sums once more (two-shot), on top of float32's own roundings."""
    symm, rank, world, n = fw.symm, fw.rank, fw.world, 4096
    a = np.random.default_rng(7 + rank).standard_normal(n).astype(np.float32)
    inputs = [np.random.default_rng(7 + r).standard_normal(n).astype(np.float32) for r in range(world)]
    exact = np.sum(np.stack(inputs).astype(np.float64), 0)
    magnitude = np.sum(np.abs(np.stack(inputs)).astype(np.float64), 0)
    # (wire, unit roundoff); fp8 scales each block by its largest magnitude: its bound uses that
    for wire, unit in (("bfloat16", 2.0**-8), ("float16", 2.0**-11), ("float8_e4m3fn", 2.0**-3)):
        t = fw.tensor(a)
        symm.shmem_allreduce(t, "sum", low_precision_dtype=wire)
        scale = np.max(np.abs(np.stack(inputs))) if wire.startswith("float8") else magnitude
        bound = 2 * unit * (world + 1) * scale + world * 2.0**-24 * magnitude
        within(fw.numpy(t), exact, bound, f"all_reduce over {wire}")
    part = n // world
    rows = slice(rank * part, (rank + 1) * part)
    out = fw.tensor(np.zeros(part, np.float32))
    symm.shmem_reduce_scatter(out, fw.tensor(a), "sum", low_precision_dtype="bfloat16")
    within(fw.numpy(out), exact[rows], 2 * 2.0**-8 * (world + 1) * magnitude[rows] + world * 2.0**-24 * magnitude[rows],
           "reduce_scatter over bfloat16")
    assert np.any(fw.numpy(out) != exact[rows].astype(np.float32)), "reduce_scatter over bfloat16 rounded nothing"
    x = fw.tensor(a)
    expect("ValueError", symm.shmem_allreduce, x, "max", None, "bfloat16",
           prefix="`low_precision_dtype` must be None for op 'max'")
    expect("ValueError", symm.shmem_allreduce, fw.tensor(values(rank, 4, "int32")), "sum", None, "float16",
           prefix=f"`low_precision_dtype` must be None for the integer dtype {fw.dtype_text('int32')}")
    expect("ValueError", symm.shmem_allreduce, fw.tensor(values(rank, 4, "float16")), "sum", None, "bfloat16",
           message=(f"`low_precision_dtype` must be narrower than the tensor's dtype {fw.dtype_text('float16')} "
                    f"(2 bytes), but got bfloat16" + refused(fw, "all_reduce")))
    expect("ValueError", symm.shmem_allreduce, x, "sum", None, "float7",
           prefix="`low_precision_dtype` must be one of float16, bfloat16")
    # The runtime reads the default when a lifecycle starts: this one ends, and the next call starts one under it.
    symm.shutdown()
    saved = os.environ.get("SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE")
    os.environ["SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE"] = "bfloat16"
    try:
        t = fw.tensor(a)
        symm.shmem_allreduce(t, "sum")
        wired = fw.tensor(a)
        symm.shmem_allreduce(wired, "sum", low_precision_dtype="bfloat16")
        equal(fw.numpy(t), fw.numpy(wired), "the environment's default against the same wire given")
        assert np.any(fw.numpy(t) != exact.astype(np.float32)), "the environment's bfloat16 default changed nothing"
        i = fw.tensor(values(rank, 8, "int32"))
        symm.shmem_allreduce(i, "sum")   # the default applies only where it can
        equal(fw.numpy(i), sum(values(r, 8, "int32") for r in range(world)), "an int32 sum under the default")
        full = fw.tensor(a)
        symm.shmem_allreduce(full, "sum", low_precision_dtype="none")   # "none" overrides the default
        within(fw.numpy(full), exact, world * 2.0**-24 * magnitude, "'none' under the default")
        os.environ["SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE"] = "float16"
        later = fw.tensor(a)
        symm.shmem_allreduce(later, "sum")   # read once per lifecycle: still bfloat16
        equal(fw.numpy(later), fw.numpy(wired), "the default after the variable changed inside the lifecycle")
    finally:
        if saved is None:
            del os.environ["SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE"]
        else:
            os.environ["SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE"] = saved
        symm.shutdown()   # the next lifecycle reads the variable as it was


@case
def reduce_scatter(fw: Framework) -> None:
    symm, rank, world = fw.symm, fw.rank, fw.world
    for n in (3, 50000):
        stack = np.stack([values(r, n * world) for r in range(world)]).astype(np.float64)
        for op in ("sum", "avg", "max", "min"):
            out = fw.tensor(np.zeros(n, np.float32))
            assert symm.shmem_reduce_scatter(out, fw.tensor(values(rank, n * world)), op) is out
            exact = {"sum": stack.sum(0), "avg": stack.sum(0) / world, "max": stack.max(0),
                     "min": stack.min(0)}[op][rank * n:(rank + 1) * n]
            within(fw.numpy(out), exact, 2.0**-24 * np.abs(exact), f"reduce_scatter {op} x{n}")
    sym_in = symmetric(fw, values(rank, 8 * world))
    out = fw.tensor(np.zeros(8, np.float32))
    symm.shmem_reduce_scatter(out, sym_in, "sum")
    equal(fw.numpy(out), sum(values(r, 8 * world) for r in range(world))[rank * 8:rank * 8 + 8],
          "reduce_scatter of a symmetric input")
    symm.barrier()
    symm.free(sym_in)
    expect("ValueError", symm.shmem_reduce_scatter, fw.tensor(np.zeros(3, np.float32)),
           fw.tensor(values(rank, 3 * world + 1)),
           message=f"`input_tensor.numel()` must be {world} x output_tensor.numel() ({3 * world}), but got "
                   f"{3 * world + 1}" + refused(fw, "reduce_scatter"))


@case
def all_to_all(fw: Framework) -> None:
    """Uneven counts: rank r sends (r + j) % 3 + 1 elements to rank j, valued 100 * r + j."""
    symm, rank, world = fw.symm, fw.rank, fw.world
    sends = [fw.tensor(np.full((rank + j) % 3 + 1, 100 * rank + j, np.float32)) for j in range(world)]
    counts = [(i + rank) % 3 + 1 for i in range(world)]
    receive = fw.tensor(np.full(sum(counts) + 2, -1, np.float32))
    assert symm.shmem_alltoall(sends, receive, counts) is receive
    want = np.concatenate([np.full(counts[i], 100 * i + rank, np.float32) for i in range(world)] + [np.full(2, -1)])
    equal(fw.numpy(receive), want, "all_to_all with uneven counts")
    # a 1-D integer tensor of counts, into a symmetric receive tensor of the same size everywhere
    sym = symm.empty(3 * world, dtype=fw.dtype("float32"))
    symm.shmem_alltoall(sends, sym, fw.tensor(np.array(counts, np.int64)))
    equal(fw.numpy(sym)[:sum(counts)], want[:sum(counts)], "all_to_all into a symmetric tensor")
    symm.barrier()
    symm.free(sym)
    # rank 0 expects one element more from rank 1 than rank 1 sends it: every rank refuses the call alike
    bad_counts = [c + (1 if rank == 0 and i == 1 else 0) for i, c in enumerate(counts)]
    before = fw.numpy(receive).copy()
    expect("ValueError", symm.shmem_alltoall, sends, receive, bad_counts,
           message="`send_tensor_list[0]` of rank 1 must have the 3 elements rank 0 expects in its receive_list[1], "
                   "but got 2")
    equal(fw.numpy(receive), before, "the receive tensor after a refused all_to_all")
    expect("ValueError", symm.shmem_alltoall, sends[:-1], receive, counts,
           message=f"`send_tensor_list` must have one tensor per rank of the group ({world}), but got {world - 1}"
                   + refused(fw, "all_to_all"))
    expect("ValueError", symm.shmem_alltoall, sends, receive, counts[:-1],
           message=f"`receive_list` must have one count per rank of the group ({world}), but got {world - 1}"
                   + refused(fw, "all_to_all"))
    expect("TypeError", symm.shmem_alltoall, sends, receive, "1" * world,
           prefix=f"`receive_list` must be a sequence of {world} ints")
    # every rank refuses: every rank raises rank 0's refusal, in rank 0's numbers
    counts0 = [i % 3 + 1 for i in range(world)]
    expect("ValueError", symm.shmem_alltoall, sends, receive, [c + 2 for c in counts],
           message=f"`sum(receive_list)` must be at most receive_tensor.numel() ({sum(counts0) + 2}), but got "
                   f"{sum(counts0) + 2 * world}" + refused(fw, "all_to_all"))


@case
def send_recv(fw: Framework) -> None:
    symm, rank, world, n = fw.symm, fw.rank, fw.world, 5000
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    symm.barrier()   # registers the world group's channel
    buf = fw.tensor(np.zeros(n, np.float32))
    if rank % 2 == 0:
        symm.shmem_send(fw.tensor(values(rank, n)), nxt)
        symm.shmem_recv(buf, prev)
    else:
        symm.shmem_recv(buf, prev)
        symm.shmem_send(fw.tensor(values(rank, n)), nxt)
    equal(fw.numpy(buf), values(prev, n), "the message from the previous rank")
    expect("ValueError", symm.shmem_send, buf, rank,
           message=f"`dst_rank` must be another rank than this one ({rank}), but got {rank}")
    expect("ValueError", symm.shmem_send, buf, world, message=f"`dst_rank` must be in [0, {world}), but got {world}")
    symm.barrier()


@case
def rendezvous_peer_buffers(fw: Framework) -> None:
    symm, rank, world = fw.symm, fw.rank, fw.world
    t = symmetric(fw, np.full(8 * world, rank, np.float32))
    symm.barrier()
    mem = symm.rendezvous(t)
    assert (mem.rank, mem.world_size, mem.buffer_size) == (rank, world, 32 * world), (mem.rank, mem.world_size,
                                                                                       mem.buffer_size)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    f32 = fw.dtype("float32")
    equal(fw.numpy(mem.get_buffer(nxt, (8,), f32)), np.full(8, nxt, np.float32), "the next rank's copy, read in place")
    mine_there = mem.get_buffer(nxt, (8,), f32, storage_offset=8 * rank)
    mine_there.copy_(fw.tensor(np.full(8, 100 + rank, np.float32)))   # written into the next rank's memory
    fw.synchronize()
    mem.barrier()
    equal(fw.numpy(t)[8 * prev:8 * prev + 8], np.full(8, 100 + prev, np.float32), "written by the previous rank")
    expect("ValueError", mem.get_buffer, nxt, (9 * world,), f32,
           prefix="`sizes` and `storage_offset` must lie inside the tensor")
    expect("ValueError", symm.rendezvous, t if rank == 0 else t[8:],
           prefix="`tensor` must be the same symmetric tensor on every rank")
    symm.barrier()
    symm.free(t)


@case
def sub_groups(fw: Framework) -> None:
    """Evens and odds: collectives on the group, and primitives addressed by group-local ranks."""
    symm, rank, world = fw.symm, fw.rank, fw.world
    evens, odds = [r for r in range(world) if r % 2 == 0], [r for r in range(world) if r % 2 == 1]
    group = fw.sub_group([evens, odds])
    mine = evens if rank % 2 == 0 else odds
    g, me = len(mine), mine.index(rank)
    t = fw.tensor(values(rank, 100))
    symm.shmem_allreduce(t, "sum", group=group)
    equal(fw.numpy(t), sum(values(r, 100) for r in mine), "all_reduce on the sub-group")
    o = fw.tensor(np.zeros(10 * g, np.float32))
    symm.shmem_allgather(o, fw.tensor(values(rank, 10)), group=group)
    equal(fw.numpy(o), np.concatenate([values(r, 10) for r in mine]), "all_gather on the sub-group")
    buf = symmetric(fw, np.zeros(8, np.float32))
    symm.barrier()
    symm.shmem_put(buf, 0, fw.tensor(np.full(8, rank, np.float32)), 0, 8, (me + 1) % g, group=group)
    symm.barrier(group=group)
    equal(fw.numpy(buf), np.full(8, mine[(me - 1) % g], np.float32), "put to the next group rank")
    symm.barrier()
    expect("ValueError", symm.shmem_put, buf, 0, fw.tensor(np.zeros(8, np.float32)), 0, 8, g, group=group,
           message=f"`target_rank` must be in [0, {g}), but got {g}")
    expect("TypeError", symm.shmem_allreduce, t, "sum", 7,
           message=f"`group` must be {fw.group_type} or None, but got int")
    symm.free(buf)


@case
def mismatch_then_recover(fw: Framework) -> None:
    """A collective whose sizes differ across ranks fails on every rank; the next one works."""
    symm, rank, world = fw.symm, fw.rank, fw.world
    expect("ShmemMismatchError", symm.shmem_allreduce, fw.tensor(values(rank, 8 if rank == 0 else 16)), "sum")
    again = fw.tensor(values(rank, 8))
    symm.shmem_allreduce(again, "sum")
    equal(fw.numpy(again), sum(values(r, 8) for r in range(world)), "the all_reduce after the mismatch")


@case
def a_refusal_on_one_rank_fails_the_call_on_every_rank(fw: Framework) -> None:
    """A check that fails on the last rank only (a bad op; an all_gather input inside another rank's block of the
    output; a reduce_scatter output inside another rank's part of the input; a freed tensor) fails the call on every
    rank with the same class and message, naming the last rank; nothing is written; the next call works."""
    symm, rank, world = fw.symm, fw.rank, fw.world
    last, odd = world - 1, rank == world - 1

    def in_step(what: str) -> None:
        t = fw.tensor(np.full(4, rank + 1.0, np.float32))
        symm.shmem_allreduce(t)
        equal(fw.numpy(t), np.full(4, world * (world + 1) / 2, np.float32), f"the all_reduce after {what}")

    t = fw.tensor(values(rank, 8))
    expect("ShmemValueError", symm.shmem_allreduce, t, "prod" if odd else "sum",
           message="`op` must be one of 'sum', 'avg', 'max', 'min', but got 'prod'" + refused(fw, "all_reduce", by=last))
    equal(fw.numpy(t), values(rank, 8), "the tensor of the refused all_reduce")
    in_step("a bad op on one rank")

    out = fw.tensor(np.full(3 * world, -7.0, np.float32))
    other = (rank + 1) % world   # another rank's block: peers write it while this rank reads its input
    data = out[3 * other:3 * other + 3] if odd else fw.tensor(values(rank, 3))
    same_on_every_rank(fw, expect("ShmemValueError", symm.shmem_allgather, out, data,
                                  prefix="`input` must not overlap `output` except as this rank's own part",
                                  contains=[refused(fw, "all_gather", by=last)]), "all_gather's overlap")
    equal(fw.numpy(out), np.full(3 * world, -7.0, np.float32), "the output of the refused all_gather")
    in_step("an all_gather overlap on one rank")

    whole = fw.tensor(values(rank, 3 * world))
    part = whole[3 * other:3 * other + 3] if odd else fw.tensor(np.full(3, -7.0, np.float32))
    same_on_every_rank(fw, expect("ShmemValueError", symm.shmem_reduce_scatter, part, whole,
                                  prefix="`output` must be this rank's part of `input` or not overlap it",
                                  contains=[refused(fw, "reduce_scatter", by=last)]), "reduce_scatter's overlap")
    equal(fw.numpy(whole), values(rank, 3 * world), "the input of the refused reduce_scatter")
    in_step("a reduce_scatter overlap on one rank")

    gone = symm.empty(8)
    symm.free(gone)   # on every rank (free is collective); only the last rank passes it on
    live = fw.tensor(values(rank, 8))
    same_on_every_rank(fw, expect("ShmemStateError", symm.shmem_allreduce, gone if odd else live,
                                  prefix="tensor of a freed symmetric allocation: argument=tensor (symmetric "
                                         "allocation was freed: allocation_id=",
                                  contains=[refused(fw, "all_reduce", by=last)]), "a freed tensor")
    equal(fw.numpy(live), values(rank, 8), "the tensor of the all_reduce a freed tensor refused")
    in_step("a freed tensor on one rank")


@case
def freed_means_freed_before_and_after_the_range_is_reused(fw: Framework) -> None:
    """Every call on a freed symmetric tensor, or on a slice taken before the free, raises "freed" naming the
    allocation, before and after a new symm.empty hands out the same range; the peers' live tensor over that range
    is left as it was."""
    symm, rank, world = fw.symm, fw.rank, fw.world
    peer = (rank + 1) % world
    x = symm.empty(16)
    where = x.data_ptr()
    piece = x[4:12]
    src = fw.tensor(np.full(8, -1.0, np.float32))
    symm.barrier()
    symm.free(x)
    freed = dict(prefix="tensor of a freed symmetric allocation: argument=", contains=["allocation_id="])

    def refused_everywhere(when: str) -> None:
        for name, t in (("x", x), ("a slice of x", piece)):
            n = 8 if name != "x" else 16
            expect("ShmemStateError", symm.shmem_put, t, 0, src, 0, 8, peer, **freed)
            expect("ShmemStateError", symm.shmem_get, src, 0, t, 0, 8, peer, **freed)
            expect("ShmemStateError", symm.shmem_allreduce, t, **freed)
            expect("ShmemStateError", symm.shmem_allgather, fw.tensor(np.zeros(n * world, np.float32)), t, **freed)
            expect("ShmemStateError", symm.rendezvous, t, **freed)
            equal(fw.numpy(src), np.full(8, -1.0, np.float32), f"the local tensor of a refused get ({name}, {when})")

    refused_everywhere("before the range is reused")
    y = symmetric(fw, values(rank, 16))
    assert y.data_ptr() == where, "symm.empty handed out another range: the test would not test reuse"
    symm.barrier()
    refused_everywhere("after the range is reused")
    symm.barrier()
    equal(fw.numpy(y), values(rank, 16), "this rank's live tensor over the reused range")
    theirs = fw.tensor(np.zeros(16, np.float32))
    symm.shmem_get(theirs, 0, y, 0, 16, peer)
    equal(fw.numpy(theirs), values(peer, 16), "the peer's live tensor over the reused range")
    symm.barrier()
    symm.free(y)


@case
def a_gradient_never_pairs_with_a_forward_call(fw: Framework) -> None:
    """Rank 0 all-reduces its gradient (backward='allreduce'), the others take it as it is ('identity'): rank 0's
    gradient all_reduce meets the others' next forward all_reduce. The fingerprint's role tells them apart: every rank
    raises ShmemMismatchError naming the role, the forward tensor is unchanged, and the next all_reduce works."""
    symm, rank, world = fw.symm, fw.rank, fw.world
    weights = values(rank, 4) + 0.5
    w = fw.tensor(weights)
    mode = "allreduce" if rank == 0 else "identity"

    def loss(x: Any) -> Any:
        return (symm.shmem_allreduce(x * 1.0, "sum", backward=mode) * w).sum()

    role = dict(contains=["ranks disagree on a collective (role)", "role=backward"])
    nxt = fw.tensor(np.full(4, 2.0, np.float32))
    if rank == 0:
        expect("ShmemMismatchError", fw.grad, loss, [fw.tensor(values(rank, 4))], **role)
    else:
        grad, = fw.grad(loss, [fw.tensor(values(rank, 4))])
        equal(grad, weights, "the identity gradient")
        expect("ShmemMismatchError", symm.shmem_allreduce, nxt, "sum", **role)
        equal(fw.numpy(nxt), np.full(4, 2.0, np.float32), "the forward all_reduce's tensor")
    again = fw.tensor(np.full(4, rank + 1.0, np.float32))
    symm.shmem_allreduce(again)
    equal(fw.numpy(again), np.full(4, world * (world + 1) / 2, np.float32), "the all_reduce after the mismatch")


@case
def send_recv_carry_the_dtype(fw: Framework) -> None:
    """float32 1.5 sent into an int32 buffer of the same bytes: the receiver raises naming both (its buffer is left as
    it was, never 1069547520), the sender's next send to it raises once, and the pair runs on."""
    symm, rank, world = fw.symm, fw.rank, fw.world
    symm.barrier()   # the world group's channel
    pairs = world - world % 2
    if rank >= pairs:
        return
    sender = rank % 2 == 0
    other = rank + 1 if sender else rank - 1
    if sender:
        symm.shmem_send(fw.tensor(np.full(4, 1.5, np.float32)), other)
    else:
        buf = fw.tensor(np.zeros(4, np.int32))
        expect("TypeError", symm.shmem_recv, buf, other,
               message=f"`tensor` must be a receive buffer for the float32 message of 16 bytes rank {other} sent, but "
                       "got int32 of 16 bytes")
        equal(fw.numpy(buf), np.zeros(4, np.int32), "the receive buffer of the refused message")
    fw.barrier()   # the refusal is on the sender's side before its next send
    if sender:
        expect("ValueError", symm.shmem_send, fw.tensor(np.full(4, 2.5, np.float32)), other,
               prefix=f"a message this rank sent must match the receive buffer of rank {other} in dtype and size, but "
                      "that rank refused it")
        symm.shmem_send(fw.tensor(np.full(4, 2.5, np.float32)), other)
    else:
        buf = fw.tensor(np.zeros(4, np.float32))
        symm.shmem_recv(buf, other)
        equal(fw.numpy(buf), np.full(4, 2.5, np.float32), "the next message of the pair")


# ---------------------------------------------------------------------------------------------------- autograd
@case
def autograd(fw: Framework) -> None:
    """Gradients of the collectives: each rank weighs its output by its own weights, so gradients differ by rank."""
    symm, rank, world = fw.symm, fw.rank, fw.world
    weights = [values(r, 6 * world) + 0.5 for r in range(world)]
    w = fw.tensor(weights[rank])

    def gathered_loss(x: Any) -> Any:
        return (symm.shmem_allgather(fw.zeros_like_output((6 * world,)), x) * w).sum()

    grad, = fw.grad(gathered_loss, [fw.tensor(values(rank, 6))])
    # the reduce_scatter (sum) of every rank's weights
    equal(grad, sum(weights)[6 * rank:6 * rank + 6], "all_gather's gradient")

    w6 = fw.tensor(weights[rank][:6])
    for backward, want in (("identity", weights[rank][:6]), ("allreduce", sum(wr[:6] for wr in weights))):
        def reduced_loss(x: Any, backward: str = backward) -> Any:
            return (symm.shmem_allreduce(x * 1.0, "sum", backward=backward) * w6).sum()

        grad, = fw.grad(reduced_loss, [fw.tensor(values(rank, 6))])
        equal(grad, want, f"all_reduce's gradient (backward={backward!r})")

    def scattered_loss(x: Any) -> Any:
        return (symm.shmem_reduce_scatter(fw.zeros_like_output((6,)), x, "sum") * w6).sum()

    grad, = fw.grad(scattered_loss, [fw.tensor(values(rank, 6 * world))])
    equal(grad, np.concatenate([wr[:6] for wr in weights]), "reduce_scatter's gradient")

    w2 = fw.tensor(weights[rank][:2 * world])

    def exchanged_loss(*sends: Any) -> Any:
        return (symm.shmem_alltoall(list(sends), fw.zeros_like_output((2 * world,)), [2] * world) * w2).sum()

    grads = fw.grad(exchanged_loss, [fw.tensor(values(rank, 2, salt=j)) for j in range(world)])
    for j in range(world):   # what this rank sent to j landed at j's receive[2 * rank : 2 * rank + 2]
        equal(grads[j], weights[j][2 * rank:2 * rank + 2], f"all_to_all's gradient of the part sent to rank {j}")


# ---------------------------------------------------------------------------------------------------- fused ops
@case
def fused_ops(fw: Framework) -> None:
    symm, rank, world = fw.symm, fw.rank, fw.world
    m, k, n = 4, 5, 3
    unit = 2.0**-24
    a = [np.random.default_rng(r).standard_normal((m, k)).astype(np.float32) for r in range(world)]
    b = np.random.default_rng(99).standard_normal((k, n)).astype(np.float32)
    signal = symm.empty(world, dtype=fw.dtype("int32"))
    gather_out = symm.empty((m * world, k), dtype=fw.dtype("float32"))
    c = fw.tensor(np.zeros((m * world, n), np.float32))
    gathered, product = symm.fused_all_gather_matmul(fw.tensor(a[rank]), fw.tensor(b), c, gather_out, signal)
    whole = np.concatenate(a).astype(np.float64)
    equal(fw.numpy(gathered), np.concatenate(a), "fused_all_gather_matmul's gather")
    # a float32 sum of k products in any order is within k roundings of the sum of magnitudes of the exact one
    within(fw.numpy(product), whole @ b, k * unit * (np.abs(whole) @ np.abs(b)), "fused_all_gather_matmul's product")
    x1 = [np.random.default_rng(q + 10).standard_normal((2 * world, k)).astype(np.float32) for q in range(world)]
    scratch = symm.empty(2 * world * n, dtype=fw.dtype("float32"))
    r = symm.fused_matmul_reduce_scatter(fw.tensor(x1[rank]), fw.tensor(b), scratch, signal)
    rows = slice(2 * rank, 2 * rank + 2)
    total = sum(x.astype(np.float64) @ b for x in x1)[rows]
    magnitude = sum(np.abs(x.astype(np.float64)) @ np.abs(b) for x in x1)[rows]
    # each product within k roundings, the sum over the group within world - 1 more
    within(fw.numpy(r), total, (k + world) * unit * magnitude, "fused_matmul_reduce_scatter")
    x = fw.tensor(x1[rank])
    # refused as the engine call each framework's fused op begins with (torch's own sync, MindSpore's reduce_scatter)
    expect("ValueError", symm.fused_matmul_reduce_scatter, x, fw.tensor(b), scratch, signal, "max",
           prefix="`reduce_op` must be one of 'sum', 'avg', but got 'max' (refused by rank 0: op=")
    expect("ValueError", symm.fused_matmul_reduce_scatter, fw.tensor(x1[rank][:2 * world - 1]), fw.tensor(b),
           scratch, signal, prefix=(f"`x1.shape[0]` must be a multiple of the group size ({world}), but got "
                                    f"{2 * world - 1} (refused by rank 0: op="))
    small = symm.empty(3, dtype=fw.dtype("float32"))
    expect("ValueError", symm.fused_matmul_reduce_scatter, x, fw.tensor(b), small, signal,
           prefix=f"`symm_tensor.numel()` must be x1.shape[0] x x2.shape[1] ({6 * world}), but got 3 (refused by rank "
                  "0: op=")
    symm.barrier()
    for t in (small, scratch, gather_out, signal):
        symm.free(t)


# ---------------------------------------------------------------------------------------------------- MoE
_EXPERTS, _HIDDEN = 2, 3


def moe_split(source: int, peer: int, e: int) -> int:
    """Rows rank ``source`` sends to local expert ``e`` of rank ``peer``: uneven, some empty."""
    return (source * 5 + peer * 3 + e * 2) % 4


def moe_rows(source: int, members: Sequence[int]) -> np.ndarray:
    """Rank ``source``'s tokens for the group ``members`` (world ranks), rank-major: row k of the chunk for (peer,
    e) holds 1000 source + 100 peer + 10 e + k (then its negative, then a fraction), exact in every float dtype the
    cases use."""
    rows = [[1000 * source + 100 * p + 10 * e + k, -(1000 * source + 100 * p + 10 * e + k), 0.25 * k]
            for p in members for e in range(_EXPERTS) for k in range(moe_split(source, p, e))]
    return np.array(rows, np.float32).reshape(-1, _HIDDEN)


def moe_dispatched(rank: int, members: Sequence[int], align: int) -> tuple:
    """What dispatch gives group rank ``rank`` of ``members`` (world ranks): ``(rows, splits, offsets)``, expert-major
    with regions aligned to ``align`` rows; ``rows`` has -1 where no chunk lands."""
    n = len(members)
    me = members[rank]
    chunks, splits, offsets, at = [], [], [], 0
    for e in range(_EXPERTS):
        region = at
        for s in range(n):
            source = members[s]
            split = moe_split(source, me, e)
            sent = moe_rows(source, members)
            start = sum(moe_split(source, p, q) for p in members for q in range(_EXPERTS)
                        if (members.index(p), q) < (rank, e))
            chunks.append((at, sent[start:start + split]))
            splits.append(split)
            offsets.append(at)
            at += split
        at = region + max(-(-(at - region) // align) * align, align)
    rows = np.full((at, _HIDDEN), -1, np.float32)
    for start, chunk in chunks:
        rows[start:start + len(chunk)] = chunk
    return rows, np.array(splits, np.int64), np.array(offsets, np.int64)


def _moe_group(fw: Framework, sub: bool) -> tuple:
    """``(group, members)``: the world, or the evens and odds."""
    if not sub:
        return None, list(range(fw.world))
    evens, odds = [r for r in range(fw.world) if r % 2 == 0], [r for r in range(fw.world) if r % 2 == 1]
    return fw.sub_group([evens, odds]), evens if fw.rank % 2 == 0 else odds


@case
def moe_dispatch_and_combine(fw: Framework) -> None:
    """Dispatch lays every rank's tokens out expert-major (aligned regions) on the ranks of their experts, with the
    splits and offsets torch's all_to_all_vdev_2d writes; combine with them brings every token back. On the world
    and on sub-groups, into ordinary and symmetric tensors."""
    symm = fw.symm
    for sub in (False, True):
        group, members = _moe_group(fw, sub)
        n, me = len(members), members.index(fw.rank)
        nsplits = n * _EXPERTS
        x = moe_rows(fw.rank, members)
        splits = np.array([moe_split(fw.rank, p, e) for p in members for e in range(_EXPERTS)], np.int64)
        want, want_splits, want_offsets = moe_dispatched(me, members, 4)
        capacity = 40
        for symmetric_output in (False, True):
            what = f"group {members}, {'symmetric' if symmetric_output else 'ordinary'} output"
            out = (symm.empty((capacity, _HIDDEN), dtype=fw.dtype("float32")) if symmetric_output
                   else fw.tensor(np.full((capacity, _HIDDEN), -1, np.float32)))
            if symmetric_output:
                out.copy_(fw.tensor(np.full((capacity, _HIDDEN), -1, np.float32)))
            table = fw.tensor(np.zeros((2, nsplits), np.int64))
            # symmetric: the input too (the same rows on every rank, the tokens first): every rank pulls its chunks
            data = (symmetric(fw, np.concatenate([x, np.zeros((capacity - len(x), _HIDDEN), np.float32)]))
                    if symmetric_output else fw.tensor(x))
            assert symm.shmem_moe_dispatch(out, data, fw.tensor(splits), table, group=group, major_align=4) is out
            got = fw.numpy(out)
            equal(fw.numpy(table)[0], want_splits, f"dispatch's splits ({what})")
            equal(fw.numpy(table)[1], want_offsets, f"dispatch's offsets ({what})")
            for s, (split, offset) in enumerate(zip(want_splits, want_offsets)):
                equal(got[offset:offset + split], want[offset:offset + split], f"dispatch's chunk {s} ({what})")
            back = fw.tensor(np.full(x.shape, -1, np.float32))
            back_table = fw.tensor(np.zeros((2, nsplits), np.int64))
            symm.shmem_moe_combine(back, out, table, back_table, group=group)
            equal(fw.numpy(back), x, f"combine restores every token ({what})")
            equal(fw.numpy(back_table)[0], splits, f"combine's splits ({what})")
            equal(fw.numpy(back_table)[1], np.concatenate([[0], np.cumsum(splits)[:-1]]), f"combine's offsets ({what})")
            if symmetric_output:
                symm.barrier()
                symm.free(data)
                symm.free(out)


@case
def moe_receive_buffer_too_small(fw: Framework) -> None:
    """An output too small for what the peers send fails on every rank with the same message, naming the rank, the
    expert and both sizes, and nothing is written on any rank; the next exchange goes through."""
    symm, rank, world = fw.symm, fw.rank, fw.world
    x = moe_rows(rank, list(range(world)))
    splits = fw.tensor(np.array([moe_split(rank, p, e) for p in range(world) for e in range(_EXPERTS)], np.int64))
    last = world - 1
    _, sizes, offsets = moe_dispatched(last, list(range(world)), 1)
    needed = max(o + k for o, k in zip(offsets, sizes) if k)
    # the first chunk that does not fit a buffer one row short, and the expert it belongs to
    short = needed - 1
    first = next(i for i, (o, k) in enumerate(zip(offsets, sizes)) if k and o + k > short)
    expert = first // world
    rows = short if rank == last else 40
    out = fw.tensor(np.full((rows, _HIDDEN), -5, np.float32))
    table = fw.tensor(np.full((2, world * _EXPERTS), -7, np.int64))
    text = expect("ValueError", symm.shmem_moe_dispatch, out, fw.tensor(x), splits, table,
                  message=f"moe_dispatch: `out` of rank {last} must hold the {needed} rows its peers send (the "
                          f"overflow starts at expert {last * _EXPERTS + expert}, local expert {expert} of rank "
                          f"{last}), but got {short} rows (every rank raises; nothing was written)")
    same_on_every_rank(fw, text, "the too-small receive buffer")
    equal(fw.numpy(out), np.full((rows, _HIDDEN), -5, np.float32), "the output after a refused dispatch")
    equal(fw.numpy(table), np.full((2, world * _EXPERTS), -7, np.int64), "the table after a refused dispatch")
    roomy = fw.tensor(np.zeros((40, _HIDDEN), np.float32))
    symm.shmem_moe_dispatch(roomy, fw.tensor(x), splits, table)
    equal(fw.numpy(table)[0], moe_dispatched(rank, list(range(world)), 1)[1], "the next dispatch's splits")


@case
def moe_bad_arguments(fw: Framework) -> None:
    """Broken contracts name the argument in the project's form, on every rank, and write nothing."""
    symm, rank, world = fw.symm, fw.rank, fw.world
    nsplits = world * _EXPERTS
    x = fw.tensor(moe_rows(rank, list(range(world))))
    out = fw.tensor(np.zeros((40, _HIDDEN), np.float32))
    splits = np.array([moe_split(rank, p, e) for p in range(world) for e in range(_EXPERTS)], np.int64)
    table = fw.tensor(np.full((2, nsplits), -7, np.int64))
    expect("TypeError", symm.shmem_moe_dispatch, out, x, fw.tensor(splits.astype(np.int32)), table,
           message=f"`in_splits` must be an int64 tensor, but got {fw.dtype_text('int32')}"
                   + refused(fw, "moe_dispatch"))
    expect("ValueError", symm.shmem_moe_dispatch, out, x, fw.tensor(splits), fw.tensor(np.zeros((2, 1), np.int64)),
           message=f"`out_splits_offsets` must have shape (2, group size x experts) with group size {world} and a "
                   f"last dimension of {nsplits}, but got (2, 1)" + refused(fw, "moe_dispatch"))
    expect("ValueError", symm.shmem_moe_dispatch, out, x, fw.tensor(splits), table, major_align=0,
           message="`major_align` must be at least 1, but got 0" + refused(fw, "moe_dispatch"))
    expect("TypeError", symm.shmem_moe_dispatch, fw.tensor(np.zeros((40, _HIDDEN), np.int32)), x, fw.tensor(splits),
           table, message=f"`input_tensor` must have the dtype of `output_tensor` ({fw.dtype_text('int32')}), but got "
                          f"{fw.dtype_text('float32')}" + refused(fw, "moe_dispatch"))
    expect("ValueError", symm.shmem_moe_combine, out, x, fw.tensor(splits), table,
           prefix="`in_splits_offsets` must have shape (2, group size x experts)")
    expect("ValueError", symm.shmem_moe_dispatch, out, x, fw.tensor(splits), table, low_precision_dtype="int8",
           prefix="`low_precision_dtype` must be one of")
    # a negative split on rank 0: the runtime's check, every rank raises rank 0's
    negative = splits.copy()
    if rank == 0:
        negative[-1] = -1
    expect("ValueError", symm.shmem_moe_dispatch, out, x, fw.tensor(negative), table,
           message=f"moe_dispatch: `in_splits` must be non-negative, but got in_splits[{nsplits - 1}]=-1 on rank 0")
    equal(fw.numpy(table), np.full((2, nsplits), -7, np.int64), "the table after refused calls")


@case
def moe_low_precision(fw: Framework) -> None:
    """Rows travel in a 16-bit or fp8 wire format (the runtime's row codec, on both frameworks): each value within
    the format's rounding of its row (fp8: scaled by a power of two per row)."""
    symm, rank, world = fw.symm, fw.rank, fw.world
    x = moe_rows(rank, list(range(world))) / 7   # not exact in any low format
    splits = fw.tensor(np.array([moe_split(rank, p, e) for p in range(world) for e in range(_EXPERTS)], np.int64))
    want, want_splits, want_offsets = moe_dispatched(rank, list(range(world)), 1)
    want = want / 7
    formats = {"float16": (2.0**-11, 2.0**-25), "bfloat16": (2.0**-8, 2.0**-134), "float8_e4m3fn": (2.0**-4, None),
               "float8_e5m2": (2.0**-3, None)}
    fp8_max = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
    fp8_spacing = {"float8_e4m3fn": 2.0**-9, "float8_e5m2": 2.0**-16}
    for name, (unit, tiny) in formats.items():
        out = fw.tensor(np.zeros((40, _HIDDEN), np.float32))
        table = fw.tensor(np.zeros((2, world * _EXPERTS), np.int64))
        symm.shmem_moe_dispatch(out, fw.tensor(x), splits, table, low_precision_dtype=name)
        got = fw.numpy(out)[:len(want)]
        if tiny is None:   # the row's scale: the power of two above absmax / fp8_max; its subnormals' spacing
            rowmax = np.abs(want).max(axis=1, keepdims=True).astype(np.float32)
            scale = np.ldexp(1.0, np.maximum(np.frexp(rowmax / np.float32(fp8_max[name]))[1], -126))
            bound = unit * np.abs(want) + scale * fp8_spacing[name] / 2
        else:
            bound = unit * np.abs(want) + tiny
        for split, offset in zip(want_splits, want_offsets):
            within(got[offset:offset + split], want[offset:offset + split], bound[offset:offset + split]
                   if np.ndim(bound) else bound, f"dispatch in {name}")


@case
def moe_autograd(fw: Framework) -> None:
    """Dispatch's gradient is the combine of the output's, combine's the dispatch of its output's: each rank weighs
    its output by its own weights, and every token's gradient is the weight of the row it landed in."""
    symm, rank, world = fw.symm, fw.rank, fw.world
    members = list(range(world))
    nsplits = world * _EXPERTS
    x = moe_rows(rank, list(range(world)))
    splits = fw.tensor(np.array([moe_split(rank, p, e) for p in members for e in range(_EXPERTS)], np.int64))
    capacity = 40
    weights = [values(r, capacity * _HIDDEN).reshape(capacity, _HIDDEN) + 0.5 for r in members]
    w = fw.tensor(weights[rank])

    def dispatched_loss(t: Any) -> Any:
        out = symm.shmem_moe_dispatch(fw.zeros_like_output((capacity, _HIDDEN)), t, splits,
                                      fw.tensor(np.zeros((2, nsplits), np.int64)), major_align=2)
        return (out * w).sum()

    grad, = fw.grad(dispatched_loss, [fw.tensor(x)])
    want = np.zeros_like(x)
    row = 0
    for p in members:   # the chunk for (p, e) landed in p's expert-major output
        _, p_splits, p_offsets = moe_dispatched(p, members, 2)
        for e in range(_EXPERTS):
            k = moe_split(rank, p, e)
            at = p_offsets[e * world + rank]
            want[row:row + k] = weights[p][at:at + k]
            row += k
    equal(grad, want, "dispatch's gradient")

    dispatched, d_splits, d_offsets = moe_dispatched(rank, members, 2)
    layout = fw.tensor(np.stack([d_splits, d_offsets]))
    wx = fw.tensor(weights[rank][:len(x)])

    def combined_loss(t: Any) -> Any:
        out = symm.shmem_moe_combine(fw.zeros_like_output(x.shape), t, layout,
                                     fw.tensor(np.zeros((2, nsplits), np.int64)), major_align=2)
        return (out * wx).sum()

    grad, = fw.grad(combined_loss, [fw.tensor(np.where(dispatched < 0, 0, dispatched))])
    # every expert row's gradient is the weight, on the rank it went back to, of the row it returned to
    want = np.zeros_like(dispatched)
    for s in members:
        row = 0
        for p in members:
            for e in range(_EXPERTS):
                k = moe_split(s, p, e)
                if p == rank:
                    at = d_offsets[e * world + s]
                    want[at:at + k] = weights[s][row:row + k]
                row += k
    equal(grad, want, "combine's gradient")
