"""Every claim of the investigation, checked against this run by a stated rule.

A claim's status comes from a figure of this run through a rule that can come out both ways,
bounded by the figure's noise: ``within_band``, ``near``, ``above``/``below``, and
``changes_nothing`` (IQR inside ``[1/1.1, 1.1]``). A claim this run cannot measure is "not
measured here", with the reason. :func:`check_claims` takes notebooks 01-04's results (any may
be missing). The rules in full: docs/development.md.
"""
from __future__ import annotations

import math

from ...measurement.timing import Stat
from ...results.verdict import (ARITHMETIC, FAILED, HELD, MEASURED, NOISE,  # noqa: F401
                                NOT_MEASURED, STATUSES, Claim)


def within_band(st: Stat, claimed: float, factor: float = 2.0) -> str:
    lo, hi = claimed / factor, claimed * factor
    if st.q1 >= lo and st.q3 <= hi:
        return HELD
    if st.q3 < lo or st.q1 > hi:
        return FAILED
    return NOISE


def near(value: float, claimed: float, tol: float) -> str:
    return HELD if abs(value / claimed - 1) <= tol else FAILED


def above(st: Stat, threshold: float) -> str:
    if st.q1 > threshold:
        return HELD
    if st.q3 < threshold:
        return FAILED
    return NOISE


NO_CHANGE = 0.10
NO_CHANGE_RULE = ("the IQR of the {what} inside 1 \u00b1 10% (held), wholly outside (failed), "
                  "else within noise")


def changes_nothing(st: Stat) -> str:
    return within_band(st, 1.0, factor=1.0 + NO_CHANGE)


def _fmt(st: Stat, unit: str = "x", scale: float = 1.0) -> str:
    flag = "" if st.precise else " (noisy)"
    return f"{st.median * scale:.3g}{unit} (IQR {st.iqr * scale:.2g}, n={st.n}){flag}"


def _bytes(v: float) -> str:
    return f"{v / 1e9:,.0f} GB" if v >= 1e10 else f"{v / 1e6:,.1f} MB"


def _not_measured(key, claim, claimed, rule, source, note, measured: str = "n/a") -> Claim:
    return Claim(key, claim, claimed, measured, NOT_MEASURED, rule, NOT_MEASURED, source, note)


REAL_SIZE = "the real spec (benchmark)"


def reduced(scale: float | None) -> str:
    """The size label of a figure measured at a run's reduced scale ("" at the real scale)."""
    if scale is None or scale >= 1.0:
        return ""
    return f"reduced size (scale {scale:g}): the real size may differ"


