"""From the ranks' results to figures: synchronous steps, communication, efficiencies, the gap.

A synchronous DDP step ends when its slowest rank does, so a world size's step time is, per step
index, the maximum over ranks (every rank ran the same steps). Communication is what the comm
hook measured (per step, the worst rank); it is checked against the all-reduce of the gradient
bytes timed directly, and flagged when it exceeds it beyond the noise (a rank waiting for a
slower one, not the network). A factor is "within noise" of 1 when 1 lies inside its IQR.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..measurement.timing import Stat
from ..records import Record


def within_noise(st: Stat, value: float = 1.0) -> bool:
    """True when ``value`` lies inside the figure's interquartile range."""
    return st.q1 <= value <= st.q3


def _arm(rank: dict, name: str) -> dict:
    return rank["arms"][name]


def synchronous(ranks: dict, arm: str, stage: str | None = None) -> Stat:
    """Per step, the slowest rank's wall time (or ``stage`` time)."""
    series = []
    for r in ranks.values():
        a = _arm(r, arm)
        src = a["step"] if stage is None else (a["stages"].get(stage) or a["extra"].get(stage))
        series.append(src["samples"] if src else [])
    n = min(len(s) for s in series)
    return Stat.from_samples([max(s[i] for s in series) for i in range(n)])


def _has(ranks: dict, arm: str, stage: str) -> bool:
    return all(stage in _arm(r, arm)["extra"] or stage in _arm(r, arm)["stages"]
               for r in ranks.values())


@dataclass
class WorldSummary(Record):
    world_size: int
    procs_per_node: int
    nnodes: int
    threads_per_rank: list[int]
    backend: str
    device: str
    batch_size: int
    strong_batch: int
    global_batch: int
    grad_bytes: int
    step: Stat  # the ddp variant
    variants: dict[str, Stat]  # no_sync, accum_last, accum_every, gather, strong
    stages: dict[str, Stat]  # forward, backward, optimizer of the ddp variant
    comm_total: Stat | None
    comm_exposed: Stat | None
    ddp_minus_no_sync: Stat | None  # paired difference, for comparison with the hook
    allreduce_grad: Stat | None
    allreduce: list[tuple[int, Stat]] = field(default_factory=list)
    exposed_exceeds_allreduce: bool = False
    overlap: float | None = None
    rank_spread: float = 0.0
    gap_steps: dict[str, Stat] = field(default_factory=dict)
    per_step_ratio: Stat | None = None  # slow / fast, paired by round
    gather_ratio: Stat | None = None  # toggled all-gather / configured, paired
    comm_method: str = ""
    ddp_logging: dict = field(default_factory=dict)


