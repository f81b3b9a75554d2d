"""Notebook 05: why the slow pipeline is slow, and the fix, from what notebooks 01-04 measured.

The verdict answers about the run's own pair (``gap_strategies``: slow, fast), from what
completed, and says in one line what it could not use and why:

* **The gap** comes from notebook 03, the only input it needs: the two pipelines' full training
  steps in the same loop (paired by round when interleaved), times the steps per epoch (80% of
  ``num_samples`` at each pipeline's batch). Notebook 04's DDP factor multiplies it only when
  it is a measured effect: beyond its IQR (1 outside it) and not contended; a factor within its
  noise, or contended, is shown and not booked. 01, 02 and 04 are read when complete with these
  params; each one missing, failed or made with other params is named in a caveat.
* **Orientation.** When the pipeline listed slow is the faster one beyond the noise, the answer
  says so in one line and explains the gap the right way round; when the two are within each
  other's noise there is no gap to explain, and the answer says that instead of ranking causes.
* **Causes are stages** (:mod:`workbook_lib.studies.timing.stages`): data item, collate, transfer,
  device prep, forward (with the loss), backward, optimizer, loop overhead, then DDP (booked only
  as above) and the unattributed rest (stage medians do not add up to the step median). Each
  row is slow minus fast in seconds per epoch; shares are of the measured gap and add to 100%.
  Host syncs are a property of a stage: counted per stage, their cost "not measured here" on a
  CPU (a CPU never waits for a device); never a cause of their own.
* **Figures it does not rest on**: a headline figure whose IQR/median is beyond the precision
  target is *disturbed*; one measured while the process's compute threads got less than 80% of
  the CPU they asked for (:mod:`workbook_lib.measurement.cpu`) is *contended*: other jobs on the
  same CPUs, or the run's own processes outnumbering them (each figure says which:
  :attr:`CpuShare.cause`, :meth:`CpuShare.explain`). Contention slows every repeat alike, so
  such a figure can be precise and wrong, and can flip the order of two pipelines. Both are
  named in the caveats and the answer does not rest on them.
* **The investigation's story** (its 40x, its claims, the built-in benchmark) is told only when
  built-in strategies ran; with ``strategies: []`` the verdict is about the user's pipelines
  alone.
* **The fix**: the fastest exact pipeline of notebook 03 (ties within
  ``verdict_tie_tolerance`` go to the least memory per sample when notebook 02 measured it).

Text is composed by :mod:`workbook_lib.report.verdict_view`; this module returns figures.
"""
from __future__ import annotations

import math
from pathlib import Path

from ...catalog import notebook_info
from ...exceptions import IncompleteInputsError
from ...measurement.cpu import CpuShare, causes_text
from ...measurement.timing import Stat
from ...running.results import file_checksum, load_result, params_differ, read_meta, results_path
from ... import pipelines
from ...training.loop import project_epochs
from ...results.bench import BenchResult
from ...results.timing import STAGES
from ...results.verdict import Cause, Gap, Recommendation, VerdictResult
from . import claims as claims_mod
from ..timing.stages import stage_medians
from ..timing import DANGO, LAZY, is_exact

TIMING = "03_data_vs_model_timing"
REQUIRED = notebook_info("05_verdict").requires  # notebook 03
OPTIONAL = notebook_info("05_verdict").reads  # 01, 02, 04
STAGE_ORDER = ("data_item", "collate", "h2d", "device_prep", "forward", "backward", "optimizer",
               "overhead")
SYNC_STAGES = ("device_prep", "forward", "backward")
MINOR = 0.05  # a cause below this share of the gap is not named in the lead


# ---------------------------------------------------------------------------------------------
# inputs


