"""Notebook 05's answer in words, composed from the verdict's figures: the lead sentence, the
caveats it rests on, the fix, the index's headline, and the notes that are evidence only.
"""
from __future__ import annotations

from ... import pipelines
from ...common.text import capitalized as _cap, one_line
from ...results.cpu import FAULTS_HIGH, KERNEL_HIGH
from ...results.verdict import VerdictResult
from .advice import NODEMASK
from .causes import first_causes, offsets, told_apart
from .gap import MIN_PAIRED, unresolved

HEADLINE_MAX = 200
MISSING_WHAT = {"01": "graph inventory", "02": "memory per sample or benchmark",
                "04": "DDP factor"}
DISTURBED_LABELS = {"gap": "the epoch-time gap", "per_step_ratio": "the per-step ratio",
                    "ddp_factor": "the DDP factor",
                    "speedup": "the recommended pipeline's speedup over the slow one (notebook "
                               "03's loop)",
                    "bench": "the benchmark's ratio"}
CONTENDED_LABELS = {**DISTURBED_LABELS, "loop": "notebook 03's steps the fix is chosen by"}


def _pct(x: float) -> str:
    return f"{x:.0%}"


def rests_on(v: VerdictResult) -> set[str]:
    """The headline figures the answer quotes or rests on."""
    keys = set()
    g = v.gap
    if g is not None:
        keys |= {"gap", "per_step_ratio"}
        if g.ddp_booked:
            keys.add("ddp_factor")
    r = v.recommendation
    if r is not None:
        keys.add("loop")
        if r.speedup is not None and (g is None or r.strategy != g.fast):
            keys.add("speedup")
        if r.bench is not None and r.strategy == "node_mask_shared":
            keys.add("bench")
    return keys


def _rested_on(v: VerdictResult, failure: str) -> bool:
    """Whether a failure ("in notebook NN: ...") is in a notebook whose figures the answer rests
    on: 03's timings always, 04's when its DDP factor is booked, 02's when its benchmark is."""
    keys = rests_on(v)
    return failure.startswith("in notebook 03") or (
        failure.startswith("in notebook 04") and "ddp_factor" in keys) or (
        failure.startswith("in notebook 02") and "bench" in keys)


def _cause_words(c, first: bool, held: tuple | None = None) -> str:
    """A cause with its share, and its main site's share of its extra time; where that site is
    ``held`` (:func:`main_site`: the headline's function), the gap share the headline quotes
    too (a user trial: the headline's 87% of the gap was 116% x 75%, said nowhere)."""
    p = f"{c.cause} ({_pct(c.share)}" + (" of the gap" if first else "")
    if c.sites and c.sites[0].share >= 0.5:
        s = c.sites[0]
        if _says_gap(c, held):  # the function's two shares in a clause of their own (a user
            # trial read "(96% of the gap, 99% of its extra time, 95% of the gap, in ...)")
            gap = (f"{'all' if held[1] >= 1.0 else _pct(held[1])} of the gap"
                   + (", its time in other stages included"  # (a user trial: "with its
                      if abs(held[1] - c.share * s.share) > 0.005 else ""))  # other stages")
            p += f"; in {s.short}: {_pct(s.share)} of this stage's extra time, {gap}"
        else:
            p += f", {_pct(s.share)} of its extra time in {s.short}"
        if s.first_steps:  # the recorded steps disagree on it
            p += f", {s.first_steps}"
    return p


def _says_gap(c, held: tuple | None) -> bool:
    """Whether :func:`_cause_words` gives ``c`` the gap share of ``held`` (:func:`main_site`):
    its main site, named (half its extra time or more), is that function, and the figure is not
    its share of the cause again (a cause that is the whole gap, its site nowhere else)."""
    if held is None or not c.sites or c.sites[0].share < 0.5:
        return False
    s, h = c.sites[0], held[0]
    return (h.function, h.file, h.line) == (s.function, s.file, s.line) and \
        not (abs(c.share - 1.0) <= 0.005 and abs(held[1] - s.share) <= 0.005)


