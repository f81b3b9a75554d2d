"""What notebook 03's reader sees: tables and figures of the loop, syncs and profiles."""
from __future__ import annotations

import numpy as np
from IPython.display import Markdown

from ..measurement.profiling import ProfileResult
from .. import pipelines
from ..training.loop import MODES, WORKER_STAGES
from ..results.timing import LoopStudy, MAIN_STAGES, PIPELINED, SyncStudy, TimingResult
from . import plotting
from .failures_view import failures_note as _failures_note
from .tables import one_line, fmt_bytes, fmt_num, fmt_pct, fmt_stat, fmt_time_stat, table

MODE_LABELS = {"data": "data only", "forward": "+ forward", "forward_backward": "+ backward",
               "full": "+ optimizer (full step)"}
PIPELINED_LABEL = "pipelined (synchronized at start and end only)"
STAGE_LABELS = {"loader_wait": "data loading (fetch + collate)", "h2d": "host-to-device copy",
                "device_prep": "device prep (masks, filtering)", "forward": "forward",
                "backward": "backward", "optimizer": "optimizer", "untracked": "loop overhead"}


def label(name: str) -> str:
    return pipelines.label(name)


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


def settings(study_or_params, graph=None, device_label: str | None = None) -> Markdown:
    """What this run measures (sizes, loop settings)."""
    p = study_or_params
    inter = "interleaved (one step of each strategy and mode in turn)" if p["num_workers"] == 0 \
        else "one arm after another (DataLoader workers would prefetch during other arms)"
    sizes = (f"Batch {p['batch_size_lazy']} for the perturbed-graph strategies, "
             f"{p['batch_size_dango']} for the DANGO-style one; H = {p['hidden']}, "
             f"{p['layers']} layers, k = {p['perturbation_k']}, dual forward "
             f"{'on' if p['dual_forward'] else 'off'}." if p["strategies"] else
             "Your pipelines, each with its own model, data and batch size (the built-in "
             "model's sizes do not apply: no built-in strategy ran).")
    return Markdown(
        f"**Run:** {graph.describe()} on {device_label}. {sizes} Each arm: {p['warmup']} warm-up step(s), one "
        f"untimed step under the sync counter, then at least {p['loop_steps']} timed steps, "
        f"until IQR/median <= {p['precision_target']:.0%} (at most {p['loop_max_steps']}, time "
        f"budget {p['loop_budget_s']:.0f} s). Arms run {inter}. DataLoader workers: "
        f"{p['num_workers']}. {threads_line(p)}")


def threads_line(params: dict) -> str:
    """How many compute threads this process uses, and why."""
    import torch

    from ..measurement.cpu import fit_threads

    why = fit_threads(workers=params["num_workers"]).why
    return f"Compute threads: {torch.get_num_threads()} ({why})."


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
        rows.append(row)
    return table(rows, caption="Share of the full step's wall time per stage (stage medians "
                               "over the step median; each stage timed between device syncs).")


def bound_table(bounds: dict):
    """What bounds each pipeline's step: the groups' shares and the rule."""
    from ..studies.timing.stages import BOUND_RULE, GROUPS
    from ..results.timing import STAGES

    rows = []
    for n, b in bounds.items():
        row = {"pipeline": label(n), "bound": b.bound,
               "largest stage": f"{STAGES[b.largest_stage][0]}: {b.largest_share:.0%}"}
        row.update({g: f"{b.group_shares[g]:.0%}" for g in GROUPS})
        row["host syncs per step (model, prep)"] = (
            "not counted" if b.syncs_per_step is None else
            f"{b.syncs_per_step:.0f} ({b.syncs_per_step / b.batch_size:.2g} per sample)")
        row["on a GPU"] = "sync-bound" if b.sync_bound_on_gpu else ""
        rows.append(row)
    return table(rows, caption=f"Shares of the full step's median. The rule: {BOUND_RULE}. "
                               "Data is the step's wait for the DataLoader (with worker "
                               "processes, what their prefetching did not hide), split into item "
                               "and collate by the workers' own times.")


# one colour per stage in every chart of this report (the profile's categories are the stages)
STAGE_COLOURS = {"loader_wait": plotting.PALETTE[0], "h2d": plotting.PALETTE[1],
                 "device_prep": plotting.PALETTE[2], "forward": plotting.PALETTE[3],
                 "backward": plotting.PALETTE[4], "optimizer": plotting.PALETTE[5],
                 "untracked": plotting.PALETTE[6], "untracked (loop, Python)": plotting.PALETTE[6]}


# each mode in the colour of the stage it adds, as the stage charts below draw that stage
MODE_STAGE = {"data": "loader_wait", "forward": "forward", "forward_backward": "backward",
              "full": "optimizer"}


def mode_colour(mode: str) -> str:
    return STAGE_COLOURS[MODE_STAGE[mode]]


