"""What notebook 03's reader sees: tables and figures of the loop, syncs and profiles."""
from __future__ import annotations

import numpy as np
from IPython.display import Markdown

from ..results.timing import (BOUND_RULE, GROUPS, MAIN_STAGES, MODES, WORKER_STAGES, LoopStudy,
                              SyncStudy, TimingResult)
from . import plotting
from .failures_view import failures_note as _failures_note
from ..common.text import one_line
from .tables import saved  # noqa: F401 - its notebook calls view.saved
from .tables import HEADLINE_MAX, fmt_bytes, fmt_num, fmt_stat, fmt_time_stat, table
from .stage_style import (MODE_LABELS, PIPELINED_LABEL, STAGE_LABELS, label, mode_colour,
                          stage_colour)
# the notebook's CPU and profile sections
from .cpu_view import cpu_plot, cpu_table  # noqa: F401
from .profile_view import code_table, profile_plot, profile_table  # noqa: F401


NONFINITE_MARK = "(loss not finite)"


def marked(study: LoopStudy, name: str) -> str:
    """The pipeline's label, marked when its loss was not finite (its timings are of a diverged
    step)."""
    f = getattr(study, "failures", {}).get(name)
    return label(name) + (f" {NONFINITE_MARK}" if f is not None and f.kind == "nonfinite_loss"
                          else "")


def failures_note(study: LoopStudy):
    """Each pipeline that failed in 03, in one line with its traceback collapsed."""
    return _failures_note(getattr(study, "failures", {}), what="The loop's figures")


def _nothing(study: LoopStudy) -> Markdown | None:
    if study.strategies:
        return None
    return Markdown("No pipeline was measured: every one failed (above).")


def repeats(study: LoopStudy) -> str:
    ns = [a.timed_steps for a in study.arms.values()]
    if not ns:
        return "no arm measured"
    return (f"{min(ns)}-{max(ns)} timed steps per arm after {study.settings['warmup_steps']} "
            f"warm-up; median, IQR")


def settings(study_or_params, graph=None, device_label: str | None = None,
             threads: str = "") -> Markdown:
    """What this run measures (sizes, loop settings); ``threads``: how many compute threads
    the notebook's setup gave this process, and why."""
    p = study_or_params
    inter = "interleaved (one step of each strategy and mode in turn)" if p.num_workers == 0 \
        else "one arm after another (DataLoader workers would prefetch during other arms)"
    sizes = (f"Batch {p.batch_size_lazy} for the perturbed-graph strategies, "
             f"{p.batch_size_dango} for the DANGO-style one; H = {p.hidden}, "
             f"{p.layers} layers, k = {p.perturbation_k}, dual forward "
             f"{'on' if p.dual_forward else 'off'}." if p.strategies else
             "Your pipelines, each with its own model, data and batch size (the built-in "
             "model's sizes do not apply: no built-in strategy ran).")
    what = graph.describe() if p.strategies else \
        f"the snapshot handed to your pipelines' factories, {graph.describe()} (a pipeline that " \
        "builds a graph of its own is not described by it),"
    return Markdown(
        f"**Run:** {what} on {device_label}. {sizes} Each arm: {p.warmup} warm-up step(s), one "
        f"untimed step under the sync counter, then at least {p.loop_steps} timed steps, "
        f"until the median is known to within {p.precision_target:.0%} (its 95% interval; at "
        f"most {p.loop_max_steps}, time "
        f"budget {p.loop_budget_s:.0f} s). Arms run {inter}. DataLoader workers: "
        f"{p.num_workers}." + (f" Compute threads: {threads}." if threads else ""))


def loop_table(study: LoopStudy):
    if _nothing(study):
        return _nothing(study)
    rows = []
    for n in study.strategies:
        row = {"pipeline": marked(study, n), "B": study.batch_sizes[n]}
        for m in MODES:
            row[f"{MODE_LABELS[m]}, ms/sample"] = fmt_stat(study.arm(n, m).ms_per_sample)
        row["full step, it/s"] = fmt_num(study.arm(n, "full").it_per_s.median)
        if study.shared_pass:
            sp = study.shared_pass.get(n)
            row["shared pass, ms/step"] = fmt_stat(sp.scaled(1e3, "ms")) if sp else "none"
        rows.append(row)
    shared = (" Shared pass: the part of the forward every sample of a batch shares (the dual "
              "forward's wildtype pass), timed alone, forward only without gradients, per step."
              if study.shared_pass else "")
    diverged = (f" {NONFINITE_MARK}: the loss was NaN or infinite at some step (see the "
                "failures above): the timings are of a diverged step."
                if any(NONFINITE_MARK in r["pipeline"] for r in rows) else "")
    return table(rows, caption=f"Per sample, median of the timed steps ({repeats(study)}); "
                               f"{study.device}." + shared + diverged)


