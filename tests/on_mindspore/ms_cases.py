"""The MindSpore system-test cases: one rank's side. Run by ms_job under msrun; every rank runs every case.

Each case returns a JSON-able record (or raises: the record then holds the error); test_ms_symm.py asserts on every
rank's record. References are independent of the code under test: numpy on inputs every rank can compute, or
MindSpore's own mccl collectives.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import numpy as np

import mindspore as ms
from mindspore import communication, ops
from mindspore.mint import distributed as md

import hyper_parallel.core.symmetric_memory as symm
from hyper_parallel.platform.mindspore import tensors as ms_tensors

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def rank_world() -> tuple:
    return md.get_rank(), md.get_world_size()


def values(rank: int, n: int, dtype=np.float32, salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s deterministic input of ``n`` elements (small integers: exact in every dtype and sum)."""
    return ((np.arange(n) * 7 + rank * 13 + salt) % 17 - 8).astype(dtype)


def raises(fn, *args, **kwargs) -> dict:
    """The class and message of what ``fn`` raised ({} if nothing)."""
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 (the record names it)
        return {"type": type(e).__name__, "message": str(e), "mro": [c.__name__ for c in type(e).__mro__]}
    return {}


def tensor(a: np.ndarray) -> ms.Tensor:
    return ms.Tensor(a)


def bf16(a: np.ndarray) -> ms.Tensor:
    return ms.Tensor(a.astype(np.float32)).astype(ms.bfloat16)


def as_numpy(t: ms.Tensor) -> np.ndarray:
    if t.dtype == ms.bfloat16:
        return t.astype(ms.float32).asnumpy()
    return t.asnumpy()


# ---------------------------------------------------------------------------------------------------- memory
@case
def empty_and_free(rank, world):
    shapes = {"float32": (4, 8), "bfloat16": (16,), "int64": (3, 5), "int8": (7,)}
    out = {}
    for name, shape in shapes.items():
        t = symm.empty(shape, dtype=getattr(ms, name))
        out[name] = {"shape": list(t.shape), "dtype": str(t.dtype)}
        before = symm.debug_state()["allocated"]
        symm.free(t)
        out[name]["freed_bytes"] = before - symm.debug_state()["allocated"]
    t = symm.empty(10)
    out["default_dtype"] = str(t.dtype)
    symm.free(t)
    out["double_free"] = raises(symm.free, t)
    out["free_ordinary"] = raises(symm.free, tensor(np.zeros(4, np.float32)))
    out["bad_shape"] = raises(symm.empty, (2, -1))
    out["bad_dtype"] = raises(symm.empty, 4, dtype=ms.complex64)
    return out


@case
def heap_size_from_the_environment(rank, world):
    t = symm.empty(1)
    size = symm.debug_state()["heap_size"]
    symm.free(t)
    return {"heap_size": size}


@case
def allocation_mismatch(rank, world):
    error = raises(symm.empty, 64 if rank == 0 else 128, dtype=ms.float32)
    state = symm.debug_state()
    after = symm.empty(8)   # the runtime stays usable
    symm.free(after)
    return {"error": error, "active": len(state["active_allocations"])}


# ---------------------------------------------------------------------------------------------------- primitives
@case
def put_get_ring(rank, world):
    n = 1000
    buf = symm.empty(n, dtype=ms.float32)
    buf.copy_(tensor(np.zeros(n, np.float32)))
    symm.barrier()
    nxt = (rank + 1) % world
    symm.shmem_put(buf, 0, tensor(values(rank, n)), 0, n, nxt)
    symm.barrier()
    got = buf.asnumpy().copy()
    pulled = ms.Tensor(np.zeros(n, np.float32))
    symm.shmem_get(pulled, 0, buf, 0, n, nxt)   # nxt's copy holds rank's own values
    pulled_np = pulled.asnumpy().copy()
    # offsets and one-element tensor arguments
    part = ms.Tensor(np.zeros(10, np.float32))
    symm.shmem_get(part, ms.Tensor([2], ms.int64), buf, ms.Tensor([100], ms.int64), ms.Tensor([8], ms.int32), rank)
    symm.barrier()
    symm.free(buf)
    prev = (rank - 1) % world
    return {"put_ok": bool(np.array_equal(got, values(prev, n))),
            "get_ok": bool(np.array_equal(pulled_np, values(rank, n))),
            "window_ok": bool(np.array_equal(part.asnumpy()[2:10], values(prev, n)[100:108])
                              and not part.asnumpy()[:2].any())}


