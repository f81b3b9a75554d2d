"""From the ranks' results to figures: synchronous steps, communication, efficiencies, the gap.

A world size's step time is, per step index, the maximum over ranks, pooled over its launches.
Communication is per rank: the comm hook's time split into the timed all-reduce transfer and the
rest (waiting for other ranks or, on a CPU, for a core). The DDP factor is computed per pair of adjacent launches and pooled; the
thread effect is shown apart. Every figure carries its worst rank's CPU share
(:mod:`workbook_lib.measurement.cpu`). The reasoning behind each rule: docs/development.md.
"""
from __future__ import annotations

import statistics

from ...results.cpu import CpuShare, worse
from ...results.stat import Stat, within_noise  # noqa: F401
from ...results.ddp import (CommRank, GapDecomposition, LAUNCH_PAIRED, LaunchFactor,  # noqa: F401
                            WorldSummary)


def _arm(rank: dict, name: str) -> dict:
    return rank["arms"][name]


def _launch_list(ranks) -> list[dict]:
    """One launch (``{rank: result}``) or several: always a list of launches."""
    return list(ranks) if isinstance(ranks, (list, tuple)) else [ranks]


def _source(a: dict, stage: str | None):
    return a["step"] if stage is None else (a["stages"].get(stage) or a["extra"].get(stage))


def arm_cpu(ranks, *arms: str) -> CpuShare | None:
    """The worst CPU share of any rank, in any launch, over the named arms (None where the
    ranks recorded none)."""
    shares = []
    for launch in _launch_list(ranks):
        for r in launch.values():
            for name in arms:
                cpu = (_arm(r, name).get("step") or {}).get("cpu") if name in r["arms"] else None
                if cpu:
                    shares.append(CpuShare.from_json(cpu))
    return worse(*shares)


def series(ranks: dict, arm: str, stage: str | None = None, how=max) -> list[float]:
    """One launch's per-step figure: per step index, ``how`` (the slowest rank by default) of
    the ranks' wall time (or ``stage`` time)."""
    per = []
    for r in ranks.values():
        src = _source(_arm(r, arm), stage)
        per.append(src["samples"] if src else [])
    n = min(len(x) for x in per)
    return [how(x[i] for x in per) for i in range(n)]


DDP_STAGES = ("forward", "loss", "loss_backward", "backward", "optimizer")


def synchronous(ranks, arm: str, stage: str | None = None) -> Stat:
    """Per step, the slowest rank's wall time (or ``stage`` time), pooled over launches."""
    return Stat.from_samples([v for launch in _launch_list(ranks)
                              for v in series(launch, arm, stage)]).with_cpu(
        arm_cpu(ranks, arm))


def _has(launches: list[dict], arm: str, stage: str) -> bool:
    return all(stage in _arm(r, arm)["extra"] or stage in _arm(r, arm)["stages"]
               for ranks in launches for r in ranks.values())


def _ratio_series(a: list[float], b: list[float]) -> list[float]:
    n = min(len(a), len(b))
    return [x / y for x, y in zip(a[:n], b[:n])]


def _comm_per_rank(launches: list[dict], arm: str) -> dict[int, CommRank]:
    out = {}
    for rank in sorted(launches[0]):
        hook, transfer, buckets = [], [], []
        for ranks in launches:
            r = ranks[rank]
            a = _arm(r, arm)
            hook += a["extra"]["comm_total"]["samples"]
            buckets += a["extra"].get("buckets", {}).get("samples", [])
            ar = min(r["allreduce"], key=lambda x: abs(int(x["bytes"]) - int(r["grad_bytes"])))
            transfer += Stat.from_json(ar["seconds"]).samples
        # measured in the launches' steps: their CPU share, which the steps' rows carry (found
        # by a user trial: a contended run's communication rows were not marked)
        cpu = arm_cpu(launches, arm)
        t = Stat.from_samples(transfer).with_cpu(cpu)
        out[rank] = CommRank(rank, Stat.from_samples(hook).with_cpu(cpu), t,
                             Stat.from_samples([h - t.median for h in hook]).with_cpu(cpu),
                             statistics.median(buckets) if buckets else 0.0)
    return out


