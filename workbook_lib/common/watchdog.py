"""Stall detection: a stage that stops making progress is stopped and named.

A :class:`Watchdog` watches one stage at a time (:meth:`Watchdog.watch`): what runs, where and
for how long it may. Past that limit, in a process's main thread an interval timer
(``SIGALRM``) raises :class:`Stalled` inside the blocked call (between bytecodes: a C call that
never returns to the interpreter is stopped only once it does); in any other thread the stall
is only reported. A monitor thread names a stage that has run a quarter of its limit (at least
:data:`WAITING_NOTE_S`).

Written here rather than taken from a library: the maintained ones (``timeout-decorator``,
``func-timeout``, ``stopit``) either re-install a ``SIGALRM`` handler per call or run the call
in another thread, which would move a training step off the thread its CUDA stream and
autograd state belong to.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

WAITING_NOTE_S = 15.0  # a stage running a quarter of its limit, and this long, is named


class Stalled(BaseException):
    """A stage ran past its limit (raised inside it by the watchdog).

    A ``BaseException``, as ``KeyboardInterrupt`` is: a pipeline's own ``except Exception``
    (a retry loop around a read) must not swallow it.

    Attributes:
        what: what was running (a pipeline, an arm).
        stage: the stage it was in.
        waited_s: how long the stage had run.
        limit_s: its limit.
    """

    def __init__(self, message: str = "", *, what: str = "", stage: str = "",
                 waited_s: float = 0.0, limit_s: float = 0.0):
        super().__init__(message)
        self.what, self.stage, self.waited_s, self.limit_s = what, stage, waited_s, limit_s


class Watchdog:
    """Stops (or reports) a stage that runs past its limit; see the module docstring.

    A context manager around the work, with :meth:`watch` around each stage; inside a timed region,
    :meth:`arm` before a series of stages, :meth:`enter`/:meth:`leave` around each (attribute writes
    only, no system call) and :meth:`disarm` after.

    Args:
        announce: where notes go (e.g. :func:`workbook_lib.common.progress.note`); None: nowhere.
        why: the rule that set the limit, for messages ("stall_timeout_s").
    """

    def __init__(self, announce: Callable[[str], None] | None = None, why: str = "the limit"):
        self.announce, self.why = announce, why
        self.signals = (threading.current_thread() is threading.main_thread()
                        and hasattr(signal, "setitimer"))
        self.what = self.where = ""
        self.started = 0.0
        self.limit: float | None = None
        self.active = False  # a stage is running (armed: ``limit`` is set)
        self._serial = 0  # one stage watched after another: notes are said once per stage
        self._noted = 0  # serial of the stage last named (negative: its stall)
        self._previous = None
        self._outer_timer: tuple = ((0.0, 0.0), 0.0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Watchdog":
        _ACTIVE.setdefault(os.getpid(), []).append(self)
        if self.signals:
            # an outer user of the one real-time timer (pytest-timeout, a caller's own alarm):
            # its handler and its time left come back when this watchdog ends
            self._outer_timer = (signal.getitimer(signal.ITIMER_REAL), time.monotonic())
            self._previous = signal.signal(signal.SIGALRM, self._fire)
        self._stop.clear()
        if self.announce is not None:
            self._thread = threading.Thread(target=self._monitor, daemon=True,
                                            name="workbook-watchdog")
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        stack = _ACTIVE.get(os.getpid(), [])
        if self in stack:
            stack.remove(self)
        self.limit, self.active = None, False
        if self.signals:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous or signal.SIG_DFL)
            (left, interval), since = self._outer_timer
            if left > 0:  # the outer timer, less the time spent here (at once if it is past)
                signal.setitimer(signal.ITIMER_REAL,
                                 max(1e-3, left - (time.monotonic() - since)), interval)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    @contextmanager
    def watch(self, what: str, where: str, limit_s: float | None) -> Iterator[None]:
        """Watch one stage with its own timer (not nested: a part of it is named with
        :meth:`rename`).

        Args:
            what: what runs (named in the message).
            where: the stage.
            limit_s: how long it may run; None or 0: not watched.
        """
        if not limit_s or limit_s <= 0:
            yield
            return
        self.start(what, where, limit_s)
        try:
            yield
        finally:
            self.stop()

    def start(self, what: str, where: str, limit_s: float) -> None:
        """Start watching a stage with its own timer (for work whose start and end are two
        calls; else :meth:`watch`)."""
        self.arm(limit_s)
        self.enter(what, where)

    def stop(self) -> None:
        """Stop watching (the timer is cancelled)."""
        self.disarm()

    def arm(self, limit_s: float) -> None:
        """Arm the timer for a series of stages (a training step), each then named by
        :meth:`enter` and :meth:`leave` without a system call: the stage that runs when the
        timer fires is checked against its own start, and the timer re-armed for what it has
        left."""
        self.limit = float(limit_s)
        self.active = False
        if self.signals:
            signal.setitimer(signal.ITIMER_REAL, self.limit)

    def disarm(self) -> None:
        """End the series (the timer is cancelled)."""
        self.limit, self.active = None, False
        if self.signals:
            signal.setitimer(signal.ITIMER_REAL, 0)

    def enter(self, what: str, where: str) -> None:
        """A stage of the armed series starts (attribute writes only)."""
        self.what, self.where, self.started = what, where, time.monotonic()
        self._serial += 1
        self.active = True

    def leave(self) -> None:
        """The stage ended (an alarm between stages re-arms the timer)."""
        self.active = False

    def rename(self, where: str) -> None:
        """Name the part of the watched stage now running (e.g. "data item" in the loader
        wait); no effect outside a watched stage."""
        if self.active:
            self.where = where

    def message(self, waited: float) -> str:
        return (f"{self.where} made no progress for {waited:.1f} s (limit {self.limit:g} s: "
                f"{self.why})")

    def _fire(self, signum, frame) -> None:
        limit = self.limit
        if limit is None:
            return  # not armed: an alarm left over
        if not self.active:  # between stages: the next one gets the whole limit
            signal.setitimer(signal.ITIMER_REAL, limit)
            return
        waited = time.monotonic() - self.started
        if waited < limit:  # the stage began after the timer was armed: wait for the rest
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, limit - waited))
            return
        msg = self.message(waited)
        what, where = self.what, self.where
        # again after another limit, should the stage catch it and go on waiting
        signal.setitimer(signal.ITIMER_REAL, limit)
        raise Stalled(msg, what=what, stage=where, waited_s=waited, limit_s=limit)

    def _monitor(self) -> None:
        while not self._stop.wait(0.5):
            limit, serial = self.limit, self._serial
            if limit is None or not self.active or self.announce is None:
                continue
            waited = time.monotonic() - self.started
            if not self.signals and waited > limit and self._noted != -serial:
                self._noted = -serial
                self._say(f"STALLED: {self.what}: {self.message(waited)}; it cannot be stopped from this "
                          "thread (signals reach the main thread only): interrupt the run to "
                          "stop it")
            elif waited > max(WAITING_NOTE_S, limit / 4) and self._noted not in (serial, -serial):
                self._noted = serial
                self._say(f"{self.what}: waiting in {self.where} for {waited:.0f} s (stopped "
                          f"at {limit:g} s: {self.why})")

    def _say(self, text: str) -> None:
        try:
            self.announce(text)
        except Exception:  # noqa: BLE001 - a note must never break the work
            pass


_PROCESS: dict[int, Watchdog] = {}
_ACTIVE: dict[int, list[Watchdog]] = {}


def current() -> Watchdog | None:
    """The watchdog this process entered last (None when none is; a forked child does not
    see its parent's)."""
    stack = _ACTIVE.get(os.getpid())
    return stack[-1] if stack else None


def process_watchdog(announce: Callable[[str], None] | None = None,
                     why: str = "the limit") -> Watchdog:
    """This process's own watchdog, entered once and kept (e.g. in a DataLoader worker, which
    has no place to enter one around its work); one per process id, so a forked child gets its
    own."""
    pid = os.getpid()
    if pid not in _PROCESS:
        _PROCESS.clear()  # a forked child's copy of the parent's entry
        _ACTIVE.clear()
        _PROCESS[pid] = Watchdog(announce, why).__enter__()
    return _PROCESS[pid]
