"""What the gap goes to: the stages that add to it, ranked, with advice, and what offsets it (see
the package docstring)."""
from __future__ import annotations

from ...results.stat import Stat
from ...results.timing import GC_PAUSE, STAGES
from ...results.verdict import Cause, Gap
from . import claims as claims_mod
from ..timing.stages import LOSS_PARTS, stage_medians, stage_quartiles, within_noise
from .advice import GC_ADVICE, H2D_WALK, MINOR, advise, carries_copies, gc_of
from .code import code_sites


STAGE_ORDER = ("data_item", "collate", "h2d", "device_prep", "forward", "loss", "backward",
               "optimizer", "overhead")
SYNC_STAGES = ("device_prep", "forward", "loss", "backward")


def _stage_words(key: str) -> str:
    return STAGES[key][0].split(" (")[0]


def _h2d_note(arm, device_type: str) -> str:
    """What a transfer stage's time went to, from the batch's contents (counted once)."""
    c = getattr(arm, "batch_contents", None) or {}
    objs = int(c.get("objects", 0) or 0)
    if device_type == "cuda":
        return (f"{c.get('tensor_bytes', 0) / 1e6:,.2f} MB in {int(c.get('tensors', 0))} "
                f"tensors" + (f", and {objs:,} other Python objects walked" if objs else "")
                if c else "")
    text = "on a CPU no byte is copied: this is the pipeline's to_device walk itself"
    if c:
        text += (f" over {int(c.get('tensors', 0))} tensors ({_bytes(c.get('tensor_bytes', 0))}, "
                 f"what a GPU's transfer would copy) and {objs:,} other Python objects"
                 + (f" ({c['kinds']})" if c.get("kinds") else ""))
    return text


def _bytes(n: float) -> str:
    return f"{n / 1e6:,.2f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} kB"


def stage_syncs(arm, key: str) -> float:
    """Host syncs per step a named stage made (the loss: its forward and its backward)."""
    parts = ("loss", "loss_backward") if key == "loss" else (key,)
    return float(sum(arm.syncs_by_stage.get(k, 0.0) for k in parts))


MANY_TENSORS = 4  # an optimizer over this many times the fast one's tensors (and 100 or more)


def optimizer_advice(slow, fast, device_type: str = "cuda") -> str:
    """Advice for a slow optimizer stage from what each side's optimizer steps over (03's
    :class:`~workbook_lib.results.timing.OptimizerShape`): where the slow one steps
    :data:`MANY_TENSORS` times as many parameter tensors (at least 100), its per-tensor work;
    else "" (the stage's own figures decide)."""
    if slow is None or fast is None or not slow.tensors or not fast.tensors or \
            slow.tensors < 100 or slow.tensors < MANY_TENSORS * fast.tensors:
        return ""
    flags = "" if slow.foreach or slow.fused else (
        f"; yours is set foreach={slow.foreach}" if slow.foreach is not None else "")
    # on a CPU torch's foreach form is a loop over the tensors itself (a review): not offered
    batched = (f"; on a GPU, foreach=True or fused=True batches the tensors' updates{flags}"
               if device_type == "cuda" else "")
    return (f"hold the parameters in fewer tensors: the slow pipeline's {slow.kind or 'optimizer'} "
            f"steps {slow.tensors:,} parameter tensors ({slow.elements:,} elements) against "
            f"{fast.tensors:,} ({fast.elements:,}) in the fast one's, and an optimizer's work "
            "is per tensor (one nn.Parameter or nn.Embedding for a table of rows, not one "
            f"parameter per row{batched})")


