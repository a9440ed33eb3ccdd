"""System tests of autograd through the user API on real gloo groups.

Every gradient is compared with a reference computed without the library: each rank rebuilds every rank's
inputs, evaluates the same function of all of them in one process with plain torch ops (concatenations and sums
standing in for the collectives), and differentiates the sum of the ranks' losses. The collectives run in
float64, so the two agree to rounding; the tensor-parallel MLP runs in float32 and takes one SGD step whose next
loss must match a single-process run too.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import hyper_parallel.core.symmetric_memory as symm
from st_cases import expect_error, run_case
from symm_cases import symm_session
from tolerances import assert_sums_close

_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "60"}
_F64 = dict(rtol=1e-12, atol=1e-12)


def _values(rank: int, shape: tuple, salt: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Rank ``rank``'s deterministic random values: every rank can rebuild any rank's."""
    generator = torch.Generator().manual_seed(7919 * rank + 104_729 * salt + 13)
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)


def _leaves(tensors: list) -> list:
    return [t.clone().requires_grad_() for t in tensors]


# --------------------------------------------------------------------------
# Cases (run in the ranks).
# --------------------------------------------------------------------------


def _case_all_gather() -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    xs = [_values(r, (5, 3), 1) for r in range(n)]
    ws = [_values(r, (5 * n, 3), 2) for r in range(n)]
    reference = _leaves(xs)
    sum((torch.cat(reference) * w).sum() for w in ws).backward()
    with symm_session() as empty:
        for output in (torch.zeros(5 * n, 3, dtype=torch.float64), empty((5 * n, 3), torch.float64)):
            x = xs[rank].clone().requires_grad_()
            y = symm.shmem_allgather(output, x)
            assert y is output and y.grad_fn is not None
            (y * ws[rank]).sum().backward()
            torch.testing.assert_close(x.grad, reference[rank].grad, **_F64)


def _case_reduce_scatter() -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    xs = [_values(r, (4 * n, 3), 3) for r in range(n)]
    ws = [_values(r, (4, 3), 4) for r in range(n)]
    for op in ("sum", "avg"):
        reference = _leaves(xs)
        stacked = torch.stack(reference)
        reduced = stacked.sum(0) if op == "sum" else stacked.mean(0)
        sum((reduced[r * 4:(r + 1) * 4] * ws[r]).sum() for r in range(n)).backward()
        x = xs[rank].clone().requires_grad_()
        y = symm.shmem_reduce_scatter(torch.zeros(4, 3, dtype=torch.float64), x, op=op)
        torch.testing.assert_close(y.detach(), reduced[rank * 4:(rank + 1) * 4].detach(), **_F64)
        (y * ws[rank]).sum().backward()
        torch.testing.assert_close(x.grad, reference[rank].grad, **_F64, msg=lambda m: f"{op}: {m}")


def _case_all_reduce() -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    xs = [_values(r, (6,), 5) for r in range(n)]
    shared = _values(0, (6,), 6)  # identity backward: the computation after the all-reduce is replicated
    ws = [_values(r, (6,), 7) for r in range(n)]  # all-reduce backward: every rank has a loss of its own
    for op in ("sum", "avg"):
        for mode, weights in (("identity", [shared]), ("allreduce", ws)):
            reference = _leaves(xs)
            stacked = torch.stack(reference)
            reduced = stacked.sum(0) if op == "sum" else stacked.mean(0)
            sum((reduced * w).sum() for w in weights).backward()
            x = xs[rank].clone().requires_grad_()
            y = symm.shmem_allreduce(x * 1, op=op, backward=mode)
            (y * weights[rank if mode == "allreduce" else 0]).sum().backward()
            torch.testing.assert_close(x.grad, reference[rank].grad, **_F64, msg=lambda m: f"{op} {mode}: {m}")


def _case_all_to_all() -> None:
    rank, n = dist.get_rank(), dist.get_world_size()

    def size(i: int, j: int) -> int:  # what rank i sends rank j
        return (i + 2 * j) % 3 + 1

    sends = [[_values(i, (size(i, j),), 10 + j) for j in range(n)] for i in range(n)]
    ws = [_values(r, (sum(size(i, r) for i in range(n)),), 8) for r in range(n)]
    reference = [_leaves(row) for row in sends]
    sum((torch.cat([reference[i][r] for i in range(n)]) * ws[r]).sum() for r in range(n)).backward()
    mine = _leaves(sends[rank])
    receive = torch.zeros(ws[rank].numel() + 2, dtype=torch.float64)  # longer than what arrives
    y = symm.shmem_alltoall(mine, receive, [size(i, rank) for i in range(n)])
    (y[:ws[rank].numel()] * ws[rank]).sum().backward()
    for j in range(n):
        torch.testing.assert_close(mine[j].grad, reference[rank][j].grad, **_F64)


