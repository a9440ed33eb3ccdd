"""System tests of the user API as torch operators (namespace ``hyper_parallel_shmem``) under torch.compile.

A small tensor-parallel model calls ``shmem_allgather``, ``shmem_allreduce``, ``shmem_reduce_scatter`` and both
fused ops. It runs eagerly and under ``torch.compile(fullgraph=True)`` on 2 real gloo ranks: forward without
grad, then forward and backward, compared with each other. A recording backend checks that dynamo put the
operators themselves into its graph. Backends: "eager" (dynamo's graph as is), "inductor", and "aot_eager" for
the model without the fused ops: AOTAutograd's functionalization hands a written argument to the op as a copy
unless inductor writes it in place, and the fused ops' symmetric tensors must be the caller's (the README's
"torch operators and torch.compile"). ``torch.library.opcheck`` checks every operator that can run in a world of
one rank.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.schema_check_mode import SchemaCheckMode

import hyper_parallel.core.symmetric_memory as symm
from st_cases import run_case
from symm_cases import symm_session
from tolerances import assert_sums_close

_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "120"}
_ROWS_PER_RANK, _D, _HIDDEN_PER_RANK, _K = 4, 8, 4, 6

# The operators the model's graph must hold, by the name dynamo records.
_MODEL_OPS = {"all_gather_", "all_reduce_", "reduce_scatter_", "fused_all_gather_matmul_",
              "fused_matmul_reduce_scatter"}


def _values(rank: int, shape: tuple, salt: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7919 * rank + 104_729 * salt + 17)
    return torch.randn(shape, generator=generator, dtype=torch.float32) / 2


def _model(x, w1, w2, w3, w4, buffers, group, fused=True):
    """Tensor-parallel layers on this rank's shards; returns this rank's loss.

    column-parallel ``x @ w1`` -> all_gather of the activations -> row-parallel ``@ w2`` -> all_reduce ->
    reduce_scatter of the rows -> fused all_gather + matmul by ``w3`` -> fused matmul by ``w4`` + reduce_scatter
    (without ``fused``, the loss is taken after the reduce_scatter and ``w3``, ``w4`` go unused).
    """
    gather_out, symm_tensor, signal = buffers
    n = dist.get_world_size(group)
    me = dist.get_rank(group)
    rows, hidden = x.shape[0], w1.shape[1]
    h = F.gelu(x @ w1)  # (rows, hidden / n): this rank's columns
    parts = torch.empty(n * rows, hidden)
    symm.shmem_allgather(parts, h, group=group)  # every rank's columns, stacked
    full = parts.view(n, rows, hidden).transpose(0, 1).reshape(rows, n * hidden)
    z = full[:, me * hidden:(me + 1) * hidden] @ w2  # row-parallel: a partial sum of (rows, d)
    z = symm.shmem_allreduce(z, group=group)
    mine = torch.empty(rows // n, z.shape[1])
    mine = symm.shmem_reduce_scatter(mine, torch.tanh(z) * (me + 1), group=group)  # this rank's rows
    if not fused:
        return (mine ** 2).sum() + full.sum() / 8
    c = torch.empty(rows, w3.shape[1])
    _, c = symm.fused_all_gather_matmul(mine, w3, c, gather_out, signal, group=group)
    out = symm.fused_matmul_reduce_scatter(torch.sin(c), w4, symm_tensor, signal, group=group)
    return (out ** 2).sum() + full.sum() / 8


def _recording(seen: set):
    """A torch.compile backend that records the operators of the graph dynamo hands it, then runs it as is."""
    def backend(gm: torch.fx.GraphModule, example_inputs):
        for node in gm.graph.nodes:
            name = str(node.target)  # "hyper_parallel_shmem.all_gather_" (an OpOverloadPacket), or with ".default"
            if node.op == "call_function" and name.startswith("hyper_parallel_shmem."):
                seen.add(name.split(".")[1])
        return gm.forward
    return backend


def _case_compiled_model_matches_eager(backends: list, explicit_group: bool, fused: bool = True,
                                       forward_only: tuple = ()) -> None:
    """The model eagerly, compiled by the recording backend (eager's very bits), and compiled by each of
    ``backends`` (those in ``forward_only``: without grad only)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(n))) if explicit_group else None
    rows, hidden = _ROWS_PER_RANK * n, _HIDDEN_PER_RANK
    x = _values(0, (rows, _D), 1)  # replicated
    weights = [_values(rank, (_D, hidden), 2), _values(rank, (hidden, _D), 3), _values(rank, (_D, _K), 4),
               _values(rank, (_K, _D), 5)]
    # Every sum on the longest path: the layers' matmuls, the collectives' sums over ranks, the loss.
    terms = _D + hidden + n + n * _D + _K + n + rows * _D + rows * n * hidden
    used = 4 if fused else 2  # the weights the loss depends on
    with symm_session() as empty:
        def fresh() -> tuple:
            """New symmetric buffers: a forward with grad puts ``gather_out`` into its graph (it is an output)."""
            return empty((rows, _D)), empty((rows, _D)), empty(n, torch.int32)

        buffers = fresh()
        with torch.no_grad():
            eager = _model(x, *weights, buffers, group, fused)
        leaves = [w.clone().requires_grad_() for w in weights[:used]] + weights[used:]
        eager_loss = _model(x, *leaves, fresh(), group, fused)
        eager_loss.backward()
        eager_grads = [w.grad for w in leaves[:used]]

        seen: set = set()
        torch._dynamo.reset()
        recorded = torch.compile(_model, fullgraph=True, backend=_recording(seen))
        with torch.no_grad():
            torch.testing.assert_close(recorded(x, *weights, buffers, group, fused), eager, rtol=0, atol=0)
        unfused = _MODEL_OPS - {"fused_all_gather_matmul_", "fused_matmul_reduce_scatter"}
        assert seen == (_MODEL_OPS if fused else unfused), f"operators in dynamo's graph: {sorted(seen)}"

        for backend in backends:
            torch._dynamo.reset()
            compiled = torch.compile(_model, fullgraph=True, backend=backend)
            with torch.no_grad():
                assert_sums_close(compiled(x, *weights, buffers, group, fused), eager, terms, f"{backend} forward")
            if backend in forward_only:
                continue
            leaves = [w.clone().requires_grad_() for w in weights[:used]] + weights[used:]
            loss = compiled(x, *leaves, fresh(), group, fused)
            loss.backward()
            assert_sums_close(loss.detach(), eager_loss.detach(), terms, f"{backend} loss")
            for i, (w, reference) in enumerate(zip(leaves[:used], eager_grads)):
                assert_sums_close(w.grad, reference, terms, f"{backend} grad of w{i + 1}")
        torch._dynamo.reset()