def rank_causes(timing, slow: str, fast: str, gap: Gap, device_type: str) -> list[Cause]:
    """The gap, stage by stage: slow minus fast in seconds per epoch, shares adding to 100%; then
    the DDP factor's row and the unattributed rest; rows that add time first, the largest first.
    ``gap``: :func:`measure_gap`'s result; ``device_type``: ``cpu`` or ``cuda``.
    """
    lo = timing.loops
    a, b = lo.arm(slow, "full"), lo.arm(fast, "full")
    ma, mb = stage_medians(a), stage_medians(b)
    qa, qb = stage_quartiles(a), stage_quartiles(b)
    ns, nf = gap.steps[slow], gap.steps[fast]
    profiles = getattr(timing, "profiles", None) or {}

    def waited(name: str, key: str) -> float | None:
        p = profiles.get(name)
        if p is None:
            return None
        parts = [p.sync_wait_per_step(k) for k in (("loss", "loss_backward") if key == "loss"
                                                    else (key,))]
        return None if None in parts else sum(parts)
    rows = []
    for key in STAGE_ORDER:
        if key not in ma and key not in mb:
            continue
        sa, sb = ma.get(key, 0.0) * ns, mb.get(key, 0.0) * nf
        evidence = (f"{ma.get(key, 0.0) * 1e3:.3g} ms per step at batch {a.samples_per_step} "
                    f"against {mb.get(key, 0.0) * 1e3:.3g} ms at batch {b.samples_per_step}")
        if key in ("data_item", "collate"):
            evidence += (" (the step's wait for the DataLoader, split by the workers' own item "
                         "and collate times)")
        note, advice = "", ""
        if key == "h2d":
            note = _h2d_note(a, device_type)
            c = getattr(a, "batch_contents", None) or {}
            if device_type != "cuda" or int(c.get("objects", 0) or 0) > 8 * a.samples_per_step:
                advice = H2D_WALK if c and int(c.get("objects", 0) or 0) else advice
        if key == "optimizer":
            advice = optimizer_advice(lo.optimizers.get(slow), lo.optimizers.get(fast),
                                      device_type)
        syncs, wait_s = None, None
        if key in SYNC_STAGES and (a.syncs_by_stage or b.syncs_by_stage):
            syncs = (stage_syncs(a, key), stage_syncs(b, key))
            if syncs[0] or syncs[1]:
                evidence += f"; {syncs[0]:.0f} host syncs per step against {syncs[1]:.0f}"
                wa, wb = waited(slow, key), waited(fast, key)
                if device_type != "cuda":
                    evidence += (" (their cost is not measured here: a CPU never waits for a "
                                 "device)")
                elif wa is None:
                    evidence += " (their wait was not profiled)"
                else:  # carved out of the stage's time, never added to it
                    wait_s = wa * ns - (wb or 0.0) * nf
                    evidence += (f", of which the host waited {wa * 1e3:.3g} ms per step at them "
                                 f"against {(wb or 0.0) * 1e3:.3g} ms (profiled warm steps; "
                                 "inside the stage's time)")
        gc_share = stage_gc_share(a, key)
        if gc_share is not None and gc_share >= GC_HIGH:
            evidence += (f"; Python's garbage collector ran in {gc_share:.0%} of "
                         f"{gc_of(key)} in the slow pipeline's full steps")
        sites, why, outside = code_sites(profiles, slow, fast, key, device_type)
        row = Cause(_stage_words(key), evidence, sa, sb, sa - sb, None,
                    claims_mod.MEASURED, stage=key, advice=advice, syncs=syncs,
                    sync_wait_s=wait_s, note=note, sites=sites, sites_note=why, outside=outside,
                    growth=lo.growth.get(slow, {}).get(key),
                    fast_growth=lo.growth.get(fast, {}).get(key), gc_share=gc_share)
        if key in qa and key in qb and within_noise(qa[key], qb[key], ns, nf):
            row.effect = "noise"
            row.evidence += ("; the two sides' interquartile ranges per epoch overlap: within "
                             "the noise, not booked (its difference is in the unattributed rest)")
        rows.append(row)
    total = gap.epoch_s[slow] - gap.epoch_s[fast]
    if gap.ddp_factor is not None:
        extra = gap.epoch_s[slow] * (gap.ddp_factor.median - 1.0)
        row = Cause(f"DDP at {gap.ddp_world} ranks",
                    f"factor {gap.ddp_factor.median:.3g} (IQR {gap.ddp_factor.iqr:.2g}; separate "
                    f"launches, alternated): {gap.ddp_why}", extra if gap.ddp_booked else None,
                    0.0 if gap.ddp_booked else None, extra if gap.ddp_booked else None, None,
                    claims_mod.MEASURED, stage="ddp")
        if gap.ddp_booked:
            total += extra
        else:
            row.effect = "noise"
        rows.append(row)
    attributed = sum(r.difference_s for r in rows
                     if r.difference_s is not None and r.effect != "noise")
    noisy = [r.cause for r in rows if r.effect == "noise" and r.difference_s is not None]
    rows.append(Cause("unattributed", "the full steps' medians x steps per epoch minus the "
                      "booked stages' (stage medians do not add up to the step's"
                      + (f"; with the stages within their noise: {', '.join(noisy)}"
                         if noisy else "") + ")", None, None,
                      total - attributed, None, claims_mod.MEASURED, "rest", stage="rest"))
    # the full steps the stages are timed in must show the gap's direction too: else a share of
    # their difference reads backwards (found by a user trial: 'adds' rows at -16%, a 'saves'
    # row at +126%, beside a 1.27x gap whose full steps said 0.466x)
    set_shares(rows, total if gap.measurable and gap.steps_agree else 0.0)
    advise(rows, device_type, encoder=lo.encoders.get(slow), gap=gap,
           copies=carries_copies(slow), num_genes=lo.num_genes)
    timed = sorted((r for r in rows if r.difference_s is not None
                    and r.effect not in ("rest", "noise")), key=lambda r: -(r.difference_s or 0))
    return timed + [r for r in rows if r.effect == "rest"] + \
        [r for r in rows if r.effect == "noise" or r.difference_s is None]


