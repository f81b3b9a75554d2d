"""Notebook 06's results (``06_adopt_fix.json``): the user's pipelines against the fix, their
equality check (:mod:`workbook_lib.studies.adoption.equality`) and speed; run by
:mod:`workbook_lib.studies.adoption`."""
from __future__ import annotations

import math

from dataclasses import dataclass, field

from .stat import Stat
from ..records import Record


@dataclass
class TensorDiff(Record):
    """One compared tensor of the pair.

    Attributes:
        name: ``output``, ``output[0]``, ``loss``, or the (slow model's) parameter name.
        kind: ``output``, ``loss`` or ``gradient``.
        max_abs_diff: ``max|fast - slow|`` (NaN when not comparable).
        scale: ``max(max|slow|, max|fast|)``.
        rel_diff: ``max_abs_diff / scale`` (0 when both are exactly equal, inf when not
            comparable).
        probe: ``max|probe - slow|``, how far the rounding probe moved the slow side (NaN
            without a probe).
        allowed: ``max(tol * scale, probe)`` (the rule of the module docstring).
        ratio: ``max_abs_diff / allowed`` (at most 1: equal; inf when not comparable).
        equal: within the rule.
        note: why it is not comparable, or what is special (shapes, no gradient).
        fast_name: the fast model's name of a gradient's parameter, where it differs.
    """

    name: str
    kind: str
    max_abs_diff: float
    scale: float
    rel_diff: float
    probe: float
    allowed: float
    ratio: float
    equal: bool
    note: str = ""
    fast_name: str = ""


def dropout_text(dropout_off: dict[str, dict[str, float]]) -> str:
    """``dropout switched off in both: 3 modules (p = 0.1)``, or per side where they differ, or
    ``no dropout module``."""
    def ps(mods: dict[str, float]) -> str:
        vals = sorted(set(mods.values()))
        return "p = " + ", ".join(f"{v:g}" for v in vals)

    sides = {k: v for k, v in dropout_off.items() if v}
    if not sides:
        return "no dropout module"
    s, f = dropout_off.get("slow", {}), dropout_off.get("fast", {})
    if len(s) == len(f) and sorted(s.values()) == sorted(f.values()):
        return f"dropout switched off in both: {len(s)} module{'s' * (len(s) != 1)} ({ps(s)})"
    return "dropout switched off: " + "; ".join(
        f"{len(m)} module{'s' * (len(m) != 1)} in {side}" + (f" ({ps(m)})" if m else "")
        for side, m in (("slow", s), ("fast", f)))


@dataclass
class EqualityResult(Record):
    """Both pipelines on the same batch(es), every output, loss and gradient compared.

    Attributes:
        slow, fast: the two pipelines' names.
        tolerance: the relative tolerance of the rule (module docstring), of the precision used.
        tolerance_basis: how it was derived, in words.
        batch_size: samples per compared batch (the slow pipeline's).
        batches: how many batches were compared (each row: the largest over them).
        renames: the explicit ``slow name -> fast name`` renames applied.
        rows: one per compared tensor.
        buffers_copied: buffers copied from the slow model (same name and shape).
        buffers_not_copied: buffers of the fast model that had no same-named, same-shaped
            buffer in the slow model (left as the fast model built them).
        device: where both ran.
        precision: ``float64`` or ``float32``: what both ran in.
        precision_note: why float32, where float64 could not run (empty otherwise).
        probe: the rounding injected for the rule's probe, in words.
        mode: ``train`` (every module in training mode but dropout) or ``eval``.
        dropout_off: the dropout modules switched off, ``{"slow"|"fast": {module: p}}``.
        randomness: what the runs with another seed found, in words.
    """

    slow: str
    fast: str
    tolerance: float
    tolerance_basis: str
    batch_size: int
    batches: int
    renames: dict[str, str] = field(default_factory=dict)
    rows: list[TensorDiff] = field(default_factory=list)
    buffers_copied: list[str] = field(default_factory=list)
    buffers_not_copied: list[str] = field(default_factory=list)
    device: str = ""
    precision: str = "float32"
    precision_note: str = ""
    probe: str = ""
    mode: str = "train"
    dropout_off: dict[str, dict[str, float]] = field(default_factory=dict)
    randomness: str = ""

    @property
    def equal(self) -> bool:
        return bool(self.rows) and all(r.equal for r in self.rows)

    @property
    def differing(self) -> list[TensorDiff]:
        return [r for r in self.rows if not r.equal]

    @property
    def worst(self) -> TensorDiff | None:
        """The row furthest from its tolerance (a not comparable one first)."""
        if not self.rows:
            return None
        return max(self.rows, key=lambda r: r.ratio)

    def conditions(self) -> str:
        """How both ran, in one sentence: precision, modes, dropout switched off."""
        prec = (f"in {self.precision}" if not self.precision_note else
                f"in {self.precision} ({self.precision_note})")
        mode = ("every module in eval mode" if self.mode == "eval" else
                "in training mode")
        return f"Both ran {prec}, {mode}; {dropout_text(self.dropout_off)}."

    def summary(self) -> str:
        """One sentence: equal or not, and the largest difference."""
        w = self.worst
        rounding = f"{self.precision} rounding"
        if self.equal:
            return (f"'{self.fast}' computes the same as '{self.slow}': outputs, loss and "
                    f"{sum(r.kind == 'gradient' for r in self.rows)} parameter gradients within "
                    f"{rounding} (tolerance {self.tolerance:.1e}; the closest to its limit:"
                    f" {w.name}, {w.ratio:.2g} of it)")
        bad = self.differing
        names = ", ".join(r.name for r in bad[:6]) + (f" and {len(bad) - 6} more"
                                                      if len(bad) > 6 else "")
        worst = (w.note if w.note else f"{w.ratio:.3g}x the allowed difference, "
                 f"{w.rel_diff:.2e} of its size")
        return (f"'{self.fast}' does NOT compute the same as '{self.slow}': {len(bad)} of "
                f"{len(self.rows)} tensors differ beyond {rounding} ({names}; the "
                f"largest: {w.name}, {worst})")


