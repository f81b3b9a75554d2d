"""The strategy benchmark: forward + backward per sample, interleaved in one process.

``python -m workbook_lib bench --params FILE --out FILE.json`` and notebook 02's benchmark
section run :func:`run_bench`. At the params' sizes (or the real spec with ``bench_full_size``)
it times, in the same rounds (A, B, C... then again, so drift cancels in the ratios):

* ``shared``: the node-mask shared graph (strategy 6) at ``batch_size_lazy`` (the investigation: 28);
* ``replicated_gather_scatter``: replicated masks as the investigation's model computes them (every
  message materialised, then masked), at the largest batch that fits, capped by
  ``bench_replicated_max_batch`` (its cost is linear in B, so it is compared per sample);
* ``replicated_sparse``: the same masks as the values of one sparse product per edge type;
* ``wildtype``: one DANGO-style step (a single wildtype pass) at ``batch_size_dango``;
* ``floor``: the shared step's own sparse products and dense matrix products, called raw at the
  same shapes and counts, without the elementwise work, indexing and autograd between them:
  what this machine's kernels allow for that step.

Every step includes the dual forward when the params ask for it, and builds its batch on the
host as the training loop does. It also times the sparse-product kernels that were tried for the
per-sample product (the ``kernels`` table) and checks the shared graph's exactness against the
plain reference on a small induced subgraph in the same run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..data.snapshots import induced_subgraph, load_snapshot
from ..measurement.memory import is_oom
from ..measurement.timing import Stat, interleave
from ..nodemask import SharedGraph
from ..records import Record
from ..report.progress import note
from ..strategies import build_ctx
from ..training.factory import build_run

REAL_SPEC = {"scale": 1.0, "hidden": 64, "layers": 3}


@dataclass
class PerSample(Record):
    """Seconds per sample of one variant (its step divided by its batch size)."""

    median: float
    iqr: float
    n: int
    batch_size: int
    label: str = ""
    batch_reason: str = ""


@dataclass
class KernelFigure(Record):
    name: str
    description: str
    seconds: Stat
    gmacs: float  # multiply-adds per second, 1e9


@dataclass
class BenchResult(Record):
    device: str
    sizes: dict
    full_size: bool
    per_sample_s: dict[str, PerSample]
    steps: dict[str, Stat]  # seconds per step
    ratio_vs_lazy_form: Stat | None
    ratio_vs_sparse_form: Stat | None
    passes_per_sample: Stat | None
    floor_fraction: Stat | None
    exact_max_rel_error: float
    kernels: list[KernelFigure] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # variant -> why it did not run
    rounds: int = 0
    seconds: float = 0.0


def replicated_bytes_per_sample(num_edges: int, max_type_edges: int, num_genes: int,
                                num_types: int, hidden: int, form: str) -> float:
    """A planning estimate of one replicated sample's peak in a training step (bytes): its
    edge copy and mask plus the transient per-edge tensors of the largest edge type. Only used
    to pick a batch that fits; notebook 02 measures the real peak."""
    base = 2 * num_edges * 8 + num_edges * (1 + 4)
    transient = 4 * max_type_edges * hidden * 4 if form == "gather_scatter" else \
        max_type_edges * (8 + 4) * 2
    act = num_genes * hidden * 4 * (num_types + 3)
    return 1.5 * (base + transient + act)


def _budget(device: torch.device) -> float:
    import psutil

    if device.type == "cuda":
        return 0.8 * torch.cuda.mem_get_info(device)[0]
    return 0.6 * psutil.virtual_memory().available


def _step_fn(run, pert):
    def step():
        run.model.zero_grad(set_to_none=True)
        ctx = build_ctx(run.strategy, pert)
        run.strategy.predict(run.model, ctx, dual=run.dual).sum().backward()
    return step


def floor_fn(sg: SharedGraph, batch: int, hidden: int, layers: int, dual: bool, device):
    """The shared step's heavy operations, raw: sparse products and dense matmuls at the same
    shapes and counts as :class:`~workbook_lib.strategies.node_mask_shared.NodeMaskShared`."""
    n, t, h = sg.num_nodes, sg.num_types, hidden
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(device)
    x0, w, ws, gw = r(n, h), r(h, t * h), r(h, h), r(n, h)
    xb, gb = r(batch, n, h), r(batch, n, h)
    agg = torch.empty(batch, t, n, h, device=device)
    wr = w.view(h, t, h).permute(1, 2, 0).contiguous()
    wt = w.view(h, t, h).permute(1, 0, 2).contiguous()
    gx = torch.empty(batch, n, h, device=device)
    d = torch.rand(n, batch, generator=g).to(device)
    pw = r(batch, t, n)
    gp = r(batch, t, h)

    def wildtype_layer():
        s = torch.sparse.mm(sg.a, x0)  # forward: stacked product, linear, self term
        s.view(n, t * h) @ w.T
        x0 @ ws.T
        gw.T @ s.view(n, t * h)  # backward: weight gradients, input gradient through A^T
        gw.T @ x0
        torch.sparse.mm(sg.a_t, (gw @ w).view(n * t, h))
        gw @ ws

    def step():
        wildtype_layer()  # the incremental first layer's wildtype pass
        for _ in range(max(0, layers - 2)):  # middle layers, forward and backward
            for i in range(batch):
                for j in range(t):
                    agg[i, j].addmm_(sg.per_type[j], xb[i], beta=0)
                torch.bmm(agg[i], wr).sum(0)
            xb.view(-1, h) @ ws.T
            for i in range(batch):
                gi = gb[i].unsqueeze(0).expand(t, n, h)
                torch.bmm(gi.transpose(1, 2), agg[i])
                ga = torch.bmm(gi, wt)
                gx[i].zero_()
                for j in range(t):
                    gx[i].addmm_(sg.per_type_t[j], ga[j])
            gb.view(-1, h).T @ xb.view(-1, h)
            gb.view(-1, h) @ ws
        if layers > 1:  # the pooled last layer: two width-B products, weighted sums
            torch.sparse.mm(sg.a, d)
            torch.sparse.mm(sg.blockdiag_t, d.repeat_interleave(t, dim=0))
            torch.bmm(pw, xb)
            torch.bmm(pw.transpose(1, 2), gp)
        if dual:
            for _ in range(layers - 1):
                wildtype_layer()
    return step


def kernel_figures(sg: SharedGraph, batch: int, hidden: int, device, *, target: float,
                   max_time_s: float) -> list[KernelFigure]:
    """The per-sample product of a middle layer (every edge type, every sample) with each
    kernel tried."""
    n, t = sg.num_nodes, sg.num_types
    x = torch.randn(batch, n, hidden, device=device)
    wide_x = x.permute(1, 0, 2).reshape(n, batch * hidden).contiguous()
    a = sg.a
    a64 = torch.sparse_csr_tensor(a.crow_indices().long(), a.col_indices().long(), a.values(),
                                  size=a.shape)
    out_s = torch.empty(batch, n * t, hidden, device=device)
    out_t = torch.empty(batch, t, n, hidden, device=device)

    def slabs():
        for i in range(batch):
            out_s[i].addmm_(a, x[i], beta=0)

    def typed():
        for i in range(batch):
            for j in range(t):
                out_t[i, j].addmm_(sg.per_type[j], x[i], beta=0)
    cases = {
        "wide, int64": ("all samples side by side [N, B*H], one product, int64 indices",
                        lambda: torch.sparse.mm(a64, wide_x)),
        "wide, int32": ("[N, B*H], one product, int32 indices",
                        lambda: torch.sparse.mm(a, wide_x)),
        "slabs, stacked types": ("one product per sample slab [N, H], all types stacked",
                                 slabs),
        "slabs, per type": ("one product per (sample, type) [N, H]: every operand "
                            "cache-sized (the CPU kernel)", typed),
    }
    res = interleave({k: f for k, (_, f) in cases.items()}, device=device, warmup=1,
                     min_rounds=3, target=target, max_time_s=max_time_s)
    macs = sg.num_edges * batch * hidden
    return [KernelFigure(k, desc, res.stats[k], macs / res.stats[k].median / 1e9)
            for k, (desc, _) in cases.items()]


def exact_error(params: dict, graph, hidden: int, layers: int) -> float:
    """Max relative error of the shared graph vs the plain reference (outputs, predictions,
    gradients) on an induced subgraph, with the params' aggregation."""
    from .benchmarks import exactness_report

    small = induced_subgraph(graph, min(params["exactness_genes"], graph.num_genes))
    return exactness_report(small, ["node_mask_shared"], k=params["perturbation_k"],
                            aggr=params["aggr"], hidden=min(hidden, 16), layers=layers,
                            seed=params["seed"])["node_mask_shared"]