@case
def example_one_put_with_signal(rank, world):
    """Seed 000's example 1: rank 0 produces, rank 1 consumes."""
    data_buf = symm.empty(4096, dtype=ms.float16)
    signal = symm.empty(1, dtype=ms.int32)
    signal.copy_(ms.Tensor([0], ms.int32))
    symm.barrier()
    local = np.random.default_rng(5).standard_normal(4096).astype(np.float16)
    result = None
    if rank == 0:
        symm.shmem_put_with_signal(
            target=data_buf, target_offset=ms.Tensor([0], ms.int64), src=ms.Tensor(local),
            src_offset=ms.Tensor([0], ms.int64), size=ms.Tensor([4096], ms.int64), signal=signal,
            signal_offset=ms.Tensor([0], ms.int64), signal_value=ms.Tensor([1], ms.int32), signal_op=0,
            target_rank=1)
    elif rank == 1:
        symm.shmem_wait_for_signal(depend_tensor=data_buf, signal=signal, signal_offset=ms.Tensor([0], ms.int64),
                                   compare_value=ms.Tensor([1], ms.int32), compare_op=0)
        result = bool(np.array_equal(data_buf.asnumpy(), local))
    symm.barrier()
    symm.free(signal)
    symm.free(data_buf)
    return {"consumer_ok": result}


@case
def signal_ops_and_compares(rank, world):
    sig = symm.empty(4, dtype=ms.int64)
    sig.copy_(ms.Tensor(np.zeros(4, np.int64)))
    symm.barrier()
    for peer in range(world):
        symm.shmem_signal_op(sig, 1, 1, 1, peer)       # ADD 1 on every rank
    symm.shmem_wait_for_signal(None, sig, 1, world, 0)  # EQ world
    symm.shmem_wait_for_signal(None, sig, 1, world - 1, 1)   # GT
    symm.shmem_wait_for_signal(None, sig, 1, world + 1, 2)   # LT
    symm.barrier()
    symm.shmem_signal_op(sig, 2, 42, 0, (rank + 1) % world)  # SET
    symm.shmem_wait_for_signal(None, sig, 2, 42, 0)
    old = os.environ.get("HYPER_PARALLEL_SHMEM_TIMEOUT_SEC")
    timeout = raises(symm.shmem_wait_for_signal, None, sig, 3, 5, 0)
    symm.barrier()
    symm.free(sig)
    return {"timeout": timeout, "timeout_env": old}


@case
def bad_primitive_arguments(rank, world):
    buf = symm.empty(16, dtype=ms.float32)
    buf.copy_(tensor(np.zeros(16, np.float32)))
    sig = symm.empty(2, dtype=ms.int32)
    src = ms.Tensor(np.ones(16, np.float32))
    symm.barrier()
    out = {
        "not_tensor": raises(symm.shmem_put, [1.0], 0, src, 0, 4, 0),
        "past_end": raises(symm.shmem_put, buf, 10, src, 0, 8, 0),
        "negative": raises(symm.shmem_put, buf, -1, src, 0, 8, 0),
        "dtype": raises(symm.shmem_put, buf, 0, ms.Tensor(np.ones(16, np.float64)), 0, 4, 0),
        "rank": raises(symm.shmem_put, buf, 0, src, 0, 4, world),
        "signal_op": raises(symm.shmem_signal_op, sig, 0, 1, 7, 0),
        "compare_op": raises(symm.shmem_wait_for_signal, None, sig, 0, 1, 9),
        "signal_dtype": raises(symm.shmem_signal_op, buf, 0, 1, 0, 0),
        "ordinary_target": raises(symm.shmem_put, ms.Tensor(np.zeros(16, np.float32)), 0, src, 0, 4, 0),
        "float_offset": raises(symm.shmem_put, buf, 1.5, src, 0, 4, 0),
        "tensor_offset_2": raises(symm.shmem_put, buf, ms.Tensor([1, 2]), src, 0, 4, 0),
        "depend_tensor": raises(symm.shmem_wait_for_signal, [1], sig, 0, 1, 0),
    }
    symm.barrier()
    # nothing was written by any refused call
    out["untouched"] = bool(np.array_equal(buf.asnumpy(), np.zeros(16, np.float32)))
    symm.free(sig)
    symm.free(buf)
    return out


