"""What notebook 02's reader sees."""
from __future__ import annotations

import numpy as np
from IPython.display import Markdown

from .bench_text import replicated_ratio_text
from ..results.mask_cost import COEFFICIENTS
from .. import pipelines
from ..results.bench import BenchResult
from ..results.mask_cost import (CostModelStudy, LayerSweep, MaskCostResult, MaskGeneration,
                                 MemoryStudy)
from . import plotting
from ..common.text import one_line
from .tables import saved  # noqa: F401 - its notebook calls view.saved
from .tables import (HEADLINE_MAX, NOT_RUN, fmt_bytes, fmt_pct, fmt_stat, fmt_time_stat,
                     say_not_run, skip_none, table)
# the notebook's benchmark section
from .bench_view import (bar_label, bench_plot, bench_table, bench_text, floor_table,  # noqa: F401
                         form_of, kernel_table, rates_table, convert_table,
                         convert_parts_table)


def label(name: str) -> str:
    return pipelines.label(name)


NO_BUILTIN = ("No built-in strategy in this run (`strategies: []`): {what} are not measured here. "
              "Your own rewrite is checked against your slow pipeline by "
              "`python -m workbook_lib equal SLOW FAST` and in notebook 06.")


def builtin_note(text: str) -> Markdown:
    """The one line saying which sections did not run (strategies: []), else nothing."""
    return Markdown(text)


def exactness_table(exact: dict[str, float], graph_desc: str):
    if not exact:  # no exact built-in strategy ran
        return Markdown(NOT_RUN)
    rows = [{"strategy": label(n), "max relative error": f"{e:.1e}",
             "within float32 rounding (< 1e-4)": "yes" if e < 1e-4 else "NO"}
            for n, e in exact.items()]
    return table(rows, caption=f"Each strategy on this run's device against the plain reference "
                               f"(per-sample PyG subgraph + GINConv) on the CPU, on {graph_desc}: "
                               "node outputs, predictions with the dual forward, and every "
                               "parameter gradient.")


@say_not_run
def coefficient_table(s: CostModelStudy):
    m = s.model
    rows = []
    for fit in (m.beta, m.alpha, m.gamma, m.delta):
        for name, value in fit.coefficients.items():
            if name not in COEFFICIENTS or (fit is m.alpha and value == 0.0):
                continue
            unit, what = COEFFICIENTS[name]
            rows.append({"coefficient": name, "what it measures": what,
                         "value": f"{value:.3g} {unit}",
                         "standard error": fmt_pct(fit.rel_stderr(name), 0),
                         "points' noise (IQR/median)": fmt_pct(fit.point_noise, 0),
                         "fit": fit.name, "in-fit error (median)":
                             fmt_pct(fit.in_fit_median_abs_rel, 0),
                         f"held-out error, E = {m.held_out_edges:,}":
                             fmt_pct(fit.held_out_median_abs_rel, 0),
                         "note": "negative: below the noise" if name in fit.negative else ""})
    f = m.filter_check
    rows.append({"coefficient": "(filter layer)", "what it measures":
                 "predicted from beta, beta_e, gamma, delta; never fitted", "value": "",
                 "standard error": "", "points' noise (IQR/median)": "",
                 "fit": f.name, "in-fit error (median)": fmt_pct(f.in_fit_median_abs_rel, 0),
                 f"held-out error, E = {m.held_out_edges:,}":
                     fmt_pct(f.held_out_median_abs_rel, 0), "note": ""})
    other = m.alpha_other
    cap = (f"Plain least squares, the largest E ({m.held_out_edges:,}) held out of every fit; "
           "the standard error is the fit's own (relative to the coefficient): a coefficient "
           "known to 50% moves that much between runs. Points' noise above 10% means the "
           "sweep ran out of time before its precision target. "
           f"The mask multiply is carried by the {m.alpha_carrier} term")
    if other is not None:
        cap += (f" (in-fit error {fmt_pct(m.alpha.in_fit_median_abs_rel, 0)} against "
                f"{fmt_pct(other.in_fit_median_abs_rel, 0)} for the other form)")
    return table(rows, caption=cap + ".")