def _case_send_recv_ring() -> None:
    """Every rank sends to the next and receives from the previous one; gradients travel the ring backwards."""
    rank, n = dist.get_rank(), dist.get_world_size()
    xs = [_values(r, (3, 2), 9) for r in range(n)]
    ws = [_values(r, (3, 2), 11) for r in range(n)]
    reference = _leaves(xs)
    sum((reference[(r - 1) % n] ** 2 * ws[r]).sum() for r in range(n)).backward()
    with symm_session():
        symm.barrier()  # acquires the runtime: point-to-point calls never do
        x = xs[rank].clone().requires_grad_()
        token = symm.shmem_send(x, (rank + 1) % n)
        assert token is not None and token.shape == () and token.item() == 0
        buffer = torch.empty(3, 2, dtype=torch.float64, requires_grad=True)
        received = symm.shmem_recv(buffer, (rank - 1) % n)
        torch.testing.assert_close(received.detach(), xs[(rank - 1) % n], **_F64)
        (received ** 2 * ws[rank]).sum().backward()  # sends the gradient of the received tensor back
        torch.testing.assert_close(buffer.grad, 2 * xs[(rank - 1) % n] * ws[rank], **_F64)
        token.backward()  # receives x's gradient from the next rank
        torch.testing.assert_close(x.grad, reference[rank].grad, **_F64)
        assert symm.shmem_send(xs[rank], (rank + 1) % n) is None  # no grad, no token
        symm.shmem_recv(torch.empty(3, 2, dtype=torch.float64), (rank - 1) % n)


def _case_pipeline() -> None:
    """Two pipeline stages on ranks 0 and 1: the second's loss trains the first's weight through send/recv."""
    rank = dist.get_rank()
    x, target = _values(0, (4, 5), 20), _values(0, (4, 2), 21)
    w0, w1 = _values(0, (5, 3), 22), _values(0, (3, 2), 23)
    ref0, ref1 = _leaves([w0, w1])
    ((torch.tanh(x @ ref0) @ ref1 - target) ** 2).sum().backward()
    with symm_session():
        symm.barrier()  # acquires the runtime: point-to-point calls never do
        if rank == 0:
            weight = w0.clone().requires_grad_()
            token = symm.shmem_send(torch.tanh(x @ weight), 1)
            token.backward()
            torch.testing.assert_close(weight.grad, ref0.grad, **_F64)
        elif rank == 1:
            weight = w1.clone().requires_grad_()
            hidden = symm.shmem_recv(torch.empty(4, 3, dtype=torch.float64, requires_grad=True), 0)
            ((hidden @ weight - target) ** 2).sum().backward()
            torch.testing.assert_close(weight.grad, ref1.grad, **_F64)