# ---------------------------------------------------------------------------------------------------- collectives
def _gather_everyone(a: np.ndarray) -> list:
    got = [None] * md.get_world_size()
    md.all_gather_object(got, a.tobytes())
    return got


@case
def all_gather(rank, world):
    out = {}
    for name, n in (("float32", 33), ("float32", 70000), ("int64", 5), ("bfloat16", 300), ("float16", 0)):
        dtype = getattr(np, name) if name != "bfloat16" else np.float32
        data = values(rank, n, dtype)
        src = bf16(data) if name == "bfloat16" else tensor(data)
        dst = ms.Tensor(np.zeros(n * world, dtype)) if name != "bfloat16" else bf16(np.zeros(n * world))
        returned = symm.shmem_allgather(dst, src)
        want = np.concatenate([values(r, n, dtype) for r in range(world)])
        out[f"{name}_{n}"] = bool(np.array_equal(as_numpy(returned), want)) and bool(
            np.array_equal(as_numpy(dst), want))
    sym = symm.empty(64 * world, dtype=ms.float32)
    symm.shmem_allgather(sym, tensor(values(rank, 64)))
    out["symmetric_output"] = bool(np.array_equal(sym.asnumpy(), np.concatenate([values(r, 64) for r in range(world)])))
    symm.free(sym)
    out["size_mismatch"] = raises(symm.shmem_allgather, ms.Tensor(np.zeros(5, np.float32)), tensor(values(rank, 3)))
    out["dtype_mismatch"] = raises(symm.shmem_allgather, ms.Tensor(np.zeros(3 * world, np.float64)),
                                   tensor(values(rank, 3)))
    return out


@case
def all_reduce(rank, world):
    out = {}
    for dtype in (np.float32, np.float64, np.int32, np.int64, np.int8):
        for op in ("sum", "max", "min", "avg"):
            if op == "avg" and not np.issubdtype(dtype, np.floating):
                continue
            for n in (17, 100000):
                t = tensor(values(rank, n, dtype))
                symm.shmem_allreduce(t, op)
                stack = np.stack([values(r, n, dtype) for r in range(world)])
                want = {"sum": stack.sum(0), "max": stack.max(0), "min": stack.min(0),
                        "avg": stack.sum(0) / world}[op].astype(dtype)
                got = t.asnumpy()
                out[f"{np.dtype(dtype).name}_{op}_{n}"] = bool(np.allclose(got, want, rtol=0, atol=0)
                                                             if op != "avg" else np.allclose(got, want, rtol=1e-6))
    b = bf16(values(rank, 1000))
    symm.shmem_allreduce(b, "sum")
    out["bfloat16_sum"] = bool(np.array_equal(as_numpy(b), sum(values(r, 1000) for r in range(world))))
    s = symm.empty(4096, dtype=ms.float32)
    s.copy_(tensor(values(rank, 4096)))
    symm.shmem_allreduce(s, "sum")
    out["symmetric"] = bool(np.array_equal(s.asnumpy(), sum(values(r, 4096) for r in range(world))))
    # every rank ends with the same bits (non-integral floats summed in some order)
    f = tensor(np.random.default_rng(rank).standard_normal(50000).astype(np.float32))
    symm.shmem_allreduce(f, "sum")
    everyone = _gather_everyone(f.asnumpy())
    out["bit_identical"] = all(b_ == everyone[0] for b_ in everyone)
    symm.free(s)
    out["avg_int"] = raises(symm.shmem_allreduce, tensor(values(rank, 4, np.int32)), "avg")
    out["bad_op"] = raises(symm.shmem_allreduce, tensor(values(rank, 4)), "prod")
    out["bad_backward"] = raises(symm.shmem_allreduce, tensor(values(rank, 4)), "sum", None, None, "sideways")
    return out


