"""The strategy benchmark: forward + backward per sample of each mask strategy, interleaved in
rounds in one process (``python -m workbook_lib bench``; notebook 02's benchmark section).

Forms timed: ``shared`` (strategy 6, delta-propagated), ``shared_full`` (every middle layer one
product per sample), ``replicated_gather_scatter``, ``replicated_sparse`` and ``wildtype``. It
runs at ``max(layers, bench_min_layers)`` layers; replicated forms are timed at the shared form's
batch where it fits (:func:`replicated_plan`, :func:`replicated_fit`). Beside the times it
reports achieved multiply-add rates, this machine's best measured rates and the floor
(:mod:`workbook_lib.nodemask.floor`), and checks the shared graph's exactness on a small subgraph.
The rules and their reasons: docs/figures.md, "The strategy benchmark".
"""
from __future__ import annotations

import time

import torch

from ...configs.validation import Params
from ...data.snapshots import induced_subgraph, load_snapshot
from ...measurement.memory import is_oom
from ...measurement.timing import Stat, interleave
from ...nodemask import SharedGraph
from ...nodemask.compiled import numba_threading_layer
from ...common.progress import note
from ...strategies import build_ctx
from ...training.factory import build_run
from ...results.bench import (BenchResult, FloorFigure, FormChoice, PerSample, RateFigure,
                              ReplicatedFit, ReplicatedPlan, recommended_form)  # noqa: F401
from .rates import (achieved_rates, dense_probe, dense_rate, kernel_cases, kernel_figures,
                    shaped_dense_probe)

REAL_SPEC = {"scale": 1.0, "hidden": 64, "layers": 3}


def floor_figure(sg: SharedGraph, pert: torch.Tensor, hidden: int, layers: int, dual: bool,
                 rates: list[RateFigure], machine: dict, shared: PerSample) -> FloorFigure:
    """The floor of the benchmark batch ``pert`` (``[B, k]``) and the shared step's measured
    counts (its ``rates``) per sample, with the floor's time at the machine's and at the step's
    rates."""
    from ...nodemask import corrections
    from ...nodemask.floor import work_floor

    wf = work_floor(sg, corrections(sg.out_edges, pert.cpu()), hidden, layers, dual)
    b = wf.batch_size
    got = {f.kind: f for f in rates if f.variant == "shared"}
    fig = FloorFigure(b, wf.per_sample("sparse_macs"), wf.per_sample("dense_macs"),
                      wf.per_sample("bytes"), parts=wf.parts,
                      measured_sparse_macs=got["sparse"].step_macs / b if "sparse" in got
                      else None,
                      measured_dense_macs=got["dense"].step_macs / b if "dense" in got else None,
                      measured_seconds=shared.median)
    if machine.get("sparse_gmacs") and machine.get("dense_gmacs"):
        fig.seconds_at_machine = wf.seconds_at(machine["sparse_gmacs"], machine["dense_gmacs"])
        fig.rates_source = (f"sparse {machine['sparse_gmacs']:.3g} GMAC/s, "
                            f"{machine.get('sparse_source', '')}; dense "
                            f"{machine['dense_gmacs']:.3g}, {machine.get('dense_source', '')}")
    if "sparse" in got and "dense" in got:
        fig.seconds_at_step_rates = wf.seconds_at(got["sparse"].gmacs, got["dense"].gmacs)
    return fig


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


def _budget(device: torch.device, budget_gb: float | None = None) -> float:
    """Bytes the benchmark may plan for: ``budget_gb`` when given, else 80% of the GPU's free
    memory or 60% of the host's available memory."""
    import psutil

    if budget_gb is not None:
        return budget_gb * 1e9
    if device.type == "cuda":
        return 0.8 * torch.cuda.mem_get_info(device)[0]
    return 0.6 * psutil.virtual_memory().available


