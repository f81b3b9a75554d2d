"""The floor of an exact sample (nodemask.floor) against a count by hand, and the restructured
delta step's measured multiply-adds against its own arithmetic and against the floor."""
import pytest
import torch

from workbook_lib.studies.mask_cost.rates import achieved_rates
from workbook_lib.data.snapshots import CellGraph, content_checksum
from workbook_lib.nodemask import SharedGraph, corrections
from workbook_lib.nodemask.floor import work_floor
from workbook_lib.strategies import build_ctx, make_strategy
from workbook_lib.strategies.model import PerturbGIN

from conftest import make_graph

# type x: 0->1, 0->2, 3->0, 1->2; type y: 0->2, 4->3 (N = 5, T = 2, E = 6)
HAND = {"x": torch.tensor([[0, 0, 3, 1], [1, 2, 0, 2]]), "y": torch.tensor([[0, 4], [2, 3]])}
PERT = torch.tensor([[0], [4]])  # sample 0 deletes gene 0, sample 1 gene 4; H = 2


def _floor(layers, dual=True):
    sg = SharedGraph(HAND, 5)
    return work_floor(sg, corrections(sg.out_edges, PERT), hidden=2, layers=layers, dual=dual)


def test_floor_by_hand_at_three_layers():
    f = _floor(3)
    parts = {k: (v.sparse_macs, v.dense_macs) for k, v in f.parts.items()}
    # wildtype layers: sparse E H forward + backward, dense N T H H x 3 (output, two gradients)
    assert parts["layer 1 wildtype"] == (2 * 6 * 2, 3 * 5 * 2 * 2 * 2)
    assert parts["layer 2 wildtype"] == (24, 120)
    # the deleted genes' messages: gene 0 sends on x and y, gene 4 on y: 3 maps of H x H, x 3;
    # added along their out-edges (3 for gene 0, 1 for gene 4), forward + backward
    assert parts["layer 1 changes"] == (2 * 4 * 2, 3 * 3 * 2 * 2)
    # changed rows: sample 0 {0, 1, 2}, sample 1 {3, 4}. Messages per (sample, type), the fewer
    # of senders and receivers: s0 x: senders {0, 1}, receivers {1, 2}: 2; s0 y: 1; s1 x: 1;
    # s1 y: 1 -> 5. Self-term maps: every row but a kept one sending on both types (gene 0 is
    # deleted in sample 0): 5. Push: 4 live out-edges in sample 0, 2 in sample 1.
    assert parts["layer 2 changes"] == (2 * 6 * 2, 3 * (5 + 5) * 2 * 2)
    # pooled: rows changed (s0 {0, 1, 2} + gene 3, whose out-edge to deleted gene 0 changes its
    # weight; s1 {0, 3, 4}) = 7 < B N, so the wildtype's weighted sum once (N = 5):
    # 2 T H (7 + 5) = 96, the map [B, T H] x [T H, H] x 3 = 48; the weights lose 1 in-edge
    assert parts["last layer, pooled"] == (1, 96 + 48)
    assert parts["wildtype readout (dual)"] == (0, 2 * 2 * 2 * 5 + 3 * 1 * 4 * 2)
    assert f.sparse_macs == 89 and f.dense_macs == 604
    assert f.per_sample("dense_macs") == 302 and f.per_sample("sparse_macs") == 44.5
    assert f.bytes > 0
    # at 1 sparse and 2 dense multiply-adds per ns
    assert f.seconds_at(1.0, 2.0) == pytest.approx((44.5 + 302 / 2) * 1e-9)