def load_inputs(run_dir: str | Path, params: dict | None = None
                ) -> tuple[dict, dict[str, str], dict[str, str]]:
    """The typed results of notebook 03 (required) and of 01, 02, 04 (when complete with the
    same result-relevant params), their checksums, and why each optional one was not used.

    Raises:
        IncompleteInputsError: notebook 03 is missing, incomplete, unreadable or made with
            other params (the verdict's one required input).
    """
    found, sums, why_not = {}, {}, {}
    for nb in REQUIRED + OPTIONAL:
        meta = read_meta(run_dir, nb)
        reason = ""
        if meta is None:
            reason = notebook_error(run_dir, nb) or "not run"
        elif not meta.complete:
            reason = "failed or incomplete" + (f" ({meta.incomplete_because})"
                                               if getattr(meta, "incomplete_because", "") else "")
        elif params is not None and params_differ(meta.params, params):
            reason = f"made with other params ({', '.join(params_differ(meta.params, params)[:3])})"
        res = None if reason else load_result(run_dir, nb)
        if res is None and not reason:
            reason = "its results are unreadable"
        if reason:
            why_not[nb] = reason
            continue
        found[nb] = res
        sums[nb] = file_checksum(results_path(run_dir, nb))
    bench = Path(run_dir) / "bench.json"  # quoted when present: --resume reruns when it changes
    if bench.is_file():
        sums["bench"] = file_checksum(bench)
    missing = [nb for nb in REQUIRED if nb in why_not]
    if missing:
        raise IncompleteInputsError(
            f"the verdict needs notebook 03's timings in {run_dir} ({TIMING}: "
            f"{why_not[TIMING]}); run it first (python -m workbook_lib run --resume --out "
            f"{run_dir} finishes what is missing)", missing=missing)
    return found, sums, why_not


def notebook_error(run_dir: str | Path, nb: str) -> str:
    """"failed: ERROR" from the partial notebook a failed run left in the run folder (the
    failing cell's error, one line), or ""."""
    import json

    path = Path(run_dir) / f"{nb}.ipynb"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    for cell in doc.get("cells", []):
        for out in cell.get("outputs", []) or []:
            if out.get("output_type") == "error":
                text = " ".join(f"{out.get('ename', '')}: {out.get('evalue', '')}".split())
                return "failed: " + (text if len(text) <= 200 else text[:197] + "...")
    return ""


def label(name: str) -> str:
    return pipelines.label(name)


def title(name: str) -> str:
    return pipelines.title(name)


# ---------------------------------------------------------------------------------------------
# the gap and its orientation


def _epoch_steps(lo, name: str, num_samples: int) -> int:
    return math.ceil(0.8 * num_samples / lo.arm(name, "full").samples_per_step)


def _ddp_gap(ddp, slow: str, fast: str):
    """Notebook 04's gap decomposition of this pair (either orientation), or None."""
    g = getattr(ddp, "gap", None) if ddp is not None else None
    if g is None or {g.slow, g.fast} != {slow, fast}:
        return None
    return g


def ddp_booking(g, swapped: bool, target: float = 0.1) -> tuple[Stat | None, bool, str]:
    """(the DDP factor oriented slow over fast, whether it is booked, why).

    Booked only when it is a measured effect the answer can rest on: 1 outside its IQR, not
    contended, and not disturbed (IQR/median within ``target``, the rule of
    :func:`disturbed_figures`)."""
    if g is None:
        return None, False, ""
    f = g.ddp_factor
    if swapped:
        f = Stat.from_samples([1.0 / x for x in f.samples if x > 0], unit="ratio").with_cpu(
            f.cpu) if f.samples else f
    if g.world_size == g.base_world_size:
        return None, False, "one world size measured: no DDP factor"
    if f.contended:
        return f, False, "contended (its ranks got less CPU than they asked for): not booked"
    if f.q1 <= 1.0 <= f.q3:
        return f, False, "1 lies within its IQR: no measurable effect, not booked"
    if f.n > 1 and f.rel_iqr > target:
        return f, False, (f"disturbed (IQR/median {f.rel_iqr:.0%} beyond the {target:.0%} "
                          "target): not booked")
    return f, True, "1 outside its IQR: booked"