def size_claims(inv, dual=None) -> list[Claim]:
    """Notebook 01: byte counts at the real edge count, from what strategy 2 really carries;
    ``dual``: notebook 02's ``DualForwardMasks`` (None: the 130 MB claim is not measured).
    """
    rs = inv.real_size
    if rs is None:
        return []
    per_edge = inv.measured_batch_mask_bytes_per_sample / inv.total_edges
    masks = per_edge * rs.total_edges
    offsets = 8 * len(inv.edge_types) * (inv.num_genes + 1)
    entries = (inv.measured_incidence_cache_bytes - offsets) * rs.total_edges / inv.total_edges
    inc64 = entries + offsets
    inc32 = entries / 2 + offsets / 2  # the same entries and offsets at 4 bytes
    basis = (f"measured in a collated strategy-2 batch at scale {inv.scale:g}, scaled to the real "
             f"{rs.total_edges:,} edges")
    out = []
    for key, claim, claimed, value, tol, note in (
            ("masks_per_batch", "65 MB of masks per batch (B = 28)", 65e6, 28 * masks, 0.10,
             basis),
            ("mask_per_sample", "2.5 MB of masks per sample", 2.5e6, masks, 0.10, basis),
            ("mask_storage", "848 GB of masks stored for the dataset", 848e9,
             masks * rs.num_samples, 0.10, basis + f", x {rs.num_samples:,} samples")):
        out.append(Claim(key, claim, _bytes(claimed), _bytes(value), ARITHMETIC,
                         f"within ±{tol:.0%} of the claimed figure", near(value, claimed, tol),
                         "01", note, value))
    claim, rule = ("130 MB of masks per batch with the dual forward",
                   "28 x the mask bytes per sample x (mask bytes the dual forward reads / "
                   "the single forward reads) within ±10% of 130 MB")
    if dual is None or not dual.single_bytes:
        out.append(_not_measured("masks_dual_forward", claim, "130 MB", rule, "02",
                                 "needs notebook 02's dual-forward probe"))
    else:
        factor = dual.dual_bytes / dual.single_bytes
        value = 28 * masks * factor
        out.append(Claim(
            "masks_dual_forward", claim, "130 MB",
            f"{_bytes(value)} (the dual forward reads {factor:.2f}x the single forward's mask "
            "bytes)", MEASURED, rule, near(value, 130e6, 0.10), "02",
            f"{dual.describe()}; the per-sample mask bytes as in the 65 MB claim", value))
    out.append(Claim(
        "incidence_cache", "the incidence cache is about 19 MB", "19.0 MB",
        f"{_bytes(inc32)} with 4-byte indices (the workbook builds it with int64: "
        f"{_bytes(inc64)})", ARITHMETIC,
        "within ±25% of the claimed figure, the structure built with 4-byte indices",
        near(inc32, 19e6, 0.25), "01",
        "strategy 2's prepared cache (every edge id under both of its endpoints, and offsets "
        f"per gene and type) measured at scale {inv.scale:g} and scaled to the real size; the "
        "investigation's 19 MB matches 4-byte entries (2.42M edges x 2 endpoints x 4 B); both "
        "sizes are shown", inc32))
    return out


def cost_claims(mask_cost, h: int) -> list[Claim]:
    """Notebook 02: exactness and filtering against masking."""
    out = []
    if "node_mask_shared" not in mask_cost.exact:
        out.append(Claim("exact", "the node-mask shared graph is exact (float32 rounding)",
                         "exact", "n/a", NOT_MEASURED,
                         "max relative error of outputs, predictions and gradients < 1e-4",
                         NOT_MEASURED, "02", "the node-mask shared graph is not among this run's "
                         "strategies (its exactness is re-checked in 02 when it is; a rewrite "
                         "of your own: python -m workbook_lib equal SLOW FAST)"))
    else:
        out.append(_exact_claim(mask_cost))
    out += _filter_claim(mask_cost, h)
    return out


def _exact_claim(mask_cost) -> Claim:
    err = max(mask_cost.exact.values())
    worst = max(mask_cost.exact, key=mask_cost.exact.get)
    own = mask_cost.exact["node_mask_shared"]
    return Claim("exact", "the node-mask shared graph is exact (float32 rounding)",
                 "exact", f"max relative error {own:.1e} (worst strategy: {worst}, {err:.1e})",
                 MEASURED, "max relative error of outputs, predictions and gradients < 1e-4",
                 HELD if own < 1e-4 else FAILED, "02",
                 f"against the plain reference on {mask_cost.exact_graph}", own)


def _filter_claim(mask_cost, h: int) -> list[Claim]:
    out = []
    pts = mask_cost.cost.points
    e = max(p.E for p in pts)
    hs = sorted({p.H for p in pts if p.kind == "masked"}, key=lambda x: abs(x - h))
    hh = hs[0]
    pmin = min(p.p for p in pts if p.kind == "filter_layer")
    masked = next(p.stat for p in pts if p.kind == "masked" and p.E == e and p.H == hh)
    filt = next(p.stat for p in pts if p.kind == "filter_layer" and p.E == e and p.H == hh
                and p.p == pmin)
    ratio = filt.ratio_to(masked, paired=True)
    out.append(Claim("filter_vs_mask", "filtering edges costs more than masking them when p << 1",
                     "filter > mask", f"filter / mask = {_fmt(ratio)} at E = {e:,}, H = {hh}, "
                     f"p = {pmin:g}", MEASURED,
                     "filter/mask above 1 with its IQR clear of 1 (same rounds)",
                     above(ratio, 1.0), "02",
                     "the masked form multiplies every [E, H] message by its mask",
                     ratio.median))
    return out


