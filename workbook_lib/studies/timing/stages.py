"""What a training step's time goes to, stage by stage, and what bounds it.

Turns one pipeline's full-step arm of :mod:`workbook_lib.training.loop` into named stages: data
item and collate (the DataLoader wait, split in the proportion of the workers' own times),
transfer, device prep, forward, loss, backward, optimizer, and loop overhead (the rest).
:func:`step_bound` names the group with the largest share, and "sync-bound on a GPU" when the
step makes at least one host sync per sample (more for each extra sample, where two batch sizes
were run).

Written here rather than taken from a profiler's "input-bound / compute-bound" summary because
the stages are the harness's own (measured between syncs, worker times sent with each batch), and
the verdict needs them per stage, not in two bins.
"""
from __future__ import annotations


from ...measurement.timing import Stat
from ...results.timing import BOUND_RULE, BOUND_WORDS, GROUPS, STAGES, StepBound  # noqa: F401

SYNC_STAGES = ("device_prep", "forward", "loss", "loss_backward", "backward")


TIMED = ("h2d", "device_prep", "forward", "backward", "optimizer")
LOSS_PARTS = ("loss", "loss_backward")


def stage_series(arm) -> dict[str, list[float]]:
    """``{stage key: per-step seconds}`` of a full-step ``arm`` for the stages it measured
    (``overhead`` always): the DataLoader wait split into data item and collate, the loss's forward
    and backward summed as "loss".
    """
    s = arm.stages
    out: dict[str, list[float]] = {}
    if "loader_wait" in s:
        item = arm.extra["worker_fetch"].median if "worker_fetch" in arm.extra else 0.0
        coll = arm.extra["worker_collate"].median if "worker_collate" in arm.extra else 0.0
        frac = item / (item + coll) if item + coll > 0 else 1.0
        wait = s["loader_wait"].samples
        out["data_item"] = [w * frac for w in wait]
        out["collate"] = [w * (1.0 - frac) for w in wait]
    for key in TIMED:
        if key in s:
            out[key] = list(s[key].samples)
        if key == "forward" and any(k in s for k in LOSS_PARTS):
            parts = [s[k].samples for k in LOSS_PARTS if k in s]
            out["loss"] = [sum(x) for x in zip(*parts)]
    out["overhead"] = list(arm.untracked.samples)
    return out


def stage_medians(arm) -> dict[str, float]:
    """Seconds per step of each stage :func:`stage_series` names (medians over the steps)."""
    return {k: Stat.from_samples(v).median for k, v in stage_series(arm).items() if v}


def stage_quartiles(arm) -> dict[str, tuple[float, float]]:
    """(first, third) quartile in seconds per step of each stage :func:`stage_series` names."""
    out = {}
    for k, v in stage_series(arm).items():
        if v:
            st = Stat.from_samples(v)
            out[k] = (st.q1, st.q3)
    return out


def within_noise(slow: tuple[float, float], fast: tuple[float, float], slow_steps: float,
                 fast_steps: float) -> bool:
    """Whether a stage's difference between the pair is within its noise: its interquartile
    ranges per epoch (quartiles per step x steps per epoch) on the two sides overlap, so the
    order of the two is not resolved. A zero-width range (a stage one side does not have, or a
    constant) overlaps only a range that contains it."""
    a_lo, a_hi = slow[0] * slow_steps, slow[1] * slow_steps
    b_lo, b_hi = fast[0] * fast_steps, fast[1] * fast_steps
    return a_lo <= b_hi and b_lo <= a_hi


def model_syncs(arm) -> float | None:
    """Host syncs per step in the device prep, forward and backward (the counted step), or
    None when the arm was not counted. The transfer's own syncs (a pageable copy) are apart."""
    if arm.syncs_per_step is None:
        return None
    if arm.syncs_by_stage:
        return float(sum(arm.syncs_by_stage.get(k, 0.0) for k in SYNC_STAGES))
    return float(arm.syncs_per_step)


def step_bound(arm, growth: dict | None = None) -> StepBound:
    """What bounds a pipeline's full step, by :data:`BOUND_RULE`.

    Args:
        arm: the pipeline's full-step :class:`~workbook_lib.results.timing.ArmResult`.
        growth: its stages' :class:`~workbook_lib.results.timing.Growth` (two batch sizes),
            or None: the syncs per sample are then the step's over its batch (a user trial:
            14 syncs of a fixed per-step function at batch 4 were called sync-bound, where
            none grew with the batch).
    """
    med = stage_medians(arm)
    step = arm.step.median
    if step <= 0:
        raise ValueError(f"arm {arm.name!r}: its step median must be positive (got {step})")
    groups = {g: 0.0 for g in GROUPS}
    for key, sec in med.items():
        groups[STAGES[key][1]] += max(sec, 0.0)
    shares = {g: v / step for g, v in groups.items()}
    top = max(GROUPS, key=lambda g: shares[g])
    largest = max(med, key=lambda k: med[k])
    syncs = model_syncs(arm)
    grown = [g.syncs_per_sample for k, g in (growth or {}).items()
             if k in SYNC_STAGES and g.syncs_per_sample is not None]
    extra = float(sum(grown)) if grown else None
    bound = extra >= 1.0 if extra is not None else \
        syncs is not None and syncs >= arm.samples_per_step
    return StepBound(pipeline=arm.strategy, bound=BOUND_WORDS[top], group_shares=shares,
                     largest_stage=largest, largest_share=med[largest] / step, step_s=step,
                     batch_size=arm.samples_per_step, syncs_per_step=syncs,
                     sync_bound_on_gpu=bool(bound and syncs),
                     stage_shares={k: v / step for k, v in med.items()},
                     syncs_per_extra_sample=extra)
