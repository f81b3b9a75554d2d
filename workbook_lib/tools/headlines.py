"""The headline figures of a run folder, read from the typed results: what ``compare`` and
``stability`` put side by side. Each says its unit, its noise, which direction is better, and its
``kind``: a ratio of the same rounds (drift cancels), a ratio of separate launches (it does not),
an absolute time, or arithmetic.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..results.stat import Stat
from ..results.tools import Figure
from ..running.results import load_result

RATIO, ABSOLUTE, ARITHMETIC, CATEGORY = ("ratio (same rounds)", "absolute time",
                                         "arithmetic", "category")
FITTED = "fitted coefficient (absolute time)"
LAUNCHES = "ratio (separate launches)"  # world sizes launched apart: not paired by round


def _stat(st):
    """A measured figure: the Stat itself (its median, IQR and CPU share), or no value."""
    return (None, None) if st is None else st


def _bench(r):
    return r.bench


def _coef(fit_name: str, coef: str | None = None):
    """(value, None, standard error, points' noise) of one cost-model coefficient."""
    def get(r):
        m = r.cost.model
        fit = getattr(m, fit_name)
        name = coef or (("alpha_eh" if m.alpha_carrier == "E*H" else "alpha_e")
                        if fit_name == "alpha" else fit_name)
        return (fit.coefficients[name], None, fit.stderr.get(name), fit.point_noise)
    return get


SPECS: list[tuple[str, str, str, str, str | None, str, Callable]] = [
    # key, label, notebook, unit, better, kind, extractor(result) -> (value, iqr) | str
    ("total_edges", "edges in the snapshot", "01_graph_inventory", "", None, ARITHMETIC,
     lambda r: (float(r.total_edges), None)),
    ("mask_bytes_per_sample", "mask bytes per sample", "01_graph_inventory", "B", "lower",
     ARITHMETIC, lambda r: (r.bytes_per_sample["edge_masks"], None)),
    ("exact_error", "node-mask shared graph: max relative error", "02_mask_cost_model", "",
     "lower", "measured", lambda r: (r.exact.get("node_mask_shared"), None)),
    ("beta", "cost model beta", "02_mask_cost_model", "s/(edge·ch)", "lower", FITTED,
     _coef("beta")),
    ("beta_e", "cost model beta_e", "02_mask_cost_model", "s/edge", "lower", FITTED,
     _coef("beta", "beta_e")),
    ("alpha", "cost model alpha (the mask multiply, its carrier term)", "02_mask_cost_model",
     "s/unit", "lower", FITTED, _coef("alpha")),
    ("gamma", "cost model gamma", "02_mask_cost_model", "s/edge", "lower", FITTED,
     _coef("gamma")),
    ("delta", "cost model delta", "02_mask_cost_model", "s/edge", "lower", FITTED,
     _coef("delta")),
    ("bench_ratio_lazy", "benchmark: shared vs replicated (the Lazy model's form), per sample",
     "02_mask_cost_model", "x", "higher", RATIO, lambda r: _stat(_bench(r).ratio_vs_lazy_form)),
    ("bench_ratio_sparse", "benchmark: shared vs replicated (sparse form), per sample",
     "02_mask_cost_model", "x", "higher", RATIO, lambda r: _stat(_bench(r).ratio_vs_sparse_form)),
    ("passes_per_sample", "benchmark: wildtype steps per exact sample", "02_mask_cost_model",
     "", "lower", RATIO, lambda r: _stat(_bench(r).passes_per_sample)),
    ("bench_ratio_full", "benchmark: full shared form vs delta form, per sample",
     "02_mask_cost_model", "x", "higher", RATIO,
     lambda r: _stat(getattr(_bench(r), "ratio_vs_full_form", None))),
    ("shared_step", "benchmark: shared step", "02_mask_cost_model", "s", "lower", ABSOLUTE,
     lambda r: _stat(_bench(r).steps.get("shared"))),
    ("data_only_ratio", "data-only step (its trivial loss included): DANGO it/s over Lazy it/s",
     "03_data_vs_model_timing", "x",
     "lower", RATIO, lambda r: _stat(r.figure("data_only_ratio").measured)
     if r.figure("data_only_ratio") else (None, None)),
    ("data_stages_ratio", "data stages only (the harness apart): Lazy over DANGO",
     "03_data_vs_model_timing", "x", "lower", RATIO,
     lambda r: _stat(r.figure("data_stages_ratio").measured)
     if r.figure("data_stages_ratio") else (None, None)),
    ("per_step_ratio_03", "data + model: DANGO it/s over Lazy it/s (per-step ratio)",
     "03_data_vs_model_timing", "x", "lower", RATIO,
     lambda r: _stat(r.figure("data_model_ratio").measured)
     if r.figure("data_model_ratio") else (None, None)),
    ("fastest_exact_ms", "fastest exact full step per sample", "03_data_vs_model_timing", "ms",
     "lower", ABSOLUTE,
     lambda r: _stat(r.loops.arm(r.fastest_exact).ms_per_sample) if r.fastest_exact
     else (None, None)),
    ("gap_total", "epoch-time gap (slow / fast)", "04_ddp_scaling", "x", "lower", LAUNCHES,
     lambda r: _stat(r.gap.total)),
    ("per_step_ratio_04", "per-step ratio (slow / fast), notebook 04", "04_ddp_scaling", "x",
     "lower", RATIO, lambda r: _stat(r.gap.per_step_ratio)),
    ("ddp_factor", "DDP factor (separate launches, alternated, equal threads per rank)",
     "04_ddp_scaling", "x", "lower", LAUNCHES,
     lambda r: _stat(r.gap.ddp_factor)),
    ("weak_efficiency", "weak scaling efficiency, largest world size", "04_ddp_scaling", "",
     "higher", LAUNCHES, lambda r: _stat(r.weak[max(r.weak)])),
    ("recommended", "recommended strategy", "05_verdict", "", None, CATEGORY,
     lambda r: r.recommendation.strategy if r.recommendation else "none"),
    ("speedup", "recommended strategy's speedup per sample", "05_verdict", "x", "higher", RATIO,
     lambda r: _stat(r.recommendation.speedup) if r.recommendation else (None, None)),
    ("claims_held", "claims held", "05_verdict", "", None, "count",
     lambda r: (float(sum(c.status == "held" for c in r.claims)), None)),
    ("adopt_rel_diff", "06: predictions' difference implied by the losses", "06_adopt_fix", "",
     "lower", "measured", lambda r: (None if getattr(r, "nonfinite_step", None) is not None
                                     else r.max_rel_diff, None)),
    ("adopt_speedup", "06: the fix's speedup per step", "06_adopt_fix", "x", "higher", RATIO,
     lambda r: _stat(r.speedup)),
]


def headline_figures(run_dir: str | Path) -> dict[str, Figure]:
    """Every headline figure a run folder's results hold (notebooks absent: left out)."""
    cache: dict = {}
    out = {}
    for key, label, nb, unit, better, kind, get in SPECS:
        if nb not in cache:
            cache[nb] = load_result(run_dir, nb)
        res = cache[nb]
        if res is None:
            continue
        try:
            got = get(res)
        except (AttributeError, KeyError, TypeError, ValueError):
            continue
        if isinstance(got, str):
            out[key] = Figure(key, label, nb, None, None, got, unit, better, kind)
        elif isinstance(got, Stat):
            out[key] = Figure(key, label, nb, got.median, got.iqr, None, unit, better, kind,
                              cpu=got.cpu)
        else:
            out[key] = Figure(key, label, nb, got[0], got[1], None, unit, better, kind,
                              *got[2:])
    return out
