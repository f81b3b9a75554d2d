"""Notebook 03's results (``03_data_vs_model_timing.json``): every arm of the training loop (an
:class:`ArmResult` per pipeline and mode, timed by :mod:`workbook_lib.training.loop`), what bounds
each step (its stages: :mod:`workbook_lib.studies.timing.stages`), host syncs, profiles and the figures
the notebook reports; measured by :mod:`workbook_lib.studies.timing`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..failures import PipelineFailure
from .profile import ProfileResult
from .stat import Stat
from ..records import Record


MODES = ("data", "forward", "forward_backward", "full")
WORKER_STAGES = ("worker_fetch", "worker_collate")
GC_PAUSE = "gc_pause"  # an extra figure: a step's seconds in Python's garbage collector

# what bounds a step: the stage groups and the rule (studies.timing.stages)
GROUPS = ("data", "transfer", "device prep", "model", "loop overhead")


BOUND_WORDS = {"data": "data-bound", "transfer": "transfer-bound",
               "device prep": "preparation-bound", "model": "model-bound",
               "loop overhead": "overhead-bound"}


BOUND_RULE = ("the stage group (data: item + collate; transfer; device prep; model: forward, "
              "loss, backward and optimizer; loop overhead) with the largest share of the full step's "
              "median; sync-bound on a GPU when the device prep, forward and backward make at "
              "least one host sync per sample: more syncs for each extra sample where the step "
              "was also run at a second batch size, else the step's syncs over its batch")


MAIN_STAGES = ("loader_wait", "h2d", "device_prep", "forward", "loss", "loss_backward", "backward",
               "optimizer")

MODEL_STAGES = ("forward", "loss", "loss_backward", "backward", "optimizer")


@dataclass
class ArmResult(Record):
    """The timed steps of one arm: wall time per optimizer step, per stage, syncs."""

    name: str
    strategy: str
    variant: str
    mode: str
    batch_size: int
    micro_batches: int
    step: Stat
    stages: dict[str, Stat] = field(default_factory=dict)
    extra: dict[str, Stat] = field(default_factory=dict)  # worker stages, hook figures
    syncs_per_step: float | None = None
    sync_kinds: dict[str, float] = field(default_factory=dict)
    syncs_by_stage: dict[str, float] = field(default_factory=dict)  # stage -> syncs it made
    ops_by_stage: dict[str, float] = field(default_factory=dict)  # stage -> aten operator calls
    warmup_steps: int = 0
    timed_steps: int = 0
    stopped_by: str = ""
    # what the counted step's batch held: tensors, tensor_bytes, objects, kinds (the transfer
    # stage walks all of it; see measurement.syncs.batch_contents)
    batch_contents: dict = field(default_factory=dict)
    # steps whose loss was NaN or infinite (their timings are of a diverged step), the first of
    # them (0 = the arm's first step, warm-up included), what it was, and the steps checked
    nonfinite_steps: int = 0
    first_nonfinite_step: int | None = None
    nonfinite_value: str = ""
    loss_steps: int = 0
    # why the loss's backward is inside the backward stage ("" when it is timed on its own)
    loss_split: str = ""

    @property
    def samples_per_step(self) -> int:
        return self.batch_size * self.micro_batches

    @property
    def ms_per_sample(self) -> Stat:
        return self.step.scaled(1e3 / self.samples_per_step, "ms/sample")

    @property
    def it_per_s(self) -> Stat:
        return self.step.inverse("it/s")

    @property
    def untracked(self) -> Stat:
        """Wall time not inside any stage (loop overhead, zero_grad, hooks)."""
        parts = [self.stages[s].samples for s in MAIN_STAGES if s in self.stages]
        return Stat.from_samples([w - sum(p[i] for p in parts)
                                  for i, w in enumerate(self.step.samples)]).with_cpu(
            self.step.cpu)


# stage key -> (words for tables and causes, group)
STAGES = {
    "data_item": ("data item (the dataset's __getitem__, DataLoader worker)", "data"),
    "collate": ("collate (the DataLoader's collate_fn)", "data"),
    "h2d": ("host-to-device transfer of the batch", "transfer"),
    "device_prep": ("device preparation (the pipeline's prepare)", "device prep"),
    "forward": ("forward (the model's)", "model"),
    "loss": ("loss (its forward and its backward)", "model"),
    "backward": ("backward (the model's)", "model"),
    "optimizer": ("optimizer (step and zero_grad)", "model"),
    "overhead": ("loop overhead (Python between stages)", "loop overhead"),
}


@dataclass
class StepBound(Record):
    """What bounds one pipeline's full step (:data:`BOUND_RULE`)."""

    pipeline: str
    bound: str  # data-bound, model-bound, ...
    group_shares: dict[str, float]  # group -> share of the step median
    largest_stage: str  # stage key of the largest single stage
    largest_share: float
    step_s: float
    batch_size: int
    syncs_per_step: float | None = None
    sync_bound_on_gpu: bool = False
    stage_shares: dict[str, float] = field(default_factory=dict)
    # more host syncs for each extra sample (device prep, forward, backward; two batch sizes),
    # None where not measured: then the rule reads syncs_per_step / batch_size
    syncs_per_extra_sample: float | None = None

    def stage_words(self, of_step: str = "") -> str:
        """``data item 78%``: the largest stage where its group bounds the step; else the
        bounding group's share first, then the largest stage (a user trial read "model-bound
        (collate 40%)" as a contradiction: the model stages together held more)."""
        name = STAGES[self.largest_stage][0].split(' (')[0]
        group = next(g for g, w in BOUND_WORDS.items() if w == self.bound)
        if STAGES[self.largest_stage][1] == group:
            return f"{name} {self.largest_share:.0%}{of_step}"
        return (f"{group} stages {self.group_shares[group]:.0%}{of_step}; largest stage "
                f"{name} {self.largest_share:.0%}")

    @property
    def summary(self) -> str:
        """``data-bound (data item 78% of the step)``, with the syncs when they bound a GPU."""
        s = f"{self.bound} ({self.stage_words(' of the step')})"
        if self.sync_bound_on_gpu:
            s += (f"; sync-bound on a GPU ({self.syncs_per_step:.0f} host syncs per step, "
                  + (f"{self.syncs_per_extra_sample:.2g} more for each extra sample)"
                     if self.syncs_per_extra_sample is not None else
                     f"{self.syncs_per_step / self.batch_size:.2g} per sample)"))
        return s


