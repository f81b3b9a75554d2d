"""What a process got of the CPUs, and the CPUs it may use: the records every timed figure
carries (:class:`CpuShare`: the share, the rule that calls it contended, its cause and its
words), and how compute threads fit those CPUs (measured by :mod:`workbook_lib.measurement.cpu`)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..records import Record
from .cpu_rules import (  # noqa: F401 - the rule's thresholds and words, read from here too
    CONTENDED_BELOW, OTHERS_SEEN, RESOLUTION, KERNEL_HIGH, FAULTS_HIGH, KEEP_PAGES,
    KEPT_PAGES, OTHER_JOBS, OWN_PROCESSES, NOT_TOLD, SPIN, OWN_THREADS_WORDS,
    ERROR_WORDS, RULE, RULE_FALLBACK, SHARE_ERROR_SHOWN)


@dataclass
class CpuAllowance(Record):
    """The CPUs a process may use: the tightest limit and every limit found."""

    cpus: int  # the tightest of the limits below (at least 1)
    source: str  # which limit that is
    host: int  # CPUs of the machine (os.cpu_count)
    affinity: int | None = None  # os.sched_getaffinity
    quota: float | None = None  # cgroup CPU quota, in CPUs (quota / period)
    slurm: int | None = None  # SLURM_CPUS_PER_TASK, else SLURM_CPUS_ON_NODE

    def describe(self) -> str:
        parts = [f"{self.host} on the machine"]
        if self.affinity is not None:
            parts.append(f"affinity {self.affinity}")
        if self.quota is not None:
            parts.append(f"cgroup quota {self.quota:g}")
        if self.slurm is not None:
            parts.append(f"SLURM {self.slurm}")
        return f"{self.cpus} CPUs ({self.source}; " + ", ".join(parts) + ")"


@dataclass
class ThreadFit(Record):
    """Compute threads per process, and why."""

    threads: int
    workers: int  # DataLoader workers per process
    procs: int  # processes sharing the CPUs
    allowance: CpuAllowance
    why: str


def fit(*, procs: int = 1, workers: int = 0, requested: int, allowance: CpuAllowance) -> ThreadFit:
    """Compute threads per process so that ``procs`` processes, each with ``workers``
    DataLoader workers (one thread each, as PyTorch sets them), never start more threads than
    the CPUs they may use: each process's share is ``cpus // procs``, its workers take up to
    ``share - 1`` of it, and the rest (at least 1) are compute threads; ``requested`` (the
    current setting) is never raised.

    Args:
        procs: processes sharing the allowance (DDP ranks on the node), at least 1.
        workers: DataLoader worker processes per process, at least 0.
        requested: the threads asked for.
        allowance: the CPUs.
    """
    if procs < 1:
        raise ValueError(f"'procs' must be a positive integer (got {procs})")
    if workers < 0:
        raise ValueError(f"'workers' must be >= 0 (got {workers})")
    if requested < 1:
        raise ValueError(f"'requested' must be a positive integer (got {requested})")
    a = allowance
    share = max(1, a.cpus // procs)
    used_by_workers = min(workers, max(0, share - 1))
    threads = max(1, min(requested, share - used_by_workers))
    who = f"{procs} processes" if procs > 1 else "1 process"
    why = (f"{a.describe()}; {who}"
           + (f", {workers} DataLoader worker(s) each" if workers else "")
           + f": {threads} compute thread(s) per process"
           + (f" (of {requested} asked)" if threads < requested else ""))
    return ThreadFit(threads=threads, workers=workers, procs=procs, allowance=a, why=why)


def _ticks_per_s() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100.0


TICKS = _ticks_per_s()


def resolution(wall_s: float, reads: int) -> float:
    """How finely other jobs' use (in CPUs) is told over ``reads`` intervals adding up to
    ``wall_s`` seconds: about one tick of ``/proc/stat`` per interval (each interval's
    difference of counters truncated to ticks), adding up as independent errors do:
    tick x sqrt(reads) / wall. inf for no wall time."""
    if wall_s <= 0 or reads < 1:
        return math.inf
    return math.sqrt(reads) / TICKS / wall_s


@dataclass
class CpuShare(Record):
    """What a process got of the CPUs over the timed intervals of one figure, and who else
    used them."""

    wall_s: float  # summed wall time of the timed intervals
    cpu_s: float  # process CPU time (user + system, all threads) over them
    threads: int  # compute threads it asked for (torch threads, at most ``allowed``)
    allowed: int  # CPUs it may use
    intervals: int  # timed intervals measured
    run_s: float | None = None  # its compute threads' time on a CPU (schedstat)
    wait_s: float | None = None  # its compute threads' run-queue wait (schedstat)
    pressure_s: float | None = None  # machine-wide CPU "some" pressure over them
    children: str = "not counted (DataLoader workers' CPU time is in their own processes)"
    helper_run_s: float | None = None  # library-named helper threads' time on a CPU
    helper_wait_s: float | None = None  # and their run-queue wait (recorded, not ruled on)
    requested: int | None = None  # compute threads per process as set (not capped)
    procs: int = 1  # processes of the run sharing the CPUs (DDP ranks on the node)
    workers: int = 0  # DataLoader worker processes of each
    cpus_seen: int | None = None  # CPUs the machine's busy time covers (its affinity)
    busy_s: float | None = None  # the machine's busy CPU time on them over the intervals
    tree_s: float | None = None  # this run's process tree's CPU time over the intervals
    span_s: float | None = None  # wall time from the first interval's start to the last's end
    span_busy_s: float | None = None  # the machine's busy CPU time over the span
    span_tree_s: float | None = None  # the run's process tree's CPU time over the span
    tree_procs: int | None = None  # the most processes seen in the run's tree
    system_s: float | None = None  # of cpu_s, the kernel's (page faults, zeroing, syscalls)
    page_faults: int | None = None  # the process's page faults over them (minor + major)
    freed_kept: bool | None = None  # freed memory kept in the process (mallopt) when measured
    tick_s: float | None = None  # how often the kernel adds up a running thread's CPU time

    @property
    def lag_s(self) -> float | None:
        """How far the run times summed over the intervals can be off, in CPU-seconds: the
        kernel adds a running thread's CPU time to what ``/proc`` and the process clock show
        once per tick (:attr:`tick_s`, 4 ms on this project's machine), so each end of each
        interval lags by up to a tick per running thread; ``tick x sqrt(intervals x
        threads)``, about 2.5 standard deviations of independent lags (found by a user trial:
        12 steps of 0.9 ms read "CPU use 154%"). None where the tick was not measured."""
        if self.tick_s is None:
            return None
        return self.tick_s * math.sqrt(max(1, self.intervals) * max(1, self.threads))

    @property
    def use_error(self) -> float | None:
        """:attr:`use`'s error in share points: :attr:`lag_s` over wall x threads."""
        lag = self.lag_s
        if lag is None or self.wall_s <= 0:
            return None
        return lag / (self.wall_s * max(1, self.threads))

    @property
    def got_error(self) -> float | None:
        """:attr:`got`'s error in share points: :attr:`lag_s` in the run time moves run / (run
        + wait) by ``lag x wait / (run + wait)^2``. A thread's run-queue wait is counted whole
        when it gets a CPU, and the intervals end outside the timed work, where a compute
        thread is rarely queued, so the wait adds none (a review: the use's error applied to
        the got hid a 78% share's real wait)."""
        lag, r, w = self.lag_s, self.run_s, self.wait_s
        if lag is None or r is None or w is None or r + w <= 0:
            return None
        return lag * w / (r + w) ** 2

    @property
    def judged_error(self) -> float:
        """The error of :attr:`judged` (0 where not measured)."""
        e = self.got_error if self.got is not None else self.use_error
        return e or 0.0

    @property
    def within_error(self) -> bool:
        """The judged share is below :data:`CONTENDED_BELOW`, but not by more than its error:
        the error decided that it is not contended (and is then always shown)."""
        j = self.judged
        return bool(not math.isnan(j) and j < CONTENDED_BELOW and not self.waited)

    def error_text(self, error: float | None, judged: bool = False) -> str:
        """' (±92 points)' for an error above :data:`SHARE_ERROR_SHOWN`, or for the judged
        share's where it decided the rule (:attr:`within_error`; a review); else ""."""
        if error is None or not (error > SHARE_ERROR_SHOWN or (judged and self.within_error)):
            return ""
        digits = 1 if error < 0.1 else 0
        return f" (±{error * 100:.{digits}f} points)"

    def got_text(self) -> str:
        """':attr:`got`' as a whole percent with its error where shown ('78% (±0.4 points)')."""
        return f"{self.got:.0%}{self.error_text(self.got_error, True)}"

    def use_text(self, judged: bool = False) -> str:
        """:attr:`use` likewise (``judged``: it is the share the rule judges)."""
        return f"{self.use:.0%}{self.error_text(self.use_error, judged)}"

    def keep_pages(self) -> str:
        """The way out of kernel time spent faulting: :data:`KEEP_PAGES`, or, where freed memory
        was already kept, what is left (a user trial was told to set what the run had set)."""
        return KEPT_PAGES if self.freed_kept else KEEP_PAGES

    @property
    def use(self) -> float:
        """CPU time / (wall x threads)."""
        denom = self.wall_s * max(1, self.threads)
        return self.cpu_s / denom if denom > 0 else math.nan

    @property
    def kernel(self) -> float | None:
        """The share of its CPU time spent in the kernel; None where not read."""
        if self.system_s is None or self.cpu_s <= 0:
            return None
        return min(1.0, max(0.0, self.system_s / self.cpu_s))

    @property
    def kernel_bound(self) -> bool:
        """At least :data:`KERNEL_HIGH` of its CPU time was the kernel's and it faulted at
        least :data:`FAULTS_HIGH` pages per CPU second: the figure is largely the operating
        system handing memory back and forth, not computation (compute threads waiting for each
        other also spend kernel time, in ``sched_yield``, without faults)."""
        k = self.kernel
        return bool(k is not None and k >= KERNEL_HIGH and self.page_faults is not None
                    and self.page_faults >= FAULTS_HIGH * self.cpu_s)

    def kernel_text(self) -> str:
        """'71% of its CPU time in the kernel, 68,000 page faults per call' ("" unread)."""
        k = self.kernel
        if k is None:
            return ""
        faults = self.faults_text("call")
        return f"{k:.0%} of its CPU time in the kernel" + (f", {faults}" if faults else "")

    def faults_text(self, per: str) -> str:
        """'68,000 page faults per <per>' (one interval: a call or a step); "" unread."""
        if self.page_faults is None or self.intervals <= 0:
            return ""
        return f"{self.page_faults / self.intervals:,.0f} page faults per {per}"

    @property
    def got(self) -> float | None:
        """run / (run + run-queue wait) of its compute threads; None without schedstat."""
        if self.run_s is None or self.wait_s is None or self.run_s + self.wait_s <= 0:
            return None
        return self.run_s / (self.run_s + self.wait_s)

    @property
    def helper_got(self) -> float | None:
        """run / (run + run-queue wait) of its helper threads; None without any."""
        r, w = self.helper_run_s, self.helper_wait_s
        if r is None or w is None or r + w <= 0:
            return None
        return r / (r + w)

    @property
    def pressure(self) -> float | None:
        """Share of the wall time in which some task on the machine waited for a CPU."""
        if self.pressure_s is None or self.wall_s <= 0:
            return None
        return min(1.0, self.pressure_s / self.wall_s)

    @property
    def judged(self) -> float:
        """The share the rule judges: :attr:`got`, else :attr:`use`."""
        g = self.got
        return g if g is not None else self.use

    @property
    def waited(self) -> bool:
        """The judged share is below :data:`CONTENDED_BELOW` by more than its
        :attr:`judged_error`."""
        j = self.judged
        return bool(self.intervals > 0 and not math.isnan(j)
                    and j + self.judged_error < CONTENDED_BELOW)

    @property
    def own_threads(self) -> bool:
        """It :attr:`waited`, and only for its own threads: no other job was seen, its
        configuration fits its CPUs, and the rest of the run's process tree used under
        :data:`OTHERS_SEEN` CPU over the intervals. A library's thread pool beside PyTorch's
        compute threads (numba's, in the workbook's delta push) then waited for the CPUs they
        held: part of what this code costs on these CPUs, the same at a rerun, not a
        disturbance (found by ``make report`` on an idle machine: 02's step at 78%, its
        headline "CONTENDED")."""
        if not self.waited or self.others_seen is not False or self.oversubscribed:
            return False
        if self.tree_s is None or self.wall_s <= 0:
            return False
        return (self.tree_s - self.cpu_s) / self.wall_s < OTHERS_SEEN

    @property
    def contended(self) -> bool:
        """True when the judged share is below :data:`CONTENDED_BELOW` by more than its
        :attr:`judged_error`, unless the wait was among its own threads (:attr:`own_threads`;
        see the module)."""
        return self.waited and not self.own_threads

    @property
    def rule(self) -> str:
        base = RULE if self.got is not None else RULE_FALLBACK
        return base + (f", {ERROR_WORDS}" if self.tick_s is not None else "") + \
            f"; {OWN_THREADS_WORDS}"

    # --- who else used the CPUs ------------------------------------------------------------

    @property
    def window(self) -> tuple[float, float, float, str] | None:
        """(wall s, machine busy CPU-s, run's tree CPU-s, what) over which other jobs' use is
        told: the timed intervals when their resolution (:func:`resolution`) is within
        :data:`RESOLUTION`, else the span from the first to the last when its is; None where
        neither was read or neither is that fine."""
        if (self.busy_s is not None and self.tree_s is not None
                and resolution(self.wall_s, self.intervals) <= RESOLUTION):
            return self.wall_s, self.busy_s, self.tree_s, "its timed intervals"
        if (self.span_s is not None and self.span_busy_s is not None
                and self.span_tree_s is not None and resolution(self.span_s, 1) <= RESOLUTION):
            return (self.span_s, self.span_busy_s, self.span_tree_s,
                    "the span of its timed intervals")
        return None

    @property
    def others(self) -> float | None:
        """Other jobs' CPU use on its CPUs, in CPUs (machine busy - this run's tree, per wall
        second, at least 0); None where not told (see :attr:`window`)."""
        w = self.window
        return None if w is None else max(0.0, (w[1] - w[2]) / w[0])

    @property
    def own(self) -> float | None:
        """This run's process tree's CPU use over the same window, in CPUs."""
        w = self.window
        return None if w is None else max(0.0, w[2] / w[0])

    @property
    def others_seen(self) -> bool | None:
        """Other jobs used at least :data:`OTHERS_SEEN` CPU; None where not told."""
        o = self.others
        return None if o is None else o >= OTHERS_SEEN

    @property
    def oversubscribed(self) -> bool:
        """This run's own compute threads and DataLoader workers outnumber its CPUs:
        ``procs x (threads + workers) > allowed``."""
        per = (self.requested or self.threads) + self.workers
        return self.procs * per > self.allowed

    @property
    def cause(self) -> str | None:
        """Why a contended figure waited: :data:`OTHER_JOBS`, :data:`OWN_PROCESSES` or
        :data:`NOT_TOLD`; None when it is not contended."""
        if not self.contended:
            return None
        seen = self.others_seen
        if seen is None:
            return NOT_TOLD
        return OTHER_JOBS if seen else OWN_PROCESSES

    def configuration(self) -> str:
        """'2 ranks x 2 threads + 1 DataLoader worker each on 2 CPUs'."""
        t = self.requested or self.threads
        who = f"{self.procs} ranks" if self.procs > 1 else "1 process"
        each = " each" if self.procs > 1 else ""
        workers = (f" + {self.workers} DataLoader worker{'s' if self.workers != 1 else ''}{each}"
                   if self.workers else "")
        return (f"{who} x {t} thread{'s' if t != 1 else ''}{workers} on {self.allowed} "
                f"CPU{'s' if self.allowed != 1 else ''}")

    def fitting(self) -> str:
        """The configuration that fits its CPUs (:func:`fit`), as advice."""
        per = "per rank" if self.procs > 1 else "per process"
        if self.procs > self.allowed:
            return (f"run at most {self.allowed} rank(s) on these {self.allowed} CPU(s), "
                    "1 thread each, or give the run more CPUs")
        a = CpuAllowance(cpus=self.allowed, source="recorded", host=self.allowed)
        f = fit(procs=self.procs, workers=self.workers,
                requested=self.requested or self.threads, allowance=a)
        share = max(1, self.allowed // self.procs)
        workers = min(self.workers, max(0, share - f.threads))
        out = f"use {f.threads} thread{'s' if f.threads != 1 else ''}"
        if workers != self.workers:
            out += f" and {workers} DataLoader worker{'s' if workers != 1 else ''}"
        return out + f" {per}"

    def fewer_threads(self) -> str:
        """Where other jobs left fewer CPUs free than this run's compute threads: how many
        threads per process would fit what they left (a user trial's shared machine gave no
        answer at 2 threads and a clear one at 1); "" where the threads already fit."""
        if self.others is None or not self.cpus_seen:
            return ""
        free = int(self.cpus_seen - self.others + 0.5)  # CPUs at least half free
        n = free // max(1, self.procs)
        if n < 1 or n >= (self.requested or self.threads):  # none fits (fewer ranks might:
            return ""  # not a thread count; a review), or the threads already fit
        return (f", or with {n} compute thread{'s' if n != 1 else ''} per process, which "
                f"fit{'s' if n == 1 else ''} the CPUs they left (OMP_NUM_THREADS={n} before the "
                "command; the figures are then at that setting)")

    def _others_text(self) -> str:
        w = self.window
        return (f"other jobs used {self.others:.2f} CPU of its {self.cpus_seen} and this run's "
                f"{self.tree_procs or 1} process(es) {self.own:.2f}, over {w[3]} ({w[0]:.2g} s)")

    def explain(self) -> str:
        """One line: whether the figure was contended, by whom, and what to do."""
        got = (f"its threads got {self.got_text()} of the CPU they asked for" if self.got is not
               None else f"CPU use {self.use_text(judged=True)} of {self.threads} thread(s)")
        c = self.cause
        if c is None and self.own_threads:
            return (f"not contended: {got}, the wait among its own threads (a library's thread "
                    "pool beside PyTorch's compute threads, numba's in the workbook's delta "
                    f"push): part of what this code costs on these CPUs; {self._others_text()}")
        if c is None:
            return f"not contended: {got}"
        if c == OTHER_JOBS:
            also = (f"; this run's own {self.configuration()} also outnumber its CPUs: "
                    f"{self.fitting()}" if self.oversubscribed else "")
            return (f"contended by other jobs: {got}; {self._others_text()}: rerun when they "
                    f"are done, or on CPUs of its own{self.fewer_threads()}{also}")
        if c == OWN_PROCESSES:
            if self.oversubscribed:
                fix = f"this run's own {self.configuration()}: {self.fitting()}"
            else:
                fix = (f"its {self.configuration()} fit, so its other processes took the CPUs "
                       "(a launcher, processes its pipeline started): fewer processes per CPU, "
                       "or more CPUs")
            return (f"contended by this run's own processes, not another job: {got}; "
                    f"{self._others_text()}; {self.tree_text()}{fix}; {SPIN}")
        why = ("no /proc/stat or process tree here" if self.busy_s is None or self.tree_s is None
               else f"timed over {max(self.wall_s, self.span_s or 0):.2g} s: too short for "
                    f"/proc/stat's {1 / TICKS:g} s ticks")
        return (f"contended: {got}; other jobs and this run's own processes not told apart "
                f"({why})")

    def tree_text(self) -> str:
        """Which of the run's processes shared the CPUs: those its configuration names, and
        how many more its tree held ("" when the tree was not read)."""
        if self.tree_procs is None:
            return ""
        named = self.procs * (1 + self.workers) + (1 if self.procs > 1 else 0)
        parts = [f"{self.procs} rank{'s' if self.procs != 1 else ''}" if self.procs > 1
                 else "its main process"]
        if self.procs > 1:
            parts.append("the torchrun agent")
        if self.workers:
            parts.append(f"{self.procs * self.workers} DataLoader worker"
                         f"{'s' if self.procs * self.workers != 1 else ''}")
        more = self.tree_procs - named
        if more > 0:
            parts.append(f"{more} more process{'es' if more != 1 else ''} it started (its "
                         "pipeline's own, or a launcher's)")
        return f"its process tree held up to {self.tree_procs}: " + ", ".join(parts) + "; "

    def describe(self) -> str:
        """'got 52% of the CPU asked for, CPU use 49% of 2 thread(s) on 2 CPU(s), other jobs
        0.95 CPU, CPU pressure 61% (contended: other jobs)'."""
        got = "run-queue wait n/a" if self.got is None else \
            f"got {self.got_text()} of the CPU asked for"
        pressure = "pressure not available here" if self.pressure is None else \
            f"CPU pressure {self.pressure:.0%}"
        others = "" if self.others is None else f", other jobs {self.others:.2f} CPU"
        flag = f" (contended: {self.cause})" if self.contended else ""
        kernel = self.kernel_text()
        kernel = f", {kernel}" if kernel else ""
        return (f"{got}, CPU use {self.use_text()} of {self.threads} thread(s) on "
                f"{self.allowed} CPU(s){others}, {pressure}{kernel}{flag}")


def causes_text(shares) -> str:
    """One or two sentences on why contended figures waited, for a summary (a verdict, a
    table's caption): other jobs, this run's own processes (with the configuration that fits),
    or not told apart; "" when none of ``shares`` is contended.

    Args:
        shares: CpuShare objects (None and uncontended ones are skipped).
    """
    busy = [s for s in shares if s is not None and s.contended]
    out = []
    if any(s.cause == OTHER_JOBS for s in busy):
        most = max((s for s in busy if s.cause == OTHER_JOBS), key=lambda s: s.others or 0)
        out.append(f"Other jobs were running on the same CPUs (up to {most.others:.2f} CPU of "
                   f"{most.cpus_seen}): rerun when they are done, or on CPUs of its own"
                   f"{most.fewer_threads()}.")
    own = [s for s in busy if s.cause == OWN_PROCESSES]
    if own:
        s = own[0]
        fix = (f"{s.configuration()}: {s.fitting()}" if s.oversubscribed else
               f"{s.configuration()} fit, its other processes took the CPUs: fewer processes "
               "per CPU, or more CPUs")
        out.append("No other job was seen" + (" for some" if len(own) < len(busy) else "")
                   + f": this run's own processes took its CPUs ({fix}); a rerun as it is "
                   "waits the same.")
    if any(s.cause == NOT_TOLD for s in busy):
        out.append(("For some, other" if out else "Other") + " jobs and this run's own "
                   "processes could not be told apart (too short a window, or no /proc/stat "
                   "here).")
    return " ".join(out)


def worse(*shares: "CpuShare | None") -> CpuShare | None:
    """The share with the lower judged value (a ratio of two figures is as contended as its
    worse side); None when none is given."""
    present = [s for s in shares if s is not None]
    if not present:
        return None
    return min(present, key=lambda s: (math.inf if math.isnan(s.judged) else s.judged))
