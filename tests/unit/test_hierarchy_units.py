"""The pure parts of teams that span nodes: where members live (NodeLayout) and the reduction across nodes, which
every member of a lane computes alike (numpy, for every framework), checked bit for bit against torch's own
arithmetic."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hyper_parallel.core.multicore.hierarchy import NodeLayout, reduce_in_order


def _bytes(t: torch.Tensor) -> np.ndarray:
    return t.reshape(-1).view(torch.uint8).numpy()


def _reduce(parts: list, op: str, divisor: int = 1) -> torch.Tensor:
    """reduce_in_order over torch tensors' bytes, as a tensor of their dtype."""
    name = str(parts[0].dtype).replace("torch.", "")
    return torch.from_numpy(reduce_in_order([_bytes(p) for p in parts], name, op, divisor)).view(parts[0].dtype)


def test_reduce_op_names_are_the_runtimes():
    from hyper_parallel.core.multicore.shmem import REDUCE_OPS

    assert set(REDUCE_OPS) == {"sum", "avg", "max", "min"}


@st.composite
def placements(draw):
    """A team of nodes x per_node members whose group ranks are spread over the nodes in any order, with node ids
    that are any distinct numbers (the runtime numbers a node by its lowest PE)."""
    nodes = draw(st.integers(1, 4))
    per_node = draw(st.integers(1, 4))
    size = nodes * per_node
    order = draw(st.permutations(range(size)))
    ids = draw(st.lists(st.integers(0, 63), min_size=nodes, max_size=nodes, unique=True))
    node_of_group_rank = [ids[order[g] // per_node] for g in range(size)]
    pes = draw(st.permutations(range(size)))  # the PE of each group rank
    nodes_of_pes = [0] * size
    for g, pe in enumerate(pes):
        nodes_of_pes[pe] = node_of_group_rank[g]
    me = draw(st.integers(0, size - 1))
    return pes, me, nodes_of_pes, node_of_group_rank


@settings(max_examples=200, deadline=None)
@given(placements())
def test_layout_pairs_the_ith_member_of_every_node(placement):
    pes, me, nodes_of_pes, node_of_group_rank = placement
    layout = NodeLayout(pes, me, nodes_of_pes)
    size = len(pes)
    assert layout.count * layout.per_node == size
    # Nodes in ascending id order, each node's members ascending, every group rank once.
    ids = [node_of_group_rank[m[0]] for m in layout.members]
    assert ids == sorted(set(node_of_group_rank))
    for node_id, members in zip(ids, layout.members):
        assert list(members) == sorted(g for g in range(size) if node_of_group_rank[g] == node_id)
    # This member's place, its lane, and the blocks' order of the node phases.
    assert layout.members[layout.node][layout.local] == me
    assert layout.lane == tuple(m[layout.local] for m in layout.members)
    assert sorted(layout.lane_major) == list(range(size))
    for block, g in enumerate(layout.lane_major):
        k, i = layout.position[g]
        assert block == i * layout.count + k and layout.members[k][i] == g


def test_layout_refuses_nodes_with_different_numbers_of_members():
    with pytest.raises(ValueError, match=r"`group` must have the same number of ranks on every node it spans, but "
                                         r"got \{'node0': 2, 'node2': 1\} \(group ranks by node: \[\[0, 1\], \[2\]\]\)"):
        NodeLayout([0, 1, 2], 0, [0, 0, 2])


def test_reduction_across_nodes_combines_in_the_given_order():
    parts = [torch.tensor([1e8, 1.0], dtype=torch.float32), torch.tensor([-1e8, 1.0]), torch.tensor([1.0, 1e8])]
    total = _reduce(parts, "sum")
    assert total.tolist() == [1.0, 1e8]  # ((1e8 - 1e8) + 1, (1 + 1) + 1e8 rounded), not another order's
    assert torch.equal(_reduce(parts, "sum"), total)  # the same bits every time
    assert _reduce(parts, "max").tolist() == [1e8, 1e8]
    assert _reduce(parts, "min").tolist() == [-1e8, 1.0]
    assert _reduce([torch.tensor([3.0]), torch.tensor([5.0])], "avg", divisor=4).tolist() == [2.0]
    assert all(p.tolist() == q for p, q in zip(parts, [[1e8, 1.0], [-1e8, 1.0], [1.0, 1e8]]))  # inputs untouched


@pytest.mark.parametrize("dtype, base", [(torch.float16, 2048.0), (torch.bfloat16, 256.0)])
def test_half_precision_sums_in_float32_and_rounds_once(dtype, base):
    # At `base` the type's spacing is 2: base + 1 rounds back to base (ties to even), so summing in the type would
    # give base; in float32 the sum is base + 2, which the type holds.
    parts = [torch.tensor([base], dtype=dtype), torch.tensor([1.0], dtype=dtype), torch.tensor([1.0], dtype=dtype)]
    total = _reduce(parts, "sum")
    assert total.dtype == dtype
    assert total.item() == base + 2


def test_integer_sums_are_exact():
    parts = [torch.tensor([2**40, -3], dtype=torch.int64), torch.tensor([1, 3], dtype=torch.int64)]
    assert _reduce(parts, "sum").tolist() == [2**40 + 1, 0]


def test_a_dtype_the_runtime_does_not_reduce_is_refused():
    with pytest.raises(TypeError, match=r"`dtype` must be one of float64, .* for a reduction across nodes, but got "
                                        r"complex64"):
        reduce_in_order([np.zeros(8, dtype=np.uint8)], "complex64", "sum")


def _torch_reference(parts: list, op: str, divisor: int) -> torch.Tensor:
    """What torch computes for the same reduction: half types widened to float32, combined in order, rounded once."""
    widen = parts[0].dtype in (torch.float16, torch.bfloat16)
    acc = parts[0].float() if widen else parts[0].clone()
    for part in parts[1:]:
        part = part.float() if widen else part
        if op in ("sum", "avg"):
            acc.add_(part)
        else:
            (torch.maximum if op == "max" else torch.minimum)(acc, part, out=acc)
    if op == "avg":
        acc.div_(divisor)
    return acc.to(parts[0].dtype) if widen else acc


_FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
_INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_FLOATS + _INTS), st.sampled_from(["sum", "avg", "max", "min"]), st.integers(1, 4),
       st.integers(1, 40), st.integers(0, 2**31 - 1), st.integers(1, 8))
