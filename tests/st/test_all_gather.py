"""System tests of ``shmem.all_gather`` on the host device: the byte-boundary matrix and its argument checks.

Message sizes of 0, 1, 3, 65 and 4097 bytes (unaligned tails) and 64 MiB, on 1, 2, 4 and 8 ranks, with the
input as an ordinary tensor and in place (the input is this rank's own slot of the output). The output starts
out as garbage so that every byte must be written.

References are independent of the code under test. Up to 4097 bytes: ``torch.distributed.all_gather`` over gloo
on the same inputs. At 64 MiB, gloo would take ~16 s and 512 MiB more per rank at 8 ranks on 2 cores, so each
rank's input is its own random 4099-byte block (a length that divides no power of two) repeated; gloo gathers
the blocks and every slot of the output is compared with its rank's block repeated, in one process.
"""

from __future__ import annotations

import ctypes

import pytest
import torch
import torch.distributed as dist

from hyper_parallel.core.multicore import shmem
from st_cases import run_case, session

_RANKS = [1, 2, 4, 8]
_SMALL = [0, 1, 3, 65, 4097]
_LARGE = 64 << 20
_BLOCK = 4099
_GARBAGE = 0xEE


def _env(nranks: int) -> dict:
    # The heap holds the 64 MiB case's output (nranks * 64 MiB) plus room for the small ones.
    return {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": f"{64 * (nranks + 1)}M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "60"}


# --------------------------------------------------------------------------
# Helpers (run in the ranks).
# --------------------------------------------------------------------------


def _random_bytes(seed: int, n: int) -> torch.Tensor:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def _prepare(empty, nbytes: int, in_place: bool, make_input):
    """The output (garbage everywhere) and the input: a separate tensor, or this rank's slot of the output."""
    rank, world = dist.get_rank(), dist.get_world_size()
    output = empty(world * nbytes, dtype=torch.uint8)
    output.fill_(_GARBAGE)
    data = make_input()
    if in_place:
        slot = output[rank * nbytes : (rank + 1) * nbytes]
        slot.copy_(data)
        return output, slot
    return output, data


# --------------------------------------------------------------------------
# Cases.
# --------------------------------------------------------------------------


def _case_small(nbytes: int, in_place: bool) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    with session() as empty:
        mine = _random_bytes(7919 * rank + nbytes, nbytes)
        output, data = _prepare(empty, nbytes, in_place, lambda: mine.clone())
        shmem.all_gather(output, data)
        assert output.numel() == world * nbytes
        assert torch.equal(data, mine), "all_gather changed its input"
        if nbytes:
            reference = [torch.empty(nbytes, dtype=torch.uint8) for _ in range(world)]
            dist.all_gather(reference, mine)
            for r in range(world):
                got = output[r * nbytes : (r + 1) * nbytes]
                assert torch.equal(got, reference[r]), f"slot {r} on rank {rank}: {(got != reference[r]).nonzero()[:5]}"


def _case_large(nbytes: int, in_place: bool) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    full, tail = divmod(nbytes, _BLOCK)
    with session() as empty:
        block = _random_bytes(104729 + rank, _BLOCK)
        output, data = _prepare(empty, nbytes, in_place, lambda: block.repeat(full + 1)[:nbytes])
        shmem.all_gather(output, data)
        blocks = [torch.empty(_BLOCK, dtype=torch.uint8) for _ in range(world)]
        dist.all_gather(blocks, block)
        for r in range(world):
            slot = output[r * nbytes : (r + 1) * nbytes]
            assert bool(slot[: full * _BLOCK].view(full, _BLOCK).eq(blocks[r]).all()), f"slot {r} on rank {rank}"
            assert torch.equal(slot[full * _BLOCK :], blocks[r][:tail]), f"tail of slot {r} on rank {rank}"