MIN_PAIRED = 5  # fewer repeats than this have no IQR to speak of: nothing is resolved on them


def resolved(r: Stat, target: float) -> int:
    """+1 when the ratio ``r`` is above 1 beyond its noise and beyond the precision target (its
    IQR clear of 1 and its median outside [1/(1+target), 1+target]: a difference smaller than
    the precision the figures were repeated for is not resolved), -1 likewise below, else 0;
    always 0 on fewer than :data:`MIN_PAIRED` repeats (two copies of one pipeline measured 1.3x
    apart on two steps)."""
    if r.n < MIN_PAIRED:
        return 0
    if r.q1 > 1.0 and r.median > 1.0 + target:
        return 1
    if r.q3 < 1.0 and r.median < 1.0 / (1.0 + target):
        return -1
    return 0


def measure_gap(lo, slow: str, fast: str, num_samples: int, ddp=None,
                target: float = 0.1) -> Gap:
    """The pair's epoch-time ratio, oriented so that ``slow`` is the slower beyond the noise.

    Args:
        lo: notebook 03's :class:`~workbook_lib.results.timing.LoopStudy`.
        slow, fast: the pair as listed (``gap_strategies``).
        num_samples: the dataset size (80% of it per epoch).
        ddp: notebook 04's result, or None.
        target: the precision target: a gap is measurable (and a listing is turned round) only
            beyond it (:func:`resolved`).
    """
    listed = [slow, fast]
    steps = {n: _epoch_steps(lo, n, num_samples) for n in listed}

    def ratio(a: str, b: str) -> tuple[Stat, Stat]:
        per_step = lo.ratio(lo.arm(a, "full"), lo.arm(b, "full"))
        return per_step, per_step.scaled(steps[a] / steps[b], "ratio")

    per_step, r = ratio(slow, fast)
    swapped = resolved(r, target) < 0
    if swapped:
        slow, fast = fast, slow
        per_step, r = ratio(slow, fast)
    basis = ("epoch time on one process: notebook 03's full steps "
             + ("paired by round" if lo.interleaved else "(separate series)")
             + " x steps per epoch")
    g = _ddp_gap(ddp, *listed)
    factor, booked, why = ddp_booking(g, swapped=g is not None and g.slow != slow,
                                      target=target)
    if booked:
        r = r.times(factor)
        basis += f" x the DDP factor at {g.world_size} ranks (notebook 04, separate launches)"
    return Gap(slow=slow, fast=fast, listed=listed, swapped=swapped, ratio=r, basis=basis,
               per_step=per_step, steps=steps,
               batch_sizes={n: lo.arm(n, "full").samples_per_step for n in listed},
               epoch_s={n: lo.arm(n, "full").step.median * steps[n] for n in listed},
               measurable=resolved(r, target) > 0, ddp_factor=factor,
               ddp_world=None if g is None else g.world_size, ddp_booked=booked, ddp_why=why)


# ---------------------------------------------------------------------------------------------
# causes, stage by stage


ADVICE = {
    "data_item": "move the per-sample work out of the dataset item: precompute it once, or build "
                 "it on the device from the deleted genes' indices (the node-mask shared graph, "
                 "workbook_lib.nodemask, needs nothing else per sample)",
    "collate": "make the collate cheap: no per-sample copies of the graph or masks; batch the "
               "deleted genes' indices and build what the model needs on the device, once per "
               "batch",
    "h2d": "transfer less: indices instead of masks or graph copies, from pinned memory "
           "(pin_memory: true)",
    "device_prep": "vectorize the device preparation over the batch (no loop per sample or gene)",
    "forward": "batch the samples' work: one pass over one shared graph for the whole batch "
               "instead of a loop or a graph copy per sample (workbook_lib.nodemask)",
    "backward": "the backward mirrors the forward: shrink the forward's per-sample work (one "
                "pass over one shared graph, workbook_lib.nodemask) and the backward shrinks "
                "with it",
    "optimizer": "a foreach or fused optimizer (torch.optim.AdamW(foreach=True), fused=True on "
                 "CUDA) with no Python loop over parameters or their rows",
    "overhead": "less Python between the stages (per-step logging, metrics read with .item(), "
                "hooks)",
    "ddp": "accumulate gradients with no_sync(), or fewer, larger steps",
}
SYNC_ADVICE = ("take the host syncs out of the step (.item(), nonzero, boolean-mask indexing, "
               ".tolist(), printing a tensor): keep values on the device and vectorize over the "
               "batch; torch.cuda.set_sync_debug_mode('warn') names each one")
