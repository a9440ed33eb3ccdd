"""Mixing the library's collectives with torch.distributed's own, as the API's interoperability rules allow
(README, "Mixing with torch.distributed's collectives"): data parallelism over symmetric memory, tensor parallelism
over gloo, in one training step on a 2 x 2 mesh of 4 real ranks.

The step runs twice from the same weights and data: once with every collective gloo's, once with the gradients
all-reduced by ``symm.shmem_allreduce`` over the data-parallel group while the activations are gathered by
``dist.all_gather_into_tensor`` over the tensor-parallel group (asynchronously, across the library's call). Both
steps must give the same loss and the same updated weights, and must match one process's reference.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import hyper_parallel.core.symmetric_memory as symm
from st_cases import run_case
from symm_cases import symm_session

_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "32M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "60"}
_BATCH, _IN, _HIDDEN, _OUT = 6, 8, 12, 5   # per data-parallel rank; _HIDDEN splits over the 2 tensor-parallel ranks
_LR = 0.1


def _parameters() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(2026)
    return (torch.randn(_HIDDEN, _IN, generator=generator, dtype=torch.float64),
            torch.randn(_OUT, _HIDDEN, generator=generator, dtype=torch.float64))


def _batch(dp_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(17 + dp_index)
    return (torch.randn(_BATCH, _IN, generator=generator, dtype=torch.float64),
            torch.randn(_BATCH, _OUT, generator=generator, dtype=torch.float64))


def _mesh() -> tuple[int, int, dist.ProcessGroup, dist.ProcessGroup]:
    """Ranks r = 2 * dp + tp: data-parallel groups {0, 2} and {1, 3}, tensor-parallel groups {0, 1} and {2, 3}
    (every rank makes every group, in the same order, as torch requires)."""
    rank = dist.get_rank()
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    return rank // 2, rank % 2, dp_groups[rank % 2], tp_groups[rank // 2]


def _step(dp_index: int, tp_index: int, dp_group: dist.ProcessGroup, tp_group: dist.ProcessGroup,
          dp_all_reduce) -> tuple[float, torch.Tensor, torch.Tensor]:
    """One SGD step of a two-layer MLP: the first layer column-parallel over the tensor-parallel group (each rank
    holds half the hidden units), the batch split over the data-parallel group. Returns the global loss and the
    whole updated weights."""
    w1, w2 = _parameters()
    half = _HIDDEN // 2
    w1_local = w1[tp_index * half:(tp_index + 1) * half].clone().requires_grad_()
    w2 = w2.clone().requires_grad_()
    x, y = _batch(dp_index)
    hidden_local = torch.tanh(x @ w1_local.T)                       # (batch, half)
    gathered = torch.empty(2 * _BATCH, half, dtype=torch.float64)
    # Tensor parallelism over gloo, asynchronous: the library's call below runs while it is in flight.
    work = dist.all_gather_into_tensor(gathered, hidden_local.detach().contiguous(), group=tp_group, async_op=True)
    probe = torch.full((4,), float(dist.get_rank()), dtype=torch.float64)
    dp_all_reduce(probe)                                             # another group's collective in between
    assert probe.tolist() == [float(tp_index + (2 + tp_index))] * 4  # the data-parallel group's ranks, summed
    work.wait()
    # The gathered halves stand in for the peer's part; the local half keeps its graph for the backward.
    parts = list(gathered.split(_BATCH))
    parts[tp_index] = hidden_local
    hidden = torch.cat([parts[0], parts[1]], dim=1)                  # (batch, hidden) in w1's order
    loss = ((hidden @ w2.T - y) ** 2).mean()
    loss.backward()
    # Both tensor-parallel ranks saw the whole hidden layer and the same batch: w2's gradient is whole on each, and
    # w1_local's gradient, through the local half only, is complete locally.
    grad_w1 = w1_local.grad.clone()
    grad_w2 = w2.grad.clone()
    # Data parallelism: the mean over the data-parallel group, the collective under test.
    dp_all_reduce(grad_w1)
    dp_all_reduce(grad_w2)
    grad_w1 /= 2
    grad_w2 /= 2
    with torch.no_grad():
        new_w1_local = w1_local - _LR * grad_w1
        new_w2 = w2 - _LR * grad_w2
    whole_w1 = torch.empty(_HIDDEN, _IN, dtype=torch.float64)
    dist.all_gather_into_tensor(whole_w1, new_w1_local.contiguous(), group=tp_group)
    global_loss = loss.detach().clone()
    dp_all_reduce(global_loss)
    return global_loss.item() / 2, whole_w1, new_w2.detach()


def _reference() -> tuple[float, torch.Tensor, torch.Tensor]:
    """The same step in one process: the whole batch of both data-parallel ranks, the whole hidden layer."""
    w1, w2 = (p.clone().requires_grad_() for p in _parameters())
    losses = []
    for dp_index in range(2):
        x, y = _batch(dp_index)
        losses.append(((torch.tanh(x @ w1.T) @ w2.T - y) ** 2).mean())
    loss = (losses[0] + losses[1]) / 2
    loss.backward()
    with torch.no_grad():
        return loss.item(), w1 - _LR * w1.grad, w2 - _LR * w2.grad


def _case_one_step_both_ways() -> None:
    dp_index, tp_index, dp_group, tp_group = _mesh()

    def gloo_all_reduce(tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor, group=dp_group)

    def symm_all_reduce(tensor: torch.Tensor) -> None:
        symm.shmem_allreduce(tensor, op="sum", group=dp_group)

    with symm_session():
        by_gloo = _step(dp_index, tp_index, dp_group, tp_group, gloo_all_reduce)
        mixed = _step(dp_index, tp_index, dp_group, tp_group, symm_all_reduce)
    reference = _reference()
    # Two operands per reduction: a sum of two float64 values is the same in either order, so the mixed step is
    # bit-identical to gloo's; the reference adds the batch halves in another order and agrees to rounding.
    assert mixed[0] == by_gloo[0]
    torch.testing.assert_close(mixed[1], by_gloo[1], rtol=0, atol=0)
    torch.testing.assert_close(mixed[2], by_gloo[2], rtol=0, atol=0)
    assert abs(mixed[0] - reference[0]) < 1e-12
    torch.testing.assert_close(mixed[1], reference[1], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mixed[2], reference[2], rtol=1e-12, atol=1e-12)


def test_a_training_step_mixing_symmetric_memory_and_gloo_equals_the_gloo_step(world_factory) -> None:
    run_case(world_factory(4, _ENV), _case_one_step_both_ways, timeout=180)