def loop_plot(study: LoopStudy) -> None:
    names = study.strategies
    if not names:
        return
    fig, ax = plotting.plt.subplots(figsize=(10, 0.55 * len(names) + 1.8))
    y = np.arange(len(names))
    h = 0.2
    for i, m in enumerate(MODES):
        med = np.array([study.arm(n, m).ms_per_sample.median for n in names])
        lo = np.array([study.arm(n, m).ms_per_sample.q1 for n in names])
        hi = np.array([study.arm(n, m).ms_per_sample.q3 for n in names])
        ax.barh(y + (i - 1.5) * h, med, h, xerr=[med - lo, hi - med], label=MODE_LABELS[m],
                color=mode_colour(m), capsize=2)
    ax.set_yticks(y, [marked(study, n) for n in names], fontsize=8)
    ax.invert_yaxis()
    plotting.value_axis(ax, [a.ms_per_sample.median for a in study.arms.values()],
                        "ms per sample", "; bars: median, whiskers: IQR")
    ax.legend(loc="lower right")
    plotting.title(ax, "Time per sample by strategy and mode", device=study.device,
                   sizes=study.sizes, repeats=repeats(study))
    plotting.show(fig, "Horizontal bars: milliseconds per sample of each strategy in the four "
                       "loop modes (data only, + forward, + backward, full step), with IQR "
                       "whiskers.")


def stage_rows(study: LoopStudy, mode: str = "full") -> dict[str, dict[str, float]]:
    """Median seconds per stage of each strategy's step (untracked = wall - stages)."""
    out = {}
    for n in study.strategies:
        a = study.arm(n, mode)
        row = {s: a.stages[s].median for s in MAIN_STAGES if s in a.stages}
        row["untracked"] = max(0.0, a.untracked.median)
        out[n] = row
    return out


def _gc_cell(gc_: tuple[float, float, int] | None) -> str:
    if gc_ is None:
        return "not recorded"
    return f"{gc_[0]:.0%}, at most {gc_[1] * 1e3:.3g} ms in one of {gc_[2]} steps" \
        if gc_[1] > 0 else "0%"


def stage_table(study: LoopStudy):
    if _nothing(study):
        return _nothing(study)
    rows = []
    for n, st in stage_rows(study).items():
        wall = study.arm(n, "full").step.median
        row = {"strategy": marked(study, n),
               "full step": fmt_time_stat(study.arm(n, "full").step)}
        for s in (*MAIN_STAGES, "untracked"):
            if s in st:
                row[STAGE_LABELS[s]] = f"{st[s] / wall:.0%}"
        row["garbage collector (every mode)"] = _gc_cell(study.gc_pauses(n))
        if study.loader_workers:
            row["garbage collector, its loader workers"] = _gc_cell(study.worker_gc(n))
        rows.append(row)
    split = {label(n): a.loss_split for n in study.strategies
             if (a := study.arm(n, "full")).loss_split}
    return table(rows, caption="Share of the full step's wall time per stage (stage medians "
                               "over the step median; each stage timed between device syncs). "
                               "The loss is timed apart from the model: its forward, and its "
                               "own backward down to the model's output. Garbage collector: "
                               "the time Python's garbage collector ran inside the pipeline's "
                               "timed steps of every mode (in whichever stage it interrupted), "
                               "over their summed wall time, and the most in one step (a full "
                               "collection walks every Python object of the process, this "
                               "run's other pipelines' too)."
                               + (f" With {study.loader_workers} DataLoader worker process(es) "
                                  "per pipeline, that is the training process's; its loader "
                                  "workers': the collector's time inside the data items and "
                                  "collates, over their summed time."
                                  if study.loader_workers else "")
                 + ("".join(f" {k}: {w}." for k, w in split.items()) if split else ""))