def _ring_step(x, buf, sig, step):
    """Send/recv around the ring, then a put with signal to the next rank, waited for by the receiver."""
    rank, n = dist.get_rank(), dist.get_world_size()
    symm.shmem_send(x * 2, (rank + 1) % n)
    y = torch.empty_like(x)
    symm.shmem_recv(y, (rank - 1) % n)
    symm.shmem_put_with_signal(buf, 0, y + 1, 0, y.numel(), sig, 0, step, 0, (rank + 1) % n)  # SET step
    symm.shmem_wait_for_signal(buf, sig, 0, step, 0)  # EQ step: the previous rank's put has landed
    z = buf * 1
    symm.barrier()  # nobody writes `buf` again before every rank has read it
    return z


def _case_compiled_point_to_point() -> None:
    """send, recv, put_with_signal, wait_for_signal and barrier traced by dynamo, run by the "eager" backend."""
    rank, n = dist.get_rank(), dist.get_world_size()
    seen: set = set()
    torch._dynamo.reset()
    compiled = torch.compile(_ring_step, fullgraph=True, backend=_recording(seen))
    with symm_session() as empty:
        buf, sig = empty(4), empty(1, torch.int64)
        sig.zero_()
        symm.barrier()
        for step in (1, 2):
            x = torch.full((4,), float(step * (rank + 1)))
            before = (rank - 2) % n  # the rank whose x reaches this one, doubled and plus one, two hops on
            expected = torch.full((4,), float(step * (before + 1)) * 2 + 1)
            torch.testing.assert_close(compiled(x, buf, sig, step), expected, rtol=0, atol=0)
    assert seen == {"send", "recv_", "put_with_signal_", "wait_for_signal", "barrier"}, sorted(seen)
    torch._dynamo.reset()