SUMMED_BAND = (0.16, 0.32)  # "24%" within a third either way


def nested_sum_status(summed_share: float, exclusive_share: float) -> str:
    """Held when the investigation's summation reproduces about 24% for the optimizer while the
    exclusive time says it is much less; failed when the summation does not give about 24%, or
    when the exclusive time gives it too (then the 24% was real)."""
    lo, hi = SUMMED_BAND
    if lo <= summed_share <= hi and exclusive_share < lo:
        return HELD
    return FAILED


def mask_loop_status(per_unit: list[float], tol: float = 0.25) -> str:
    """Syncs per (sample, gene, edge type) at every measured (B, k, T): held when all lie within
    ±``tol`` of 1 (864 = 32 x 3 x 9 scaled to the run), failed when none does."""
    inside = [abs(x - 1.0) <= tol for x in per_unit]
    if all(inside):
        return HELD
    if not any(inside):
        return FAILED
    return NOISE


def stored_reads_note(reads) -> str:
    """What the stored-masks claim's loop figure read: cached pages, and how a cold read
    compares (notebook 03's cold/warm reads)."""
    note = ("the loop reads masks written just before it, from the page cache (as a dataset "
            "read again each epoch is when it fits in memory)")
    if reads is not None and reads.dropped:
        note += (f"; read cold, an item took {reads.cold_over_warm.median:.3g}x as long "
                 f"({reads.cold_ms.median:.3g} against {reads.warm_ms.median:.3g} ms per item)")
    return note


def _measured_on(figure) -> str:
    """Which pipelines a data-vs-model figure was measured on, when they are not the built-in
    Lazy and DANGO forms the claim names (a user-only run judges the claim on its own gap)."""
    names = getattr(figure, "names", ("Lazy", "DANGO"))
    if figure is None or tuple(names) == ("Lazy", "DANGO"):
        return ""
    return f" (on this run's gap pipelines: {names[0]} over {names[1]})"


