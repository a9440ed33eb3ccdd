"""The user API on MindSpore, on 2 and 4 real ranks (msrun, mccl on CPU), host device.

One msrun job per rank count runs every case of ms_cases.py (MindSpore's start-up costs seconds); each test checks
every rank's record of one case.
"""

from __future__ import annotations

import os

import pytest

import ms_job

_HERE = os.path.dirname(os.path.abspath(__file__))
_ENV = {"HYPER_PARALLEL_SHMEM_HEAP_SIZE": "64M", "HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "5"}
RANKS = (2, 4)
# The 4-rank job sizes its heap with seed 004's alias instead of the runtime's variable.
_HEAP = {2: ("HYPER_PARALLEL_SHMEM_HEAP_SIZE", 64 << 20), 4: ("SYMMETRIC_MEMORY_HEAP_SIZE", 32 << 20)}


@pytest.fixture(scope="module", params=RANKS, ids=[f"{n}ranks" for n in RANKS])
def job(request):
    nranks = request.param
    variable, size = _HEAP[nranks]
    env = {"HYPER_PARALLEL_SHMEM_TIMEOUT_SEC": "5", variable: str(size)}
    result = ms_job.run(os.path.join(_HERE, "ms_cases.py"), nranks, timeout=400, env=env)
    return nranks, result


def test_heap_size_from_either_variable(job):
    nranks = job[0]
    for res in records(job, "heap_size_from_the_environment"):
        assert res["heap_size"] == _HEAP[nranks][1]


def records(job, name: str) -> list:
    """Every rank's result of case ``name``; fails with the rank's traceback when a rank raised."""
    nranks, result = job
    recs = result.case(name, nranks)
    for rank, rec in enumerate(recs):
        assert rec["ok"], f"rank {rank} raised in {name}: {rec['error']}\n{rec['traceback']}"
    return [rec["result"] for rec in recs]


def all_true(results: list, keys=None) -> None:
    for rank, res in enumerate(results):
        for key in keys or res:
            assert res[key] is True, f"rank {rank}: {key} = {res[key]!r}"


def test_empty_and_free(job):
    for res in records(job, "empty_and_free"):
        # allocations are reserved in 64-byte granules (the runtime face's alignment)
        assert res["float32"] == {"shape": [4, 8], "dtype": "Float32", "freed_bytes": 128}
        assert res["bfloat16"]["freed_bytes"] == 64 and res["int64"]["freed_bytes"] == 128
        assert res["bfloat16"]["dtype"] == "BFloat16" and res["bfloat16"]["shape"] == [16]
        assert res["int64"]["shape"] == [3, 5] and res["int8"]["shape"] == [7]
        assert res["default_dtype"] == "Float32"
        assert res["double_free"]["type"] == "ValueError"
        assert "must be a tensor from symm.empty (not freed yet)" in res["double_free"]["message"]
        assert res["free_ordinary"]["type"] == "ValueError"
        assert res["bad_shape"] == {"type": "ValueError", "message":
                                    "`shape` must have non-negative dimensions, but got (2, -1)",
                                    "mro": res["bad_shape"]["mro"]}
        assert res["bad_dtype"]["type"] == "TypeError" and "`dtype` must be one of" in res["bad_dtype"]["message"]


def test_allocation_mismatch_fails_on_every_rank_and_leaves_nothing(job):
    for res in records(job, "allocation_mismatch"):
        assert res["error"]["type"] == "ShmemMismatchError", res["error"]
        assert "RuntimeError" in res["error"]["mro"]
        assert res["active"] == 0


def test_put_get_ring(job):
    all_true(records(job, "put_get_ring"))


def test_seed_example_one(job):
    results = records(job, "example_one_put_with_signal")
    assert results[1]["consumer_ok"] is True


def test_signals(job):
    for res in records(job, "signal_ops_and_compares"):
        assert res["timeout"]["type"] == "ShmemTimeoutError", res["timeout"]
        assert "observed=0" in res["timeout"]["message"] or "observed 0" in res["timeout"]["message"], res["timeout"]


def test_bad_primitive_arguments(job):
    nranks = job[0]
    for res in records(job, "bad_primitive_arguments"):
        assert res["not_tensor"]["message"] == "`target` must be a mindspore.Tensor, but got list"
        assert res["past_end"]["message"] == "`target_offset + size` must be at most target.numel() (16), but got 10 + 8 = 18"
        assert res["negative"]["message"] == "`target_offset` must be non-negative, but got -1"
        assert res["dtype"]["type"] == "TypeError"
        assert res["dtype"]["message"] == "`src` must have the dtype of `target` (Float32), but got Float64"
        assert res["rank"]["message"] == f"`target_rank` must be in [0, {nranks}), but got {nranks}"
        assert res["signal_op"]["message"] == "`signal_op` must be one of 0 (SET), 1 (ADD), but got 7"
        assert res["compare_op"]["message"].startswith("`compare_op` must be one of 0 (EQ), 1 (GT), 2 (LT)")
        assert res["signal_dtype"]["message"] == ("`signal` must have dtype mindspore.int32 or mindspore.int64, but "
                                                  "got Float32")
        assert res["ordinary_target"]["type"] in ("ShmemValueError", "ValueError"), res["ordinary_target"]
        assert "symmetric" in res["ordinary_target"]["message"] or "allocation" in res["ordinary_target"]["message"]
        assert res["float_offset"]["type"] == "TypeError"
        assert res["tensor_offset_2"]["type"] == "TypeError"
        assert res["depend_tensor"]["message"] == "`depend_tensor` must be a mindspore.Tensor or None, but got list"
        assert res["untouched"] is True


def test_all_gather(job):
    for res in records(job, "all_gather"):
        for key, value in res.items():
            if key.endswith("mismatch"):
                continue
            assert value is True, key
        assert res["size_mismatch"]["type"] == "ValueError"
        assert res["size_mismatch"]["message"].startswith("`output_tensor.numel()` must be ")
        assert res["dtype_mismatch"]["type"] == "TypeError"


def test_all_reduce(job):
    for res in records(job, "all_reduce"):
        for key, value in res.items():
            if isinstance(value, bool):
                assert value is True, key
        assert res["avg_int"]["message"] == "`op` must be 'sum', 'max' or 'min' for the integer dtype Int32, but got 'avg'"
        assert res["bad_op"]["message"] == "`op` must be one of 'sum', 'avg', 'max', 'min', but got 'prod'"
        assert res["bad_backward"]["message"] == ("`backward` must be one of 'identity', 'allreduce', but got "
                                                  "'sideways'")


def test_all_reduce_agrees_with_mccl(job):
    for res in records(job, "all_reduce_matches_mccl"):
        assert res["close"] is True, res


def test_low_precision(job):
    for res in records(job, "low_precision"):
        for wire in ("bfloat16", "Float16", "float8_e4m3fn"):
            assert res[wire]["within"] is True, (wire, res[wire])
        assert res["max_refused"]["message"].startswith("`low_precision_dtype` must be None for op 'max'")
        assert res["int_refused"]["message"].startswith("`low_precision_dtype` must be None for the integer dtype")
        assert res["not_narrower"]["message"] == ("`low_precision_dtype` must be narrower than the tensor's dtype "
                                                  "Float16 (2 bytes), but got bfloat16")
        assert res["unknown"]["message"].startswith("`low_precision_dtype` must be one of float16, bfloat16")
        assert res["env_default_low"] is True
        assert res["env_default_int_exact"] is True


def test_reduce_scatter(job):
    for res in records(job, "reduce_scatter"):
        all_true([res], [k for k in res if k != "size_mismatch"])
        assert res["size_mismatch"]["type"] == "ValueError"


def test_all_to_all(job):
    for res in records(job, "all_to_all"):
        assert res["ok"] is True
        assert res["count_mismatch"]["type"] in ("ShmemValueError", "ShmemMismatchError"), res["count_mismatch"]
        assert res["wrong_length"]["message"].startswith("`send_tensor_list` must have one tensor per rank")
        assert res["counts_type"]["message"].startswith("`receive_list` must be a sequence of")
        assert res["counts_past_end"]["message"].startswith("`sum(receive_list)` must be at most receive_tensor.numel()")
        assert res["counts_tensor"] == {}   # a 1-D integer tensor of counts is accepted


def test_send_recv(job):
    for res in records(job, "send_recv"):
        assert res["ok"] is True
        assert res["self"]["message"].startswith("`dst_rank` must be another rank than this one")
        assert res["no_channel"]["type"] == "ShmemStateError"
        assert res["no_channel"]["message"].startswith("group has no channel yet (run a collective or symm.barrier on "
                                                       "it first): op=shmem_send group=hp_fresh")


def test_send_recv_are_refused_while_a_gradient_is_recorded(job):
    for res in records(job, "send_recv_refused_while_recording"):
        assert res["error"]["type"] == "ShmemStateError"
        assert res["error"]["message"].startswith("shmem_send cannot be differentiated on mindspore (a Cell's bprop")


def test_rendezvous_gives_every_ranks_copy(job):
    for res in records(job, "rendezvous_peer_buffers"):
        all_true([res], ["read_peer", "written_by_prev", "world"])
        assert res["past_end"]["message"].startswith("`sizes` and `storage_offset` must lie inside the tensor")
        assert res["mismatch"]["type"] == "ValueError"
        assert res["mismatch"]["message"].startswith("`tensor` must be the same symmetric tensor on every rank")


def test_sub_groups_use_group_ranks(job):
    for res in records(job, "sub_groups"):
        all_true([res], ["all_reduce", "all_gather", "put_group_rank"])
        assert res["rank_outside"]["type"] == "ValueError"
        assert res["bad_group"]["message"] == "`group` must be a MindSpore group name (str) or None, but got int"


def test_mismatch_fails_everywhere_then_recovers(job):
    for res in records(job, "mismatch_then_recover"):
        assert res["error"]["type"] == "ShmemMismatchError", res["error"]
        assert res["recovered"] is True


def test_autograd_through_bprop(job):
    all_true(records(job, "autograd"))


def test_fused_ops(job):
    nranks = job[0]
    for res in records(job, "fused_ops"):
        all_true([res], ["gather", "matmul", "reduce_scatter"])
        assert res["bad_op"]["message"] == "`reduce_op` must be one of 'sum', 'avg', but got 'max'"
        assert res["rows"]["message"] == (f"`x1.shape[0]` must be a multiple of the group size ({nranks}), but got "
                                          f"{2 * nranks - 1}")
        assert res["scratch"]["message"] == (f"`symm_tensor.numel()` must be x1.shape[0] x x2.shape[1] "
                                             f"({6 * nranks}), but got 3")


def test_shutdown_refused_while_allocated(job):
    for res in records(job, "shutdown_refused_then_done"):
        assert res["refused"]["type"] == "ShmemStateError", res["refused"]
        assert res["state"] == "uninitialized"


def test_graph_mode_is_refused_with_the_reason(job):
    for res in records(job, "graph_mode_is_refused"):
        assert res["error"]["type"] == "ShmemStateError"
        assert res["error"]["message"].startswith("symmetric memory on MindSpore runs in PyNative mode only")


def test_an_absent_rank_makes_the_bootstrap_time_out(job):
    res = records(job, "absent_rank_times_out")[0]
    assert res["error"]["type"] == "ShmemTimeoutError", res["error"]
    assert "bootstrap all_gather over the MindSpore group timed out" in res["error"]["message"]
    assert "group=hp_absent timeout_sec=5" in res["error"]["message"]
    assert res["seconds"] < 30


def test_seed_example_one_runs_as_a_script():
    example = os.path.join(_HERE, "..", "..", "examples", "mindspore_producer_consumer.py")
    result = ms_job.run(os.path.abspath(example), 2, timeout=200, env=_ENV)
    assert result.returncode == 0, result.logs[-6000:]
    assert "rank 1 received 4096 halves" in result.logs and "intact=True" in result.logs, result.logs[-6000:]