H2D_WALK = ("keep Python objects out of the batch (names, strings, per-sample lists): .to() "
            "walks every one of them each step; carry indices and look names up outside the "
            "step")


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
        text += (f" over {int(c.get('tensors', 0))} tensors and {objs:,} other Python objects"
                 + (f" ({c['kinds']})" if c.get("kinds") else ""))
    return text


def rank_causes(timing, slow: str, fast: str, gap: Gap, device_type: str) -> list[Cause]:
    """The gap, stage by stage: slow minus fast in seconds per epoch, shares adding to 100%.

    Args:
        timing: notebook 03's results (its ``loops``).
        slow, fast: the pair, oriented (``gap.slow``, ``gap.fast``).
        gap: :func:`measure_gap`'s result (the DDP factor's booking, the steps per epoch).
        device_type: ``cpu`` or ``cuda``.

    Each stage of :mod:`~workbook_lib.studies.timing.stages` is one row, its median per step x steps
    per epoch, slow minus fast; host syncs ride on their stage's row as evidence. Then the DDP
    factor (its extra time when booked, else a row marked noise with no share), and the
    unattributed rest, so that the booked rows' shares add to exactly 100% of the measured gap.
    Rows that add time come first, the largest first.
    """
    lo = timing.loops
    a, b = lo.arm(slow, "full"), lo.arm(fast, "full")
    ma, mb = stage_medians(a), stage_medians(b)
    ns, nf = gap.steps[slow], gap.steps[fast]
    profiles = getattr(timing, "profiles", None) or {}

    def waited(name: str, key: str) -> float | None:
        p = profiles.get(name)
        return p.sync_wait_per_step(key) if p is not None else None
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
        note, advice = "", ADVICE[key]
        if key == "h2d":
            note = _h2d_note(a, device_type)
            c = getattr(a, "batch_contents", None) or {}
            if device_type != "cuda" or int(c.get("objects", 0) or 0) > 8 * a.samples_per_step:
                advice = H2D_WALK if c and int(c.get("objects", 0) or 0) else advice
        syncs, wait_s = None, None
        if key in SYNC_STAGES and (a.syncs_by_stage or b.syncs_by_stage):
            syncs = (a.syncs_by_stage.get(key, 0.0), b.syncs_by_stage.get(key, 0.0))
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
                    if sa - sb > 0 and wait_s > 0.5 * (sa - sb):
                        advice = SYNC_ADVICE
        rows.append(Cause(_stage_words(key), evidence, sa, sb, sa - sb, None,
                          claims_mod.MEASURED, stage=key, advice=advice, syncs=syncs,
                          sync_wait_s=wait_s, note=note))
    total = gap.epoch_s[slow] - gap.epoch_s[fast]
    if gap.ddp_factor is not None:
        extra = gap.epoch_s[slow] * (gap.ddp_factor.median - 1.0)
        row = Cause(f"DDP at {gap.ddp_world} ranks",
                    f"factor {gap.ddp_factor.median:.3g} (IQR {gap.ddp_factor.iqr:.2g}; separate "
                    f"launches, alternated): {gap.ddp_why}", extra if gap.ddp_booked else None,
                    0.0 if gap.ddp_booked else None, extra if gap.ddp_booked else None, None,
                    claims_mod.MEASURED, stage="ddp", advice=ADVICE["ddp"])
        if gap.ddp_booked:
            total += extra
        else:
            row.effect = "noise"
        rows.append(row)
    attributed = sum(r.difference_s for r in rows if r.difference_s is not None)
    rows.append(Cause("unattributed", "the full steps' medians x steps per epoch minus the "
                      "stages' (stage medians do not add up to the step's)", None, None,
                      total - attributed, None, claims_mod.MEASURED, "rest", stage="rest"))
    set_shares(rows, total if gap.measurable else 0.0)
    timed = sorted((r for r in rows if r.difference_s is not None and r.effect != "rest"),
                   key=lambda r: -(r.difference_s or 0))
    return timed + [r for r in rows if r.effect == "rest"] + \
        [r for r in rows if r.difference_s is None]