def summarize(ranks, *, scaling: str, gap: list[str], procs_per_node: int,
              nnodes: int, workers_per_rank: int = 0) -> WorldSummary:
    """One world size's figures from its launch (``{rank: result}``) or launches (a list).
    ``gap`` names the two gap pipelines (slow, fast), or fewer when one failed (then no per-step
    ratio)."""
    launches = _launch_list(ranks)
    r0 = next(iter(launches[0].values()))
    world = r0["world_size"]
    ddp_arm = f"{scaling}/ddp"
    ddp = synchronous(launches, ddp_arm)
    variants = {v: synchronous(launches, f"{scaling}/{v}")
                for v in ("no_sync", "accum_last", "accum_every", "gather", "strong")
                if all(f"{scaling}/{v}" in r["arms"] for ln in launches for r in ln.values())}
    stages = {s: synchronous(launches, ddp_arm, s) for s in DDP_STAGES
              if _has(launches, ddp_arm, s)}
    comm_total = comm_exposed = None
    per_rank: dict[int, CommRank] = {}
    if world > 1 and _has(launches, ddp_arm, "comm_exposed"):
        comm_total = Stat.from_samples([v for ln in launches
                                        for v in series(ln, ddp_arm, "comm_total", min)])
        comm_exposed = Stat.from_samples([v for ln in launches
                                          for v in series(ln, ddp_arm, "comm_exposed", min)])
        per_rank = _comm_per_rank(launches, ddp_arm)
    diffs = []
    for ln in launches:
        a, b = series(ln, ddp_arm), series(ln, f"{scaling}/no_sync")
        diffs += [x - y for x, y in zip(a, b)]
    diff = Stat.from_samples(diffs) if world > 1 and diffs else None
    ar = [(int(a["bytes"]), Stat.from_json(a["seconds"])) for a in r0["allreduce"]]
    grad_ar = min(ar, key=lambda p: abs(p[0] - r0["grad_bytes"]))[1] if world > 1 else None
    exceeds = bool(comm_exposed is not None and grad_ar is not None and
                   comm_exposed.q1 > grad_ar.q3)
    overlap, note = None, ""
    buckets = [c.buckets for c in per_rank.values()]
    if buckets and max(buckets) <= 1:
        overlap, note = 0.0, ("0 by construction: the gradients fit one bucket, whose all-reduce "
                              "starts when backward has ended")
    elif comm_exposed is not None and comm_total is not None and comm_total.median > 0:
        overlap = max(0.0, 1.0 - comm_exposed.median / comm_total.median)
        note = (f"measured: 1 - exposed / total over {max(buckets):g} buckets")
    per_rank_compute = []
    for r in launches[0].values():  # compute only (no_sync): no all-reduce lines the ranks up
        a = _arm(r, f"{scaling}/no_sync")
        per_rank_compute.append(sum(Stat.from_json(a["stages"][s]).median
                                    for s in DDP_STAGES[:-1] if s in a["stages"]))
    spread = ((max(per_rank_compute) - min(per_rank_compute)) /
              (sorted(per_rank_compute)[len(per_rank_compute) // 2] or 1.0))
    gap_steps = {g: synchronous(launches, f"{g}/gap") for g in gap}
    ratio_series: list[list[float]] = []
    ratio = None
    if len(gap) == 2:  # fewer: a gap pipeline failed (no per-step ratio)
        slow, fast = gap
        ratio_series = [_ratio_series(series(ln, f"{slow}/gap"), series(ln, f"{fast}/gap"))
                        for ln in launches]
        ratio = Stat.from_samples([x for rs in ratio_series for x in rs],
                                  unit="ratio").with_cpu(
            arm_cpu(launches, f"{slow}/gap", f"{fast}/gap"))
    gathers = []
    for ln in launches:  # a pipeline whose loss cannot gather has no toggled arm
        if "gather" in variants:
            gathers += _ratio_series(series(ln, f"{scaling}/gather"), series(ln, ddp_arm))
    gather = Stat.from_samples(gathers, unit="ratio") if gathers else None
    step_series = {scaling: [series(ln, ddp_arm) for ln in launches],
                   **{g: [series(ln, f"{g}/gap") for ln in launches] for g in gap}}
    threads_all = r0.get("threads_all")
    thread_effect, thread_steps = None, {}
    if threads_all and len(gap) == 2 and f"{gap[0]}/gap@all-threads" in r0["arms"]:
        slow, fast = gap
        t_ratio = []
        for ln in launches:
            all_r = _ratio_series(series(ln, f"{slow}/gap@all-threads"),
                                  series(ln, f"{fast}/gap@all-threads"))
            eq_r = _ratio_series(series(ln, f"{slow}/gap"), series(ln, f"{fast}/gap"))
            t_ratio += _ratio_series(all_r, eq_r)
        thread_effect = Stat.from_samples(t_ratio, unit="ratio")
    if threads_all and f"{scaling}/ddp@all-threads" in r0["arms"]:
        for name, arm_eq, arm_all in [(scaling, ddp_arm, f"{scaling}/ddp@all-threads"),
                                      *[(g, f"{g}/gap", f"{g}/gap@all-threads") for g in gap]]:
            xs = []
            for ln in launches:
                xs += _ratio_series(series(ln, arm_all), series(ln, arm_eq))
            thread_steps[name] = Stat.from_samples(xs, unit="ratio")
    return WorldSummary(
        world_size=world, procs_per_node=procs_per_node, nnodes=nnodes,
        threads_per_rank=[int(r["threads"]) for r in launches[0].values()],
        backend=r0["backend"], device=r0["device"],
        batch_size=int(_arm(r0, ddp_arm)["batch_size"]),
        strong_batch=int(r0["strong_batch"]), global_batch=int(r0["global_batch"]),
        grad_bytes=int(r0["grad_bytes"]), step=ddp, variants=variants, stages=stages,
        comm_total=comm_total, comm_exposed=comm_exposed, ddp_minus_no_sync=diff,
        allreduce_grad=grad_ar, allreduce=ar, exposed_exceeds_allreduce=exceeds,
        overlap=overlap, overlap_note=note, rank_spread=spread, gap_steps=gap_steps,
        per_step_ratio=ratio, gather_ratio=gather, comm_method=r0.get("comm_method", ""),
        ddp_logging=r0.get("ddp_logging", {}), launches=len(launches),
        workers_per_rank=int(r0.get("workers", workers_per_rank) or 0),
        comm_per_rank=per_rank, ratio_series=ratio_series, step_series=step_series,
        threads_all=threads_all, thread_effect=thread_effect, thread_step_effect=thread_steps)


def efficiencies(worlds: dict[int, WorldSummary]) -> tuple[dict[int, Stat], dict[int, Stat]]:
    """Weak (per-rank batch fixed): T(base)/T(n). Strong (the global batch fixed):
    T_strong(base) * base / (n * T_strong(n)). Relative to the smallest world size run."""
    base = min(worlds)
    weak, strong = {}, {}
    b = worlds[base]
    for w, s in worlds.items():
        if w == base:  # the reference itself: exactly 1
            weak[w] = strong[w] = Stat(1.0, 0.0, 1.0, 1.0, s.step.n, "ratio")
            continue
        weak[w] = b.step.ratio_to(s.step)
        strong[w] = b.variants["strong"].ratio_to(s.variants["strong"]).scaled(base / w, "ratio")
    return weak, strong


def launch_factor(top: list[list[float]], base: list[list[float]]) -> LaunchFactor:
    """Per pair of launches (the i-th at each world size), the ratio of ``top`` (the larger world
    size's per-step figure per launch) over ``base`` step index by step index, pooled; each pair's
    ratio of medians kept apart.
    """
    pairs = min(len(top), len(base))
    if pairs == 0:
        raise ValueError("a launch factor needs at least one launch at each world size")
    xs, by = [], []
    for i in range(pairs):
        xs += _ratio_series(top[i], base[i])
        by.append(statistics.median(top[i]) / statistics.median(base[i]))
    return LaunchFactor(Stat.from_samples(xs, unit="ratio"), by, pairs)


def _step_cpu(world, name: str) -> CpuShare | None:
    """The CPU share of a strategy's step at one world size (its gap arm, else the scaling
    arm's step); None where none was recorded."""
    st = (getattr(world, "gap_steps", None) or {}).get(name) or getattr(world, "step", None)
    return getattr(st, "cpu", None)


def gap_decomposition(worlds: dict[int, WorldSummary], slow: str, fast: str,
                      batch_sizes: dict[str, int]) -> GapDecomposition:
    base, top = min(worlds), max(worlds)
    steps = batch_sizes[fast] / batch_sizes[slow]
    b = worlds[base]
    r_base = b.per_step_ratio
    by_pair: list[float] = []
    factors: dict[str, Stat] = {}
    if top != base:
        f = launch_factor(worlds[top].ratio_series, b.ratio_series)
        factor = f.stat.with_cpu(getattr(worlds[top].per_step_ratio, "cpu", None),
                                 getattr(r_base, "cpu", None))
        by_pair = f.by_pair
        for name, per_launch in worlds[top].step_series.items():
            if name in b.step_series:
                factors[name] = launch_factor(per_launch, b.step_series[name]).stat.with_cpu(
                    _step_cpu(worlds[top], name), _step_cpu(b, name))
    else:
        factor = Stat(1.0, 0.0, 1.0, 1.0, r_base.n, "ratio")
    total = r_base.scaled(steps, "ratio").times(factor)  # always applied, its IQR carried
    return GapDecomposition(slow, fast, dict(batch_sizes), top, base, steps, r_base, factor,
                            within_noise(factor), total, factor_by_pair=by_pair,
                            threads_per_rank=(b.threads_per_rank or [None])[0],
                            thread_effect=b.thread_effect, threads_all=b.threads_all,
                            step_factors=factors)
