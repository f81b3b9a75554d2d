"""The records of the commands that are no notebook: a run folder's headline figures
(``compare``) and run-to-run stability (``stability``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..records import Record
from .cpu import CpuShare

@dataclass
class StabilityRow(Record):
    key: str
    label: str
    kind: str
    values: list[str]  # formatted per run
    rel_diff: float | None
    agrees: bool | None
    verdict_rests_on: bool
    note: str = ""


@dataclass
class StabilityResult(Record):
    runs: list[str]
    tolerance: float
    drift: float | None  # relative change of the reference absolute time between runs
    rows: list[StabilityRow] = field(default_factory=list)

    @property
    def disagreeing(self) -> list[StabilityRow]:
        return [r for r in self.rows if r.agrees is False]


@dataclass
class Figure(Record):
    key: str
    label: str
    notebook: str
    value: float | None
    iqr: float | None
    text: str | None  # for a category (e.g. the recommended strategy)
    unit: str
    better: str | None  # "lower", "higher" or None
    kind: str
    se: float | None = None  # a fitted coefficient's standard error
    point_noise: float | None = None  # median IQR/median of the timings it was fitted on
    cpu: CpuShare | None = None  # what the process got of the CPUs while it was measured

    @property
    def contended(self) -> bool:
        """Measured while the process got less than 80% of the CPU it asked for."""
        return self.cpu is not None and self.cpu.contended

    @property
    def rel_se(self) -> float | None:
        """The standard error relative to the value (None where there is none)."""
        return None if self.se is None or not self.value else abs(self.se / self.value)