def set_shares(rows: list[Cause], gap: float) -> None:
    """Each booked row's share of the measured gap (none when the gap is 0 or not measurable)
    and whether it adds or saves time (the rest keeps "rest", noise keeps "noise")."""
    for r in rows:
        if r.difference_s is None:
            continue
        r.share = r.difference_s / gap if gap else None
        if r.effect not in ("rest", "noise"):
            r.effect = "adds" if r.difference_s > 0 else "saves" if r.difference_s < 0 else ""


def first_causes(causes: list[Cause], n: int = 2) -> list[Cause]:
    """The stages that add the most, each at least :data:`MINOR` of the gap."""
    return [c for c in causes if c.effect == "adds" and c.share is not None
            and c.share >= MINOR and c.stage != "rest"][:n]


def told_apart(first: list[Cause], gap: Gap) -> bool:
    """Whether the first two causes are ranked by a margin the measurement resolves: their
    shares differ by more than the gap's own spread as a share of it (the ratio's IQR over the
    ratio minus one; 0.32 over 0.55 is 58% of the gap, so 58% against 55% is not told apart,
    while 58% against 41% of a 7.1x gap with IQR 0.19, 3% of it, is). True with one cause."""
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


# ---------------------------------------------------------------------------------------------
# the fix


def _bench(run_dir: Path, mask_cost) -> tuple[BenchResult | None, str]:
    """The benchmark to quote: a real-spec one when measured (``bench.json`` from the CLI in the
    run folder, else notebook 02's), otherwise 02's reduced-size one; None when neither ran."""
    import json

    own = getattr(mask_cost, "bench", None) if mask_cost is not None else None
    path = Path(run_dir) / "bench.json"
    if path.is_file():
        try:
            b = BenchResult.from_json(json.loads(path.read_text()))
            if b.full_size or own is None or not own.full_size:
                return b, "bench.json (python -m workbook_lib bench) in the run folder"
        except (ValueError, KeyError, TypeError):
            pass
    return own, "notebook 02" if own is not None else ""


def tied_with_fastest(ms: dict[str, Stat], tie_tolerance: float,
                      target: float) -> tuple[str, list[str], list[str]]:
    """The fastest median, the strategies tied with it, and those among them tied only because
    the machine was disturbed.

    Tied: a median within ``tie_tolerance`` of the fastest's. When either figure is disturbed
    (IQR/median beyond ``target``), also any whose IQR overlaps the fastest's: this run cannot
    tell them apart, so the choice must not rest on their medians.
    """
    fastest = min(ms, key=lambda n: ms[n].median)
    f = ms[fastest]
    close = {n for n in ms if ms[n].median <= f.median * (1 + tie_tolerance)}
    noisy = {n for n in ms if n not in close and (f.rel_iqr > target or ms[n].rel_iqr > target)
             and ms[n].q1 <= f.q3}
    return fastest, sorted(close | noisy), sorted(noisy)


