"""The strategy benchmark's tables and plots (notebook 02's benchmark section; 05 and 06 name the
form it recommends)."""
from __future__ import annotations

import numpy as np
from IPython.display import Markdown

from ..results.bench import FormChoice, recommended_form
from .bench_text import (convert_rows, floor_drift, part_caption, part_rows,
                         replicated_ratio_text)
from ..results.bench import BenchResult
from . import plotting
from .tables import fmt_time_stat, table, say_not_run, skip_none


def _ms(st) -> str:
    return f"{st.median * 1e3:.3g} ms (IQR {st.iqr * 1e3:.2g}, n={st.n})"


@skip_none
def bench_table(b: BenchResult):
    """One row per variant: its label (the shared forms' path and push kernel), the batch its
    per-sample figure stands for and what that figure is (measured there, or projected)."""
    rows = []
    for k, v in b.per_sample_s.items():
        fit = b.replicated.get(k)
        if fit is not None:
            steps = [f"B=1: {fmt_time_stat(fit.step_b1)}"]
            if fit.step_b2:
                steps.append(f"B=2: {fmt_time_stat(fit.step_b2)}")
            if fit.check_step is not None:
                steps.append(f"B={fit.check_batch}: {fmt_time_stat(fit.check_step)}")
            step, check = "; ".join(steps), fit.error_text
        else:
            step, check = fmt_time_stat(b.steps[k]), ""
        rows.append({"variant": v.label or k, "B": v.batch_size, "per-sample figure":
                     v.batch_reason, "steps timed": step, "per sample": _ms(v),
                     "projection from B = 1, 2": check})
    for k, why in b.skipped.items():
        rows.append({"variant": k, "B": "", "per-sample figure": f"skipped: {why}",
                     "steps timed": "", "per sample": "", "projection from B = 1, 2": ""})
    kind = "the real spec" if b.full_size else "this run's sizes (a reduced-size rehearsal)"
    return table(rows, caption=f"Forward + backward per sample at {kind}: {b.sizes['edges']:,} "
                               f"edges, H={b.sizes['hidden']}, L={b.sizes['layers']}, "
                               f"{b.rounds} interleaved rounds; {b.device}; delta push kernel "
                               f"{b.push_kernel or 'none (no delta form ran)'}. Replicated "
                               "forms: measured at the shared form's batch when the memory "
                               "estimate fits the budget, else projected from B = 1, 2 (the "
                               "line through the two steps); B = 1 and 2 are timed in the same "
                               "rounds either way, so the last column shows the projection's "
                               "error at the largest batch measured.")


@skip_none
def form_of(b: BenchResult) -> Markdown:
    """The form of the node-mask shared graph the benchmark recommends (nothing without a
    benchmark: no built-in strategy ran)."""
    return form_text(recommended_form(b))


def form_text(c: FormChoice) -> Markdown:
    """Which form of the node-mask shared graph this run recommends, and why."""
    name = {"delta": "the second layer delta-propagated (`middle=\"delta\"`, the default)",
            "full": "full middle layers (`middle=\"full\"`)"}[c.middle]
    return Markdown(f"**Recommended form of the node-mask shared graph:** {name}: {c.reason}.")


@skip_none
def rates_table(b: BenchResult):
    """Achieved multiply-add rates of the shared steps' products beside this machine's best."""
    rows = [{"step": b.per_sample_s[f.variant].label if f.variant in b.per_sample_s
             else f.variant, "products": f.kind,
             "G multiply-adds": f"{f.macs / 1e9:.3g}" + (
                 f" (+{f.inside_macs / 1e9:.3g} inside the push)" if f.inside_macs else ""),
             "time in them": f"{f.seconds * 1e3:.3g} ms ({f.seconds / f.step_seconds:.0%} of "
                             "the profiled step)",
             "achieved GMAC/s": f"{f.gmacs:.3g}",
             "machine's best GMAC/s": "n/a" if f.machine_gmacs is None else
             f"{f.machine_gmacs:.3g} ({f.machine_source})",
             "achieved / best": "n/a" if not f.machine_gmacs else
             f"{f.gmacs / f.machine_gmacs:.2f}"} for f in b.rates]
    return table(rows, caption="One warm step of each shared form under the profiler: every "
                               "sparse product is a profiler range carrying its multiply-add "
                               "count; dense products are the profiler's count of mm/addmm/bmm "
                               "outside them (dense multiply-adds done inside the compiled "
                               "push, the pooled layer's weighted sums, are shown beside them: "
                               "their time is the push's). The rest of the step is elementwise "
                               "work, "
                               "indexing and autograd. A best rate is the fastest measured here, "
                               "not a hardware peak.")


