"""A profile of warm training steps: each stage's exclusive time, the naive nested sums, and
where each stage's time is in the pipeline's own code (measured by
:mod:`workbook_lib.measurement.profiling` and :mod:`workbook_lib.measurement.code_sites`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..records import Record


# a function whose first caller holds at least this share of its time is called from one place
# (below it: another of the pipeline's functions, the loop or a library holds the rest)
ONE_CALLER_SHARE = 0.95


def callers_cell(callers: list[str], shares: list[float]) -> str:
    """A code table's "called from" cell: the first caller alone where it holds at least
    :data:`ONE_CALLER_SHARE`, else each one with its share ("g (file.py:9), 70% of its time;
    h (file.py:3), 30% of its time"); "" where none."""
    if not callers:
        return ""
    if shares[0] >= ONE_CALLER_SHARE:
        return callers[0]
    return "; ".join(f"{c}, {sh:.0%} of its time" for c, sh in zip(callers, shares))


@dataclass
class LineTime(Record):
    """One line of a function of the pipeline's own code: the operator time of the torch calls
    it made (their backward included, in the backward's stage), per recorded step, from a step
    profiled with each call marked by its line (:mod:`workbook_lib.measurement.line_marks`)."""

    line: int
    text: str  # the line's source, stripped ("" where the file cannot be read)
    seconds: float  # host time of its operators per recorded step
    ops: float  # operator calls per recorded step
    device_seconds: float = 0.0  # kernel time per recorded step (CUDA traces)
    dims: list[int] = field(default_factory=list)  # its operators' largest input's shape
    dims_op: str = ""  # the operator that took it ("aten::bmm")


@dataclass
class SiteTime(Record):
    """Where part of a stage's profiled time went: a function of the pipeline's own code (and
    the library frame under it that holds the time, if any), the mean per recorded step, and
    each recorded step's."""

    function: str  # its qualified name where the source says it ("MyGather.backward")
    file: str  # as the trace names it (relative to the folder it was imported from)
    line: int  # the function's first line
    library: str  # "propagate (torch_geometric/...py:455)", or "" for the function's own work
    seconds: float  # host self time per recorded step (their mean)
    ops: float  # operator calls per recorded step (their mean)
    device_seconds: float = 0.0  # kernel time per recorded step (CUDA traces; their mean)
    # its lines that made torch calls, most operator time first, from another step (the
    # line-marked one), on the function's first row of the stage only; empty where none was
    # marked (cProfile's stages; a function of Python only)
    lines: list[LineTime] = field(default_factory=list)
    # each recorded step's host self time and kernel time (empty in a results file from before
    # two steps were recorded: one step, ``seconds``, then)
    step_seconds: list[float] = field(default_factory=list)
    step_device_seconds: list[float] = field(default_factory=list)
    # the functions of the pipeline's own code that called it ("name (file:line)"), the most
    # time first (at most three), and each one's share of all its time in the stage (kernel time
    # where it ran any, else host time; the rest: the loop or a library called it). Empty where
    # no own function called it, or in a results file from before callers were kept
    callers: list[str] = field(default_factory=list)
    caller_shares: list[float] = field(default_factory=list)

    @property
    def caller_words(self) -> str:
        """"g (file.py:9)", or, where it is called from more than one place (its first caller
        under :data:`ONE_CALLER_SHARE`), each caller with its share: "g (file.py:9), 70% of its
        time; h (file.py:3), 30% of its time"; "" where none."""
        return callers_cell(self.callers, self.caller_shares)

    @property
    def where(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"

    def hottest(self) -> tuple[LineTime, float] | None:
        """Its line with the most operator time and that line's share of the time on all its
        lines (kernel time where there is any), or None."""
        dev = any(ln.device_seconds for ln in self.lines)
        total = sum(ln.device_seconds if dev else ln.seconds for ln in self.lines)
        if total <= 0:
            return None
        top = max(self.lines, key=lambda ln: ln.device_seconds if dev else ln.seconds)
        return top, (top.device_seconds if dev else top.seconds) / total


NOT_OWN = "(not in the pipeline's code)"
# stages attributed by cProfile (measurement.code_sites.data_sites), which sees Python calls,
# not operators: their sites' ``ops`` is 0 whatever ran (a user trial read it as none)
NO_OPS_STAGES = ("data_item", "collate")


def ops_words(stage: str, ops: float) -> str:
    """A site's operator calls per step as a table cell: "not counted" in a stage cProfile
    attributes."""
    return "not counted (cProfile)" if stage in NO_OPS_STAGES else f"{ops:.0f}"


@dataclass
class ProfileResult(Record):
    """Categories by exclusive time of the profiled (warm) steps, and the naive nested sums."""

    schedule: dict[str, int]
    profiled_steps: str  # e.g. "steps 4-6 of the run (after 1 loop warm-up + profiler wait 1, warmup 1)"
    wall_s: float
    categories: dict[str, float] = field(default_factory=dict)  # seconds, exclusive time
    naive: dict[str, float] = field(default_factory=dict)  # seconds, nested durations summed
    trace: str = ""  # path of the Chrome trace (relative to the run folder where possible)
    summed: dict[str, float] = field(default_factory=dict)  # seconds, the investigation's sums
    # seconds the host waited at CUDA syncs per wb: stage over the recorded steps (the timer's
    # own syncs apart); empty on a CPU
    sync_wait: dict[str, float] = field(default_factory=dict)
    # stage -> where its time went in the pipeline's own code, largest first
    # (:mod:`.code_sites`); the function NOT_OWN holds what ran under no frame of it
    sites: dict[str, list[SiteTime]] = field(default_factory=dict)
    sites_note: str = ""  # why there are no sites ("" when there are)

    def sync_wait_per_step(self, stage: str) -> float | None:
        """Seconds per recorded step the host waited at syncs in ``stage`` (None: no CUDA
        trace)."""
        if not self.schedule.get("cuda", 0):
            return None
        active = self.schedule.get("active", 0)
        return self.sync_wait.get(stage, 0.0) / active if active else None

    @property
    def coverage(self) -> float:
        """Exclusive categories / wall time of the recorded steps (about 1 when they add up)."""
        return sum(self.categories.values()) / self.wall_s if self.wall_s else float("nan")

    @property
    def naive_over_wall(self) -> float:
        return sum(self.naive.values()) / self.wall_s if self.wall_s else float("nan")

    def shares(self) -> dict[str, float]:
        tot = sum(self.categories.values())
        return {k: v / tot for k, v in self.categories.items()} if tot else {}

    def summed_shares(self) -> dict[str, float]:
        """Shares of :attr:`summed` (what the investigation's analyzer reported)."""
        tot = sum(self.summed.values())
        return {k: v / tot for k, v in self.summed.items()} if tot else {}