def _case_typed_and_shaped() -> None:
    """Elements of any dtype and shape: bytes count; a 2-D output gathered in place through its own row."""
    rank, world = dist.get_rank(), dist.get_world_size()
    with session() as empty:
        rows = empty(world, 5, dtype=torch.float32)
        rows.fill_(float("nan"))
        rows[rank] = torch.arange(5, dtype=torch.float32) - 0.5 * rank
        shmem.all_gather(rows, rows[rank])
        expected = torch.stack([torch.arange(5, dtype=torch.float32) - 0.5 * r for r in range(world)])
        assert torch.equal(rows, expected), rows
        # An int64 output gathering float64 inputs: 8 bytes each, the bits land unchanged.
        bits = empty(world, 3, dtype=torch.int64)
        values = torch.tensor([1.5, -0.0, float("inf")], dtype=torch.float64) + rank
        shmem.all_gather(bits, values)
        reference = [torch.empty(3, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(reference, values)
        assert torch.equal(bits, torch.stack(reference).view(torch.int64))


def _case_bad_arguments() -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    with session() as empty:
        output = empty(world * 4 + 1, dtype=torch.uint8)
        exact = empty(world * 4, dtype=torch.uint8)
        output.fill_(_GARBAGE)
        exact.fill_(_GARBAGE)
        four = torch.full((4,), rank, dtype=torch.uint8)
        checks = [
            (lambda: shmem.all_gather(output, four), ValueError,
             f"`output` must have group_size * input bytes ({world} * 4 = {world * 4}), but got {world * 4 + 1}"),
            (lambda: shmem.all_gather(exact, torch.zeros(3, dtype=torch.uint8)), ValueError,
             f"`output` must have group_size * input bytes ({world} * 3 = {world * 3}), but got {world * 4}"),
            (lambda: shmem.all_gather(exact, torch.zeros(4, dtype=torch.int32)), ValueError,
             f"({world} * 16 = {world * 16}), but got {world * 4}"),
            (lambda: shmem.all_gather(exact, torch.zeros(8, dtype=torch.uint8)[::2]), ValueError,
             "`input` must be contiguous, but got a tensor of shape [4] and strides [2]"),
            (lambda: shmem.all_gather(exact.view(2, 2 * world).t(), four), ValueError, "`output` must be contiguous"),
            (lambda: shmem.all_gather([0] * world * 4, four), TypeError,
             "`output` must be a torch.Tensor, but got list"),
            (lambda: shmem.all_gather(exact, 4), TypeError, "`input` must be a torch.Tensor, but got int"),
        ]
        for index, (call, exc_type, fragment) in enumerate(checks):
            with pytest.raises(exc_type) as info:
                call()
            assert fragment in str(info.value), (index, fragment, str(info.value))
        dist.barrier()
        # Nothing was written anywhere, and the ranks are still in step for a good all_gather.
        assert torch.equal(output, torch.full_like(output, _GARBAGE))
        assert torch.equal(exact, torch.full_like(exact, _GARBAGE))
        shmem.all_gather(exact, four)
        assert exact.view(world, 4).tolist() == [[r] * 4 for r in range(world)]
        # An ordinary output works too: the runtime's engine stages what it cannot address on the peers.
        ordinary = torch.empty(world * 4, dtype=torch.uint8)
        shmem.all_gather(ordinary, four)
        assert ordinary.view(world, 4).tolist() == [[r] * 4 for r in range(world)]


# --------------------------------------------------------------------------
# Tests.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("in_place", [False, True], ids=["input", "in-place"])
@pytest.mark.parametrize("nbytes", _SMALL)
@pytest.mark.parametrize("nranks", _RANKS)
def test_all_gather_small_messages(world_factory, nranks: int, nbytes: int, in_place: bool) -> None:
    run_case(world_factory(nranks, _env(nranks)), _case_small, nbytes, in_place)


@pytest.mark.parametrize("in_place", [False, True], ids=["input", "in-place"])
@pytest.mark.parametrize("nranks", _RANKS)
def test_all_gather_64_mib(world_factory, nranks: int, in_place: bool) -> None:
    run_case(world_factory(nranks, _env(nranks)), _case_large, _LARGE, in_place, timeout=240)


@pytest.mark.parametrize("nranks", [1, 4])
def test_all_gather_counts_bytes_of_any_dtype_and_shape(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _env(nranks)), _case_typed_and_shaped)


@pytest.mark.parametrize("nranks", [1, 4])
def test_all_gather_bad_arguments_raise_and_write_nothing(world_factory, nranks: int) -> None:
    run_case(world_factory(nranks, _env(nranks)), _case_bad_arguments)