@say_not_run
def bench_text(b: BenchResult) -> Markdown:
    def r(st, suffix="x"):
        return "n/a" if st is None else f"**{st.median:.3g}{suffix}** (IQR {st.iqr:.2g})"
    kind = "at the real spec" if b.full_size else \
        "at this run's reduced sizes (`bench_full_size: true` or `python -m workbook_lib bench " \
        "--params params/full.yaml` for the real spec)"
    notes = "".join(f" {n[0].upper()}{n[1:]}." for n in b.notes)

    def versus(key, what):
        text = replicated_ratio_text(b, key)
        if not text:
            return f"n/a against {what}"
        ratio, _, rest = text.partition(" (")
        return f"**{ratio}** ({rest} faster than {what}"
    form = f" ({b.shared_form}, L = {b.sizes['layers']})" if b.shared_form else ""
    dango = (f" ({r(b.ratio_vs_dango_sample)} a DANGO-style sample's cost)"
             if b.ratio_vs_dango_sample is not None else "")
    floor = ("" if b.floor is None else
             " The floor of an exact sample for this model, from the batch's own deletions: "
             + "; ".join(b.floor.lines()) + ".")
    return Markdown(
        f"Per sample, {kind}: the node-mask shared graph{form} is "
        + (f"{r(b.ratio_vs_full_form)} faster with its second layer delta-propagated than with "
           "full middle layers, " if b.ratio_vs_full_form is not None else "")
        + versus("replicated_gather_scatter",
                 "replicated masks in the Lazy model's form (every message materialised, then "
                 "masked)")
        + " and " + versus("replicated_sparse", "their sparse-product form") + ". "
        f"One exact sample costs {r(b.passes_per_sample, '')} DANGO-style wildtype steps{dango}."
        f"{floor} Exactness in the same run: max relative error {b.exact_max_rel_error:.1e}."
        f"{notes}")


@skip_none
def floor_table(b: BenchResult):
    """The floor of an exact sample, part by part, beside the step's measured counts."""
    f = b.floor
    if f is None:
        return Markdown("No floor: the shared form's delta path did not run (it needs L >= 3).")
    rows = [{"part (forward + backward)": k,
             "sparse M multiply-adds": f"{v.sparse_macs / f.batch_size / 1e6:.3g}",
             "dense M multiply-adds": f"{v.dense_macs / f.batch_size / 1e6:.3g}",
             "MB": f"{v.bytes / f.batch_size / 1e6:.3g}"} for k, v in f.parts.items()]
    rows.append({"part (forward + backward)": "**floor, per exact sample**",
                 "sparse M multiply-adds": f"{f.sparse_macs / 1e6:.3g}",
                 "dense M multiply-adds": f"{f.dense_macs / 1e6:.3g}",
                 "MB": f"{f.bytes / 1e6:.3g}"})
    rows.append({"part (forward + backward)": "the step, measured (one profiled step)",
                 "sparse M multiply-adds": "n/a" if f.measured_sparse_macs is None else
                 f"{f.measured_sparse_macs / 1e6:.3g} ({f.ratio('sparse'):.2f}x the floor)",
                 "dense M multiply-adds": "n/a" if f.measured_dense_macs is None else
                 f"{f.measured_dense_macs / 1e6:.3g} ({f.ratio('dense'):.2f}x the floor)",
                 "MB": ""})
    when = "" if f.seconds_at_machine is None else (
        f" At this machine's best measured rates the floor's products take "
        f"{f.seconds_at_machine * 1e3:.3g} ms per sample"
        + (f" ({f.seconds_at_step_rates * 1e3:.3g} ms at the rates the step achieved)"
           if f.seconds_at_step_rates is not None else "")
        + (f"; the exact sample measured {f.measured_seconds * 1e3:.3g} ms."
           if f.measured_seconds is not None else "."))
    return table(rows, caption=f"The fewest multiply-adds an exact sample needs for this model "
                               f"(B = {f.batch_size}, the benchmark batch's own deletions; "
                               "workbook_lib.nodemask.floor), per sample, against one profiled "
                               "step of the shared form (sparse: the tagged sparse products; "
                               f"dense: the profiler's mm/bmm count).{when}")


