"""Strategy benchmarks of notebook 02: one sample's edge removal in each form, one layer of each
strategy across batch size, and exactness against the plain reference; forms and strategies are
timed in the same rounds (:func:`~workbook_lib.measurement.timing.interleave`).
"""
from __future__ import annotations


import torch

from ...data.perturbations import sample_perturbations
from ...data.snapshots import CellGraph
from ...measurement.memory import is_oom
from ...measurement.timing import interleave
from ...common.progress import progress
from ...strategies import build_ctx, make_strategy
from ...strategies.model import PerturbGIN
from ...results.mask_cost import LayerPoint, LayerSweep, MaskGeneration


def mask_generation(graph: CellGraph, k, batch_size: int, device, *, warmup=1, min_rounds=5,
                    target=0.1, max_time_s=20.0, seed=0, storage_dir=None) -> MaskGeneration:
    """Per sample: host subgraph (1), host incidence loop (2), stored masks read (3), device loop
    with syncs (4a), device vectorized (4b) and device keep-mask filter (5), interleaved."""
    pert = sample_perturbations(graph.num_genes, k, batch_size, seed=seed)
    dpert = pert.to(device)
    s1 = make_strategy("subgraph_cpu", graph, device=device)
    s2 = make_strategy("replicated_mask_cpu", graph, device=device)
    s3 = make_strategy("replicated_mask_stored", graph, device=device, storage_dir=storage_dir)
    s3.store(pert)
    s4 = make_strategy("device_mask_loop", graph, device=device)
    s4v = make_strategy("device_mask_vectorized", graph, device=device)
    s5 = make_strategy("replicated_filter_device", graph, device=device)

    def filt():
        for t in graph.edge_types:
            src, dst = s5.replicate(t, batch_size)
            s5.keep_mask(src, dst, dpert).nonzero()
    fns = {"subgraph_cpu": lambda: [s1.make_item(i, r) for i, r in enumerate(pert)],
           "replicated_mask_cpu": lambda: [s2.masks_for(r) for r in pert],
           "replicated_mask_stored": lambda: [s3.make_item(i, r) for i, r in enumerate(pert)],
           "device_mask_loop": lambda: s4.make_masks(dpert),
           "device_mask_vectorized": lambda: s4v.make_masks(dpert),
           "replicated_filter_device": filt}
    res = interleave(fns, device=device, warmup=warmup, min_rounds=min_rounds, target=target,
                     max_time_s=max_time_s)
    where = {"subgraph_cpu": "host (DataLoader worker)", "replicated_mask_cpu": "host",
             "replicated_mask_stored": "host, read from disk", "device_mask_loop": "device",
             "device_mask_vectorized": "device", "replicated_filter_device": "device"}
    return MaskGeneration(batch_size, {n: s.scaled(1e3 / batch_size, "ms/sample")
                                       for n, s in res.stats.items()}, where)


def _hidden_input(strategy, ctx, hidden: int, gen: torch.Generator) -> torch.Tensor:
    b, n = ctx["B"], strategy.n
    if strategy.name == "dango_wildtype":
        shape = (n, hidden)
    elif strategy.replicated:
        shape = (b * n, hidden)
    else:
        shape = (b, n, hidden)
    return torch.randn(*shape, generator=gen).to(strategy.device)