def lead(v: VerdictResult) -> str:
    """The answer's first sentence (see the module docstring)."""
    if v.no_answer:
        return f"**No answer about this pair:** {v.no_answer[len('no answer about '):]}." \
            if v.no_answer.startswith("no answer about ") else f"**No answer:** {v.no_answer}."
    g = v.gap
    s, f = pipelines.title(g.slow), pipelines.title(g.fast)
    r = g.ratio
    fig = f"IQR {r.iqr:.2g}, n = {r.n}" + ("; disturbed, not relied on: see below"
                                          if "gap" in v.disturbed else "")
    if not g.measurable and g.contended:
        cpu = r.cpu.explain() if r.cpu is not None else "less CPU than it asked for"
        return (f"**{_cap(s)} and {f}: no gap is resolved, the figures were measured "
                f"contended** (epoch-time ratio {r.median:.3g}x, IQR {r.iqr:.2g}, n = {r.n}; "
                f"{cpu}): another job's share of the CPUs can make one pipeline look slower "
                "than another, so there is no gap to explain on these figures; rerun when the "
                "machine is quiet.")
    if not g.measurable and r.n < MIN_PAIRED:
        return (f"**{_cap(s)} and {f}: too few paired steps to resolve a gap** "
                f"(n = {r.n}, at least {MIN_PAIRED} needed; epoch-time ratio {r.median:.3g}x): "
                "there is no gap to explain on these figures; raise loop_steps.")
    why, need = unresolved(r, v.target)
    if not g.measurable and need is not None:  # not the same speed: too few steps to tell
        return (f"**{_cap(s)} and {f}: a {r.median:.3g}x gap is not resolved** ({fig}; quartiles "
                f"{r.q1:.3g}-{r.q3:.3g}): {why}. There is no gap to explain on these figures; "
                f"at least {need} paired steps would resolve one (loop_steps and loop_max_steps "
                "of at least that), if no more steps come out the other way.")
    if not g.measurable and "gap" in v.disturbed:  # (a user trial: 'the same speed' of a
        # ratio known to +-13% beside a stage that differed 170-fold)
        return (f"**{_cap(s)} and {f}: no gap is resolved** (epoch-time ratio {r.median:.3g}x, "
                f"{fig}; quartiles {r.q1:.3g}-{r.q3:.3g}): {why or 'not resolved'}, and the "
                "steps varied more than these steps can pin down, so these figures tell neither "
                "the same speed nor a gap: there is no gap to explain on them.")
    if not g.measurable:
        return (f"**{_cap(s)} and {f} train at the same speed within the noise**: "
                f"epoch-time ratio {r.median:.3g}x ({fig}; quartiles {r.q1:.3g}-{r.q3:.3g}), "
                f"{why or 'not resolved'}: there is no gap to explain.")
    text = f"**{_cap(s)} is {r.median:.3g}x slower per epoch than {f}** ({fig})"
    first = first_causes(v.causes)
    if not first and not g.steps_agree:  # the stages' steps disagree with the gap
        full = (g.full_difference_s + g.epoch_s[g.fast]) / max(g.epoch_s[g.fast], 1e-300)
        return text + (f"; no cause is ranked: the full steps the stages are timed in came out "
                       f"the other way ({full:.3g}x per epoch, the ratio of their medians), so "
                       "the stage split cannot be read from them; more steps (loop_steps, "
                       "loop_max_steps) settle which is right.")
    if not first:
        top = next((c for c in v.causes if c.effect == "adds" and c.share is not None), None)
        return text + ("; no stage stands out" + (f" (largest: {top.cause}, {_pct(top.share)} "
                                                  "of the gap)" if top else "") + ".")
    parts = []
    held = main_site(v.causes)
    for i, c in enumerate(first):
        p = _cause_words(c, i == 0, held)
        if _says_gap(c, held):
            held = None  # said once (a review: twice where two causes share the function)
        if c.share > 1.0:  # an offsetting term stands beside any share above 100%
            off = offsets(v.causes)
            if off:
                p += ", offset by " + ", ".join(f"{o.cause} {_pct(o.share)}" for o in off[:2])
        parts.append(p + ")")
    if told_apart(first, g):
        text += "; first cause: " + parts[0] + (", then " + ", ".join(parts[1:]) if parts[1:]
                                                 else "")
    else:  # a near tie: both named, neither put first on figures that cannot rank them
        spread = g.ratio.iqr / max(g.ratio.median - 1.0, 1e-12)
        text += (f"; first causes, not told apart at this precision (their shares differ by "
                 f"less than the gap's own spread, its IQR over the ratio minus one: "
                 f"{_pct(spread)} of it): " + parts[0] + " and " + parts[1])
    c = first[0]
    if c.advice and c.diagnosed:  # what its figures show, which may not be a change to make
        return text + f"; its figures show {c.advice}."
    if c.advice and not told_apart(first, g) and first[1].advice and not first[1].diagnosed:
        # neither is first: both changes (a user trial read "not told apart" and then "change
        # first" of one of them as a contradiction)
        return text + (f"; change both, neither first at this precision: the {c.cause}: "
                       f"{c.advice}; the {first[1].cause}: {first[1].advice}.")
    if c.advice:
        return text + f"; change first: {c.advice}."
    return text + (f"; no change follows from these figures alone: {c.finding}.")