def recommend(timing, mask_cost, ddp, run_dir: Path, *, baseline: str, tie_tolerance: float,
              num_samples: int, target: float = 0.1,
              exclude: tuple[str, ...] = ()) -> Recommendation | None:
    """The fastest exact pipeline of notebook 03 (None when none is exact).

    Args:
        mask_cost: notebook 02's result or None (memory per sample then unknown: ties go to
            the fastest median).
        ddp: notebook 04's result or None (no multi-rank projection then).
        exclude: pipelines left out (e.g. one whose loss was not finite).
    """
    lo = timing.loops
    exact = [n for n in lo.strategies if is_exact(lo, n) and n not in exclude]
    if not exact:
        return None
    ms = {n: lo.arm(n, "full").ms_per_sample for n in exact}
    fastest, tied, noisy = tied_with_fastest(ms, tie_tolerance, target)
    why = (f"within {tie_tolerance:.0%} of the fastest" if not noisy else
           f"within {tie_tolerance:.0%} of the fastest or, on this disturbed run, with IQRs "
           f"overlapping its ({', '.join(noisy)})")
    mem = mask_cost.memory.per_sample() if mask_cost is not None and \
        getattr(mask_cost, "memory", None) is not None else {}
    if len(tied) > 1 and all(n in mem for n in tied):
        best = min(tied, key=lambda n: (mem[n], ms[n].median))
        rule = (f"{len(tied)} strategies {why}: the least memory per sample measured in "
                "notebook 02 wins")
    else:
        best = fastest
        rule = ("the fastest full step per sample" if len(tied) == 1 else
                f"{len(tied)} strategies {why}; memory per sample was not measured for all of "
                "them, so the fastest median wins"
                + (" (disturbed: rerun on a quieter machine to firm the choice up)"
                   if noisy else ""))
    contended = sorted(n for n in exact if ms[n].contended)
    if contended:
        rule += (f"; measured while the process got less CPU than it asked for "
                 f"({', '.join(contended)}: contended), which can change the order of these "
                 "figures, so this choice is provisional. "
                 + causes_text(ms[n].cpu for n in contended))
    speed = lo.ratio(lo.arm(baseline, "full"), lo.arm(best, "full")).scaled(
        lo.arm(best, "full").samples_per_step / lo.arm(baseline, "full").samples_per_step,
        "ratio") if baseline in lo.strategies and baseline != best else None
    bench, source = _bench(run_dir, mask_cost)
    worlds = sorted(getattr(ddp, "worlds", {}) or {})
    gap = getattr(ddp, "gap", None)
    factors = (getattr(gap, "step_factors", {}) or {}) if gap is not None else {}
    top, base = (worlds[-1], worlds[0]) if worlds else (1, 1)
    epochs = {}
    for n in {best, baseline} & set(lo.strategies):
        a = lo.arm(n, "full")
        one = project_epochs(a.step.median, a.samples_per_step, num_samples)["epochs_per_day"]
        epochs[n] = {"1 rank": one}
        if top != base and n in factors:  # each strategy's own measured factor
            epochs[n][f"{top} ranks"] = one * (top / base) / factors[n].median
    basis = (f"80% of {num_samples:,} samples per epoch; 1 rank: notebook 03's full step"
             + (f"; {top} ranks: {top / base:g}x the samples per step at each pipeline's own "
                f"step factor measured in notebook 04 (weak scaling, separate launches); a "
                f"pipeline 04 did not run has no {top}-rank figure" if top != base else
                "; no multi-rank figure (notebook 04 did not measure one)"))
    return Recommendation(strategy=best, label=label(best), title=title(best),
                          ms_per_sample=ms[best],
                          baseline=baseline, speedup=speed, fastest=fastest, tied=tied,
                          tie_rule=rule, memory_per_sample=mem, contended=contended,
                          bench=bench, bench_source=source,
                          epochs_per_day=epochs, projection_basis=basis)


