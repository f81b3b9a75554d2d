"""Strategy benchmarks of notebook 02: mask generation per sample, one layer across batch
size, and the full-size forward+backward comparison. Timing goes through ``timing.measure``
(warm-up, device sync, repeats, median/IQR)."""
from __future__ import annotations

import time

import psutil
import torch
from tqdm import tqdm

from ..strategies.model import PerturbGIN
from ..data.perturbations import sample_perturbations
from ..data.snapshots import CellGraph
from ..strategies import build_ctx, make_strategy
from ..measurement.timing import measure


def is_oom(exc: BaseException) -> bool:
    """Host or device out-of-memory, as raised by Python or PyTorch."""
    if isinstance(exc, MemoryError):
        return True
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def oom_record(exc: BaseException) -> dict:
    """What a sweep keeps for a point that did not fit: no value, and why."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {"median": None, "q1": None, "q3": None, "iqr": None, "n": 0,
            "reason": f"out of memory: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}


def mask_generation_per_sample(graph: CellGraph, k, batch_size: int, device, *, warmup=1,
                               repeats=3, seed=0, storage_dir=None) -> dict:
    """Seconds per sample to produce one sample's edge removal, for each form:
    host subgraph (1), host incidence loop (2), stored masks read (3), device loop with syncs
    (4a), device vectorized (4b, timed per batch / B), device filter keep-mask (5)."""
    pert = sample_perturbations(graph.num_genes, k, batch_size, seed=seed)
    out = {}
    s1 = make_strategy("subgraph_cpu", graph, device=device)
    out["subgraph_cpu"] = measure(lambda: [s1.make_item(i, r) for i, r in enumerate(pert)],
                                  warmup=warmup, repeats=repeats)
    s2 = make_strategy("replicated_mask_cpu", graph, device=device)
    out["replicated_mask_cpu"] = measure(lambda: [s2.masks_for(r) for r in pert],
                                         warmup=warmup, repeats=repeats)
    s3 = make_strategy("replicated_mask_stored", graph, device=device, storage_dir=storage_dir)
    s3.store(pert)
    out["replicated_mask_stored"] = measure(
        lambda: [s3.make_item(i, r) for i, r in enumerate(pert)], warmup=warmup,
        repeats=repeats)
    dpert = pert.to(device)
    s4 = make_strategy("device_mask_loop", graph, device=device)
    out["device_mask_loop"] = measure(lambda: s4.make_masks(dpert), device=device,
                                      warmup=warmup, repeats=repeats)
    s4v = make_strategy("device_mask_vectorized", graph, device=device)
    out["device_mask_vectorized"] = measure(lambda: s4v.make_masks(dpert), device=device,
                                            warmup=warmup, repeats=repeats)
    s5 = make_strategy("replicated_filter_device", graph, device=device)

    def filt():
        for t in graph.edge_types:
            src, dst = s5.replicate(t, batch_size)
            s5.keep_mask(src, dst, dpert).nonzero()
    out["replicated_filter_device"] = measure(filt, device=device, warmup=warmup,
                                              repeats=repeats)
    return {name: {"per_sample_s": st.median / batch_size, "per_batch": st.as_dict(),
                   "batch_size": batch_size} for name, st in out.items()}


def layer_time_across_batch(graph: CellGraph, strategies: list[str], batch_sizes: list[int],
                            hidden: int, k, device, *, aggr="sum", warmup=1, repeats=3,
                            seed=0, progress=True) -> dict:
    """Median seconds of one model layer (all edge types) per strategy and B (forward, no
    grad; device prep excluded - it is timed separately)."""
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=hidden, layers=1,
                       seed=seed).to(device)
    out: dict = {}
    jobs = [(s, b) for s in strategies for b in batch_sizes]
    for name, b in tqdm(jobs, desc="layer across B", disable=not progress):
        try:
            s = make_strategy(name, graph, aggr=aggr, device=device)
            pert = sample_perturbations(graph.num_genes, k, b, seed=seed)
            ctx = build_ctx(s, pert)
            with torch.no_grad():
                st = measure(lambda: s.predict(model, ctx), device=device, warmup=warmup,
                             repeats=repeats)
            out.setdefault(name, {})[str(b)] = {**st.as_dict(), "reason": None}
        except Exception as exc:  # noqa: BLE001 - only OOM is recorded, the rest re-raised
            if not is_oom(exc):
                raise
            out.setdefault(name, {})[str(b)] = oom_record(exc)
        finally:
            ctx = None
    return out


def replicated_bytes_per_sample(graph: CellGraph, hidden: int, form: str) -> float:
    """Peak-memory estimate of one replicated sample in a training step (bytes): its edge
    copy and mask, plus the transient per-edge tensors of the largest edge type (messages
    and their masked copy in forward, the same again in backward for gather-scatter)."""
    e_tot = graph.num_edges()
    e_max = max(graph.num_edges(t) for t in graph.edge_types)
    base = 2 * e_tot * 8 + e_tot * (1 + 4)
    if form == "gather_scatter":
        transient = 4 * e_max * hidden * 4
    else:
        transient = e_max * (8 + 4) * 2
    act = graph.num_genes * hidden * 4 * (len(graph.edge_types) + 3)
    return 1.5 * (base + transient + act)


def memory_budget_bytes(device: torch.device) -> float:
    """What a benchmark may use: 70% of available host memory, 80% of free GPU memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return 0.8 * free
    return 0.7 * psutil.virtual_memory().available