@skip_none
def cost_plot(s: CostModelStudy, device: str) -> None:
    m = s.model
    fig, axes = plotting.plt.subplots(1, 2, figsize=(12, 4.5))
    for kind, marker, color in (("unmasked", "o", 0), ("masked", "^", 1),
                                ("filter_layer", "s", 2)):
        pts = [p for p in s.points if p.kind == kind]
        pred = np.array([m.predict_mask(p.E, p.H) if kind == "masked" else
                         m.predict_filter(p.E, p.H, p.p) if kind == "filter_layer" else
                         m.predict_unmasked(p.E, p.H) for p in pts]) * 1e3
        meas = np.array([p.stat.median for p in pts]) * 1e3
        held = np.array([p.E == m.held_out_edges for p in pts])
        for flag, face in ((False, plotting.PALETTE[color]), (True, "none")):
            if (held == flag).any():
                axes[0].scatter(pred[held == flag], meas[held == flag], marker=marker,
                                facecolors=face, edgecolors=plotting.PALETTE[color],
                                label=f"{kind.replace('_', ' ')} ({'held out' if flag else 'fitted'})")
    lo = min(p.stat.median for p in s.points if p.stat.median > 0) * 1e3 * 0.5
    hi = max(p.stat.median for p in s.points) * 1e3 * 2
    axes[0].plot([lo, hi], [lo, hi], "k--", lw=1)
    axes[0].set(xscale="log", yscale="log", xlabel="predicted (ms, log scale)",
                ylabel="measured median (ms, log scale)")
    plotting.plain_ticks(axes[0])
    axes[0].legend(fontsize=7)
    reps = min(p.stat.n for p in s.points)
    plotting.title(axes[0], "Cost model: measured against predicted", device=device,
                   repeats=f">= {reps} interleaved rounds")
    for i, h in enumerate(sorted({p.H for p in s.points if p.H})):
        pts = sorted((p for p in s.points if p.kind == "unmasked" and p.H == h), key=lambda p: p.E)
        es = np.array([p.E for p in pts])
        med = np.array([p.stat.median for p in pts]) * 1e3
        err = [med - np.array([p.stat.q1 for p in pts]) * 1e3,
               np.array([p.stat.q3 for p in pts]) * 1e3 - med]
        axes[1].errorbar(es, med, yerr=err, fmt="o", color=plotting.PALETTE[i],
                         label=f"measured, H = {h}")
        grid = np.linspace(es.min(), es.max(), 50)
        axes[1].plot(grid, [m.predict_unmasked(e, h) * 1e3 for e in grid], "-",
                     color=plotting.PALETTE[i], lw=1)
    axes[1].set(xlabel="edges E", ylabel="unmasked gather-scatter layer (ms)")
    axes[1].xaxis.set_major_locator(plotting.MaxNLocator(5))
    plotting.plain_ticks(axes[1])
    axes[1].legend(fontsize=7)
    plotting.title(axes[1], "Unmasked layer against E (lines: the fit)", device=device,
                   repeats="median, IQR whiskers")
    plotting.show(fig, "Left: measured against predicted layer times on log axes for unmasked, "
                       "masked and filter layers, fitted points filled and held-out points "
                       "hollow. Right: unmasked layer time against edge count per hidden size, "
                       "with the fitted lines.")


@skip_none
def crossover_table(s: CostModelStudy):
    rows = []
    for c in s.crossover:
        row = {"E": f"{c.E:,}", "H": c.H, "predicted crossover p":
               "none in [0, 1)" if c.predicted_p is None else f"{c.predicted_p:.3g}"}
        for p, r in c.measured.items():
            row[f"filter/mask at p={p:g}"] = f"{r:.2f}"
        row["prediction matches"] = "yes" if c.agrees else "no"
        rows.append(row)
    return table(rows, caption="Direct timings of a filter layer over a masked layer at each "
                               "swept p, same rounds (below 1: filtering wins). 'Matches': the "
                               "predicted crossover puts every swept p on the side measured.")


@say_not_run
def crossover_text(s: CostModelStudy, typical_p: float | None) -> Markdown:
    m = s.model
    p = s.crossover_at_run_hidden
    agree = sum(c.agrees for c in s.crossover)
    tp = f"; a perturbation removes p ≈ {typical_p:.2%} of edges (notebook 01)" if typical_p \
        else ""
    where = ("none in [0, 1): masking is predicted cheaper at every p" if p is None else
             "0: filtering is predicted cheaper at every p" if p == 0 else f"p = {p:.3g}")
    return Markdown(
        f"At H = {s.run_hidden} the predicted crossover is **{where}**{tp}. Filtering pays "
        f"gamma + delta per edge to build the kept edge list; masking pays the mask multiply, "
        f"carried here by the {m.alpha_carrier} term. The prediction matches the direct timings "
        f"at {agree} of {len(s.crossover)} (E, H) points.")


@say_not_run
def forms_table(s: CostModelStudy):
    rows = [{"E": f"{e:,}", "H": h, "gather-scatter": fmt_time_stat(gs),
             "CSR product": fmt_time_stat(sp),
             "gather-scatter / CSR": fmt_stat(gs.ratio_to(sp, paired=True), unit="x")}
            for e, h, gs, sp in s.forms()]
    return table(rows, caption="The same sum aggregation, every message materialised "
                               "(h[src], then index_add_) or one CSR sparse-dense product; same "
                               "rounds, ratio per round.")