def _case_fused(dtype: torch.dtype = torch.float64) -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    m, k, cols = 6, 4, 5
    a_s = [_values(r, (m, k), 30) for r in range(n)]
    b_s = [_values(r, (k, cols), 31) for r in range(n)]  # a column shard of the weight per rank
    w_c = [_values(r, (n * m, cols), 32) for r in range(n)]
    w_g = [_values(r, (n * m, k), 33) for r in range(n)]
    a_ref, b_ref = _leaves(a_s), _leaves(b_s)
    gathered_ref = torch.cat(a_ref)
    sum(((gathered_ref @ b_ref[r]) * w_c[r]).sum() + (gathered_ref * w_g[r]).sum() for r in range(n)).backward()

    x1_s = [_values(r, (n * m, k), 34) for r in range(n)]
    x2_s = [_values(r, (k, cols), 35) for r in range(n)]
    w_o = [_values(r, (m, cols), 36) for r in range(n)]
    with symm_session() as empty:
        gather_out = empty((n * m, k), dtype)
        signal = empty(n, torch.int64)
        a, b = a_s[rank].clone().requires_grad_(), b_s[rank].clone().requires_grad_()
        c = torch.zeros(n * m, cols, dtype=dtype)
        g, c_out = symm.fused_all_gather_matmul(a, b, c, gather_out, signal, block_size=4)
        assert g is gather_out and c_out is c and c.grad_fn is not None
        ((c_out * w_c[rank]).sum() + (g * w_g[rank]).sum()).backward()
        torch.testing.assert_close(a.grad, a_ref[rank].grad, **_F64)
        torch.testing.assert_close(b.grad, b_ref[rank].grad, **_F64)

        symm_tensor = empty((n * m, cols), dtype)
        for op in ("sum", "avg"):
            x1_ref, x2_ref = _leaves(x1_s), _leaves(x2_s)
            products = torch.stack([x1_ref[r] @ x2_ref[r] for r in range(n)])
            reduced = products.sum(0) if op == "sum" else products.mean(0)
            sum((reduced[r * m:(r + 1) * m] * w_o[r]).sum() for r in range(n)).backward()
            x1, x2 = x1_s[rank].clone().requires_grad_(), x2_s[rank].clone().requires_grad_()
            out = symm.fused_matmul_reduce_scatter(x1, x2, symm_tensor, signal, reduce_op=op)
            (out * w_o[rank]).sum().backward()
            torch.testing.assert_close(x1.grad, x1_ref[rank].grad, **_F64, msg=lambda msg: f"{op}: {msg}")
            torch.testing.assert_close(x2.grad, x2_ref[rank].grad, **_F64, msg=lambda msg: f"{op}: {msg}")


def _mlp_data(n: int) -> tuple:
    """Inputs, targets and weights of a two-layer MLP, float32: 4 rows per rank, d=8, hidden=4n."""
    rows, d, hidden = 4 * n, 8, 4 * n
    x = _values(0, (rows, d), 40, torch.float32)
    target = _values(0, (rows, d), 41, torch.float32)
    w1 = _values(0, (d, hidden), 42, torch.float32) / 2
    w2 = _values(0, (hidden, d), 43, torch.float32) / 2
    return x, target, w1, w2


def _reference_mlp_step(x, target, w1, w2, lr: float) -> tuple:
    """One single-process SGD step: (loss, grad_w1, grad_w2, grad_x, next loss)."""
    w1, w2, x = _leaves([w1, w2, x])
    loss = ((F.gelu(x @ w1) @ w2 - target) ** 2).sum()
    loss.backward()
    with torch.no_grad():
        next_loss = ((F.gelu(x @ (w1 - lr * w1.grad)) @ (w2 - lr * w2.grad) - target) ** 2).sum()
    return loss.detach(), w1.grad, w2.grad, x.grad, next_loss


