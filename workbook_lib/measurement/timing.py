"""The one timing core: every time the workbook reports comes from here.

Rules it enforces by construction:

* **The device is synchronized around every timed region** (:func:`sync`; CUDA work is
  asynchronous, so a timer read without a sync measures the launch, not the work).
* **Warm-up is excluded by construction**: :func:`measure` and :func:`interleave` run their
  warm-up calls before the first timed one, and :class:`StepClock` keeps a step's stage times only
  when the step was opened as a timed step, so a warm-up step can never leak into a timed one.
* **Repeats until a precision target or a time budget**: a figure is repeated until its median
  is known to ``target`` (10% by default: the half-width of the median's 95% confidence
  interval, :meth:`Stat.known_to`) or its time budget is spent, and never fewer than
  ``min_repeats`` times (:func:`measure` uses PyTorch's own rule, IQR/median).
* **Every figure carries its noise**: a :class:`Stat` holds the median, the quartiles, the IQR
  and n, and says whether it met the precision target.
* **Every figure carries what the process got of the CPUs** while it was timed
  (:class:`~workbook_lib.measurement.cpu.CpuShare`: CPU use, the share of the CPU its compute
  threads asked for, CPU pressure, other jobs' use of its CPUs): a steady disturbance slows
  every repeat alike and keeps the IQR small, so a figure is also marked *contended*
  (:attr:`Stat.contended`) when its compute threads got less than 80% of the CPU they asked
  for, and says by whom (:attr:`CpuShare.cause`: other jobs, or this run's own processes).

:func:`measure` times one pure function with ``torch.utils.benchmark.Timer.adaptive_autorange``
(PyTorch's own timer: it synchronizes the accelerator, picks a block size and repeats until the
IQR/median threshold). Two things are written here because that timer does not do them:
:func:`interleave` runs several variants A, B, A, B... in one process so that their ratio does not
carry the drift between two separate measurements (a shared machine's speed drifts by tens of
percent over minutes); and :class:`StepClock` times the stages of a training loop, whose steps are
not repeatable calls of one function (each consumes the next batch).
"""
from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..records import Record
from .cpu import CpuMeter, CpuShare, worse
from typing import Callable, Iterator

import numpy as np
import torch

DEFAULT_TARGET = 0.10
CI_LEVEL = 0.95  # the confidence of the median's interval that precision is judged on


HARNESS_SYNC = "harness:sync"  # the profiler range of the timer's own device syncs


def sync(device: torch.device | str | None) -> None:
    """Wait for the work queued on ``device`` (CUDA); on CPU work is synchronous already.

    On CUDA the wait runs in a :data:`HARNESS_SYNC` profiler range, so that a trace tells the
    timer's own syncs from those the measured code makes
    (:func:`~workbook_lib.traces.sync_wait_by_stage`)."""
    if device is None:
        return
    dev = torch.device(device)
    if dev.type == "cuda":
        from torch.profiler import record_function

        with record_function(HARNESS_SYNC):
            torch.cuda.synchronize(dev)


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q1, med, q3 = np.percentile(np.asarray(xs, dtype=float), [25, 50, 75])
    return float(q1), float(med), float(q3)