@case
def all_reduce_matches_mccl(rank, world):
    rng = np.random.default_rng(100 + rank)
    a = rng.standard_normal(4096).astype(np.float32)
    ours = tensor(a)
    symm.shmem_allreduce(ours, "sum")
    theirs = tensor(a)
    md.all_reduce(theirs)
    diff = float(np.max(np.abs(ours.asnumpy() - theirs.asnumpy())))
    bound = world * 2.0**-23 * float(np.max(np.abs(a))) * world * 4
    return {"close": diff <= bound, "diff": diff}


@case
def low_precision(rank, world):
    n = 4096
    rng = np.random.default_rng(7 + rank)
    a = rng.standard_normal(n).astype(np.float32)
    exact = sum(np.random.default_rng(7 + r).standard_normal(n).astype(np.float64) for r in range(world))
    out = {}
    for wire, unit in (("bfloat16", 2.0**-8), (ms.float16, 2.0**-11), ("float8_e4m3fn", 2.0**-4)):
        t = tensor(a)
        symm.shmem_allreduce(t, "sum", low_precision_dtype=wire)
        # each value is rounded once when encoded and the partial sum once more (two-shot): a bound from the unit
        # roundoff and the sum of magnitudes, generous by a factor of 4 for the block scales of fp8.
        bound = 4 * unit * world * 4 * np.max(np.abs(exact)) + 1e-6
        err = float(np.max(np.abs(t.asnumpy() - exact)))
        out[str(wire)] = {"within": err <= bound, "err": err}
    out["max_refused"] = raises(symm.shmem_allreduce, tensor(a), "max", None, "bfloat16")
    out["int_refused"] = raises(symm.shmem_allreduce, tensor(values(rank, 4, np.int32)), "sum", None, "float16")
    out["not_narrower"] = raises(symm.shmem_allreduce, tensor(values(rank, 4, np.float16)), "sum", None, "bfloat16")
    out["unknown"] = raises(symm.shmem_allreduce, tensor(a), "sum", None, "float7")
    os.environ["SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE"] = "bfloat16"
    t = tensor(a)
    symm.shmem_allreduce(t, "sum")
    out["env_default_low"] = bool(float(np.max(np.abs(t.asnumpy() - exact))) > 0)
    i = tensor(values(rank, 8, np.int32))
    symm.shmem_allreduce(i, "sum")   # the default applies only where it can
    out["env_default_int_exact"] = bool(np.array_equal(i.asnumpy(), sum(values(r, 8, np.int32) for r in range(world))))
    del os.environ["SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE"]
    return out


@case
def reduce_scatter(rank, world):
    out = {}
    for n in (3, 50000):
        for op in ("sum", "avg", "max"):
            data = tensor(values(rank, n * world))
            o = ms.Tensor(np.zeros(n, np.float32))
            symm.shmem_reduce_scatter(o, data, op)
            stack = np.stack([values(r, n * world) for r in range(world)])
            want = {"sum": stack.sum(0), "avg": stack.sum(0) / world, "max": stack.max(0)}[op][rank * n:(rank + 1) * n]
            out[f"{op}_{n}"] = bool(np.allclose(o.asnumpy(), want, rtol=1e-6, atol=0))
    out["size_mismatch"] = raises(symm.shmem_reduce_scatter, ms.Tensor(np.zeros(3, np.float32)),
                                  tensor(values(rank, 3 * world + 1)))
    return out


