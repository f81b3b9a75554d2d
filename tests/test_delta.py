"""Delta propagation (nodemask.delta, strategy 6's default form): exact against the plain
reference in outputs and gradients, with either push kernel, and no host sync in the step."""
import pytest
import torch

from workbook_lib.data.perturbations import sample_perturbations
from workbook_lib.data.snapshots import CellGraph, content_checksum
from workbook_lib.measurement.syncs import SyncCounter
from workbook_lib.nodemask import SharedGraph
from workbook_lib.nodemask import compiled, delta
from workbook_lib.nodemask.delta import push
from workbook_lib.strategies import build_ctx, make_strategy
from workbook_lib.strategies.model import PerturbGIN
from workbook_lib.strategies.reference import reference_node_outputs, reference_predict

from conftest import make_graph

TOL = 2e-5
KERNELS = ["pull", "index_add", "numba"]


def rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


@pytest.fixture(scope="module")
def graph():
    """30 genes; genes 26..29 have no edge at all; one edge type is empty."""
    g = make_graph(num_genes=26, types={"a": 120, "b": 60, "c": 15, "empty": 0}, seed=11)
    return CellGraph("tiny", 30, g.edge_index, "test", content_checksum(30, g.edge_index))


def perturbations(n_genes):
    big = sample_perturbations(n_genes, {10: 0.5, 7: 0.3, 1: 0.2}, 64, seed=4)  # B 64, k <= 10
    big[0, :3] = torch.tensor([26, 27, 29])  # genes without edges
    big[1] = big[2]  # the same genes deleted in two samples
    return big


_REF: dict = {}


def _check(graph, pert, aggr, layers, kernel, dual):
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=5, layers=layers, seed=3)
    s = make_strategy("node_mask_shared", graph, aggr=aggr, push_kernel=kernel)
    assert s.middle == "delta"
    w = torch.randn(pert.shape[0], graph.num_genes, 5, generator=torch.Generator().manual_seed(0))

    def grads(fn):
        model.zero_grad()
        nodes, pred = fn()
        ((nodes * w).sum() + pred.sum()).backward()
        return nodes.detach(), pred.detach(), {n: p.grad.clone() for n, p in
                                               model.named_parameters() if p.grad is not None}
    key = (id(graph), aggr, layers, dual, tuple(pert.flatten().tolist()))
    if key not in _REF:  # the reference is the slow part: once for both kernels
        _REF[key] = grads(lambda: (reference_node_outputs(model, graph, pert, aggr),
                                   reference_predict(model, graph, pert, aggr, dual)))
    ref = _REF[key]

    def got_fn():
        ctx = build_ctx(s, pert)
        return s.node_outputs(model, ctx), s.predict(model, ctx, dual)
    got = grads(got_fn)
    assert rel(got[0], ref[0]) < TOL
    assert rel(got[1], ref[1]) < TOL
    assert set(got[2]) == set(ref[2])
    for k in ref[2]:
        assert rel(got[2][k], ref[2][k]) < TOL, k


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("layers", [2, 3, 4])
@pytest.mark.parametrize("aggr", ["sum", "mean"])
def test_delta_strategy_is_exact(graph, aggr, layers, kernel):
    # B = 64 at the model's 3 layers, 16 at 2 and 4; the dual forward (its wildtype pass reuses
    # the perturbed pass's layers and reads out pooled) at every depth
    pert = perturbations(graph.num_genes)[:64 if layers == 3 else 16]
    _check(graph, pert, aggr, layers, kernel, dual=True)


@pytest.mark.parametrize("middle", ["delta", "full"])
@pytest.mark.parametrize("aggr", ["sum", "mean"])
def test_dual_forward_without_numba_kernels(graph, aggr, middle):
    """The full form's dual forward (wildtype middle layers in full, readout pooled)."""
    pert = perturbations(graph.num_genes)[:8]
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=5, layers=3, seed=3)
    s = make_strategy("node_mask_shared", graph, aggr=aggr, middle=middle, push_kernel="pull")
    got = s.predict(model, build_ctx(s, pert), dual=True)
    assert rel(got, reference_predict(model, graph, pert, aggr, True)) < TOL