@dataclass
class StoredReads(Record):
    """Reading stored masks per item, cold (the file's pages dropped from the page cache
    first) and warm (read again right after), paired by round."""

    items: int
    bytes_per_item: int
    file_bytes: int
    cold_ms: Stat  # per item
    warm_ms: Stat
    cold_over_warm: Stat
    dropped: bool  # posix_fadvise was available (the kernel may still keep pages, e.g. tmpfs)


PIPELINED = "pipelined"  # the full step without per-stage syncs


def arm_key(strategy: str, mode: str) -> str:
    return f"{strategy}/{mode}"


HALF = "half"  # the full step at a second batch size (how each stage grows with samples)


@dataclass
class Growth(Record):
    """How one stage's cost grows with the samples of a batch: the pipeline's full step at its
    batch size and at a second one, interleaved (paired by round)."""

    stage: str
    batch_sizes: tuple[int, int]  # (the pipeline's, the second)
    per_sample: Stat  # seconds per extra sample (per round: difference / difference in samples)
    at_batch: Stat  # seconds per step at the pipeline's batch size
    share: float  # per_sample x batch size / at_batch: the part of the stage that is per sample
    ops_per_sample: float | None = None  # aten operator calls per extra sample (counted steps)
    syncs_per_sample: float | None = None  # host syncs per extra sample (counted steps)
    grows: bool = False  # GROWS_RULE

    @property
    def share_words(self) -> str:
        """The per-sample share in words: "all" at 100% or more (the line through the two batch
        sizes meets zero at or below no samples: within its noise, all of it is per sample);
        "0% or less" at 0 or below (a user trial read "-0% of the stage"; its per-sample figure
        beside it says how noisy); "under 1%" where a whole percent would read 0%."""
        if self.share >= 1.0:
            return "all"
        if self.share <= 0:
            return "0% or less"
        text = f"{self.share:.0%}"
        return "under 1%" if text == "0%" else text

    @property
    def python_loop(self) -> bool:
        """Operator calls that grow with the samples: a loop over them (LOOP_RULE; counted,
        not timed)."""
        return self.ops_per_sample is not None and self.ops_per_sample >= LOOP_OPS


GROWS_SHARE = 0.5
GROWS_RULE = ("the stage grows with the samples of a batch when its cost per extra sample "
              "(full steps at two batch sizes, paired by round) is above 0 beyond its noise (the "
              "95% confidence interval of its median) and, times the batch size, at least "
              f"{GROWS_SHARE:.0%} of the stage's time")
