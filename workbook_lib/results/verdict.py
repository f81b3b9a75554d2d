"""Notebook 05's results (``05_verdict.json``): the answer, its causes, the claims judged
(:mod:`workbook_lib.studies.verdict.claims`) and the recommendation; reasoned by
:mod:`workbook_lib.studies.verdict`."""
from __future__ import annotations

from dataclasses import dataclass, field

from .cpu import CpuShare
from .stat import Stat
from ..records import Record
from .bench import BenchResult, FormChoice
from .profile import ONE_CALLER_SHARE, callers_cell
from .timing import Growth

# a claim's status, and the kind of figure it rests on
HELD, FAILED, NOISE, NOT_MEASURED = "held", "failed", "within noise", "not measured here"
STATUSES = (HELD, FAILED, NOISE, NOT_MEASURED)
HOT_LINE = 0.25  # a line named as a site's hottest holds at least this share of its time
SECOND_CALLER = 0.25  # a second caller named beside the first holds at least this share
MINOR = 0.05  # a cause below this share of the gap is not named in the lead, nor advised
MEASURED, ARITHMETIC = "measured", "arithmetic"


@dataclass
class Claim(Record):
    key: str
    claim: str  # the investigation's words
    claimed: str  # its figure
    measured: str  # this run's figure (with its IQR where it has one)
    kind: str  # measured, arithmetic, or not measured here
    rule: str  # the comparison, in words
    status: str
    source: str  # the notebook the figure comes from
    note: str = ""
    value: float | None = None  # the number the rule compared
    size: str = ""  # where the claim is about the real sizes: the sizes the figure comes from


@dataclass
class CodeLine(Record):
    """A line of a :class:`CodeSite`'s function: the operator time of the torch calls made on it
    (their backward's in a backward stage), per step, from notebook 03's line-marked step."""

    line: int
    text: str  # its source, stripped
    ms: float  # per step: host time, or kernel time where the site's figures are a GPU's
    share: float  # of the function's operator time on its marked lines, in the cause's stages
    dims: list[int] = field(default_factory=list)  # its operators' largest input's shape
    dims_op: str = ""  # the operator that took it ("aten::bmm")

    @property
    def short_text(self) -> str:
        """Its source cut to 60 characters for a sentence."""
        return self.text if len(self.text) <= 60 else self.text[:57] + "..."