def _step_fn(run, pert):
    def step():
        run.model.zero_grad(set_to_none=True)
        ctx = build_ctx(run.strategy, pert)
        run.strategy.predict(run.model, ctx, dual=run.dual).sum().backward()
    return step


def amortised(b1: Stat, b2: Stat | None, at_batch: int) -> Stat:
    """Seconds per sample at ``at_batch`` from steps timed at B = 1 and B = 2 in the same
    rounds: per round, the line through the two points, ``(a + b B) / B`` with
    ``a = 2 t1 - t2`` (the per-step part) and ``b = t2 - t1`` (the per-sample part). Without a
    B = 2 timing, the B = 1 step as it is."""
    if b2 is None:
        return b1.scaled(1.0, "s/sample")
    if len(b1.samples) != len(b2.samples) or not b1.samples:
        raise ValueError("B = 1 and B = 2 must be timed in the same rounds")
    bs = at_batch
    return Stat.from_samples([(t1 * (2 - bs) + t2 * (bs - 1)) / bs
                              for t1, t2 in zip(b1.samples, b2.samples)],
                             unit="s/sample", target=b1.target).with_cpu(b1.cpu, b2.cpu)


def exact_error(params: Params, graph, hidden: int, layers: int) -> float:
    """Max relative error of the shared graph vs the plain reference (outputs, predictions,
    gradients) on an induced subgraph, with the params' aggregation."""
    from .layers import exactness_report

    small = induced_subgraph(graph, min(params.exactness_genes, graph.num_genes))
    return exactness_report(small, ["node_mask_shared"], k=params.perturbation_k,
                            aggr=params.aggr, hidden=min(hidden, 16), layers=layers,
                            seed=params.seed)["node_mask_shared"]


