"""Every claim of the investigation, checked against this run by a stated rule.

A claim's status comes from a figure this run produced (or arithmetic on one, labelled so)
through a rule that can come out both ways, with bounds derived from the figure's noise:

* ``within_band``: a measured ratio "within F x of the claimed figure": **held** when the whole
  interquartile range lies inside ``[claimed/F, claimed*F]``, **failed** when it lies wholly
  outside, otherwise **within noise**;
* ``near``: arithmetic (no noise) within a relative tolerance of the claimed figure;
* ``above`` / ``below``: a measured figure beyond a threshold, its IQR clear of it;
* ``changes_nothing``: a measured ratio "no change" within ``NO_CHANGE`` (10%, the precision
  target): **held** when its IQR lies inside ``[1/1.1, 1.1]``, **failed** when wholly outside,
  otherwise **within noise** (a rule "1 inside the IQR" would fail a precise 3% change and pass
  a noisy 30% one).

A claim this run cannot measure (a GPU's transfer on a CPU run, a GPU's memory limit) is **not
measured here**; nothing is fixed in code. :func:`check_claims` takes the typed results of
notebooks 01-04 (any may be missing: its claims are then not measured).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..measurement.timing import Stat
from ..records import Record

HELD, FAILED, NOISE, NOT_MEASURED = "held", "failed", "within noise", "not measured here"
STATUSES = (HELD, FAILED, NOISE, NOT_MEASURED)
MEASURED, ARITHMETIC = "measured", "arithmetic"


@dataclass
class Claim(Record):
    key: str
    claim: str  # the investigation's words
    claimed: str  # its figure
    measured: str  # this run's figure (with its IQR where it has one)
    kind: str  # measured, arithmetic, or not measured here
    rule: str  # the comparison, in words
    status: str
    source: str  # the notebook the figure comes from
    note: str = ""
    value: float | None = None  # the number the rule compared


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


def _not_measured(key, claim, claimed, rule, source, note) -> Claim:
    return Claim(key, claim, claimed, "n/a", NOT_MEASURED, rule, NOT_MEASURED, source, note)


def size_claims(inv) -> list[Claim]:
    """Notebook 01: byte counts at the real edge count, from what strategy 2 really carries."""
    rs = inv.real_size
    if rs is None:
        return []
    per_edge = inv.measured_batch_mask_bytes_per_sample / inv.total_edges
    masks = per_edge * rs.total_edges
    offsets = 8 * len(inv.edge_types) * (inv.num_genes + 1)
    inc = (inv.measured_incidence_cache_bytes - offsets) * rs.total_edges / inv.total_edges \
        + offsets
    basis = (f"measured in a collated strategy-2 batch at scale {inv.scale:g}, scaled to the real "
             f"{rs.total_edges:,} edges")
    out = []
    for key, claim, claimed, value, tol, note in (
            ("masks_per_batch", "65 MB of masks per batch (B = 28)", 65e6, 28 * masks, 0.10,
             basis),
            ("masks_dual_forward", "130 MB of masks per batch with the dual forward", 130e6,
             28 * masks, 0.10, basis + "; the dual forward's wildtype pass runs on the "
                                       "unperturbed graph and carries no mask"),
            ("mask_per_sample", "2.5 MB of masks per sample", 2.5e6, masks, 0.10, basis),
            ("mask_storage", "848 GB of masks stored for the dataset", 848e9,
             masks * rs.num_samples, 0.10, basis + f", x {rs.num_samples:,} samples"),
            ("incidence_cache", "the incidence cache is about 19 MB", 19e6, inc, 0.25,
             f"strategy 2's prepared cache (every edge under both endpoints, int64), scaled to "
             f"the real size; int32 indices would make it {_bytes(inc / 2)}")):
        out.append(Claim(key, claim, _bytes(claimed), _bytes(value), ARITHMETIC,
                         f"within ±{tol:.0%} of the claimed figure", near(value, claimed, tol),
                         "01", note, value))
    return out


def cost_claims(mask_cost, h: int) -> list[Claim]:
    """Notebook 02: exactness and filtering against masking."""
    out = []
    err = max(mask_cost.exact.values())
    worst = max(mask_cost.exact, key=mask_cost.exact.get)
    out.append(Claim("exact", "the node-mask shared graph is exact (float32 rounding)",
                     "exact", f"max relative error {mask_cost.exact.get('node_mask_shared', err):.1e}"
                     f" (worst strategy: {worst}, {err:.1e})", MEASURED,
                     "max relative error of outputs, predictions and gradients < 1e-4",
                     HELD if mask_cost.exact.get("node_mask_shared", 1.0) < 1e-4 else FAILED,
                     "02", f"against the plain reference on {mask_cost.exact_graph}",
                     mask_cost.exact.get("node_mask_shared")))
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


def timing_claims(timing, device_type: str) -> list[Claim]:
    """Notebook 03: the data-vs-model figures, transfers, syncs, the profile."""
    from .timing_study import DANGO, LAZY

    out = []
    lo = timing.loops
    if LAZY in lo.strategies:
        a = lo.arm(LAZY, "full")
        if device_type == "cuda" and "h2d" in a.stages:
            shares = {k: v.median for k, v in a.stages.items()}
            top = max(shares, key=shares.get)
            out.append(Claim("transfer_bottleneck", "the bottleneck is CPU->GPU transfer",
                             "transfer is the largest stage",
                             f"transfer {shares['h2d'] / a.step.median:.1%} of a step; largest "
                             f"stage: {top}", MEASURED,
                             "the host-to-device stage is the largest of the Lazy full step",
                             HELD if top == "h2d" else FAILED, "03", "",
                             shares["h2d"] / a.step.median))
        else:
            out.append(_not_measured(
                "transfer_bottleneck", "the bottleneck is CPU->GPU transfer",
                "transfer is the largest stage",
                "the host-to-device stage is the largest of the Lazy full step", "03",
                "a CPU run has no host-to-device copy: run on a GPU (params/full.yaml)"))
    band = "within 2x of the claimed figure, IQR inside the band (both directions)"
    for key, claim, claimed in (
            ("data_only_ratio", "data pipeline only: Lazy 56x slower than DANGO (it/s)", 56.0),
            ("data_model_ratio", "data + model: Lazy 19x slower than DANGO (it/s)", 19.0),
            ("model_batch_ratio", "one batch, forward + backward + optimizer: only 1.6x "
                                  "slower (Lazy vs DANGO)", 1.6)):
        f = timing.figure(key)
        if f is None:
            continue
        out.append(Claim(key, claim, f"{claimed:g}x", _fmt(f.measured), MEASURED, band,
                         within_band(f.measured, claimed), "03",
                         "the investigation measured on one GPU at the real size", f.measured.median))
    if "device_mask_loop" in lo.strategies and timing.syncs.scaling:
        per = [p.counted / (p.batch_size * p.k * p.edge_types) for p in timing.syncs.scaling]
        vec = timing.syncs.per_step.get("device_mask_vectorized")
        ok = min(per) >= 1.0 and (vec is None or vec == 0)
        out.append(Claim("mask_loop_syncs", "the GPU mask loop syncs once per sample, gene and "
                                            "edge type (864 .item() calls per batch)",
                         "864 = 32 x 3 x 9", f"{min(per):.2f}-{max(per):.2f} syncs per "
                         f"(sample, gene, type); vectorized: {vec if vec is not None else 'n/a'}",
                         MEASURED, "at least one sync per (sample, gene, edge type) at every "
                                   "measured (B, k, T), and none in the vectorized form",
                         HELD if ok else FAILED, "03", timing.syncs.method, min(per)))
    for key, claim, a_name, b_name in (
            ("vectorize_no_gain", "vectorizing device mask generation gave no gain over the "
                                  ".item() loop", "device_mask_loop", "device_mask_vectorized"),
            ("stored_masks_no_gain", "storing masks on disk gave no gain over building them "
                                     "from the incidence cache", "replicated_mask_cpu",
             "replicated_mask_stored")):
        if a_name in lo.strategies and b_name in lo.strategies:
            r = lo.ratio(lo.arm(a_name), lo.arm(b_name))
            note = ("on a CPU a sync costs nothing: only a GPU run can show the loop's cost"
                    if key == "vectorize_no_gain" and device_type != "cuda" else "")
            out.append(Claim(key, claim, "no gain", f"{a_name} / {b_name} full step = {_fmt(r)}",
                             MEASURED, NO_CHANGE_RULE.format(what="step-time ratio (same rounds)"),
                             changes_nothing(r), "03", note, r.median))
    prof = timing.profiles.get(LAZY)
    if prof is not None:
        share = prof.shares().get("optimizer", 0.0)
        out.append(Claim("optimizer_24", "the optimizer takes 24% of the time", "24%",
                         f"{share:.1%} (exclusive time, warm steps)", MEASURED,
                         "exclusive-time share within 16-32%",
                         HELD if 0.16 <= share <= 0.32 else FAILED, "03",
                         prof.profiled_steps, share))
        naive = prof.naive_over_wall
        status = HELD if naive > 1.2 else (FAILED if naive <= 1.05 else NOISE)
        out.append(Claim("nested_sum", "that 24% came from summing nested profiler events "
                                       "(parents and children counted again)",
                         "nested sums over-count",
                         f"summed durations = {naive:.2f}x the wall time (exclusive: "
                         f"{prof.coverage:.2f}x)", MEASURED,
                         "the nested sum exceeds the wall time by more than 20%", status, "03",
                         "", naive))
    return out


def ddp_claims(ddp) -> list[Claim]:
    """Notebook 04: the epoch gap, DDP and the all-gather."""
    out = []
    g = ddp.gap
    out.append(Claim("epoch_gap", "the replicated pipeline trains about 40x fewer epochs per day",
                     "40x", _fmt(g.total), MEASURED,
                     "within 2x of the claimed figure, IQR inside the band (both directions)",
                     within_band(g.total, 40.0), "04",
                     f"steps x{g.steps_ratio:.2f} (arithmetic) x step time x"
                     f"{g.per_step_ratio.median:.3g} (measured)"
                     + f" x DDP x{g.ddp_factor.median:.3g} (measured, always applied)",
                     g.total.median))
    total = g.total.median
    if total > 1:
        explained = (math.log(g.steps_ratio) +
                     math.log(max(g.ddp_factor.median, 1e-9))
                     ) / math.log(total)
        out.append(Claim("ddp_and_batch_explain", "DDP sync and the smaller batch explain the "
                                                  "rest of the gap", "most of the gap",
                         f"{explained:.0%} of the log-gap", MEASURED,
                         "steps-per-epoch and DDP factors together >= 50% of the log of the gap",
                         HELD if explained >= 0.5 else FAILED, "04", "", explained))
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
                 device_type: str = "cpu", hidden: int = 32) -> list[Claim]:
    """Every claim with this run's status (missing notebooks: their claims are not measured)."""
    out: list[Claim] = []
    if inventory is not None:
        out += size_claims(inventory)
    if mask_cost is not None:
        out += cost_claims(mask_cost, hidden)
        out += memory_claims(mask_cost, device_type)
    if timing is not None:
        out += timing_claims(timing, device_type)
    if ddp is not None:
        out += ddp_claims(ddp)
    return out
