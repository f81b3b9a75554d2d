"""Drawing notebooks 01-04 together: causes of the gap, the brief's claims, a recommendation."""
from __future__ import annotations

import math

from ..running.results import read_results

NOTEBOOKS = ("01_graph_inventory", "02_mask_cost_model", "03_data_vs_model_timing",
             "04_ddp_scaling")
HELD, FAILED, UNTESTABLE = "held", "failed", "not testable here"

CAUSE_STAGES = {
    "data pipeline (waiting for the loader)": ("loader_wait",),
    "host-to-device transfer": ("h2d",),
    "on-device mask generation / filtering": ("device_prep",),
    "forward": ("forward",),
    "backward": ("backward",),
    "optimizer": ("optimizer",),
}

ADOPTION = {
    "node_mask_shared": (
        "Keep one CSR adjacency per edge type (or one stacked [T*N, N] matrix) on the device, "
        "built once. The dataset item and the collate carry only the k deleted-gene indices "
        "per sample (no edge masks, no replicated edge_index, nothing stored on disk). On the "
        "device build the node keep-mask D [N, B] with one scatter, and replace the masked "
        "conv by: zero deleted rows of X, one sparse product A @ X with the batch side by side "
        "([N, B*H]), zero deleted rows again; for mean aggregation divide by A @ D. Exact for "
        "sum and mean aggregation (forward and gradients)."),
    "device_mask_vectorized": (
        "Ship only perturbation indices; on the device mark deleted genes in a [B, N] bool "
        "tensor and gather it at both endpoints of the edges: no .item(), no sync."),
    "replicated_mask_stored": (
        "Precompute masks once and read them per sample (costs storage proportional to the "
        "dataset)."),
    "subgraph_cpu": "Call PyG subgraph per sample in DataLoader workers.",
    "replicated_mask_cpu": "Build edge masks from an incidence cache in DataLoader workers.",
    "device_mask_loop": "Generate masks on the device with a Python loop (syncs per gene).",
    "replicated_filter_device": "Filter replicated edges on the device with isin + gather.",
}


def load_run(run_dir) -> tuple[dict, list[str]]:
    """Results of notebooks 01-04 in ``run_dir`` and the names of the missing ones."""
    found, missing = {}, []
    for nb in NOTEBOOKS:
        r = read_results(run_dir, nb)
        if r is None:
            missing.append(nb)
        else:
            found[nb] = r
    return found, missing


def rank_gap_causes(r03: dict, slow: str, fast: str, *, num_samples: int,
                    r04: dict | None = None) -> list[dict]:
    """Causes of the epoch-time difference between two strategies, ranked by their share.

    Per stage: median seconds per step x steps per epoch (80% of ``num_samples``, each
    strategy's batch size), slow minus fast. DDP overhead (notebook 04's factor) is one more
    cause when available.
    """
    bs = r03["batch_sizes"]
    steps = {s: math.ceil(0.8 * num_samples / bs[s]) for s in (slow, fast)}
    st = r03["stage_seconds"]
    rows = []
    for cause, stages in CAUSE_STAGES.items():
        per = {s: sum(st[s].get(x, 0.0) for x in stages) * steps[s] for s in (slow, fast)}
        rows.append({"cause": cause, "slow_s_per_epoch": per[slow],
                     "fast_s_per_epoch": per[fast], "difference_s": per[slow] - per[fast]})
    if r04 and r04.get("gap_decomposition"):
        g = r04["gap_decomposition"]
        epoch_slow = sum(r["slow_s_per_epoch"] for r in rows)
        if g.get("ddp_factor") and g["ddp_factor"] != 1.0:
            rows.append({"cause": f"DDP overhead at {g['world_size']} ranks",
                         "slow_s_per_epoch": epoch_slow * (g["ddp_factor"] - 1.0),
                         "fast_s_per_epoch": 0.0,
                         "difference_s": epoch_slow * (g["ddp_factor"] - 1.0)})
    total = sum(r["difference_s"] for r in rows)
    for r in rows:
        r["share"] = r["difference_s"] / total if total else None
    return sorted(rows, key=lambda r: -r["difference_s"])


