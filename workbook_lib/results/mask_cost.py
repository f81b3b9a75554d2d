"""Notebook 02's results (``02_mask_cost_model.json``): the cost model's sweep and fit
(:mod:`workbook_lib.studies.mask_cost.costmodel`), mask generation and the layer across batch sizes
(:mod:`workbook_lib.studies.mask_cost.layers`), peak memory per sample
(:mod:`workbook_lib.studies.mask_cost.memory`), the dual forward's mask bytes and the full-size
benchmark; put together by :mod:`workbook_lib.studies.mask_cost`."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..failures import PipelineFailure
from .memory import MemoryFit, MemoryPoint
from .stat import Stat
from ..records import Record
from .bench import BenchResult


@dataclass
class SweepPoint(Record):
    kind: str  # masked, unmasked, mask_cost, spmm, keep_mask, gather, filter_layer
    E: int
    H: int
    p: float
    stat: Stat


@dataclass
class Fit(Record):
    """One least-squares fit: coefficients, in-fit residuals, held-out errors."""

    name: str
    terms: list[str]
    coefficients: dict[str, float]
    in_fit_points: int
    in_fit_median_abs_rel: float
    held_out_points: int
    held_out_median_abs_rel: float | None
    negative: list[str] = field(default_factory=list)
    stderr: dict[str, float] = field(default_factory=dict)  # least-squares standard errors
    point_noise: float | None = None  # median IQR/median of the fitted points' timings

    def rel_stderr(self, name: str) -> float | None:
        """A coefficient's standard error relative to it (None where not estimable)."""
        v, se = self.coefficients.get(name), self.stderr.get(name)
        return None if v in (None, 0) or se is None else abs(se / v)


@dataclass
class CostModel(Record):
    """Fitted coefficients (seconds per unit) and how well they predict."""

    beta: Fit  # unmasked layers: beta*E*H + beta_e*E + c
    alpha: Fit  # the mask multiply, by the term that fits it better (alpha_eh*E*H or alpha_e*E)
    gamma: Fit  # keep mask: gamma*E + c
    delta: Fit  # gather: delta*E + c
    held_out_edges: int
    filter_check: Fit  # the filter model predicted (not fitted) vs measured filter layers
    alpha_carrier: str  # "E*H" or "E": the term that carries the mask cost
    alpha_other: Fit | None = None  # the other single-term fit, for comparison

    def coefficient(self, name: str) -> float:
        for f in (self.beta, self.alpha, self.gamma, self.delta):
            if name in f.coefficients:
                return f.coefficients[name]
        raise KeyError(name)

    def predict_unmasked(self, e: float, h: float) -> float:
        b = self.beta.coefficients
        return b["beta"] * e * h + b["beta_e"] * e + b["c"]

    def predict_mask(self, e: float, h: float) -> float:
        a = self.alpha.coefficients
        return self.predict_unmasked(e, h) + a["alpha_eh"] * e * h + a["alpha_e"] * e

    def predict_filter(self, e: float, h: float, p: float) -> float:
        b = self.beta.coefficients
        return ((self.gamma.coefficients["gamma"] + self.delta.coefficients["delta"]) * e
                + (1 - p) * (b["beta"] * e * h + b["beta_e"] * e) + b["c"])

    def crossover_p(self, h: float) -> float | None:
        """The p above which filtering is predicted cheaper than masking at hidden size ``h``,
        or None if never in [0, 1):
        ``(gamma + delta - alpha_e - alpha_eh*H) / (beta*H + beta_e)``."""
        b = self.beta.coefficients
        denom = b["beta"] * h + b["beta_e"]
        if denom <= 0:
            return None
        a = self.alpha.coefficients
        p = (self.gamma.coefficients["gamma"] + self.delta.coefficients["delta"]
             - a["alpha_e"] - a["alpha_eh"] * h) / denom
        if p < 0:
            return 0.0
        return float(p) if p < 1 else None


@dataclass
class CrossoverCheck(Record):
    """Predicted crossover p against direct filter-vs-mask timings at one (E, H)."""

    E: int
    H: int
    predicted_p: float | None
    measured: dict[float, float]  # p -> filter / masked (median ratio); < 1: filter wins
    measured_p: float | None  # first swept p where filtering won (None: never)
    agrees: bool  # prediction and measurement put every swept p on the same side