@pytest.mark.parametrize("aggr", ["sum", "mean"])
def test_wildtype_pooled_layer_is_the_mean_of_the_full_layer(graph, aggr):
    sg = SharedGraph(graph.edge_index, graph.num_genes, aggr=aggr)
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=4, layers=2, seed=2)
    h = torch.randn(graph.num_genes, 4, requires_grad=True)
    lin = model.lins[1]
    full = model.combine(1, h, sg.wildtype_aggregate(h)).mean(0)
    got = sg.pooled_layer(h, lin.weight, lin.bias)
    assert rel(got, full) < TOL
    g_full = torch.autograd.grad(full.sum(), (h, lin.weight))
    g_got = torch.autograd.grad(got.sum(), (h, lin.weight))
    assert all(rel(a, b) < TOL for a, b in zip(g_got, g_full))
    with pytest.raises(ValueError, match=r"\[N, H\]"):
        sg.pooled_layer(h[:3], lin.weight)


def test_pooled_weights_less_the_deleted_genes_in_edges_equal_the_product(graph):
    """Sum aggregation: the wildtype out-degrees less each deleted gene's in-edges (listed in
    the collate) against the product of A_t^T with the kept genes, and against a dense count."""
    sg = SharedGraph(graph.edge_index, graph.num_genes, aggr="sum")
    pert = perturbations(graph.num_genes)[:12]
    nb = sg.batch(pert)
    got = nb.pooled_weights()
    prod = sg.batch(pert)
    prod._corrections_allowed = lambda: False  # as a batch without host corrections
    assert torch.allclose(got, prod.pooled_weights(), rtol=1e-6, atol=0)
    n = sg.num_nodes
    for b in (0, 1, 5):
        keep = torch.ones(n)
        keep[pert[b][pert[b] >= 0]] = 0
        for i, ei in enumerate(graph.edge_index.values()):
            a = torch.zeros(n, n).index_put_((ei[1], ei[0]), torch.ones(ei.shape[1]),
                                             accumulate=True)  # A[dst, src]
            want = keep * (keep @ a) / n  # w[j] = D[j] sum_n A[n, j] D[n] / N
            assert torch.allclose(got[b, i], want)


@pytest.mark.parametrize("kernel", KERNELS)
def test_push_with_rows_and_relu_is_the_composition(graph, kernel):
    """The push with its correction rows and ReLU inside (one pass per sample slab on the
    compiled kernel) equals push, then the rows added, then ReLU: values and gradients."""
    sg = SharedGraph(graph.edge_index, graph.num_genes)
    nb = sg.batch(perturbations(graph.num_genes)[:7], push_kernel=kernel)
    c = nb.corrections()
    g = torch.Generator().manual_seed(5)
    base = torch.randn(graph.num_genes, 3, generator=g, requires_grad=True)
    u = torch.randn(c.msg_pair.numel(), 3, generator=g, requires_grad=True)
    rows = torch.randn(c.pair_gene.numel(), 3, generator=g, requires_grad=True)
    w = torch.rand(7, graph.num_genes * sg.num_types, generator=g) * nb.keep.repeat_interleave(
        sg.num_types, dim=1)
    weights = torch.randn(7, graph.num_genes, 3, generator=g)
    fused = push(sg, c, base, u, w, kernel, rows=rows, relu=True)
    plain = push(sg, c, base, u, w, kernel)
    plain = torch.relu(plain.index_put((c.pair_sample, c.pair_gene), rows, accumulate=True))
    assert rel(fused, plain) < TOL and (fused == 0).any() and (fused > 0).any()
    gf = torch.autograd.grad((fused * weights).sum(), (base, u, rows))
    gp = torch.autograd.grad((plain * weights).sum(), (base, u, rows))
    for a, b in zip(gf, gp):
        assert rel(a, b) < TOL
    # one weight per receiving gene [B, N] (sum aggregation's kept mask): as the same weight
    # repeated over the receiver's types
    wn = torch.rand(7, graph.num_genes, generator=g) * nb.keep
    per_gene = push(sg, c, base, u, wn, kernel, rows=rows, relu=True)
    per_slot = push(sg, c, base, u, wn.repeat_interleave(sg.num_types, dim=1), kernel,
                    rows=rows, relu=True)
    assert rel(per_gene, per_slot) < TOL
    gn = torch.autograd.grad((per_gene * weights).sum(), (u, rows))
    gs = torch.autograd.grad((per_slot * weights).sum(), (u, rows))
    assert all(rel(a, b) < TOL for a, b in zip(gn, gs))
    with pytest.raises(ValueError, match="'weight' must be"):
        push(sg, c, base, u, wn[:, :5], kernel)
    # messages given one per (row, type) [R, T, H]: the same push
    full = torch.zeros(c.pair_gene.numel() * sg.num_types, 3)
    full[delta.message_slots(c)] = u.detach()
    again = push(sg, c, base, full.view(-1, sg.num_types, 3), w, kernel, rows=rows, relu=True)
    assert rel(again, fused) < TOL


