"""What notebook 05's reader sees: the answer first, then the evidence."""
from __future__ import annotations

import textwrap

import numpy as np
from IPython.display import Markdown

from ..studies.verdict import claims as C
from ..studies import verdict as V
from ..measurement.cpu import causes_text
from .. import pipelines
from ..results.verdict import VerdictResult
from . import plotting
from ..common.text import one_line
from .tables import saved  # noqa: F401 - its notebook calls view.saved
from .tables import HEADLINE_MAX, fmt_bytes, fmt_num, fmt_pct, fmt_seconds, fmt_stat, table

STATUS_COLOURS = {C.HELD: "#dff0d8", C.FAILED: "#f2dede", C.NOISE: "#fcf8e3",
                  C.NOT_MEASURED: "#eeeeee"}


def label(name: str) -> str:
    return pipelines.label(name)


def answer(v: VerdictResult) -> Markdown:
    return Markdown("## The answer\n\n" + v.answer)


def _pct(x: float) -> str:
    return f"{x:.0%}"


def lead(v: VerdictResult) -> str:
    """The answer's first sentence: the pair's one gap ratio, the first causes, what to change
    first (or one line why there is no such answer)."""
    if v.no_answer:
        return f"**No answer about this pair:** {v.no_answer[len('no answer about '):]}." \
            if v.no_answer.startswith("no answer about ") else f"**No answer:** {v.no_answer}."
    g = v.gap
    s, f = pipelines.title(g.slow), pipelines.title(g.fast)
    r = g.ratio
    fig = f"IQR {r.iqr:.2g}, n = {r.n}" + ("; contended, not relied on: see below"
                                          if "gap" in v.contended else
                                          "; disturbed, not relied on: see below"
                                          if "gap" in v.disturbed else "")
    if not g.measurable and r.n < V.MIN_PAIRED:
        return (f"**{s[0].upper()}{s[1:]} and {f}: too few paired steps to resolve a gap** "
                f"(n = {r.n}, at least {V.MIN_PAIRED} needed; epoch-time ratio {r.median:.3g}x): "
                "there is no gap to explain on these figures; raise loop_steps.")
    if not g.measurable:
        return (f"**{s[0].upper()}{s[1:]} and {f} train at the same speed within the noise**: "
                f"epoch-time ratio {r.median:.3g}x ({fig}; quartiles {r.q1:.3g}-{r.q3:.3g}), "
                f"not resolved beyond its IQR and the {v.target:.0%} precision target: there is "
                "no gap to explain.")
    text = f"**{s[0].upper()}{s[1:]} is {r.median:.3g}x slower per epoch than {f}** ({fig})"
    first = V.first_causes(v.causes)
    if not first:
        top = next((c for c in v.causes if c.effect == "adds" and c.share is not None), None)
        return text + ("; no stage stands out" + (f" (largest: {top.cause}, {_pct(top.share)} "
                                                  "of the gap)" if top else "") + ".")
    parts = []
    for i, c in enumerate(first):
        p = f"{c.cause} ({_pct(c.share)}" + (" of the gap" if i == 0 else "")
        if c.share > 1.0:  # an offsetting term stands beside any share above 100%
            off = V.offsets(v.causes)
            if off:
                p += ", offset by " + ", ".join(f"{o.cause} {_pct(o.share)}" for o in off[:2])
        parts.append(p + ")")
    if V.told_apart(first, g):
        text += "; first cause: " + parts[0] + (", then " + ", ".join(parts[1:]) if parts[1:]
                                                 else "")
    else:  # a near tie: both named, neither put first on figures that cannot rank them
        spread = g.ratio.iqr / max(g.ratio.median - 1.0, 1e-12)
        text += (f"; first causes, not told apart at this precision (their shares differ by "
                 f"less than the gap's own spread, its IQR over the ratio minus one: "
                 f"{_pct(spread)} of it): " + parts[0] + " and " + parts[1])
    if first[0].advice:
        text += f"; change first: {first[0].advice}"
    return text + "."