def set_shares(rows: list[Cause], gap: float) -> None:
    """Each booked row's share of the measured gap (none when the gap is 0 or not measurable)
    and whether it adds or saves time (the rest keeps "rest", noise keeps "noise")."""
    for r in rows:
        if r.difference_s is None or r.effect == "noise":
            continue
        r.share = r.difference_s / gap if gap else None
        if r.effect not in ("rest", "noise"):
            r.effect = "adds" if r.difference_s > 0 else "saves" if r.difference_s < 0 else ""


def first_causes(causes: list[Cause], n: int = 2) -> list[Cause]:
    """The stages that add the most, each at least :data:`MINOR` of the gap."""
    return [c for c in causes if c.effect == "adds" and c.share is not None
            and c.share >= MINOR and c.stage != "rest"][:n]


def told_apart(first: list[Cause], gap: Gap) -> bool:
    """Whether the first two causes' shares differ by more than the gap's own spread as a share of
    it (the ratio's IQR over the ratio minus one). True with one cause.
    """
    if len(first) < 2:
        return True
    r = gap.ratio
    spread = r.iqr / max(r.median - 1.0, 1e-12)
    return abs(first[0].share - first[1].share) > spread


def offsets(causes: list[Cause]) -> list[Cause]:
    """Rows that save time (negative shares), the largest first: shown beside any share above
    100%."""
    return sorted((c for c in causes if c.share is not None and c.share < -0.005),
                  key=lambda c: c.share)


def syncs_note(causes: list[Cause], device_type: str) -> str:
    """The pair's host syncs by stage, in one line, with what they cost here ("" without any
    the slow pipeline makes more of)."""
    more = [c for c in causes if c.syncs is not None and c.syncs[0] > c.syncs[1]]
    if not more:
        return ""
    per = ", ".join(f"{c.syncs[0]:.0f} against {c.syncs[1]:.0f} in the {c.cause}" for c in more)
    return (f"host syncs per step: {per}; "
            + ("their wait is inside the stage's time above, not added to it"
               if device_type == "cuda" else
               "not measured here: a CPU never waits for a device, so their cost on a GPU "
               "needs a GPU run"))


GC_HIGH = 0.1  # the slow pipeline's garbage-collector share of its steps' time worth a caveat
# a cause's stage -> the loop's timed stages that hold it (the data stages: the item's and the
# collate's own times, where they ran: a DataLoader worker's collections are counted there)
TIMED = {"data_item": ("worker_fetch",), "collate": ("worker_collate",), "loss": LOSS_PARTS}