def growth_table(study: LoopStudy):
    """How each stage of the gap's pair grows with the samples of a batch."""
    from ..results.timing import GROWS_RULE, LOOP_RULE

    rows = []
    for n, by in study.growth.items():
        for stage, g in by.items():
            rows.append({"pipeline": label(n), "stage": stage.replace("_", " "),
                         "batches": f"{g.batch_sizes[0]} and {g.batch_sizes[1]}",
                         "per extra sample": fmt_time_stat(g.per_sample),
                         "share of the stage at its batch": g.share_words,
                         "operator calls per extra sample": "" if g.ops_per_sample is None
                         else f"{g.ops_per_sample:.3g}",
                         "host syncs per extra sample": "" if g.syncs_per_sample is None
                         else f"{g.syncs_per_sample:.3g}",
                         "grows": "yes" if g.grows else "",
                         "a loop over the samples": "yes" if g.python_loop else ""})
    notes = "; ".join(f"{label(n)}: {w}" for n, w in study.growth_note.items() if w)
    cap = (f"The gap's pair, each at a second batch size in the same loop. {GROWS_RULE}; "
           f"{LOOP_RULE}." + (f" Not measured: {notes}." if notes else ""))
    if not rows:
        return Markdown("No growth was measured: it is measured for the two pipelines of "
                        "gap_strategies." + (f" {notes}." if notes else ""))
    return table(rows, caption=cap)


def encoder_table(study: LoopStudy):
    """Each pipeline's encoder (``shared_encoder``) on B masked copies against its conversion,
    and the conversion's form and changed rows per layer."""
    if not study.encoders:
        return Markdown("No pipeline offers its encoder (the protocol's optional "
                        "`shared_encoder(batch)`), so no conversion was timed.")
    rows, explains = [], []
    for n, f in study.encoders.items():
        if f.blocked:
            rows.append({"pipeline": label(n), "batch": f.batch_size,
                         "does not convert": f.blocked})
            continue
        rows.append({"pipeline": label(n), "batch": f.batch_size,
                     "its forward runs": "converted already" if f.runs_converted
                     else "as given",
                     "masked copies, per batch": fmt_time_stat(f.masked_copies),
                     "converted, per batch": fmt_time_stat(f.converted),
                     "copies / converted (same rounds)": fmt_stat(f.ratio, unit="x"),
                     "outputs agree to (max rel. error)": f"{f.max_rel_error:.1e}",
                     "floor, M multiply-adds per sample":
                         f"{(f.floor_sparse_macs + f.floor_dense_macs) / 1e6:.3g}",
                     "every gene changes from": f.all_changed_from or "no layer"})
        explains.append(f"{label(n)}:\n{f.explain}")
    cap = ("Forward and backward of the encoder alone, on the pipeline's own batches: on B "
           "copies of the graph with each sample's deleted genes' edges dropped and input rows "
           "zeroed, and converted (workbook_lib.nodemask.convert: the wildtype once, per sample "
           "only the rows a deletion changes); interleaved in rounds, the batch changing each "
           "round. The floor: the fewest multiply-adds an exact sample needs, forward and "
           "backward (the conversion's own count). Its forward runs 'converted already' where "
           "one forward of the pipeline called a converted form of the encoder: the copies' "
           "column is then what copies would cost, not a gain left.")
    import html

    from IPython.display import HTML

    keys = list(dict.fromkeys(k for r in rows for k in r))
    rows = [{k: r.get(k, "") for k in keys} for r in rows]

    pre = "".join(f"<pre>{html.escape(e)}</pre>" for e in explains)
    return HTML(table(rows, caption=cap).to_html() + pre)


def bound_table(bounds: dict):
    """What bounds each pipeline's step: the groups' shares and the rule."""
    from ..results.timing import STAGES

    rows = []
    for n, b in bounds.items():
        row = {"pipeline": label(n), "bound": b.bound,
               "largest stage": f"{STAGES[b.largest_stage][0]}: {b.largest_share:.0%}"}
        row.update({g: f"{b.group_shares[g]:.0%}" for g in GROUPS})
        row["host syncs per step (model, prep)"] = (
            "not counted" if b.syncs_per_step is None else
            f"{b.syncs_per_step:.0f} ({b.syncs_per_extra_sample:.2g} more per extra sample)"
            if b.syncs_per_extra_sample is not None else
            f"{b.syncs_per_step:.0f} ({b.syncs_per_step / b.batch_size:.2g} per sample)")
        row["on a GPU"] = "sync-bound" if b.sync_bound_on_gpu else ""
        rows.append(row)
    return table(rows, caption=f"Shares of the full step's median. The rule: {BOUND_RULE}. "
                               "Data is the step's wait for the DataLoader (with worker "
                               "processes, what their prefetching did not hide), split into item "
                               "and collate by the workers' own times.")