def _check_schema_and_fake(op, args: tuple) -> None:
    """What opcheck's schema and fake-tensor tests check, on the caller's tensors: opcheck hands the op copies,
    and these ops need the symmetric tensors themselves (peers address them)."""
    with SchemaCheckMode():  # raises if the op writes an argument its schema does not mark, or aliases one
        real = op(*args)
    with FakeTensorMode() as mode:
        fake = op(*pytree.tree_map_only(torch.Tensor, mode.from_tensor, args))
    if real is None:
        assert fake is None, f"{op}: the fake kernel returned {fake}"
    else:
        assert (fake.shape, fake.dtype, fake.device) == (real.shape, real.dtype, real.device), f"{op}: {fake} {real}"


def _case_opcheck() -> None:
    """opcheck on every collective a one-rank world can run (send and recv need a peer); its schema and fake
    tests, on the caller's tensors, for the ops that take symmetric ones."""
    ops = torch.ops.hyper_parallel_shmem
    grad = dict(requires_grad=True)
    collectives = [
        (ops.all_reduce_, (torch.randn(5), "sum", "", "", "identity")),
        (ops.all_reduce_, (torch.randn(5), "avg", "", "bfloat16", "allreduce")),
        (ops.all_gather_, (torch.empty(4, 3), torch.randn(4, 3, **grad), "")),
        (ops.reduce_scatter_, (torch.empty(4), torch.randn(4, **grad), "sum", "", "none")),
        (ops.all_to_all_, (torch.empty(3), [torch.randn(3, **grad)], [3], "")),
        (ops.moe_exchange_, (torch.empty(4, 2), torch.empty(2, 1, dtype=torch.int64), torch.randn(3, 2, **grad),
                             torch.tensor([3]), None, "dispatch", 2, "", "none")),
        (ops.moe_exchange_, (torch.empty(3, 2), torch.empty(2, 1, dtype=torch.int64), torch.randn(4, 2, **grad),
                             torch.tensor([3]), torch.tensor([1]), "combine", 1, "", "bfloat16")),
        (ops.barrier, ("",)),
    ]
    with symm_session() as empty:
        symm.barrier()
        for op, args in collectives:
            torch.library.opcheck(op, args)  # schema, fake kernel, autograd registration, AOT dispatch
        data, signal = empty(6), empty(2, torch.int64)
        signal.zero_()
        data.fill_(1.0)
        symmetric = [
            (ops.put_, (data[:2], torch.randn(2), 0, "")),
            (ops.get_, (torch.empty(2), data[2:4], 0, "")),
            (ops.signal_, (signal[:1], 3, "set", 0, "")),
            (ops.put_with_signal_, (data[4:], torch.randn(2), signal[1:], 1, "add", 0, "")),
            (ops.wait_for_signal, (data, signal[:1], 3, "ge")),
            (ops.fused_all_gather_matmul_, (torch.randn(6, 4), torch.randn(4, 2), torch.empty(6, 2), empty((6, 4)),
                                            signal, 2, "")),
            (ops.fused_matmul_reduce_scatter, (torch.randn(3, 4), torch.randn(4, 2), data, signal, "sum", "")),
        ]
        for op, args in symmetric:
            _check_schema_and_fake(op, args)
        assert signal.tolist() == [3, 1] and data[4:].ne(1.0).all()  # the primitives wrote the caller's tensors


def test_compiled_model_matches_eager(world_factory) -> None:
    # 2 ranks only: a rank's first compilation imports dynamo and inductor, seconds of CPU per rank, and the eager
    # paths of every group size are the other modules' tests (the compiled graph differs only in its constants).
    run_case(world_factory(2, _ENV), _case_compiled_model_matches_eager, ["eager"], False, timeout=300)


def test_compiled_model_with_an_explicit_group_matches_eager_under_inductor(world_factory) -> None:
    # Forward only: inductor compiles a C++ kernel per fused group of ops, tens of seconds for the backward's too.
    run_case(world_factory(2, _ENV), _case_compiled_model_matches_eager, ["eager", "inductor"], True, True,
             ("inductor",), timeout=300)


@pytest.mark.parametrize("explicit_group", [False, True], ids=["world", "explicit_group"])
def test_compiled_collectives_match_eager_under_aot_eager(world_factory, explicit_group: bool) -> None:
    run_case(world_factory(2, _ENV), _case_compiled_model_matches_eager, ["aot_eager"], explicit_group, False,
             timeout=300)


def test_compiled_point_to_point_and_primitives(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_compiled_point_to_point, timeout=300)


def test_operators_pass_opcheck(world_factory) -> None:
    run_case(world_factory(1, _ENV), _case_opcheck, timeout=300)
