"""The gap between the run's two pipelines from notebook 03's loop, per epoch, and what notebook
04's DDP factor adds to it when it is a measured effect (see the package docstring)."""
from __future__ import annotations

import math

from ...measurement.timing import Stat
from ...results.stat import CI_LEVEL, ci_rank
from ...results.timing import PIPELINED, arm_key
from ...results.verdict import Gap


def _epoch_steps(lo, name: str, num_samples: int) -> int:
    return math.ceil(0.8 * num_samples / lo.arm(name, "full").samples_per_step)


def _ddp_gap(ddp, slow: str, fast: str):
    """Notebook 04's gap decomposition of this pair (either orientation), or None."""
    g = getattr(ddp, "gap", None) if ddp is not None else None
    if g is None or {g.slow, g.fast} != {slow, fast}:
        return None
    return g


def ddp_booking(g, swapped: bool, target: float = 0.1) -> tuple[Stat | None, bool, str]:
    """(the DDP factor oriented slow over fast, whether it is booked, why).

    Booked only when it is a measured effect the answer can rest on: 1 outside its IQR, not
    contended, and not disturbed (its median known to ``target``, the rule of
    :func:`disturbed_figures`)."""
    if g is None:
        return None, False, ""
    f = g.ddp_factor
    if swapped:
        f = Stat.from_samples([1.0 / x for x in f.samples if x > 0], unit="ratio").with_cpu(
            f.cpu) if f.samples else f
    if g.world_size == g.base_world_size:
        return None, False, "one world size measured: no DDP factor"
    if f.contended:
        return f, False, "contended (its ranks got less CPU than they asked for): not booked"
    if f.q1 <= 1.0 <= f.q3:
        return f, False, "1 lies within its IQR: no measurable effect, not booked"
    if f.n > 1 and not f.known_to(target):
        return f, False, (f"disturbed (its median known to ±{f.ci_half_width():.0%}, beyond the "
                          f"{target:.0%} target): not booked")
    return f, True, "1 outside its IQR: booked"


MIN_PAIRED = 5  # fewer repeats than this have no IQR to speak of: nothing is resolved on them


def resolved(r: Stat, target: float) -> int:
    """+1 when the ratio ``r`` is above 1 beyond its noise and the precision target (its IQR and
    its median's confidence interval, :meth:`Stat.median_ci`, clear of 1; its median outside
    [1/(1+target), 1+target]), -1 likewise below, else 0; always 0 on fewer than
    :data:`MIN_PAIRED` repeats. On 5 to 8 paired repeats the interval is their range: every
    pair must agree (a one-sided sign test at 96% or better), where the IQR alone let one
    pipeline timed twice come out 1.13x "slower" than itself (IQR 0.46, n = 6) on a loaded
    machine.
    """
    if r.n < MIN_PAIRED:
        return 0
    lo, hi = r.median_ci()
    if r.q1 > 1.0 and lo > 1.0 and r.median > 1.0 + target:
        return 1
    if r.q3 < 1.0 and hi < 1.0 and r.median < 1.0 / (1.0 + target):
        return -1
    return 0


def unresolved(r: Stat, target: float) -> tuple[str, int | None]:
    """Why :func:`resolved` gives 0, in words, and the paired steps that would let the steps
    that came out the other way stand beside a gap (None where more steps are not the
    answer); ``("", None)`` where it does not give 0. Found by a user trial: a 1.52x ratio
    (quartiles 1.51-1.64) that one disturbed step of six vetoed was told 'IQR holds 1'."""
    if resolved(r, target) != 0:
        return "", None
    if r.n < MIN_PAIRED:
        return f"{r.n} paired steps, at least {MIN_PAIRED} needed", MIN_PAIRED
    if r.q1 <= 1.0 <= r.q3:
        return "its IQR holds 1", None
    if 1.0 / (1.0 + target) <= r.median <= 1.0 + target:
        return f"its median within the {target:.0%} precision target of 1", None
    above = r.median > 1.0
    other = sorted(x for x in r.samples if (x <= 1.0 if above else x >= 1.0))
    lo, hi = r.median_ci()
    need = next(m for m in range(r.n, 10 * r.n + 100) if ci_rank(m) > len(other))
    worst = (other[0] if above else other[-1]) if other else None
    return (f"{len(other)} of {r.n} paired steps the other way"
            + (f" ({worst:.3g}x)" if worst is not None else "")
            + f", so the median's {CI_LEVEL:.0%} interval ({lo:.3g}-{hi:.3g}) holds 1", need)


