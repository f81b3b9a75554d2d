"""The full-size benchmark's results (``python -m workbook_lib bench``, and its figures quoted by
notebooks 02 and 05): per-sample figures, the kernels' rates, the replicated strategy's fit and
the fix's floor of work; measured by :mod:`workbook_lib.studies.mask_cost.bench`."""
from __future__ import annotations

from dataclasses import dataclass, field

from .stat import Stat
from .floor import ConvertFloor, FloorPart
from .parts import PartRow, StepParts
from ..records import Record


@dataclass
class PerSample(Record):
    """Seconds per sample of one variant (its step divided by its batch size)."""

    median: float
    iqr: float
    n: int
    batch_size: int
    label: str = ""
    batch_reason: str = ""


@dataclass
class KernelFigure(Record):
    name: str
    description: str
    seconds: Stat
    gmacs: float  # multiply-adds per second, 1e9
    used_by_step: bool = False  # the kernel the shared step uses on this device


@dataclass
class RateFigure(Record):
    """Achieved multiply-add rate of one kind of product inside one profiled step."""

    variant: str
    kind: str  # "sparse" or "dense"
    macs: float  # the multiply-adds whose time is `seconds` (the rate's)
    seconds: float  # time inside those products (profiler, CPU time; device time on CUDA)
    step_seconds: float  # the profiled step's wall time
    gmacs: float
    machine_gmacs: float | None  # this machine's best measured rate for that kind
    machine_source: str = ""
    inside_macs: float = 0.0  # dense multiply-adds done inside a sparse kernel (timed with it)

    @property
    def step_macs(self) -> float:
        """All the step's multiply-adds of this kind (those done inside another kind's kernel
        too): what is compared with the floor."""
        return self.macs + self.inside_macs


@dataclass
class ReplicatedFit(Record):
    """A replicated form's per-sample cost: measured at the shared form's batch ``at_batch``
    when it ran there, else **measured at the largest batch that ran** (``quoted_batch``), never
    a projection; the projection from B = 1, 2 to ``at_batch`` is kept beside it, with its error
    at the largest batch measured (``check_batch``)."""

    step_b1: Stat
    step_b2: Stat | None
    at_batch: int
    per_sample: Stat  # the figure quoted: measured at quoted_batch
    measured: bool = False  # per_sample was timed at at_batch itself
    projected: Stat | None = None  # per round (t1 (2 - B) + t2 (B - 1)) / B at at_batch
    check_batch: int | None = None  # the largest batch timed beyond 2
    check_step: Stat | None = None  # its step
    projection_error: Stat | None = None  # projected / measured per sample at check_batch
    rule: str = ""  # why this batch (the memory estimate, the budget, the cap)
    quoted_batch: int | None = None  # the batch per_sample was measured at
    at_least: bool = False  # per-sample cost rose from B = 2 to quoted_batch
    rising_over: list[int] = field(default_factory=list)  # [2, quoted_batch] when it did
    projected_ratio: Stat | None = None  # the projection / the shared form, per sample

    @property
    def basis(self) -> str:
        """What the per-sample figure is, in words for labels (never "same batch" unless it
        was timed at the shared form's batch)."""
        if self.measured:
            return f"measured at B = {self.at_batch} (the shared form's batch)"
        q = self.quoted_batch or 1
        out = f"measured at B = {q}, the largest batch that ran ({self.rule})"
        if self.at_least:
            lo, hi = self.rising_over
            out += (f"; its per-sample cost rose from B = {lo} to B = {hi}: at B = "
                    f"{self.at_batch} it is taken to be at least this")
        return out

    @property
    def short_basis(self) -> str:
        """``measured at B = 8`` or ``measured at the same batch, B = 28``."""
        if self.measured:
            return f"measured at the same batch, B = {self.at_batch}"
        return f"measured at B = {self.quoted_batch or 1}"

    @property
    def error_text(self) -> str:
        """The projection's error at the largest measured batch, or why there is none."""
        if self.projection_error is None:
            return "no batch beyond 2 measured: the projection's error is unknown"
        e = self.projection_error
        return (f"the projection from B = 1, 2 is {e.median:.2f}x the measurement at "
                f"B = {self.check_batch} (IQR {e.iqr:.2g}, n={e.n})")

    @property
    def projection_text(self) -> str:
        """The projection to the shared form's batch, labelled as one, with its error."""
        if self.projected is None:
            return "no projection (B = 2 did not run)"
        if self.projected.median <= 0:
            return ("the line through B = 1, 2 gives no positive time (B = 2's step was not "
                    "slower than B = 1's): the projection is noise, not a figure")
        ratio = (f", {self.projected_ratio.median:.3g}x the shared form"
                 if self.projected_ratio is not None else "")
        return (f"projected from B = 1, 2 to B = {self.at_batch}: "
                f"{self.projected.median * 1e3:.3g} ms per sample{ratio}; {self.error_text}")