def timing_claims(timing, device_type: str, scale: float | None = None) -> list[Claim]:
    """Notebook 03: the data-vs-model figures, transfers, syncs, the profile (what a CPU run
    cannot measure is not measured; figures are marked as measured at the run's ``scale``).
    """
    from ..timing import LAZY

    out = []
    size = reduced(scale)
    lo = timing.loops
    gpu = device_type == "cuda"
    if LAZY in lo.strategies:
        a = lo.arm(LAZY, "full")
        if gpu and "h2d" in a.stages:
            shares = {k: v.median for k, v in a.stages.items()}
            top = max(shares, key=shares.get)
            out.append(Claim("transfer_bottleneck", "the bottleneck is CPU->GPU transfer",
                             "transfer is the largest stage",
                             f"transfer {shares['h2d'] / a.step.median:.1%} of a step; largest "
                             f"stage: {top}", MEASURED,
                             "the host-to-device stage is the largest of the Lazy full step",
                             HELD if top == "h2d" else FAILED, "03", "",
                             shares["h2d"] / a.step.median, size))
        else:
            out.append(_not_measured(
                "transfer_bottleneck", "the bottleneck is CPU->GPU transfer",
                "transfer is the largest stage",
                "the host-to-device stage is the largest of the Lazy full step", "03",
                "a CPU run has no host-to-device copy: run on a GPU (params/full.yaml)"))
    band = "within 2x of the claimed figure, IQR inside the band (both directions)"
    on = _measured_on(timing.figure("data_model_ratio"))
    stages = timing.figure("data_stages_ratio")
    whole = timing.figure("data_only_ratio")
    claim = "data pipeline only: Lazy 56x slower than DANGO (it/s)"
    if stages is not None or whole is not None:
        shown = stages or whole
        text = (f"data stages (loader wait + transfer + device prep): {_fmt(stages.measured)}"
                if stages is not None else "")
        if whole is not None:
            text += ("; " if text else "") + (f"whole data-only step with its trivial loss: "
                                              f"{_fmt(whole.measured)}")
        text += on
        if gpu:
            out.append(Claim("data_only_ratio", claim, "56x", text, MEASURED,
                             band + ", on the data stages (the harness's own cost apart)",
                             within_band(shown.measured, 56.0), "03",
                             "the investigation measured on one GPU at the real size",
                             shown.measured.median, size))
        else:
            out.append(_not_measured(
                "data_only_ratio", claim, "56x", band, "03",
                "the 56x includes the host-to-device copy of every batch (MBs of masks for "
                "Lazy, a few indices for DANGO), which a CPU run does not make: run on a GPU",
                measured=text))
    dm = timing.figure("data_model_ratio")
    if dm is not None:
        out.append(Claim("data_model_ratio", "data + model: Lazy 19x slower than DANGO (it/s)",
                         "19x", _fmt(dm.measured) + on, MEASURED, band,
                         within_band(dm.measured, 19.0), "03",
                         "the investigation measured on one GPU at the real size",
                         dm.measured.median, size))
    mb = timing.figure("model_batch_ratio")
    claim = "one batch, forward + backward + optimizer: only 1.6x slower (Lazy vs DANGO)"
    if mb is not None and gpu:
        out.append(Claim("model_batch_ratio", claim, "1.6x", _fmt(mb.measured) + on,
                         MEASURED, band,
                         within_band(mb.measured, 1.6), "03",
                         "the investigation profiled one pre-saved batch on one GPU",
                         mb.measured.median, size))
    elif mb is not None:
        out.append(_not_measured(
            "model_batch_ratio", claim, "1.6x", band, "03",
            "the 1.6x is a GPU's kernel efficiency: a GPU runs the B graph copies' wide kernels "
            "near its throughput while the small wildtype pass leaves it mostly idle, so the "
            "ratio on a GPU is far below the work ratio; a CPU's time follows the work",
            measured=f"{_fmt(mb.measured)} on this CPU"))
    if "device_mask_loop" in lo.strategies and timing.syncs.scaling:
        per = [p.counted / (p.batch_size * p.k * p.edge_types) for p in timing.syncs.scaling]
        vec = timing.syncs.per_step.get("device_mask_vectorized")
        pts = ", ".join(f"{p.counted} at (B={p.batch_size}, k={p.k}, T={p.edge_types})"
                        for p in timing.syncs.scaling[:3])
        out.append(Claim("mask_loop_syncs", "the GPU mask loop syncs once per sample, gene and "
                                            "edge type (864 .item() calls per batch)",
                         "864 = 32 x 3 x 9", f"{min(per):.2f}-{max(per):.2f} syncs per "
                         f"(sample, gene, type) ({pts}, ...); vectorized: "
                         f"{vec if vec is not None else 'n/a'} per step",
                         MEASURED, "the count / (B x k x T) within ±25% of 1 at every measured "
                                   "(B, k, T) (held), at none (failed), else mixed",
                         mask_loop_status(per), "03",
                         timing.syncs.method + "; the workbook's loop form reads each gene slot "
                         "once and two values per gene and edge type", min(per)))
    if "device_mask_loop" in lo.strategies and "device_mask_vectorized" in lo.strategies:
        claim = "vectorizing device mask generation gave no gain over the .item() loop"
        rule = NO_CHANGE_RULE.format(what="step-time ratio (same rounds)")
        r = lo.ratio(lo.arm("device_mask_loop"), lo.arm("device_mask_vectorized"))
        text = f"device_mask_loop / device_mask_vectorized full step = {_fmt(r)}"
        if gpu:
            out.append(Claim("vectorize_no_gain", claim, "no gain", text, MEASURED, rule,
                             changes_nothing(r), "03", "", r.median, size))
        else:
            out.append(_not_measured(
                "vectorize_no_gain", claim, "no gain", rule, "03",
                "what the loop costs is its syncs, each draining a GPU's queue; on a CPU a sync "
                "costs nothing (notebook 03 counts them)", measured=text + " on this CPU"))
    if "replicated_mask_cpu" in lo.strategies and "replicated_mask_stored" in lo.strategies:
        r = lo.ratio(lo.arm("replicated_mask_cpu"), lo.arm("replicated_mask_stored"))
        out.append(Claim("stored_masks_no_gain", "storing masks on disk gave no gain over "
                                                 "building them from the incidence cache",
                         "no gain", f"replicated_mask_cpu / replicated_mask_stored full step = "
                                    f"{_fmt(r)}", MEASURED,
                         NO_CHANGE_RULE.format(what="step-time ratio (same rounds)"),
                         changes_nothing(r), "03", stored_reads_note(
                             getattr(timing, "stored_reads", None)), r.median, size))
    prof = timing.profiles.get(LAZY)
    if prof is not None:
        share = prof.shares().get("optimizer", 0.0)
        out.append(Claim("optimizer_24", "the optimizer takes 24% of the time", "24%",
                         f"{share:.1%} (exclusive time, warm steps)", MEASURED,
                         "exclusive-time share within 16-32%",
                         HELD if 0.16 <= share <= 0.32 else FAILED, "03",
                         prof.profiled_steps, share, size))
        summed = getattr(prof, "summed_shares", lambda: {})()
        if summed:
            s_opt = summed.get("optimizer", 0.0)
            out.append(Claim(
                "nested_sum", "that 24% came from summing nested profiler events (parents and "
                              "children counted again)", "the sum gives about 24%",
                f"summing every event's duration by name, as the investigation did: optimizer "
                f"{s_opt:.0%} (exclusive time: {share:.1%})", MEASURED,
                "the summation gives 16-32% for the optimizer while the exclusive time gives "
                "less than 16% (held); otherwise failed",
                nested_sum_status(s_opt, share), "03",
                "events named by keyword (a name with 'step' or 'optim' is the optimizer, so "
                "every ProfilerStep#N, a whole training step, counts as one), durations of "
                "parents and children summed; the workbook's own wb: ranges left out",
                s_opt, size))
    return out