@dataclass
class MaskGeneration(Record):
    """Milliseconds per sample to produce one sample's edge removal, by form."""

    batch_size: int
    per_sample_ms: dict[str, Stat]
    where: dict[str, str]


@dataclass
class LayerPoint(Record):
    strategy: str
    batch_size: int
    stat: Stat | None  # seconds per layer (forward), None when it did not fit
    reason: str | None = None


@dataclass
class LayerSweep(Record):
    hidden: int
    edges: int
    points: list[LayerPoint] = field(default_factory=list)

    def series(self, strategy: str) -> list[LayerPoint]:
        return sorted((p for p in self.points if p.strategy == strategy),
                      key=lambda p: p.batch_size)


@dataclass
class MemoryStudy(Record):
    device: str
    budget_bytes: float
    budget_label: str
    points: list[MemoryPoint] = field(default_factory=list)
    fits: dict[str, MemoryFit] = field(default_factory=dict)
    # user pipeline -> the failure of its probes (raised or stalled); ``figures_kept`` when some
    # of its points were measured
    failures: dict[str, PipelineFailure] = field(default_factory=dict)

    def per_sample(self) -> dict[str, float]:
        """Measured bytes per sample by strategy (the real-size fit preferred), for the
        verdict's tie-break; only fits that succeeded."""
        out: dict[str, float] = {}
        for key in sorted(self.fits, key=lambda k: "real" not in k):
            f = self.fits[key]
            name = key.split(":")[0]
            if f.status == "ok" and f.per_sample_bytes and name not in out:
                out[name] = f.per_sample_bytes
        return out


@dataclass
class DualForwardMasks(Record):
    """Per-edge mask bytes one forward reads, single and dual."""

    strategy: str
    batch_size: int
    edges: int  # the graph's edges
    single_bytes: int
    dual_bytes: int

    def describe(self) -> str:
        return (f"per-edge mask bytes one forward of {self.strategy} reads at B = "
                f"{self.batch_size} ({self.edges:,} edges): {self.single_bytes:,} without the "
                f"dual forward, {self.dual_bytes:,} with it (every 1-D per-edge tensor an "
                "operator reads, counted once)")


@dataclass
class CostModelStudy(Record):
    """The sweep, the fitted model and the crossover checked against direct timings."""

    points: list[SweepPoint]
    model: CostModel
    crossover: list[CrossoverCheck]
    run_hidden: int
    crossover_at_run_hidden: float | None
    seconds: float = 0.0

    def forms(self) -> list[tuple[int, int, Stat, Stat]]:
        """(E, H, gather-scatter, CSR product) of the unmasked layers."""
        gs = {(p.E, p.H): p.stat for p in self.points if p.kind == "unmasked"}
        sp = {(p.E, p.H): p.stat for p in self.points if p.kind == "spmm"}
        return [(e, h, gs[(e, h)], sp[(e, h)]) for (e, h) in sorted(gs) if (e, h) in sp]


@dataclass
class MaskCostResult(Record):
    """Notebook 02's results."""

    device: str
    exact: dict[str, float]
    exact_graph: str
    cost: CostModelStudy | None  # None: no built-in strategy ran (so for every section below
    mask_generation: MaskGeneration | None  # but the memory)
    layers: LayerSweep | None
    bench: BenchResult | None
    memory: MemoryStudy
    notes: list[str] = field(default_factory=list)
    dual_masks: DualForwardMasks | None = None  # what the dual forward adds (a claim's figure)


COEFFICIENTS = {
    "beta": ("s per edge·channel", "message computation and aggregation"),
    "beta_e": ("s per edge", "per-edge index bookkeeping of gather-scatter"),
    "alpha_eh": ("s per edge·channel", "the mask multiply, per message element"),
    "alpha_e": ("s per edge", "the mask multiply, per edge"),
    "gamma": ("s per edge", "keep-mask construction (isin)"),
    "delta": ("s per edge", "nonzero + gather of the kept edges"),
}
