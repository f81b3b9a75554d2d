"""The benchmark's convert section: a TorchCell-shaped encoder on B masked copies, converted
(:func:`workbook_lib.nodemask.convert`) and its floor; the workbook's own model converted against
its hand-written delta form; the masked copies against the converted form on a graph whose
deletions reach few genes. Forward + backward per exact sample, interleaved (see
:func:`convert_section`)."""
from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import GINConv
from torch_geometric.nn.aggr import AttentionalAggregation

from ...data.snapshots import CellGraph, induced_subgraph
from ...measurement.timing import interleave, measure
from ...results.stat import Stat
from ...nodemask import convert
from ...nodemask.parts import time_parts
from ...results.bench import ConvertBench, PerSample, ReplicatedPlan

PART_STEPS = 3  # steps of the pass that times the converted step's parts


class TorchCellEncoder(nn.Module):
    """``encoder(x, edge_index_dict) -> [N, H]``: per layer, per edge type a GIN (two-layer MLP,
    trainable eps), the types summed, LayerNorm, ReLU (examples/torchcell_pyg.py's shape)."""

    def __init__(self, edge_types: list, hidden: int, layers: int):
        super().__init__()
        self.convs = nn.ModuleList(
            nn.ModuleDict({_name(et): GINConv(nn.Sequential(
                nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden)), train_eps=True)
                for et in edge_types})
            for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))

    def forward(self, x, edge_index_dict):
        for convs, norm in zip(self.convs, self.norms):
            x = sum(convs[_name(et)](x, ei) for et, ei in edge_index_dict.items())
            x = norm(x).relu()
        return x


def _name(et) -> str:
    return "__".join(et) if isinstance(et, tuple) else str(et)


