"""What notebook 05's reader sees: the answer first, then the evidence."""
from __future__ import annotations

import textwrap

import numpy as np
from IPython.display import Markdown

from ..analysis import claims as C
from ..analysis.verdict import VerdictResult
from .. import pipelines
from . import plotting
from .tables import fmt_num, fmt_pct, fmt_seconds, fmt_stat, table

STATUS_COLOURS = {C.HELD: "#dff0d8", C.FAILED: "#f2dede", C.NOISE: "#fcf8e3",
                  C.NOT_MEASURED: "#eeeeee"}


def label(name: str) -> str:
    return pipelines.label(name)


def answer(v: VerdictResult) -> Markdown:
    return Markdown("## The answer\n\n" + v.answer)


EFFECTS = {"adds": "adds time", "saves": "saves time", "rest": "not attributed",
           "noise": "within its noise", "": ""}


def causes_table(v: VerdictResult):
    rows = [{"stage": c.stage, "cause": c.cause, "evidence": c.evidence, "effect": EFFECTS.get(c.effect, c.effect),
             "difference per epoch (slow - fast)": fmt_seconds(c.difference_s)
             if c.difference_s is not None else c.kind,
             "share of the measured gap": fmt_pct(c.share) if c.share is not None else ""}
            for c in v.causes]
    return table(rows, caption="The epoch-time difference between the two pipelines by "
                               "mechanism: notebook 03's stage medians x steps per epoch (80% of "
                               "the dataset at each pipeline's batch size), and notebook 04's "
                               "DDP factor (always applied, with its IQR). Shares are of the measured gap (the "
                               "full steps' medians x steps per epoch): the causes that add time, "
                               "minus those that save time, plus the unattributed rest, make "
                               "100%.")


def causes_plot(v: VerdictResult) -> None:
    groups = [("adds", "adds time"), ("saves", "saves time"), ("noise", "within its noise"),
              ("rest", "not attributed")]
    rows = [(c, lab) for eff, lab in groups for c in v.causes
            if c.effect == eff and c.share is not None]
    if not rows:
        return
    fig, ax = plotting.plt.subplots(figsize=(10, 0.65 * len(rows) + 1.6))
    colours = {"adds time": plotting.PALETTE[3], "saves time": plotting.PALETTE[2],
               "within its noise": "#cccccc", "not attributed": "#999999"}
    vals = np.array([abs(c.share) * 100 for c, _ in rows])
    ax.barh(range(len(rows)), vals, color=[colours[lab] for _, lab in rows])
    ax.set_yticks(range(len(rows)), [textwrap.fill(f"[{lab}] {c.cause}", 58, max_lines=2,
                                                   placeholder="...") for c, lab in rows],
                  fontsize=8)
    ax.invert_yaxis()
    for i, ((c, lab), x) in enumerate(zip(rows, vals)):
        sign = "-" if lab == "saves time" or (lab in ("not attributed", "within its noise")
                                              and c.share < 0) else ""
        ax.text(x, i, f" {sign}{x:.1f}%", va="center", fontsize=8)
    ax.set_xlim(0, max(vals.max() * 1.18, 1.0))
    ax.set_xlabel("size of the cause, % of the measured epoch-time gap")
    slow = next((s for s in (v.gap_strategies or []) if s), "")
    plotting.title(ax, f"Why {pipelines.title(slow) if slow else 'the slow pipeline'} is slower, "
                   "by mechanism", device=v.device)
    plotting.show(fig, "Horizontal bars: each mechanism's part of the measured epoch-time gap "
                       "(slow minus fast pipeline). Red bars add time to the slow pipeline, "
                       "green bars save time (shown as their size, labelled with a minus), a "
                       "light grey bar is a factor whose IQR holds 1 (booked, no measurable "
                       "effect), the grey bar is what the stage medians leave unattributed.")