def step_time(strategy, model, pert, device, *, warmup=1, repeats=3):
    """Forward + backward of one batch (ctx built once, outside the timed region)."""
    ctx = build_ctx(strategy, pert)

    def step():
        model.zero_grad(set_to_none=True)
        strategy.predict(model, ctx).sum().backward()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    st = measure(step, device=device, warmup=warmup, repeats=repeats)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return st, peak


def full_size_comparison(graph: CellGraph, *, batch_size: int, k, hidden: int, layers: int,
                         device, aggr="sum", warmup=1, repeats=3, seed=0,
                         replicated_max_batch: int | None = None, progress=True) -> dict:
    """Strategy 6 against strategy 2 in the brief's form (gather-scatter, every message
    materialised then masked) and in its best form (masks as values of one sparse product),
    forward + backward, per sample. Strategy 2 runs at the largest batch that fits the memory
    budget (and ``replicated_max_batch`` when given), since its cost is linear in B."""
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=hidden, layers=layers,
                       seed=seed).to(device)
    budget = memory_budget_bytes(device)
    rows = {}
    plan = [("node_mask_shared", "spmm"), ("replicated_mask_cpu", "spmm"),
            ("replicated_mask_cpu", "gather_scatter")]
    for name, form in tqdm(plan, desc="full-size benchmark", disable=not progress):
        b, why = batch_size, "requested batch"
        if name == "replicated_mask_cpu":
            per = replicated_bytes_per_sample(graph, hidden, form)
            fits = max(1, int(budget // per))
            if fits < b:
                b, why = fits, (f"largest batch fitting the memory budget "
                                f"({budget / 1e9:.1f} GB at ~{per / 1e9:.2f} GB/sample)")
            if replicated_max_batch and replicated_max_batch < b:
                b, why = replicated_max_batch, "capped by replicated_max_batch (run time)"
        t0 = time.perf_counter()
        try:
            s = make_strategy(name, graph, aggr=aggr, device=device, form=form)
            pert = sample_perturbations(graph.num_genes, k, b, seed=seed)
            st, peak = step_time(s, model, pert, device, warmup=warmup, repeats=repeats)
            step, per, reason = st.as_dict(), st.median / b, None
        except Exception as exc:  # noqa: BLE001 - only OOM is recorded, the rest re-raised
            if not is_oom(exc):
                raise
            rec = oom_record(exc)
            step, per, peak, reason = rec, None, None, rec["reason"]
        rows[f"{name}:{form}"] = {"strategy": name, "form": form, "batch_size": b,
                                  "batch_reason": why, "step": step, "per_sample_s": per,
                                  "peak_device_bytes": peak, "reason": reason,
                                  "wall_s": time.perf_counter() - t0}
    shared = rows["node_mask_shared:spmm"]["per_sample_s"]

    def ratio(key):
        other = rows[key]["per_sample_s"]
        return other / shared if (other is not None and shared) else None
    return {
        "rows": rows,
        "ratio_vs_brief_form": ratio("replicated_mask_cpu:gather_scatter"),
        "ratio_vs_sparse_form": ratio("replicated_mask_cpu:spmm"),
        "sizes": {"num_genes": graph.num_genes, "edges": graph.num_edges(), "hidden": hidden,
                  "layers": layers, "k": k, "scale": graph.scale},
        "memory_budget_bytes": budget,
    }


def exactness_report(graph: CellGraph, strategies: list[str], *, k, batch_size: int = 3,
                     hidden: int = 16, layers: int = 2, aggr="sum", seed=0,
                     storage_dir=None) -> dict:
    """Max relative error of node outputs and parameter gradients of each exact strategy
    against the plain reference (per-sample PyG subgraph + GINConv), on CPU."""
    from ..strategies.reference import reference_node_outputs

    pert = sample_perturbations(graph.num_genes, k, batch_size, seed=seed)
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=hidden, layers=layers,
                       seed=seed)
    w = torch.randn(batch_size, graph.num_genes, hidden,
                    generator=torch.Generator().manual_seed(seed))

    def run(fn):
        model.zero_grad(set_to_none=True)
        out = fn()
        (out * w).sum().backward()
        return out.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()
                              if p.grad is not None}
    ref, ref_g = run(lambda: reference_node_outputs(model, graph, pert, aggr))

    def rel(a, b):
        return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))
    report = {}
    for name in strategies:
        kw = {"storage_dir": storage_dir} if name == "replicated_mask_stored" else {}
        s = make_strategy(name, graph, aggr=aggr, device="cpu", **kw)
        if not s.exact:
            continue
        if name == "replicated_mask_stored":
            s.store(pert)
        out, g = run(lambda: s.node_outputs(model, build_ctx(s, pert)))
        report[name] = max([rel(out, ref)] + [rel(g[n], ref_g[n]) for n in ref_g])
    return report