LOOP_OPS = 4.0
LOOP_RULE = (f"a loop over the samples: at least {LOOP_OPS:g} more operator calls for every "
             "extra sample of a batch (counted in one step at each batch size; one pass over "
             "the batch makes the same calls whatever its size)")


@dataclass
class EncoderFigures(Record):
    """A pipeline's encoder (its ``shared_encoder``) on B masked copies against its conversion
    (:func:`workbook_lib.nodemask.convert`), forward + backward on the same batches,
    interleaved; and the conversion's floor. ``blocked``: why the encoder does not convert
    (the conversion's one line), with no figures."""

    batch_size: int = 0
    masked_copies: Stat | None = None  # seconds per batch: the encoder on B masked copies
    converted: Stat | None = None  # seconds per batch: the converted encoder
    ratio: Stat | None = None  # masked copies / converted, paired by round
    max_rel_error: float | None = None  # converted against masked copies, outputs
    floor_sparse_macs: float = 0.0  # per sample, forward + backward
    floor_dense_macs: float = 0.0
    all_changed_from: str | None = None  # the first layer at which every gene has changed
    all_changed_macs: float = 0.0  # per sample, from that layer on
    explain: str = ""  # the conversion's explain(): form and changed rows per layer and type
    num_genes: int = 0
    blocked: str = ""
    runs_converted: bool = False  # the pipeline's forward runs this encoder converted already


@dataclass
class OptimizerShape(Record):
    """What a pipeline's optimizer steps over, as configured (03 reads it once, not timed)."""

    kind: str  # its class name ("Adam"); "" where the pipeline configured none
    tensors: int  # parameter tensors it steps
    elements: int  # their elements
    foreach: bool | None = None  # as set in its first parameter group (None: torch's default)
    fused: bool | None = None


