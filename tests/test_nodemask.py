"""The fix as a public API: exact against the plain reference, and clear errors."""
import pytest
import torch

from workbook_lib.nodemask import SharedGraph, corrections, validate_deleted
from workbook_lib.strategies.model import PerturbGIN
from workbook_lib.strategies.reference import reference_node_outputs

from conftest import make_graph

TOL = 2e-5


def rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


@pytest.fixture(scope="module")
def graph():
    # one edge type with no edges at all
    return make_graph(num_genes=14, types={"a": 45, "b": 25, "c": 9, "empty": 0}, seed=5)


PERTS = [torch.tensor([[0, 5, 9], [1, 2, 3], [13, 4, -1]]),
         torch.tensor([[-1, -1]]),  # deletes nothing
         torch.tensor([[3]])]


def _layers(nb, model, pooled):
    lins, last = model.lins, model.num_layers - 1
    h, _ = nb.first_layer(model.embedding, lins[0].weight, lins[0].bias, relu=last > 0)
    for i in range(1, last + (0 if pooled else 1)):
        h = nb.layer(h, lins[i].weight, lins[i].bias, relu=i < last)
    if pooled:
        return nb.pooled_layer(h, lins[last].weight, lins[last].bias)
    return h


@pytest.mark.parametrize("kernel", ["slab", "wide"])
@pytest.mark.parametrize("aggr", ["sum", "mean"])
@pytest.mark.parametrize("pi", range(len(PERTS)))
def test_incremental_and_pooled_layers_are_exact(graph, aggr, kernel, pi):
    pert = PERTS[pi]
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=6, layers=3, seed=2)
    sg = SharedGraph(graph.edge_index, graph.num_genes, aggr=aggr, kernel=kernel)
    w = torch.randn(pert.shape[0], graph.num_genes, 6, generator=torch.Generator().manual_seed(1))

    def grads(fn):
        model.zero_grad()
        out = fn()
        ((out * w).sum() if out.dim() == 3 else out.sum()).backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                              if p.grad is not None}
    ref, ref_g = grads(lambda: reference_node_outputs(model, graph, pert, aggr))
    got, got_g = grads(lambda: _layers(sg.batch(pert), model, pooled=False))
    assert rel(got, ref) < TOL
    for k in ref_g:
        assert rel(got_g[k], ref_g[k]) < TOL, k
    # pooled last layer = the mean over genes of the last layer's output
    ref_p, ref_pg = grads(lambda: reference_node_outputs(model, graph, pert, aggr).mean(1))
    got_p, got_pg = grads(lambda: _layers(sg.batch(pert), model, pooled=True))
    assert rel(got_p, ref_p) < TOL
    for k in ref_pg:
        assert rel(got_pg[k], ref_pg[k]) < TOL, k


def test_aggregate_and_shared_aggregate_agree(graph):
    sg = SharedGraph(graph.edge_index, graph.num_genes, aggr="mean")
    nb = sg.batch(PERTS[0])
    x0 = torch.randn(graph.num_genes, 5)
    dense = nb.aggregate(x0.expand(3, -1, -1).contiguous())
    inc = nb.aggregate_shared(x0)
    assert rel(inc.dense(), dense) < TOL
    w = torch.randn(7, sg.num_types * 5)
    assert rel(inc.linear(w), dense.reshape(3, graph.num_genes, -1) @ w.T) < TOL
    # deleted genes aggregate nothing, in every sample and type
    assert dense[0, 5].abs().max() == 0 and dense[2, 13].abs().max() == 0


def test_corrections_built_on_the_host_match_lazy_ones(graph):
    sg = SharedGraph(graph.edge_index, graph.num_genes)
    pert = PERTS[0]
    host = corrections(sg.out_edges, pert)
    from workbook_lib.nodemask import NodeMaskBatch

    x0 = torch.randn(graph.num_genes, 4)
    pre = NodeMaskBatch(sg, pert, host).aggregate_shared(x0).dense()
    lazy = sg.batch(pert).aggregate_shared(x0).dense()
    assert torch.equal(pre, lazy)


def test_heterodata_input():
    from torch_geometric.data import HeteroData

    g = make_graph(num_genes=10, types={"x": 20, "y": 12})
    data = HeteroData()
    data["gene"].num_nodes = 10
    for t, ei in g.edge_index.items():
        data["gene", t, "gene"].edge_index = ei
    sg = SharedGraph(data)
    ref = SharedGraph(g.edge_index, 10)
    h = torch.randn(2, 10, 3)
    pert = torch.tensor([[1, 2], [0, -1]])
    assert torch.allclose(sg.batch(pert).aggregate(h), ref.batch(pert).aggregate(h))