class TorchCellModel(nn.Module):
    """Gene embedding, :class:`TorchCellEncoder`, attention pooling over kept genes, a head."""

    def __init__(self, num_genes: int, edge_types: list, hidden: int, layers: int, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.embedding = nn.Parameter(torch.randn(num_genes, hidden) * 0.1)
        self.encoder = TorchCellEncoder(edge_types, hidden, layers)
        self.pool = AttentionalAggregation(nn.Linear(hidden, 1))
        self.head = nn.Linear(hidden, 1)


class PerturbGINEncoder(nn.Module):
    """The workbook's :class:`~workbook_lib.strategies.model.PerturbGIN` as a PyG encoder, on its
    parameters: per layer, per type ``GINConv`` (identity, the model's eps), concatenated, the
    layer's linear map, ReLU but after the last."""

    def __init__(self, model, aggr: str):
        super().__init__()
        self.lins, self.types = model.lins, list(model.edge_types)
        a = "add" if aggr == "sum" else "mean"
        self.convs = nn.ModuleList(GINConv(nn.Identity(), eps=model.eps, aggr=a)
                                   for _ in self.lins)  # one per call: convert plans per module

    def forward(self, x, edge_index_dict):
        last = len(self.lins) - 1
        for i, (lin, conv) in enumerate(zip(self.lins, self.convs)):
            x = lin(torch.cat([conv(x, edge_index_dict[t]) for t in self.types], dim=-1))
            if i < last:
                x = x.relu()
        return x


def masked_copies_bytes(num_edges: int, max_type_edges: int, num_genes: int, num_types: int,
                        hidden: int, layers: int) -> float:
    """A planning estimate of one masked copy's peak in a TorchCell-shaped step (bytes): its
    offset edge index, mask and masked copy, the gathered messages of the largest type and
    the activations every layer and type keeps for the backward. Only used to pick a batch."""
    edges = num_edges * (2 * 8 + 1 + 2 * 8)
    act = layers * num_types * num_genes * hidden * 4 * 5
    return 1.5 * (edges + 2 * max_type_edges * hidden * 4 + act)


def masked_step(model: TorchCellModel, edges: dict, pert: torch.Tensor, num_genes: int):
    """A training step of ``model`` as TorchCell runs it: B copies of the graph in one batch,
    per copy and type a boolean edge mask (False on edges touching a deleted gene; built here,
    outside the step, as a data loader's collate builds it), deleted genes' input rows zeroed,
    attention pooling over kept genes."""
    b, n = pert.shape[0], num_genes
    dev = model.embedding.device
    keep = _keep(pert, n).view(-1).to(dev)
    offs = (torch.arange(b, device=dev) * n).view(1, b, 1)
    big = {t: (ei.to(dev).unsqueeze(1) + offs).reshape(2, -1) for t, ei in edges.items()}
    mask = {t: keep[e[0]] & keep[e[1]] for t, e in big.items()}
    node_id = torch.arange(n, device=dev).repeat(b)
    batch = torch.arange(b, device=dev).repeat_interleave(n)

    def forward():
        x = model.embedding[node_id] * keep.unsqueeze(-1)
        h = model.encoder(x, {t: e[:, mask[t]] for t, e in big.items()})
        return model.head(model.pool(h[keep], batch[keep], dim_size=b)).squeeze(-1)
    return _trained(model, forward), forward


def converted_step(model: nn.Module, fast, pert: torch.Tensor):
    """A training step of a converted model: ``head(fast(embedding, deleted))``, the plan
    made afresh each step (a training loop's batches differ)."""
    host = pert.cpu()

    def forward():
        fast.clear_plan()
        return model.head(fast(model.embedding, host)).squeeze(-1)
    return _trained(model, forward), forward


def _trained(model: nn.Module, forward):
    def step():
        model.zero_grad(set_to_none=True)
        forward().sum().backward()
    return step


def _keep(pert: torch.Tensor, n: int) -> torch.Tensor:
    keep = torch.ones(pert.shape[0], n, dtype=torch.bool)
    p = pert.cpu()
    rows = torch.arange(p.shape[0]).unsqueeze(1).expand_as(p)
    keep[rows[p >= 0], p[p >= 0]] = False
    return keep


def few_reach_graph(graph: CellGraph, per_type: int, seed: int) -> dict:
    """``{type: edge_index}``: ``per_type`` edges sampled from each type of ``graph`` (seeded),
    so that a deletion reaches few genes within the benchmark's layers."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for t, ei in graph.edge_index.items():
        m = min(per_type, ei.shape[1])
        out[t] = ei[:, torch.randperm(ei.shape[1], generator=g)[:m]].contiguous()
    return out


def rel_error(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Max over pairs of ``max|got - want| / max|want|``; a reference that is zero but for
    rounding (``max|want|`` below 1e-12 of the largest reference value: an attention gate's bias,
    whose gradient a softmax cancels) is compared against that largest value instead."""
    scale = max(float(b.abs().max()) for b in want)
    out = 0.0
    for a, b in zip(got, want, strict=True):
        ref = max(float(b.abs().max()), 1e-30)
        out = max(out, float((a - b).abs().max()) / (ref if ref >= 1e-12 * scale else scale))
    return out


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def torchcell_exact_error(graph: CellGraph, pert: torch.Tensor, *, hidden: int, layers: int,
                          seed: int, device: torch.device | str = "cpu") -> float:
    """The TorchCell-shaped model converted against its B masked copies on ``graph``, in float64
    on ``device``: the largest relative error over its predictions and every gradient."""
    n = graph.num_genes
    edges = {t: e.to(device) for t, e in graph.edge_index.items()}
    tc = TorchCellModel(n, list(edges), hidden, layers, seed).double().to(device)
    fast = convert(tc.encoder, edges, readout=tc.pool)
    runs = []
    for fn in (masked_step(tc, edges, pert, n)[1], converted_step(tc, fast, pert)[1]):
        tc.zero_grad(set_to_none=True)
        y = fn()
        y.sum().backward()
        runs.append([y.detach().cpu()] + [g.cpu() for g in _grads(tc)])
    return rel_error(runs[1], runs[0])


def exact_errors(graph: CellGraph, pert: torch.Tensor, *, hidden: int, layers: int, aggr: str,
                 seed: int) -> dict[str, float]:
    """On ``graph`` (the benchmark's small subgraph): the TorchCell-shaped model converted
    against its B masked copies in float64 (predictions and every gradient), and the workbook's
    own model converted (no readout) against its hand-written delta form's node outputs on the
    kept genes in float32, the hand-written kernels' type (outputs and every gradient of a
    weighted sum over them: the deleted genes' own rows differ by definition, convert zeroing
    their inputs where the workbook keeps their embeddings)."""
    from ...strategies import build_ctx, make_strategy
    from ...strategies.model import PerturbGIN

    n, edges = graph.num_genes, graph.edge_index
    out = {"torchcell_converted": torchcell_exact_error(graph, pert, hidden=hidden,
                                                        layers=layers, seed=seed)}
    own = PerturbGIN(n, list(edges), hidden=hidden, layers=layers, seed=seed)  # float32 kernels
    strat = make_strategy("node_mask_shared", graph, aggr=aggr, device="cpu", middle="delta")
    fast = convert(PerturbGINEncoder(own, aggr), edges)
    keep = _keep(pert, n).unsqueeze(-1).float()
    w = torch.randn(pert.shape[0], n, hidden, generator=torch.Generator().manual_seed(seed)) * keep
    runs = []
    for fn in (lambda: strat.node_outputs(own, build_ctx(strat, pert)),
               lambda: fast(own.embedding, pert)):
        own.zero_grad(set_to_none=True)
        h = fn()
        (h * w).sum().backward()
        runs.append([(h * keep).detach()] + _grads(own))
    out["own_converted"] = rel_error(runs[1], runs[0])
    return out


def convert_section(params, graph: CellGraph, dev: torch.device, *, pert: torch.Tensor,
                    own_model: nn.Module, own_step, machine: dict,
                    masked_plan: ReplicatedPlan, probes: dict | None = None) -> ConvertBench:
    """Time, interleaved, forward + backward per exact sample: the TorchCell-shaped model on
    masked copies (``masked_plan``'s largest batch: the largest that fits, at most the converted
    batch; :func:`masked_copies_bytes` estimates a copy) and
    converted (``pert``'s batch), the workbook's model converted and ``own_step`` (its
    hand-written delta form on ``pert``), and the TorchCell-shaped model on masked copies and
    converted on a graph whose deletions reach few genes; the converted encoder's floor at the
    ``machine``'s best rates; where the converted step's time goes, part by part, beside each
    part's floor at those rates (:func:`~workbook_lib.nodemask.parts.time_parts`: a pass of its
    own after the timed steps); exactness on the benchmark's small subgraph.

    Args:
        params: the benchmark's params (hidden, layers, seed, aggr, timing and batch settings).
        graph: the benchmark's graph; dev: its device; pert: ``[B, k]``, the shared form's batch.
        own_model: the shared form's ``PerturbGIN``; own_step: its timed step on ``pert``.
        machine: ``sparse_gmacs`` and ``dense_gmacs`` (the bench's best measured rates).
        masked_plan: where the masked copies are timed (``bench.replicated_plan``).
        probes: None, or ``{"sparse": (fn, macs), "dense": (fn, macs)}`` (and optionally
            ``"dense_shaped"``, below): the kernels those
            rates came from, timed again in the same rounds, so that the converted sample's
            ratio to its floor is also given at each round's own rates
            (:attr:`ConvertBench.floor_same_rounds`: a machine whose speed drifts between the
            rates' measurement and the rounds moves the first ratio, not this one); with
            ``"dense_shaped"`` (:func:`.rates.shaped_dense_probe`), the ratio with the
            floor's dense work priced in each round at the rate of a linear map's three
            products at the encoder's own layer shape (:attr:`ConvertBench.floor_shaped_rounds`).
    """
    hidden, layers, n = params.hidden, params.layers, graph.num_genes
    bs = pert.shape[0]
    edges = {t: ei.to(dev) for t, ei in graph.edge_index.items()}
    tc = TorchCellModel(n, list(edges), hidden, layers, params.seed).to(dev)
    fast = convert(tc.encoder, edges, readout=tc.pool)
    plan = masked_plan
    mb = plan.batches[-1]
    own_fast = convert(PerturbGINEncoder(own_model, params.aggr), edges, readout="mean")
    sparse = few_reach_graph(graph, max(1, n // 8), params.seed)
    sparse = {t: e.to(dev) for t, e in sparse.items()}
    tc_sparse = TorchCellModel(n, list(sparse), hidden, layers, params.seed).to(dev)
    fast_sparse = convert(tc_sparse.encoder, sparse, readout=tc_sparse.pool)
    fns = {"torchcell_masked": masked_step(tc, edges, pert[:mb], n)[0],
           "torchcell_converted": converted_step(tc, fast, pert)[0],
           "own_converted": converted_step(own_model, own_fast, pert)[0],
           "own_handwritten": own_step,
           "few_reach_masked": masked_step(tc_sparse, sparse, pert[:mb], n)[0],
           "few_reach_converted": converted_step(tc_sparse, fast_sparse, pert)[0]}
    batch = {k: (mb if k.endswith("masked") else bs) for k in fns}
    rate_fns = {f"rate_{k}": fn for k, (fn, _) in (probes or {}).items()}
    res = interleave({**fns, **rate_fns}, device=dev, warmup=params.warmup,
                     min_rounds=max(3, params.min_repeats), target=params.precision_target,
                     max_time_s=10 * params.time_budget_s, judged=list(fns))
    per_round = {k: res.stats[k].scaled(1.0 / batch[k], "s/sample") for k in fns}
    # in the rounds each step follows another form's (after the masked copies', on memory they
    # returned): the converted step again, its steps in a row, as a training loop runs them
    st = measure(fns["torchcell_converted"], device=dev, warmup=1,
                 min_repeats=max(3, params.min_repeats), target=params.precision_target,
                 max_time_s=params.time_budget_s).scaled(1.0 / bs, "s/sample")
    loop = PerSample(st.median, st.iqr, st.n, bs, "TorchCell-shaped, converted, back to back",
                     "the shared form's batch; timed after the rounds, its steps in a row")
    masked_why = f"the largest batch that fits, at most the converted one: {plan.rule}"
    labels = {
        "torchcell_masked": ("TorchCell-shaped, B masked copies", masked_why),
        "torchcell_converted": ("TorchCell-shaped, converted", "the shared form's batch"),
        "own_converted": ("workbook's model, converted", "the shared form's batch"),
        "own_handwritten": ("workbook's model, hand-written delta form (the bench's 'shared')",
                            "the shared form's batch"),
        "few_reach_masked": ("few-reach graph: TorchCell-shaped, B masked copies", masked_why),
        "few_reach_converted": ("few-reach graph: TorchCell-shaped, converted",
                                "the shared form's batch")}
    forms = {k: PerSample(st.median, st.iqr, st.n, batch[k], *labels[k])
             for k, st in per_round.items()}
    # where that step's time goes, part by part (a pass of its own: on a GPU each part is
    # synchronized, which the timed steps above are not)
    parts = time_parts(fns["torchcell_converted"], steps=PART_STEPS, device=dev, warmup=0)
    floor = fast.floor(pert)
    floor_s = floor.seconds_at(machine["sparse_gmacs"], machine["dense_gmacs"]) \
        if machine.get("sparse_gmacs") and machine.get("dense_gmacs") else None
    part_rows = parts.against(floor, machine["sparse_gmacs"], machine["dense_gmacs"]) \
        if floor_s is not None else []
    same, round_rates = floor_in_rounds(floor, res.stats, probes or {}, bs)
    shaped, shaped_rates = floor_in_rounds(floor, res.stats, probes or {}, bs, "dense_shaped")
    round_rates.update({k: v for k, v in shaped_rates.items() if k == "dense_shaped"})
    small = induced_subgraph(graph, min(params.exactness_genes, n))
    g = torch.Generator().manual_seed(params.seed)
    small_pert = torch.stack([torch.randperm(small.num_genes, generator=g)[:pert.shape[1]]
                              for _ in range(min(bs, 4))])
    errs = exact_errors(small, small_pert, hidden=min(hidden, 8), layers=layers,
                        aggr=params.aggr, seed=params.seed)
    return ConvertBench(
        forms=forms, steps={k: res.stats[k] for k in fns}, rounds=res.rounds,
        masked_vs_converted=per_round["torchcell_masked"].ratio_to(
            per_round["torchcell_converted"], paired=True),
        converted_vs_handwritten=per_round["own_converted"].ratio_to(
            per_round["own_handwritten"], paired=True),
        few_reach_masked_vs_converted=per_round["few_reach_masked"].ratio_to(
            per_round["few_reach_converted"], paired=True),
        floor=floor, floor_seconds=floor_s,
        floor_rates=(f"sparse {machine['sparse_gmacs']:.3g} GMAC/s ("
                     f"{machine.get('sparse_source', '')}), dense {machine['dense_gmacs']:.3g} "
                     f"({machine.get('dense_source', '')})") if floor_s is not None else "",
        explain=fast.explain(pert), few_reach_explain=fast_sparse.explain(pert),
        few_reach_edges_per_type=max(1, n // 8),
        exact_max_rel_error=errs, exact_genes=small.num_genes, loop=loop,
        floor_same_rounds=same, round_rates=round_rates, floor_shaped_rounds=shaped,
        parts=parts, part_rows=part_rows)


def floor_in_rounds(floor, stats: dict, probes: dict, batch: int,
                    dense: str = "dense") -> tuple:
    """The converted TorchCell-shaped sample over its floor's time at each round's own rates:
    per round, the floor's sparse and dense multiply-adds priced at the rates its ``rate_sparse``
    and ``rate_<dense>`` probes (``probes``: ``(fn, macs)`` each) ran at in that round, and the
    converted step of that round (``stats``, seconds per step of ``batch`` samples) over it.
    ``dense`` names the dense probe: ``"dense"`` (the large matmul: the machine's best rate) or
    ``"dense_shaped"`` (a GIN-MLP layer's own products, :func:`.rates.shaped_dense_probe`).
    Returns ``(Stat of the per-round ratios, {"sparse": Stat, dense: Stat} of the rates in
    G multiply-adds/s)``, or ``(None, {})`` without both probes."""
    if not {"sparse", dense} <= set(probes) or "torchcell_converted" not in stats:
        return None, {}
    keys = ("sparse", dense)
    rates = {k: [probes[k][1] / t / 1e9 for t in stats[f"rate_{k}"].samples] for k in keys}
    conv = stats["torchcell_converted"].samples
    ratios = [(c / batch) / floor.seconds_at(s, d)
              for c, s, d in zip(conv, rates["sparse"], rates[dense])]
    return (Stat.from_samples(ratios, unit="ratio"),
            {k: Stat.from_samples(v, unit="GMAC/s") for k, v in rates.items()})