def caveats(v: VerdictResult) -> list[str]:
    """One line each: what the answer does not rest on, what is missing and why."""
    out = []
    g = v.gap
    if g is not None and g.swapped:
        r = g.ratio
        out.append(f"Listed the other way round: gap_strategies names '{g.listed[0]}' as the "
                   f"slow one, but it is the faster ({r.median:.3g}x per epoch, IQR {r.iqr:.2g})"
                   f"; the gap is explained as '{g.slow}' over '{g.fast}'.")
    if v.contended:
        worst = min(v.contended.values(), key=lambda c: c.got if c.got is not None else 1.0)
        causes = {c.cause for c in v.contended.values()}
        out.append("Contended, not relied on: " + ", ".join(
            V.CONTENDED_LABELS.get(k, k) for k in v.contended) + f" (the worst: {worst.explain()})."
            + (" " + causes_text(v.contended.values()) if len(causes) > 1 else ""))
    noisy = [k for k in v.disturbed if k not in v.contended]
    if noisy:
        out.append("Disturbed, not relied on: " + ", ".join(
            f"{V.DISTURBED_LABELS.get(k, k)} (IQR/median {v.disturbed[k]:.0%})" for k in noisy)
            + f", against the {v.target:.0%} target, with no contention seen: the steps themselves "
            "varied that much (batches of unequal cost, or a stage whose time varies); more "
            "steps (loop_steps, loop_budget_s) firm up the median, they do not narrow the "
            "spread.")
    for name, what in v.nonfinite.items():
        out.append(f"'{name}': {what}: its timings are of a diverged step"
                   + (" (it is not recommended)." if v.recommendation is None or
                      v.recommendation.strategy != name else "."))
    for name, what in v.failures.items():
        if f"'{name}'" not in v.no_answer:  # the lead says it already
            out.append(f"{what[0].upper()}{what[1:]}.")
    if g is not None and g.ddp_factor is not None and not g.ddp_booked:
        out.append(f"DDP factor at {g.ddp_world} ranks {g.ddp_factor.median:.3g} (IQR "
                   f"{g.ddp_factor.iqr:.2g}): {g.ddp_why}.")
    for nb, why in v.missing.items():
        what = MISSING_WHAT.get(nb[:2], nb)
        fail = [w for n, w in v.failures.items() if w.startswith(f"in notebook {nb[:2]}")]
        out.append(f"No {what}: notebook {nb[:2]} {why}" + (f" ({'; '.join(fail)})" if fail
                                                              else "") + ".")
    if v.syncs_note:
        out.append(v.syncs_note[0].upper() + v.syncs_note[1:] + ".")
    first = V.first_causes(v.causes)
    if first and first[0].note:
        out.append(f"Where the {first[0].cause}'s time went: {first[0].note}.")
    return out


MISSING_WHAT = {"01": "graph inventory", "02": "memory per sample or benchmark",
                "04": "DDP factor"}


def _builtin_fix(r) -> str:
    """The workbook's own fix as notebook 02's benchmark measured it on this graph (never
    quoted as the speed of a pipeline it did not time)."""
    b = r.bench
    if b is None or b.ratio_vs_lazy_form is None:
        return ("The workbook's own fix, the node-mask shared graph (workbook_lib.nodemask), "
                "was not benchmarked in this run.")
    where = "at the real spec" if b.full_size else "at this run's reduced size"
    return (f"The workbook's own fix, the node-mask shared graph (workbook_lib.nodemask), "
            f"measured {b.ratio_vs_lazy_form.median:.3g}x faster per sample (forward + backward) "
            f"than replicated masks in the Lazy model's form in notebook 02's benchmark on this "
            f"graph, {where} (the built-in forms, not your pipelines).")


def equal_command(v: VerdictResult) -> str:
    """``python -m workbook_lib equal SLOW FAST`` for the pair, with the specs the run was given
    (a pipeline's name alone is not a spec the command can import)."""
    def spec(name: str) -> str:
        target = v.specs.get(name)
        return name if target is None else (target if target.split(":")[0].split("/")[-1]
                                            .removesuffix(".py") == name else
                                            f"{name}={target}")

    return f"python -m workbook_lib equal {spec(v.gap.slow)} {spec(v.gap.fast)}"