@dataclass
class Stat(Record):
    """A repeated measurement: median, quartiles, IQR and the number of repeats ``n``.

    ``unit`` is ``"s"`` for times; derived figures (ratios, ms per sample) say what they are.
    ``samples`` keeps the raw values so that figures can show their spread.
    """

    median: float
    iqr: float
    q1: float
    q3: float
    n: int
    unit: str = "s"
    target: float | None = None  # the precision target it was repeated for
    samples: list[float] = field(default_factory=list)
    cpu: CpuShare | None = None  # what the process got of the CPUs while it was timed

    @property
    def contended(self) -> bool:
        """True when the process got clearly less CPU than it asked for while this figure was
        measured (:attr:`CpuShare.contended`); False where nothing was recorded."""
        return self.cpu is not None and self.cpu.contended

    def with_cpu(self, *shares: CpuShare | None) -> "Stat":
        """This Stat carrying the worse of ``shares`` (and its own) as its CPU share."""
        self.cpu = worse(self.cpu, *shares)
        return self

    @classmethod
    def from_samples(cls, samples: list[float], *, unit: str = "s",
                     target: float | None = None) -> "Stat":
        """Summarize raw values (at least one)."""
        xs = [float(x) for x in samples]
        if not xs:
            raise ValueError("'samples' must hold at least one value (got none)")
        q1, med, q3 = _quartiles(xs)
        return cls(median=med, iqr=q3 - q1, q1=q1, q3=q3, n=len(xs), unit=unit, target=target,
                   samples=xs)

    @property
    def rel_iqr(self) -> float:
        """IQR / median (the precision of the figure); inf for a zero median."""
        return self.iqr / abs(self.median) if self.median else math.inf

    def median_ci(self, level: float = CI_LEVEL) -> tuple[float, float]:
        """A distribution-free confidence interval of the median: the order statistics
        ``x(k)``, ``x(n-k+1)`` of the samples with the largest ``k`` whose binomial(n, 1/2)
        coverage is at least ``level`` (min to max when n is too small for it). Without
        samples: the quartiles."""
        xs = sorted(self.samples)
        n = len(xs)
        if n < 2:
            return (self.q1, self.q3) if not xs else (-math.inf, math.inf)
        k, tail = 0, 0.0  # tail: P(Bin(n, 1/2) <= k - 1), the mass left out on each side
        while True:
            nxt = tail + math.comb(n, k) / 2 ** n
            if 1 - 2 * nxt < level or k + 1 > n - k:
                break
            k, tail = k + 1, nxt
        k = max(k, 1)
        return xs[k - 1], xs[n - k]

    def ci_half_width(self, level: float = CI_LEVEL) -> float:
        """Half the width of :meth:`median_ci` over the median (inf for a zero median)."""
        lo, hi = self.median_ci(level)
        return (hi - lo) / (2 * abs(self.median)) if self.median else math.inf

    def known_to(self, target: float) -> bool:
        """Whether the median is known to within ``target`` of itself: the half-width of its
        confidence interval (:meth:`median_ci`) at most ``target``. A varied workload measured
        long enough is precise, however wide the spread of its steps."""
        return self.ci_half_width() <= target

    @property
    def precise(self) -> bool:
        """:meth:`known_to` the target it was measured for (default 10%)."""
        return self.known_to(self.target if self.target is not None else DEFAULT_TARGET)

    def scaled(self, factor: float, unit: str) -> "Stat":
        """The same measurement in another unit (e.g. seconds per batch -> ms per sample)."""
        if self.samples:
            return Stat.from_samples([x * factor for x in self.samples], unit=unit,
                                     target=self.target).with_cpu(self.cpu)
        lo, hi = sorted((self.q1 * factor, self.q3 * factor))
        return Stat(self.median * factor, hi - lo, lo, hi, self.n, unit, self.target,
                    cpu=self.cpu)

    def inverse(self, unit: str) -> "Stat":
        """1/x of every sample (e.g. seconds per step -> iterations per second)."""
        return Stat.from_samples([1.0 / x for x in self.samples if x > 0], unit=unit,
                                 target=self.target).with_cpu(self.cpu)

    def ratio_to(self, other: "Stat", *, paired: bool = False) -> "Stat":
        """``self / other`` with its noise.

        ``paired=True`` (samples taken in the same rounds, as :func:`interleave` does): the
        median and IQR of the per-round ratios. Otherwise the ratio of medians with the relative
        IQRs combined in quadrature (independent noise), and n the smaller of the two.
        """
        if paired:
            if len(self.samples) != len(other.samples) or not self.samples:
                raise ValueError("a paired ratio needs two sample lists of equal length "
                                 f"(got {len(self.samples)} and {len(other.samples)})")
            return Stat.from_samples([a / b for a, b in zip(self.samples, other.samples)],
                                     unit="ratio", target=self.target).with_cpu(self.cpu,
                                                                                other.cpu)
        r = self.median / other.median
        rel = math.hypot(self.rel_iqr, other.rel_iqr)
        half = abs(r) * rel / 2
        return Stat(median=r, iqr=2 * half, q1=r - half, q3=r + half,
                    n=min(self.n, other.n), unit="ratio", target=self.target,
                    cpu=worse(self.cpu, other.cpu))

    def times(self, other: "Stat") -> "Stat":
        """``self * other`` for independent figures: the product of medians, relative IQRs
        combined in quadrature."""
        r = self.median * other.median
        half = abs(r) * math.hypot(self.rel_iqr, other.rel_iqr) / 2
        return Stat(median=r, iqr=2 * half, q1=r - half, q3=r + half,
                    n=min(self.n, other.n), unit="ratio", target=self.target,
                    cpu=worse(self.cpu, other.cpu))

    def describe(self, scale: float = 1.0, unit: str | None = None, digits: int = 3) -> str:
        """'12.3 ms (IQR 0.4, n=10)', with ', contended: got 40% of the CPU asked for' when the
        figure is contended."""
        u = unit if unit is not None else self.unit
        flag = f", contended: {self.cpu.describe()}" if self.contended else ""
        return (f"{self.median * scale:.{digits}g} {u} (IQR {self.iqr * scale:.2g}, "
                f"n={self.n}{flag})")