def _gap_pair(g) -> str:
    """The pipelines notebook 04's gap compared, when not the built-in Lazy and DANGO forms."""
    from ..timing import DANGO, LAZY
    pair = (getattr(g, "slow", LAZY), getattr(g, "fast", DANGO))
    return "" if pair == (LAZY, DANGO) else f"{pair[0]} over {pair[1]} (this run's gap): "


def applied_ddp_factor(g) -> Stat | None:
    """The DDP factor notebook 04's gap multiplied in (None when it multiplied none in)."""
    base = g.steps_ratio * g.per_step_ratio.median
    if base and abs(g.total.median / base - 1.0) > 1e-9:
        return g.ddp_factor
    return None


def real_size_gap(bench, g) -> Stat | None:
    """The epoch-time gap at the real spec: per-sample time (epoch time / samples) of the Lazy
    form over the wildtype step, paired by round in the full-size benchmark, times the DDP
    factor notebook 04 applied. None without a full-size benchmark."""
    if bench is None or not bench.full_size or "replicated_gather_scatter" not in bench.steps \
            or "wildtype" not in bench.steps:
        return None
    b_slow = bench.per_sample_s["replicated_gather_scatter"].batch_size
    b_fast = bench.per_sample_s["wildtype"].batch_size
    slow = bench.steps["replicated_gather_scatter"].scaled(1.0 / b_slow, "s/sample")
    fast = bench.steps["wildtype"].scaled(1.0 / b_fast, "s/sample")
    gap = slow.ratio_to(fast, paired=len(slow.samples) == len(fast.samples) and bool(slow.samples))
    f = applied_ddp_factor(g)
    return gap if f is None else gap.times(f)