def fix_text(v: VerdictResult) -> str:
    """The fix in one paragraph: the fastest exact pipeline, named for what its figure times."""
    r = v.recommendation
    if r is None:
        return ("**No exact pipeline in this run** (every one declares exact = False, or its "
                "loss was not finite): nothing here computes the perturbed graph to recommend. "
                "The node-mask shared graph (workbook_lib.nodemask) is exact; check a rewrite "
                "with `python -m workbook_lib equal SLOW FAST` before trusting its speed.")
    shaky = set(v.disturbed) | set(v.contended)
    if r.strategy == r.baseline:
        return (f"**No exact pipeline in this run is faster than {r.title}.** "
                + (_builtin_fix(r) + " " if v.builtin else
                   "The node-mask shared graph (workbook_lib.nodemask) computes the same model "
                   "with one pass over one shared graph. ")
                + "Check that a rewrite computes the same model with `python -m workbook_lib "
                "equal SLOW FAST` before trusting its speed.")
    head = ("**The fix, provisionally: " if "loop" in v.contended else "**The fix: ")
    if v.gap is not None and r.strategy == v.gap.fast and r.strategy != "node_mask_shared":
        return (head + f"{r.title}**, exact and the faster side of this gap (its per-epoch "
                "figure is the gap above). Check it computes the same model with "
                f"`{equal_command(v)}` before adopting it.")
    text = head + f"{r.title}**, exact"
    if r.speedup is not None:
        text += (f"; its full step per sample (notebook 03, same loop) {r.speedup.median:.3g}x "
                 f"faster than {pipelines.title(r.baseline)}"
                 + (" (a disturbed or contended figure, see above)" if "speedup" in shaky
                    else ""))
    b = r.bench
    if r.strategy != "node_mask_shared":
        text += ". " + (_builtin_fix(r) if v.builtin else "")
    elif b is not None and b.ratio_vs_lazy_form is not None:
        where = "at the real spec" if b.full_size else "at this run's reduced size (only)"
        text += (f"; benchmark per sample, forward + backward: {b.ratio_vs_lazy_form.median:.3g}x "
                 f"faster than replicated masks in the Lazy model's form {where}"
                 + (" (a disturbed or contended figure, see above)" if "bench" in shaky else ""))
        if b.passes_per_sample is not None:
            text += f", {b.passes_per_sample.median:.2g} wildtype steps per exact sample"
    text = text.strip()
    if "disturbed" in r.tie_rule or r.contended:
        text += f" Choosing among {', '.join(pipelines.title(n) for n in r.tied)}: {r.tie_rule}."
    return text if text.endswith(".") else text + "."


def story(v: VerdictResult, scale: float | None = None, edges: int | None = None) -> str:
    """The investigation's figures beside this run's (only when built-in strategies ran)."""
    if not v.builtin or v.gap is None:
        return ""
    where = f" at scale {scale:g} ({edges:,} edges)" if scale is not None and edges else ""
    return (f"The investigation observed about 40x on 4 GPUs at the real size; this run measured "
            f"{v.gap.ratio.median:.3g}x on a {v.device_type.upper()}{where}. The steps-per-epoch "
            "factor is the same arithmetic in both; the per-step factor depends on the device "
            "and the graph's size (notebook 02's benchmark shows it at the real size).")


def compose(v: VerdictResult, scale: float | None = None, edges: int | None = None) -> str:
    """The whole answer: the lead sentence, one caveat a line, the fix, and (built-in runs) the
    investigation's figures and what a CPU can say. Sets ``v.lead`` and ``v.caveats``."""
    v.lead = lead(v)
    v.caveats = caveats(v)
    parts = [v.lead]
    if v.caveats:
        parts.append("\n".join(f"- {c}" for c in v.caveats))
    parts.append(fix_text(v))
    st = story(v, scale, edges)
    if st:
        parts.append(st)
    if v.cannot_say and v.builtin:
        parts.append("A CPU run can say: " + "; ".join(v.can_say) + ". It cannot say: "
                     + "; ".join(v.cannot_say) + ".")
    v.answer = "\n\n".join(parts)
    return v.answer


EFFECTS = {"adds": "adds time", "saves": "saves time", "rest": "not attributed",
           "noise": "shown, not booked", "": ""}