def caveats(v: VerdictResult) -> list[str]:
    """One line each: what about the figures the answer rests on it must say."""
    out = []
    g = v.gap
    uses = rests_on(v)
    if g is not None and g.swapped:
        r = g.ratio
        out.append(f"Listed the other way round: gap_strategies names '{g.listed[0]}' as the "
                   f"slow one, but it is the faster ({r.median:.3g}x per epoch, IQR {r.iqr:.2g})"
                   f"; the gap is explained as '{g.slow}' over '{g.fast}'.")
    said = {"gap", "per_step_ratio"} if g is not None and g.contended else set()
    cont = {k: c for k, c in v.contended.items() if k in uses and k not in said}
    if cont:
        worst = min(cont.values(), key=lambda c: c.got if c.got is not None else 1.0)
        out.append("Contended, not relied on: " + ", ".join(
            CONTENDED_LABELS.get(k, k) for k in cont) + f" (the worst: {worst.explain()}).")
    noisy = [k for k in v.disturbed if k not in v.contended and k in uses]
    if noisy:
        out.append("Disturbed, not relied on: " + ", ".join(
            f"{DISTURBED_LABELS.get(k, k)} (its median known to ±{v.disturbed[k]:.0%})"
            for k in noisy)
            + f", against the {v.target:.0%} target, with no contention seen: the steps varied "
            "more than this many steps can pin down; more steps (loop_steps, loop_max_steps, "
            "loop_budget_s) narrow it.")
    for name, cpu in v.kernel.items():  # (kernel-bound: its faults were read)
        out.append(f"Kernel-bound, '{name}': its full step spent {cpu.kernel:.0%} of its CPU "
                   f"time in the kernel, with {cpu.faults_text('step')} (the "
                   f"rule: at least {KERNEL_HIGH:.0%} with {FAULTS_HIGH:,} page faults per CPU "
                   f"second), time the operating system spent, not its own work: "
                   f"{cpu.keep_pages()}; rerun so set to measure the gap without it.")
    named = set(v.gap_strategies) | ({v.recommendation.strategy} if v.recommendation else set())
    for name, what in v.nonfinite.items():
        if name in named:
            out.append(f"'{name}': {what}: its timings are of a diverged step"
                       + (" (it is not recommended)." if v.recommendation is None or
                          v.recommendation.strategy != name else "."))
    for name, what in v.failures.items():
        if name in named and f"'{name}'" not in v.no_answer and _rested_on(v, what):
            out.append(f"{_cap(what)}.")  # (the lead says it already where it names the name)
    first = first_causes(v.causes)
    if first and first[0].syncs and first[0].syncs[0] > first[0].syncs[1] and v.syncs_note:
        out.append(_cap(v.syncs_note) + ".")
    if first and first[0].note:
        out.append(f"Where the {first[0].cause}'s time went: {first[0].note}.")
    if v.gc_note:
        out.append(v.gc_note + ".")
    return out


