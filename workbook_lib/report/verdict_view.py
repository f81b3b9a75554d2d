"""What notebook 05's reader sees: the answer first, then the evidence."""
from __future__ import annotations

import textwrap

import numpy as np
from IPython.display import Markdown, display

from ..results import verdict as C
from .. import pipelines
from ..common.text import capitalized
from ..results.profile import ops_words
from ..results.verdict import MINOR, VerdictResult
from . import plotting
from .tables import saved  # noqa: F401 - its notebook calls view.saved
from .tables import fmt_bytes, fmt_num, fmt_pct, fmt_seconds, fmt_stat, line_cell, table

STATUS_COLOURS = {C.HELD: "#dff0d8", C.FAILED: "#f2dede", C.NOISE: "#fcf8e3",
                  C.NOT_MEASURED: "#eeeeee"}


def label(name: str) -> str:
    return pipelines.label(name)


def answer(v: VerdictResult) -> Markdown:
    return Markdown("## The answer\n\n" + v.answer)


OUTSIDE = "(outside the pipeline's code)"
EFFECTS = {"adds": "adds time", "saves": "saves time", "rest": "not attributed",
           "noise": "shown, not booked", "": ""}


def causes_table(v: VerdictResult):
    if not v.causes:
        return Markdown(v.no_answer[0].upper() + v.no_answer[1:] + "." if v.no_answer else
                        "No causes: the pair was not timed.")
    rows = [{"stage": c.stage, "cause": c.cause,
             "evidence": c.evidence + (f"; {c.note}" if c.note else ""),
             "per extra sample (slow)": growth_cell(c.growth),
             "effect": EFFECTS.get(c.effect, c.effect) + (
                 ", minor" if c.effect in ("adds", "saves") and c.share is not None
                 and abs(c.share) < MINOR else ""),
             "difference per epoch (slow - fast)": fmt_seconds(c.difference_s)
             if c.difference_s is not None else ("not booked" if c.effect == "noise"
                                                 else c.kind),
             "share of the measured gap": fmt_pct(c.share) if c.share is not None else ""}
            for c in v.causes]
    g = v.gap
    cap = ("The epoch-time difference between the two pipelines, stage by stage: notebook 03's "
           "stage medians x steps per epoch (80% of the dataset, num_samples = "
           f"{v.num_samples:,}, at each pipeline's batch size), slow minus fast. "
           + ("" if v.builtin or not v.num_samples else
              "num_samples defaults to the investigated dataset's size: set it to yours "
              "(--set num_samples=N) for epoch times of your own; the ratio does not change. "))
    cap += ("Shares are of the measured gap (" + g.basis + "): the rows that add time, minus "
            "those that save time, plus the unattributed rest, make 100%. A factor within its "
            "noise or contended is shown, not booked. Minor: under "
            f"{MINOR:.0%} of the gap, booked but neither named in the answer nor advised (a "
            "stage whose code is the same on both sides can differ by that much: its "
            "neighbours' caches and memory)."
            if g is not None and g.measurable else
            "The two pipelines are within each other's noise: no share of a gap is given.")
    return table(rows, caption=cap)


def growth_cell(g) -> str:
    """How a stage grows with the samples, in a table cell ("" when not measured)."""
    if g is None:
        return ""
    text = fmt_stat(g.per_sample.scaled(1e3, "ms"), unit="ms") + f", {g.share_words} of the stage"
    if g.ops_per_sample is not None:
        text += f"; {g.ops_per_sample:.3g} ops"
    return text + (" (grows)" if g.grows else "")