@say_not_run
def mask_generation_table(mg: MaskGeneration):
    rows = [{"form": label(n), "where": mg.where[n], "per sample": fmt_stat(st, unit="ms")}
            for n, st in sorted(mg.per_sample_ms.items(), key=lambda kv: kv[1].median)]
    return table(rows, caption=f"Producing one sample's edge removal, timed per batch of "
                               f"{mg.batch_size} and divided by it; all forms in the same rounds.")


# what the one-layer sweep times of a strategy whose step has several paths
LAYER_FORM = {"node_mask_shared": " [full middle layer: one product per sample]"}


@say_not_run
def layer_plot(ls: LayerSweep, device: str) -> Markdown | None:
    """The one-layer sweep's plot, or a sentence saying why there is none (no built-in
    strategy with a layer of its own in this run)."""
    if not ls.points:
        return Markdown(NO_BUILTIN.format(what="one layer of each built-in strategy across "
                                               "batch size"))
    fig, ax = plotting.plt.subplots(figsize=(8, 4.5))
    names = list(dict.fromkeys(p.strategy for p in ls.points))
    for i, n in enumerate(names):
        pts = [p for p in ls.series(n) if p.stat is not None]
        if not pts:
            continue
        bs = np.array([p.batch_size for p in pts])
        med = np.array([p.stat.median for p in pts]) * 1e3
        err = [med - np.array([p.stat.q1 for p in pts]) * 1e3,
               np.array([p.stat.q3 for p in pts]) * 1e3 - med]
        ax.errorbar(bs, med, yerr=err, fmt="o-", color=plotting.PALETTE[i],
                    label=label(n) + LAYER_FORM.get(n, ""))
        ax.plot(bs, med[0] * bs / bs[0], ":", color=plotting.PALETTE[i], lw=1)
        oom = [p.batch_size for p in ls.series(n) if p.stat is None]
        if oom:
            ax.plot(oom, [med.max() * 1.5] * len(oom), "x", ms=10, color=plotting.PALETTE[i])
    ax.set(xscale="log", yscale="log", xlabel="batch size B (log scale)",
           ylabel="one layer, ms (log scale)")
    plotting.plain_ticks(ax)
    sizes = sorted({p.batch_size for p in ls.points})
    ax.set_xticks(sizes, [str(b) for b in sizes])  # every batch size measured, labelled
    ax.xaxis.set_minor_locator(plotting.NullLocator())
    ax.legend(fontsize=7)
    plotting.title(ax, "One middle layer over every edge type (dotted: linear in B; x: out of "
                       "memory)", device=device, sizes=f"E = {ls.edges:,}, H = {ls.hidden}",
                   repeats="median, IQR whiskers")
    plotting.show(fig, "Log-log lines: milliseconds of one middle layer per strategy against "
                       "batch size, with dotted lines of linear growth from B = 1.")


def memory_table(m: MemoryStudy):
    rows = []
    for key, f in m.fits.items():
        rows.append({
            "strategy @ sizes": key, "points (B)": ", ".join(str(b) for b, _ in f.points),
            "per sample": fmt_bytes(f.per_sample_bytes),
            "set-up + intercept": fmt_bytes((f.setup_bytes or 0) + (f.intercept_bytes or 0))
            if f.per_sample_bytes else "n/a",
            "largest residual": fmt_pct(f.max_abs_rel_residual, 1),
            f"largest batch in {fmt_bytes(m.budget_bytes)}": f.largest_batch
            if f.largest_batch is not None else "n/a",
            "extrapolation": (f"{f.extrapolation_factor:.1f}x beyond B={f.largest_measured_batch}"
                              if f.extrapolation_factor else "n/a"),
            "status": memory_status(f)})
    return table(rows, caption=f"Peak of one training step (forward + backward) in a fresh "
                               f"process per point, above the resident level before it; fitted "
                               f"bytes = intercept + per sample x B. Budget: {m.budget_label}.")


def memory_failures(m: MemoryStudy):
    """Each pipeline whose memory probes failed, in one line with the probe's traceback
    collapsed (nothing when none did)."""
    from .failures_view import failures_note

    return failures_note(getattr(m, "failures", {}) or {}, what="The memory figures", none="")


EXTRAPOLATION_FLAG = 10.0  # a projected largest batch this far beyond the measured ones is flagged