@pytest.mark.parametrize("kernel", KERNELS)
def test_delta_with_self_loops_and_nothing_deleted(kernel):
    ei = {"a": torch.tensor([[0, 1, 2, 2, 3, 4], [1, 1, 1, 2, 0, 3]]),
          "b": torch.tensor([[4, 0], [0, 4]])}
    g = CellGraph("loops", 5, ei, "test", content_checksum(5, ei))
    pert = torch.tensor([[2, -1], [1, 4], [-1, -1]])
    for aggr in ("sum", "mean"):
        _check(g, pert, aggr, 3, kernel, dual=False)


def test_full_form_is_kept_and_agrees(graph):
    pert = perturbations(graph.num_genes)[:8]
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=5, layers=3, seed=3)
    outs = {}
    for middle in ("delta", "full"):
        s = make_strategy("node_mask_shared", graph, middle=middle, push_kernel="pull")
        outs[middle] = s.predict(model, build_ctx(s, pert))
    assert rel(outs["delta"], outs["full"]) < TOL
    with pytest.raises(ValueError, match="'middle'"):
        make_strategy("node_mask_shared", graph, middle="sliced")


def test_delta_layer_matches_layer_on_dense_features(graph):
    """The public API: delta_layer(first_layer_delta(...)) == layer(first_layer(...))."""
    sg = SharedGraph(graph.edge_index, graph.num_genes, aggr="mean")
    pert = perturbations(graph.num_genes)[:5]
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=4, layers=3, seed=1)
    lin0, lin1 = model.lins[0], model.lins[1]
    nb = sg.batch(pert)
    dense, _ = nb.first_layer(model.embedding, lin0.weight, lin0.bias)
    hd = nb.first_layer_delta(model.embedding, lin0.weight, lin0.bias)
    assert rel(hd.dense(), dense) < TOL
    want = nb.layer(dense, lin1.weight, lin1.bias, eps=0.5)
    got = nb.delta_layer(hd, lin1.weight, lin1.bias, eps=0.5)
    assert rel(got, want) < TOL


@pytest.mark.parametrize("kernel", KERNELS)
def test_push_adds_each_message_to_its_out_neighbours(kernel):
    """Against a hand count: gene 0 sends type 0 to genes 1 and 2, type 1 to gene 2; the
    weight scales each message by its receiver and type (0 skips it)."""
    ei = {"x": torch.tensor([[0, 0, 3], [1, 2, 0]]), "y": torch.tensor([[0], [2]])}
    sg = SharedGraph(ei, 4)
    nb = sg.batch(torch.tensor([[0], [3]]), push_kernel=kernel)
    c = nb.corrections()
    u = torch.zeros(c.pair_gene.numel(), 2, 1)
    r0 = int(((c.pair_sample == 0) & (c.pair_gene == 0)).nonzero())
    u[r0, 0], u[r0, 1] = 1.0, 10.0
    w = torch.ones(2, 8)
    w[0, 2 * 2 + 1] = 0.5  # gene 2, type 1, in sample 0
    u.requires_grad_(True)
    out = push(sg, c, torch.zeros(4, 1), u, w, kernel)
    assert out[0, :, 0].tolist() == [0.0, 1.0, 6.0, 0.0]
    assert out[1].abs().sum() == 0
    g = torch.zeros(2, 4, 1)
    g[0, 2] = 1.0
    out.backward(g)
    assert u.grad[r0].flatten().tolist() == [1.0, 0.5]