def code_table(v: VerdictResult):
    """The first causes' extra time in the slow pipeline's own code, function by function."""
    first = [c for c in v.causes if c.effect == "adds" and c.share is not None
             and c.stage != "rest"][:2]
    if not first:
        return Markdown("No cause to find in the code: " + (v.no_answer or "no stage adds to a "
                                                             "measured gap") + ".")
    rows, said = [], []
    for c in first:
        if not c.sites:
            said.append(f"{c.cause}: {c.sites_note or 'not attributed'}")
        for s in c.sites:
            top = s.lines[0] if s.lines else None
            rows.append({"cause": c.cause, "function": s.function, "where": f"{s.file}:{s.line}",
                         "called from": s.caller_cell,
                         "library under it": s.under,
                         "hottest line": line_cell(top.line, top.text, top.share) if top
                         else "",
                         "slow, ms per profiled step": f"{s.slow_ms:.3g}",
                         "fast, ms per profiled step": f"{s.fast_ms:.3g}",
                         "share of the stage's extra time": fmt_pct(s.share),
                         "first in": (f"{s.first_in} of {s.recorded} recorded steps"
                                      if s.recorded else ""),
                         "operator calls per step": ops_words(c.stage, s.ops)})
        if c.sites and c.outside:  # the rest of the shares: what ran under no frame of its code
            rows.append({"cause": c.cause, "function": OUTSIDE, "where": "", "called from": "",
                         "library under it": "", "hottest line": "",
                         "slow, ms per profiled step": "", "fast, ms per profiled step": "",
                         "share of the stage's extra time": fmt_pct(c.outside),
                         "first in": "", "operator calls per step": ""})
    cap = ("Where each first cause's extra time is, in the slow pipeline's own files: "
           "two steps of each pipeline profiled with Python stacks in notebook 03 (the data "
           "stages: two batches under cProfile; a backward operator counts at the function that "
           "ran its forward), each function's time per step (their mean) against the fast "
           "pipeline's same function (0 where it has none); shares are of the sum of the "
           "functions' positive differences. Called from: the functions of the slow "
           "pipeline's own code that called it, with each one's share of its time in the slow "
           "pipeline where it is called from more than one place (kernel time on a GPU; in the "
           "backward, the function that made the forward call; a comprehension or lambda is "
           "part of its function; empty: only the loop or a library called it). "
           "First in: in how many of the recorded steps the "
           "stage's first function had the most extra time of any (each step against the fast "
           "pipeline's same step); where not in every one, the advice that names it says their "
           "order is not settled. Two steps, not repeated to a precision target: two functions "
           "whose times are close can trade places in a rerun. The "
           "profiler's Python tracer slows Python-heavy code, so these are shares of a "
           "profiled step, not the loop's timings. Hottest line: "
           "the slow function's line whose torch calls took the most operator time (their "
           "backward in the backward), with its share of the operator time on all the "
           "function's lines, from a step with each torch call marked by its line (empty: none "
           "marked, such as Python between torch calls). "
           f"{OUTSIDE}: operators that ran under no frame of the pipeline's code (autograd's "
           "own, or a library's threads)."
           + (" " + "; ".join(said) + "." if said else ""))
    if not rows:
        return Markdown(cap)
    return table(rows, caption=cap)