def stage_colour(stage: str, i: int) -> str:
    return STAGE_COLOURS.get(stage, plotting.PALETTE[(7 + i) % 10])


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
    return table(rows, caption=f"Arithmetic on the measured step: 80% of {num_samples:,} samples "
                               "per epoch. Projections to several ranks use notebook 04's "
                               "measured DDP factor and are made in notebook 05.")


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


def profile_table(profiles: dict[str, ProfileResult], loops: LoopStudy | None = None):
    missing = [] if loops is None else [
        f for n, f in loops.failures.items() if n in loops.strategies and n not in profiles
        and f.kind != "nonfinite_loss"]
    if missing:
        from IPython.display import display

        display(_failures_note({f.pipeline: f for f in missing}, what="The profiles"))
    if not profiles:
        return Markdown("No pipeline was profiled.")
    cats = sorted({c for p in profiles.values() for c in p.categories})
    rows = []
    for n, p in profiles.items():
        row = {"strategy": label(n), "profiled": p.profiled_steps.split(" of the run")[0]}
        sh = p.shares()
        row.update({c.replace("untracked (loop, Python)", "loop overhead"): fmt_pct(sh.get(c, 0))
                    for c in cats})
        row["exclusive sum / wall"] = f"{p.coverage:.2f}"
        row["nested sum / wall"] = f"{p.naive_over_wall:.1f}"
        if p.summed:
            row["optimizer, summed as the investigation did"] = fmt_pct(
                p.summed_shares().get("optimizer", 0.0))
        rows.append(row)
    first = next(iter(profiles.values()))
    return table(rows, caption=f"Shares by exclusive (self) time on the main thread; "
                               f"{first.profiled_steps}. 'nested sum / wall' is what summing "
                               "every event's duration gives: parents and children counted again "
                               "and again. The investigation's analyzer also named categories by "
                               "keywords in event names, so every ProfilerStep (a whole step) "
                               "counted as the optimizer: its last column reproduces that sum.")


def profile_plot(profiles: dict[str, ProfileResult], device: str, pick: str | None = None) -> None:
    names = list(profiles)
    if not names:
        return
    found = {c for p in profiles.values() for c in p.categories}
    order = [*MAIN_STAGES, "untracked (loop, Python)"]
    cats = [c for c in order if c in found] + sorted(found - set(order))
    fig, axes = plotting.plt.subplots(1, 2, figsize=(15, 0.45 * len(names) + 2.6))
    left = np.zeros(len(names))
    for i, c in enumerate(cats):
        v = np.array([profiles[n].shares().get(c, 0.0) * 100 for n in names])
        axes[0].barh(range(len(names)), v, left=left, color=stage_colour(c, i),
                     label=STAGE_LABELS.get(c, c.replace("untracked (loop, Python)",
                                                         "loop overhead")))
        left += v
    axes[0].set_yticks(range(len(names)), [label(n) for n in names], fontsize=8)
    axes[0].invert_yaxis()
    axes[0].set_xlim(0, 100)
    axes[0].set_xlabel("% of profiled time (exclusive time)")
    axes[0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, fontsize=7)
    plotting.title(axes[0], "Categories by exclusive time (they add up)", device=device,
                   repeats=next(iter(profiles.values())).profiled_steps.split(" (")[0])
    pick = pick if pick in profiles else names[0]
    p = profiles[pick]
    keys = sorted(set(p.categories) | set(p.naive))
    y = np.arange(len(keys))
    axes[1].barh(y - 0.2, [p.categories.get(k, 0) / p.wall_s * 100 for k in keys], 0.4,
                 label="exclusive time (correct)")
    axes[1].barh(y + 0.2, [p.naive.get(k, 0) / p.wall_s * 100 for k in keys], 0.4,
                 label="nested durations summed (wrong)")
    axes[1].axvline(100, color="k", ls=":", lw=1)
    axes[1].set_yticks(y, [k.replace("untracked (loop, Python)", "loop overhead") for k in keys])
    axes[1].set_xlabel("% of the profiled wall time")
    axes[1].legend(fontsize=7)
    plotting.title(axes[1], f"{label(pick)}: exclusive vs nested sums", device=device)
    plotting.show(fig, "Left: stacked shares of profiled time per category by exclusive time "
                       "for each strategy. Right: for one strategy, exclusive time against the "
                       "sum of nested event durations per category, which exceeds 100%.")