def stage_plot(study: LoopStudy) -> None:
    data = stage_rows(study)
    names = list(data)
    if not names:
        return
    fig, ax = plotting.plt.subplots(figsize=(10, 0.5 * len(names) + 1.8))
    left = np.zeros(len(names))
    stages = [*MAIN_STAGES, "untracked"]
    for i, s in enumerate(stages):
        shares = np.array([data[n].get(s, 0.0) / max(1e-12, sum(data[n].values()))
                           for n in names]) * 100
        ax.barh(range(len(names)), shares, left=left, color=stage_colour(s, i),
                label=STAGE_LABELS[s])
        left += shares
    ax.set_yticks(range(len(names)), [marked(study, n) for n in names], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of the full step (stage medians)")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    plotting.title(ax, "Where a full training step goes", device=study.device,
                   sizes=study.sizes, repeats=repeats(study))
    plotting.show(fig, "Stacked horizontal bars: share of each strategy's full training step "
                       "spent in data loading, transfer, device prep, forward, backward, "
                       "optimizer and loop overhead.")


def worker_table(study: LoopStudy):
    if _nothing(study):
        return _nothing(study)
    rows = []
    for n in study.strategies:
        a = study.arm(n, "data")
        row = {"strategy": label(n)}
        for s in WORKER_STAGES:
            st = a.extra.get(s)
            row[f"{s.replace('worker_', '')}, ms/sample"] = fmt_stat(
                st.scaled(1e3 / a.samples_per_step, "ms") if st else None)
        rows.append(row)
    return table(rows, caption="Measured inside the DataLoader workers (data-only mode). With "
                               "num_workers > 0 this work overlaps the main process.")


def sanity_note(flags) -> Markdown:
    if not flags:
        return Markdown("**Sanity check passed:** for every strategy, data only <= + forward <= "
                        "+ backward <= full step within noise (no lower quartile of a smaller "
                        "mode above the upper quartile of a larger one).")
    lines = [f"- {label(f.strategy)}: {MODE_LABELS[f.lower]} {f.lower_ms:.3g} ms > "
             f"{MODE_LABELS[f.upper]} {f.upper_ms:.3g} ms per step" for f in flags]
    return Markdown("**Sanity check: flagged.** A mode that does strictly less work took longer "
                    "than one that does more, beyond the noise. Read these figures with care "
                    "(machine noise or an effect the loop does not model):\n" + "\n".join(lines))


def reported_table(figs):
    if not figs:
        return Markdown("Not measured: the investigation's figures are of its Lazy and "
                        "DANGO-style models (strategies 2 and 7), and this run did not time both.")
    rows = [{"figure": f.figure,
             "investigation": "not reported" if f.key.startswith("harness") else
             f"{f.claimed:g}{'x' if f.unit == 'x' else ' ms'}",
             "measured here": fmt_stat(f.measured, unit="x" if f.unit == "x" else "ms")}
            for f in figs]
    return table(rows, caption="Lazy = replicated masks from the incidence cache (strategy 2), "
                               "DANGO = single wildtype pass (strategy 7). Ratios of steps taken "
                               "in the same rounds. The data-only step includes the harness's own "
                               "cost (a trivial loss and its backward, so that the loop is real): "
                               "the data-stages ratio leaves it out and the harness rows show it. "
                               "The investigation measured on one GPU at the real size; notebook "
                               "05 says which claims hold.")


def stored_reads_table(r):
    if r is None:
        return Markdown("Not measured: strategy 3 (stored masks) is not among this run's "
                        "built-in strategies.")
    rows = [{"read": "cold (pages dropped first)", "per item": fmt_stat(r.cold_ms, unit="ms")},
            {"read": "warm (from the page cache)", "per item": fmt_stat(r.warm_ms, unit="ms")},
            {"read": "cold / warm (same rounds)", "per item": fmt_stat(r.cold_over_warm,
                                                                      unit="x")}]
    how = ("each round: fsync and posix_fadvise(DONTNEED) on the file, then every item read, "
           "then read again" if r.dropped else
           "this system has no posix_fadvise: both reads are warm")
    return table(rows, caption=f"{r.items} items of {fmt_bytes(r.bytes_per_item)} of masks each "
                               f"({fmt_bytes(r.file_bytes)} file); {how}. The kernel may keep "
                               "pages it was asked to drop (tmpfs always does). The loop's "
                               "strategy-3 figures are warm reads; a dataset larger than memory "
                               "would be read cold.")


def epochs_table(study: LoopStudy, epochs: dict[str, float], num_samples: int):
    rows = [{"strategy": label(n), "samples per step": study.arm(n, "full").samples_per_step,
             "full step": fmt_time_stat(study.arm(n, "full").step),
             "epochs per 24 h (1 rank)": fmt_num(v)} for n, v in epochs.items()]
    return table(rows, caption=f"Arithmetic on the measured full step (every stage recorded): "
                               f"80% of {num_samples:,} samples per epoch. Notebook 05 projects "
                               "from the step a plain loop runs where every pipeline it compares "
                               "has one (so its figures can be higher), and to several ranks "
                               "with each pipeline's own step factor measured in notebook 04.")