def causes_plot(v: VerdictResult) -> None:
    """A bridge (waterfall) from the fast pipeline's epoch time to the slow one's, stage by
    stage: each booked row a step up (adds) or down (saves), the rest last."""
    g = v.gap
    rows = [c for c in v.causes if c.difference_s is not None and c.effect != "noise"]
    if g is None or not rows:
        return
    if g.measurable and not g.steps_agree:  # the answer says why: the
        display(Markdown("No bridge: the full steps the stages are timed in came out the other "
                         "way from the gap (see the answer)."))  # slow epoch below the fast
        return
    start, end = g.epoch_s[g.fast], g.epoch_s[g.fast] + sum(c.difference_s for c in rows)
    labels = [f"{pipelines.label(g.fast)}\n(fast)"]
    bottoms, heights, colours = [0.0], [start], ["#7f9fbf"]
    level = start
    for c in rows:
        d = c.difference_s
        labels.append(textwrap.fill(c.cause, 14, max_lines=2, placeholder="..."))
        bottoms.append(level if d >= 0 else level + d)
        heights.append(abs(d))
        colours.append(plotting.PALETTE[3] if d > 0 else plotting.PALETTE[2]
                       if c.effect != "rest" else "#999999")
        if c.effect == "rest":
            colours[-1] = "#999999"
        level += d
    labels.append(f"{pipelines.label(g.slow)}\n(slow)")
    bottoms.append(0.0)
    heights.append(end)
    colours.append("#7f9fbf")
    unit, div = ("h", 3600.0) if end >= 3 * 3600 else (("min", 60.0) if end >= 180 else ("s", 1.0))
    fig, ax = plotting.plt.subplots(figsize=(max(7.0, 0.9 * len(labels) + 2), 4.6))
    x = np.arange(len(labels))
    ax.bar(x, np.array(heights) / div, bottom=np.array(bottoms) / div, color=colours)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.08)  # room for the labels over the highest bar
    for i in range(1, len(labels) - 1):
        c = rows[i - 1]
        share = f"{c.share:+.0%}" if c.share is not None else ""
        ax.text(i, (bottoms[i] + heights[i]) / div, share, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel({"h": "hours", "min": "minutes", "s": "seconds"}[unit]
                  + " per epoch, one process")  # the unit the bars are drawn in
    plotting.title(ax, f"From {label(g.fast)}'s epoch to {label(g.slow)}'s, "
                   "stage by stage", device=v.device,
                   repeats="stage medians x steps per epoch; labels: share of the gap")
    plotting.show(fig, "Bridge chart: the first bar is the fast pipeline's epoch time, each "
                       "following bar the difference one stage makes (red adds time, green "
                       "saves time, grey the unattributed rest), the last bar the slow "
                       "pipeline's epoch time; shares of the measured gap are printed above.")


def claims_table(v: VerdictResult):
    if not v.claims:
        return Markdown(f"No claim of the investigation was judged: {v.claims_note}."
                        if v.claims_note else "No claim of the investigation was judged.")
    import pandas as pd

    df = pd.DataFrame([{"claim": c.claim, "claimed": c.claimed, "this run": c.measured,
                        "kind": c.kind, "rule": c.rule, "status": c.status,
                        "sizes": c.size or "", "from": c.source, "note": c.note}
                       for c in v.claims])
    counts = {s: sum(c.status == s for c in v.claims) for s in C.STATUSES}
    cap = ("Each status comes from this run's figure through the rule shown. "
           + ", ".join(f"{k}: {n}" for k, n in counts.items()) + "."
           + (f" {v.claims_note[0].upper()}{v.claims_note[1:]}." if v.claims_note else ""))
    st = table(df, caption=cap)
    return st.map(lambda s: f"background-color: {STATUS_COLOURS.get(s, '')}" if s in
                  STATUS_COLOURS else "", subset=["status"])


def recommendation_text(v: VerdictResult, run_dir=None) -> Markdown:
    r = v.recommendation
    if r is None:
        return Markdown("No exact pipeline with a finite loss ran in notebook 03: no "
                        "recommendation.")
    if r.strategy == r.baseline:  # the slow side itself: nothing exact here to switch to
        lines = [f"### No exact pipeline here is faster than {r.title}",
                 f"- Its {r.step_words}: **{fmt_stat(r.ms_per_sample, unit='ms per sample')}"
                 f"** (notebook 03, {v.device}); {r.tie_rule.rstrip('.')}. The answer above "
                 "says what else this run measured."]
    else:
        lines = [f"### Use {r.title}",
                 f"- {capitalized(r.step_words)}: "
                 f"**{fmt_stat(r.ms_per_sample, unit='ms per sample')}** "
                 f"(notebook 03, {v.device}); {r.tie_rule.rstrip('.')}."]
    same = ", same rounds." if "paired" in (v.gap.basis if v.gap else "") else "."
    if r.alternative_speedup is not None and r.alternative:
        lines.append(f"- {capitalized(pipelines.title(r.alternative))} against it: "
                     f"**{fmt_stat(r.alternative_speedup, unit='x')}** per sample, "
                     f"{r.step_words}, same loop{same[:-1]}: the gap not resolved, not shown to "
                     "be faster.")
    if r.speedup is not None:
        lines.append(f"- Against {pipelines.title(r.baseline)}: **{fmt_stat(r.speedup, unit='x')}** "
                     f"faster per sample, {r.step_words}, same loop" + same)
    b = r.bench
    if b is not None and v.builtin:
        where = ("the real spec" if b.full_size else
                 "this run's reduced sizes only (the real-spec figure: `python -m workbook_lib "
                 f"bench --params params/full.yaml --out {_bench_out(run_dir)}`)")
        parts = []
        if b.ratio_vs_lazy_form is not None:
            parts.append(f"{fmt_stat(b.ratio_vs_lazy_form, unit='x')} faster than replicated "
                         "masks in the Lazy model's form")
        if b.ratio_vs_sparse_form is not None:
            parts.append(f"{fmt_stat(b.ratio_vs_sparse_form, unit='x')} than their "
                         "sparse-product form")
        if b.passes_per_sample is not None:
            parts.append(f"{b.passes_per_sample.median:.2g} DANGO-style wildtype steps per "
                         "exact sample")
        form = (f" (the shared graph as measured: {b.shared_form}, L = {b.sizes['layers']})"
                if b.shared_form else "")
        if parts:
            lines.append(f"- Benchmark ({r.bench_source}), per sample, forward + backward, at "
                         f"{where}{form}: " + "; ".join(parts) + ".")
    if r.memory_per_sample:
        lines.append("- Measured peak memory per sample (notebook 02): " + "; ".join(
            f"{label(n)} {fmt_bytes(b_)}" for n, b_ in r.memory_per_sample.items()) + ".")
    elif "02_mask_cost_model" in v.missing:
        lines.append(f"- Memory per sample: not measured (notebook 02 "
                     f"{v.missing['02_mask_cost_model']}).")
    return Markdown("\n".join(lines))


def _bench_out(run_dir) -> str:
    """Where ``bench --out`` must write for this run's verdict to read it."""
    from pathlib import Path

    if run_dir is None:
        return "RUN_DIR/bench.json"
    return str(Path(run_dir) / "bench.json")


def epochs_table(v: VerdictResult):
    r = v.recommendation
    if r is None or not r.epochs_per_day:
        return Markdown("No epochs-per-day projection: no exact pipeline to recommend.")
    # each column: epochs per 24 h at that many ranks (a user trial read "1 rank" as no unit)
    rows = [{"strategy": label(n), **{f"epochs per day, {k}": fmt_num(x) for k, x in by.items()}}
            for n, by in r.epochs_per_day.items()]
    return table(rows, caption="Projected epochs per 24 h: " + r.projection_basis + ".")


ADOPTION = '''### Adopting it in a PyG training loop

The batch carries only each sample's deleted-gene indices; no edge masks, no replicated
`edge_index`, nothing stored. Build the shared graph once, then per batch:

```python
from workbook_lib.nodemask import SharedGraph

graph = SharedGraph(cell_graph, aggr="sum", device="cuda")  # HeteroData or {edge type: edge_index}
batch = graph.batch(deleted)                 # [B, k] deleted genes per sample, -1 padded
h, _ = batch.first_layer(x0, W0, b0)         # first layer: input x0 [N, H] shared by all samples
for W, b in middle_layers:
    h = batch.layer(h, W, b)                 # [B, N, H] -> [B, N, H], exact per sample
pooled = batch.pooled_layer(h, W_last, b_last)  # last layer + mean over genes: [B, H]
```

`batch.aggregate(h)` returns the per-sample, per-edge-type aggregation `[B, N, T, H]` for a layer
of your own; `batch.aggregate_shared(x0)` and `batch.aggregate_pooled(h)` are the incremental
first layer and the pooled last layer. The pooled form holds when the last layer is linear in its
aggregation and the readout is a mean (or sum) over genes, as in this workbook's model; with an
attention readout or a non-linearity after the last layer use `batch.layer` instead. Notebook 06
trains the same model both ways and compares the loss curves.'''


def form(v: VerdictResult) -> Markdown:
    """Which form of the node-mask shared graph to adopt (from the benchmark; built-in runs
    only, where the benchmark ran)."""
    if v.form is None:
        return Markdown("")
    from .bench_view import form_text

    return form_text(v.form)


def adoption(v: VerdictResult) -> Markdown:
    r = v.recommendation
    if r is None or r.strategy != "node_mask_shared":
        # (a user trial: 'The recommended strategy here is none faster than ...')
        which = ("No strategy is recommended here" if r is None else
                 f"No strategy here is recommended over {r.title}: none is shown faster"
                 if r.strategy == r.baseline else f"The recommended strategy here is {r.title}")
        # the pointer where the answer advises the fix, or the run compares its strategies
        # (found by a user trial: beside a vectorized loss it pointed at the node-mask API)
        pointer = v.builtin or v.advises_nodemask
        return Markdown(which + (
            "; the node-mask shared graph's API, and `convert` for an encoder of your own, are "
            "in `workbook_lib.nodemask` (README)." if pointer else "."))
    return Markdown(ADOPTION)


def cpu_text(v: VerdictResult) -> Markdown:
    notes = ("**What the answer does not rest on.**\n\n" + "\n".join(f"- {n}" for n in v.notes)
             + "\n\n") if v.notes else ""
    exact = ("**Exactness.** " + "; ".join(f"{label(n)}: {w}" for n, w in v.exactness.items())
             + ".\n\n") if v.exactness else ""
    if not v.cannot_say:
        return Markdown(notes + exact + "This run was on a GPU: every claim it could test was "
                        "tested.")
    return Markdown(notes + exact + "**What a CPU run can say about a GPU run.** It can: "
                    + "; ".join(v.can_say) + ". It cannot: " + "; ".join(v.cannot_say)
                    + (". Run the workbook on a GPU node with `params/full.yaml` for those."
                       if v.builtin else ". Run your pipelines on a GPU node (`--set "
                       "device=cuda`) for those."))


def headline(v: VerdictResult) -> str:
    """The index's one sentence (composed with the answer: :mod:`~workbook_lib.studies.verdict.answer`)."""
    return v.headline
