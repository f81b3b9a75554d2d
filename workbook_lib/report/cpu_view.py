"""What the processes got of the CPUs while notebook 03's loop was timed: the table and the plot,
per pipeline and mode (contended figures marked)."""
from __future__ import annotations

import numpy as np

from ..results.timing import HALF, LoopStudy, PIPELINED
from . import plotting
from .tables import fmt_pct, table
from .stage_style import MODE_LABELS, PIPELINED_LABEL, label


def cpu_rows(study: LoopStudy) -> list[dict]:
    """Per arm: what the process got of the CPUs over its timed steps."""
    rows = []
    for key, a in study.arms.items():
        c = a.step.cpu
        if c is None:
            continue
        mode = PIPELINED_LABEL if a.variant == PIPELINED else \
            f"full step at batch {a.samples_per_step} (how stages grow)" if a.variant == HALF \
            else MODE_LABELS.get(a.mode, a.variant)
        rows.append({"pipeline": label(a.strategy), "mode": mode,
                     "threads / CPUs": f"{c.threads} / {c.allowed}",
                     "CPU use (CPU time / wall x threads)": fmt_pct(c.use, 0)
                     + c.error_text(c.use_error),
                     "got of the CPU asked for": fmt_pct(c.got, 0)
                     + c.error_text(c.got_error, True) if c.got is not None
                     else "n/a (no schedstat)",
                     "CPU pressure (machine)": fmt_pct(c.pressure, 0)
                     if c.pressure is not None else "not available here",
                     "other jobs (CPUs)": f"{c.others:.2f}" if c.others is not None
                     else "not told",
                     "contended": "CONTENDED" if c.contended else "no",
                     "by": c.cause or "",
                     "in the kernel": kernel_cell(c)})
    return rows


def kernel_cell(c) -> str:
    """'40%, 1,900,000 page faults per step (KERNEL-BOUND)'; 'not read' where not recorded."""
    if c.kernel is None:
        return "not read"
    faults = c.faults_text("step")
    return f"{c.kernel:.0%}" + (f", {faults}" if faults else "") + \
        (" (KERNEL-BOUND)" if c.kernel_bound else "")


def cpu_table(study: LoopStudy):
    from ..results.cpu import (FAULTS_HIGH, KERNEL_HIGH, OTHERS_SEEN, SHARE_ERROR_SHOWN,
                               causes_text)

    rows = cpu_rows(study)
    s = study.settings
    first = next((a.step.cpu for a in study.arms.values() if a.step.cpu is not None), None)
    rule = first.rule if first is not None else ""
    children = first.children if first is not None else ""
    bad = sum(r["contended"] == "CONTENDED" for r in rows)
    heavy = sum(r["in the kernel"].endswith("(KERNEL-BOUND)") for r in rows)
    return table(rows, caption=(
        f"What the process got of the CPUs over each arm's timed steps. Threads: "
        f"{s.get('threads', '?')} ({s.get('threads_why', 'not recorded')}). CPU use: the "
        "process's CPU time (user + system, all threads) over wall time x threads; child "
        f"processes {children}. Got: its threads' time on a CPU over that time plus their "
        "run-queue wait (a sleeping thread asks for nothing, so a serial step alone gets ~100%). "
        "Both are read from what the kernel adds up once per scheduler tick"
        + (f" ({first.tick_s * 1e3:.2g} ms here)" if first is not None and first.tick_s else "")
        + ", so over short steps the run times can lag by a few ticks: each share's error, "
        "about 2.5 standard deviations, is shown beside it as '(±N points)' from "
        f"{SHARE_ERROR_SHOWN * 100:.0f} points (CPU use can then read above 100%). "
        "CPU pressure: the share of the wall time in which some task on the machine waited for "
        "a CPU (/proc/pressure/cpu; other jobs' waits count too). Other jobs: the machine's busy "
        "CPU time on these CPUs minus this run's process tree's, per wall second. "
        f"Rule: {rule}; by other jobs when they used at least {OTHERS_SEEN:g} CPU, else by "
        "this run's own processes. In the kernel: the share of its CPU time that was system "
        "time, and its page faults per timed step; kernel-bound from "
        f"{KERNEL_HIGH:.0%} with {FAULTS_HIGH:,} page faults per CPU second."
        + (f" {bad} arm(s) contended: their figures are marked in every table and the verdict "
           "does not rest on them. " + causes_text(a.step.cpu for a in study.arms.values())
           if bad else "")
        + (f" {heavy} arm(s) kernel-bound: {_way_out(study)}." if heavy else "")))


def _way_out(study: LoopStudy) -> str:
    """The kernel-bound arms' way out, as their measurements say (freed memory kept or not)."""
    from ..results.cpu import KEEP_PAGES

    heavy = [a.step.cpu for a in study.arms.values()
             if a.step.cpu is not None and a.step.cpu.kernel_bound]
    return heavy[0].keep_pages() if heavy and all(c.freed_kept for c in heavy) else KEEP_PAGES


def cpu_plot(study: LoopStudy) -> None:
    from ..results.cpu import CONTENDED_BELOW

    arms = [(k, a) for k, a in study.arms.items() if a.step.cpu is not None]
    if not arms:
        return
    fig, ax = plotting.plt.subplots(figsize=(10, 0.28 * len(arms) + 1.8))
    judged = np.array([a.step.cpu.judged * 100 for _, a in arms])
    use = np.array([a.step.cpu.use * 100 for _, a in arms])
    judged_err = np.array([a.step.cpu.judged_error * 100 for _, a in arms])
    use_err = np.array([(a.step.cpu.use_error or 0.0) * 100 for _, a in arms])
    y = np.arange(len(arms))
    ax.barh(y - 0.2, judged, 0.4, xerr=judged_err,
            label="got of the CPU its threads asked for (green; red: contended)",
            color=[plotting.PALETTE[3] if a.step.contended else plotting.PALETTE[2]
                   for _, a in arms])
    ax.barh(y + 0.2, use, 0.4, xerr=use_err, label="CPU use (CPU time / wall x threads)",
            color=plotting.PALETTE[7])
    ax.axvline(CONTENDED_BELOW * 100, color="black", linestyle="--", linewidth=1,
               label=f"contended below {CONTENDED_BELOW:.0%}")
    ax.set_yticks(y, [f"{label(a.strategy)} · {a.variant}" for _, a in arms], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, max(105.0, float(np.nanmax(np.r_[judged + judged_err, use + use_err])) + 5))
    ax.set_xlabel("% over the arm's timed steps (red: contended)")
    ax.legend(loc="lower right", fontsize=7)
    ns = [a.step.cpu.intervals for _, a in arms]
    plotting.title(ax, "What the process got of the CPUs while each arm was timed",
                   device=study.device, sizes=study.sizes,
                   repeats=f"totals over {min(ns)}-{max(ns)} timed steps per arm (warm-up "
                           "excluded)")
    plotting.show(fig, "Horizontal bars per arm: the share of the CPU time its threads asked "
                       "for that they got (red below the 80% rule line: contended), and its CPU "
                       "use over wall time x threads; whiskers: how far the kernel's per-tick "
                       "accounting can move each over steps that short.")
