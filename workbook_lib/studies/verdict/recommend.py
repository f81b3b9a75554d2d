"""The fix recommended: the fastest exact pipeline of notebook 03's loop, ties and the full-size
benchmark's say included (see the package docstring)."""
from __future__ import annotations

from pathlib import Path

from ...results.cpu import causes_text
from ...measurement.timing import Stat
from ... import pipelines
from ...training.loop import project_epochs
from ...results.bench import BenchResult
from ...results.verdict import Recommendation, step_words
from ..timing import is_exact
from .gap import step_mode


def label(name: str) -> str:
    return pipelines.label(name)


def title(name: str) -> str:
    return pipelines.title(name)


def _bench(run_dir: Path, mask_cost) -> tuple[BenchResult | None, str]:
    """The benchmark to quote: a real-spec one when measured (``bench.json`` from the CLI in the
    run folder, else notebook 02's), otherwise 02's reduced-size one; None when neither ran."""
    import json

    own = getattr(mask_cost, "bench", None) if mask_cost is not None else None
    path = Path(run_dir) / "bench.json"
    if path.is_file():
        try:
            b = BenchResult.from_json(json.loads(path.read_text()))
            if b.full_size or own is None or not own.full_size:
                return b, "bench.json (python -m workbook_lib bench) in the run folder"
        except (ValueError, KeyError, TypeError):
            pass
    return own, "notebook 02" if own is not None else ""


def tied_with_fastest(ms: dict[str, Stat], tie_tolerance: float,
                      target: float) -> tuple[str, list[str], list[str]]:
    """The fastest median, the strategies tied with it (median within ``tie_tolerance``, or, when a
    figure is disturbed, an overlapping IQR), and those tied only because of the disturbance.
    """
    fastest = min(ms, key=lambda n: ms[n].median)
    f = ms[fastest]
    close = {n for n in ms if ms[n].median <= f.median * (1 + tie_tolerance)}
    noisy = {n for n in ms if n not in close and (not f.known_to(target)
                                                  or not ms[n].known_to(target))
             and ms[n].q1 <= f.q3}
    return fastest, sorted(close | noisy), sorted(noisy)


def _thread_effects(ddp, base: int) -> dict[str, float] | None:
    """Per pipeline, its step with all the allocation's threads over its step at 04's threads
    per rank (04's thread effect, at its smallest world size), where 04 ran its ranks on fewer
    threads than 03 (a pipeline without a sound one is left out: no multi-rank figure rests
    on 03's step then); None where the threads were the same (nothing to correct)."""
    w = (getattr(ddp, "worlds", {}) or {}).get(base) if ddp is not None else None
    most = getattr(w, "threads_all", None)
    if not most or min(getattr(w, "threads_per_rank", None) or [most]) >= most:
        return None
    return {n: st.median for n, st in (getattr(w, "thread_step_effect", None) or {}).items()
            if not st.contended}


def threads_words(ddp, base: int) -> str:
    """'1 thread(s) per rank (03: 2)'."""
    w = ddp.worlds[base]
    return f"{min(w.threads_per_rank)} thread(s) per rank (03: {w.threads_all})"