def causes_table(v: VerdictResult):
    if not v.causes:
        return Markdown(v.no_answer[0].upper() + v.no_answer[1:] + "." if v.no_answer else
                        "No causes: the pair was not timed.")
    rows = [{"stage": c.stage, "cause": c.cause,
             "evidence": c.evidence + (f"; {c.note}" if c.note else ""),
             "effect": EFFECTS.get(c.effect, c.effect),
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
            "noise or contended is shown, not booked."
            if g is not None and g.measurable else
            "The two pipelines are within each other's noise: no share of a gap is given.")
    return table(rows, caption=cap)


def causes_plot(v: VerdictResult) -> None:
    """A bridge (waterfall) from the fast pipeline's epoch time to the slow one's, stage by
    stage: each booked row a step up (adds) or down (saves), the rest last."""
    g = v.gap
    rows = [c for c in v.causes if c.difference_s is not None and c.effect != "noise"]
    if g is None or not rows:
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
    for i in range(1, len(labels) - 1):
        c = rows[i - 1]
        share = f"{c.share:+.0%}" if c.share is not None else ""
        ax.text(i, (bottoms[i] + heights[i]) / div, share, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel(f"seconds per epoch, one process ({unit})" if unit != "s" else
                  "seconds per epoch, one process")
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
    lines = [f"### Use {r.title}",
             f"- Full training step: **{fmt_stat(r.ms_per_sample, unit='ms per sample')}** "
             f"(notebook 03, {v.device}); {r.tie_rule.rstrip('.')}."]
    if r.speedup is not None:
        lines.append(f"- Against {pipelines.title(r.baseline)}: **{fmt_stat(r.speedup, unit='x')}** "
                     "faster per sample, full step, same loop"
                     + (", same rounds." if "paired" in (v.gap.basis if v.gap else "") else "."))
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
    rows = [{"strategy": label(n), **{k: fmt_num(x) for k, x in by.items()}}
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
    if not v.builtin:
        return Markdown("")
    from ..studies.mask_cost import bench
    from .bench_view import form_text

    return form_text(bench.recommended_form(v.recommendation.bench if v.recommendation
                                            else None))


def sizes_of(found: dict) -> dict:
    """The scale and edge count of the run's graph, from notebook 01 when it completed."""
    inv = found.get("01_graph_inventory")
    return {"scale": getattr(inv, "scale", None), "edges": getattr(inv, "total_edges", None)}


def adoption(v: VerdictResult) -> Markdown:
    r = v.recommendation
    if r is None or r.strategy != "node_mask_shared":
        return Markdown(f"The recommended strategy here is {r.title if r else 'none'}; the "
                        "node-mask shared graph's API is in `workbook_lib.nodemask` (README).")
    return Markdown(ADOPTION)


def cpu_text(v: VerdictResult) -> Markdown:
    if not v.cannot_say:
        return Markdown("This run was on a GPU: every claim it could test was tested.")
    return Markdown("**What a CPU run can say about a GPU run.** It can: "
                    + "; ".join(v.can_say) + ". It cannot: " + "; ".join(v.cannot_say)
                    + (". Run the workbook on a GPU node with `params/full.yaml` for those."
                       if v.builtin else ". Run your pipelines on a GPU node (`--set "
                       "device=cuda`) for those."))


def headline(v: VerdictResult) -> str:
    """One short sentence for the index (at most :data:`HEADLINE_MAX` characters): a contended
    or disturbed mark first, then the answer."""
    marks = []
    if v.contended:
        marks.append("contended")
    if v.disturbed and not set(v.disturbed) <= set(v.contended):
        marks.append("disturbed")
    mark = (" and ".join(marks).upper() + ": ") if marks else ""
    if v.no_answer:
        return one_line(mark + v.no_answer, HEADLINE_MAX)
    g = v.gap
    if not g.measurable:
        text = (f"{g.slow} and {g.fast}: no measurable gap ({g.ratio.median:.3g}x per epoch, "
                "IQR holds 1)")
    else:
        text = f"{g.slow} {g.ratio.median:.3g}x slower per epoch than {g.fast}"
        if g.swapped:
            text += " (listed the other way round)"
        first = V.first_causes(v.causes)
        if first:
            ranked = V.told_apart(first, g)
            text += ("; first cause: " if ranked else "; first causes (not told apart): ") + (
                ", then " if ranked else " and ").join(f"{c.cause} ({_pct(c.share)})"
                                                       for c in first)
    r = v.recommendation
    if r is not None and r.strategy not in (g.slow, g.fast):
        text += f"; fix: {r.label}"
    return one_line(mark + text, HEADLINE_MAX)
