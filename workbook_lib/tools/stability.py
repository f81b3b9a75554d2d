"""Do two runs agree? ``python -m workbook_lib stability --params FILE --runs 2 --out DIR``
runs every notebook ``runs`` times (``DIR/run1``, ``DIR/run2``...) and reports every headline
figure's largest relative difference against a tolerance (15% by default), with why a figure
cannot agree where it cannot (an absolute time moves with the machine, a contended figure is
not judged). :mod:`workbook_lib.report.stability_view` writes the page.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from ..configs.validation import Params
from ..common.files import atomic_write_text
from ..exceptions import ParamsError
from ..results.tools import StabilityResult, StabilityRow
from ..running.results import load_result
from .compare import fmt_value
from .headlines import ABSOLUTE, CATEGORY, FITTED, LAUNCHES, RATIO, headline_figures

VERDICT_RESTS_ON = ("recommended", "speedup", "gap_total", "per_step_ratio_04",
                    "per_step_ratio_03", "bench_ratio_lazy", "ddp_factor", "exact_error")


def _rel(vals: list[float]) -> float | None:
    vals = [v for v in vals if v is not None]
    if len(vals) < 2:
        return None
    lo, hi = min(vals), max(vals)
    ref = min(abs(lo), abs(hi))
    return (hi - lo) / ref if ref else None


def compare_figures(run_dirs: list[Path], tolerance: float = 0.15) -> StabilityResult:
    figs = [headline_figures(d) for d in run_dirs]
    keys = list(dict.fromkeys(k for f in figs for k in f))
    ref = [f.get("shared_step") for f in figs]
    drift = _rel([r.value for r in ref if r is not None and r.value]) if all(ref) else None
    out = StabilityResult(runs=[d.name for d in run_dirs], tolerance=tolerance, drift=drift)
    for k in keys:
        fs = [f.get(k) for f in figs]
        f0 = next(f for f in fs if f is not None)
        rests = k in VERDICT_RESTS_ON
        if f0.kind == CATEGORY:
            texts = [f.text if f else "—" for f in fs]
            same = len(set(texts)) == 1
            out.rows.append(StabilityRow(k, f0.label, f0.kind, texts, None, same, rests,
                                         "" if same else "the runs chose differently"))
            continue
        vals = [f.value if f else None for f in fs]
        rel = _rel(vals)
        agrees = None if rel is None else rel <= tolerance
        note = ""
        busy = [(d.name, f.cpu) for d, f in zip(run_dirs, fs) if f is not None and f.contended]
        if busy:
            agrees = None
            note = ("contended in " + "; ".join(f"{n} ({c.explain()})" for n, c in busy)
                    + ": so it is not judged")
        elif agrees is False:
            if f0.kind == FITTED:
                note = _fitted_note(fs, drift, tolerance)
            elif f0.kind == ABSOLUTE:
                note = ("an absolute time: it moves with the machine's speed"
                        + (f" (the reference step moved {drift:.0%} between the runs)"
                           if drift is not None else "") + "; the verdict uses ratios")
            elif f0.kind in (RATIO, LAUNCHES):
                iqrs = [f.iqr / f.value for f in fs if f and f.iqr and f.value]
                noisy = iqrs and max(iqrs) >= rel
                what = ("a ratio of steps in the same rounds" if f0.kind == RATIO else
                        "a ratio of separate launches (the machine's drift between them does "
                        "not cancel)")
                note = (f"{what}; its own IQR is up to {max(iqrs):.0%} of it" if iqrs
                        else what) + (
                    ": the difference is within that noise" if noisy else
                    ": the difference exceeds its noise")
            else:
                note = "measured; read it with its noise"
        fmt = [("—" if v is None else fmt_value(v) + (
            f" (IQR {f.iqr:.2g})" if f and f.iqr else
            f" (standard error {f.rel_se:.0%})" if f and f.rel_se is not None else "")
            + (" (contended)" if f is not None and f.contended else ""))
            for v, f in zip(vals, fs)]
        out.rows.append(StabilityRow(k, f0.label, f0.kind, fmt, rel, agrees, rests, note))
    for row in out.rows:
        if row.key == "gap_total" and row.agrees is False:
            row.note = _gap_note(run_dirs) or row.note
    out.rows.extend(_claim_rows(run_dirs))
    return out


def _gap_note(run_dirs: list[Path]) -> str | None:
    """The epoch-time gap always multiplies in the DDP factor; when the runs' factors differ
    beyond their IQRs, that is part of why their gaps differ."""
    gaps = [getattr(load_result(d, "04_ddp_scaling"), "gap", None) for d in run_dirs]
    if any(g is None for g in gaps) or len(gaps) < 2:
        return None
    a, b = gaps[0].ddp_factor, gaps[1].ddp_factor
    if a.q3 >= b.q1 and b.q3 >= a.q1:  # the IQRs overlap: the factor does not explain it
        return None
    parts = [f"{d.name}: DDP factor {g.ddp_factor.median:.3g} (IQR {g.ddp_factor.iqr:.2g})"
             for d, g in zip(run_dirs, gaps)]
    per_step = [g.per_step_ratio.median * g.steps_ratio for g in gaps]
    return ("the gap is steps per epoch x per-step ratio x the DDP factor; the factors differ "
            "beyond their IQRs: " + "; ".join(parts) + ". Without the factor the runs give "
            + " and ".join(f"{v:.3g}" for v in per_step) + "x")


def _fitted_note(fs, drift: float | None, tolerance: float) -> str:
    """Why a fitted cost-model coefficient differs between runs, from the fits' own standard
    errors, the noise of the timings they were fitted on, and the machine's drift: each reason
    is stated only where the numbers support it."""
    present = [f for f in fs if f is not None and f.value is not None]
    lo, hi = min(present, key=lambda f: f.value), max(present, key=lambda f: f.value)
    parts = ["a fitted coefficient (an absolute time)"]
    rel_se = [f.rel_se for f in present if f.rel_se is not None]
    if rel_se:
        parts.append(f"the fits' standard errors are {', '.join(f'{r:.0%}' for r in rel_se)} "
                     "of it")
    noise = [f.point_noise for f in present if f.point_noise is not None]
    if noise:
        parts.append("the timings it was fitted on had a median IQR/median of "
                     + ", ".join(f"{n:.0%}" for n in noise) + " (target 10%)")
    if drift is not None:
        parts.append(f"the reference step moved {drift:.0%} between the runs")
    combined = (None if lo.se is None or hi.se is None
                else 2.0 * (lo.se ** 2 + hi.se ** 2) ** 0.5)
    rel = (hi.value - lo.value) / abs(lo.value) if lo.value else float("inf")
    if combined is not None and hi.value - lo.value <= combined:
        why = "the difference is within two standard errors of the fits: this sweep does not " \
              "determine it more closely"
    elif drift is not None and rel <= drift + tolerance:
        why = "the difference is the machine's drift"
    else:
        why = ("the difference exceeds the fits' uncertainty and the machine's drift"
               if combined is not None else "the difference exceeds the machine's drift")
        if noise and max(noise) > 0.10:
            why += (": the sweep ran on a disturbed machine (its timings stayed above the "
                    "precision target)")
    return "; ".join(parts) + ": " + why + ". The verdict uses ratios, not coefficients"


def _claim_rows(run_dirs: list[Path]) -> list[StabilityRow]:
    """One row per claim whose status differs between runs (a count of equal statuses hides a
    claim that held in one run and failed in the other), and one row counting the rest."""
    verdicts = [load_result(d, "05_verdict") for d in run_dirs]
    if any(v is None for v in verdicts):
        return []
    by_run = [{c.key: c for c in v.claims} for v in verdicts]
    keys = list(dict.fromkeys(k for b in by_run for k in b))
    rows, same = [], 0
    for k in keys:
        cs = [b.get(k) for b in by_run]
        statuses = [c.status if c else "—" for c in cs]
        if len(set(statuses)) == 1:
            same += 1
            continue
        c0 = next(c for c in cs if c is not None)
        rows.append(StabilityRow(
            f"claim:{k}", f"claim: {c0.claim}", "claim status",
            [f"{st}: {c.measured}" if c else st for st, c in zip(statuses, cs)], None, False,
            False, f"rule: {c0.rule}; the runs' values fall on different sides of one of its "
                   "edges"))
    rows.insert(0, StabilityRow("claim_statuses", "claim statuses equal in every run",
                                "claim status", [f"{same} of {len(keys)}"] * len(run_dirs),
                                None, same == len(keys), False, ""))
    return rows


def run_stability(params: Params, out_dir: str | Path, *, runs: int = 2,
                  tolerance: float = 0.15, only: list[str] | None = None,
                  progress: bool = True, write_index=None) -> StabilityResult:
    """Run the notebooks ``runs`` times into ``out_dir/run1``, ``run2``... and compare every
    headline figure (:func:`compare_figures`), written to ``out_dir/stability.json``.

    Args:
        params: validated params; out_dir: the folder of the runs.
        runs: how many runs (at least 2); tolerance: relative difference allowed (> 0).
        only: ``--only`` values (None: every notebook); progress: progress bars.
        write_index: each run folder's index writer.

    Raises:
        ParamsError: before the first run, for runs below 2, a tolerance not positive or an
            unknown notebook.
    """
    from ..running.notebooks import resolve_only
    from ..running.run_folder import run_notebooks

    if runs < 2:
        raise ParamsError(f"--runs must be at least 2 (got {runs})", key="runs", value=runs)
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise ParamsError(f"--tolerance must be a positive number (got {tolerance})",
                          key="tolerance", value=tolerance)
    resolve_only(only)  # an unknown notebook refused before the first run
    out = Path(out_dir)
    dirs = [out / f"run{i + 1}" for i in range(runs)]
    for d in dirs:
        run_notebooks(params, d, only=only, progress=progress, log_output=False,
                      write_index=write_index)
    res = compare_figures(dirs, tolerance)
    atomic_write_text(out / "stability.json", json.dumps(res.to_json(), indent=1))
    return res