@dataclass
class CodeSite(Record):
    """A function of the slow pipeline's own code that holds part of a stage's extra time
    against the fast one, from their profiled steps (per step)."""

    function: str  # its qualified name ("MyGather.backward")
    file: str  # as the trace names it
    line: int  # its first line
    library: str  # the library frame under it that holds most of its time ("" for its own)
    slow_ms: float  # the slow pipeline's profiled time in it, per step
    fast_ms: float  # the fast one's (0 when it has no such function)
    share: float  # of the stage's extra profiled time (the sum of the sites' positive
    # differences)
    ops: float = 0.0  # operator calls under it per profiled step (slow pipeline)
    graph_share: float = 0.0  # of its slow time, under graph code (verdict.code.GRAPH_CODE)
    lines: list[CodeLine] = field(default_factory=list)  # most operator time first
    fast_ops: float | None = None  # its counterpart's operator calls per step (None: none)
    # its time in the backward per step (slow pipeline), for a forward or loss site (None: not
    # looked up): none means its operators have no backward, no trainable input
    backward_ms: float | None = None
    library_share: float = 0.0  # of its slow time, under any library frame (``library``'s too)
    # the functions of the slow pipeline's own code that called it ("`g` (file:line)"), the
    # most time first, and each one's share of all its time in the slow pipeline (kernel time
    # where it ran any, else host time); empty where none did (the loop or a library called
    # it) or in a file from before
    callers: list[str] = field(default_factory=list)
    caller_shares: list[float] = field(default_factory=list)
    # the stage's first-named function only: in how many of the recorded steps it had the most
    # extra time, of how many (0 of 0: one step recorded, a results file from before), and a
    # function that had more in a step where it did not ("`f` (file:line)"; "" where none)
    first_in: int = 0
    recorded: int = 0
    rival: str = ""

    @property
    def where(self) -> str:
        return f"`{self.function}` ({self.file}:{self.line})"

    @property
    def called_from(self) -> str:
        """"called from `g` (file.py:9)"; where it is called from more than one place
        (:attr:`split_callers`), " for 52% of its time in the slow pipeline", and " and from `h`
        (file.py:3) for 45%" where a second caller holds at least :data:`SECOND_CALLER` (a
        close pair's order can change between runs: both are named); "" where none."""
        if not self.callers:
            return ""
        if not self.split_callers:
            return f"called from {self.callers[0]}"
        second = (f" and from {self.callers[1]} for {self.caller_shares[1]:.0%}"
                  if len(self.callers) > 1 and self.caller_shares[1] >= SECOND_CALLER else "")
        return (f"called from {self.callers[0]} for {self.caller_shares[0]:.0%} of its time in "
                "the slow pipeline" + second)

    @property
    def split_callers(self) -> bool:
        """Called from more than one place: its first caller holds less than
        :data:`ONE_CALLER_SHARE` of its time (another function, the loop or a library the
        rest)."""
        return bool(self.callers) and self.caller_shares[0] < ONE_CALLER_SHARE

    @property
    def caller_cell(self) -> str:
        """The code table's cell: "g (file.py:9)", with ", 52% of its time" (and the second
        caller's) where it is called from more than one place; "" where none."""
        return callers_cell([c.replace("`", "") for c in self.callers], self.caller_shares)

    @property
    def unsettled(self) -> str:
        """Where the recorded steps disagree on the first function: "`f` (file.py:3) had the
        most extra time in 1 of 2 recorded steps, `g` (file.py:9) in another: their order is
        not settled"; else ""."""
        if self.recorded < 2 or self.first_in >= self.recorded:
            return ""
        return (f"{self.where} had the most extra time in {self.first_in} of {self.recorded} "
                f"recorded steps, {self.rival or 'another function'} in another: their order "
                "is not settled")

    @property
    def first_steps(self) -> str:
        """Its lead in a few words: "first in 1 of 2 recorded steps" where the steps disagree,
        "" where every recorded step put it first (or one was recorded)."""
        return (f"first in {self.first_in} of {self.recorded} recorded steps"
                if self.unsettled else "")

    @property
    def under(self) -> str:
        """The library under it for a table: its main one, "(its own code)", or, where library
        calls hold most of it and none half, how much they hold (found by a user trial: 05 said
        '(its own code)' of a function whose time was in four PyG utilities)."""
        if self.library:
            return self.library
        if self.library_share >= 0.5:
            return f"several library calls, {self.library_share:.0%} of it, none half"
        return "(its own code)"

    @property
    def short(self) -> str:
        """``where`` with its busiest line: "`f` (file.py:8; busiest line 13)" (the line with
        the most of its operator time, not of its extra time: a review); "`f` (defined at
        file.py:8)" where it has no line figures (a data stage's, profiled by function: a user
        trial read its def line as the hot one)."""
        if not self.lines:
            return f"`{self.function}` (defined at {self.file}:{self.line})"
        if not self.hot_line:
            return self.where
        return f"`{self.function}` ({self.file}:{self.line}; busiest line {self.lines[0].line})"

    @property
    def hot_line(self) -> str:
        """"line 17, `loss = ...`, holds 82% of its operator time", or "" where no line holds
        at least :data:`HOT_LINE` of it (or none was marked). Of the slow pipeline's operator
        time in the function, from the line-marked step: not of its extra time, nor of Python
        time between its calls."""
        if not self.lines or self.lines[0].share < HOT_LINE:
            return ""
        top = self.lines[0]
        text = top.short_text
        return (f"line {top.line}" + (f", `{text}`," if text else "") +
                f" holds {top.share:.0%} of its operator time")


