"""Warm-step profiles by exclusive time, per pipeline: the table and the plot of notebook 03's
profile section."""
from __future__ import annotations

import numpy as np
from IPython.display import Markdown

from ..results.profile import ProfileResult, ops_words
from ..results.timing import LoopStudy, MAIN_STAGES
from .. import pipelines
from . import plotting
from .failures_view import failures_note as _failures_note
from .tables import fmt_pct, line_cell, table
from .stage_style import STAGE_LABELS, label, stage_colour


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
    # the investigation's way of summing is about its own strategies: shown only beside them
    investigated = any(pipelines.is_builtin(n) for n in profiles)
    rows = []
    for n, p in profiles.items():
        row = {"strategy": label(n), "profiled": p.profiled_steps.split(" of the run")[0]}
        sh = p.shares()
        row.update({c.replace("untracked (loop, Python)", "loop overhead"): fmt_pct(sh.get(c, 0))
                    for c in cats})
        row["exclusive sum / wall"] = f"{p.coverage:.2f}"
        row["nested sum / wall"] = f"{p.naive_over_wall:.1f}"
        if investigated:  # beside built-in strategies: theirs, and "" for a user's pipeline
            row["optimizer, summed as the investigation did"] = ""
        if p.summed and investigated and pipelines.is_builtin(n):
            row["optimizer, summed as the investigation did"] = fmt_pct(
                p.summed_shares().get("optimizer", 0.0))
        rows.append(row)
    first = next(iter(profiles.values()))
    return table(rows, caption=f"Shares by exclusive (self) time on the main thread; "
                               f"{first.profiled_steps}. 'nested sum / wall' is what summing "
                               "every event's duration gives: parents and children counted again "
                               "and again."
                               + (" The investigation's analyzer also named categories by "
                                  "keywords in event names, so every ProfilerStep (a whole "
                                  "step) counted as the optimizer: its last column reproduces "
                                  "that sum." if investigated else ""))


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


def code_table(profiles: dict[str, ProfileResult], most: int = 3):
    """Per pipeline and stage, the functions of its own code that hold the stage's profiled
    time (the largest ``most`` of each stage that runs any)."""
    rows, said = [], []
    for n, p in profiles.items():
        if not p.sites:
            said.append(f"{label(n)}: {p.sites_note or 'not attributed'}")
            continue
        if p.sites_note:  # functions attributed, their lines not
            said.append(f"{label(n)}: {p.sites_note}")
        for stage in ("data_item", "collate", *MAIN_STAGES):  # the DataLoader's apart
            sites = p.sites.get(stage, [])
            total = sum(r.seconds for r in sites)
            own = [r for r in sites if r.file][:most]
            for r in own:
                hot = r.hottest()
                rows.append({"pipeline": label(n), "stage": STAGE_LABELS.get(stage, stage),
                             "function": r.function, "where": f"{r.file}:{r.line}",
                             "called from": r.caller_words,
                             "library under it": r.library or "(its own code)",
                             "hottest line": line_cell(hot[0].line, hot[0].text, hot[1])
                             if hot else "",
                             "ms per profiled step": f"{r.seconds * 1e3:.3g}",
                             "each recorded step, ms": ", ".join(f"{x * 1e3:.3g}"
                                                                for x in r.step_seconds),
                             "share of the stage": fmt_pct(r.seconds / total) if total else "",
                             "operator calls per step": ops_words(stage, r.ops)})
    cap = ("Where each stage's profiled time is in each pipeline's own files, from two steps "
           "recorded with Python stacks (the data stages: two batches under cProfile): ms per "
           "step is their mean, each step's beside it (two steps show how far a function's "
           "time moves from one step to the next, not a precision target: close rows can trade "
           "places in a rerun; a backward operator counts at the function that ran its forward; "
           "time under no function of the pipeline's own, the loop's or a library's called from "
           "it, is left out of the rows but not of the shares). The Python tracer slows "
           "Python-heavy code: shares of a profiled step, not the loop's timings. Hottest "
           "line: the function's line whose torch calls took the most operator time (their "
           "backward in the backward stage), with its share of the operator time on all the "
           "function's lines, from another step with each torch call marked by its line; "
           "Python between torch calls has no line (empty: no torch call marked). Called "
           "from: the pipeline's own function that called it for the most of its time, with "
           "that share where it is called from more than one place (kernel time on a GPU; in "
           "the backward, the function that made the forward call; a comprehension or lambda "
           "is part of its function; empty: only the loop or a library called it)."
           + (" Not attributed, or not by line: " + "; ".join(said) + "." if said else ""))
    if not rows:
        return Markdown(cap)
    return table(rows, caption=cap)