def _case_tensor_parallel_mlp() -> None:
    """One training step of a tensor-parallel MLP two ways: sequence-parallel with the fused ops, and
    Megatron-style with a replicated input and an all-reduce (identity backward)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    lr = 0.01
    x, target, w1, w2 = _mlp_data(n)
    loss_ref, g1_ref, g2_ref, gx_ref, next_ref = _reference_mlp_step(x, target, w1, w2, lr)
    rows, hidden = x.shape[0] // n, w1.shape[1] // n
    # Every sum on the longest path of the step, forward (x @ w1, @ w2, the loss) and backward (the gradients'
    # matmuls), plus the next loss: the two runs may order each of them differently.
    d, total_rows, total_hidden = x.shape[1], x.shape[0], w1.shape[1]
    terms = 2 * (d + total_hidden + total_rows * d) + 2 * total_rows

    def close(ours: torch.Tensor, reference: torch.Tensor, what: str) -> None:
        assert_sums_close(ours, reference, terms, what)

    mine_rows = slice(rank * rows, (rank + 1) * rows)
    mine_hidden = slice(rank * hidden, (rank + 1) * hidden)

    def sequence_parallel_loss(w1_shard, w2_shard, x_rows, buffers) -> torch.Tensor:
        gather_out, symm_tensor, signal = buffers
        _, h = symm.fused_all_gather_matmul(x_rows, w1_shard, torch.empty(x.shape[0], hidden), gather_out, signal)
        z_rows = symm.fused_matmul_reduce_scatter(F.gelu(h), w2_shard, symm_tensor, signal)
        return ((z_rows - target[mine_rows]) ** 2).sum()  # this rank's rows of the loss

    with symm_session() as empty:
        buffers = (empty(tuple(x.shape)), empty((x.shape[0], w2.shape[1])), empty(n, torch.int32))
        w1_shard = w1[:, mine_hidden].clone().requires_grad_()
        w2_shard = w2[mine_hidden].clone().requires_grad_()
        x_rows = x[mine_rows].clone().requires_grad_()
        loss = sequence_parallel_loss(w1_shard, w2_shard, x_rows, buffers)
        loss.backward()
        total = loss.detach().clone()
        dist.all_reduce(total)
        close(total, loss_ref, "total")
        close(w1_shard.grad, g1_ref[:, mine_hidden], "w1_shard.grad")
        close(w2_shard.grad, g2_ref[mine_hidden], "w2_shard.grad")
        close(x_rows.grad, gx_ref[mine_rows], "x_rows.grad")
        with torch.no_grad():
            w1_shard -= lr * w1_shard.grad
            w2_shard -= lr * w2_shard.grad
            next_total = sequence_parallel_loss(w1_shard, w2_shard, x_rows, buffers)
        dist.all_reduce(next_total)
        close(next_total, next_ref, "next_total")

        # Megatron's row-parallel layer: the input is replicated, the partial products are all-reduced, and
        # the loss after the all-reduce is computed identically on every rank (identity backward).
        w1_shard = w1[:, mine_hidden].clone().requires_grad_()
        w2_shard = w2[mine_hidden].clone().requires_grad_()
        z = symm.shmem_allreduce(F.gelu(x @ w1_shard) @ w2_shard)
        loss = ((z - target) ** 2).sum()
        loss.backward()
        close(loss.detach(), loss_ref, "loss.detach()")
        close(w1_shard.grad, g1_ref[:, mine_hidden], "w1_shard.grad")
        close(w2_shard.grad, g2_ref[mine_hidden], "w2_shard.grad")


def _case_errors() -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    with symm_session():
        y = torch.ones(4, requires_grad=True) * 1
        before = y.detach().clone()
        expect_error(ValueError, lambda: symm.shmem_allreduce(y, op="max"),
                     "`op` must be 'sum' or 'avg' when `tensor` requires grad, but got 'max'")
        expect_error(ValueError, lambda: symm.shmem_allreduce(y, backward="sum"),
                     "`backward` must be one of 'identity', 'allreduce', but got 'sum'")
        # checked without grad too: a typo never waits for the first backward to surface
        expect_error(ValueError, lambda: symm.shmem_allreduce(before, backward="all_reduce"),
                     "`backward` must be one of 'identity', 'allreduce', but got 'all_reduce'")
        assert torch.equal(y.detach(), before)
        expect_error(ValueError,
                     lambda: symm.shmem_reduce_scatter(torch.zeros(1), torch.ones(n, requires_grad=True) * 1, op="min"),
                     "`op` must be 'sum' or 'avg' when `input_tensor` requires grad, but got 'min'")
        out = torch.zeros(4 * n)
        expect_error(ValueError, lambda: symm.shmem_allgather(out, out[rank * 4:(rank + 1) * 4].requires_grad_()),
                     "`input_tensor` must not be a view of `output_tensor` when it requires grad")
        assert not out.any()
        expect_error(ValueError, lambda: symm.shmem_recv(torch.ones(2, requires_grad=True) * 1, (rank + 1) % n),
                     "`tensor` must be a leaf (a receive buffer made with requires_grad=True) when it requires grad, "
                     "but got the output of MulBackward0")
        with torch.no_grad():  # no graph under no_grad: the plain paths run, 'max' included
            assert symm.shmem_allreduce(torch.ones(3, requires_grad=True) * 1, op="max").grad_fn is None


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("case", [_case_all_gather, _case_reduce_scatter, _case_all_reduce, _case_all_to_all,
                                  _case_send_recv_ring, _case_fused, _case_tensor_parallel_mlp, _case_errors],
                         ids=lambda case: case.__name__[len("_case_"):])
def test_gradients_match_single_process(world_factory, nranks: int, case) -> None:
    run_case(world_factory(nranks, _ENV), case, timeout=120)


def test_pipeline_stages_train_through_send_recv(world_factory) -> None:
    run_case(world_factory(2, _ENV), _case_pipeline, timeout=120)