def replicated_plan(compared: int, per_sample_bytes: float, budget: float,
                    max_batch: int) -> ReplicatedPlan:
    """Where to time a replicated form: at ``compared`` when ``compared * per_sample_bytes <=
    budget`` and ``compared <= max_batch``, else at the largest batch that satisfies both; B = 1 and 2
    always, as far as they fit.

    Args:
        compared: the shared form's batch (``batch_size_lazy``).
        per_sample_bytes: :func:`replicated_bytes_per_sample`.
        budget: bytes the step may use; max_batch: ``bench_replicated_max_batch``.
    """
    if compared < 1 or max_batch < 1:
        raise ValueError(f"batches must be at least 1 (got compared={compared}, "
                         f"max_batch={max_batch})")
    if per_sample_bytes <= 0 or budget <= 0:
        raise ValueError(f"the memory estimate and budget must be positive (got "
                         f"{per_sample_bytes}, {budget})")
    fits = int(budget // per_sample_bytes)
    top = max(1, min(fits, max_batch))
    est = (f"estimate {per_sample_bytes / 1e9:.2g} GB/sample, budget {budget / 1e9:.3g} GB")
    if compared <= top:
        return ReplicatedPlan(tuple(sorted({1, min(2, top), compared})), compared, True,
                              f"B = {compared} fits ({est})")
    why = (f"B = {compared} exceeds bench_replicated_max_batch = {max_batch}"
           if compared > max_batch and fits >= compared
           else f"B = {compared} does not fit: {est}, largest fitting B = {max(fits, 0)}")
    return ReplicatedPlan(tuple(sorted({1, min(2, top), top})), compared, False, why)


def replicated_fit(stats: dict[str, Stat], key: str,
                   plan: ReplicatedPlan) -> ReplicatedFit | None:
    """The per-sample figure of replicated form ``key`` under ``plan``: measured at the compared
    batch, else at the largest batch that ran (``at_least`` when the per-sample cost rose from B = 2),
    with the projection from B = 1, 2 and its error beside it. None when not even B = 1 ran.

    Args:
        stats: step times by ``"{key}@{B}"`` (missing: skipped, e.g. out of memory).
        key: the replicated variant's name; plan: its :func:`replicated_plan`.
    """
    b1, b2 = stats.get(f"{key}@1"), stats.get(f"{key}@2")
    if b1 is None:
        return None
    at = plan.compared
    projected = amortised(b1, b2, at) if b2 is not None else None
    ran = sorted(b for b in plan.batches if f"{key}@{b}" in stats)
    timed = [b for b in ran if b > 2]
    check = timed[-1] if timed else None
    check_step = stats[f"{key}@{check}"] if check else None
    err = None
    if check is not None and b2 is not None:
        err = amortised(b1, b2, check).ratio_to(check_step.scaled(1.0 / check, "s/sample"),
                                                paired=True)
    direct = stats.get(f"{key}@{at}") if at in plan.batches else None
    rule = plan.rule
    if plan.at_compared and direct is None:
        rule = f"B = {at} was planned but did not run (out of memory)"
    quoted = at if direct is not None else ran[-1]
    per = stats[f"{key}@{quoted}"].scaled(1.0 / quoted, "s/sample")
    # "at least": the per-sample cost rose from B = 2 to the quoted batch (B = 1 carries the
    # step's whole per-step part, so the trend is read from B = 2 on)
    over = [b for b in ran if b >= 2]
    rising = direct is None and len(over) > 1 and stats[f"{key}@{over[-1]}"].median / over[-1] \
        > stats[f"{key}@{over[0]}"].median / over[0]
    return ReplicatedFit(b1, b2, at, per, measured=direct is not None, projected=projected,
                         check_batch=check, check_step=check_step, projection_error=err,
                         rule=rule, quoted_batch=quoted, at_least=rising,
                         rising_over=[over[0], over[-1]] if rising else [])


def bench_layers(layers: int, min_layers: int) -> int:
    """The benchmark's depth: ``max(layers, bench_min_layers)`` (see the module docstring)."""
    return max(int(layers), int(min_layers))


def _rate_probes(sg: SharedGraph, kernel: str, pert: torch.Tensor, hidden: int, dev,
                 size: int) -> dict:
    """``{"sparse": (fn, macs), "dense": (fn, macs), "dense_shaped": (fn, macs)}``: the machine
    rates' fastest sparse kernel (``kernel``, by its name in :func:`.rates.kernel_cases`), the
    dense matmul, and the dense products at a GIN-MLP layer's own shape
    (:func:`.rates.shaped_dense_probe`), to be timed again in the convert section's rounds. A
    kernel of a product per sample slab runs at the same rate on two samples as on the batch
    (its buffers then 2/B the size: at the real spec on this project's 2-core CPU, 0.991x
    [IQR 0.065] per type and 1.000x [0.051] stacked, B = 2 against 28, 8 interleaved rounds);
    the others take the batch."""
    b = min(2, pert.shape[0]) if kernel.startswith("slabs") else pert.shape[0]
    push = kernel.startswith("push")
    sparse = kernel_cases(sg, b, hidden, dev, pert=pert[:b] if push else None,
                          only=kernel)[kernel][1:]
    return {"sparse": sparse, "dense": dense_probe(dev, size),
            "dense_shaped": shaped_dense_probe(dev, hidden, pert.shape[0] * sg.num_nodes)}


def run_bench(params: Params, *, full_size: bool | None = None, device=None) -> BenchResult:
    """Run the benchmark (see the module docstring)."""
    from ...running.environment import device_label, resolve_device
    from ...strategies import make_strategy

    full = params.bench_full_size if full_size is None else full_size
    p = params.replace(**REAL_SPEC) if full else params
    run_layers = p.layers
    p = p.replace(layers=bench_layers(p.layers, p.bench_min_layers))
    dev = resolve_device(p.device) if device is None else torch.device(device)
    t0 = time.perf_counter()
    graph = load_snapshot(p.data)
    hidden, layers, bs = p.hidden, p.layers, p.batch_size_lazy
    budget = _budget(dev, p.memory_budget_gb)
    plan = {"shared": ("node_mask_shared", None, bs, "delta"),
            "shared_full": ("node_mask_shared", None, bs, "full"),
            "wildtype": ("dango_wildtype", None, p.batch_size_dango, None)}
    if layers < 3:  # no middle layer: the two forms are one computation, timed once
        del plan["shared_full"]
    rep_plans: dict[str, ReplicatedPlan] = {}
    for key, form in (("replicated_gather_scatter", "gather_scatter"),
                      ("replicated_sparse", "spmm")):
        per = replicated_bytes_per_sample(
            graph.num_edges(), max(graph.num_edges(t) for t in graph.edge_types),
            graph.num_genes, len(graph.edge_types), hidden, form)
        rep_plans[key] = replicated_plan(bs, per, budget, p.bench_replicated_max_batch)
        for b in rep_plans[key].batches:
            plan[f"{key}@{b}"] = ("replicated_mask_cpu", form, b, None)
    fns, per_b, labels, skipped, runs = {}, {}, {}, {}, {}
    push_kernel = shared_form = ""
    for key, (name, form, b, middle) in plan.items():
        note(f"bench: preparing {key} (B={b})")
        try:
            run = build_run(p, name, graph=graph, device=dev, batch_size=b, form=form)
            if middle is not None:
                run.strategy = make_strategy(name, graph, aggr=p.aggr, device=dev,
                                             middle=middle)
            runs[key] = run
            fns[key] = _step_fn(run, run.perturbations(b))
            fns[key]()  # fails here, not in the middle of a round, if it does not fit
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is recorded
            if not is_oom(exc):
                raise
            skipped[key] = f"out of memory at B={b}: {str(exc).splitlines()[0][:160]}"
            fns.pop(key, None)
            continue
        per_b[key] = b
        if middle is not None:  # the path the step takes at this depth, and its push kernel
            path = run.strategy.path_label(layers)
            labels[key] = f"{type(run.strategy).label} [{path}]"
            shared_form = path if key == "shared" else shared_form
            if run.strategy.path(layers) == "delta":
                push_kernel = run.strategy.step_push_kernel()
        else:
            labels[key] = run.strategy.label + (f" ({form.replace('_', '-')})" if form else "")
    note("bench: timing the variants interleaved")
    res = interleave(fns, device=dev, warmup=p.warmup, min_rounds=max(3, p.min_repeats),
                     target=p.precision_target, max_time_s=10 * p.time_budget_s)
    per_round: dict[str, Stat] = {}
    per_sample: dict[str, PerSample] = {}
    for k in ("shared", "shared_full", "wildtype"):
        if k in fns:
            per_round[k] = res.stats[k].scaled(1.0 / per_b[k], "s/sample")
            why = "batch_size_dango" if k == "wildtype" else "batch_size_lazy"
            st = per_round[k]
            per_sample[k] = PerSample(st.median, st.iqr, st.n, per_b[k], labels[k], why)
    replicated = {}
    for key, rplan in rep_plans.items():
        fit = replicated_fit(res.stats, key, rplan)
        if fit is None:
            continue
        replicated[key] = fit
        st = per_round[key] = fit.per_sample
        per_sample[key] = PerSample(st.median, st.iqr, st.n, fit.quoted_batch or bs,
                                    labels[f"{key}@1"], fit.basis)

    def ratio(a, b):
        if a not in per_round or b not in per_round:
            return None
        return per_round[a].ratio_to(per_round[b], paired=True)
    passes = per_round["shared"].ratio_to(res.stats["wildtype"], paired=True) \
        if "shared" in per_round and "wildtype" in fns else None
    for key, fit in replicated.items():
        if fit.projected is not None and fit.projected.median > 0 and "shared" in per_round:
            fit.projected_ratio = fit.projected.ratio_to(per_round["shared"], paired=True)
    note("bench: kernels tried, machine rates, achieved rates, exactness")
    sg = SharedGraph(graph.edge_index, graph.num_genes, aggr=p.aggr, device=dev,
                     allow_self_loops=True)
    pert = build_run(p, "node_mask_shared", graph=graph, device=dev,
                     batch_size=bs).perturbations(bs)
    kernels = kernel_figures(sg, bs, hidden, dev, target=p.precision_target,
                             max_time_s=5 * p.time_budget_s, pert=pert)
    size = 2048 if full else 512
    dense_st, dense_g = dense_rate(dev, size=size, target=p.precision_target,
                                   max_time_s=p.time_budget_s)
    best = max(kernels, key=lambda k: k.gmacs)
    machine = {"sparse_gmacs": best.gmacs, "sparse_source": f"fastest kernel tried: {best.name}",
               "dense_gmacs": dense_g,
               "dense_source": f"{size}^3 float32 matmul "
                               f"({dense_st.median * 1e3:.3g} ms)"}
    rates = []
    for k in ("shared", "shared_full"):
        if k in fns:
            rates += achieved_rates(fns[k], dev, k, machine)
    floor = None
    if "shared" in fns and shared_form.startswith("delta"):
        floor = floor_figure(sg, pert, hidden, layers, bool(p.dual_forward), rates,
                             machine, per_sample["shared"])
    notes = []
    if layers != run_layers:
        notes.append(f"the benchmark runs at L = {layers} (this run's model has {run_layers}: "
                     f"bench_min_layers = {p.bench_min_layers}), so that the delta form, "
                     "which needs a middle layer, is measured")
    if layers > 3:
        notes.append(f"L = {layers}: only the second layer is delta-propagated; layers 3 to "
                     f"{layers - 1} run one full product per sample (by then nearly every gene "
                     "has changed)")
    if layers < 3:
        notes.append(f"L = {layers}: no middle layer, so the shared graph's step takes the "
                     "plain path (first layer incremental, last layer pooled) and the delta form "
                     "was not measured (bench_min_layers = 3 measures it)")
    err = exact_error(p, graph, hidden, layers)
    conv = None
    if "shared" in fns:
        from .convert_bench import convert_section, masked_copies_bytes

        note("bench: the convert section (TorchCell-shaped encoder; the workbook's model)")
        per = masked_copies_bytes(graph.num_edges(), max(graph.num_edges(t) for t in
                                                         graph.edge_types),
                                  graph.num_genes, len(graph.edge_types), hidden, layers)
        conv = convert_section(p, graph, dev, pert=pert, own_model=runs["shared"].model,
                               own_step=fns["shared"], machine=machine,
                               masked_plan=replicated_plan(bs, per, budget,
                                                           p.bench_replicated_max_batch),
                               probes=_rate_probes(sg, best.name, pert, hidden, dev, size))
    return BenchResult(
        device=device_label(dev),
        sizes={"num_genes": graph.num_genes, "edges": graph.num_edges(),
               "edge_types": len(graph.edge_types), "scale": graph.scale, "hidden": hidden,
               "layers": layers, "k": p.perturbation_k, "aggr": p.aggr,
               "dual_forward": p.dual_forward},
        full_size=bool(full), per_sample_s=per_sample, steps=dict(res.stats),
        ratio_vs_lazy_form=ratio("replicated_gather_scatter", "shared"),
        ratio_vs_sparse_form=ratio("replicated_sparse", "shared"),
        passes_per_sample=passes, exact_max_rel_error=err,
        ratio_vs_full_form=ratio("shared_full", "shared"), replicated=replicated, rates=rates,
        ratio_vs_dango_sample=ratio("shared", "wildtype"), floor=floor,
        machine=machine, kernels=kernels, skipped=skipped, notes=notes, rounds=res.rounds,
        seconds=time.perf_counter() - t0, push_kernel=push_kernel,
        push_threads=numba_threading_layer() if push_kernel == "numba" else "",
        shared_form=shared_form, run_layers=run_layers, convert=conv)