def test_push_kernel_errors(graph):
    sg = SharedGraph(graph.edge_index, graph.num_genes)
    c = sg.batch(torch.tensor([[1]])).corrections()
    with pytest.raises(ValueError, match="push_kernel"):
        push(sg, c, torch.zeros(30, 2), torch.zeros(c.pair_gene.numel(), 4, 2),
             torch.ones(1, 120), "cuda-magic")


@pytest.mark.parametrize("middle,kernel", [
    ("delta", "pull"), ("delta", "index_add"), ("full", None),
    ("delta", "numba")])
@pytest.mark.parametrize("aggr", ["sum", "mean"])
def test_shared_graph_training_step_has_no_host_sync(graph, aggr, middle, kernel):
    """One training step of the node-mask shared graph (after the collate, which runs in the
    DataLoader's workers on the host) makes no device-to-host synchronization: the count is
    PyTorch's dispatcher-level one (what a GPU would sync)."""
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=5, layers=3, seed=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s = make_strategy("node_mask_shared", graph, aggr=aggr, middle=middle, push_kernel=kernel)
    pert = perturbations(graph.num_genes)[:6]
    batch = s.collate([s.make_item(i, row) for i, row in enumerate(pert)])
    c = SyncCounter("cpu")
    with c.count():
        ctx = s.device_prepare(s.to_device(batch))
        opt.zero_grad()
        s.predict(model, ctx, dual=True).pow(2).sum().backward()
        opt.step()
    assert c.total == 0, dict(c.by_kind)
    # and the counter does see a validation done in the step
    c2 = SyncCounter("cpu")
    with c2.count():
        s.shared.batch(pert)
    assert c2.total > 0


def test_footprint_counts_changed_genes_and_messages_by_hand():
    """Chain 0 -> 1 -> 2 -> 3 in type a, 0 -> 3 in type b; gene 4 isolated; gene 0 deleted."""
    from workbook_lib.studies.inventory import footprint

    ei = {"a": torch.tensor([[0, 1, 2], [1, 2, 3]]), "b": torch.tensor([[0], [3]])}
    g = CellGraph("hand", 5, ei, "test", content_checksum(5, ei))
    r = {(x.layer, x.edge_type): (x.genes.median, x.edges.median)
         for x in footprint(g, torch.tensor([[0]]), 3)}
    assert set(r) == {(l, t) for l in (1, 2, 3) for t in ("a", "b", "all")}
    assert r[(1, "a")] == pytest.approx((2 / 5, 1 / 3))  # genes 0 and 1; the edge 0 -> 1
    assert r[(1, "b")] == pytest.approx((2 / 5, 1.0))
    assert r[(1, "all")] == pytest.approx((3 / 5, 2 / 4))  # R_1 = {0, 1, 3}
    assert r[(2, "a")] == pytest.approx((3 / 5, 2 / 3))  # edges leaving R_1: 0->1, 1->2
    assert r[(2, "all")] == pytest.approx((4 / 5, 3 / 4))
    assert r[(3, "all")] == pytest.approx((4 / 5, 1.0))
    isolated = {(x.layer, x.edge_type): x for x in footprint(g, torch.tensor([[4]]), 2)}
    assert isolated[(2, "all")].genes.median == pytest.approx(1 / 5)
    assert isolated[(2, "all")].edges.median == 0


def test_numba_threads_block_instead_of_spinning(graph):
    """The compiled push runs on numba's workqueue layer (its OpenMP layer's spinning threads
    starve PyTorch's next operations on a machine with as many cores as threads), unless the
    user chose a layer."""
    import os

    if os.environ.get("NUMBA_THREADING_LAYER"):
        pytest.skip("the user chose numba's threading layer")
    sg = SharedGraph(graph.edge_index, graph.num_genes)
    nb = sg.batch(perturbations(graph.num_genes)[:3], push_kernel="numba")
    c = nb.corrections()
    push(sg, c, torch.zeros(graph.num_genes, 2), torch.ones(c.msg_pair.numel(), 2), nb.keep,
         "numba")
    assert compiled.numba_threading_layer() == compiled.THREADING_LAYER == "workqueue"