@case
def all_to_all(rank, world):
    # rank r sends (r + j) % 3 + 1 elements to rank j, valued 100 * r + j
    sends = [tensor(np.full((rank + j) % 3 + 1, 100 * rank + j, np.float32)) for j in range(world)]
    counts = [(i + rank) % 3 + 1 for i in range(world)]
    receive = ms.Tensor(np.zeros(sum(counts) + 2, np.float32))
    symm.shmem_alltoall(sends, receive, counts)
    want = np.concatenate([np.full(counts[i], 100 * i + rank, np.float32) for i in range(world)] + [np.zeros(2)])
    out = {"ok": bool(np.array_equal(receive.asnumpy(), want))}
    bad_counts = [c + (1 if rank == 0 and i == 1 else 0) for i, c in enumerate(counts)]
    out["count_mismatch"] = raises(symm.shmem_alltoall, sends, receive, bad_counts)
    out["wrong_length"] = raises(symm.shmem_alltoall, sends[:-1], receive, counts)
    out["counts_type"] = raises(symm.shmem_alltoall, sends, receive, "123")
    out["counts_past_end"] = raises(symm.shmem_alltoall, sends, receive, [c + 2 for c in counts])
    out["counts_tensor"] = raises(symm.shmem_alltoall, sends, receive, ms.Tensor(np.array(counts, np.int64)))
    return out


@case
def send_recv(rank, world):
    n = 5000
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    symm.barrier()   # registers the world group's channel
    buf = ms.Tensor(np.zeros(n, np.float32))
    if rank % 2 == 0:
        symm.shmem_send(tensor(values(rank, n)), nxt)
        symm.shmem_recv(buf, prev)
    else:
        symm.shmem_recv(buf, prev)
        symm.shmem_send(tensor(values(rank, n)), nxt)
    communication.create_group("hp_fresh", list(range(world)))
    return {"ok": bool(np.array_equal(buf.asnumpy(), values(prev, n))),
            "self": raises(symm.shmem_send, buf, rank),
            "no_channel": raises(symm.shmem_send, buf, nxt, group="hp_fresh")}


@case
def send_recv_refused_while_recording(rank, world):
    """MindSpore cannot run the receiver's backward (its buffer is never differentiated): refused, not silently
    wrong."""
    nxt = (rank + 1) % world
    symm.barrier()
    seen = {}

    def loss(x):
        seen["error"] = raises(symm.shmem_send, x * 1.0, nxt)
        return (x * 2).sum()

    ms.grad(loss)(tensor(values(rank, 4)))
    return seen
@case
def rendezvous_peer_buffers(rank, world):
    t = symm.empty(8 * world, dtype=ms.float32)
    t.copy_(tensor(np.full(8 * world, rank, np.float32)))
    symm.barrier()
    mem = symm.rendezvous(t)
    nxt = (rank + 1) % world
    peer = mem.get_buffer(nxt, (8,), ms.float32)
    seen = peer.asnumpy().copy()                          # the next rank's copy, read in place
    mine_there = mem.get_buffer(nxt, (8,), ms.float32, storage_offset=8 * rank)
    mine_there.copy_(tensor(np.full(8, 100 + rank, np.float32)))   # written into its memory
    ms_tensors.synchronize()   # the copy_ above is queued: it must have run before the barrier
    mem.barrier()
    prev = (rank - 1) % world
    got = t.asnumpy()[8 * prev:8 * prev + 8].copy()
    out = {"read_peer": bool(np.array_equal(seen, np.full(8, nxt, np.float32))),
           "written_by_prev": bool(np.array_equal(got, np.full(8, 100 + prev, np.float32))),
           "world": mem.world_size == world and mem.rank == rank and mem.buffer_size == 32 * world,
           "past_end": raises(mem.get_buffer, nxt, (9 * world,), ms.float32),
           "mismatch": raises(symm.rendezvous, t if rank == 0 else t[8:])}
    symm.barrier()
    symm.free(t)
    return out