def run_bench(params: dict, *, full_size: bool | None = None, device=None) -> BenchResult:
    """Run the benchmark (see the module docstring)."""
    from ..running.environment import device_label, resolve_device

    full = params["bench_full_size"] if full_size is None else full_size
    p = {**params, **REAL_SPEC} if full else dict(params)
    dev = resolve_device(p["device"]) if device is None else torch.device(device)
    t0 = time.perf_counter()
    graph = load_snapshot(p)
    hidden, layers = p["hidden"], p["layers"]
    budget = _budget(dev)
    plan = {"shared": ("node_mask_shared", None, p["batch_size_lazy"]),
            "replicated_gather_scatter": ("replicated_mask_cpu", "gather_scatter", None),
            "replicated_sparse": ("replicated_mask_cpu", "spmm", None),
            "wildtype": ("dango_wildtype", None, p["batch_size_dango"])}
    fns, per_b, reasons, labels, skipped = {}, {}, {}, {}, {}
    for key, (name, form, b) in plan.items():
        reason = "batch_size_dango" if key == "wildtype" else "batch_size_lazy"
        if b is None:
            per = replicated_bytes_per_sample(
                graph.num_edges(), max(graph.num_edges(t) for t in graph.edge_types),
                graph.num_genes, len(graph.edge_types), hidden, form)
            fits = max(1, int(budget // per))
            b = min(p["batch_size_lazy"], fits, p["bench_replicated_max_batch"])
            if b < p["batch_size_lazy"]:
                reason = ("bench_replicated_max_batch" if b == p["bench_replicated_max_batch"]
                          else f"largest fitting {budget / 1e9:.0f} GB at about "
                               f"{per / 1e9:.1f} GB/sample (estimate)")
        note(f"bench: preparing {key} (B={b})")
        try:
            run = build_run(p, name, graph=graph, device=dev, batch_size=b, form=form)
            fns[key] = _step_fn(run, run.perturbations(b))
            fns[key]()  # fails here, not in the middle of a round, if it does not fit
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is recorded
            if not is_oom(exc):
                raise
            skipped[key] = f"out of memory at B={b}: {str(exc).splitlines()[0][:160]}"
            fns.pop(key, None)
            continue
        per_b[key], reasons[key] = b, reason
        labels[key] = run.strategy.label + (f" ({form.replace('_', '-')})" if form else "")
    sg = SharedGraph(graph.edge_index, graph.num_genes, aggr=p["aggr"], device=dev,
                     allow_self_loops=True)
    fns["floor"] = floor_fn(sg, per_b.get("shared", p["batch_size_lazy"]), hidden, layers,
                            p["dual_forward"], dev)
    note("bench: timing the variants interleaved")
    res = interleave(fns, device=dev, warmup=p["warmup"], min_rounds=max(3, p["min_repeats"]),
                     target=p["precision_target"], max_time_s=10 * p["time_budget_s"])

    def per_round(k):
        return res.stats[k].scaled(1.0 / per_b[k], "s/sample")
    per_sample = {}
    for k in fns:
        if k != "floor":
            st = per_round(k)
            per_sample[k] = PerSample(st.median, st.iqr, st.n, per_b[k], labels[k], reasons[k])

    def ratio(a, b):
        if a not in per_b or b not in per_b:
            return None
        return per_round(a).ratio_to(per_round(b), paired=True)
    passes = per_round("shared").ratio_to(res.stats["wildtype"], paired=True) \
        if "shared" in per_b and "wildtype" in per_b else None
    floor = res.stats["floor"].ratio_to(res.stats["shared"], paired=True) \
        if "shared" in per_b else None
    note("bench: kernels tried, exactness")
    kernels = kernel_figures(sg, per_b.get("shared", p["batch_size_lazy"]), hidden, dev,
                             target=p["precision_target"], max_time_s=5 * p["time_budget_s"])
    err = exact_error(p, graph, hidden, layers)
    return BenchResult(
        device=device_label(dev),
        sizes={"num_genes": graph.num_genes, "edges": graph.num_edges(),
               "edge_types": len(graph.edge_types), "scale": graph.scale, "hidden": hidden,
               "layers": layers, "k": p["perturbation_k"], "aggr": p["aggr"],
               "dual_forward": p["dual_forward"]},
        full_size=bool(full), per_sample_s=per_sample, steps=dict(res.stats),
        ratio_vs_lazy_form=ratio("replicated_gather_scatter", "shared"),
        ratio_vs_sparse_form=ratio("replicated_sparse", "shared"),
        passes_per_sample=passes, floor_fraction=floor, exact_max_rel_error=err,
        kernels=kernels, skipped=skipped, rounds=res.rounds,
        seconds=time.perf_counter() - t0)


def summary_lines(r: BenchResult) -> list[str]:
    """A short plain-text table (the CLI prints it)."""
    s = r.sizes
    lines = [f"bench on {r.device}: {s['edges']:,} edges, H={s['hidden']}, L={s['layers']}, "
             f"k={s['k']}; {r.rounds} interleaved rounds, {r.seconds:.0f} s",
             f"{'variant':28s} {'B':>4s} {'ms/sample':>11s} {'IQR':>8s} {'n':>3s}"]
    for k, v in r.per_sample_s.items():
        lines.append(f"{k:28s} {v.batch_size:4d} {v.median * 1e3:11.2f} {v.iqr * 1e3:8.2f} "
                     f"{v.n:3d}")
    for k, why in r.skipped.items():
        lines.append(f"{k:28s} skipped: {why}")

    def show(label, st):
        if st is not None:
            lines.append(f"{label:28s} {st.median:.3g} (IQR {st.iqr:.2g})")
    show("ratio vs Lazy model's form", r.ratio_vs_lazy_form)
    show("ratio vs sparse form", r.ratio_vs_sparse_form)
    show("wildtype steps per sample", r.passes_per_sample)
    show("floor / shared step", r.floor_fraction)
    lines.append(f"{'exact max rel. error':28s} {r.exact_max_rel_error:.2e}")
    return lines
