"""Notebook 04's results (``04_ddp_scaling.json``): the launch plan
(:mod:`workbook_lib.distributed.plan`), each world size's summary and the gap's decomposition
(:mod:`workbook_lib.studies.ddp.summary`), the ring all-reduce fit
(:mod:`workbook_lib.studies.ddp.allreduce_model`); measured by
:mod:`workbook_lib.studies.ddp`."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..failures import PipelineFailure
from .stat import Stat
from ..records import Record


@dataclass
class Launch(Record):
    world_size: int
    nnodes: int
    procs_per_node: int
    threads_per_rank: int  # intra-op threads of every rank (the same at every world size)
    workers_per_rank: int = 0  # DataLoader workers of every rank (the same at every world size)
    threads_all: int | None = None  # the thread-effect arms' threads (smallest world size only)


@dataclass
class Plan(Record):
    backend: str
    device_type: str
    capacity_per_node: int
    capacity_source: str
    nnodes: int
    launches: list[Launch] = field(default_factory=list)
    cpus: int = 1
    cpus_source: str = ""
    skipped: dict[int, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class RingFit(Record):
    bandwidth_gbps: float
    latency_us: float
    world_sizes: list[int]
    points: int
    median_abs_rel_error: float  # in-sample
    source: str = "fitted on all-reduces timed here"
    notes: list[str] = field(default_factory=list)

    def link(self) -> dict:
        return {"bandwidth_gbps": self.bandwidth_gbps, "latency_us": self.latency_us}


LAUNCH_PAIRED = ("ratio of separate launches, alternated (1, 2, 1, 2...): per step index within "
                 "each pair of adjacent launches, pooled over the pairs")


@dataclass
class CommRank(Record):
    """One rank's communication per step (see the module docstring)."""

    rank: int
    hook: Stat  # the comm hook: buckets' ready -> all-reduce finished, summed
    transfer: Stat  # the all-reduce of the gradient bytes, timed after a barrier
    wait: Stat  # hook - the transfer's median: waiting for slower ranks
    buckets: float


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
    comm_total: Stat | None  # per step, the rank that waited least (closest to the transfer)
    comm_exposed: Stat | None  # the same rank's time from compute done to all-reduce done
    ddp_minus_no_sync: Stat | None  # paired difference, for comparison with the hook
    allreduce_grad: Stat | None
    allreduce: list[tuple[int, Stat]] = field(default_factory=list)
    exposed_exceeds_allreduce: bool = False
    overlap: float | None = None
    overlap_note: str = ""
    rank_spread: float = 0.0
    gap_steps: dict[str, Stat] = field(default_factory=dict)
    per_step_ratio: Stat | None = None  # slow / fast, paired by round
    gather_ratio: Stat | None = None  # toggled all-gather / configured, paired
    comm_method: str = ""
    ddp_logging: dict = field(default_factory=dict)
    launches: int = 1
    workers_per_rank: int = 0
    comm_per_rank: dict[int, CommRank] = field(default_factory=dict)
    # per launch, per step: the per-step ratio and each strategy's synchronous step
    ratio_series: list[list[float]] = field(default_factory=list)
    step_series: dict[str, list[list[float]]] = field(default_factory=dict)
    threads_all: int | None = None
    thread_effect: Stat | None = None  # per-step ratio with all threads / at equal threads
    thread_step_effect: dict[str, Stat] = field(default_factory=dict)  # step, all / equal


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
    ddp_factor: Stat  # measured: per-step ratio at world_size over at base (separate launches)
    ddp_within_noise: bool  # descriptive only: 1 inside the factor's IQR (it is applied anyway)
    total: Stat  # steps ratio x per-step ratio x DDP factor, the IQRs combined
    measured: list[str] = field(default_factory=lambda: ["per-step ratio", "DDP factor"])
    arithmetic: list[str] = field(default_factory=lambda: ["steps per epoch"])
    factor_by_pair: list[float] = field(default_factory=list)
    factor_method: str = LAUNCH_PAIRED
    threads_per_rank: int | None = None
    thread_effect: Stat | None = None  # at base: per-step ratio, all threads / equal threads
    threads_all: int | None = None
    # each strategy's own step factor (step at world_size / at base, weak scaling)
    step_factors: dict[str, Stat] = field(default_factory=dict)


@dataclass
class Prediction(Record):
    world_size: int
    comm_s: float  # all-reduce of one step's gradients, predicted
    step_s: float
    measured_s: float | None
    extrapolated: bool


@dataclass
class DDPResult(Record):
    plan: Plan
    scaling_strategy: str
    gap_strategies: list[str]
    worlds: dict[int, WorldSummary]
    weak: dict[int, Stat]
    strong: dict[int, Stat]
    ring: RingFit | None
    link: dict
    link_source: str
    predictions: list[Prediction]
    presets: dict[str, dict[int, float]]  # link -> world size -> comm seconds of the gradients
    gap: GapDecomposition | None  # None: a gap pipeline failed (see failures)
    ratio_03: Stat | None = None  # notebook 03's per-step ratio of the same two strategies
    agrees_with_03: bool | None = None
    logs: dict[str, str] = field(default_factory=dict)  # launch name -> folder (relative)
    # pipeline -> why its DDP arms are missing (a rank raised or stalled in it), or why they are
    # marked (a loss that is not finite: ``figures_kept``)
    failures: dict[str, PipelineFailure] = field(default_factory=dict)

    def log_files(self, run_dir: Path) -> list[str]:
        """Every file of the launches (torchrun log, rank logs and results), relative."""
        return [f"{d}/{f.name}" for d in self.logs.values()
                for f in sorted((Path(run_dir) / d).glob("*")) if f.is_file()]


@dataclass
class LaunchFactor(Record):
    """A figure at the largest world size over the same at the smallest, from separate launches
    (see the module docstring)."""

    stat: Stat
    by_pair: list[float]  # each pair of adjacent launches' ratio of medians
    pairs: int
    method: str = LAUNCH_PAIRED