def claims_table(v: VerdictResult):
    import pandas as pd

    df = pd.DataFrame([{"claim": c.claim, "claimed": c.claimed, "this run": c.measured,
                        "kind": c.kind, "rule": c.rule, "status": c.status,
                        "sizes": c.size or "", "from": c.source, "note": c.note}
                       for c in v.claims])
    counts = {s: sum(c.status == s for c in v.claims) for s in C.STATUSES}
    cap = ("Each status comes from this run's figure through the rule shown. "
           + ", ".join(f"{k}: {n}" for k, n in counts.items()) + ".")
    st = table(df, caption=cap)
    return st.map(lambda s: f"background-color: {STATUS_COLOURS.get(s, '')}" if s in
                  STATUS_COLOURS else "", subset=["status"])


def recommendation_text(v: VerdictResult, run_dir=None) -> Markdown:
    r = v.recommendation
    if r is None:
        return Markdown("No exact strategy ran in notebook 03: no recommendation.")
    lines = [f"### Use {r.title}",
             f"- Full training step: **{fmt_stat(r.ms_per_sample, unit='ms')}** per sample "
             f"(notebook 03, {v.device}); {r.tie_rule}."]
    if r.speedup is not None:
        lines.append(f"- Against {pipelines.title(r.baseline)}: **{fmt_stat(r.speedup, unit='x')}** faster "
                     "per sample, same loop, same rounds.")
    b = r.bench
    if b is not None:
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
        lines.append(f"- Benchmark ({r.bench_source}), per sample, forward + backward, at "
                     f"{where}{form}: " + "; ".join(parts) + ".")
    if r.memory_per_sample:
        lines.append("- Measured peak memory per sample (notebook 02): " + "; ".join(
            f"{label(n)} {b_ / 1e6:,.0f} MB" for n, b_ in r.memory_per_sample.items()) + ".")
    return Markdown("\n".join(lines))


def _bench_out(run_dir) -> str:
    """Where ``bench --out`` must write for this run's verdict to read it."""
    from pathlib import Path

    if run_dir is None:
        return "RUN_DIR/bench.json"
    return str(Path(run_dir) / "bench.json")


def epochs_table(v: VerdictResult):
    r = v.recommendation
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
                    + ". Run the workbook on a GPU node with `params/full.yaml` for those.")


def headline(v: VerdictResult) -> str:
    r = v.recommendation
    parts = []
    first = next((c for c in v.causes if c.effect == "adds" and c.share is not None), None)
    if first is not None:
        parts.append(f"first cause: {first.cause.split(' (')[0]} ({first.share:.0%} of the gap)")
    if r is not None and r.strategy == r.baseline:
        parts.append(f"no exact pipeline here is faster than {r.title}")
    elif r is not None:
        s = f"use {r.title}"
        if r.speedup is not None:
            s += (f" ({r.speedup.median:.3g}x faster per sample than {pipelines.title(r.baseline)} here"
                  + (" (disturbed)" if "speedup" in v.disturbed else "")
                  + (" (contended)" if "speedup" in v.contended else ""))
            b = r.bench
            if r.strategy == "node_mask_shared" and b is not None \
                    and b.ratio_vs_lazy_form is not None:  # the benchmark times this form only
                s += (f"; {b.ratio_vs_lazy_form.median:.3g}x against the Lazy model's form at "
                      f"{'the real spec' if b.full_size else 'reduced size'}"
                      + (" (disturbed)" if "bench" in v.disturbed else "")
                      + (" (contended)" if "bench" in v.contended else ""))
            s += ")"
        parts.append(s)
    if v.gap_total is not None:
        parts.append(f"measured gap {v.gap_total.median:.3g}x (the investigation: 40x on GPUs)")
    counts = {s: sum(c.status == s for c in v.claims) for s in C.STATUSES}
    parts.append("claims " + ", ".join(f"{k}: {n}" for k, n in counts.items() if n))
    if v.contended:
        parts.append("contended (not relied on): " + ", ".join(v.contended))
    if v.disturbed:
        parts.append("disturbed (not relied on): " + ", ".join(v.disturbed))
    return "; ".join(parts)


def saved(path, headline_text: str) -> Markdown:
    return Markdown(f"**Headline.** {headline_text}\n\nResults: `{path.name}` in the run folder.")