def sync_table(syncs: SyncStudy):
    rows = [{"strategy": label(n), "syncs per step": fmt_num(v or 0.0),
             "kinds": ", ".join(f"{k}: {c:g}" for k, c in syncs.kinds[n].items()) or "none"}
            for n, v in syncs.per_step.items()]
    return table(rows, caption=f"Counted on one untimed full step per strategy (transfer, device "
                               f"prep, forward, backward). Method: {syncs.method}.")


def sync_plot(syncs: SyncStudy) -> None:
    pts = syncs.scaling
    if not pts:  # the loop form of device masks (4a) did not run
        return
    fig, ax = plotting.plt.subplots(figsize=(7, 4.2))
    for i, t in enumerate(sorted({p.edge_types for p in pts})):
        sel = [p for p in pts if p.edge_types == t]
        ax.scatter([p.batch_size * p.k * p.edge_types for p in sel], [p.counted for p in sel],
                   color=plotting.PALETTE[i], label=f"counted, T = {t} edge types")
    xs = np.array(sorted({p.batch_size * p.k * p.edge_types for p in pts}))
    ax.plot(xs, 2 * xs, "k:", lw=1, label="2·B·k·T (two per gene and edge type)")
    ax.set(xscale="log", yscale="log", xlabel="B · k · T (log scale)",
           ylabel="syncs per batch (log scale)")
    plotting.plain_ticks(ax)
    ax.legend()
    plotting.title(ax, "Loop-form device mask generation (4a): host syncs per batch",
                   sizes=f"B in {sorted({p.batch_size for p in pts})}, k in (1, 3, 5)",
                   device=syncs.method.split(":")[0])
    plotting.show(fig, "Scatter on log axes: host syncs per batch of the loop-form device mask "
                       "generation against B times k times the number of edge types, with the "
                       "line 2BkT.")


def _short_bound(b) -> str:
    """'model-bound (forward 61%)', or 'model-bound (model stages 55%; largest stage collate
    40%)' where the largest stage is another group's."""
    return f"{b.bound} ({b.stage_words()})"


def headline(r: TimingResult, pair: list[str] | None = None) -> str:
    """One short sentence for the index (at most :data:`HEADLINE_MAX` characters): a contended
    mark first, then what bounds the pair's steps (else the fastest exact pipeline's), then
    failures and losses that were not finite."""
    lo = r.loops
    bad = [k for k, a in lo.arms.items() if a.step.contended] if lo is not None else []
    by = ", ".join(sorted({lo.arms[k].step.cpu.cause for k in bad}))
    mark = f"CONTENDED by {by} ({len(bad)} of {len(lo.arms)} arms): " if bad else ""
    names = [n for n in (pair or []) if n in r.bounds]
    if not names:
        names = [r.fastest_exact] if r.fastest_exact in r.bounds else list(r.bounds)[:2]
    parts = [f"{label(n)} {_short_bound(r.bounds[n])}" for n in names]
    failed = list((getattr(lo, "failures", None) or {}))
    if failed:
        parts.append("failed: " + ", ".join(failed))
    diverged = [n for n in (lo.strategies if lo is not None else []) if n in r.bounds
                and getattr(lo.arm(n, "full"), "nonfinite_steps", 0)]
    if diverged:
        parts.append("loss not finite: " + ", ".join(diverged))
    text = mark + "; ".join(parts)
    return one_line(text, HEADLINE_MAX)


def pipelined_table(study: LoopStudy):
    """The full step with its stages synchronized (the attribution above) beside the same step
    synchronized only at its start and end, and the difference."""
    rows = []
    for n in study.strategies:
        got = study.pipelined(n)
        if got is None:
            continue
        synced, piped, diff = got
        rows.append({"strategy": label(n), "full step, stages synchronized": fmt_time_stat(synced),
                     PIPELINED_LABEL: fmt_time_stat(piped),
                     "difference (paired)": fmt_time_stat(diff)})
    if not rows:
        return Markdown("No pipelined step was measured.")
    cpu = study.device.lower().startswith("cpu")
    return table(rows, caption="Every stage above is timed between device syncs and recorded "
                               "(a profiler range, a stage timer, the loss's backward timed "
                               "apart), which serializes the host's work with the device's; "
                               "the pipelined step is what a plain training loop runs, timed "
                               "as one, with none of that: the answer's gap is of these steps. "
                               + ("On a CPU the work is synchronous already, so the difference "
                                  "is what the records cost per step." if cpu else
                                  "The difference is what the stage attribution's syncs and "
                                  "records cost per step."))