CPU_CAN = ["exactness of every strategy (outputs and gradients)",
           "sizes: masks, replicated edge indices, caches, what a batch carries",
           "how the strategies' compute compares (graph passes per sample, message forms)",
           "how many host syncs each pipeline makes",
           "peak memory per sample of each strategy (host memory)"]
CPU_CANNOT = ["host-to-device transfer costs (a CPU run copies nothing)",
              "what each sync costs (a CPU never waits for a device)",
              "GPU kernel efficiency and GPU memory limits",
              "NCCL communication between GPUs"]


DISTURBED_LABELS = {"gap": "the epoch-time gap", "per_step_ratio": "the per-step ratio",
                    "ddp_factor": "the DDP factor", "speedup": "the fix's speedup in the loop",
                    "bench": "the benchmark's ratio"}
CONTENDED_LABELS = {**DISTURBED_LABELS, "loop": "notebook 03's full steps (the fix is chosen "
                                                "by them)"}


def _headline_stats(gap: Gap | None, rec: Recommendation | None) -> dict[str, Stat | None]:
    figs: dict[str, Stat | None] = {}
    if gap is not None:
        figs.update(gap=gap.ratio, per_step_ratio=gap.per_step)
        if gap.ddp_factor is not None:
            figs["ddp_factor"] = gap.ddp_factor
    if rec is not None:
        figs["speedup"] = rec.speedup
        figs["bench"] = rec.bench.ratio_vs_lazy_form if rec.bench is not None else None
    return figs


def disturbed_figures(gap: Gap | None, rec: Recommendation | None,
                      target: float) -> dict[str, float]:
    """The headline figures whose IQR/median is beyond ``target`` (the machine was disturbed
    while they were measured, or they are too few): key -> IQR/median."""
    return {k: st.rel_iqr for k, st in _headline_stats(gap, rec).items()
            if st is not None and st.n > 1 and st.rel_iqr > target}


def contended_figures(gap: Gap | None, rec: Recommendation | None,
                      timing=None) -> dict[str, CpuShare]:
    """The headline figures measured while the process got less CPU than its threads asked for
    (:attr:`Stat.contended`), and notebook 03's full steps when any exact strategy's was: key ->
    the CPU share it was measured with."""
    out = {k: st.cpu for k, st in _headline_stats(gap, rec).items()
           if st is not None and getattr(st, "contended", False)}
    if timing is not None:
        lo = timing.loops
        arms = [lo.arm(n, "full").step for n in lo.strategies if is_exact(lo, n)]
        bad = [a.cpu for a in arms if getattr(a, "contended", False)]
        if bad:
            out["loop"] = min(bad, key=lambda c: c.judged)
    return out


# ---------------------------------------------------------------------------------------------
# what went wrong in the user's pipelines


def pipeline_failures(found: dict) -> dict[str, str]:
    """pipeline -> "NB: what failed" for every pipeline a notebook lost (one line each; a loss
    that was not finite is :func:`nonfinite_losses`'s)."""
    from ...failures import NONFINITE

    out: dict[str, str] = {}
    for nb, res in sorted(found.items()):
        groups = [getattr(res, "failures", None),
                  getattr(getattr(res, "loops", None), "failures", None),
                  getattr(getattr(res, "memory", None), "failures", None)]
        for g in groups:
            for name, f in (g or {}).items():
                if getattr(f, "kind", "") != NONFINITE:
                    out.setdefault(name, f"in notebook {nb[:2]}: {f.line()}")
    return out


def nonfinite_losses(lo) -> dict[str, str]:
    """pipeline -> its loss in words, for pipelines whose full step's loss was not finite."""
    out = {}
    for n in lo.strategies:
        try:
            a = lo.arm(n, "full")
        except KeyError:
            continue
        bad = getattr(a, "nonfinite_steps", 0) or 0
        if bad:
            first = getattr(a, "first_nonfinite_step", None)
            out[n] = (f"its loss was not finite in {bad} of its steps"
                      + (f" from step {first}" if first is not None else ""))
    return out


