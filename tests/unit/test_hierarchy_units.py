"""The pure parts of teams that span nodes: where members live (NodeLayout) and the reduction across nodes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hyper_parallel.core.multicore.shmem._hierarchy import NodeLayout, reduce_in_order

_SUM, _AVG, _MAX, _MIN = 0, 1, 2, 3  # the runtime's numbering (checked below)


def test_reduce_op_numbering_is_the_runtimes():
    from hyper_parallel.core.multicore.shmem import REDUCE_OPS

    assert REDUCE_OPS == {"sum": _SUM, "avg": _AVG, "max": _MAX, "min": _MIN}


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
    total = reduce_in_order(parts, _SUM)
    assert total.tolist() == [1.0, 1e8]  # ((1e8 - 1e8) + 1, (1 + 1) + 1e8 rounded), not another order's
    assert torch.equal(reduce_in_order(parts, _SUM), total)  # the same bits every time
    assert reduce_in_order(parts, _MAX).tolist() == [1e8, 1e8]
    assert reduce_in_order(parts, _MIN).tolist() == [-1e8, 1.0]
    assert reduce_in_order([torch.tensor([3.0]), torch.tensor([5.0])], _AVG, divisor=4).tolist() == [2.0]
    assert all(p.tolist() == q for p, q in zip(parts, [[1e8, 1.0], [-1e8, 1.0], [1.0, 1e8]]))  # inputs untouched


@pytest.mark.parametrize("dtype, base", [(torch.float16, 2048.0), (torch.bfloat16, 256.0)])
def test_half_precision_sums_in_float32_and_rounds_once(dtype, base):
    # At `base` the type's spacing is 2: base + 1 rounds back to base (ties to even), so summing in the type would
    # give base; in float32 the sum is base + 2, which the type holds.
    parts = [torch.tensor([base], dtype=dtype), torch.tensor([1.0], dtype=dtype), torch.tensor([1.0], dtype=dtype)]
    total = reduce_in_order(parts, _SUM)
    assert total.dtype == dtype
    assert total.item() == base + 2


def test_integer_sums_are_exact():
    parts = [torch.tensor([2**40, -3], dtype=torch.int64), torch.tensor([1, 3], dtype=torch.int64)]
    assert reduce_in_order(parts, _SUM).tolist() == [2**40 + 1, 0]