def notes(v: VerdictResult) -> list[str]:
    """What the run could not use or did not rely on, beside the answer (evidence only)."""
    out = []
    g = v.gap
    uses = rests_on(v)
    other = {k: c for k, c in v.contended.items() if k not in uses}
    if other:
        out.append("Contended (the answer does not use them): " + ", ".join(
            CONTENDED_LABELS.get(k, k) for k in other) + ".")
    named = set(v.gap_strategies) | ({v.recommendation.strategy} if v.recommendation else set())
    for name, what in v.nonfinite.items():
        if name not in named:
            out.append(f"'{name}': {what}: its timings are of a diverged step.")
    for name, what in v.failures.items():
        if name not in named or not _rested_on(v, what):
            out.append(f"{_cap(what)}.")
    if g is not None and g.ddp_factor is not None and not g.ddp_booked:
        out.append(f"DDP factor at {g.ddp_world} ranks {g.ddp_factor.median:.3g} (IQR "
                   f"{g.ddp_factor.iqr:.2g}): {g.ddp_why}.")
    for nb, why in v.missing.items():
        what = MISSING_WHAT.get(nb[:2], nb)
        fail = [w for n, w in v.failures.items() if w.startswith(f"in notebook {nb[:2]}")]
        out.append(f"No {what}: notebook {nb[:2]} {why}" + (f" ({'; '.join(fail)})" if fail
                                                              else "") + ".")
    if v.syncs_note and not any(c.startswith(_cap(v.syncs_note)) for c in v.caveats):
        out.append(_cap(v.syncs_note) + ".")
    return out


def _builtin_fix(r) -> str:
    """The workbook's own fix as notebook 02's benchmark measured it on this graph (never
    quoted as the speed of a pipeline it did not time)."""
    b = r.bench
    if b is None or b.ratio_vs_lazy_form is None:
        return ("The workbook's own fix, the node-mask shared graph (workbook_lib.nodemask), "
                "was not benchmarked in this run.")
    where = "at the real spec" if b.full_size else "at this run's reduced size"
    return (f"The workbook's own fix, the node-mask shared graph (workbook_lib.nodemask), "
            f"measured {b.ratio_vs_lazy_form.median:.3g}x faster per sample (forward + backward) "
            f"than replicated masks in the Lazy model's form in notebook 02's benchmark on this "
            f"graph, {where} (the built-in forms, not your pipelines).")


def equal_command(v: VerdictResult) -> str:
    """``python -m workbook_lib equal SLOW FAST --params ...`` for the pair, with the specs the
    run was given (a pipeline's name alone is not a spec the command can import) and the run's
    params (:func:`~workbook_lib.studies.verdict.params_args`)."""
    def spec(name: str) -> str:
        target = v.specs.get(name)
        return name if target is None else (target if target.split(":")[0].split("/")[-1]
                                            .removesuffix(".py") == name else
                                            f"{name}={target}")

    return " ".join(x for x in ("python -m workbook_lib equal", spec(v.gap.slow), spec(v.gap.fast),
                                v.params_args) if x)