@dataclass
class LoopStudy(Record):
    """Every (strategy, mode) arm of the loop."""

    device: str
    sizes: str
    strategies: list[str]  # every pipeline compared: built-in strategies, then the user's
    batch_sizes: dict[str, int]
    interleaved: bool
    settings: dict[str, Any]
    arms: dict[str, ArmResult] = field(default_factory=dict)
    # pipeline -> declared exact (True), declared not (False) or not stated (None)
    exact: dict[str, bool | None] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)  # pipeline -> name for tables
    # pipeline -> seconds of its shared pass (``shared_forward``: the part of the forward every
    # sample of a batch shares, e.g. the dual forward's wildtype pass), forward only, no grad
    shared_pass: dict[str, Stat] = field(default_factory=dict)
    # pipeline -> why it has no figures here (it raised or stalled: not in ``strategies``), or
    # why its figures are marked (a loss that is not finite: ``figures_kept``, still compared)
    failures: dict[str, PipelineFailure] = field(default_factory=dict)
    # pipeline -> stage -> how it grows with the samples of a batch (the gap's pair only)
    growth: dict[str, dict[str, Growth]] = field(default_factory=dict)
    # pipeline -> why its growth was not measured ("" or absent when it was)
    growth_note: dict[str, str] = field(default_factory=dict)
    # pipeline -> its encoder against its conversion (pipelines with ``shared_encoder`` only)
    encoders: dict[str, EncoderFigures] = field(default_factory=dict)
    # pipeline -> what its optimizer steps over (a slow optimizer stage's figure: its tensors)
    optimizers: dict[str, OptimizerShape] = field(default_factory=dict)
    num_genes: int | None = None  # the graph's (an operand [B, N, N]: a graph per sample)

    def arm(self, strategy: str, mode: str = "full") -> ArmResult:
        return self.arms[arm_key(strategy, mode)]

    def arms_of(self, strategy: str) -> list[ArmResult]:
        """The pipeline's arms, every mode (by their keys, :func:`arm_key`)."""
        return [a for key, a in self.arms.items() if key.rsplit("/", 1)[0] == strategy]

    def gc_pauses(self, strategy: str) -> tuple[float, float, int] | None:
        """Over every timed step of the pipeline's arms (every mode): the share of their summed
        wall time in which Python's garbage collector ran (inside whichever stages it
        interrupted), the most it ran in one step (seconds) and the steps; None where no arm
        recorded it (a results file from before the figure)."""
        pauses, walls = [], []
        for a in self.arms_of(strategy):
            st = a.extra.get(GC_PAUSE)
            if st is not None:
                pauses += st.samples
                walls += a.step.samples[:len(st.samples)]
        if not pauses or sum(walls) <= 0:
            return None
        return sum(pauses) / sum(walls), max(pauses), len(pauses)

    def worker_gc(self, strategy: str) -> tuple[float, float, int] | None:
        """Over every timed step of the pipeline's arms (every mode): the share of its data
        items' and collates' summed time in which Python's garbage collector ran inside them,
        where they ran (a DataLoader worker's collections, which :meth:`gc_pauses` never sees),
        the most in one step (seconds) and the steps; None where no arm recorded it."""
        pauses, spent = [], 0.0
        for a in self.arms_of(strategy):
            gf, gcl = (a.extra.get(f"{GC_PAUSE}:{s}") for s in WORKER_STAGES)
            if gf is None or gcl is None:
                continue
            pauses += [x + y for x, y in zip(gf.samples, gcl.samples)]
            spent += sum(sum(a.extra[s].samples) for s in WORKER_STAGES if s in a.extra)
        if not pauses or spent <= 0:
            return None
        return sum(pauses) / spent, max(pauses), len(pauses)

    @property
    def loader_workers(self) -> int:
        """The DataLoader worker processes of each pipeline (0: items and collates ran in the
        step's own process)."""
        return int(self.settings.get("num_workers", 0) or 0)

    def ratio(self, a: ArmResult, b: ArmResult) -> Stat:
        """``a.step / b.step``: paired by round when the arms were interleaved."""
        if self.interleaved:
            n = min(a.step.n, b.step.n)
            return Stat.from_samples([x / y for x, y in zip(a.step.samples[:n],
                                                            b.step.samples[:n])],
                                     unit="ratio").with_cpu(a.step.cpu, b.step.cpu)
        return a.step.ratio_to(b.step)

    def pipelined(self, strategy: str) -> tuple[Stat, Stat, Stat] | None:
        """(full step with every stage synchronized and recorded, the same step as a plain
        loop runs it, timed as one, their difference paired by round): what the stage
        attribution's syncs and records cost. None when the study has no pipelined arm."""
        key = arm_key(strategy, PIPELINED)
        if key not in self.arms:
            return None
        a, b = self.arm(strategy, "full"), self.arms[key]
        n = min(a.step.n, b.step.n)
        diff = Stat.from_samples([x - y for x, y in zip(a.step.samples[:n],
                                                       b.step.samples[:n])]).with_cpu(a.step.cpu,
                                                                                      b.step.cpu)
        return a.step, b.step, diff

    def model_seconds(self, strategy: str) -> Stat:
        """Forward, loss, backward and optimizer of the full step (the model's share, no
        data)."""
        a = self.arm(strategy, "full")
        parts = [a.stages[s].samples for s in MODEL_STAGES if s in a.stages]
        return Stat.from_samples([sum(p[i] for p in parts)
                                  for i in range(a.step.n)]).with_cpu(a.step.cpu)


@dataclass
class SanityFlag(Record):
    """A mode that took longer than a mode that does strictly more work, beyond noise."""

    strategy: str
    lower: str
    upper: str
    lower_ms: float
    upper_ms: float


@dataclass
class ReportedFigure(Record):
    """One of the investigation's data-vs-model figures, re-measured here."""

    key: str
    figure: str
    claimed: float
    measured: Stat
    unit: str
    names: tuple[str, str] = ("Lazy", "DANGO")  # (slow, fast) as the figure names them


@dataclass
class SyncPoint(Record):
    """Syncs of the loop-form device mask generation at one (B, k, T)."""

    batch_size: int
    k: int
    edge_types: int
    counted: int
    expected: int  # from the loop's structure: one per gene slot, two per gene and edge type


@dataclass
class SyncStudy(Record):
    method: str
    per_step: dict[str, float]  # strategy -> syncs per full step (the loop's counted step)
    kinds: dict[str, dict[str, float]]
    scaling: list[SyncPoint] = field(default_factory=list)


@dataclass
class TimingResult(Record):
    """Notebook 03's results."""

    loops: LoopStudy
    sanity: list[SanityFlag]
    reported: list[ReportedFigure]
    epochs_per_day_1rank: dict[str, float]
    syncs: SyncStudy
    profiles: dict[str, ProfileResult]
    fastest_exact: str | None
    stored_reads: StoredReads | None = None  # strategy 3's reads, cold and warm
    bounds: dict[str, StepBound] = field(default_factory=dict)  # what bounds each step

    def figure(self, key: str) -> ReportedFigure | None:
        return next((f for f in self.reported if f.key == key), None)