def test_the_reduction_is_torchs_bit_for_bit(dtype, op, nodes, count, seed, divisor):
    # Values over the whole range of each type, inf, NaN and ties of the half types included: numpy's float32 to
    # bfloat16 rounding is written out here (numpy has no bfloat16), torch's is c10's.
    if op == "avg" and dtype in _INTS:
        op = "sum"
    generator = torch.Generator().manual_seed(seed)
    if dtype in _FLOATS:
        parts = [(torch.randn(count, generator=generator, dtype=torch.float64) *
                  torch.tensor(10.0).pow(torch.randint(-6, 6, (count,), generator=generator))).to(dtype)
                 for _ in range(nodes)]
        parts[0][:: 7] = float("inf")
        if count > 3:
            parts[-1][3] = float("nan")
    else:
        info = torch.iinfo(dtype)
        parts = [torch.randint(info.min, info.max, (count,), generator=generator, dtype=dtype) for _ in range(nodes)]
    expected = _torch_reference(parts, op, divisor)
    got = _reduce(parts, op, divisor)
    assert got.dtype == dtype
    if dtype in _FLOATS:  # NaN where torch has NaN (its bits may differ), every other value bit for bit
        assert torch.equal(got.isnan(), expected.isnan())
        got, expected = got[~got.isnan()], expected[~expected.isnan()]
    assert torch.equal(_bits(got), _bits(expected))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