def ddp_claims(ddp, bench=None, scale: float | None = None) -> list[Claim]:
    """Notebook 04: the epoch gap (at the real spec when the full-size benchmark ran), DDP and
    the all-gather."""
    out = []
    g = ddp.gap
    f = applied_ddp_factor(g)
    real = real_size_gap(bench, g)
    rule = "within 2x of the claimed figure, IQR inside the band (both directions)"
    if real is not None:
        out.append(Claim("epoch_gap", "the replicated pipeline trains about 40x fewer epochs per "
                                      "day", "40x", _fmt(real), MEASURED, rule,
                         within_band(real, 40.0), "02",
                         "per sample in the full-size benchmark (replicated masks in the Lazy "
                         "model's form over the wildtype step, same rounds)"
                         + ("" if f is None else f" x DDP x{f.median:.3g} (notebook 04)")
                         + f"; at this run's scale notebook 04 measured {_fmt(g.total)}",
                         real.median, REAL_SIZE))
    else:
        out.append(Claim("epoch_gap", "the replicated pipeline trains about 40x fewer epochs per "
                                      "day", "40x", _fmt(g.total), MEASURED, rule,
                         within_band(g.total, 40.0), "04",
                         _gap_pair(g) + f"steps x{g.steps_ratio:.2f} (arithmetic) x step time x"
                         f"{g.per_step_ratio.median:.3g} (measured)"
                         + ("" if f is None else f" x DDP x{f.median:.3g}")
                         + "; the real spec needs the full-size benchmark "
                           "(python -m workbook_lib bench)", g.total.median, reduced(scale)))
    total = g.total.median
    if total > 1:
        explained = (math.log(g.steps_ratio) +
                     (0.0 if f is None else math.log(max(f.median, 1e-9)))) / math.log(total)
        out.append(Claim("ddp_and_batch_explain", "DDP sync and the smaller batch explain the "
                                                  "rest of the gap", "most of the gap",
                         f"{explained:.0%} of the log-gap", MEASURED,
                         "steps-per-epoch and DDP factors together >= 50% of the log of the gap",
                         HELD if explained >= 0.5 else FAILED, "04", "", explained,
                         reduced(scale)))
    top = max(ddp.worlds)
    gr = ddp.worlds[top].gather_ratio
    if top > 1 and gr is not None:
        out.append(Claim("gather_changes_nothing", "turning off the loss all-gather changes "
                                                   "nothing", "no change",
                         f"step with / without toggled gather = {_fmt(gr)} at {top} ranks",
                         MEASURED, NO_CHANGE_RULE.format(what="paired ratio"),
                         changes_nothing(gr), "04", "", gr.median))
    return out


def memory_claims(mask_cost, device_type: str) -> list[Claim]:
    """The replicated model's out-of-memory batch on an 80 GB GPU."""
    claim, claimed = "replicated masks run out of memory at batch 38 on an 80 GB GPU", "38"
    rule = "the projected largest batch in the device's memory within ±25% of 38"
    if device_type != "cuda":
        return [_not_measured("oom_38", claim, claimed, rule, "02",
                              "a GPU memory limit: run on a GPU; notebook 02 shows this host's "
                              "measured bytes per sample")]
    fits = [f for k, f in mask_cost.memory.fits.items()
            if k.startswith("replicated_mask_cpu:gather_scatter") and "scale 1," in k
            and "H=64" in k and f.largest_batch is not None]
    if not fits:
        return [_not_measured("oom_38", claim, claimed, rule, "02",
                              "needs the real spec (memory_full_size or scale 1, H = 64)")]
    f = fits[0]
    return [Claim("oom_38", claim, claimed, f"largest batch {f.largest_batch} in "
                                             f"{f.budget_bytes / 1e9:.0f} GB", MEASURED, rule,
                  near(float(f.largest_batch), 38.0, 0.25), "02",
                  f"extrapolated {f.extrapolation_factor:.1f}x beyond the batches measured",
                  float(f.largest_batch))]


def check_claims(inventory=None, mask_cost=None, timing=None, ddp=None, *,
                 device_type: str = "cpu", hidden: int = 32, bench=None) -> list[Claim]:
    """Every claim with this run's status (missing notebooks: their claims are not measured).

    Args:
        bench: the benchmark to judge real-size claims on (a full-size one counts; default:
            notebook 02's).
    """
    out: list[Claim] = []
    scale = getattr(inventory, "scale", None)
    if inventory is not None:
        out += size_claims(inventory, getattr(mask_cost, "dual_masks", None))
    if mask_cost is not None:
        out += cost_claims(mask_cost, hidden)
        out += memory_claims(mask_cost, device_type)
    if timing is not None:
        out += timing_claims(timing, device_type, scale)
    if ddp is not None and getattr(ddp, "gap", None) is not None:
        out += ddp_claims(ddp, bench if bench is not None else getattr(mask_cost, "bench", None),
                          scale)
    return out