def _timed_call(fn: Callable[[], object], device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def measure(fn: Callable[[], object], *, device: torch.device | str = "cpu", warmup: int = 1,
            min_repeats: int = 5, target: float = DEFAULT_TARGET, max_time_s: float = 2.0,
            label: str = "") -> Stat:
    """Time ``fn()`` with ``torch.utils.benchmark.Timer.adaptive_autorange``.

    ``warmup`` untimed calls come first. Timing then repeats until IQR/median <= ``target`` or
    ``max_time_s`` of timed work, and never fewer than ``min_repeats`` blocks (a block is one call
    for anything slower than a few ms, several calls averaged for faster ones).

    Args:
        fn: the work to time; its return value is discarded.
        device: where it runs (the timer synchronizes the accelerator around each block).
        warmup: untimed calls first (default 1).
        min_repeats: the fewest timed blocks (default 5).
        target: IQR/median to stop at (default 0.10).
        max_time_s: time budget for repeats beyond ``min_repeats`` (default 2 s).
        label: a name for the measurement (kept by the Timer).

    Returns:
        A :class:`Stat` in seconds per call.
    """
    from torch.utils.benchmark import Timer

    if warmup < 0:
        raise ValueError(f"'warmup' must be >= 0 (got {warmup})")
    if min_repeats <= 0:
        raise ValueError(f"'min_repeats' must be a positive integer (got {min_repeats})")
    if not 0 < target < 1:
        raise ValueError(f"'target' must be in (0, 1) (got {target})")
    if max_time_s <= 0:
        raise ValueError(f"'max_time_s' must be positive (got {max_time_s})")
    for _ in range(warmup):
        fn()
    one = _timed_call(fn, device)  # an estimate of one call, so that n >= min_repeats
    min_run = min_repeats * one
    timer = Timer(stmt="fn()", globals={"fn": fn}, label=label or "workbook",
                  num_threads=torch.get_num_threads())
    meter = CpuMeter()
    with meter:  # the whole timed phase (the Timer's own blocks): what the process got
        m = timer.adaptive_autorange(threshold=target, min_run_time=min_run,
                                     max_run_time=max(max_time_s, 1.5 * min_run))
        times = list(m.times)
        while len(times) < min_repeats:  # fast calls come in blocks: top up to min_repeats
            times.append(timer.timeit(number=m.number_per_run).median)
    return Stat.from_samples(times, target=target).with_cpu(meter.share())


@dataclass
class Interleaved(Record):
    """Variants timed in rounds (every variant once per round, order rotating)."""

    stats: dict[str, Stat]
    rounds: int
    seconds: float

    def ratio(self, a: str, b: str) -> Stat:
        """``a / b`` from the per-round ratios (paired: drift between rounds cancels)."""
        return self.stats[a].ratio_to(self.stats[b], paired=True)


def interleave(fns: dict[str, Callable[[], object]], *, device: torch.device | str = "cpu",
               warmup: int = 1, min_rounds: int = 5, max_rounds: int = 100,
               target: float = DEFAULT_TARGET, max_time_s: float = 10.0,
               on_round: Callable[[int], None] | None = None) -> Interleaved:
    """Time several variants interleaved: round r calls each variant once (A, B, C, then
    B, C, A...), each call between device syncs.

    Rounds continue until every variant's median is known to ``target`` (:meth:`Stat.known_to`;
    at least ``min_rounds``),
    or until ``max_rounds`` or ``max_time_s`` of timed work. ``warmup`` untimed rounds come first.

    Returns:
        :class:`Interleaved` with one :class:`Stat` per variant (seconds per call); use
        :meth:`Interleaved.ratio` for paired ratios.
    """
    if not fns:
        raise ValueError("'fns' must name at least one variant (got none)")
    if min_rounds <= 0:
        raise ValueError(f"'min_rounds' must be a positive integer (got {min_rounds})")
    if max_rounds < min_rounds:
        raise ValueError(f"'max_rounds' must be >= min_rounds={min_rounds} (got {max_rounds})")
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    meters = {n: CpuMeter() for n in names}  # read outside each timed call
    spent, rounds = 0.0, 0
    while True:
        order = names[rounds % len(names):] + names[:rounds % len(names)]
        for name in order:
            meters[name].begin()
            dt = _timed_call(fns[name], device)
            meters[name].end()
            samples[name].append(dt)
            spent += dt
        rounds += 1
        if on_round is not None:
            on_round(rounds)
        if rounds < min_rounds:
            continue
        done = all(Stat.from_samples(s).known_to(target) for s in samples.values())
        if done or rounds >= max_rounds or spent >= max_time_s:
            break
    return Interleaved({n: Stat.from_samples(s, target=target).with_cpu(meters[n].share())
                        for n, s in samples.items()}, rounds=rounds, seconds=spent)


class StepClock:
    """Wall time and per-stage time of training-loop steps.

    A step is opened with ``with clock.step(timed=...)``; its stage times (``clock.stage(name)``,
    each between device syncs) and any durations measured elsewhere (``clock.add``, e.g. inside a
    DataLoader worker) go into that step's own record, which is kept only when the step was
    opened as timed. A warm-up step therefore cannot leak into a timed one.

    A :class:`~workbook_lib.measurement.cpu.CpuMeter` reads what the process got of the CPUs
    around every timed step (outside its wall time); :meth:`wall` and :meth:`stages` carry it.

    Args:
        device: where the steps run (synchronized around every step and stage).
        children: what the CPU figure says about child processes (DataLoader workers).
        procs: the run's processes sharing these CPUs (DDP ranks on the node).
        workers: DataLoader worker processes of each.
    """

    def __init__(self, device: torch.device | str = "cpu", *, children: str | None = None,
                 procs: int = 1, workers: int = 0):
        self.device = torch.device(device)
        self.steps: list[dict[str, float]] = []  # timed steps only; "_wall" is the whole step
        self._cur: dict[str, float] | None = None
        self.meter = CpuMeter(children=children, procs=procs, workers=workers)

    @contextmanager
    def step(self, timed: bool = True) -> Iterator[dict[str, float]]:
        if self._cur is not None:
            raise RuntimeError("StepClock.step() is not re-entrant: a step is already open")
        rec: dict[str, float] = {}
        self._cur = rec
        if timed:
            self.meter.begin()
        sync(self.device)
        t0 = time.perf_counter()
        try:
            yield rec
            sync(self.device)
            rec["_wall"] = time.perf_counter() - t0
            if timed:
                self.meter.end()
                self.steps.append(rec)
        finally:
            self._cur = None
            self.meter.cancel()  # a step that raised leaves no interval open

    @contextmanager
    def stage(self, name: str, synced: bool = True) -> Iterator[None]:
        """Time one stage of the open step (between device syncs).

        ``synced=False`` leaves the device running across the stage's boundaries (a pipelined
        step: only the step's own start and end are synchronized); the stage's time is then only
        the host's time to issue its work, and is recorded as ``"issue:<name>"``, never under
        the stage's name."""
        if self._cur is None:
            raise RuntimeError(f"stage {name!r} outside a step: open one with clock.step()")
        rec = self._cur
        if synced:
            sync(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if synced:
                sync(self.device)
            key = name if synced else f"issue:{name}"
            rec[key] = rec.get(key, 0.0) + time.perf_counter() - t0

    def add(self, name: str, seconds: float) -> None:
        """Add a duration measured elsewhere to the open step."""
        if self._cur is None:
            raise RuntimeError(f"add({name!r}) outside a step: open one with clock.step()")
        self._cur[name] = self._cur.get(name, 0.0) + float(seconds)

    @property
    def n(self) -> int:
        return len(self.steps)

    def wall(self, target: float | None = None) -> Stat:
        """Wall time per timed step (with what the process got of the CPUs over them)."""
        return Stat.from_samples([s["_wall"] for s in self.steps],
                                 target=target).with_cpu(self.meter.share())

    def stages(self, names: tuple[str, ...] | list[str] | None = None,
               target: float | None = None) -> dict[str, Stat]:
        """Per-stage time of the timed steps (0 where a step lacked the stage)."""
        keys = names if names is not None else sorted(
            {k for s in self.steps for k in s if not k.startswith("_")})
        share = self.meter.share()
        return {k: Stat.from_samples([s.get(k, 0.0) for s in self.steps],
                                     target=target).with_cpu(share)
                for k in keys}


def median(xs: list[float]) -> float:
    """Median of a non-empty list (plain helper for summaries)."""
    return float(statistics.median(xs))