def cpu_rows(study: LoopStudy) -> list[dict]:
    """Per arm: what the process got of the CPUs over its timed steps."""
    rows = []
    for key, a in study.arms.items():
        c = a.step.cpu
        if c is None:
            continue
        mode = PIPELINED_LABEL if a.variant == PIPELINED else MODE_LABELS.get(a.mode, a.variant)
        rows.append({"pipeline": label(a.strategy), "mode": mode,
                     "threads / CPUs": f"{c.threads} / {c.allowed}",
                     "CPU use (CPU time / wall x threads)": fmt_pct(c.use, 0),
                     "got of the CPU asked for": fmt_pct(c.got, 0) if c.got is not None
                     else "n/a (no schedstat)",
                     "CPU pressure (machine)": fmt_pct(c.pressure, 0)
                     if c.pressure is not None else "not available here",
                     "other jobs (CPUs)": f"{c.others:.2f}" if c.others is not None
                     else "not told",
                     "contended": "CONTENDED" if c.contended else "no",
                     "by": c.cause or ""})
    return rows


def cpu_table(study: LoopStudy):
    from ..measurement.cpu import OTHERS_SEEN, causes_text

    rows = cpu_rows(study)
    s = study.settings
    first = next((a.step.cpu for a in study.arms.values() if a.step.cpu is not None), None)
    rule = first.rule if first is not None else ""
    children = first.children if first is not None else ""
    bad = sum(r["contended"] == "CONTENDED" for r in rows)
    return table(rows, caption=(
        f"What the process got of the CPUs over each arm's timed steps. Threads: "
        f"{s.get('threads', '?')} ({s.get('threads_why', 'not recorded')}). CPU use: the "
        "process's CPU time (user + system, all threads) over wall time x threads; child "
        f"processes {children}. Got: its threads' time on a CPU over that time plus their "
        "run-queue wait (a sleeping thread asks for nothing, so a serial step alone gets ~100%). "
        "CPU pressure: the share of the wall time in which some task on the machine waited for "
        "a CPU (/proc/pressure/cpu; other jobs' waits count too). Other jobs: the machine's busy "
        "CPU time on these CPUs minus this run's process tree's, per wall second. "
        f"Rule: {rule}; by other jobs when they used at least {OTHERS_SEEN:g} CPU, else by "
        "this run's own processes."
        + (f" {bad} arm(s) contended: their figures are marked in every table and the verdict "
           "does not rest on them. " + causes_text(a.step.cpu for a in study.arms.values())
           if bad else "")))


def cpu_plot(study: LoopStudy) -> None:
    from ..measurement.cpu import CONTENDED_BELOW

    arms = [(k, a) for k, a in study.arms.items() if a.step.cpu is not None]
    if not arms:
        return
    fig, ax = plotting.plt.subplots(figsize=(10, 0.28 * len(arms) + 1.8))
    judged = np.array([a.step.cpu.judged * 100 for _, a in arms])
    use = np.array([a.step.cpu.use * 100 for _, a in arms])
    y = np.arange(len(arms))
    ax.barh(y - 0.2, judged, 0.4, label="got of the CPU its threads asked for (green; red: "
                                        "contended)",
            color=[plotting.PALETTE[3] if a.step.contended else plotting.PALETTE[2]
                   for _, a in arms])
    ax.barh(y + 0.2, use, 0.4, label="CPU use (CPU time / wall x threads)",
            color=plotting.PALETTE[7])
    ax.axvline(CONTENDED_BELOW * 100, color="black", linestyle="--", linewidth=1,
               label=f"contended below {CONTENDED_BELOW:.0%}")
    ax.set_yticks(y, [f"{label(a.strategy)} · {a.variant}" for _, a in arms], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 105)
    ax.set_xlabel("% over the arm's timed steps (red: contended)")
    ax.legend(loc="lower right", fontsize=7)
    ns = [a.step.cpu.intervals for _, a in arms]
    plotting.title(ax, "What the process got of the CPUs while each arm was timed",
                   device=study.device, sizes=study.sizes,
                   repeats=f"totals over {min(ns)}-{max(ns)} timed steps per arm (warm-up "
                           "excluded)")
    plotting.show(fig, "Horizontal bars per arm: the share of the CPU time its threads asked "
                       "for that they got (red below the 80% rule line: contended), and its CPU "
                       "use over wall time x threads.")


def _short_bound(b) -> str:
    """'model-bound (forward 61%)'."""
    from ..results.timing import STAGES

    return f"{b.bound} ({STAGES[b.largest_stage][0].split(' (')[0]} {b.largest_share:.0%})"


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
    return one_line(text)


def saved(path, headline_text: str) -> Markdown:
    """The closing line of every notebook: the headline and where the results went."""
    return Markdown(f"**Headline.** {headline_text}\n\nResults: `{path.name}` in the run folder.")


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
    return table(rows, caption="Every stage above is timed between device syncs, which "
                               "serializes the host's work with the device's; the pipelined "
                               "step lets them overlap within the step. "
                               + ("On a CPU the work is synchronous already, so the difference "
                                  "is noise around 0." if cpu else
                                  "The difference is what the stage attribution's syncs cost."))
