"""The one timing core: every time the workbook reports comes from here.

By construction the device is synchronized around every timed region (:func:`sync`), warm-up
is excluded, a figure is repeated until its median is known to ``target`` (10%) or its budget
is spent, and every figure carries its noise (:class:`Stat`) and what the process got of the
CPUs (:class:`~workbook_lib.measurement.cpu.CpuShare`; *contended* below 80%).

:func:`measure` times one pure function with ``torch.utils.benchmark.Timer.adaptive_autorange``.
Written here because that timer does neither: :func:`interleave` runs variants A, B, A, B... in
one process so that their ratio does not carry a shared machine's drift, and :class:`StepClock`
times the stages of a training loop, whose steps are not repeatable calls of one function.
"""
from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..results.stat import CI_LEVEL, DEFAULT_TARGET, Interleaved, Stat  # noqa: F401
from ..results.timing import GC_PAUSE
from .cpu import CpuMeter
from .gc_pauses import GcPauses
from typing import Callable, Iterator

import numpy as np
import torch


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


def _timed_call(fn: Callable[[], object], device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def measure(fn: Callable[[], object], *, device: torch.device | str = "cpu", warmup: int = 1,
            min_repeats: int = 5, target: float = DEFAULT_TARGET, max_time_s: float = 2.0,
            label: str = "") -> Stat:
    """Time ``fn()`` with ``torch.utils.benchmark.Timer.adaptive_autorange``: ``warmup`` untimed
    calls, then blocks (one call, or several averaged for calls faster than a few ms) until
    IQR/median <= ``target`` or ``max_time_s`` of timed work, never fewer than ``min_repeats``.

    Args:
        fn: the work to time; its return value is discarded.
        device: where it runs (the timer synchronizes the accelerator around each block).
        max_time_s: time budget for repeats beyond ``min_repeats``.
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


def interleave(fns: dict[str, Callable[[], object]], *, device: torch.device | str = "cpu",
               warmup: int = 1, min_rounds: int = 5, max_rounds: int = 100,
               target: float = DEFAULT_TARGET, max_time_s: float = 10.0,
               on_round: Callable[[int], None] | None = None,
               judged: list[str] | None = None) -> Interleaved:
    """Time several variants interleaved: round r calls each variant once (A, B, C, then
    B, C, A...), each call between device syncs.

    Rounds continue until every variant's median is known to ``target`` (:meth:`Stat.known_to`;
    at least ``min_rounds``; only the variants named in ``judged``, where given: a probe timed
    alongside need not hold the rounds),
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
    if judged is not None and (not judged or set(judged) - set(names)):
        raise ValueError(f"'judged' must name some of the variants {names} (got {judged})")
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
        done = all(Stat.from_samples(samples[n]).known_to(target)
                   for n in (names if judged is None else judged))
        if done or rounds >= max_rounds or spent >= max_time_s:
            break
    return Interleaved({n: Stat.from_samples(s, target=target).with_cpu(meters[n].share())
                        for n, s in samples.items()}, rounds=rounds, seconds=spent)


class StepClock:
    """Wall time and per-stage time of training-loop steps.

    A step opened with ``with clock.step(timed=...)`` collects its stage times
    (``clock.stage(name)``, between device syncs) and durations measured elsewhere (``clock.add``,
    e.g. in a DataLoader worker); they are kept only for a timed step. A
    :class:`~workbook_lib.measurement.cpu.CpuMeter` reads the CPU share around every timed step,
    and :class:`~workbook_lib.measurement.gc_pauses.GcPauses` the seconds Python's garbage
    collector ran inside it (``"gc_pause"``: inside the stages, not one of them; and
    ``"gc_pause:STAGE"``, the part inside each stage that had any).

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
        self.gc = GcPauses()

    @contextmanager
    def step(self, timed: bool = True) -> Iterator[dict[str, float]]:
        if self._cur is not None:
            raise RuntimeError("StepClock.step() is not re-entrant: a step is already open")
        rec: dict[str, float] = {}
        self._cur = rec
        if timed:
            self.meter.begin()
        sync(self.device)
        if timed:
            self.gc.open()
        t0 = time.perf_counter()
        try:
            yield rec
            sync(self.device)
            rec["_wall"] = time.perf_counter() - t0
            if timed:
                rec[GC_PAUSE] = self.gc.close()
                self.meter.end()
                self.steps.append(rec)
        finally:
            self._cur = None
            self.gc.close()
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
        g0 = self.gc.seconds
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if synced:
                sync(self.device)
            key = name if synced else f"issue:{name}"
            rec[key] = rec.get(key, 0.0) + time.perf_counter() - t0
            if self.gc.seconds > g0:  # the collector inside this stage (timed steps only)
                rec[f"{GC_PAUSE}:{key}"] = rec.get(f"{GC_PAUSE}:{key}", 0.0) + \
                    self.gc.seconds - g0

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