@pytest.mark.parametrize("deleted,words", [
    (torch.tensor([[0, 20]]), ["gene index 20", "0..13"]),
    (torch.tensor([[-2]]), ["gene index -2"]),
    (torch.tensor([[3, 3]]), ["gene 3 twice", "sample 0"]),
    (torch.tensor([1, 2]), ["[B, k]"]),
    (torch.tensor([[1.0]]), ["integer"]),
])
def test_bad_deleted_indices(graph, deleted, words):
    sg = SharedGraph(graph.edge_index, graph.num_genes)
    with pytest.raises((ValueError, TypeError)) as e:
        sg.batch(deleted)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_bad_graphs_and_features(graph):
    with pytest.raises(ValueError, match="outside 0..4"):
        SharedGraph({"a": torch.tensor([[0, 9], [1, 2]])}, 5)
    with pytest.raises(ValueError, match="self-loop"):
        SharedGraph({"a": torch.tensor([[0, 1], [0, 2]])}, 5)
    SharedGraph({"a": torch.tensor([[0, 1], [0, 2]])}, 5, allow_self_loops=True)
    with pytest.raises(ValueError, match="num_nodes"):
        SharedGraph({"a": torch.tensor([[0], [1]])})
    with pytest.raises(ValueError, match="'aggr'"):
        SharedGraph(graph.edge_index, graph.num_genes, aggr="max")
    sg = SharedGraph(graph.edge_index, graph.num_genes)
    nb = sg.batch(PERTS[0])
    with pytest.raises(ValueError, match="N=14"):
        nb.aggregate(torch.randn(3, 13, 4))
    with pytest.raises(ValueError, match="B=3"):
        nb.aggregate(torch.randn(2, 14, 4))
    assert validate_deleted(torch.tensor([[1, -1]]), 5).dtype == torch.long


def test_self_loops_are_exact_when_allowed():
    """A self-loop is a message from the gene to itself, removed with the gene (as in PyG)."""
    from workbook_lib.data.snapshots import CellGraph, content_checksum

    ei = {"a": torch.tensor([[0, 1, 2, 2, 3], [1, 1, 1, 2, 0]])}
    g = CellGraph("loops", 4, ei, "test", content_checksum(4, ei))
    model = PerturbGIN(4, ["a"], hidden=3, layers=2, seed=0)
    pert = torch.tensor([[2], [1]])
    ref = reference_node_outputs(model, g, pert, "sum")
    sg = SharedGraph(ei, 4, allow_self_loops=True)
    assert rel(_layers(sg.batch(pert), model, pooled=False), ref) < TOL


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kernel", ["slab", "wide"])
def test_cuda_matches_cpu(graph, kernel):
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=6, layers=3, seed=2)
    pert = PERTS[0]
    cpu = _layers(SharedGraph(graph.edge_index, graph.num_genes).batch(pert), model, True)
    gpu_model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=6, layers=3, seed=2).cuda()
    sg = SharedGraph(graph.edge_index, graph.num_genes, device="cuda", kernel=kernel)
    out = _layers(sg.batch(pert.cuda()), gpu_model, True)
    assert rel(out.cpu(), cpu) < 1e-4


def _per_type_dense(graph, sg):
    """``A_t`` as dense ``[N, N]`` matrices (row: receiver), from the graph's edge lists."""
    n = graph.num_genes
    mats = []
    for name in sg.edge_types:
        a = torch.zeros(n, n)
        ei = graph.edge_index[name]
        a.index_put_((ei[1], ei[0]), torch.ones(ei.shape[1]), accumulate=True)
        mats.append(a)
    return mats


@pytest.mark.parametrize("h,ho", [(6, 6), (5, 7)])
def test_stacked_aggregate_linear_is_the_per_type_products(graph, h, ho):
    """One stacked CSR product each way (the CPU kernel's wildtype layers, sum aggregation)
    equals sum_t (A_t x) W_t^T computed densely type by type: output and both gradients, an
    empty edge type and H != H_out included."""
    from workbook_lib.nodemask.kernels import stacked_aggregate_linear

    sg = SharedGraph(graph.edge_index, graph.num_genes, aggr="sum", kernel="slab")
    t, n = sg.num_types, graph.num_genes
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, h, generator=g, requires_grad=True)
    w = torch.randn(ho, t * h, generator=g, requires_grad=True)
    up = torch.randn(n, ho, generator=g)
    got = stacked_aggregate_linear(x, w, sg.a, sg.a_tt)
    gx, gw = torch.autograd.grad(got, [x, w], up)
    mats = _per_type_dense(graph, sg)
    ref = sum(mats[i] @ x @ w[:, i * h:(i + 1) * h].T for i in range(t))
    rx, rw = torch.autograd.grad(ref, [x, w], up)
    assert rel(got, ref) < TOL and rel(gx, rx) < TOL and rel(gw, rw) < TOL
    with pytest.raises(ValueError, match="do not agree"):
        stacked_aggregate_linear(x, w[:, :-1], sg.a, sg.a_tt)


@pytest.mark.parametrize("layers", [2, 3, 4])
def test_delta_step_with_the_stacked_product_equals_the_per_type_one(graph, layers):
    """The delta path's wildtype layers take the stacked product on a CPU with sum aggregation
    (``SharedGraph.a_tt``) and the per-type products otherwise: both give the same outputs and
    gradients (the reference comparison is in test_delta.py)."""
    from workbook_lib.strategies import build_ctx, make_strategy

    s = make_strategy("node_mask_shared", graph, aggr="sum", push_kernel="pull")
    assert s.shared.a_tt is not None
    assert SharedGraph(graph.edge_index, graph.num_genes, kernel="wide").a_tt is None
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=6, layers=layers, seed=2)
    pert = PERTS[0]

    def run():
        model.zero_grad()
        ctx = build_ctx(s, pert)
        nodes, pred = s.node_outputs(model, ctx), s.predict(model, ctx, dual=True)
        (nodes.sum() + pred.sum()).backward()
        return [nodes.detach(), pred.detach()] + [p.grad.clone() for p in model.parameters()
                                                  if p.grad is not None]
    stacked = run()
    a_tt, s.shared.a_tt = s.shared.a_tt, None
    try:
        per_type = run()
    finally:
        s.shared.a_tt = a_tt
    assert len(stacked) == len(per_type)
    for a, b in zip(stacked, per_type):
        assert rel(a, b) < TOL