@dataclass
class FloorFigure(Record):
    """The floor of an exact sample (:mod:`workbook_lib.nodemask.floor`, from the benchmark
    batch's own perturbations) beside the shared step's measured counts, per sample."""

    batch_size: int
    sparse_macs: float
    dense_macs: float
    bytes: float
    parts: dict[str, FloorPart] = field(default_factory=dict)  # per batch
    measured_sparse_macs: float | None = None  # the profiled step's, per sample
    measured_dense_macs: float | None = None
    seconds_at_machine: float | None = None  # the floor's products at the machine's best rates
    seconds_at_step_rates: float | None = None  # at the rates the step's products achieved
    measured_seconds: float | None = None  # the exact sample as timed (median)
    rates_source: str = ""

    def ratio(self, kind: str) -> float | None:
        """Measured / floor multiply-adds per sample for ``sparse`` or ``dense``."""
        if kind not in ("sparse", "dense"):
            raise ValueError(f"'kind' must be sparse or dense (got {kind!r})")
        got = getattr(self, f"measured_{kind}_macs")
        want = getattr(self, f"{kind}_macs")
        return None if got is None or not want else got / want

    def lines(self) -> list[str]:
        """The floor and the step's counts in words (the CLI and the report print them)."""
        out = []
        for kind in ("sparse", "dense"):
            f, m, r = getattr(self, f"{kind}_macs"), getattr(self, f"measured_{kind}_macs"), \
                self.ratio(kind)
            out.append(f"{kind}: {f / 1e6:.1f}M multiply-adds per exact sample at the floor"
                       + (f", the step {m / 1e6:.1f}M: **{r:.2f}x its floor**" if r else
                          ", the step's count not measured"))
        out.append(f"bytes at the floor: {self.bytes / 1e6:.1f} MB per sample (each product's "
                   "operands read once, its result written once)")
        if self.seconds_at_machine is not None:
            t = (f"the floor's products would take {self.seconds_at_machine * 1e3:.3g} ms per "
                 f"sample at this machine's best measured rates ({self.rates_source})")
            if self.seconds_at_step_rates is not None:
                t += f", {self.seconds_at_step_rates * 1e3:.3g} ms at the rates the step achieved"
            if self.measured_seconds is not None:
                t += f"; the exact sample measured {self.measured_seconds * 1e3:.3g} ms"
            out.append(t)
        return out


@dataclass
class ConvertBench(Record):
    """The benchmark's convert section (:mod:`workbook_lib.studies.mask_cost.convert_bench`):
    forward + backward per exact sample, interleaved in the same rounds, of a TorchCell-shaped
    encoder on B masked copies and converted, the workbook's model converted and hand-written,
    and the first pair again on a graph whose deletions reach few genes (all measured); the
    converted encoder's floor and its time at the machine's best rates (computed)."""

    forms: dict[str, PerSample] = field(default_factory=dict)
    steps: dict[str, Stat] = field(default_factory=dict)  # seconds per step
    rounds: int = 0
    masked_vs_converted: Stat | None = None  # per sample, paired
    converted_vs_handwritten: Stat | None = None  # the workbook's model, per sample, paired
    few_reach_masked_vs_converted: Stat | None = None
    floor: ConvertFloor | None = None  # the TorchCell-shaped encoder's, the timed batch's
    floor_seconds: float | None = None  # computed: the floor's products at floor_rates
    floor_rates: str = ""
    explain: str = ""  # fast.explain of the timed batch
    few_reach_explain: str = ""
    few_reach_edges_per_type: int = 0
    exact_max_rel_error: dict[str, float] = field(default_factory=dict)  # float64, small graph
    exact_genes: int = 0
    # the converted TorchCell-shaped step timed again after the rounds, its steps in a row (a
    # training loop's order; in the rounds each step follows another form's); None: older result
    loop: PerSample | None = None
    # the converted sample / its floor's time at each round's own rates (the rates' kernels
    # timed in the same rounds), median [IQR] over rounds, and those rates (GMAC/s); None and
    # {} in older results
    floor_same_rounds: Stat | None = None
    round_rates: dict[str, Stat] = field(default_factory=dict)
    # the same with the floor's dense multiply-adds priced at the rate of a linear map's three
    # products at the encoder's own layer shape ([rows, H] x [H, H], a cache-sized block per
    # CPU worker, timed in each round: round_rates["dense_shaped"]) instead of the large
    # matmul's; None in older results
    floor_shaped_rounds: Stat | None = None
    # where the converted TorchCell-shaped step's time goes: its parts timed in a pass of their
    # own after the back-to-back steps, and each beside its floor at floor_rates (None and []
    # in older results, or without the rates)
    parts: StepParts | None = None
    part_rows: list[PartRow] = field(default_factory=list)

    def to_floor(self) -> float | None:
        """The converted TorchCell-shaped sample's measured time in the rounds / its floor's
        computed time."""
        got = self.forms.get("torchcell_converted")
        if got is None or not self.floor_seconds:
            return None
        return got.median / self.floor_seconds

    def loop_to_floor(self) -> float | None:
        """The same, its steps timed back to back (:attr:`loop`)."""
        if self.loop is None or not self.floor_seconds:
            return None
        return self.loop.median / self.floor_seconds


