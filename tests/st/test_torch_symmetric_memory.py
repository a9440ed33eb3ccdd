"""PyTorch's ``test/distributed/test_symmetric_memory.py``, ported to CPU tensors over the host device's backend.

The test bodies are torch's (BSD-3-Clause, the PyTorch contributors): the same inputs, references and assertions,
with the device ``cpu`` instead of ``cuda``, gloo instead of NCCL, no ``torch.cuda.synchronize()`` (the host device's
calls have finished when they return), and this repository's launcher: one world of 2 and one of 4 ranks for the
module, each test a case in it with a timeout. A test that torch runs from 2 GPUs up runs at 2 and 4 ranks; one that
needs 3 or 4 runs at 4. The ``SymmMemNegativeTest`` cases end normally instead of with ``os._exit(0)``: a timed-out
wait here leaves the process healthy (the CUDA kernel traps the device).

The tests of torch's file that do not run here are listed, with the reason, in README.md ("torch's symmetric-memory
tests on CPU").
"""

from __future__ import annotations

import itertools
import random
from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
from torch._C._autograd import DeviceType
from torch._C._distributed_c10d import _SymmetricMemory
from torch.distributed._functional_collectives import all_gather_single
from torch.distributed._symmetric_memory import (
    _fused_all_gather_matmul_fallback,
    _fused_matmul_reduce_scatter_fallback,
    _test_mode,
    restride_A_for_fused_matmul_reduce_scatter,
    restride_A_shard_for_fused_all_gather_matmul,
)

from st_cases import run_case
from torch_symm_mem_cases import ENV, RankTest, run_method

test_contexts = [nullcontext, _test_mode]