def summarize(ranks: dict, *, scaling: str, gap: list[str], procs_per_node: int,
              nnodes: int) -> WorldSummary:
    r0 = next(iter(ranks.values()))
    world = r0["world_size"]
    ddp = synchronous(ranks, f"{scaling}/ddp")
    variants = {v: synchronous(ranks, f"{scaling}/{v}")
                for v in ("no_sync", "accum_last", "accum_every", "gather", "strong")}
    stages = {s: synchronous(ranks, f"{scaling}/ddp", s) for s in ("forward", "backward",
                                                                   "optimizer")}
    comm_total = comm_exposed = None
    if world > 1 and _has(ranks, f"{scaling}/ddp", "comm_exposed"):
        comm_total = synchronous(ranks, f"{scaling}/ddp", "comm_total")
        comm_exposed = synchronous(ranks, f"{scaling}/ddp", "comm_exposed")
    n = min(ddp.n, variants["no_sync"].n)
    diff = Stat.from_samples([a - b for a, b in zip(ddp.samples[:n],
                                                    variants["no_sync"].samples[:n])]) \
        if world > 1 else None
    ar = [(int(a["bytes"]), Stat.from_json(a["seconds"])) for a in r0["allreduce"]]
    grad_ar = min(ar, key=lambda p: abs(p[0] - r0["grad_bytes"]))[1] if world > 1 else None
    exceeds = bool(comm_exposed is not None and grad_ar is not None and
                   comm_exposed.q1 > grad_ar.q3)
    overlap = None
    if comm_exposed is not None and comm_total is not None and comm_total.median > 0:
        overlap = max(0.0, 1.0 - comm_exposed.median / comm_total.median)
    per_rank = []
    for r in ranks.values():  # compute only (no_sync): no all-reduce lines the ranks up
        a = _arm(r, f"{scaling}/no_sync")
        per_rank.append(sum(Stat.from_json(a["stages"][s]).median
                            for s in ("forward", "backward") if s in a["stages"]))
    spread = (max(per_rank) - min(per_rank)) / (sorted(per_rank)[len(per_rank) // 2] or 1.0)
    gap_steps = {g: synchronous(ranks, f"{g}/gap") for g in gap}
    slow, fast = gap
    m = min(gap_steps[slow].n, gap_steps[fast].n)
    ratio = Stat.from_samples([a / b for a, b in zip(gap_steps[slow].samples[:m],
                                                     gap_steps[fast].samples[:m])], unit="ratio")
    k = min(ddp.n, variants["gather"].n)
    gather = Stat.from_samples([a / b for a, b in zip(variants["gather"].samples[:k],
                                                      ddp.samples[:k])], unit="ratio")
    return WorldSummary(
        world_size=world, procs_per_node=procs_per_node, nnodes=nnodes,
        threads_per_rank=[int(r["threads"]) for r in ranks.values()],
        backend=r0["backend"], device=r0["device"],
        batch_size=int(_arm(r0, f"{scaling}/ddp")["batch_size"]),
        strong_batch=int(r0["strong_batch"]), global_batch=int(r0["global_batch"]),
        grad_bytes=int(r0["grad_bytes"]), step=ddp, variants=variants, stages=stages,
        comm_total=comm_total, comm_exposed=comm_exposed, ddp_minus_no_sync=diff,
        allreduce_grad=grad_ar, allreduce=ar, exposed_exceeds_allreduce=exceeds,
        overlap=overlap, rank_spread=spread, gap_steps=gap_steps, per_step_ratio=ratio,
        gather_ratio=gather, comm_method=r0.get("comm_method", ""),
        ddp_logging=r0.get("ddp_logging", {}))


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


@dataclass
class GapDecomposition(Record):
    """Epoch-time ratio slow/fast = steps-per-epoch ratio x per-step ratio x DDP factor."""

    slow: str
    fast: str
    batch_sizes: dict[str, int]
    world_size: int  # the largest world size measured
    base_world_size: int
    steps_ratio: float  # arithmetic: samples per step
    per_step_ratio: Stat  # measured at base_world_size, paired by round
    ddp_factor: Stat  # measured: per-step ratio at world_size over at base
    ddp_within_noise: bool  # 1 inside its IQR: "no measurable DDP overhead"
    total: Stat
    measured: list[str] = field(default_factory=lambda: ["per-step ratio", "DDP factor"])
    arithmetic: list[str] = field(default_factory=lambda: ["steps per epoch"])


def gap_decomposition(worlds: dict[int, WorldSummary], slow: str, fast: str,
                      batch_sizes: dict[str, int]) -> GapDecomposition:
    base, top = min(worlds), max(worlds)
    steps = batch_sizes[fast] / batch_sizes[slow]
    r_base = worlds[base].per_step_ratio
    if top != base:
        factor = worlds[top].per_step_ratio.ratio_to(r_base)
    else:
        factor = Stat(1.0, 0.0, 1.0, 1.0, r_base.n, "ratio")
    total = r_base.scaled(steps, "ratio")
    if not within_noise(factor):  # within noise: "no measurable DDP overhead", not a factor
        total = total.times(factor)
    return GapDecomposition(slow, fast, dict(batch_sizes), top, base, steps, r_base, factor,
                            within_noise(factor), total)