def fix_text(v: VerdictResult) -> str:
    """The fix in one paragraph: the fastest exact pipeline, named for what its figure times."""
    r = v.recommendation
    if r is None:
        why = "; ".join(f"'{n}': {w}" for n, w in v.exactness.items()) or \
            "none declares exact = True or was proven equal to the slow one by `equal`"
        bad = ", ".join(f"'{n}'" for n in v.nonfinite)
        return (f"**No exact pipeline in this run** ({why}"
                + (f"; {bad}: a loss that was not finite, not recommended" if bad else "")
                + "): nothing here is known to compute the perturbed graph to recommend."
                # the fix named only where the advice offers it (a user trial: offered beside a
                # cause in Python feature code of the dataset item)
                + (" The node-mask shared graph (workbook_lib.nodemask) the advice names is "
                   "exact." if any(NODEMASK in c.advice for c in v.causes) else "")
                + " Check a rewrite with `python -m workbook_lib equal SLOW FAST` before "
                "trusting its speed.")
    shaky = set(v.disturbed) | set(v.contended)
    if r.strategy == r.baseline:  # provisional as the other branch, where contended
        tied = ""
        if r.alternative and r.alternative_speedup is not None:  # exact, tied with it
            sp = r.alternative_speedup
            tied = (f"{_cap(pipelines.title(r.alternative))} ("
                    f"{v.exactness.get(r.alternative, 'declared exact')}) is tied with it: "
                    f"{sp.median:.3g}x per sample (IQR {sp.iqr:.2g}, n = {sp.n}), its "
                    f"{r.step_words}, so switching is not shown to pay. ")
        return (("**Provisionally (measured contended), no" if "loop" in v.contended else
                 "**No") + f" exact pipeline in this run is faster than {r.title}.** " + tied
                + (_builtin_fix(r) + " " if v.builtin else
                   "The node-mask shared graph (workbook_lib.nodemask) computes the same model "
                   "with one pass over one shared graph. "
                   if v.advises_nodemask else "")
                + ("" if r.alternative else "Check that a rewrite computes the same model with "
                   "`python -m workbook_lib equal SLOW FAST` before trusting its speed.")).strip()
    head = ("**The fix, provisionally: " if "loop" in v.contended else "**The fix: ")
    how = r.exactness or "exact"
    if v.gap is not None and r.strategy == v.gap.fast and r.strategy != "node_mask_shared":
        check = ("" if r.proven else f" Check it computes the same model with "
                 f"`{equal_command(v)}` before adopting it.")
        if not v.gap.measurable:  # (a user trial: 'the faster side' of no resolved gap)
            return (head + f"{r.title}**, {how}; no gap between the pair is resolved on these "
                    "figures, so it is not shown to be the faster." + check)
        return (head + f"{r.title}**, {how} and the faster side of this gap (its per-epoch "
                "figure is the gap above)." + check)
    text = head + f"{r.title}**, {how}"
    if r.speedup is not None:
        text += (f"; its {r.step_words} per sample (notebook 03, same loop) "
                 f"{r.speedup.median:.3g}x "
                 f"faster than {pipelines.title(r.baseline)}"
                 + (" (a disturbed or contended figure, see above)" if "speedup" in shaky
                    else ""))
    b = r.bench
    if r.strategy != "node_mask_shared":
        text += ". " + (_builtin_fix(r) if v.builtin else "")
    elif b is not None and b.ratio_vs_lazy_form is not None:
        where = "at the real spec" if b.full_size else "at this run's reduced size (only)"
        text += (f"; benchmark per sample, forward + backward: {b.ratio_vs_lazy_form.median:.3g}x "
                 f"faster than replicated masks in the Lazy model's form {where}"
                 + (" (a disturbed or contended figure, see above)" if "bench" in shaky else ""))
        if b.passes_per_sample is not None:
            text += f", {b.passes_per_sample.median:.2g} wildtype steps per exact sample"
    text = text.strip()
    if "disturbed" in r.tie_rule or r.contended:
        text += f" Choosing among {', '.join(pipelines.title(n) for n in r.tied)}: {r.tie_rule}."
    return text if text.endswith(".") else text + "."


def story(v: VerdictResult, scale: float | None = None, edges: int | None = None) -> str:
    """The investigation's figures beside this run's (only when built-in strategies ran)."""
    if not v.builtin or v.gap is None:
        return ""
    where = f" at scale {scale:g} ({edges:,} edges)" if scale is not None and edges else ""
    return (f"The investigation observed about 40x on 4 GPUs at the real size; this run measured "
            f"{v.gap.ratio.median:.3g}x on a {v.device_type.upper()}{where}. The steps-per-epoch "
            "factor is the same arithmetic in both; the per-step factor depends on the device "
            "and the graph's size (notebook 02's benchmark shows it at the real size).")


def headline(v: VerdictResult) -> str:
    """One short sentence for the index (at most :data:`HEADLINE_MAX` characters): a contended
    or disturbed mark first (for figures the answer rests on), then the answer, and the
    function that holds most of the gap when one does."""
    uses = rests_on(v)
    marks = []
    if set(v.contended) & uses:
        marks.append("contended")
    if {k for k in v.disturbed if k not in v.contended} & uses:
        marks.append("disturbed")
    mark = (" and ".join(marks).upper() + ": ") if marks else ""
    if v.no_answer:
        return one_line(mark + v.no_answer, HEADLINE_MAX)
    g = v.gap
    if g.measurable:
        return _shortest_fit(mark, _measured_headlines(v))
    if g.contended:  # not a finding (found by a user trial: a 44x gap read as none)
        text = (f"{g.slow} and {g.fast}: gap not measured ({g.ratio.median:.3g}x per epoch "
                "measured while other work took the CPUs; rerun)")
    else:
        why = (f"{g.ratio.median:.3g}x per epoch, "
               + unresolved(g.ratio, v.target)[0].split(", so ")[0])
        text = f"{g.slow} and {g.fast}: no measurable gap ({why})"
    r = v.recommendation
    if r is not None and r.strategy not in (g.slow, g.fast):
        text += f"; fix: {r.label}"
    return one_line(mark + text, HEADLINE_MAX)