@case
def sub_groups(rank, world):
    evens = [r for r in range(world) if r % 2 == 0]
    odds = [r for r in range(world) if r % 2 == 1]
    mine = evens if rank % 2 == 0 else odds
    name = "hp_evens" if rank % 2 == 0 else "hp_odds"
    communication.create_group(name, mine)   # MindSpore: only a group's members create it
    g = len(mine)
    me = mine.index(rank)
    t = tensor(values(rank, 100))
    symm.shmem_allreduce(t, "sum", group=name)
    out = {"all_reduce": bool(np.array_equal(t.asnumpy(), sum(values(r, 100) for r in mine)))}
    o = ms.Tensor(np.zeros(10 * g, np.float32))
    symm.shmem_allgather(o, tensor(values(rank, 10)), group=name)
    out["all_gather"] = bool(np.array_equal(o.asnumpy(), np.concatenate([values(r, 10) for r in mine])))
    buf = symm.empty(8, dtype=ms.float32)
    buf.copy_(tensor(np.zeros(8, np.float32)))
    symm.barrier()
    symm.shmem_put(buf, 0, tensor(np.full(8, rank, np.float32)), 0, 8, (me + 1) % g, group=name)
    symm.barrier(group=name)
    out["put_group_rank"] = bool(np.array_equal(buf.asnumpy(), np.full(8, mine[(me - 1) % g], np.float32)))
    symm.barrier()
    symm.free(buf)
    out["rank_outside"] = raises(symm.shmem_put, buf, 0, tensor(np.zeros(8, np.float32)), 0, 8, g, group=name)
    out["bad_group"] = raises(symm.shmem_allreduce, t, "sum", 7)
    return out


@case
def mismatch_then_recover(rank, world):
    t = tensor(values(rank, 8 if rank == 0 else 16))
    error = raises(symm.shmem_allreduce, t, "sum")
    again = tensor(values(rank, 8))
    symm.shmem_allreduce(again, "sum")
    return {"error": error, "recovered": bool(np.array_equal(again.asnumpy(), sum(values(r, 8) for r in range(world))))}


# ---------------------------------------------------------------------------------------------------- autograd
@case
def autograd(rank, world):
    out = {}
    w = values(rank, 6 * world).astype(np.float32) + 0.5   # per-rank weights: grads differ across ranks
    W = [values(r, 6 * world).astype(np.float32) + 0.5 for r in range(world)]

    def gathered_loss(x):
        o = ops.zeros((6 * world,), ms.float32)
        return (symm.shmem_allgather(o, x) * tensor(w)).sum()

    g = ms.grad(gathered_loss)(tensor(values(rank, 6)))
    want = sum(W)[rank * 6:(rank + 1) * 6]        # reduce_scatter(sum) of every rank's grad_out
    out["all_gather"] = bool(np.allclose(g.asnumpy(), want))

    def reduced_loss(x, backward):
        y = x * 1.0
        return (symm.shmem_allreduce(y, "sum", backward=backward) * tensor(w[:6])).sum()

    g_id = ms.grad(lambda x: reduced_loss(x, "identity"))(tensor(values(rank, 6)))
    g_ar = ms.grad(lambda x: reduced_loss(x, "allreduce"))(tensor(values(rank, 6)))
    out["all_reduce_identity"] = bool(np.allclose(g_id.asnumpy(), w[:6]))
    out["all_reduce_allreduce"] = bool(np.allclose(g_ar.asnumpy(), sum(Wr[:6] for Wr in W)))

    def scattered_loss(x):
        o = ops.zeros((6,), ms.float32)
        return (symm.shmem_reduce_scatter(o, x, "sum") * tensor(w[:6])).sum()

    g_rs = ms.grad(scattered_loss)(tensor(values(rank, 6 * world)))
    out["reduce_scatter"] = bool(np.allclose(g_rs.asnumpy(), np.concatenate([Wr[:6] for Wr in W])))

    def exchanged_loss(*sends):
        receive = ops.zeros((2 * world,), ms.float32)
        return (symm.shmem_alltoall(list(sends), receive, [2] * world) * tensor(w[:2 * world])).sum()

    grads = ms.grad(exchanged_loss, grad_position=tuple(range(world)))(*[tensor(values(rank, 2, salt=j))
                                                                         for j in range(world)])
    # what rank sent to j landed at j's receive[2 * rank : 2 * rank + 2], weighted by j's w
    out["all_to_all"] = all(bool(np.allclose(grads[j].asnumpy(), W[j][2 * rank:2 * rank + 2])) for j in range(world))
    return out


