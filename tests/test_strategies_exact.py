"""Exactness: every strategy that claims to compute the perturbed-graph forward gives the same
node outputs and gradients as the plain reference (per-sample PyG subgraph + GINConv)."""
import pytest
import torch

from workbook_lib.strategies.model import PerturbGIN
from workbook_lib.data.perturbations import sample_perturbations
from workbook_lib.strategies.reference import reference_node_outputs, reference_predict, reference_wildtype
from workbook_lib.strategies import REGISTRY, build_ctx, make_strategy

from conftest import make_graph

EXACT = [n for n, c in REGISTRY.items() if c.exact]
TOL = 2e-5


def rel_err(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _check(name, graph, pert, aggr, form, dual=False, tmp_path=None):
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=8, layers=2, seed=1)
    kw = {"aggr": aggr, "form": form}
    if name == "replicated_mask_stored":
        kw["storage_dir"] = tmp_path
    s = make_strategy(name, graph, **kw)
    if name == "replicated_mask_stored":
        s.store(pert)
    torch.manual_seed(0)
    weights = torch.randn(pert.shape[0], graph.num_genes, 8)
    # reference
    model.zero_grad()
    ref = reference_node_outputs(model, graph, pert, aggr)
    ((ref * weights).sum() + reference_predict(model, graph, pert, aggr, dual).sum()).backward()
    ref_g = _grads(model)
    # strategy
    model.zero_grad()
    ctx = build_ctx(s, pert)
    out = s.node_outputs(model, ctx)
    ((out * weights).sum() + s.predict(model, ctx, dual).sum()).backward()
    got_g = _grads(model)
    assert out.shape == ref.shape
    assert rel_err(out, ref) < TOL, (name, rel_err(out, ref))
    assert set(got_g) == set(ref_g)
    for k in ref_g:
        assert rel_err(got_g[k], ref_g[k]) < TOL, (name, k, rel_err(got_g[k], ref_g[k]))


CASES = {
    # k = 0, 1, 3; deletions sharing neighbours; batch 1 and several; padded (mixed k)
    "k0_batch2": torch.tensor([[-1, -1], [-1, -1]]),
    "k1_batch1": torch.tensor([[3]]),
    "k3_batch3": torch.tensor([[0, 5, 9], [1, 2, 3], [11, 4, 7]]),
    "mixed_k": torch.tensor([[2, -1, -1], [6, 7, 8], [0, 1, -1]]),
}


@pytest.fixture(scope="module")
def graph():
    return make_graph(num_genes=12, types={"a": 40, "b": 25, "c": 9}, seed=3)


@pytest.mark.parametrize("aggr", ["sum", "mean"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", EXACT)
def test_exact_gather_scatter(name, case, aggr, graph, tmp_path):
    _check(name, graph, CASES[case], aggr, "gather_scatter" if name != "node_mask_shared"
           else "spmm", tmp_path=tmp_path)


@pytest.mark.parametrize("aggr", ["sum", "mean"])
@pytest.mark.parametrize("name", EXACT)
def test_exact_spmm_form_and_dual(name, aggr, graph, tmp_path):
    _check(name, graph, CASES["k3_batch3"], aggr, "spmm", dual=True, tmp_path=tmp_path)


def test_shared_neighbours_case(graph):
    # two deleted genes adjacent to each other and to a common neighbour
    ei = graph.edge_index["a"]
    s, d = int(ei[0, 0]), int(ei[1, 0])
    pert = torch.tensor([[s, d], [d, -1]])
    for name in EXACT:
        if name != "replicated_mask_stored":
            _check(name, graph, pert, "mean", "gather_scatter" if name != "node_mask_shared"
                   else "spmm")


def test_random_larger_graph_all_exact(tmp_path):
    g = make_graph(num_genes=40, types={"x": 200, "y": 120}, seed=7)
    pert = sample_perturbations(40, {1: 0.3, 3: 0.7}, 5, seed=2)
    for name in EXACT:
        _check(name, g, pert, "sum", "gather_scatter" if name != "node_mask_shared" else "spmm",
               tmp_path=tmp_path)


def test_node_mask_builds_no_per_sample_edge_tensor(graph):
    s = make_strategy("node_mask_shared", graph)
    pert = CASES["k3_batch3"]
    ctx = build_ctx(s, pert)
    e_min = min(graph.num_edges(t) for t in graph.edge_types)
    for v in ctx.values():
        if isinstance(v, torch.Tensor):
            assert v.numel() < e_min * pert.shape[0] or v.shape[0] == graph.num_genes
    assert "edges" not in ctx and "masks" not in ctx


@pytest.mark.parametrize("aggr", ["sum", "mean"])
def test_dango_against_its_definition(graph, aggr):
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=8, layers=2, seed=1)
    s = make_strategy("dango_wildtype", graph, aggr=aggr)
    pert = CASES["mixed_k"]
    got = s.predict(model, build_ctx(s, pert))
    wt = reference_wildtype(model, graph, aggr)
    expected = []
    for row in pert:
        genes = [g for g in row.tolist() if g >= 0]
        hp = wt[genes]
        a = torch.softmax(hp @ model.query, dim=0)
        expected.append(model.head((a[:, None] * hp).sum(0)).squeeze())
    assert rel_err(got, torch.stack(expected)) < TOL
    empty = s.predict(model, build_ctx(s, torch.full((1, 2), -1)))
    assert torch.allclose(empty, model.head.bias)


def test_device_loop_counts_its_syncs(graph):
    s = make_strategy("device_mask_loop", graph)
    pert = CASES["mixed_k"]
    assert s.syncs_per_batch(pert) == 3 * 3 + 2 * 6 * 3


def test_unknown_strategy():
    with pytest.raises(ValueError, match="'strategy'"):
        make_strategy("magic", make_graph())