@pytest.mark.parametrize("per", ["gene", "slot"])
def test_push_pooled_in_one_pass_is_the_push_then_the_weighted_sums(graph, per):
    """The compiled push with the pooled layer's weighted sums taken inside it (the [B, N, H]
    output never written) against the push, then a batched product: values and gradients, for
    weights per receiving gene (sum aggregation) and per receiving slot (mean)."""
    sg = SharedGraph(graph.edge_index, graph.num_genes)
    nb = sg.batch(perturbations(graph.num_genes)[:9], push_kernel="numba")
    c = nb.corrections()
    g = torch.Generator().manual_seed(8)
    n, t = graph.num_genes, sg.num_types
    base = torch.randn(n, 4, generator=g, requires_grad=True)
    u = torch.randn(c.msg_pair.numel(), 4, generator=g, requires_grad=True)
    rows = torch.randn(c.pair_gene.numel(), 4, generator=g, requires_grad=True)
    w = torch.rand(9, n if per == "gene" else n * t, generator=g)
    pool = torch.rand(9, t + 1, n, generator=g)
    fused = delta.push_pooled(sg, c, base, u, w, pool, "numba", rows=rows)
    plain = torch.bmm(pool, push(sg, c, base, u, w, "numba", rows=rows, relu=True))
    assert fused.shape == (9, t + 1, 4) and rel(fused, plain) < TOL
    gw = torch.randn(9, t + 1, 4, generator=g)
    gf = torch.autograd.grad((fused * gw).sum(), (base, u, rows))
    gp = torch.autograd.grad((plain * gw).sum(), (base, u, rows))
    for a, b in zip(gf, gp):
        assert rel(a, b) < TOL
    with pytest.raises(ValueError, match="'pool' must be"):
        delta.push_pooled(sg, c, base, u, w, pool[:, :, :5], "numba")


def test_typed_out_edges_list_every_out_edge_by_sender_and_type(graph):
    """The compiled push's out-edges grouped by (sender, type): exactly each gene's out-edges
    of that type, receivers ascending (each receiver's terms are then added in the order of the
    (receiver, type) lists)."""
    sg = SharedGraph(graph.edge_index, graph.num_genes)
    n, t = sg.num_nodes, sg.num_types
    ptr, node = sg.out_type_ptr, sg.out_type_node
    assert ptr.shape == (n * t + 1,) and int(ptr[-1]) == sg.num_edges == node.numel()
    oe = sg.out_edges
    for s in range(n):
        slots = oe.slot[oe.ptr[s]:oe.ptr[s + 1]]
        for ty in range(t):
            got = node[ptr[s * t + ty]:ptr[s * t + ty + 1]].long()
            assert torch.equal(got, slots[slots % t == ty] // t)


def test_add_at_rows_is_index_add_in_outputs_and_gradients():
    """``add_at_rows`` (in place, no ``index_add_``) against ``index_add``: the same rows and
    the same gradients for both inputs; autograd refuses it on rows that their producer's
    backward needs (in place on a saved tensor) rather than computing a wrong gradient."""
    from workbook_lib.nodemask.kernels import add_at_rows

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(40, 6, generator=gen, requires_grad=True)
    src = torch.randn(7, 6, generator=gen, requires_grad=True)
    index = torch.randperm(40, generator=gen)[:7]
    w = torch.randn(40, 6, generator=gen)
    want = (x * 2.0).index_add(0, index, src, alpha=-1.5)
    gx, gs = torch.autograd.grad((want * w).sum(), (x, src))
    got = add_at_rows(x * 2.0, src, index, -1.5)
    assert torch.equal(got, want)
    hx, hs = torch.autograd.grad((got * w).sum(), (x, src))
    assert torch.equal(hx, gx) and torch.equal(hs, gs)
    saved = x.exp()  # ExpBackward keeps its result
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        add_at_rows(saved, src, index).sum().backward()


def test_delta_step_runs_no_index_add_on_cpu(graph):
    """The CPU delta step (numba push, sum aggregation: the benchmark's) adds rows back with
    sparse products and in-place row copies, never with ``index_add_``: PyTorch runs it on a CPU
    as a ``scatter_add_`` sorting an index expanded to every element, whose parallel passes
    stalled for 50-120 ms each when other jobs shared the 2 cores. (Mean aggregation's degree
    corrections still use it.)"""
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=5, layers=3, seed=3)
    s = make_strategy("node_mask_shared", graph, aggr="sum", push_kernel="numba")
    ctx = build_ctx(s, perturbations(graph.num_genes)[:6])
    with torch.profiler.profile() as prof:
        s.predict(model, ctx, dual=True).pow(2).sum().backward()
    ops = {e.name for e in prof.events()}
    assert "aten::index_select" in ops  # the profile sees the step's row movements
    assert not ops & {"aten::index_add_", "aten::index_add", "aten::scatter_add_"}, \
        sorted(ops & {"aten::index_add_", "aten::index_add", "aten::scatter_add_"})


