"""What torch's own symmetric-memory tests need in the ranks of a :class:`harness.World`.

The ported tests (``test_torch_symmetric_memory.py``, ``test_torch_nvshmem.py``) keep the bodies of PyTorch's
``test/distributed/test_symmetric_memory.py`` and ``test/distributed/test_nvshmem.py`` (BSD-3-Clause, the PyTorch
contributors): their inputs, references and assertions, with the device ``cpu``, the process group gloo and this
repository's launcher instead of ``MultiProcContinuousTest``. A test class of theirs becomes a class deriving from
:class:`RankTest`, which answers what ``MultiProcContinuousTest`` answers (``rank``, ``world_size``, ``device``, an
``assertEqual`` that compares tensors as torch's does, with ``torch.testing.assert_close``); :func:`run_method` runs
one test method in every rank.
"""

from __future__ import annotations

import importlib
import random
import unittest

import torch
import torch.distributed as dist

import hyper_parallel.platform.torch  # noqa: F401  (the torch handler: registers the host device as a CPU backend)

# torch's tests run with the backend their device has: here the host device's, by its name.
BACKEND = "HYPER_PARALLEL_SHMEM"
# Each ported module runs its worlds with these: room for the tile tests' 2048 x 2048 tensors, short waits.
ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "256M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "30"}


# torch's TestCase seeds every generator with this before each test (common_utils.SEED): the same on every rank.
_SEED = 1234


class RankTest(unittest.TestCase):
    """A test class of torch's, seen from one rank of the harness's world."""

    __test__ = False  # run in the ranks by run_method, never collected by pytest in the test process

    def runTest(self) -> None:  # noqa: N802  (unittest's name; the harness calls the methods itself)
        pass

    def setUp(self) -> None:
        random.seed(_SEED)
        torch.manual_seed(_SEED)

    def assertEqual(self, first, second, msg=None) -> None:  # noqa: N802
        """torch's TestCase.assertEqual: tensors (and a number against each element of a tensor) within the dtype's
        default tolerances of ``torch.testing.assert_close``, anything else as unittest compares it."""
        if isinstance(first, torch.Tensor) or isinstance(second, torch.Tensor):
            # A number stands for every element of the tensor it is compared with.
            first_t = first if isinstance(first, torch.Tensor) else torch.full_like(second, first)
            second_t = second if isinstance(second, torch.Tensor) else torch.full_like(first, second)
            torch.testing.assert_close(first_t, second_t, check_dtype=False, equal_nan=True,
                                       msg=None if msg is None else lambda default: f"{msg}\n{default}")
            return
        super().assertEqual(first, second, msg)

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")


def run_method(module: str, cls: str, method: str, params: dict) -> None:
    """Runs ``cls.method(**params)`` of ``module`` in this rank (the harness runs it in every rank)."""
    test = getattr(importlib.import_module(module), cls)()
    test.setUp()
    try:
        getattr(test, method)(**params)
    finally:
        test.tearDown()
    dist.barrier()  # no rank starts the next case while a peer still reads its symmetric tensors