def _status(ok: bool | None) -> str:
    return UNTESTABLE if ok is None else (HELD if ok else FAILED)


def claims(found: dict, spec_total_edges: int | None, device_type: str) -> list[dict]:
    """Every claim of the brief with its status and the number behind it."""
    r01, r02 = found.get("01_graph_inventory"), found.get("02_mask_cost_model")
    r03, r04 = found.get("03_data_vs_model_timing"), found.get("04_ddp_scaling")
    out = []

    def add(claim, ok, number, source, note=""):
        out.append({"claim": claim, "status": _status(ok), "number": number, "source": source,
                    "note": note})

    # sizes: exact arithmetic at the real size (the spec's edge count), whatever the run scale
    if r01:
        e = spec_total_edges or r01["total_edges"]
        basis = "real size (spec arithmetic)" if spec_total_edges else "this snapshot"
        inc = r01["incidence_cache_bytes"] * (e / r01["total_edges"])
        for claim, claimed, value in (
                ("65 MB of masks per batch (B=28)", 65e6, 28 * e),
                ("2.5 MB of masks per sample", 2.5e6, e),
                ("848 GB of masks for the dataset", 848e9, e * 332313)):
            add(claim, abs(value / claimed - 1) < 0.1, f"{value / 1e6:,.1f} MB" if value < 1e9
                else f"{value / 1e9:,.0f} GB", "01", f"{basis}; ratio {value / claimed:.2f}")
        add("130 MB of masks per batch with the dual forward", False, f"{28 * e / 1e6:,.1f} MB",
            "01", "the wildtype pass needs no mask: the dual forward adds none")
        add("incidence cache about 19 MB", abs(inc / 19e6 - 1) < 0.25, f"{inc / 1e6:,.1f} MB",
            "01", f"{basis}; every edge under both endpoints, int64 (int32 would halve it)")
    if r02:
        cross = r02.get("crossover_p")
        p_typ = r01["removed_edge_fraction"]["mean"] if r01 else 0.003
        add("filtering edges costs more than masking them when p << 1",
            cross is None or cross > p_typ,
            "no crossover" if cross is None else f"crossover p = {cross:.3f}", "02",
            f"typical p = {p_typ:.4f}")
        exact = r02.get("exact") or {}
        if "node_mask_shared" in exact:
            add("the node-mask shared graph is exact", exact["node_mask_shared"] < 1e-4,
                f"max rel. error {exact['node_mask_shared']:.1e}", "02")
    if r03:
        st = r03["stage_seconds"]
        if "replicated_mask_cpu" in st:
            s = st["replicated_mask_cpu"]
            main = {k: v for k, v in s.items() if not k.startswith("worker_")}
            top = max(main, key=main.get)
            add("the bottleneck is CPU->GPU transfer",
                None if device_type != "cuda" else top == "h2d",
                f"h2d {main.get('h2d', 0.0) / sum(main.values()):.1%} of a step; largest: {top}",
                "03", "" if device_type == "cuda" else "no GPU in this run: transfer is a no-op")
        comp = {c["figure"]: c for c in r03.get("brief_comparison", [])}
        for fig, claim in (("data pipeline only: DANGO it/s over Lazy it/s",
                            "data pipeline only: Lazy 56x slower than DANGO"),
                           ("data + model: DANGO it/s over Lazy it/s",
                            "data + model: Lazy 19x slower than DANGO")):
            if fig in comp:
                add(claim + " (in kind)", comp[fig]["holds_in_kind"],
                    f"{comp[fig]['measured']:.1f}x", "03")
        if "replicated_mask_cpu" in st and "dango_wildtype" in st:
            model = {s: sum(st[s].get(k, 0.0) for k in ("forward", "backward", "optimizer"))
                     for s in ("replicated_mask_cpu", "dango_wildtype")}
            ratio = model["replicated_mask_cpu"] / model["dango_wildtype"]
            add("one batch: forward+backward+optimizer only 1.6x slower (Lazy vs DANGO)",
                ratio < 5.0, f"{ratio:.1f}x per step", "03",
                "held in kind when the model alone explains little of a 40x gap")
        syncs = r03.get("syncs_per_step", {})
        if "device_mask_loop" in syncs:
            add("the GPU mask loop syncs hundreds of times per batch (864 .item() calls)",
                syncs["device_mask_loop"] >= 100 and syncs.get("device_mask_vectorized", 0) == 0,
                f"{syncs['device_mask_loop']:.0f} syncs/step (vectorized: "
                f"{syncs.get('device_mask_vectorized', 'n/a')})", "03")
        cats = r03.get("profile_categories", {}).get("replicated_mask_cpu")
        if cats:
            share = cats.get("optimizer", 0.0) / sum(cats.values())
            add("the optimizer takes 24% of the time", share > 0.15, f"{share:.1%} (exclusive)",
                "03", "the 24% came from summing nested profiler events")
    if r04:
        g = r04.get("gap_decomposition")
        if g:
            add("the replicated pipeline trains ~40x fewer epochs per day (in kind: > 5x)",
                g["total"] > 5, f"{g['total']:.1f}x", "04",
                f"steps x{g['steps_ratio']:.2f}, step time x{g['per_step_ratio']:.2f}, "
                f"DDP x{g['ddp_factor']:.2f}")
            logs = math.log(max(g["total"], 1.0000001))
            share = (math.log(g["steps_ratio"]) + math.log(max(g["ddp_factor"], 1e-9))) / logs
            add("DDP sync and the smaller batch explain the rest of the gap", share >= 0.5,
                f"{share:.0%} of the log-gap", "04")
        gat = r04.get("ddp_gather")
        if gat:
            ws = max(gat, key=lambda k: int(k))
            a, b = gat[ws]["step_s"], gat[ws].get("toggled_step_s")
            if b:
                add("turning off the loss all-gather changes nothing", abs(a / b - 1) < 0.1,
                    f"{abs(a / b - 1):.0%} difference at {ws} ranks", "04")
    return out


