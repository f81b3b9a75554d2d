"""A repeated measurement and its noise (:class:`Stat`: median, quartiles, IQR, n, the
confidence interval of the median, what the process got of the CPUs), and variants timed in the
same rounds (:class:`Interleaved`); timed by :mod:`workbook_lib.measurement.timing`."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..records import Record
from .cpu import CpuShare, worse

DEFAULT_TARGET = 0.10


CI_LEVEL = 0.95  # the confidence of the median's interval that precision is judged on


def ci_rank(n: int, level: float = CI_LEVEL) -> int:
    """The rank ``k`` of :meth:`Stat.median_ci` on ``n`` samples: the interval is the k-th
    smallest to the k-th largest, the largest ``k`` whose binomial(n, 1/2) coverage is at least
    ``level`` (1, the whole range, when n is too small for it)."""
    k, tail = 0, 0.0  # tail: P(Bin(n, 1/2) <= k - 1), the mass left out on each side
    while True:
        nxt = tail + math.comb(n, k) / 2 ** n
        if 1 - 2 * nxt < level or k + 1 > n - k:
            break
        k, tail = k + 1, nxt
    return max(k, 1)


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
        k = ci_rank(n, level)
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


@dataclass
class Interleaved(Record):
    """Variants timed in rounds (every variant once per round, order rotating)."""

    stats: dict[str, Stat]
    rounds: int
    seconds: float

    def ratio(self, a: str, b: str) -> Stat:
        """``a / b`` from the per-round ratios (paired: drift between rounds cancels)."""
        return self.stats[a].ratio_to(self.stats[b], paired=True)


def within_noise(st: Stat, value: float = 1.0) -> bool:
    """True when ``value`` lies inside the figure's interquartile range."""
    return st.q1 <= value <= st.q3
