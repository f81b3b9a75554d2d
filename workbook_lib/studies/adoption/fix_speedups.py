"""Every speedup of the fix a run folder holds, each named by what it times (notebook 06's
table: the training loop of 03, the benchmark of 02 or ``bench.json``, 06's own training)."""
from __future__ import annotations

from pathlib import Path

from ...results.adoption import Speedup
from ...running.results import load_result


def speedups(run_dir: str | Path, adoption=None) -> list[Speedup]:
    """Every speedup of the node-mask shared graph over replicated masks a run folder holds, each
    named by what it times (03's loop with data and optimizer, 02's forward + backward benchmark,
    06's training on the same batches; ``adoption``: 06's result before it is written).
    """
    import json

    from ...results.bench import BenchResult

    out: list[Speedup] = []
    v = load_result(run_dir, "05_verdict")
    t = load_result(run_dir, "03_data_vs_model_timing")
    scale = ""
    inv = load_result(run_dir, "01_graph_inventory")
    if inv is not None:
        scale = f"scale {inv.scale:g} ({inv.total_edges:,} edges)"
    if v is not None and v.recommendation is not None and v.recommendation.speedup is not None \
            and v.recommendation.strategy == "node_mask_shared":
        r = v.recommendation
        b = t.loops.batch_sizes if t is not None else {}
        out.append(Speedup(
            "training loop, per sample", "03 (quoted in 05)", r.speedup.median, r.speedup.iqr,
            "the full DataLoader step: masks built per sample in the loader, transfer, "
            "forward with the dual pass, backward, AdamW; every strategy and mode interleaved",
            f"both B = {b.get('node_mask_shared', '?')}", scale))

    def bench_rows(bres: BenchResult, nb: str) -> None:
        s = bres.sizes
        size = (f"{'the real spec' if bres.full_size else 'scale ' + format(s['scale'], 'g')}"
                f" ({s['edges']:,} edges), H = {s['hidden']}, {s['layers']} layers")
        shared_b = bres.per_sample_s["shared"].batch_size if "shared" in bres.per_sample_s \
            else "?"
        for key, st, form in (("replicated_gather_scatter", bres.ratio_vs_lazy_form,
                               "the Lazy model's gather-scatter form"),
                              ("replicated_sparse", bres.ratio_vs_sparse_form,
                               "their sparse-product form")):
            if st is None or key not in bres.per_sample_s:
                continue
            fit = bres.replicated.get(key)
            rep_b = f"replicated {fit.basis}" if fit is not None else \
                f"replicated B = {bres.per_sample_s[key].batch_size}"
            shared = f" [{bres.shared_form}]" if bres.shared_form else ""
            out.append(Speedup(
                f"benchmark per sample, against {form}", nb, st.median, st.iqr,
                "forward + backward of the model only (no data pipeline, no optimizer), "
                f"the batch prepared beforehand; the shared graph{shared}",
                f"{rep_b}, shared B = {shared_b}", size))
    mc = load_result(run_dir, "02_mask_cost_model")
    if mc is not None and mc.bench is not None:
        bench_rows(mc.bench, "02")
    path = Path(run_dir) / "bench.json"
    if path.is_file():
        try:
            bench_rows(BenchResult.from_json(json.loads(path.read_text())), "bench.json")
        except (ValueError, KeyError, TypeError):
            pass
    a = adoption if adoption is not None else load_result(run_dir, "06_adopt_fix")
    if a is not None and getattr(a, "speedup", None) is not None \
            and getattr(a, "mode", "builtin") == "builtin":  # a user pair: not this fix
        out.append(Speedup(
            "training, per step", "06", a.speedup.median, a.speedup.iqr,
            "the full DataLoader step of the two pipelines alone, interleaved, on the same "
            f"batches ({a.optimizer.upper()}, a teacher's labels)",
            f"both B = {a.batch_size}", scale))
    return out


def speedup_inputs(run_dir: str | Path) -> list[str]:
    """The notebooks besides 02 whose results :func:`speedups` read (for a resume's checksums)."""
    return [nb for nb in ("03_data_vs_model_timing", "05_verdict")
            if load_result(run_dir, nb) is not None]