@pytest.mark.parametrize("case", ["mixed", "one_sample", "nothing_deleted", "isolated_only"])
def test_compiled_corrections_equal_the_torch_ones(graph, case):
    """The compiled corrections builder (the CPU collate's) gives every field of the PyTorch
    version, the same values in the same order, the push plan and the selection CSRs
    included."""
    from dataclasses import fields

    from workbook_lib.nodemask.corrections import _corrections_compiled, _corrections_torch

    sg = SharedGraph(graph.edge_index, graph.num_genes)
    pert = {"mixed": perturbations(graph.num_genes)[:20],
            "one_sample": perturbations(graph.num_genes)[3:4],
            "nothing_deleted": torch.full((3, 4), -1),
            "isolated_only": torch.tensor([[26, 27, -1], [29, -1, -1]])}[case]
    a = _corrections_compiled(sg.out_edges, pert)
    b = _corrections_torch(sg.out_edges, pert)
    for f in fields(b):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "plan":
            for k in ("ranges", "entries", "type_counts", "num_deleted"):
                assert getattr(x, k) == getattr(y, k), k
            assert torch.equal(x.pair_ptr, y.pair_ptr) and torch.equal(x.pair_out, y.pair_out)
        elif y.layout == torch.sparse_csr:
            assert x.shape == y.shape, f.name
            for part in ("crow_indices", "col_indices", "values"):
                assert torch.equal(getattr(x, part)(), getattr(y, part)()), (f.name, part)
        else:
            assert x.dtype == y.dtype and torch.equal(x, y), f.name


@pytest.mark.parametrize("per", ["gene", "slot"])
@pytest.mark.parametrize("width", [64, 63])
def test_compiled_push_at_the_unrolled_width_equals_pull(graph, per, width):
    """The compiled kernels' per-edge loops take a fixed trip count at H = ``numba_push.WIDE``
    (64, the real spec's) and the general loop otherwise: both, the pooled pass included,
    against the PyTorch ``pull`` kernel, values and gradients, weights per receiving gene (sum)
    and per slot (mean)."""
    from workbook_lib.nodemask import numba_push

    assert numba_push.WIDE == 64
    sg = SharedGraph(graph.edge_index, graph.num_genes)
    nb = sg.batch(perturbations(graph.num_genes)[:9], push_kernel="numba")
    c = nb.corrections()
    g = torch.Generator().manual_seed(9)
    n, t = graph.num_genes, sg.num_types
    base = torch.randn(n, width, generator=g, requires_grad=True)
    u = torch.randn(c.msg_pair.numel(), width, generator=g, requires_grad=True)
    rows = torch.randn(c.pair_gene.numel(), width, generator=g, requires_grad=True)
    w = torch.rand(9, n if per == "gene" else n * t, generator=g)
    pool = torch.rand(9, t + 1, n, generator=g)
    gout = torch.randn(9, n, width, generator=g)
    gpool = torch.randn(9, t + 1, width, generator=g)
    for fn, gw in ((lambda k: push(sg, c, base, u, w, k, rows=rows, relu=True), gout),
                   (lambda k: delta.push_pooled(sg, c, base, u, w, pool, k, rows=rows), gpool)):
        got, want = fn("numba"), fn("pull")
        assert rel(got, want) < TOL
        for a, b in zip(torch.autograd.grad((got * gw).sum(), (base, u, rows)),
                        torch.autograd.grad((want * gw).sum(), (base, u, rows))):
            assert rel(a, b) < TOL
