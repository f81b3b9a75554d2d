"""Notebook 05: why the slow pipeline is slow, which claims hold, and the fix.

The verdict reads the typed results of notebooks 01-04 from the run folder and refuses to run
when any is missing or incomplete (a verdict from partial inputs would look complete and be
wrong). It records the checksum of every input it read, so ``run --resume`` reruns it whenever
an input changed.

* **Causes**: the epoch-time difference between the two ``gap_strategies``, split by mechanism
  (the model on B graph copies, per-sample data work, device prep, transfer, loop overhead, DDP)
  from notebook 03's stage medians x steps per epoch, and notebook 04's DDP factor (booked only
  when it is beyond the noise). Host syncs are counted, not timed, on a CPU.
* **Claims**: :mod:`workbook_lib.analysis.claims`.
* **The fix**: the fastest exact strategy (notebook 03, full step per sample); strategies within
  ``verdict_tie_tolerance`` of it are tied, and the tie goes to the least memory per sample when
  notebook 02 measured it for every tied strategy (never on a missing value). Its gain per
  sample, the benchmark's figure (the real spec when it was measured: ``bench.json`` in the run
  folder or notebook 02 with ``bench_full_size``), and epochs per day at the dataset size, with
  notebook 04's measured DDP factor for several ranks.
* **Figures it does not rest on**: a headline figure whose IQR/median is beyond the precision
  target is *disturbed*; one measured while the process's compute threads got less than 80% of
  the CPU they asked for (:mod:`workbook_lib.measurement.cpu`) is *contended*: other jobs on the
  same CPUs, or the run's own processes outnumbering them (each figure says which:
  :attr:`CpuShare.cause`, :meth:`CpuShare.explain`), slow every repeat alike, so such a figure
  can be precise and wrong by orders of magnitude,
  and can flip the order of two pipelines. Both are named first in the answer, shown and marked,
  and the answer does not rest on them (a fix chosen from contended full steps is provisional).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ..catalog import notebook_info
from ..exceptions import IncompleteInputsError
from ..measurement.cpu import CpuShare, causes_text
from ..measurement.timing import Stat
from ..records import Record
from ..running.results import (file_checksum, load_result, params_differ, read_meta,
                                results_path)
from .. import pipelines
from ..training.loop import project_epochs
from . import claims as claims_mod
from .bench import BenchResult
from .timing_study import is_exact

INPUTS = notebook_info("05_verdict").requires


@dataclass
class Cause(Record):
    cause: str
    evidence: str
    slow_s_per_epoch: float | None
    fast_s_per_epoch: float | None
    difference_s: float | None
    share: float | None  # of the measured epoch-time gap (negative: the cause saves time)
    kind: str  # measured, or not measured here
    # "adds" or "saves" time on the slow pipeline; "rest": unattributed; "noise": a factor
    # whose IQR holds 1 (booked, but no measurable effect)
    effect: str = ""
    # the stage it names: data_item, collate, h2d, device_prep, syncs, forward, backward,
    # optimizer, overhead, ddp, rest (see workbook_lib.analysis.stages)
    stage: str = ""
    advice: str = ""  # what to change when this is the first cause


@dataclass
class Recommendation(Record):
    strategy: str
    label: str
    title: str
    ms_per_sample: Stat
    baseline: str
    speedup: Stat | None  # baseline / recommended, full step per sample (03, same rounds)
    fastest: str
    tied: list[str]
    tie_rule: str
    memory_per_sample: dict[str, float] = field(default_factory=dict)
    contended: list[str] = field(default_factory=list)  # exact strategies measured contended
    bench: BenchResult | None = None
    bench_source: str = ""
    epochs_per_day: dict[str, dict[str, float]] = field(default_factory=dict)
    projection_basis: str = ""


@dataclass
class VerdictResult(Record):
    answer: str  # the lead paragraph (markdown)
    device: str
    device_type: str
    causes: list[Cause]
    claims: list[claims_mod.Claim]
    recommendation: Recommendation | None
    gap_total: Stat | None
    can_say: list[str]
    cannot_say: list[str]
    inputs: dict[str, str] = field(default_factory=dict)  # notebook -> results checksum
    disturbed: dict[str, float] = field(default_factory=dict)  # headline figure -> IQR/median
    # headline figure -> what the process got of the CPUs while it was measured (contended)
    contended: dict[str, CpuShare] = field(default_factory=dict)
    target: float = 0.1  # the precision target the figures were repeated for
    gap_strategies: list[str] = field(default_factory=list)  # [slow, fast]


def load_inputs(run_dir: str | Path,
                params: dict | None = None) -> tuple[dict, dict[str, str]]:
    """The typed results of notebooks 01-04 and their checksums (with ``params``: made with
    the same result-relevant params).

    Raises:
        IncompleteInputsError: one or more is missing, incomplete, unreadable or made with other
            params.
    """
    found, sums, missing, other = {}, {}, [], []
    for nb in INPUTS:
        meta = read_meta(run_dir, nb)
        if meta is not None and meta.complete and params is not None:
            changed = params_differ(meta.params, params)
            if changed:
                missing.append(nb)
                other.append(f"{nb} ({', '.join(changed[:3])})")
                continue
        res = load_result(run_dir, nb) if meta is not None and meta.complete else None
        if res is None:
            missing.append(nb)
            continue
        found[nb] = res
        sums[nb] = file_checksum(results_path(run_dir, nb))
    bench = Path(run_dir) / "bench.json"  # quoted when present: --resume reruns when it changes
    if bench.is_file():
        sums["bench"] = file_checksum(bench)
    if other:
        absent = [nb for nb in missing if not any(o.startswith(nb) for o in other)]
        raise IncompleteInputsError(
            f"the verdict's inputs in {run_dir} were made with other params: "
            f"{'; '.join(other)}" + (f" (and {', '.join(absent)} are missing or incomplete)"
                                     if absent else "")
            + "; run them with these params first", missing=missing)
    if missing:
        raise IncompleteInputsError(
            f"the verdict needs complete results of {', '.join(missing)} in {run_dir}; run "
            f"them first (python -m workbook_lib run --resume --out {run_dir} finishes what "
            "is missing)", missing=missing)
    return found, sums


def label(name: str) -> str:
    return pipelines.label(name)


def title(name: str) -> str:
    return pipelines.title(name)


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
    "syncs": "take the host syncs out of the step (.item(), nonzero, boolean-mask indexing, "
             ".tolist(), printing a tensor): keep values on the device and vectorize over the "
             "batch; torch.cuda.set_sync_debug_mode('warn') names each one on a GPU",
    "forward": "batch the samples' work: one pass over one shared graph for the whole batch "
               "instead of a loop or a graph copy per sample (workbook_lib.nodemask)",
    "backward": "the backward mirrors the forward: shrink the forward's per-sample work and the "
                "backward shrinks with it",
    "optimizer": "a foreach or fused optimizer (torch.optim.AdamW(foreach=True), fused=True on "
                 "CUDA) with no Python loop over parameters or their rows",
    "overhead": "less Python between the stages (per-step logging, metrics read with .item(), "
                "hooks)",
}
SYNCED = ("device_prep", "forward", "backward")
SYNC_RULE = "at least one host sync per sample more than the fast pipeline in that stage"


def rank_causes(timing, ddp, slow: str, fast: str, num_samples: int,
                device_type: str) -> list[Cause]:
    """The epoch-time difference between ``slow`` and ``fast``, stage by stage.

    Args:
        timing: notebook 03's results (its ``loops``: the full-step arms of both pipelines).
        ddp: notebook 04's results, or None (the DDP row is then "not measured here").
        slow, fast: the two pipelines' names.
        num_samples: the dataset size (80% of it per epoch).
        device_type: ``cpu`` or ``cuda``.

    Each stage of :mod:`~workbook_lib.analysis.stages` (data item, collate, transfer, device
    prep, forward, backward, optimizer, loop overhead) is one row: its median per step x steps
    per epoch, slow minus fast. A device-prep, forward or backward row whose stage makes at
    least one host sync per sample more in the slow pipeline (:data:`SYNC_RULE`) is named for
    its syncs (stage ``syncs``). Then notebook 04's DDP factor (``ddp`` None: not measured) and
    the unattributed rest. Timed rows come first, largest addition first.
    """
    from ..strategies import REGISTRY
    from .stages import STAGES, stage_medians

    lo = timing.loops
    a, b = lo.arm(slow, "full"), lo.arm(fast, "full")
    steps = {s: math.ceil(0.8 * num_samples / lo.arm(s, "full").samples_per_step)
             for s in (slow, fast)}
    ma, mb = stage_medians(a), stage_medians(b)
    ba, bb = a.samples_per_step, b.samples_per_step
    copies = slow in REGISTRY and REGISTRY[slow].replicated and fast == "dango_wildtype"
    rows = []
    for key in ("data_item", "collate", "h2d", "device_prep", "forward", "backward",
                "optimizer", "overhead"):
        what = STAGES[key][0]
        if key not in ma and key not in mb:
            continue
        sa, sb = ma.get(key, 0.0) * steps[slow], mb.get(key, 0.0) * steps[fast]
        evidence = (f"{ma.get(key, 0.0) * 1e3:.3g} ms per step at batch {ba} against "
                    f"{mb.get(key, 0.0) * 1e3:.3g} ms at batch {bb}")
        if key == "h2d" and device_type != "cuda":
            evidence += ("; on a CPU no byte is copied: this is the pipeline's to_device walk "
                         "itself (a GPU's copy: a GPU run)")
        if key in ("data_item", "collate"):
            evidence += (" (the step's wait for the DataLoader, split by the workers' own item "
                         "and collate times)")
        stage = key
        if copies and key in ("forward", "backward"):
            what = (f"{key} on B = {ba} graph copies per step ({title(fast)} makes one pass)")
        na, nb = (a.syncs_by_stage.get(key, 0.0), b.syncs_by_stage.get(key, 0.0))
        if key in SYNCED and na - nb >= ba:
            stage = "syncs"
            what = (f"host syncs in the {STAGES[key][0]}: {na:.0f} per step against "
                    f"{nb:.0f} (each drains a GPU's queue)")
            evidence += ("" if device_type == "cuda" else
                         "; the stage's time on this CPU, its syncs counted as a GPU would make "
                         "them")
        rows.append(Cause(what, evidence, sa, sb, sa - sb, None, claims_mod.MEASURED,
                          stage=stage, advice=ADVICE[stage]))
    if ddp is not None:
        g = ddp.gap
        # the DDP factor is always applied (its IQR carried into the gap's): no on/off threshold
        extra = a.step.median * steps[slow] * (g.ddp_factor.median - 1.0)
        rows.append(Cause(f"DDP at {g.world_size} ranks", f"factor {g.ddp_factor.median:.3g} "
                          f"(IQR {g.ddp_factor.iqr:.2g}; separate launches, alternated)", extra,
                          0.0, extra, None, claims_mod.MEASURED, stage="ddp",
                          advice="accumulate gradients with no_sync(), or fewer, larger steps"))
    else:
        rows.append(Cause("DDP", "notebook 04 not run", None, None, None, None,
                          claims_mod.NOT_MEASURED, stage="ddp"))
    syncs = a.syncs_per_step
    if syncs is not None and not any(r.stage == "syncs" for r in rows):
        rows.append(Cause("host syncs (each drains a GPU's queue)",
                          f"{syncs:.0f} per step of {title(slow)} against "
                          f"{b.syncs_per_step or 0:.0f}"
                          + ("" if device_type == "cuda" else " (what a GPU would sync)"),
                          None, None, None, None,
                          claims_mod.MEASURED if device_type == "cuda" else
                          "counted (their time: a GPU run)", stage="syncs"))
    # shares of the measured epoch-time gap (the full steps' medians x steps, and the DDP extra):
    # stage medians do not add up to the step median, so what they leave is its own row
    gap = a.step.median * steps[slow] - b.step.median * steps[fast] + sum(
        r.difference_s for r in rows if r.stage == "ddp" and r.difference_s)
    attributed = sum(r.difference_s for r in rows if r.difference_s is not None)
    rows.append(Cause("unattributed (the step medians' gap minus the stages'; medians do not "
                      "add up)", "full-step medians x steps per epoch, minus the rows above",
                      None, None, gap - attributed, None, claims_mod.MEASURED, "rest",
                      stage="rest"))
    set_shares(rows, gap)
    ddp_row = next(r for r in rows if r.stage == "ddp")
    if ddp is not None and ddp.gap.ddp_factor.q1 <= 1.0 <= ddp.gap.ddp_factor.q3 \
            and ddp_row.difference_s:
        # the factor's IQR holds 1: its share is booked (it is in the gap) but neither adds nor
        # saves time measurably
        ddp_row.effect = "noise"
        ddp_row.evidence += ": 1 lies within its IQR, no measurable effect"
    timed = sorted((r for r in rows if r.difference_s is not None and r.effect != "rest"),
                   key=lambda r: -(r.difference_s or 0))
    return timed + [r for r in rows if r.effect == "rest"] + \
        [r for r in rows if r.difference_s is None]


def set_shares(rows: list[Cause], gap: float) -> None:
    """Each timed cause's share of the measured gap and whether it adds or saves time (the
    unattributed rest keeps its effect "rest")."""
    for r in rows:
        if r.difference_s is None:
            continue
        r.share = r.difference_s / gap if gap else None
        if r.effect != "rest":
            r.effect = "adds" if r.difference_s > 0 else "saves" if r.difference_s < 0 else ""


def _bench(run_dir: Path, mask_cost) -> tuple[BenchResult | None, str]:
    """The benchmark to quote: a real-spec one when measured (``bench.json`` from the CLI in the
    run folder, else notebook 02's), otherwise 02's reduced-size one."""
    import json

    path = Path(run_dir) / "bench.json"
    if path.is_file():
        try:
            b = BenchResult.from_json(json.loads(path.read_text()))
            if b.full_size or not mask_cost.bench.full_size:
                return b, "bench.json (python -m workbook_lib bench) in the run folder"
        except (ValueError, KeyError, TypeError):
            pass
    return mask_cost.bench, "notebook 02"


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
              num_samples: int, target: float = 0.1) -> Recommendation | None:
    lo = timing.loops
    exact = [n for n in lo.strategies if is_exact(lo, n)]
    if not exact:
        return None
    ms = {n: lo.arm(n, "full").ms_per_sample for n in exact}
    fastest, tied, noisy = tied_with_fastest(ms, tie_tolerance, target)
    why = (f"within {tie_tolerance:.0%} of the fastest" if not noisy else
           f"within {tie_tolerance:.0%} of the fastest or, on this disturbed run, with IQRs "
           f"overlapping its ({', '.join(noisy)})")
    mem = mask_cost.memory.per_sample()
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
    top = max(ddp.worlds)
    base = min(ddp.worlds)
    factors = getattr(ddp.gap, "step_factors", {}) or {}
    epochs = {}
    for n in {best, baseline, *ddp.gap_strategies} & set(lo.strategies):
        a = lo.arm(n, "full")
        one = project_epochs(a.step.median, a.samples_per_step, num_samples)["epochs_per_day"]
        epochs[n] = {"1 rank": one}
        if top != base and n in factors:  # each strategy's own measured factor
            epochs[n][f"{top} ranks"] = one * (top / base) / factors[n].median
    basis = (f"80% of {num_samples:,} samples per epoch; 1 rank: notebook 03's full step; "
             f"{top} ranks: {top / base:g}x the samples per step at each strategy's own step "
             f"factor measured in notebook 04 (its {top}-rank step over its {base}-rank step, "
             "weak scaling, separate launches alternated); a strategy 04 did not run has no "
             f"{top}-rank figure")
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
              "GPU kernel efficiency and GPU memory limits (the OOM at batch 38)",
              "NCCL communication between GPUs"]


DISTURBED_LABELS = {"gap": "the epoch-time gap", "per_step_ratio": "the per-step ratio",
                    "ddp_factor": "the DDP factor", "speedup": "the fix's speedup in the loop",
                    "bench": "the benchmark's ratio"}


def disturbed_figures(ddp, rec: Recommendation | None, target: float) -> dict[str, float]:
    """The headline figures whose IQR/median is beyond ``target`` (the machine was disturbed
    while they were measured, or they are too few): key -> IQR/median."""
    figs = {"gap": ddp.gap.total, "per_step_ratio": ddp.gap.per_step_ratio,
            "ddp_factor": ddp.gap.ddp_factor}
    if rec is not None:
        figs["speedup"] = rec.speedup
        figs["bench"] = rec.bench.ratio_vs_lazy_form if rec.bench is not None else None
    return {k: st.rel_iqr for k, st in figs.items()
            if st is not None and st.n > 1 and st.rel_iqr > target}


CONTENDED_LABELS = {**DISTURBED_LABELS, "loop": "notebook 03's full steps (the fix is chosen "
                                                "by them)"}


def contended_figures(ddp, rec: Recommendation | None, timing=None) -> dict[str, CpuShare]:
    """The headline figures measured while the process got less CPU than its threads asked for
    (:attr:`Stat.contended`), and notebook 03's full steps when any exact strategy's was: key ->
    the CPU share it was measured with."""
    figs = {"gap": ddp.gap.total, "per_step_ratio": ddp.gap.per_step_ratio,
            "ddp_factor": ddp.gap.ddp_factor}
    if rec is not None:
        figs["speedup"] = rec.speedup
        figs["bench"] = rec.bench.ratio_vs_lazy_form if rec.bench is not None else None
    out = {k: st.cpu for k, st in figs.items()
           if st is not None and getattr(st, "contended", False)}
    if timing is not None:
        lo = timing.loops
        arms = [lo.arm(n, "full").step for n in lo.strategies if is_exact(lo, n)]
        bad = [a.cpu for a in arms if getattr(a, "contended", False)]
        if bad:
            out["loop"] = min(bad, key=lambda c: c.judged)
    return out


def build_verdict(found: dict, inputs: dict[str, str], params: dict, run_dir: Path,
                  device: str, device_type: str) -> VerdictResult:
    inv = found["01_graph_inventory"]
    mc = found["02_mask_cost_model"]
    timing = found["03_data_vs_model_timing"]
    ddp = found["04_ddp_scaling"]
    slow, fast = params["gap_strategies"]
    causes = rank_causes(timing, ddp, slow, fast, params["num_samples"], device_type) \
        if slow in timing.loops.strategies and fast in timing.loops.strategies else []
    cl = claims_mod.check_claims(inv, mc, timing, ddp, device_type=device_type,
                                 hidden=params["hidden"], bench=_bench(run_dir, mc)[0])
    # the fix against the slow side of the gap: the Lazy pipeline by default, the user's own
    # slow pipeline when gap_strategies names it
    rec = recommend(timing, mc, ddp, run_dir, baseline=slow,
                    tie_tolerance=params["verdict_tie_tolerance"],
                    num_samples=params["num_samples"], target=params["precision_target"])
    res = VerdictResult(answer="", device=device, device_type=device_type, causes=causes,
                        claims=cl, recommendation=rec, gap_total=ddp.gap.total,
                        can_say=CPU_CAN if device_type != "cuda" else [],
                        cannot_say=CPU_CANNOT if device_type != "cuda" else [], inputs=inputs,
                        disturbed=disturbed_figures(ddp, rec, params["precision_target"]),
                        contended=contended_figures(ddp, rec, timing),
                        target=params["precision_target"], gap_strategies=[slow, fast])
    res.answer = answer(res, ddp, inv, params)
    return res


def _builtin_fix(r: Recommendation) -> str:
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


def _fmt(st: Stat | None, unit: str = "x") -> str:
    return "n/a" if st is None else f"{st.median:.3g}{unit} (IQR {st.iqr:.2g})"


def answer(v: VerdictResult, ddp, inv, params: dict) -> str:
    """The lead paragraph: the gap, its causes, the investigation's 40x, what a CPU can say, the fix."""
    g = ddp.gap
    slow, fast = g.slow, g.fast
    scale = f"scale {inv.scale:g} of the real graph ({inv.total_edges:,} edges)"
    lines = []
    shaky = set(v.disturbed) | set(v.contended)  # figures the answer does not rest on
    if v.contended:
        lines.append("**Contended figures (the process got less CPU than it asked for):** "
                     + "; ".join(f"{CONTENDED_LABELS[k]}: {c.describe()}"
                                 for k, c in v.contended.items())
                     + ". " + causes_text(v.contended.values())
                     + " Contention slows every repeat alike, so these figures can look precise "
                     "and still be wrong by orders of magnitude, and the order of two pipelines "
                     "can flip. The answer below does not rest on them: they are shown and "
                     "marked.")
    if v.disturbed:
        lines.append("**Disturbed figures (beyond the precision target):** " + "; ".join(
            f"{DISTURBED_LABELS[k]} {x:.0%}" for k, x in v.disturbed.items())
            + f" IQR/median against the {v.target:.0%} target: the machine was busy while they "
            "were measured, or their repeats were too few for their spread. The answer below "
            "does not rest on them: they are shown and marked, and rerunning on a quieter "
            "machine (or with a larger time budget) is the way to firm them up.")
    def why_not(key: str) -> str:
        return "contended" if key in v.contended else "disturbed"
    if "gap" in shaky:
        lines.append(f"On this run ({v.device}, {scale}), {title(slow)} measured "
                     f"{g.total.median:.3g}x slower per epoch than {title(fast)} (IQR "
                     f"{g.total.iqr:.2g}: {why_not('gap')}, not relied on).")
    lines += [] if "gap" in shaky else [f"**On this run ({v.device}, {scale}), {title(slow)} trains "
             f"{g.total.median:.3g}x slower per epoch than {title(fast)}** (IQR "
             f"{g.total.iqr:.2g}): {g.steps_ratio:.2f}x more steps per epoch (batch "
             f"{g.batch_sizes[slow]} against {g.batch_sizes[fast]}) times {g.per_step_ratio.median:.3g}x "
             f"per step times a DDP factor of {g.ddp_factor.median:.3g} (IQR "
             f"{g.ddp_factor.iqr:.2g}"
             + (f"; {why_not('ddp_factor')}, not relied on" if "ddp_factor" in shaky else "")
             + ")."]
    adds = [c for c in v.causes if c.effect == "adds" and c.share is not None and c.share > 0.005]
    offsets = [c for c in v.causes if c.effect == "saves" and c.share is not None
               and c.share < -0.005]
    rest = next((c for c in v.causes if c.effect == "rest" and c.share is not None), None)
    if adds:
        # the stages' ranking comes from notebook 03's stage medians; on a disturbed run it is
        # given, marked, and to be confirmed (the shares rest on the disturbed gap)
        unsure = "per_step_ratio" in shaky or "gap" in shaky
        lines.append(("**Why** (from disturbed or contended figures: confirm on a quieter "
                      "machine)**:** " if unsure else "**Why:** ")
                     + "; ".join(f"{c.cause}: {c.share:.0%} of the measured gap"
                                 for c in adds[:3]) + "."
                     + "".join(f" {c.cause[0].upper()}{c.cause[1:]} saves {-c.share:.0%} of it "
                               f"({c.evidence})." for c in offsets)
                     + (f" {rest.share:.0%} is not attributed to a stage." if rest is not None
                        and abs(rest.share) > 0.005 else "")
                     + (f"\n\n**What to change first** ({adds[0].cause.split(' (')[0]}): "
                        f"{adds[0].advice}." if adds[0].advice else ""))
    lines.append(f"The investigation observed about 40x on 4 GPUs at the real size; this run "
                 f"measured {g.total.median:.3g}x on a {v.device_type.upper()} at {scale}. The "
                 "steps-per-epoch factor is the same arithmetic in both; the per-step factor "
                 "depends on the device and the graph's size (notebook 02's benchmark shows it "
                 "at the real size).")
    if v.cannot_say:
        lines.append("A CPU run can say: " + "; ".join(v.can_say) + ". It cannot say: "
                     + "; ".join(v.cannot_say) + ".")
    r = v.recommendation
    if r is not None and r.strategy == r.baseline:
        # the slow pipeline is the only (or the fastest) exact one: nothing in this run fixes it
        lines.append(f"**No exact pipeline in this run is faster than {title(r.baseline)}.** "
                     + _builtin_fix(r) + " Check that a rewrite computes the same model with "
                     "`python -m workbook_lib equal SLOW FAST` before trusting its speed.")
    elif r is not None:
        fix = (f"**The fix, provisionally: {r.title}** (chosen from contended full steps, see "
               "above), exact" if "loop" in v.contended else f"**The fix: {r.title}**, exact")
        if r.speedup is not None and "speedup" in shaky:
            fix += (f"; in this run's training loop it measured {r.speedup.median:.3g}x per "
                    f"sample against {title(r.baseline)}, a {why_not('speedup')} figure (see "
                    "above)")
        elif r.speedup is not None:
            fix += (f", {r.speedup.median:.3g}x faster per sample than {title(r.baseline)} in "
                    "this run's training loop")
        b = r.bench
        if r.strategy != "node_mask_shared":  # the benchmark timed the built-in forms only
            fix += ". " + _builtin_fix(r)
        elif b is not None and b.ratio_vs_lazy_form is not None:
            where = "at the real spec" if b.full_size else "at this run's reduced size (only)"
            fix += (f"; per sample, forward + backward, {b.ratio_vs_lazy_form.median:.3g}x "
                    f"faster than replicated masks in the Lazy model's form {where}"
                    + (f" (IQR {b.ratio_vs_lazy_form.iqr:.2g}: a {why_not('bench')} figure, see "
                       "above)" if "bench" in shaky else ""))
            if b.passes_per_sample is not None:
                fix += f", {b.passes_per_sample.median:.2g} wildtype steps per exact sample"
        lines.append(fix if fix.endswith(".") else fix + ".")
        if "disturbed" in r.tie_rule or r.contended:
            lines.append(f"Choosing among {', '.join(title(n) for n in r.tied)}: {r.tie_rule}.")
    return "\n\n".join(lines)