@dataclass
class Cause(Record):
    cause: str  # the stage in words
    evidence: str
    slow_s_per_epoch: float | None
    fast_s_per_epoch: float | None
    difference_s: float | None
    share: float | None  # of the measured epoch-time gap (negative: the stage saves time)
    kind: str  # measured, or not measured here
    # "adds" or "saves" time on the slow pipeline; "rest": unattributed; "noise": shown, not
    # booked (a factor within its IQR, or contended)
    effect: str = ""
    # data_item, collate, h2d, device_prep, forward, backward, optimizer, overhead, ddp, rest
    stage: str = ""
    advice: str = ""  # what to change when this is the first cause
    # the advice is what the stage's largest site's figures show (advice.site_diagnosis), not a
    # change of the stage's own kind: the lead says so, and a backward does not mirror it
    diagnosed: bool = False
    syncs: tuple[float, float] | None = None  # host syncs per step in this stage (slow, fast)
    # on a GPU: seconds per epoch (slow - fast) of the stage's time the host waited at those
    # syncs (carved out of the stage's time, never added to it); None where not measured
    sync_wait_s: float | None = None
    note: str = ""  # what the stage's time went to, where its label would mislead
    # where the stage's extra time is in the slow pipeline's code (profiled), largest first,
    # or why not (sites_note)
    sites: list[CodeSite] = field(default_factory=list)
    sites_note: str = ""
    # the share of the stage's extra profiled time outside the pipeline's code (no frame of it:
    # autograd's own operators, a library's), on the sites' scale; None where not profiled
    outside: float | None = None
    growth: Growth | None = None  # how the stage grows with the samples (slow pipeline)
    fast_growth: Growth | None = None  # the same for the fast pipeline
    finding: str = ""  # what was measured, in one sentence (said instead of advice)
    # of the stage's timed time in the slow pipeline's full steps (their sum), the part Python's
    # garbage collector ran inside it; None where not recorded
    gc_share: float | None = None


@dataclass
class Gap(Record):
    """The epoch-time ratio between the pair, oriented slow over fast."""

    slow: str
    fast: str
    listed: list[str]  # the pair as gap_strategies named it
    swapped: bool  # the one listed slow is the faster: explained the other way round
    ratio: Stat  # epoch time slow / fast (the one gap ratio of the answer)
    basis: str  # what the ratio times
    per_step: Stat  # full step slow / fast (same rounds when interleaved)
    steps: dict[str, int]  # steps per epoch, per pipeline
    batch_sizes: dict[str, int]
    epoch_s: dict[str, float]  # seconds per epoch on one process, per pipeline (medians)
    measurable: bool  # the ratio resolved beyond its IQR and the target, and not contended
    contended: bool = False  # measured while the process got less CPU than it asked for
    ddp_factor: Stat | None = None
    ddp_world: int | None = None
    ddp_booked: bool = False
    ddp_why: str = ""  # why the factor is or is not booked

    @property
    def full_difference_s(self) -> float:
        """Slow minus fast per epoch from the full steps the stages are timed in, with the DDP
        factor where it is booked: what the causes' shares are of."""
        extra = self.epoch_s[self.slow] * (self.ddp_factor.median - 1.0) \
            if self.ddp_booked and self.ddp_factor is not None else 0.0
        return self.epoch_s[self.slow] + extra - self.epoch_s[self.fast]

    @property
    def steps_agree(self) -> bool:
        """The full steps show the gap's direction: the slow side slower (else no cause is
        ranked on them, and no bridge drawn)."""
        return self.full_difference_s > 0


def step_words(mode: str) -> str:
    """Notebook 03's arm ``mode`` ("full" or "pipelined") as the step it times, in words."""
    return "full training step" if mode == "full" else "plain-loop training step"