@case
def fused_ops(rank, world):
    m, k, n = 4, 5, 3
    a = np.random.default_rng(rank).standard_normal((m, k)).astype(np.float32)
    b = np.random.default_rng(99).standard_normal((k, n)).astype(np.float32)
    gather_out = symm.empty((m * world, k), dtype=ms.float32)
    c = ms.Tensor(np.zeros((m * world, n), np.float32))
    g, prod = symm.fused_all_gather_matmul(tensor(a), tensor(b), c, gather_out, None)
    A = np.concatenate([np.random.default_rng(r).standard_normal((m, k)).astype(np.float32) for r in range(world)])
    # float32 sums of k products in any order differ from the exact value by at most k * 2^-24 * sum|a_i b_i| each
    # (twice that between two such sums); the reduce_scatter adds world - 1 more roundings of sums of such terms.
    unit = 2.0**-24
    bound = 2 * k * unit * (np.abs(A) @ np.abs(b))
    out = {"gather": bool(np.array_equal(g.asnumpy(), A)),
           "matmul": bool(np.all(np.abs(prod.asnumpy() - A @ b) <= bound))}
    x1 = np.random.default_rng(rank + 10).standard_normal((2 * world, k)).astype(np.float32)
    scratch = symm.empty(2 * world * n, dtype=ms.float32)
    r = symm.fused_matmul_reduce_scatter(tensor(x1), tensor(b), scratch, None)
    X = [np.random.default_rng(q + 10).standard_normal((2 * world, k)).astype(np.float64) for q in range(world)]
    total = sum(x @ b.astype(np.float64) for x in X)[2 * rank:2 * rank + 2]
    magnitude = sum(np.abs(x) @ np.abs(b.astype(np.float64)) for x in X)[2 * rank:2 * rank + 2]
    out["reduce_scatter"] = bool(np.all(np.abs(r.asnumpy() - total) <= 2 * (k + world) * unit * magnitude))
    out["bad_op"] = raises(symm.fused_matmul_reduce_scatter, tensor(x1), tensor(b), scratch, None, "max")
    out["rows"] = raises(symm.fused_matmul_reduce_scatter, tensor(x1[:2 * world - 1]), tensor(b), scratch, None)
    small = symm.empty(3, dtype=ms.float32)
    out["scratch"] = raises(symm.fused_matmul_reduce_scatter, tensor(x1), tensor(b), small, None)
    symm.free(small)
    symm.free(scratch)
    symm.free(gather_out)
    return out


# ---------------------------------------------------------------------------------------------------- lifecycle
@case
def shutdown_refused_then_done(rank, world):
    live = symm.empty(4)
    refused = raises(symm.shutdown)
    symm.free(live)
    symm.shutdown()
    state = symm.debug_state()["state"]
    again = symm.empty(4)   # a later empty starts afresh
    symm.free(again)
    symm.shutdown()
    return {"refused": refused, "state": state}


@case
def graph_mode_is_refused(rank, world):
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        error = raises(symm.barrier)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    return {"error": error}


@case
def absent_rank_times_out(rank, world):
    """Rank 0 starts a collective on a new group that the other ranks never join: it raises in time (the last
    case: the group stays blocked)."""
    symm.barrier()
    communication.create_group("hp_absent", list(range(world)))
    if rank != 0:
        return {}
    start = time.monotonic()
    error = raises(symm.barrier, group="hp_absent")
    return {"error": error, "seconds": time.monotonic() - start}


def main() -> None:
    communication.init()
    rank, world = rank_world()
    selected = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] else list(CASES)
    path = os.path.join(os.environ["HP_MS_RESULTS"], f"rank{rank}.jsonl")
    with open(path, "a") as f:
        for name in selected:
            start = time.monotonic()
            try:
                record = {"case": name, "ok": True, "result": CASES[name](rank, world)}
            except Exception as e:  # noqa: BLE001 (reported to the test)
                record = {"case": name, "ok": False, "error": f"{type(e).__name__}: {e}",
                          "traceback": traceback.format_exc()}
            record["seconds"] = round(time.monotonic() - start, 3)
            f.write(json.dumps(record, default=lambda o: o.item() if hasattr(o, "item") else str(o)) + "\n")
            f.flush()
            md.barrier()   # cases start together on every rank


if __name__ == "__main__":
    main()