def _memory_per_sample(r02: dict | None) -> dict[str, float]:
    """Measured bytes per sample by strategy from notebook 02 (the real-size fit preferred)."""
    out: dict[str, float] = {}
    fits = ((r02 or {}).get("memory") or {}).get("largest_batch") or {}
    for key in sorted(fits, key=lambda k: "real size" not in k):  # real size first
        name = key.split(":")[0]
        per = fits[key].get("per_sample_bytes")
        if per and name not in out:
            out[name] = per
    return out


def recommendation(found: dict, baseline: str = "replicated_mask_cpu",
                   tie_tolerance: float = 0.15) -> dict | None:
    """The exact strategy to use: the fastest full step per sample (notebook 03); strategies
    within ``tie_tolerance`` of it are tied, and the tie goes to the smallest measured memory
    per sample (notebook 02), then to the faster one."""
    r03 = found.get("03_data_vs_model_timing")
    if not r03:
        return None
    from ..strategies import REGISTRY

    ms = {s: m["full"] for s, m in r03["ms_per_sample"].items() if REGISTRY[s].exact}
    if not ms:
        return None
    r02 = found.get("02_mask_cost_model")
    mem = _memory_per_sample(r02)
    fastest = min(ms, key=ms.get)
    tied = sorted(s for s in ms if ms[s] <= ms[fastest] * (1 + tie_tolerance))
    best = min(tied, key=lambda s: (mem.get(s, float("inf")), ms[s]))
    out = {"strategy": best, "label": REGISTRY[best].label, "ms_per_sample": ms[best],
           "fastest": fastest, "tied_with_fastest": tied, "tie_tolerance": tie_tolerance,
           "memory_per_sample_bytes": mem, "baseline": baseline,
           "speedup_per_sample": (ms[baseline] / ms[best]) if baseline in ms else None,
           "adoption": ADOPTION.get(best, ""), "all_ms_per_sample": ms}
    if r02:
        full = r02.get("full_size_ratio_shared_vs_replicated", {})
        out["full_size_ratio_vs_brief_form"] = full.get("value")
        out["full_size_ratio_vs_sparse_form"] = full.get("ratio_vs_sparse_form")
        out["memory"] = r02.get("memory")
    return out