@dataclass
class Recommendation(Record):
    strategy: str
    label: str
    title: str
    ms_per_sample: Stat
    baseline: str
    speedup: Stat | None  # baseline / recommended, per sample, step_mode's step (03, same rounds)
    fastest: str
    tied: list[str]
    tie_rule: str
    memory_per_sample: dict[str, float] = field(default_factory=dict)
    contended: list[str] = field(default_factory=list)  # exact strategies measured contended
    bench: BenchResult | None = None
    bench_source: str = ""
    epochs_per_day: dict[str, dict[str, float]] = field(default_factory=dict)
    projection_basis: str = ""
    exactness: str = "declared exact"  # how it is known to be exact, in words
    proven: bool = False  # proven equal to the slow pipeline by ``equal``
    # the arm of notebook 03 its figures time: "pipelined" (the step a plain loop runs, the
    # gap's) where every pipeline compared has one, else "full" (every stage recorded)
    step_mode: str = "full"
    # where the slow pipeline is kept, tied with the fastest on an unresolved gap: the fastest
    # other exact one, not shown to be faster, and its figure (slow / it, per sample, same loop)
    alternative: str = ""
    alternative_speedup: Stat | None = None

    @property
    def step_words(self) -> str:
        """The step its figures time, in words."""
        return step_words(self.step_mode)


@dataclass
class VerdictResult(Record):
    answer: str  # the whole answer (markdown): lead, caveats, fix
    device: str
    device_type: str
    causes: list[Cause]
    claims: list[Claim]
    recommendation: Recommendation | None
    gap_total: Stat | None
    can_say: list[str]
    cannot_say: list[str]
    inputs: dict[str, str] = field(default_factory=dict)  # notebook -> results checksum
    disturbed: dict[str, float] = field(default_factory=dict)  # headline figure -> its median's interval half-width / median
    # headline figure -> what the process got of the CPUs while it was measured (contended)
    contended: dict[str, CpuShare] = field(default_factory=dict)
    # a pair pipeline -> its full step's CPU share, where that step was kernel-bound
    kernel: dict[str, CpuShare] = field(default_factory=dict)
    target: float = 0.1  # the precision target the figures were repeated for
    gap_strategies: list[str] = field(default_factory=list)  # [slow, fast] as answered
    lead: str = ""  # the answer's first sentence
    caveats: list[str] = field(default_factory=list)  # one line each
    gap: Gap | None = None
    no_answer: str = ""  # why there is no answer about the pair (then lead says so)
    missing: dict[str, str] = field(default_factory=dict)  # notebook -> why it was not used
    failures: dict[str, str] = field(default_factory=dict)  # pipeline -> "NB: what failed"
    nonfinite: dict[str, str] = field(default_factory=dict)  # pipeline -> its loss, in words
    builtin: bool = True  # built-in strategies ran: the investigation's story applies
    claims_note: str = ""  # why no claim was judged, when none was
    syncs_note: str = ""  # host syncs of the pair's stages and what they cost here
    gc_note: str = ""  # the slow pipeline's garbage-collector pauses, where they are many
    num_samples: int = 0  # the dataset size an epoch is 80% of (params num_samples)
    specs: dict[str, str] = field(default_factory=dict)  # user pipeline -> its spec as given
    params_args: str = ""  # a command's params for the run's: --params RUN/params.yaml, or --sets
    exactness: dict[str, str] = field(default_factory=dict)  # pipeline -> how exact, in words
    notes: list[str] = field(default_factory=list)  # what the answer does not rest on
    headline: str = ""  # the index's one sentence
    form: FormChoice | None = None  # the shared graph's form to adopt (built-in runs)

    @property
    def advises_nodemask(self) -> bool:
        """Whether a cause's advice is the node-mask shared graph (``workbook_lib.nodemask``)."""
        return any("workbook_lib.nodemask" in (c.advice or "") for c in self.causes)