def memory_status(f) -> str:
    """The fit's status, flagged when its largest-batch projection extrapolates beyond
    ``EXTRAPOLATION_FLAG`` x the largest batch measured."""
    s = f.status + (f": {f.reason}" if f.reason else "")
    if f.extrapolation_factor and f.extrapolation_factor > EXTRAPOLATION_FLAG:
        s += (f"; the largest batch is extrapolated {f.extrapolation_factor:.0f}x beyond the "
              "batches measured: an estimate, not a measurement")
    return s


@say_not_run
def dual_masks_text(d) -> Markdown:
    f = d.dual_bytes / d.single_bytes if d.single_bytes else float("nan")
    return Markdown(f"Mask bytes one forward reads: **{fmt_bytes(d.single_bytes)}** without the "
                    f"dual forward, **{fmt_bytes(d.dual_bytes)}** with it ({f:.2f}x), for "
                    f"{d.strategy} at B = {d.batch_size}. The wildtype pass runs on the "
                    "unperturbed graph and reads no mask unless this factor is above 1. "
                    "Measured: every 1-D per-edge tensor an operator of the forward reads, "
                    "counted once.")


def memory_plot(m: MemoryStudy) -> Markdown | None:
    """The points and fits, or a sentence when no strategy has a usable point (failed or below
    resolution: the table says which): an empty chart has no scale to read."""
    if not any(f.points for f in m.fits.values()):
        return Markdown("No plot: no strategy has a usable point (the table above gives each "
                        "one's reason).")
    fig, ax = plotting.plt.subplots(figsize=(8, 4.2))
    for i, (key, f) in enumerate(m.fits.items()):
        if not f.points:
            continue
        bs = np.array([b for b, _ in f.points])
        ys = np.array([y for _, y in f.points])
        ax.plot(bs, ys, "o", color=plotting.PALETTE[i % 10], label=key)
        if f.per_sample_bytes:
            grid = np.linspace(0, bs.max(), 20)
            ax.plot(grid, f.intercept_bytes + f.per_sample_bytes * grid, "-",
                    color=plotting.PALETTE[i % 10], lw=1)
    ax.set_xlabel("batch size B")
    unit = plotting.bytes_ticks(ax, "y")
    ax.set_ylabel(f"peak of one step ({unit})")
    if ax.get_legend_handles_labels()[0]:  # no measured point: no legend (and no warning)
        ax.legend(fontsize=6)
    plotting.title(ax, "Peak memory of a training step (lines: the fits)", device=m.device,
                   repeats="one fresh process per point")
    plotting.show(fig, "Points: measured peak memory of one training step against batch size "
                       "for each strategy and size; lines: the linear fits.")


def headline(r: MaskCostResult) -> str:
    """One short sentence for the index (at most :data:`HEADLINE_MAX` characters): the
    benchmark's answer (which form is fastest per sample) when the built-in strategies ran,
    else the user pipelines' memory per sample."""
    b, c = r.bench, r.cost
    parts = []
    bench_part = headline_bench_part(b) if b is not None else ""
    if bench_part:
        parts.append(bench_part)
    if r.exact:
        parts.append(f"max exactness error {max(r.exact.values()):.1e}")
    if c is not None:
        p = c.crossover_at_run_hidden
        parts.append("cost model: filtering beats masking " + ("nowhere in [0, 1)" if p is None
                                                               else f"above p = {p:.3g}")
                     + " (a prediction)")
    mem = r.memory.per_sample() if r.memory is not None else {}
    if mem and (b is None or len(parts) < 2):
        parts.append("peak memory per sample: " + ", ".join(
            f"{label(n)} {fmt_bytes(v)}" for n, v in list(mem.items())[:3]))
    failed = (getattr(r.memory, "failures", None) or {}) if r.memory is not None else {}
    if failed:  # what failed is the memory probe, at some batch sizes or all
        parts.append("memory probe failed: " + ", ".join(
            n + ("" if getattr(f, "figures_kept", False) else " (no figure)")
            for n, f in failed.items()))
    if b is None and c is None:
        parts.append("built-in sections not run (strategies: [])")
    text = "; ".join(parts)
    return one_line(text, HEADLINE_MAX)


def headline_bench_part(b: BenchResult) -> str:
    """The benchmark's clause of the headline: the shared form measured (path, push kernel,
    depth) against the Lazy model's replicated form, as measured (at the same batch, or at the
    largest batch that ran, labelled with it), the projection beside it; empty without that
    ratio."""
    text = replicated_ratio_text(b, "replicated_gather_scatter")
    if not text:
        return ""
    form = f" [{b.shared_form}, L = {b.sizes['layers']}]" if b.shared_form else ""
    return (f"node-mask shared{form} vs replicated (the Lazy model's form) per sample: {text} "
            f"({'real spec' if b.full_size else 'reduced size'})")
