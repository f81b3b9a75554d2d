"""Peak memory of a training step: one measured point, and the line fitted through them with
the largest batch it projects (measured by :mod:`workbook_lib.measurement.memory`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..records import Record

STATUS_OK = "ok"


STATUS_BELOW = "below resolution"


STATUS_OOM = "out of memory"


STATUS_FAILED = "failed"


STATUS_TIMEOUT = "timed out"


@dataclass
class PeakMemory(Record):
    """Peak of one call: ``bytes`` above the level just before it (``before_bytes``)."""

    bytes: int
    before_bytes: int
    method: str


@dataclass
class MemoryPoint(Record):
    """One measured point: a training step's peak memory (forward + backward, no optimizer)."""

    strategy: str
    form: str
    batch_size: int
    scale: float
    hidden: int
    layers: int
    device: str
    status: str  # ok, below resolution, out of memory, failed, timed out
    step_bytes: int | None = None  # peak of the step above the level before it
    setup_bytes: int | None = None  # resident (CPU) / allocated (CUDA) before the step
    method: str = ""
    reason: str | None = None
    seconds: float = 0.0
    traceback: str = ""  # a failed probe's traceback (its stderr)
    details: dict = field(default_factory=dict)  # what the set-up's exception said of itself

    @property
    def usable(self) -> bool:
        return self.status == STATUS_OK and self.step_bytes is not None

    @property
    def label(self) -> str:
        return f"{self.strategy}:{self.form}"


@dataclass
class MemoryFit(Record):
    """``step_bytes(B) = intercept + per_sample * B`` fitted on measured points, and the largest
    batch whose step plus set-up fits the budget."""

    label: str
    points: list[tuple[int, float]] = field(default_factory=list)  # (B, step bytes) used
    per_sample_bytes: float | None = None
    intercept_bytes: float | None = None
    setup_bytes: float | None = None  # largest set-up level seen before a step
    residuals: list[float] = field(default_factory=list)  # measured - fitted, bytes
    max_abs_rel_residual: float | None = None
    budget_bytes: float = 0.0
    budget_label: str = ""
    largest_batch: int | None = None
    largest_measured_batch: int | None = None
    extrapolation_factor: float | None = None  # largest_batch / largest_measured_batch
    status: str = STATUS_OK
    reason: str | None = None