@skip_none
def bench_plot(b: BenchResult) -> None:
    keys = list(b.per_sample_s)
    med = np.array([b.per_sample_s[k].median for k in keys]) * 1e3
    iqr = np.array([b.per_sample_s[k].iqr for k in keys]) * 1e3
    fig, ax = plotting.plt.subplots(figsize=(8, 3.6))
    ax.barh(range(len(keys)), med, xerr=iqr / 2, color=plotting.PALETTE[:len(keys)], capsize=3)
    ax.set_yticks(range(len(keys)), [bar_label(b, k) for k in keys], fontsize=8)
    ax.invert_yaxis()
    plotting.value_axis(ax, med, "ms per sample, forward + backward")
    for i, v in enumerate(med):
        ax.text(v, i, f" {v:.3g} ms", va="center", fontsize=8)
    plotting.title(ax, "Strategy benchmark, per sample", device=b.device,
                   sizes=f"{b.sizes['edges']:,} edges, H={b.sizes['hidden']}, "
                         f"L={b.sizes['layers']}, push {b.push_kernel or 'n/a'}",
                   repeats=f"{b.rounds} interleaved rounds")
    plotting.show(fig, "Horizontal bars: milliseconds per sample of the node-mask shared graph "
                       "(each form's path and push kernel in its label), replicated masks in "
                       "two forms (each labelled measured at the shared batch or projected "
                       "from B = 1, 2) and a DANGO-style wildtype step.")


def bar_label(b: BenchResult, key: str) -> str:
    """A bar's label: the variant's label and, for a replicated form, what its figure is."""
    v = b.per_sample_s[key]
    text = v.label or key
    fit = b.replicated.get(key)
    if fit is None:
        return text
    if fit.measured:
        return f"{text}\nmeasured at B = {fit.at_batch}"
    return (f"{text}\nmeasured at B = {fit.quoted_batch}"
            + (f" (at least this at B = {fit.at_batch})" if fit.at_least else ""))


@say_not_run
def kernel_table(b: BenchResult):
    rows = [{"kernel": k.name,
             "what": k.description, "time": fmt_time_stat(k.seconds),
             "G multiply-adds/s": f"{k.gmacs:.2f}",
             "the step's kernel here": "yes" if k.used_by_step else ""} for k in b.kernels]
    return table(rows, caption="One middle layer's per-sample sparse products (every edge type, "
                               f"every sample, H = {b.sizes['hidden']}) with each kernel tried, "
                               "and the delta layer's push (useful multiply-adds: the out-edges "
                               "of the changed rows), interleaved.")


@skip_none
def convert_table(b: BenchResult):
    """The convert section: each form's ms per sample and its ratio (see
    :func:`~workbook_lib.report.bench_text.convert_rows`)."""
    rows = convert_rows(b)
    if not rows:
        return Markdown("No convert section: the shared form did not run, or an older result.")
    c = b.convert
    head = rows[0]
    errs = ", ".join(f"{k} {v:.1e}" for k, v in c.exact_max_rel_error.items())
    return table([dict(zip(head, r)) for r in rows[1:]],
                 caption=f"Forward + backward per exact sample, {c.rounds} interleaved rounds "
                         "(measured; ratios paired per round), but the back-to-back line (the "
                         "converted step timed again after the rounds, its steps in a row, as a "
                         "training loop runs them: in the rounds each step follows another "
                         "form's or a rate probe's) and the floor's line: computed, "
                         "the floor's multiply-adds at this machine's best measured rates. "
                         + ("The line 'at each round's rates' prices the floor at the rates its "
                            "two kernels ran at in each round, beside the step (same rounds). "
                            if c.floor_same_rounds is not None else "")
                         + ("The line after it prices the floor's dense multiply-adds instead at "
                            "the rate a linear map's three products reach at the encoder's own "
                            "layer shape ([rows, H] x [H, H], a cache-sized block per worker, "
                            "timed in each round): the large matmul's rate can be beyond such "
                            "narrow products on this device. "
                            if c.floor_shaped_rounds is not None else "")
                         + (floor_drift(c) + ". " if floor_drift(c) else "")
                         + "Masked copies: the largest batch that fits the memory budget, at most "
                         "the converted batch; their masks are built outside the step. The "
                         f"few-reach graph keeps {c.few_reach_edges_per_type:,} edges per type. "
                         f"Exactness on {c.exact_genes} genes: {errs}.")


@skip_none
def convert_parts_table(b: BenchResult):
    """Where the converted TorchCell-shaped step's time goes, part by part, beside each part's
    floor (:func:`~workbook_lib.report.bench_text.part_rows`)."""
    rows = part_rows(b)
    if not rows:
        return Markdown("No per-part times: no convert section, no floor rates, or an older "
                        "result.")
    head = rows[0]
    return table([dict(zip(head, r)) for r in rows[1:]],
                 caption=part_caption(b)[0].upper() + part_caption(b)[1:] + ".")