def _in_timing(lo, name: str) -> bool:
    try:
        lo.arm(name, "full")
        return True
    except KeyError:
        return False


# ---------------------------------------------------------------------------------------------
# the verdict


def build_verdict(found: dict, inputs: dict[str, str], params: dict, run_dir: Path,
                  device: str, device_type: str,
                  missing: dict[str, str] | None = None) -> VerdictResult:
    """Everything notebook 05 says, as figures (its text: the view).

    Args:
        found: the typed results :func:`load_inputs` read (03 always; 01, 02, 04 when usable).
        missing: notebook -> why it was not used (from :func:`load_inputs`).
    """
    missing = dict(missing or {})
    inv = found.get("01_graph_inventory")
    mc = found.get("02_mask_cost_model")
    timing = found[TIMING]
    ddp = found.get("04_ddp_scaling")
    lo = timing.loops
    listed = list(params["gap_strategies"])
    builtin = bool(params["strategies"])
    failures = pipeline_failures(found)
    nonfinite = nonfinite_losses(lo)
    res = VerdictResult(answer="", device=device, device_type=device_type, causes=[],
                        claims=[], recommendation=None, gap_total=None,
                        can_say=CPU_CAN if device_type != "cuda" else [],
                        cannot_say=CPU_CANNOT if device_type != "cuda" else [], inputs=inputs,
                        target=params["precision_target"], gap_strategies=listed,
                        missing=missing, failures=failures, nonfinite=nonfinite,
                        builtin=builtin, num_samples=int(params["num_samples"]),
                        specs={n: s.target for n, s in pipelines.user_specs(params).items()})
    absent = [n for n in listed if not _in_timing(lo, n)]
    if absent:
        n = absent[0]
        why = failures[n].split(": ", 1)[1] if n in failures else f"'{n}' was not timed"
        res.no_answer = (f"no answer about '{listed[0]}' against '{listed[1]}': notebook 03 has "
                         f"no full step of '{n}': {why}")
    else:
        g = measure_gap(lo, *listed, params["num_samples"], ddp, params["precision_target"])
        res.gap, res.gap_total, res.gap_strategies = g, g.ratio, [g.slow, g.fast]
        res.causes = rank_causes(timing, g.slow, g.fast, g, device_type)
        res.syncs_note = syncs_note(res.causes, device_type)
    res.claims, res.claims_note = judge_claims(inv, mc, timing, ddp, params, run_dir,
                                               device_type)
    res.recommendation = recommend(
        timing, mc, ddp, run_dir, baseline=res.gap_strategies[0],
        tie_tolerance=params["verdict_tie_tolerance"], num_samples=params["num_samples"],
        target=params["precision_target"], exclude=tuple(nonfinite))
    res.disturbed = disturbed_figures(res.gap, res.recommendation, params["precision_target"])
    res.contended = contended_figures(res.gap, res.recommendation, timing)
    return res


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


def judge_claims(inv, mc, timing, ddp, params: dict, run_dir: Path,
                 device_type: str) -> tuple[list[Claim], str]:
    """The investigation's claims, judged only when built-in strategies ran (they are about its
    models); the gap claims only when this run's gap is the investigated pair."""
    if not params["strategies"]:
        return [], ("no built-in strategy ran (strategies: []): the investigation's claims are "
                    "about its own models and are not judged on your pipelines")
    on_pair = list(params["gap_strategies"]) == [LAZY, DANGO]
    cl = claims_mod.check_claims(inv, mc, timing, ddp if on_pair else None,
                                 device_type=device_type, hidden=params["hidden"],
                                 bench=_bench(run_dir, mc)[0])
    note = "" if on_pair else ("the epoch-gap claims are about the Lazy and DANGO-style models; "
                               "this run's gap is another pair, so they are not judged")
    return cl, note