def recommend(timing, mask_cost, ddp, run_dir: Path, *, baseline: str, tie_tolerance: float,
              num_samples: int, target: float = 0.1, exclude: tuple[str, ...] = (),
              exact: set[str] | None = None, words: dict[str, str] | None = None,
              proven: set[str] = frozenset(), gap_fast: str | None = None) -> Recommendation | None:
    """The fastest exact pipeline of notebook 03 (None when none is exact).

    Args:
        mask_cost: 02's result or None (ties then go to the fastest median); ddp: 04's or None.
        exclude: pipelines left out (e.g. a loss not finite).
        exact: the pipelines known to be exact (default: those that declared it).
        words: each pipeline's exactness in words; proven: those proven by ``equal``.
        gap_fast: the faster side of the pair's gap where it is resolved (same rounds), else
            None: the slow pipeline tied with the fastest then stays (no switch is shown to pay).
    """
    lo = timing.loops
    known = exact if exact is not None else {n for n in lo.strategies if is_exact(lo, n)}
    exact = [n for n in lo.strategies if n in known and n not in exclude]
    if not exact:
        return None
    # the step a plain training loop runs (no per-stage records) where every pipeline compared
    # here has one, as the gap's figure: one figure for one pair (found by a user trial: the
    # answer's 11.8x gap beside this section's 10.6x of the recorded full steps)
    mode = step_mode(lo, [n for n in {*exact, baseline} if n in lo.strategies])
    timed = step_words(mode)  # the step the figures below time
    ms = {n: lo.arm(n, mode).ms_per_sample for n in exact}
    fastest, tied, noisy = tied_with_fastest(ms, tie_tolerance, target)
    why = (f"within {tie_tolerance:.0%} of the fastest" if not noisy else
           f"within {tie_tolerance:.0%} of the fastest or, on this disturbed run, with IQRs "
           f"overlapping its ({', '.join(noisy)})")
    mem = mask_cost.memory.per_sample() if mask_cost is not None and \
        getattr(mask_cost, "memory", None) is not None else {}
    if len(tied) > 1 and all(n in mem for n in tied):
        best = min(tied, key=lambda n: (mem[n], ms[n].median))
        rule = (f"{len(tied)} strategies {why}: the least memory per sample measured in "
                "notebook 02 wins")
    else:
        best = fastest
        rule = ("the only exact pipeline in this run" if len(ms) == 1 else
                f"the fastest {timed} per sample of the exact pipelines" if len(tied) == 1 else
                f"{len(tied)} strategies {why}; memory per sample was not measured for all of "
                "them, so the fastest median wins"
                + (" (disturbed: their steps vary beyond the precision target; more steps firm the "
                   "choice up)"
                   if noisy else ""))
    if gap_fast is not None and gap_fast in exact and best == baseline:
        # the pair's resolved gap (its rounds paired) outranks the medians per sample, which a
        # disturbed run can turn over (a user trial: a 1.19x gap beside 'none faster')
        best = gap_fast
        rule += (f"; {title(gap_fast)} instead, the faster side of the pair's resolved gap "
                 "(same rounds), where the medians per sample put the slow one first")
    elif gap_fast is None and baseline in tied and best != baseline and \
            not all(n in mem for n in tied):
        # the slow side among the tied, the pair's gap not resolved: a switch is not shown to
        # pay (a user trial: the faster median won, 1.03x one run, 0.971x the other)
        best = baseline
        rule = (f"{len(tied)} strategies {why}, {title(baseline)} among them, and its gap to "
                "them not resolved: on these figures no switch from it is shown to pay"
                + (" (disturbed: their steps vary beyond the precision target; more steps "
                   "settle it)" if noisy else ""))
    # the slow side kept, with others tied with it: the fastest of them, named with its figure
    others = [n for n in tied if n != baseline] if best == baseline else []
    alternative = min(others, key=lambda n: ms[n].median) if others else ""
    contended = sorted(n for n in exact if ms[n].contended)
    if contended:
        rule += (f"; measured while the process got less CPU than it asked for "
                 f"({', '.join(contended)}: contended), which can change the order of these "
                 "figures, so this choice is provisional. "
                 + causes_text(ms[n].cpu for n in contended))
    def against_slow(n: str) -> Stat | None:
        """The slow pipeline's step over ``n``'s, per sample, paired by round."""
        if baseline not in lo.strategies or baseline == n:
            return None
        return lo.ratio(lo.arm(baseline, mode), lo.arm(n, mode)).scaled(
            lo.arm(n, mode).samples_per_step / lo.arm(baseline, mode).samples_per_step, "ratio")
    speed = against_slow(best)
    bench, source = _bench(run_dir, mask_cost)
    worlds = sorted(getattr(ddp, "worlds", {}) or {})
    gap = getattr(ddp, "gap", None)
    factors = (getattr(gap, "step_factors", {}) or {}) if gap is not None else {}
    top, base = (worlds[-1], worlds[0]) if worlds else (1, 1)
    threads = _thread_effects(ddp, base)
    epochs = {}
    for n in {best, baseline, alternative} & set(lo.strategies):
        a = lo.arm(n, mode)
        one = project_epochs(a.step.median, a.samples_per_step, num_samples)["epochs_per_day"]
        epochs[n] = {"1 rank": one}
        te = 1.0 if threads is None else threads.get(n)
        if top != base and n in factors and not factors[n].contended and te is not None:
            # its own factor, if sound, from its step at 04's threads per rank: 03's step at
            # all threads over the thread effect (found by a user trial: 134 epochs a day at
            # 2 ranks beside ~119 from 04's own steps, the threads' gain counted twice)
            epochs[n][f"{top} ranks"] = one * (top / base) / factors[n].median * te
    basis = (f"80% of {num_samples:,} samples per epoch; 1 rank: notebook 03's {timed}"
             + (" (as a plain training loop runs it, no per-stage records: the gap's steps)"
                if mode != "full" else "")
             + (f"; {top} ranks: {top / base:g}x the samples per step at each pipeline's own "
                f"step factor measured in notebook 04 (weak scaling, separate launches)"
                + (f", from its step at {threads_words(ddp, base)}: 03's step over the thread "
                   "effect 04 measured paired (its step with all threads over the same at the "
                   "threads per rank)" if threads is not None else "")
                + "; a pipeline 04 did not run, or whose factor"
                + (" or thread effect" if threads is not None else "")
                + f" was measured contended, has no {top}-rank figure" if top != base else
                "; no multi-rank figure (notebook 04 did not measure one)"))
    return Recommendation(strategy=best, label=label(best), title=title(best),
                          ms_per_sample=ms[best],
                          baseline=baseline, speedup=speed, fastest=fastest, tied=tied,
                          tie_rule=rule, memory_per_sample=mem, contended=contended,
                          bench=bench, bench_source=source,
                          epochs_per_day=epochs, projection_basis=basis,
                          exactness=(words or {}).get(best, "declared exact"),
                          proven=best in proven, step_mode=mode, alternative=alternative,
                          alternative_speedup=against_slow(alternative) if alternative else None)
