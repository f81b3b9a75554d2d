"""Any Chrome trace broken down by exclusive time, row by row, and two traces compared (read by
:mod:`workbook_lib.traces`; the ``trace`` command's records)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..records import Record

@dataclass
class OpTime(Record):
    """One operator (event name) on one row: calls, exclusive and inclusive seconds (an event
    nested in another of the same name is not counted again in the inclusive time)."""

    name: str
    calls: int
    exclusive_s: float
    inclusive_s: float


@dataclass
class RowBreakdown(Record):
    """One CPU thread or GPU stream.

    Attributes:
        label: how the report names the row.
        kind: ``CPU thread`` or ``GPU stream``.
        main: the row holding the ProfilerStep# ranges (or the busiest CPU thread).
        wall_s: wall time by ``wall_rule``.
        exclusive_s: the sum of the kept events' exclusive times (equals ``wall_s`` when the
            events nest properly).
        steps: ProfilerStep# ranges on this row.
        outside_steps_s: exclusive time of events outside every step (left out).
        ranges, kinds: exclusive seconds by range path and by the trace's ``cat``.
        range_steps: on the steps' thread, each range's exclusive seconds in each step (in
            time order; the first step's span also holds the profiler's switch to recording).
        operators: by exclusive time, largest first.
    """

    label: str
    pid: str
    tid: str
    kind: str
    main: bool
    wall_s: float
    wall_rule: str
    exclusive_s: float
    events: int
    steps: int = 0
    outside_steps_s: float = 0.0
    ranges: dict[str, float] = field(default_factory=dict)
    kinds: dict[str, float] = field(default_factory=dict)
    operators: list[OpTime] = field(default_factory=list)
    range_steps: dict[str, list[float]] = field(default_factory=dict)

    @property
    def coverage(self) -> float:
        """Exclusive times summed over the wall time (1 when they add up)."""
        return self.exclusive_s / self.wall_s if self.wall_s else float("nan")

    @property
    def per_step(self) -> int:
        """Divisor for per-step figures: the number of steps (1 without steps)."""
        return max(self.steps, 1)


@dataclass
class TraceBreakdown(Record):
    """Every row of a trace broken down by exclusive time; ``main`` is the main row's label."""

    path: str
    rows: list[RowBreakdown]
    main: str | None
    depth: int | None = None
    ignored: dict[str, int] = field(default_factory=dict)

    @property
    def main_row(self) -> RowBreakdown | None:
        return next((r for r in self.rows if r.main), None)

    @property
    def gpu_rows(self) -> list[RowBreakdown]:
        return [r for r in self.rows if r.kind == "GPU stream"]


@dataclass
class DiffRow(Record):
    """One key in two traces: seconds in A and B (per step where both have steps), B - A,
    B / A (None where A is 0)."""

    key: str
    a_s: float
    b_s: float
    delta_s: float
    ratio: float | None


@dataclass
class TraceDiff(Record):
    """B against A: the main threads' wall time, ranges, kinds and operators; GPU busy time and
    kernels over all streams where either trace has them. ``per`` says whether the figures are
    per profiled step (both traces have steps) or totals."""

    a: str
    b: str
    per: str
    a_steps: int
    b_steps: int
    rows: list[DiffRow]
    ranges: list[DiffRow]
    kinds: list[DiffRow]
    operators: list[DiffRow]
    kernels: list[DiffRow] = field(default_factory=list)