def step_mode(lo, names) -> str:
    """The arm whose steps compare ``names``: the step a plain training loop runs (03's
    pipelined arm: no stage records, whose cost the synchronized full step adds to every step)
    where every one of them has one, else the full step."""
    return PIPELINED if all(arm_key(n, PIPELINED) in lo.arms for n in names) else "full"


def measure_gap(lo, slow: str, fast: str, num_samples: int, ddp=None,
                target: float = 0.1) -> Gap:
    """The pair's epoch-time ratio, oriented so that ``slow`` is the slower beyond the noise.

    Args:
        lo: notebook 03's loop study; slow, fast: the pair as listed; ddp: 04's result or None.
        num_samples: the dataset size (80% of it per epoch).
        target: the precision target the gap must exceed (never when measured contended).
    """
    listed = [slow, fast]
    steps = {n: _epoch_steps(lo, n, num_samples) for n in listed}
    mode = step_mode(lo, listed)
    plain = mode == PIPELINED

    def ratio(a: str, b: str) -> tuple[Stat, Stat]:
        per_step = lo.ratio(lo.arm(a, mode), lo.arm(b, mode))
        return per_step, per_step.scaled(steps[a] / steps[b], "ratio")

    per_step, r = ratio(slow, fast)
    swapped = resolved(r, target) < 0 and not r.contended
    if swapped:
        slow, fast = fast, slow
        per_step, r = ratio(slow, fast)
    basis = ("epoch time on one process: notebook 03's "
             + ("pipelined steps (as a plain training loop runs them, no per-stage records) "
                if plain else "full steps ")
             + ("paired by round" if lo.interleaved else "(separate series)")
             + " x steps per epoch")
    g = _ddp_gap(ddp, *listed)
    factor, booked, why = ddp_booking(g, swapped=g is not None and g.slow != slow,
                                      target=target)
    if booked:
        r = r.times(factor)
        basis += f" x the DDP factor at {g.world_size} ranks (notebook 04, separate launches)"

    def of_medians(m: str) -> float:  # what notebook 03's tables show: each median on its own
        return (lo.arm(slow, m).step.median * steps[slow]
                / max(lo.arm(fast, m).step.median * steps[fast], 1e-300))

    if lo.interleaved:
        medians = of_medians(mode) * (factor.median if booked else 1.0)
        basis += (f"; the median of the rounds' ratios, {r.median:.3g}x, where the ratio of "
                  f"the two medians (notebook 03's tables) is {medians:.3g}x: they differ "
                  "when the rounds vary")
    if plain:  # the stages' shares are of the synchronized full steps' difference
        basis += (f"; the causes' shares are of the full steps' difference (every stage "
                  f"synchronized and recorded: {of_medians('full'):.3g}x per epoch, the "
                  "records' cost added to every step of both)")
    return Gap(slow=slow, fast=fast, listed=listed, swapped=swapped, ratio=r, basis=basis,
               per_step=per_step, steps=steps,
               batch_sizes={n: lo.arm(n, "full").samples_per_step for n in listed},
               epoch_s={n: lo.arm(n, "full").step.median * steps[n] for n in listed},
               measurable=resolved(r, target) > 0 and not r.contended,
               contended=r.contended, ddp_factor=factor,
               ddp_world=None if g is None else g.world_size, ddp_booked=booked, ddp_why=why)
