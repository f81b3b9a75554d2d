"""Comparing two run folders: headline numbers side by side, with ratios (B over A)."""
from __future__ import annotations

import html
import json
from pathlib import Path

from ..exceptions import RunComparisonError
from ..running.results import read_results
from ..running.runner import TITLES

# per notebook: the numbers worth comparing (dotted paths; '*' expands one level)
HEADLINES = {
    "01_graph_inventory": ["total_edges", "mask_bytes_per_sample", "incidence_cache_bytes",
                           "removed_edge_fraction.mean", "hop_coverage.*"],
    "02_mask_cost_model": ["coefficients.*.value", "crossover_p", "prediction_error.*",
                           "full_size_ratio_shared_vs_replicated.value",
                           "full_size_ratio_shared_vs_replicated.ratio_vs_sparse_form",
                           "full_size_ratio_shared_vs_replicated.per_sample_s.*"],
    "03_data_vs_model_timing": ["it_per_s.*.data", "it_per_s.*.full", "ms_per_sample.*.full",
                                "syncs_per_step.*", "epochs_per_day.*.1"],
    "04_ddp_scaling": ["step_time_s.*", "scaling_efficiency.*", "comm_fraction.*",
                       "gap_decomposition.steps_ratio", "gap_decomposition.per_step_ratio",
                       "gap_decomposition.ddp_factor", "gap_decomposition.total"],
    "05_verdict": ["recommendation.speedup_per_sample", "gap.total_ratio"],
}


def _expand(doc, path: str) -> dict[str, object]:
    parts = path.split(".")
    out = {}

    def walk(node, i, prefix):
        if i == len(parts):
            out[prefix] = node
            return
        if not isinstance(node, dict):
            return
        keys = list(node) if parts[i] == "*" else [parts[i]]
        for k in keys:
            if k in node and not k.startswith("_"):
                walk(node[k], i + 1, f"{prefix}.{k}" if prefix else k)
    walk(doc, 0, "")
    return out


def headline_numbers(run_dir: str | Path) -> dict[str, dict[str, float]]:
    """``{notebook: {path: number}}`` for the notebooks whose results exist in ``run_dir``."""
    out = {}
    for nb, paths in HEADLINES.items():
        res = read_results(run_dir, nb)
        if res is None:
            continue
        vals = {}
        for p in paths:
            for k, v in _expand(res, p).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    vals[k] = float(v)
        out[nb] = vals
    return out


def _meta(run_dir: Path) -> dict:
    env = {}
    if (run_dir / "environment.json").is_file():
        env = json.loads((run_dir / "environment.json").read_text())
    sums = {}
    for nb in HEADLINES:
        res = read_results(run_dir, nb)
        if res and res.get("_meta", {}).get("snapshot_checksum"):
            sums[nb] = res["_meta"]["snapshot_checksum"]
    return {"env": env, "checksums": sums}


def compare_runs(run_a: str | Path, run_b: str | Path, out: str | Path | None = None, *,
                 force: bool = False) -> Path:
    """Write an HTML page comparing two run folders; returns its path.

    Raises:
        RunComparisonError: a folder is missing or has no results, or the runs used different
            snapshots (unless ``force``).
    """
    a, b = Path(run_a), Path(run_b)
    for d in (a, b):
        if not d.is_dir():
            raise RunComparisonError(f"run folder {d} does not exist")
    ha, hb = headline_numbers(a), headline_numbers(b)
    if not ha or not hb:
        empty = a if not ha else b
        raise RunComparisonError(f"run folder {empty} holds no results files")
    ma, mb = _meta(a), _meta(b)
    sa, sb = set(ma["checksums"].values()), set(mb["checksums"].values())
    if sa and sb and sa != sb and not force:
        raise RunComparisonError(
            f"the runs used different snapshots ({sorted(s[:12] for s in sa)} vs "
            f"{sorted(s[:12] for s in sb)}); numbers would not be comparable. "
            "Pass --force to compare anyway.")
    rows = []
    for nb in HEADLINES:
        if nb not in ha and nb not in hb:
            continue
        rows.append(f"<tr><th colspan=4>{html.escape(TITLES.get(nb, nb))}</th></tr>")
        keys = list(dict.fromkeys([*ha.get(nb, {}), *hb.get(nb, {})]))
        for k in keys:
            va, vb = ha.get(nb, {}).get(k), hb.get(nb, {}).get(k)
            ratio = (vb / va) if (va not in (None, 0) and vb is not None) else None
            fmt = lambda v: "—" if v is None else f"{v:.4g}"  # noqa: E731
            cls = "" if ratio is None else ("up" if ratio > 1.05 else "down" if ratio < 0.95 else "")
            rows.append(f"<tr><td><code>{html.escape(k)}</code></td><td>{fmt(va)}</td>"
                        f"<td>{fmt(vb)}</td><td class='{cls}'>{fmt(ratio)}</td></tr>")

    def env_line(m, d):
        e = m["env"]
        git = e.get("git", {})
        return (f"<code>{html.escape(str(d))}</code>: {html.escape(str(e.get('device_label')))}, "
                f"snapshot scale {e.get('params', {}).get('scale')}, git "
                f"{html.escape(str(git.get('revision'))[:10])}, created {e.get('created')}")
    warn = "" if not (sa and sb and sa != sb) else \
        "<p class='warn'>The runs used different snapshots (compared with --force).</p>"
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Run comparison</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}
td,th{{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left}} th{{background:#f3f3f3}}
.up{{color:#a00}} .down{{color:#070}} .warn{{background:#fdd;padding:6px}}</style></head><body>
<h1>Run comparison</h1><p>A = {env_line(ma, a)}<br>B = {env_line(mb, b)}</p>{warn}
<p>Ratio = B / A (for times, below 1 means B is faster).</p>
<table><tr><th>number</th><th>A</th><th>B</th><th>B / A</th></tr>{''.join(rows)}</table>
</body></html>"""
    out_path = Path(out) if out else b / f"compare_{a.name}_vs_{b.name}.html"
    out_path.write_text(page, encoding="utf-8")
    return out_path