@dataclass
class AdoptionResult(Record):
    steps: int
    warmup_steps: int
    batch_size: int
    lr: float
    optimizer: str
    losses: dict[str, list[float]]
    # per step: the least relative RMS difference of the predictions that the losses imply
    rel_diff: list[float]
    max_rel_diff: float
    step: dict[str, Stat]  # seconds per step (timed steps)
    speedup: Stat | None  # replicated / fix, paired by round (None: not applicable)
    memory_per_sample: dict[str, float] = field(default_factory=dict)
    epochs_per_day: dict[str, dict[str, float]] = field(default_factory=dict)
    projection_basis: str = ""
    device: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    label_variance: float | None = None  # the loss of predicting the labels' mean
    # the loss curves "agree" within this: 1e-5 on a CPU; on CUDA (atomic sums in any order) the
    # float32 accumulation bound of measurement.precision, if larger
    tolerance: float = 1e-5
    tolerance_basis: str = "float32 rounding (1e-5)"
    # "builtin" (replicated masks against the node-mask shared graph) or "pipelines" (the user's
    # slow pipeline against its rewrite, named in gap_strategies); keys of losses/step -> names
    mode: str = "builtin"
    names: dict[str, str] = field(default_factory=dict)
    applicable: bool = True
    reason: str = ""  # why 06 does not apply, one sentence (when not applicable)
    equality: EqualityResult | None = None  # the check before training
    # how rel_diff is computed from the losses
    rule: str = "the least relative RMS difference of the predictions the MSE losses imply"
    # the first step (from 0) whose loss was not finite on either side, and the pipelines whose
    # loss was not: rel_diff stops before it (None: every loss finite)
    nonfinite_step: int | None = None
    nonfinite: list[str] = field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        """The reference's key then the rewrite's."""
        return list(self.losses) or list(self.names)


@dataclass
class Speedup(Record):
    """One of the fix's speedups over replicated masks, and what it includes."""

    name: str
    notebook: str
    value: float
    iqr: float | None
    measures: str  # what is timed
    batches: str  # the batch sizes of the two sides
    sizes: str  # the graph and model sizes


@dataclass
class Proof(Record):
    """An ``equal`` outcome for a pair of pipeline sources."""

    slow: str  # the slow spec's target
    fast: str
    equal: bool
    summary: str  # the check's one line
    when: str  # local time it ran
    files: list[str]  # the source files it is keyed by
    # every other file of the user's own code loaded when it ran (a helper the pipelines
    # import), with its content's sha256: a changed one retires the proof (a user trial)
    depends: dict[str, str] = field(default_factory=dict)

    def words(self, slow_name: str) -> str:
        return (f"proven equal to '{slow_name}' by `equal` ({self.when})" if self.equal else
                f"shown to differ from '{slow_name}' by `equal` ({self.when}: {self.summary})")


def finite_loss(x: float | None) -> bool:
    """A loss that is a finite number (None: one that was not, read back from a results
    file)."""
    return x is not None and math.isfinite(x)


def loss_fall(losses: list[float], window: int = 10) -> tuple[float, float]:
    """(mean loss of the first ``window`` steps, of the last ``window``): how far training
    brought it."""
    if not losses:
        raise ValueError("'losses' must hold at least one value")
    finite = [x for x in losses if finite_loss(x)]  # a diverged run's
    if not finite:
        return float("nan"), float("nan")
    w = max(1, min(window, len(finite) // 4 or 1))
    return sum(finite[:w]) / w, sum(finite[-w:]) / w
