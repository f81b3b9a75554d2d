"""Honest timing: warm-up, device sync around every timed region, repeats, median and IQR."""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch


def sync(device: torch.device | str | None) -> None:
    """Wait for queued device work (CUDA); a no-op on CPU, where work is synchronous."""
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda":
        torch.cuda.synchronize(dev)


@dataclass
class Stats:
    """Summary of repeated measurements (seconds)."""

    samples: list[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples)) if self.samples else float("nan")

    @property
    def q1(self) -> float:
        return float(np.percentile(self.samples, 25)) if self.samples else float("nan")

    @property
    def q3(self) -> float:
        return float(np.percentile(self.samples, 75)) if self.samples else float("nan")

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    def as_dict(self) -> dict:
        return {"median": self.median, "q1": self.q1, "q3": self.q3, "iqr": self.iqr,
                "n": self.n}


def measure(fn: Callable[[], object], *, device: torch.device | str = "cpu", warmup: int = 2,
            repeats: int = 5) -> Stats:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` timed calls, each between
    device syncs.

    Args:
        fn: the work to time (its return value is discarded).
        device: where it runs; CUDA is synchronized before and after each call.
        warmup: untimed calls first (default 2).
        repeats: timed calls (default 5).
    """
    if repeats <= 0:
        raise ValueError(f"'repeats' must be a positive integer (got {repeats})")
    if warmup < 0:
        raise ValueError(f"'warmup' must be >= 0 (got {warmup})")
    for _ in range(warmup):
        fn()
    sync(device)
    out = Stats()
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.samples.append(time.perf_counter() - t0)
    return out


class StageTimer:
    """Accumulates synchronized wall time per named stage, per step.

    >>> timer = StageTimer("cpu")
    >>> with timer.stage("forward"):
    ...     pass
    >>> timer.next_step()
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = device
        self.steps: list[dict[str, float]] = [{}]

    @contextmanager
    def stage(self, name: str):
        sync(self.device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            sync(self.device)
            cur = self.steps[-1]
            cur[name] = cur.get(name, 0.0) + time.perf_counter() - t0

    def add(self, name: str, seconds: float) -> None:
        """Record a duration measured elsewhere (e.g. inside a DataLoader worker)."""
        cur = self.steps[-1]
        cur[name] = cur.get(name, 0.0) + float(seconds)

    def next_step(self) -> None:
        self.steps.append({})

    def completed(self) -> list[dict[str, float]]:
        return [s for s in self.steps if s]

    def medians(self) -> dict[str, float]:
        """Median seconds per stage over completed steps (0 where a step lacked the stage)."""
        steps = self.completed()
        names = sorted({k for s in steps for k in s})
        return {k: float(statistics.median([s.get(k, 0.0) for s in steps])) for k in names}
