"""How each stage of a pipeline's step grows with the samples of a batch.

The loop also runs the pair's full step at a second batch size (half, or 2 for a batch of 1),
interleaved; per round, a stage's difference between the two sizes gives its cost per extra
sample, and the counted steps give the extra operator calls and host syncs per sample.
"""
from __future__ import annotations

from ...measurement.timing import Stat
from ...results.timing import GROWS_SHARE, HALF, Growth, arm_key
from .stages import stage_series

COUNTED = {"loss": ("loss", "loss_backward")}  # a named stage's counted parts


def second_batch(b: int) -> int:
    """The second batch size: half of ``b``, or 2 for a batch of 1."""
    return b // 2 if b >= 2 else 2


def _per_step(arm, stage: str, field: str) -> float | None:
    counted = getattr(arm, field) or {}
    parts = COUNTED.get(stage, (stage,))
    if not counted or not any(k in counted for k in parts):
        return None
    return float(sum(counted.get(k, 0.0) for k in parts))


def growth(loops, name: str) -> dict[str, Growth]:
    """Every stage's growth for pipeline ``name`` from notebook 03's ``loops`` (paired by round
    when interleaved, else against the median at the second size); empty when its second arm did
    not run.
    """
    key = arm_key(name, HALF)
    if key not in loops.arms:
        return {}
    a, h = loops.arm(name, "full"), loops.arms[key]
    big, small = a.samples_per_step, h.samples_per_step
    sa, sh = stage_series(a), stage_series(h)
    n = min(a.step.n, h.step.n)
    out = {}
    for stage, xs in sa.items():
        ys = sh.get(stage)
        if not ys or stage == "overhead":
            continue
        if loops.interleaved:  # the same rounds
            diffs = [x - y for x, y in zip(xs[:n], ys[:n])]
        else:  # separate series: each step at the big size against the other's median
            m = Stat.from_samples(ys).median
            diffs = [x - m for x in xs]
        per = Stat.from_samples([d / (big - small) for d in diffs],
                                unit="s/sample").with_cpu(a.step.cpu, h.step.cpu)
        at = Stat.from_samples(xs).with_cpu(a.step.cpu)
        share = per.median * big / at.median if at.median > 0 else 0.0
        extra = {}
        for fld, label in (("ops_by_stage", "ops"), ("syncs_by_stage", "syncs")):
            x, y = _per_step(a, stage, fld), _per_step(h, stage, fld)
            extra[label] = None if x is None or y is None else (x - y) / (big - small)
        out[stage] = Growth(stage, (big, small), per, at, share, extra["ops"], extra["syncs"],
                            grows=per.median_ci()[0] > 0 and share >= GROWS_SHARE)
    return out