def stage_gc_share(arm, key: str) -> float | None:
    """Of a cause's stage's summed time over ``arm``'s timed steps, the part Python's garbage
    collector ran inside it (the data stages: inside the items or the collates, in the process
    that ran them); None where the arm has no such record (a results file from before it) or
    the stage no time."""
    if GC_PAUSE not in arm.extra:
        return None
    names = TIMED.get(key, (key,))
    if key in ("data_item", "collate") and f"{GC_PAUSE}:{names[0]}" not in arm.extra:
        return None  # recorded only for the step's own process then
    timed = {**arm.stages, **arm.extra}
    total = sum(sum(timed[n].samples) for n in names if n in timed)
    if total <= 0:
        return None
    inside = sum(sum(arm.extra[f"{GC_PAUSE}:{n}"].samples) for n in names
                 if f"{GC_PAUSE}:{n}" in arm.extra)
    return inside / total


def gc_note(lo, slow: str, fast: str) -> str:
    """The garbage collector's pauses in the slow pipeline's timed steps, where they are at
    least :data:`GC_HIGH` of their summed time and more than the fast one's share ("" else, and
    where either was not recorded): its median full step and that step's IQR with and without
    the collector's time (the gap is of medians: it holds the collector's time as far as the
    median step does, and an epoch pays all of it; measured, a pipeline that collected in 4 of
    9 steps had its median fall on either side of them from run to run), and the two full
    steps' ratio of means beside that of medians (an epoch pays every step: a user trial's
    gc.freeze() cut the collector from 52% to 6% with the median-based gap unmoved). With
    DataLoader worker processes, their own collections inside the items and collates (never
    this process's) are told apart, by the same rule."""
    parts = []
    gs, gf = lo.gc_pauses(slow), lo.gc_pauses(fast)
    workers = lo.loader_workers
    if gs is not None and gf is not None and gs[0] >= GC_HIGH and gs[0] > gf[0]:
        text = (f"Python's garbage collector took {gs[0]:.0%} of the timed steps of '{slow}' "
                f"(of their summed time, every mode; at most {gs[1] * 1e3:.3g} ms in one of its "
                f"{gs[2]} steps"
                + ("; the training process only" if workers else "")
                + f"), against {gf[0]:.0%} of those of '{fast}'")
        a = lo.arm(slow, "full")
        st = a.extra.get(GC_PAUSE)
        if st is not None and st.n == a.step.n and a.step.n:
            without = Stat.from_samples([w - p for w, p in zip(a.step.samples, st.samples)])
            text += (f": its median full step {a.step.median * 1e3:.3g} ms, "
                     f"{without.median * 1e3:.3g} ms without the collector's time (IQR "
                     f"{a.step.iqr * 1e3:.3g} ms, {without.iqr * 1e3:.3g} ms without it). The "
                     "gap is of medians: it holds the collector's time as far as the median "
                     "step does, and an epoch pays all of it")
            fa = lo.arm(fast, "full")
            if fa.step.n and fa.step.median > 0 and a.step.median > 0:  # what an epoch pays
                ms = sum(a.step.samples) / a.step.n
                mf = sum(fa.step.samples) / fa.step.n
                text += (f": the mean full step is {ms * 1e3:.3g} ms against the fast one's "
                         f"{mf * 1e3:.3g} ms, a ratio of {ms / mf:.3g}x, against "
                         f"{a.step.median / fa.step.median:.3g}x of their medians")
        parts.append(text)
    in_main = bool(parts)  # a collection in the training process walks every pipeline's objects
    ws, wf = (lo.worker_gc(slow), lo.worker_gc(fast)) if workers else (None, None)
    if ws is not None and wf is not None and ws[0] >= GC_HIGH and ws[0] > wf[0]:
        parts.append(f"In the {workers} DataLoader worker process(es) of '{slow}', Python's "
                     f"garbage collector took {ws[0]:.0%} of its data items' and collates' "
                     f"summed time (at most {ws[1] * 1e3:.3g} ms in one step's batch, of "
                     f"{ws[2]} steps), against {wf[0]:.0%} in those of '{fast}': the step "
                     "waits for it where the workers cannot keep ahead")
    if not parts:
        return ""
    return (". ".join(parts) + f". To shorten its collections, {GC_ADVICE}. A full collection "
            "walks every Python object of its process"
            + (", this run's other pipelines' too" if in_main else
               ", a forked DataLoader worker's the ones it inherited from the training process "
               "too"))