def layer_across_batch(graph: CellGraph, strategies: list[str], batch_sizes: list[int],
                       hidden: int, k, device, *, aggr="sum", warmup=1, min_rounds=5,
                       target=0.1, max_time_s=10.0, seed=0) -> LayerSweep:
    """One middle layer (every edge type, forward) per strategy, interleaved per batch size.
    A strategy that runs out of memory at a batch size is recorded there and left out of the
    larger ones."""
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=hidden, layers=2,
                       seed=seed).to(device)
    out = LayerSweep(hidden=hidden, edges=graph.num_edges())
    gen = torch.Generator().manual_seed(seed)
    dead: dict[str, str] = {}
    made = {n: make_strategy(n, graph, aggr=aggr, device=device) for n in strategies}
    for b in progress(batch_sizes, desc="02 one layer across B"):
        fns = {}
        for name in strategies:
            if name in dead:
                out.points.append(LayerPoint(name, b, None, dead[name]))
                continue
            s = made[name]
            try:
                ctx = build_ctx(s, sample_perturbations(graph.num_genes, k, b, seed=seed))
                h = _hidden_input(s, ctx, hidden, gen)
                with torch.no_grad():
                    s.one_layer(model, h, ctx)
                fns[name] = (lambda s=s, h=h, ctx=ctx: s.one_layer(model, h, ctx))
            except Exception as exc:  # noqa: BLE001 - only out-of-memory is recorded
                if not is_oom(exc):
                    raise
                dead[name] = f"out of memory at B={b}: {str(exc).splitlines()[0][:120]}"
                out.points.append(LayerPoint(name, b, None, dead[name]))
        if fns:
            with torch.no_grad():
                res = interleave(fns, device=device, warmup=warmup, min_rounds=min_rounds,
                                 target=target, max_time_s=max_time_s)
            out.points.extend(LayerPoint(n, b, s) for n, s in res.stats.items())
    return out


def _model_on(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A copy of ``model`` on ``device`` (the same weights as the reference's)."""
    import copy

    return copy.deepcopy(model).to(device)


def exactness_report(graph: CellGraph, strategies: list[str], *, k, batch_size: int = 3,
                     hidden: int = 16, layers: int = 2, aggr="sum", seed=0,
                     storage_dir=None, device: torch.device | str = "cpu") -> dict[str, float]:
    """Max relative error of node outputs, predictions (dual forward) and parameter gradients
    of each exact strategy, run on ``device`` (the run's own: forward and backward through its
    kernels and custom autograd functions), against the plain reference (per-sample PyG
    subgraph + GINConv) on the CPU. Perturbations delete some of the best-connected genes, so
    edges are actually removed."""
    from ...strategies.reference import reference_node_outputs, reference_predict

    dev = torch.device(device)
    pert = sample_perturbations(graph.num_genes, k, batch_size, seed=seed)
    pert[0, 0] = 0  # gene 0 of an induced_subgraph is its best-connected one
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=hidden, layers=layers,
                       seed=seed)
    w = torch.randn(batch_size, graph.num_genes, hidden,
                    generator=torch.Generator().manual_seed(seed))

    def run(m, nodes_fn, pred_fn):
        m.zero_grad(set_to_none=True)
        nodes, pred = nodes_fn(), pred_fn()
        ((nodes * w.to(nodes.device)).sum() + pred.sum()).backward()
        return nodes.detach().cpu(), pred.detach().cpu(), {
            n: p.grad.detach().cpu().clone() for n, p in m.named_parameters()
            if p.grad is not None}
    ref = run(model, lambda: reference_node_outputs(model, graph, pert, aggr),
              lambda: reference_predict(model, graph, pert, aggr, dual=True))

    scale = max(float(t.abs().max()) for t in [ref[0], ref[1], *ref[2].values()])

    def rel(a, b):
        """max |a - b| / max |b|; a reference tensor near zero (below 1e-6 of the largest
        reference magnitude, e.g. a gradient the dual forward cancels) uses that floor."""
        return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-6 * scale)
    on_dev = _model_on(model, dev)
    report = {}
    for name in strategies:
        kw = {"storage_dir": storage_dir} if name == "replicated_mask_stored" else {}
        s = make_strategy(name, graph, aggr=aggr, device=dev, **kw)
        if not s.exact:
            continue
        if name == "replicated_mask_stored":
            s.store(pert)
        # the host pipeline (items, collate) takes the host's perturbations, as a DataLoader does
        got = run(on_dev, lambda: s.node_outputs(on_dev, build_ctx(s, pert)),
                  lambda: s.predict(on_dev, build_ctx(s, pert), dual=True))
        report[name] = max([rel(got[0], ref[0]), rel(got[1], ref[1])] +
                           [rel(got[2][n], ref[2][n]) for n in ref[2]])
    return report