def test_floor_by_hand_with_a_full_middle_layer_and_without_the_dual():
    f = _floor(4, dual=False)
    parts = {k: (v.sparse_macs, v.dense_macs) for k, v in f.parts.items()}
    # layer 3 per sample on each sample's graph: sample 0 keeps 2 edges (4 touch gene 0),
    # sample 1 keeps 5: sparse 2 x 7 x H; dense B N T H H x 3
    assert parts["layers 3 to L-1, per sample"] == (2 * 7 * 2, 3 * 2 * 5 * 2 * 2 * 2)
    assert "layers 3 to L-1, wildtype (dual)" not in parts and \
        "wildtype readout (dual)" not in parts
    # every row has changed by the last layer: no shared weighted sum
    assert parts["last layer, pooled"] == (1, 2 * 2 * 2 * 10 + 48)
    with_dual = _floor(4).parts
    assert (with_dual["layers 3 to L-1, wildtype (dual)"].sparse_macs,
            with_dual["layers 3 to L-1, wildtype (dual)"].dense_macs) == (24, 120)


def test_floor_refuses_what_it_does_not_state():
    with pytest.raises(ValueError, match="L >= 3"):
        _floor(2)
    sg = SharedGraph(HAND, 5)
    with pytest.raises(ValueError, match="'hidden'"):
        work_floor(sg, corrections(sg.out_edges, PERT), hidden=0, layers=3)
    with pytest.raises(ValueError, match="rates must be positive"):
        _floor(3).seconds_at(0.0, 1.0)
    with pytest.raises(ValueError, match="'what'"):
        _floor(3).per_sample("flops")


# ----------------------------------------------------------------- the step's measured counts
@pytest.fixture(scope="module")
def graph():
    g = make_graph(num_genes=60, types={"a": 500, "b": 250, "c": 40}, seed=3)
    return CellGraph("small", 60, g.edge_index, "test", content_checksum(60, g.edge_index))


def _measured(graph, pert, hidden, kernel="pull"):
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=hidden, layers=3, seed=0)
    s = make_strategy("node_mask_shared", graph, aggr="sum", push_kernel=kernel)

    def step():
        model.zero_grad(set_to_none=True)
        s.predict(model, build_ctx(s, pert), dual=True).sum().backward()
    step()
    return {f.kind: f.step_macs for f in achieved_rates(step, "cpu", "s", {})}, s


@pytest.mark.parametrize("kernel", ["pull", "numba"])
def test_the_delta_steps_dense_work_is_its_own_arithmetic_and_near_the_floor(graph, kernel):
    """Every dense product of the restructured step, counted by the profiler, equals the count
    of what it is meant to compute: the two wildtype layers, the deleted genes' messages (not
    x0 W_t for every gene), one message per (changed row, type its gene sends on) (not all T),
    the self term's change, the pooled layer (the readout's mean one more row) and the dual's
    wildtype readout pooled (no further wildtype layer). With the compiled kernel the pooled
    layer's weighted sums run inside the push and are counted there."""
    g = torch.Generator().manual_seed(1)
    b, h = 16, 8
    pert = torch.stack([torch.randperm(graph.num_genes, generator=g)[:3] for _ in range(b)])
    got, s = _measured(graph, pert, h, kernel)
    sg = s.shared
    c = corrections(sg.out_edges, pert)
    n, t = sg.num_nodes, sg.num_types
    r, m = c.pair_gene.numel(), c.msg_pair.numel()
    assert m == int(sg.out_edges.sends[:, c.pair_gene].sum()) < r * t
    msgs_1 = int(c.source_gene.numel()) * t  # x0[s] W_t, every type, once per batch
    per_layer = t * n * h * h + n * h * h  # the typed map and the self term
    expected = 3 * (2 * per_layer + msgs_1 * h * h + m * h * h + r * h * h)
    expected += 2 * b * (t + 1) * n * h  # the pooled weighted sums, forward and the rows' grad
    expected += 3 * (b * t * h * h + b * h * h)  # the pooled map and the self term's
    expected += 2 * t * n * h  # the dual's wildtype readout, pooled
    small = 3 * (t * h * h + h * h) + 3 * b * h  # its map, the head: matrix-vector or not
    assert expected <= got["dense"] <= expected + small
    floor = work_floor(sg, c, h, 3, dual=True)
    assert got["dense"] <= 1.5 * floor.dense_macs
    # sparse: the tagged products are the floor's, plus the push to deleted receivers
    assert floor.sparse_macs <= got["sparse"] <= 1.05 * floor.sparse_macs