@dataclass
class BenchResult(Record):
    device: str
    sizes: dict
    full_size: bool
    per_sample_s: dict[str, PerSample]
    steps: dict[str, Stat]  # seconds per step
    ratio_vs_lazy_form: Stat | None
    ratio_vs_sparse_form: Stat | None
    passes_per_sample: Stat | None
    exact_max_rel_error: float
    ratio_vs_full_form: Stat | None = None  # shared_full / shared per sample (delta's gain)
    replicated: dict[str, ReplicatedFit] = field(default_factory=dict)
    rates: list[RateFigure] = field(default_factory=list)
    machine: dict = field(default_factory=dict)  # best sparse / dense GMAC/s measured here
    kernels: list[KernelFigure] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # variant -> why it did not run
    notes: list[str] = field(default_factory=list)
    rounds: int = 0
    seconds: float = 0.0
    push_kernel: str = ""  # the delta push's kernel in the timed steps ("" : no delta form ran)
    push_threads: str = ""  # numba's threading layer when the push ran compiled
    shared_form: str = ""  # the path of the step timed as "shared" ("delta, push numba"...)
    run_layers: int | None = None  # the run's model depth (the benchmark's is sizes["layers"])
    ratio_vs_dango_sample: Stat | None = None  # shared / wildtype, per sample each
    floor: FloorFigure | None = None  # the exact sample's floor beside the step's counts
    convert: ConvertBench | None = None  # the convert section (None: not run, older results)


@dataclass
class ReplicatedPlan(Record):
    """The batches at which one replicated form is timed, and why (see the module docstring)."""

    batches: tuple  # always 1; 2 when it fits; the compared batch or the largest fitting one
    compared: int  # the shared form's batch
    at_compared: bool  # timed at the compared batch itself
    rule: str


@dataclass
class FormChoice(Record):
    """Which form of the node-mask shared graph to train with, and why."""

    middle: str  # "delta" or "full" (NodeMaskShared's ``middle``)
    reason: str
    measured: bool  # from a benchmark of this device (else the default, not measured here)


def recommended_form(b: BenchResult | None) -> FormChoice:
    """The faster form by the benchmark's paired ratio (full / delta per sample, same rounds):
    ``delta`` when that ratio's median is at least 1 (at 2 layers the two are one computation),
    ``full`` otherwise; without a benchmark, the default ``delta``, marked not measured."""
    run_layers = getattr(b, "run_layers", None) if b is not None else None
    if run_layers is not None and run_layers < 3:
        measured = (f"; 02's benchmark at L = {b.sizes.get('layers')} measured delta vs full "
                    f"per sample {b.ratio_vs_full_form.median:.3g}x (IQR "
                    f"{b.ratio_vs_full_form.iqr:.2g}), for a deeper model"
                    if b.ratio_vs_full_form is not None else "")
        return FormChoice("delta", f"this run's model has {run_layers} layers: no middle layer, "
                                   "so the fix's step takes the plain path (the delta and full "
                                   f"forms are the same computation there){measured}", False)
    if b is not None and b.sizes.get("layers", 3) < 3:
        return FormChoice("delta", f"with {b.sizes.get('layers')} layers there is no middle "
                                   "layer: the two forms are the same computation", False)
    if b is None or b.ratio_vs_full_form is None:
        return FormChoice("delta", "no benchmark of both forms on this device (not measured "
                                   "here): the default, delta propagation", False)
    r = b.ratio_vs_full_form
    where = "at the real spec" if b.full_size else "at this run's reduced sizes"
    fig = f"{r.median:.3g}x (IQR {r.iqr:.2g}, {r.n} interleaved rounds, {where}, {b.device})"
    if r.median >= 1.0:
        return FormChoice("delta", f"delta propagation was {fig} faster per sample than full "
                                   "middle layers", True)
    return FormChoice("full", f"full middle layers were faster: delta / full per sample "
                              f"{1 / r.median:.3g}x ({where}, {b.device}); delta's push kernel "
                              "does not pay off on this device", True)