class SymmetricMemoryTest(RankTest):
    def _init_process(self):
        torch.manual_seed(42 + self.rank)

    def test_has_multicast_support(self) -> None:
        # validate that has_multicast_support() returns "false" instead of throwing
        self.assertFalse(_SymmetricMemory.has_multicast_support(DeviceType.CPU, 0))

    def test_is_symm_mem_tensor(self) -> None:
        # CPU tensor -> False (not allocated by the backend)
        t_cpu = torch.empty(1024)
        self.assertFalse(symm_mem.is_symm_mem_tensor(t_cpu))

        # symm-mem tensor
        t_symm = symm_mem.empty(1024, device="cpu")
        self.assertTrue(symm_mem.is_symm_mem_tensor(t_symm))

    def test_get_backend(self) -> None:
        backend = symm_mem.get_backend(torch.device("cpu"))
        self.assertIsNotNone(backend)
        backend = symm_mem.get_backend("cpu")
        self.assertIsNotNone(backend)

    def test_get_signal_pad_size(self) -> None:
        # Test that get_signal_pad_size returns a positive integer
        signal_pad_size = symm_mem.get_signal_pad_size()
        self.assertIsInstance(signal_pad_size, int)
        self.assertGreater(signal_pad_size, 0)

        # Test that the C++ API returns the same value
        cpp_signal_pad_size = _SymmetricMemory.signal_pad_size
        self.assertEqual(signal_pad_size, cpp_signal_pad_size)

    def test_set_signal_pad_size(self) -> None:
        # Save the original signal pad size
        original_size = symm_mem.get_signal_pad_size()

        # Test setting a new signal pad size
        new_size = 1024 * 1024  # 1MB
        symm_mem.set_signal_pad_size(new_size)
        self.assertEqual(symm_mem.get_signal_pad_size(), new_size)

        # Test that the C++ API reflects the change
        self.assertEqual(_SymmetricMemory.signal_pad_size, new_size)

        # Restore original size for other tests
        symm_mem.set_signal_pad_size(original_size)
        self.assertEqual(symm_mem.get_signal_pad_size(), original_size)

    def test_set_signal_pad_size_with_allocation(self) -> None:
        """Test that custom signal pad size is actually used in allocations."""
        self._init_process()

        # Save the original signal pad size
        original_size = symm_mem.get_signal_pad_size()

        # Test with a custom signal pad size (2x the default)
        custom_size = original_size * 2
        symm_mem.set_signal_pad_size(custom_size)

        # Allocate symmetric memory and verify the signal pad size
        t = symm_mem.empty(64, device="cpu")
        symm_mem_hdl = symm_mem.rendezvous(t, group=dist.group.WORLD)

        # Verify the allocated symmetric memory uses the custom signal pad size
        self.assertEqual(symm_mem_hdl.signal_pad_size, custom_size)

        # Test that signal pad operations work with the custom size
        signal_pad = symm_mem_hdl.get_signal_pad(self.rank)
        expected_numel = custom_size // 4  # uint32_t
        self.assertEqual(signal_pad.numel(), expected_numel)

        # Verify we can use the full custom signal pad
        signal_pad.fill_(0)
        signal_pad[0] = 42
        self.assertEqual(signal_pad[0].item(), 42)

        # Restore original settings
        symm_mem.set_signal_pad_size(original_size)

    def test_get_signal_pad(self) -> None:
        self._init_process()

        t = symm_mem.empty(1, device="cpu")
        symm_mem_hdl = symm_mem.rendezvous(t, group=dist.group.WORLD)
        peer_rank = (self.rank + 1) % self.world_size

        signal_pad = symm_mem_hdl.get_signal_pad(self.rank)
        self.assertEqual(signal_pad.data_ptr(), symm_mem_hdl.signal_pad_ptrs[symm_mem_hdl.rank])

        signal_pad = symm_mem_hdl.get_signal_pad(peer_rank)
        self.assertEqual(signal_pad.dtype, torch.uint32)
        self.assertEqual(signal_pad.numel(), symm_mem_hdl.signal_pad_size // 4)

        # Only specify sizes
        signal_pad = symm_mem_hdl.get_signal_pad(peer_rank, (8, 8))
        self.assertEqual(signal_pad.dtype, torch.uint32)
        self.assertEqual(signal_pad.numel(), 64)

        # Only specify dtype
        signal_pad = symm_mem_hdl.get_signal_pad(peer_rank, dtype=torch.uint64)
        self.assertEqual(signal_pad.dtype, torch.uint64)
        self.assertEqual(signal_pad.numel(), symm_mem_hdl.signal_pad_size // 8)

        # Specify both sizes and dtype
        signal_pad = symm_mem_hdl.get_signal_pad(peer_rank, (8, 8), dtype=torch.uint64)
        self.assertEqual(signal_pad.dtype, torch.uint64)
        self.assertEqual(signal_pad.numel(), 64)

        # Sanity check that writes to buffer doesn't corrupt signal_pad
        t = symm_mem.empty(1, device="cpu")
        symm_mem_hdl = symm_mem.rendezvous(t, group=dist.group.WORLD)
        signal_pad = symm_mem_hdl.get_signal_pad(self.rank)
        signal_pad.fill_(42)
        t.fill_(0)
        self.assertTrue(signal_pad.eq(42).all())

    def test_low_contention_all_gather(self, symm_mem_input: bool) -> None:
        self._init_process()

        if symm_mem_input:
            t = _SymmetricMemory.empty_strided_p2p(
                size=(64, 64),
                stride=(64, 1),
                dtype=torch.float32,
                device=self.device,
                group_name="0",
            ).fill_(self.rank)
        else:
            t = torch.full((64, 64), self.rank, dtype=torch.float32, device=self.device)

        res = torch.ops.symm_mem._low_contention_all_gather(t, "0")
        res = torch.ops._c10d_functional.wait_tensor(res)
        self.assertEqual(res.shape, (64 * self.world_size, 64))

        chunks = res.chunk(self.world_size)
        for r in range(self.world_size):
            self.assertTrue(chunks[r].eq(r).all())

    def test_low_contention_reduce_scatter(self, reduce_op: str, symm_mem_input: bool) -> None:
        self._init_process()

        if symm_mem_input:
            t = _SymmetricMemory.empty_strided_p2p(
                size=(64, 64),
                stride=(64, 1),
                dtype=torch.float32,
                device=self.device,
                group_name="0",
            )
        else:
            t = torch.empty((64, 64), dtype=torch.float32, device=self.device)

        chunks = t.chunk(self.world_size)
        for r in range(self.world_size):
            chunks[r].fill_(r)

        res = torch.ops.symm_mem._low_contention_reduce_scatter(t, reduce_op, "0")
        res = torch.ops._c10d_functional.wait_tensor(res)
        self.assertEqual(res.shape, (64 // self.world_size, 64))

        if reduce_op == "sum":
            expect = self.rank * self.world_size
        elif reduce_op == "avg":
            expect = self.rank
        else:
            raise AssertionError(f"Unexpected reduce_op: {reduce_op}")
        self.assertTrue(res.eq(expect).all())

    def test_subgroup(self) -> None:
        self._init_process()

        ranks = list(range(self.world_size))
        subgroup_0 = dist.new_group(ranks[: len(ranks) // 2])
        subgroup_1 = dist.new_group(ranks[len(ranks) // 2 :])

        world = dist.group.WORLD
        subgroup = subgroup_0 if world.rank() < world.size() // 2 else subgroup_1

        t = symm_mem.empty(64, device="cpu")
        symm_mem_world = symm_mem.rendezvous(t, group=world)
        symm_mem_subgroup = symm_mem.rendezvous(t, group=subgroup)

        self.assertEqual(symm_mem_world.world_size, world.size())
        self.assertEqual(symm_mem_world.rank, world.rank())
        self.assertEqual(symm_mem_subgroup.world_size, world.size() // 2)
        self.assertEqual(symm_mem_subgroup.rank, world.rank() % subgroup.size())

        t.fill_(world.rank())
        symm_mem_world.barrier()

        # Observe a peer buffer via the world group
        peer_rank = (world.rank() + 1) % world.size()
        buf = symm_mem_world.get_buffer(peer_rank, (64,), torch.float32)
        self.assertTrue(buf.eq(peer_rank).all())

        # Observe a peer buffer via the subgroup
        peer_rank = (subgroup.rank() + 1) % subgroup.size()
        buf = symm_mem_subgroup.get_buffer(peer_rank, (64,), torch.float32)
        if world.rank() < world.size() // 2:
            self.assertTrue(buf.eq(peer_rank).all())
        else:
            self.assertTrue(buf.eq(peer_rank + world.size() // 2).all())

    def test_rendezvous_after_strict_subgroup(self) -> None:
        self._init_process()

        world = dist.group.WORLD
        subgroup = dist.new_group(list(range(world.size() - 1)))

        t0 = symm_mem.empty(64, device="cpu")
        if world.rank() < world.size() - 1:
            symm_mem.rendezvous(t0, group=subgroup)

        t1 = symm_mem.empty(64, device="cpu")
        hdl = symm_mem.rendezvous(t1, group=world)
        self.assertEqual(hdl.world_size, world.size())
        self.assertEqual(hdl.rank, world.rank())

        t1.fill_(world.rank())
        hdl.barrier()
        peer_rank = (world.rank() + 1) % world.size()
        buf = hdl.get_buffer(peer_rank, (64,), torch.float32)
        self.assertTrue(buf.eq(peer_rank).all())

    def test_rendezvous_on_overlapping_subgroups(self) -> None:
        self._init_process()

        ranks = list(range(self.world_size))
        group_a = dist.new_group(ranks[0:2])
        group_b = dist.new_group(ranks[1:3])
        rank = dist.group.WORLD.rank()

        t_a = symm_mem.empty(64, device="cpu")
        if rank in ranks[0:2]:
            symm_mem.rendezvous(t_a, group=group_a)

        t_b = symm_mem.empty(64, device="cpu")
        if rank in ranks[1:3]:
            t_b.fill_(rank)
            hdl = symm_mem.rendezvous(t_b, group=group_b)
            hdl.barrier()
            peer = (hdl.rank + 1) % hdl.world_size
            buf = hdl.get_buffer(peer, (64,), torch.float32)
            self.assertTrue(buf.eq(ranks[1:3][peer]).all())

    def test_dispatcher_torchbind_symmetric_memory(self) -> None:
        self._init_process()
        group_name = dist.group.WORLD.group_name

        dtype = torch.float
        numel = 1024
        t = symm_mem.empty(numel, dtype=dtype, device=self.device)

        # Exercise dispatcher schema that returns a TorchBind
        # SymmetricMemory object (__torch__.torch.classes.c10d.SymmetricMemory).
        sm = torch.ops.symm_mem._rendezvous(t, group_name)
        # Exercise dispatcher schema that accepts a TorchBind
        # SymmetricMemory object (__torch__.torch.classes.c10d.SymmetricMemory).
        torch.ops.symm_mem._barrier(sm)


class AsyncTPTest(RankTest):
    def _init_process(self):
        torch.manual_seed(42 + self.rank)
        torch.use_deterministic_algorithms(True)
        torch.set_deterministic_debug_mode("warn")
        torch.utils.deterministic.fill_uninitialized_memory = True

    def tearDown(self) -> None:
        torch.use_deterministic_algorithms(False)
        torch.set_deterministic_debug_mode("default")
        super().tearDown()

    def test_fused_all_gather_matmul(self, gather_dim: int) -> None:
        self._init_process()

        BATCH = 8
        M = 64
        N = 16
        K = 32
        group = dist.group.WORLD
        rank = self.rank

        torch.manual_seed(42 + rank)
        A_shard_shape = [BATCH, M, K]
        A_shard_shape[gather_dim] //= self.world_size

        A_shard = torch.rand(A_shard_shape, device="cpu")
        Bs = [torch.rand(K, N, device="cpu") for _ in range(3)]

        ag_output_0, mm_outputs_0 = _fused_all_gather_matmul_fallback(
            A_shard, Bs, gather_dim=gather_dim, group_name=group.group_name
        )
        ag_output_1, mm_outputs_1 = torch.ops.symm_mem.fused_all_gather_matmul(
            A_shard, Bs, gather_dim=gather_dim, group_name=group.group_name
        )

        if not torch.allclose(ag_output_0, ag_output_1):
            raise AssertionError("Expected ag_output_0 to be close to ag_output_1")
        if not (ag_output_0.stride() == ag_output_1.stride()):
            raise AssertionError(f"Expected strides to match: {ag_output_0.stride()} vs {ag_output_1.stride()}")
        for mm_output_0, mm_output_1 in zip(mm_outputs_0, mm_outputs_1):
            if not torch.allclose(mm_output_0, mm_output_1):
                raise AssertionError("Expected mm_output_0 to be close to mm_output_1")
            if not mm_output_0.stride():
                raise AssertionError(f"Expected mm_output_0.stride() to be truthy, got {mm_output_0.stride()}")

    def test_fused_matmul_reduce_scatter(self, scatter_dim: int) -> None:
        self._init_process()

        BATCH = 8
        M = 64
        N = 16
        K = 1024
        group = dist.group.WORLD
        rank = self.rank

        torch.manual_seed(42 + rank)
        A = torch.rand(BATCH, M, K, device="cpu")
        B = torch.rand(K, N, device="cpu")

        output_0 = _fused_matmul_reduce_scatter_fallback(
            A, B, "avg", scatter_dim=scatter_dim, group_name=group.group_name
        )
        output_1 = torch.ops.symm_mem.fused_matmul_reduce_scatter(
            A, B, "avg", scatter_dim=scatter_dim, group_name=group.group_name
        )

        if not torch.allclose(output_0, output_1):
            raise AssertionError("Expected output_0 to be close to output_1")
        if not (output_0.stride() == output_1.stride()):
            raise AssertionError(f"Expected strides to match: {output_0.stride()} vs {output_1.stride()}")

    def test_fused_matmul_reduce_scatter_bfloat16_custom_reduce(self) -> None:
        self._init_process()

        M = 64
        N = 32
        K = 1024
        group = dist.group.WORLD
        rank = self.rank

        torch.manual_seed(42 + rank)
        A = torch.rand(M, K, device="cpu", dtype=torch.bfloat16)
        B = torch.rand(K, N, device="cpu", dtype=torch.bfloat16)

        output_0 = _fused_matmul_reduce_scatter_fallback(A, B, "avg", scatter_dim=0, group_name=group.group_name)
        output_1 = torch.ops.symm_mem.fused_matmul_reduce_scatter(
            A, B, "avg", scatter_dim=0, group_name=group.group_name
        )

        torch.testing.assert_close(output_0, output_1, rtol=1e-2, atol=1e-2)
        self.assertEqual(output_0.stride(), output_1.stride())

    def test_fused_scaled_matmul_reduce_scatter(self, scatter_dim: int, rowwise: bool) -> None:
        self._init_process()

        BATCH = 8
        M = 64
        N = 16
        K = 32
        group = dist.group.WORLD
        rank = self.rank

        torch.manual_seed(42 + rank)
        A = torch.rand(BATCH, M, K, device="cpu").to(torch.float8_e4m3fn)
        B = torch.rand(N, K, device="cpu").to(torch.float8_e4m3fn).T

        if rowwise:
            A_scale = torch.full((BATCH, M, 1), 0.1, device="cpu")
            B_scale = torch.full((1, N), 0.1, device="cpu")
        else:
            A_scale = torch.tensor(0.1, device="cpu")
            B_scale = torch.tensor(0.1, device="cpu")

        output_shape = [*A.shape[:-1], B.shape[1]]

        outputs = []
        for context in test_contexts:
            with context():
                outputs.append(
                    torch.ops.symm_mem.fused_scaled_matmul_reduce_scatter(
                        A,
                        B,
                        A_scale,
                        B_scale,
                        "avg",
                        scatter_dim,
                        scatter_dim,
                        group.group_name,
                        output_shape,
                        out_dtype=torch.bfloat16,
                    )
                )

        if not (outputs[0].stride() == outputs[1].stride()):
            raise AssertionError(f"Expected strides to match: {outputs[0].stride()} vs {outputs[1].stride()}")
        self.assertEqual(outputs[0], outputs[1])

    def test_optimal_layout(self, dim: int) -> None:
        t = torch.rand(8, 64, 32, 16)

        x = restride_A_shard_for_fused_all_gather_matmul(t, dim)
        self.assertTrue(x.movedim(dim, 0).is_contiguous())
        self.assertTrue(torch.allclose(x, t))

        x = restride_A_for_fused_matmul_reduce_scatter(t, dim)
        self.assertTrue(x.movedim(dim, 0).is_contiguous())
        self.assertTrue(torch.allclose(x, t))


class SymmMemEmptySetDeviceTest(RankTest):
    def _get_test_alloc_args(self):
        shape = (64, 64)
        stride = (64, 1)
        dtype = torch.float32
        device = self.device
        return (shape, stride, dtype, device)

    def _verify_symmetric_memory(self, symm_mem_hdl):
        self.assertEqual(symm_mem_hdl.world_size, self.world_size)

        buf = symm_mem_hdl.get_buffer(0, (symm_mem_hdl.buffer_size // 4,), torch.float32)
        self.assertEqual(buf.storage_offset(), 0)
        self.assertEqual(buf.untyped_storage().size(), symm_mem_hdl.buffer_size)

        if symm_mem_hdl.rank == 0:
            symm_mem_hdl.wait_signal(src_rank=1)
            self.assertTrue(buf.eq(42).all())
        else:
            buf.fill_(42)
            symm_mem_hdl.put_signal(dst_rank=0)

        symm_mem_hdl.barrier()

        if symm_mem_hdl.rank == 0:
            symm_mem_hdl.barrier()
            self.assertTrue(buf.eq(43).all())
        else:
            buf.fill_(43)
            symm_mem_hdl.barrier()

        symm_mem_hdl.barrier()

    def test_empty_strided_p2p(self) -> None:
        torch.manual_seed(42 + self.rank)
        group_name = dist.group.WORLD.group_name

        alloc_args = self._get_test_alloc_args()

        t = torch.empty((64, 64), device=self.device)
        self.assertIsNone(_SymmetricMemory.rendezvous(t))

        t = _SymmetricMemory.empty_strided_p2p(*alloc_args, group_name=group_name)
        symm_mem_hdl = _SymmetricMemory.rendezvous(t)

        del t
        self._verify_symmetric_memory(symm_mem_hdl)

    def test_empty_strided_p2p_persistent(self) -> None:
        torch.manual_seed(42 + self.rank)
        group_name = dist.group.WORLD.group_name

        alloc_args = self._get_test_alloc_args()

        alloc_id = 42 + random.randint(0, 2147483647)
        t = _SymmetricMemory.empty_strided_p2p(*alloc_args, group_name=group_name, alloc_id=alloc_id)
        data_ptr = t.data_ptr()

        # Verify that persistent allocation would fail if there's an active
        # allocation with the same alloc_id.
        with self.assertRaises(RuntimeError):
            _SymmetricMemory.empty_strided_p2p(*alloc_args, group_name=group_name, alloc_id=alloc_id)

        # Verify that persistent allocation would succeed in lieu of activate
        # allocations with the same alloc_id, and the returned tensor would
        # have the same data pointer.
        del t
        t = _SymmetricMemory.empty_strided_p2p(*alloc_args, group_name=group_name, alloc_id=alloc_id)
        self.assertEqual(t.data_ptr(), data_ptr)

        symm_mem_hdl = _SymmetricMemory.rendezvous(t)
        self._verify_symmetric_memory(symm_mem_hdl)


class SymmMemNegativeTest(RankTest):
    def test_barrier_timeout(self) -> None:
        t = symm_mem.empty(1, device="cpu")
        symm_mem_hdl = symm_mem.rendezvous(t, group=dist.group.WORLD)

        if self.rank == 0:
            with self.assertRaises(RuntimeError):
                symm_mem_hdl.barrier(timeout_ms=1000)

    def test_put_signal_timeout(self) -> None:
        t = symm_mem.empty(1, device="cpu")
        symm_mem_hdl = symm_mem.rendezvous(t, group=dist.group.WORLD)

        if self.rank == 0:
            with self.assertRaises(RuntimeError):
                # First, put a signal into rank 1's signal pad. Since rank 1
                # doesn't wait on this signal, the subsequent put will timeout.
                symm_mem_hdl.put_signal(dst_rank=1)
                symm_mem_hdl.put_signal(dst_rank=1, timeout_ms=1000)

    def test_wait_signal_timeout(self) -> None:
        t = symm_mem.empty(1, device="cpu")
        symm_mem_hdl = symm_mem.rendezvous(t, group=dist.group.WORLD)

        if self.rank == 0:
            with self.assertRaises(RuntimeError):
                symm_mem_hdl.wait_signal(src_rank=1, timeout_ms=1000)

    def test_barrier_channel_out_of_bounds(self) -> None:
        t = symm_mem.empty(64, device="cpu")
        symm_mem_hdl = symm_mem.rendezvous(t, group=dist.group.WORLD)

        num_slots = symm_mem_hdl.signal_pad_size // 4
        max_channel = num_slots // self.world_size

        # channel == max_channel must be rejected
        with self.assertRaisesRegex(RuntimeError, "maximum supported channel"):
            symm_mem_hdl.barrier(channel=max_channel)

        # channel == max_channel - 1 must be accepted
        if max_channel > 1:
            symm_mem_hdl.barrier(channel=max_channel - 1)

    def test_put_wait_signal_channel_out_of_bounds(self) -> None:
        t = symm_mem.empty(64, device="cpu")
        symm_mem_hdl = symm_mem.rendezvous(t, group=dist.group.WORLD)

        num_slots = symm_mem_hdl.signal_pad_size // 4
        max_channel = num_slots // self.world_size
        peer = (self.rank + 1) % self.world_size

        # An over-capacity channel would write past the signal pad, into the
        # peer's tensor data (see #191618). Both ops must reject it host-side.
        with self.assertRaisesRegex(RuntimeError, "maximum supported channel"):
            symm_mem_hdl.put_signal(dst_rank=peer, channel=max_channel)
        with self.assertRaisesRegex(RuntimeError, "maximum supported channel"):
            symm_mem_hdl.wait_signal(src_rank=peer, channel=max_channel)

        # The boundary channel is accepted: ring-exchange a signal on it.
        src = (self.rank - 1) % self.world_size
        symm_mem_hdl.put_signal(dst_rank=peer, channel=max_channel - 1)
        symm_mem_hdl.wait_signal(src_rank=src, channel=max_channel - 1)

    def test_put_wait_signal_rank_out_of_bounds(self) -> None:
        t = symm_mem.empty(64, device="cpu")
        symm_mem_hdl = symm_mem.rendezvous(t, group=dist.group.WORLD)

        # An out-of-range rank indexes a wild signal pad pointer (put_signal)
        # or a slot past the signal pad, in the tensor data (wait_signal).
        # get_signal_pad wraps the wild pointer in a tensor handed to the user.
        for bad_rank in (-1, self.world_size):
            with self.assertRaisesRegex(RuntimeError, r"must be in \[0"):
                symm_mem_hdl.put_signal(dst_rank=bad_rank)
            with self.assertRaisesRegex(RuntimeError, r"must be in \[0"):
                symm_mem_hdl.wait_signal(src_rank=bad_rank)
            with self.assertRaisesRegex(RuntimeError, r"must be in \[0"):
                symm_mem_hdl.get_signal_pad(bad_rank)


class SymmMemCollectiveTest(RankTest):
    def _init_process(self):
        torch.manual_seed(42 + self.rank)

    def test_one_shot_all_reduce(self) -> None:
        self._init_process()
        group_name = dist.group.WORLD.group_name

        for dtype, size_bytes, align_bytes, copy, offset in itertools.product(
            [torch.float, torch.bfloat16],
            [4, 8192, 8196],
            [8],
            [True, False],
            [0, 16],
        ):
            inp = symm_mem.empty(size_bytes // dtype.itemsize + offset, dtype=dtype, device=self.device)
            symm_mem.rendezvous(inp, group=group_name)
            if not copy:
                inp.normal_()
                res = torch.ops.symm_mem.one_shot_all_reduce(inp[offset:], "sum", group_name)
            if copy:
                local_inp = torch.randn_like(inp[offset:])
                res = torch.ops.symm_mem.one_shot_all_reduce_copy(inp[offset:], local_inp, "sum", group_name)
            self._verify_all_reduce_result(local_inp if copy else inp[offset:], res)

    def test_two_shot_all_reduce(self) -> None:
        self._init_process()
        group_name = dist.group.WORLD.group_name

        for dtype, size_bytes, align_bytes, inplace in itertools.product(
            [torch.float, torch.bfloat16],
            [4, 8192, 8196],
            [8],
            [True, False],
        ):
            t = symm_mem.empty(16384, dtype=dtype, device=self.device).fill_(0)
            symm_mem.rendezvous(t, group=group_name)

            self.assertTrue(t.data_ptr() % 16 == 0)
            self.assertTrue(align_bytes % t.element_size() == 0)
            self.assertTrue(size_bytes % t.element_size() == 0)

            shift = align_bytes // t.element_size()
            numel = size_bytes // t.element_size()
            res = t[shift : shift + numel]
            res.normal_()
            inp = res.clone()
            if not inplace:
                out = torch.empty_like(inp)
                torch.ops.symm_mem.two_shot_all_reduce_out(res, "sum", group_name, out)
            else:
                torch.ops.symm_mem.two_shot_all_reduce_(res, "sum", group_name)

            # Head and tail should not be written
            self.assertTrue(t[:shift].eq(0).all().item())
            self.assertTrue(t[shift + numel :].eq(0).all().item())
            self._verify_all_reduce_result(inp, res if inplace else out)

    def _verify_all_reduce_result(self, inp, res):
        gathered_res = all_gather_single(res, 0, "0").view(self.world_size, -1)
        # Verify that the results across ranks are identical
        self.assertEqual((gathered_res == gathered_res[0, :]).all(dim=0).sum(), inp.numel())

        # Verify that the result are close to the sum of inputs across ranks
        gathered_inps = all_gather_single(inp, 0, "0").view(self.world_size, -1)
        torch.testing.assert_close(gathered_inps.sum(dim=0), res, rtol=1e-01, atol=1e-01)

    def test_reduce_scatter(self) -> None:
        self._init_process()
        group_name = dist.group.WORLD.group_name

        for dtype, size_bytes, align_bytes, split_last_dim in itertools.product(
            [torch.float, torch.bfloat16],
            [128, 8192, 36 * 1024 * 16],
            [8],
            [True, False],
        ):
            t = symm_mem.empty(36 * 1024 * 16, dtype=dtype, device=self.device).fill_(0)
            symm_mem.rendezvous(t, group=group_name)

            self.assertTrue(t.data_ptr() % 16 == 0)
            self.assertTrue(align_bytes % t.element_size() == 0)
            self.assertTrue(size_bytes % t.element_size() == 0)

            shift = align_bytes // t.element_size()
            numel = size_bytes // t.element_size()
            res = t[shift : shift + numel].normal_()
            if split_last_dim:
                res = res.view(-1, 128 // t.element_size())
            inp = res.clone()
            out_size = list(inp.shape)
            out_size[-1] = inp.shape[-1] // self.world_size
            out = torch.empty(out_size, dtype=dtype, device=self.device)
            torch.ops.symm_mem.reduce_scatter_out(res, group_name, split_last_dim, out)

            # Head and tail should not be written
            self.assertTrue(t[:shift].eq(0).all().item())
            self.assertTrue(t[shift + numel :].eq(0).all().item())
            self._verify_reduce_scatter_result(inp, out)

    def test_reduce_scatter_corner_cases(self) -> None:
        self._init_process()
        dtype = torch.bfloat16
        group_name = dist.group.WORLD.group_name
        t = symm_mem.empty(16384, dtype=dtype, device=self.device).fill_(0)
        symm_mem.rendezvous(t, group=group_name)
        res = t[:0]
        out_size = res.shape[0] // self.world_size
        out = torch.empty(out_size, dtype=dtype, device=self.device)
        torch.ops.symm_mem.reduce_scatter_out(res, group_name, False, out)
        res = t[:48]
        out_size = res.shape[0] // self.world_size
        out = torch.empty(out_size, dtype=dtype, device=self.device)
        with self.assertRaisesRegex(RuntimeError, "divisible"):
            torch.ops.symm_mem.reduce_scatter_out(res, group_name, False, out)
        res = t[: 2 * 48].view(2, 48)
        out = torch.empty(2, 48 // self.world_size, dtype=dtype, device=self.device)
        with self.assertRaisesRegex(RuntimeError, "divisible"):
            torch.ops.symm_mem.reduce_scatter_out(res, group_name, True, out)

    def _verify_reduce_scatter_result(self, inp, res):
        gathered_res = all_gather_single(res, 0, "0").view(self.world_size, *res.shape)
        gathered_inps = all_gather_single(inp, 0, "0").view(self.world_size, *inp.shape)
        sum_inps = gathered_inps.sum(0)
        slice_width = sum_inps.shape[-1] // self.world_size
        for i in range(self.world_size):
            torch.testing.assert_close(
                gathered_res[i],
                sum_inps[..., i * slice_width : (i + 1) * slice_width],
                rtol=1e-01,
                atol=1.1e-01,
            )


class SymmMemSingleProcTest(RankTest):
    def test_stream_write_value32(self):
        tensor = torch.zeros(4, dtype=torch.uint32, device="cpu")
        expect = torch.tril(torch.ones(4, 4, device="cpu")).to(torch.uint32)

        for i in range(4):
            _SymmetricMemory.stream_write_value32(tensor, i, 1)
            torch.testing.assert_close(tensor, expect[i])

        with self.assertRaises(RuntimeError):
            _SymmetricMemory.stream_write_value32(tensor, offset=-1, val=1)

        with self.assertRaises(RuntimeError):
            _SymmetricMemory.stream_write_value32(tensor, offset=0, val=4294967296)

    def test_memset32(self):
        t = _SymmetricMemory.empty_strided_p2p(
            (64,),
            (1,),
            dtype=torch.uint32,
            device=torch.device("cpu"),
            group_name="0",
        ).fill_(0)

        _SymmetricMemory.memset32(t, offset=32, val=1, count=16)
        self.assertTrue(t[:32].eq(0).all())
        self.assertTrue(t[32:48].eq(1).all())
        self.assertTrue(t[48:].eq(0).all())

        with self.assertRaisesRegex(RuntimeError, "input must be a flat, contiguous uint32 tensor"):
            _SymmetricMemory.memset32(t.view(8, 8), offset=0, val=1, count=1)

        with self.assertRaisesRegex(RuntimeError, "input must be a flat, contiguous uint32 tensor"):
            _SymmetricMemory.memset32(t.view(torch.float32), offset=0, val=1, count=1)

        with self.assertRaisesRegex(RuntimeError, "offset must be greater than or equal to 0"):
            _SymmetricMemory.memset32(t, offset=-1, val=1, count=1)

        with self.assertRaisesRegex(RuntimeError, r"val must be in the range of.*\(uint32_t\)"):
            _SymmetricMemory.memset32(t, offset=0, val=4294967296, count=1)

        with self.assertRaisesRegex(RuntimeError, "count must be a positive integer"):
            _SymmetricMemory.memset32(t, offset=0, val=1, count=-1)

        with self.assertRaisesRegex(RuntimeError, "count must be a positive integer"):
            _SymmetricMemory.memset32(t, offset=0, val=1, count=0)

        with self.assertRaisesRegex(RuntimeError, r"offset \+ count.*exceeded the numel of the input"):
            _SymmetricMemory.memset32(t, offset=64, val=1, count=1)

        with self.assertRaisesRegex(RuntimeError, r"offset \+ count.*exceeded the numel of the input"):
            _SymmetricMemory.memset32(t, offset=0, val=1, count=65)

        _SymmetricMemory.memset32(t, offset=0, val=1, count=64)
        _SymmetricMemory.memset32(t, offset=63, val=1, count=1)


class SymmMemPoolTest(RankTest):
    def test_symm_mem_empty_storage_reuse(self):
        """symm_mem.empty() reuses storage across alloc/free cycles (here: the persistent allocation's cache)."""
        torch.manual_seed(42 + self.rank)

        size = (1024,)
        stride = (1,)
        alloc_id = 13 + random.randint(0, 2147483647)
        dtype = torch.float

        # We must use the alloc_id argument to guarantee the reuse of previously
        # allocated memory
        t1 = _SymmetricMemory.empty_strided_p2p(size, stride, dtype=dtype, device=self.device, alloc_id=alloc_id)
        ptr1 = t1.data_ptr()
        del t1

        t2 = _SymmetricMemory.empty_strided_p2p(size, stride, dtype=dtype, device=self.device, alloc_id=alloc_id)
        ptr2 = t2.data_ptr()

        self.assertEqual(
            ptr1,
            ptr2,
            "symm_mem.empty() should reuse the same storage block via the implicit MemPool",
        )


# (class, test, parameters, fewest ranks): the ranks torch asks for (skip_if_lt_x_gpu), 2 where it asks for none.
_TESTS = [
    ("SymmetricMemoryTest", "test_has_multicast_support", {}, 2),
    ("SymmetricMemoryTest", "test_is_symm_mem_tensor", {}, 2),
    ("SymmetricMemoryTest", "test_get_backend", {}, 2),
    ("SymmetricMemoryTest", "test_get_signal_pad_size", {}, 2),
    ("SymmetricMemoryTest", "test_set_signal_pad_size", {}, 2),
    ("SymmetricMemoryTest", "test_set_signal_pad_size_with_allocation", {}, 2),
    ("SymmetricMemoryTest", "test_get_signal_pad", {}, 2),
    *[("SymmetricMemoryTest", "test_low_contention_all_gather", {"symm_mem_input": s}, 2) for s in (True, False)],
    *[("SymmetricMemoryTest", "test_low_contention_reduce_scatter", {"reduce_op": op, "symm_mem_input": s}, 2)
      for op in ("sum", "avg") for s in (True, False)],
    ("SymmetricMemoryTest", "test_subgroup", {}, 4),
    ("SymmetricMemoryTest", "test_rendezvous_after_strict_subgroup", {}, 3),
    ("SymmetricMemoryTest", "test_rendezvous_on_overlapping_subgroups", {}, 3),
    ("SymmetricMemoryTest", "test_dispatcher_torchbind_symmetric_memory", {}, 2),
    *[("AsyncTPTest", "test_fused_all_gather_matmul", {"gather_dim": d}, 2) for d in (0, 1, 2)],
    *[("AsyncTPTest", "test_fused_matmul_reduce_scatter", {"scatter_dim": d}, 2) for d in (0, 1, 2)],
    ("AsyncTPTest", "test_fused_matmul_reduce_scatter_bfloat16_custom_reduce", {}, 2),
    *[("AsyncTPTest", "test_fused_scaled_matmul_reduce_scatter", {"scatter_dim": d, "rowwise": r}, 2)
      for d in (0, 1) for r in (True, False)],
    *[("AsyncTPTest", "test_optimal_layout", {"dim": d}, 2) for d in (0, 1, 2)],
    ("SymmMemEmptySetDeviceTest", "test_empty_strided_p2p", {}, 2),
    ("SymmMemEmptySetDeviceTest", "test_empty_strided_p2p_persistent", {}, 2),
    ("SymmMemNegativeTest", "test_barrier_timeout", {}, 2),
    ("SymmMemNegativeTest", "test_put_signal_timeout", {}, 2),
    ("SymmMemNegativeTest", "test_wait_signal_timeout", {}, 2),
    ("SymmMemNegativeTest", "test_barrier_channel_out_of_bounds", {}, 2),
    ("SymmMemNegativeTest", "test_put_wait_signal_channel_out_of_bounds", {}, 2),
    ("SymmMemNegativeTest", "test_put_wait_signal_rank_out_of_bounds", {}, 2),
    ("SymmMemCollectiveTest", "test_one_shot_all_reduce", {}, 4),
    ("SymmMemCollectiveTest", "test_two_shot_all_reduce", {}, 4),
    ("SymmMemCollectiveTest", "test_reduce_scatter", {}, 4),
    ("SymmMemCollectiveTest", "test_reduce_scatter_corner_cases", {}, 4),
    ("SymmMemSingleProcTest", "test_stream_write_value32", {}, 2),
    ("SymmMemSingleProcTest", "test_memset32", {}, 2),
    ("SymmMemPoolTest", "test_symm_mem_empty_storage_reuse", {}, 2),
]


def _id(case: tuple) -> str:
    cls, test, params, _ = case
    suffix = "".join(f"_{k}_{v}" for k, v in params.items())
    return f"{cls}.{test}{suffix}"


@pytest.mark.parametrize("case,nranks", [(case, n) for n in (2, 4) for case in _TESTS if n >= case[3]],
                         ids=lambda value: _id(value) if isinstance(value, tuple) else f"{value}ranks")
def test_torch_symmetric_memory(world_factory, case: tuple, nranks: int) -> None:
    cls, test, params, _ = case
    run_case(world_factory(nranks, ENV), run_method, __name__, cls, test, params, timeout=120)