def _measured_headlines(v: VerdictResult) -> list[str]:
    """A measured gap's headline, then shorter ones: the order note, then causes after the
    first, then the causes dropped, so that the function and file:line that hold the gap are
    the last thing cut (found by a user trial: cut at "LoopReadoutModel.forwar...")."""
    g = v.gap
    lead = f"{g.slow} {g.ratio.median:.3g}x slower per epoch than {g.fast}"
    order = " (listed the other way round)" if g.swapped else ""
    r = v.recommendation
    fix = f"; fix: {r.label}" if r is not None and r.strategy not in (g.slow, g.fast) else ""
    first = first_causes(v.causes)
    held = main_site(v.causes) if first else None
    busiest = f"; busiest line {held[0].lines[0].line}" if held is not None and \
        held[0].hot_line else ""
    # more than the whole gap where other stages are faster on the slow side: "all" (a user
    # trial read "101% of the gap" as a fault)
    site = (f"; {'all' if held[1] >= 1.0 else _pct(held[1])} of the gap in {held[0].function} "
            f"({held[0].file}:{held[0].line}{busiest})") if held is not None else ""
    if not first:
        return [lead + order + fix, lead + fix]
    ranked = told_apart(first, g)
    causes = ("; first cause: " if ranked else "; first causes (not told apart): ") + (
        ", then " if ranked else " and ").join(f"{c.cause} ({_pct(c.share)})" for c in first)
    one = f"; first cause: {first[0].cause} ({_pct(first[0].share)})" if ranked else ""
    return [lead + order + causes + site + fix, lead + causes + site + fix,
            *([lead + one + site + fix] if one else []), lead + site + fix, lead + site]


def _shortest_fit(mark: str, texts: list[str]) -> str:
    """The first of ``texts`` that fits :data:`HEADLINE_MAX` after ``mark``; else the last,
    cut."""
    for t in texts:
        if len(one_line(mark + t, 10 ** 6)) <= HEADLINE_MAX:
            return one_line(mark + t, HEADLINE_MAX)
    return one_line(mark + texts[-1], HEADLINE_MAX)


def main_site(causes: list) -> tuple | None:
    """The function of the slow pipeline that holds most of the gap, summed over the causes it
    holds time in (a cause's share x the function's share of that cause's extra time), with that
    sum; None when no function holds half the gap."""
    held: dict = {}
    for c in causes:
        if c.share is None or c.share <= 0 or c.effect != "adds":
            continue
        for s in c.sites:
            key = (s.function, s.file, s.line)
            site, total = held.get(key, (s, 0.0))
            held[key] = (site, total + c.share * s.share)
    best = max(held.values(), key=lambda st: st[1], default=None)
    return best if best is not None and best[1] >= 0.5 else None


def compose(v: VerdictResult, scale: float | None = None, edges: int | None = None) -> str:
    """The whole answer: the lead sentence, one caveat a line, the fix, and (built-in runs) the
    investigation's figures and what a CPU can say. Sets ``lead``, ``caveats``, ``notes``,
    ``headline`` and ``answer``."""
    v.lead = lead(v)
    v.caveats = caveats(v)
    v.notes = notes(v)
    v.headline = headline(v)
    parts = [v.lead]
    if v.caveats:
        parts.append("\n".join(f"- {c}" for c in v.caveats))
    parts.append(fix_text(v))
    st = story(v, scale, edges)
    if st:
        parts.append(st)
    if v.cannot_say and v.builtin:
        parts.append("A CPU run can say: " + "; ".join(v.can_say) + ". It cannot say: "
                     + "; ".join(v.cannot_say) + ".")
    v.answer = "\n\n".join(parts)
    return v.answer
