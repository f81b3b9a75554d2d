"""What to change first, from the figures a cause shows: its code sites, how it grows with the
samples of a batch, its operator calls and host syncs per extra sample, and the other causes.

Each rule states the figure it rests on (a loop over samples, a forward that grows with the
batch, a backward that mirrors the forward, a loss); where none applies, no change is advised.
"""
from __future__ import annotations

from ...results.timing import EncoderFigures
from ...results.verdict import HOT_LINE, MINOR, Cause, Gap
from .code import GRAPH_SHARE, MIN_SITE, graph_code

MIRRORS = "the backward mirrors the forward"
NODEMASK = ("one pass over one shared graph for the whole batch instead of a graph copy or a "
            "loop per sample (workbook_lib.nodemask)")
SYNC_ADVICE = ("take the host syncs out of the step (.item(), nonzero, boolean-mask indexing, "
               ".tolist(), printing a tensor): keep values on the device and vectorize over the "
               "batch; torch.cuda.set_sync_debug_mode('warn') names each one")
H2D_WALK = ("keep Python objects out of the batch (names, strings, per-sample lists): .to() "
            "walks every one of them each step; carry indices and look names up outside the "
            "step")
STATIC = {
    "data_item": "move the per-sample work out of the dataset item: precompute it once, or build "
                 "it on the device from the deleted genes' indices",
    "collate": "make the collate cheap: no per-sample copies of the graph or masks; batch the "
               "deleted genes' indices and build what the model needs on the device, once per "
               "batch",
    "h2d": "transfer less: indices instead of masks or graph copies, from pinned memory "
           "(pin_memory: true)",
    # the same algorithm in its multi-tensor form, not another one (found by a user trial: an
    # SGD user was pointed at AdamW, which trains differently)
    "optimizer": "a foreach or fused optimizer of the same kind as yours (torch.optim's SGD, "
                 "Adam, AdamW, Adagrad... take foreach=True, and fused=True where the device "
                 "has a fused form), or the same update as torch._foreach_* operations over "
                 "all parameters at once, with no Python loop over parameters or their rows",
    "ddp": "accumulate gradients with no_sync(), or fewer, larger steps",
}


def _noisy(st) -> str:
    """", noisy" for a figure not known to its precision target (the tables' '(noisy)' rule,
    ``Stat.precise``), ", contended" for one measured while CPU was taken; else ""."""
    return ("" if getattr(st, "precise", True) else ", noisy") + (
        ", contended" if getattr(st, "contended", False) else "")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _site(c: Cause) -> str:
    if not c.sites:
        return ""
    s = c.sites[0]
    return f"{s.where}" + (f" (under {s.library})" if s.library else "") + (
        f", {s.hot_line}" if s.hot_line else "")


def growth_words(c: Cause) -> str:
    """How the stage grows with the samples, in figures ("" when not measured)."""
    g = c.growth
    if g is None:
        return ""
    big, small = g.batch_sizes
    text = (f"{_ms(g.per_sample.median)} per extra sample (IQR {g.per_sample.iqr * 1e3:.2g}, "
            f"n = {g.per_sample.n}{_noisy(g.per_sample)}; batches {big} and {small}), "
            f"{g.share_words} of the stage at batch {big}")
    if g.ops_per_sample is not None:
        text += f"; {g.ops_per_sample:.3g} operator calls per extra sample"
    if g.syncs_per_sample:
        text += f", {g.syncs_per_sample:.3g} host syncs"
    return text


def _loop(c: Cause, what: str) -> str:
    g = c.growth
    s = c.sites[0] if c.sites else None
    where = "" if s is None else (
        f"; its time is mostly in {s.where}, the loop there or in what calls it" +
        (f" ({s.hot_line})" if s.hot_line else ""))
    return (f"a Python loop over the samples in the {what} ({g.ops_per_sample:.3g} more "
            f"operator calls for each extra sample{where}): work on the whole batch at once, "
            "with tensor operations over a batch dimension")


SECOND_SITE = 0.25  # a second function holding at least this share of a stage's extra time


def _held(c: Cause, what: str) -> str:
    """"; N% of WHAT's extra time is in FUNCTION (file:line)" or "", and "M% in FUNCTION2
    (file:line)" after it where the next function holds at least :data:`SECOND_SITE` of it (a
    check of two helpers of equal work: 34% and 34%, the advice named one)."""
    if not c.sites:
        return ""
    return f"; {c.sites[0].share:.0%} of {what}'s extra time is in {_site(c)}" + _second(c)


def _second(c: Cause) -> str:
    """", M% in FUNCTION2 (file:line)" where the stage's second function holds at least
    :data:`SECOND_SITE` of its extra time; else ""."""
    if len(c.sites) > 1 and c.sites[1].share >= SECOND_SITE:
        return f", {c.sites[1].share:.0%} in {c.sites[1].where}"
    return ""


def _callers(c: Cause) -> None:
    """A first function called from more than one place (a helper shared by several of the
    pipeline's functions, or by them and the loop): the calls that hold the most of it, added
    to the advice that names it, else to the finding."""
    s = c.sites[0] if c.sites else None
    if s is None or not s.split_callers:
        return
    words = f"; `{s.function}` is {s.called_from}"
    if f"`{s.function}` is called from" in c.advice:  # the forward's advice, quoted whole by
        return  # the backward that mirrors it, says it already (a user trial: said twice)
    if s.where in c.advice:
        c.advice += words
    elif s.where in c.finding:
        c.finding += words


def _custom_backward(c: Cause) -> bool:
    s = c.sites[0] if c.sites else None
    return s is not None and s.function.split(".")[-1] == "backward"


def gc_of(stage: str, other: str = "its time") -> str:
    """What the collector's share of a cause's stage is a share of, in words
    (:func:`.causes.stage_gc_share`): the data stages' own time, where they ran; ``other``
    for every other stage."""
    return {"data_item": "the data items' own time (in the process that ran them)",
            "collate": "the collates' own time (in the process that ran them)"}.get(stage, other)


GC_MOST = 0.5  # a stage whose time is at least this share Python's garbage collector
GC_ADVICE = ("make fewer Python objects per step (tensors rather than lists, dicts or an object "
             "per sample), and call gc.freeze() once the long-lived ones are built (the "
             "dataset, a Python copy of the graph) so that no later collection walks them")
MANY_CALLS = 1000  # operator calls per step in one function: a loop, if each is cheap
CHEAP_CALL_US = 20.0  # microseconds per call below which a call's cost is its overhead
SAME_CALLS = 0.1  # operator calls within this share of the fast function's: the same calls
MORE_WORK = 1.5  # ... taking this many times as long: more arithmetic per call
FIXED_SHARE = 0.1  # a stage whose per-sample part is below this share is fixed work per step
NO_BACKWARD = 0.05  # a function whose backward time is below this share of its forward's


def _each(s) -> float:
    """Microseconds per operator call of a site's profiled time."""
    return s.slow_ms * 1e3 / s.ops if s.ops else float("inf")


def cheap_calls(c: Cause, line: bool = True) -> str:
    """"a loop in F: N operator calls per step at X µs each ...: make the loop one tensor
    operation" where the stage's largest site makes :data:`MANY_CALLS` or more calls per step,
    each under :data:`CHEAP_CALL_US` (their overhead, not their arithmetic, is the cost: found
    by a user trial, a custom backward's loop over 6,607 rows was told 'not a loop; the work of
    its operations is the cost'); else ""."""
    s = c.sites[0] if c.sites else None
    if s is None or s.ops < MANY_CALLS or _each(s) >= CHEAP_CALL_US:
        return ""
    g = c.growth
    more = "" if g is None or g.ops_per_sample is None else (
        ", none more for each extra sample" if g.ops_per_sample < 1 else
        f", {g.ops_per_sample:.3g} more for each extra sample")
    return (f"a loop in {s.where}" + (f" ({s.hot_line})" if s.hot_line and line else "") +
            f": {s.ops:.3g} operator calls per step at {_each(s):.2g} µs each{more}, so the "
            "calls cost, not their arithmetic: make the loop one tensor operation over all its "
            "rows or items")


class Diagnosis(str):
    """Advice that is :func:`site_diagnosis`'s: what the figures show, which may not be a change
    to make (``Cause.diagnosed``; the type says so, where comparing texts once did)."""


def site_diagnosis(c: Cause) -> str:
    """What the stage's largest site's figures say where no other advice follows: many cheap
    calls (:func:`cheap_calls`); no operator call at all (host Python or NumPy); the fast
    function's calls taking longer (more arithmetic per call); work that does not grow with the
    batch (fixed per step); else "". A text found is a :class:`Diagnosis`."""
    text = _site_diagnosis(c)
    return Diagnosis(text) if text else ""


def _site_diagnosis(c: Cause) -> str:
    s = c.sites[0] if c.sites else None
    if s is None:
        return ""
    text = cheap_calls(c)
    if text:
        return text
    if s.ops == 0 and s.share >= 0.5:  # found by a user trial: NumPy metrics in the loss
        return (f"{s.where} makes no torch operation ({s.slow_ms:.3g} ms per profiled step, 0 "
                "operator calls): host Python or NumPy work inside the step; move what need not "
                "run every step out of it (compute it once, or a metric every N steps)")
    if s.fast_ops and abs(s.ops - s.fast_ops) <= SAME_CALLS * s.fast_ops and s.fast_ms > 0 \
            and s.slow_ms >= MORE_WORK * s.fast_ms:  # found by a user trial: a wider model
        return (f"{s.where} makes the fast pipeline's operator calls ({s.ops:.3g} against "
                f"{s.fast_ops:.3g} per step) and takes {s.slow_ms / s.fast_ms:.3g}x as long: "
                "not more calls; the same calls do more work each (larger tensors), or its "
                "Python between them costs more (a profiled time holds both)")
    g = c.growth
    if g is not None and not g.grows and not g.python_loop and g.share < FIXED_SHARE and \
            s.backward_ms is not None and s.backward_ms < NO_BACKWARD * s.slow_ms:
        # found by a user trial: an adjacency rebuilt every step; not a stack of trainable
        # parameters, whose backward shows it changes every step
        return (f"its time does not grow with the batch ({g.per_sample.median * 1e3:.3g} ms "
                f"per extra sample, IQR {g.per_sample.iqr * 1e3:.2g}, n = {g.per_sample.n}"
                f"{_noisy(g.per_sample)}; {g.share_words} of the stage per sample), and "
                f"{s.where}, which holds {s.share:.0%} of its extra time, has no backward "
                f"({s.backward_ms:.2g} ms per profiled step against {s.slow_ms:.3g} forward): "
                "work on no trainable parameter, the same every step unless its inputs change; "
                "computed once, in `__init__`, and kept as a buffer, it would leave the step")
    return ""


def encoder_words(fig: EncoderFigures) -> str:
    """What converting the slow pipeline's encoder measured: "your encoder converts: X -> Y ms
    per batch ...", "your encoder does not convert: <why>", or where the pipeline runs it
    converted already, "your encoder runs converted already: Y ms per batch ..."."""
    if fig.blocked:
        return f"your encoder does not convert: {fig.blocked}"
    if fig.runs_converted:
        return (f"your encoder runs converted already (workbook_lib.nodemask.convert); 03 timed "
                f"it alone, without a readout, converted again: {fig.converted.median * 1e3:.3g} "
                f"ms per batch of {fig.batch_size}, forward and backward (on masked copies "
                f"{fig.masked_copies.median * 1e3:.3g} ms), floor "
                f"{(fig.floor_sparse_macs + fig.floor_dense_macs) / 1e6:.3g} M multiply-adds "
                "per sample")
    text = (f"your encoder converts: {fig.masked_copies.median * 1e3:.3g} -> "
            f"{fig.converted.median * 1e3:.3g} ms per batch of {fig.batch_size}, forward and "
            f"backward ({fig.ratio.median:.3g}x, IQR {fig.ratio.iqr:.2g}, n = {fig.ratio.n}"
            f"{_noisy(fig.ratio)}, same rounds; workbook_lib.nodemask.convert), "
            f"floor {(fig.floor_sparse_macs + fig.floor_dense_macs) / 1e6:.3g} M multiply-adds "
            "per sample")
    if fig.all_changed_from:
        text += (f"; every gene changes from {fig.all_changed_from} "
                 f"({fig.all_changed_macs / 1e6:.3g} M multiply-adds per sample from there)")
    else:
        text += "; no layer changes every gene"
    return text


def not_faster(fig: EncoderFigures) -> str:
    """Where the conversion was timed and is not faster beyond its noise (the ratio's lower
    quartile at most 1), that this measurement does not bear the advice out; else ""."""
    r = fig.ratio
    if fig.blocked or r is None or r.q1 > 1.0:
        return ""
    return (f"; but measured, your encoder converted is not shown to be faster at batch "
            f"{fig.batch_size} ({r.median:.3g}x, quartiles {r.q1:.3g}-{r.q3:.3g}): these "
            "figures do not show that one shared pass pays for this encoder at this batch")


def gap_left(fig: EncoderFigures, steps: int | None, epoch_s: tuple[float, float] | None,
             batch_size: int | None) -> str:
    """What converting the encoder would leave of the gap, projected from the measured figures
    (the saving per sample x the slow side's samples per epoch, off its epoch time); "" where a
    figure is missing."""
    if fig.blocked or fig.masked_copies is None or fig.converted is None or not steps or \
            epoch_s is None or not batch_size or not fig.batch_size or epoch_s[1] <= 0:
        return ""
    per_sample = (fig.masked_copies.median - fig.converted.median) / fig.batch_size
    saved = per_sample * batch_size * steps
    slow, fast = epoch_s
    if per_sample <= 0 or saved >= slow:
        return ""
    return (f"projected from these figures, not measured: it saves {_ms(per_sample * batch_size)}"
            f" of each {_ms(slow / steps)} step, which leaves the gap at about "
            f"{(slow - saved) / fast:.3g}x of {slow / fast:.3g}x (full steps)")


def carries_copies(name: str) -> bool:
    """A built-in strategy that carries one graph copy per sample (``Strategy.replicated``)."""
    from ...strategies import REGISTRY

    cls = REGISTRY.get(name)
    return bool(cls is not None and getattr(cls, "replicated", False))


def graph_per_sample(c: Cause, num_genes: int | None) -> str:
    """Where a line of the stage's largest site, holding at least :data:`HOT_LINE` of its
    operator time, gives an operator an N x N matrix for each sample of the batch (an operand
    ``[B, N, N]``, N the graph's genes, B the stage's batch; from notebook 03's line-marked
    step with shapes), that, in figures; else "". A user trial: a dense adjacency masked per
    sample and multiplied by ``bmm`` got no advice. Not caught: a hidden width of N (``[B, N,
    F]`` with F = N has the same shape), a single-head attention over the genes (``[B, N, N]``
    too); heads (``[B, H, N, N]``) and one shared ``[N, N]`` are not taken."""
    s = c.sites[0] if c.sites else None
    b = c.growth.batch_sizes[0] if c.growth is not None and c.growth.batch_sizes else None
    if s is None or not num_genes or num_genes < 2 or not b or b < 2:
        return ""
    for ln in s.lines:
        if list(ln.dims) == [b, num_genes, num_genes] and ln.share >= HOT_LINE:
            op = ln.dims_op.replace("aten::", "")
            return (f"line {ln.line} of {s.where}, `{ln.short_text}`, holds {ln.share:.0%} of its "
                    f"operator time and gives {op} a {list(ln.dims)} operand: an N x N matrix "
                    f"for each of the {b} samples (N = {num_genes:,} genes), as a dense "
                    "adjacency per sample would be")
    return ""


def graph_work(c: Cause, encoder: EncoderFigures | None, copies: bool,
               num_genes: int | None = None) -> str:
    """What in the figures shows that a stage's cost per sample (the forward's, or the
    backward's where the forward is not advised) is graph work, in words; "" where nothing does
    (then one shared pass is not advised, however the stage grows): a
    built-in strategy that carries a graph copy per sample, an encoder the pipeline declares
    (``shared_encoder``: run on its graph copies), a line of the largest site computing on an
    N x N matrix per sample (:func:`graph_per_sample`, given the graph's ``num_genes``), or the
    stage's own largest site running graph code (its main library frame, or at least
    :data:`GRAPH_SHARE` of its time)."""
    if copies:
        return "the slow pipeline carries one graph copy per sample"
    if encoder is not None and encoder.runs_converted:
        return ""  # it makes one shared pass already: not advised to make one
    if encoder is not None:
        return "its encoder (shared_encoder) runs on a graph copy per sample"
    dense = graph_per_sample(c, num_genes)
    if dense:
        return dense
    s = c.sites[0] if c.sites else None
    if s is not None and graph_code(s.library):
        return f"its largest site, {s.where}, runs graph code ({s.library})"
    if s is not None and s.graph_share >= GRAPH_SHARE:
        return f"{s.graph_share:.0%} of its largest site's time, in {s.where}, runs graph code"
    return ""


def advise(rows: list[Cause], device_type: str, encoder: EncoderFigures | None = None,
           gap: Gap | None = None, copies: bool = False, num_genes: int | None = None) -> None:
    """Sets every row's ``advice`` (what to change, or "") and ``finding`` (what was measured,
    in one sentence). ``encoder``: the slow pipeline's encoder against its conversion (03),
    said where the forward's advice is one shared pass; ``gap``: its steps per epoch tell a
    slower stage from more steps of an equal one, and with its epoch times and batch say what
    the conversion's saving leaves of the gap; ``copies``: the slow pipeline is a built-in
    strategy that carries graph copies (:func:`carries_copies`); ``num_genes``: the graph's
    (:func:`graph_per_sample`). Only a cause that adds at least
    :data:`MINOR` of the gap (a named one) is advised."""
    steps = (gap.steps.get(gap.slow), gap.steps.get(gap.fast)) if gap else (None, None)
    by = {c.stage: c for c in rows}
    for c in sorted(rows, key=lambda c: c.stage == "backward"):  # the forward's advice first
        c.finding = _finding(c)
        more = _more_steps(c, steps)
        if more:  # the step's stage is no slower: advice about its code would not follow
            c.finding += "; " + more
            c.advice = ""
            continue
        if c.effect != "adds" or c.share is None or c.share < MINOR:  # not a named cause
            c.advice = ""  # (found by a user trial: the results file advised pinned memory
            continue  # for a transfer that saved time, on a CPU)
        c.advice = _advice(c, by, device_type, graph_work(c, encoder, copies, num_genes))
        c.diagnosed = isinstance(c.advice, Diagnosis)
        c.advice = str(c.advice)
        if _second(c) and c.sites[0].where in c.advice and c.sites[1].where not in c.advice:
            # advice about its first function: the second, nearly as large, named beside it
            c.advice += f"; {c.sites[1].share:.0%} of its extra time is in {c.sites[1].where}"
        if c.sites and c.sites[0].unsettled and c.sites[0].where in c.advice:
            c.advice += f"; {c.sites[0].unsettled}"  # named from steps that disagree
        _callers(c)
        if c.gc_share is not None and c.gc_share >= GC_MOST:  # the collector, not the code
            of = gc_of(c.stage, "this stage's time")
            c.advice += (f"; {c.gc_share:.0%} of {of} in the slow pipeline's full steps was "
                         f"Python's garbage collector: {GC_ADVICE}")
        if encoder is not None and encoder.runs_converted and c.stage == "forward":
            c.finding += "; " + encoder_words(encoder)  # what it runs, not a change to make
        # the encoder's figures where the advice is its own (a backward mirroring the forward
        # quotes the forward's, figures and all; a forward's may follow a loop's: a review)
        if encoder is not None and NODEMASK in c.advice and c.stage in ("forward", "backward") \
                and not c.advice.startswith(MIRRORS):
            c.advice += "; " + encoder_words(encoder) + not_faster(encoder)
            left = gap and gap_left(encoder, steps[0],
                                    (gap.epoch_s[gap.slow], gap.epoch_s[gap.fast]),
                                    gap.batch_sizes.get(gap.slow))
            if left:
                c.advice += "; " + left


# a stage that runs once per step (the optimizer, the loop's overhead) at most this many times
# slower per step on the slow side owes its extra time per epoch to the steps, not to its code
SAME_STEP = 1.5
PER_STEP_STAGES = ("optimizer", "overhead")


def _more_steps(c: Cause, steps: tuple[int | None, int | None]) -> str:
    """Where a once-per-step stage is about as fast per step on both sides (at most
    :data:`SAME_STEP` x) and the slow side makes more steps per epoch: that, in figures;
    else ""."""
    ns, nf = steps
    if c.stage not in PER_STEP_STAGES or not ns or not nf or ns <= nf or \
            c.slow_s_per_epoch is None or not c.fast_s_per_epoch:
        return ""
    slow, fast = c.slow_s_per_epoch / ns, c.fast_s_per_epoch / nf
    if slow > SAME_STEP * fast:
        return ""
    return (f"its step takes {_ms(slow)} against {_ms(fast)} (at most {SAME_STEP:g}x): the extra "
            f"time is the {ns:,} steps per epoch against {nf:,} (a smaller batch), not its code")


def _finding(c: Cause) -> str:
    parts = [f"{c.cause}: {c.evidence.split('; ')[0]}"]
    g = growth_words(c)
    if g:
        parts.append(g)
    if c.sites:
        parts.append(f"{c.sites[0].share:.0%} of its extra time in {_site(c)}" + _second(c) + (
            f", {c.outside:.0%} outside the pipeline's code"
            if c.outside is not None and c.outside >= MIN_SITE else ""))
    elif c.sites_note:
        parts.append(c.sites_note)
    return "; ".join(parts)


def _shared_pass(stage: str, g, graph: str) -> str:
    """One shared pass advised from a stage's growth ``g`` and what shows it is graph work."""
    return (f"{NODEMASK}: the {stage} costs {_ms(g.per_sample.median)} more for each extra "
            f"sample (IQR {g.per_sample.iqr * 1e3:.2g}, n = {g.per_sample.n}"
            f"{_noisy(g.per_sample)}), {g.share_words} of its time at batch "
            f"{g.batch_sizes[0]}, and {graph}")


def _advice(c: Cause, by: dict[str, Cause], device_type: str, graph: str = "") -> str:
    g = c.growth
    loop = g is not None and g.python_loop
    grows = g is not None and g.grows
    if c.sync_wait_s is not None and c.difference_s and c.sync_wait_s > 0.5 * c.difference_s:
        return SYNC_ADVICE  # measured on a GPU: the syncs' wait is most of the stage's extra
    if c.stage == "loss":
        if loop:
            return _loop(c, "loss")
        return site_diagnosis(c)
    if c.stage in ("forward", "device_prep"):
        advice = []
        if loop:
            advice.append(_loop(c, c.stage.replace("_", " ")))
        if grows and c.stage == "forward" and graph:  # per-sample cost, shown to be graph work
            advice.append(_shared_pass("forward", g, graph))
        return "; ".join(advice) or site_diagnosis(c)
    if c.stage == "backward":
        if _custom_backward(c):
            s = c.sites[0]
            text = (f"the custom autograd backward {s.where} holds {s.share:.0%} of the "
                    f"backward's extra time ({s.slow_ms:.3g} ms per profiled step" +
                    (f"; {s.hot_line}" if s.hot_line else "") + ")")
            if loop:
                return text + (f" and loops over the samples ({g.ops_per_sample:.3g} more "
                               "operator calls for each extra sample): make it one batched "
                               "tensor operation")
            # no loop: what each call computes is the cost (found by a user trial: this was
            # told to be 'one batched tensor operation' at 6 operator calls per step)
            if g is None or g.ops_per_sample is None:  # no second batch: a loop not ruled out
                return (f"{text}, in {s.ops:.3g} operator calls per step (how they grow with "
                        "the batch was not measured): time it against autograd's own backward "
                        "of its forward (drop the Function; `equal` checks the gradients "
                        "agree)")
            loop_of_calls = cheap_calls(c, line=False)  # its line is said once, in the text
            if loop_of_calls:
                return f"{text}: {loop_of_calls}"
            more = ", none more for each extra sample" if g.ops_per_sample < 1 else \
                f", {g.ops_per_sample:.3g} more for each extra sample"
            return (f"{text}, in {s.ops:.3g} operator calls per step{more}: not a loop; the "
                    "work of its operations is the cost: time it against autograd's own "
                    "backward of its forward (drop the Function; `equal` checks the gradients "
                    "agree)")
        fwd = by.get("forward")
        if fwd is not None and fwd.effect == "adds" and (fwd.share or 0) >= 0.05 and \
                fwd.advice and not fwd.diagnosed and c.sites and fwd.sites and \
                c.sites[0].function == fwd.sites[0].function:
            s = c.sites[0]
            out = (f"; {c.outside:.0%} runs outside the pipeline's code"
                   if c.outside is not None and c.outside >= MIN_SITE else "")
            # the forward's advice whole, its figures too: where the backward is the first cause,
            # the answer's lead quotes this row alone (a review asked for it once, in the
            # forward's row; the lead then lost the encoder's figures: CI's matrix)
            return (f"{MIRRORS} (its largest site in the pipeline's code, "
                    f"{s.where}, is the forward's: {s.share:.0%} of the backward's extra "
                    f"time{out}" + (f"; the backward of {s.hot_line}" if s.hot_line else "")
                    + f"): {fwd.advice}")
        # the forward not advised one shared pass: the backward's own figures (where it is,
        # the forward's advice stands for both, once)
        if grows and graph and not loop and not (fwd is not None and NODEMASK in fwd.advice):
            return _shared_pass("backward", g, graph)
        return _loop(c, "backward") if loop else site_diagnosis(c)
    if c.stage == "h2d":
        return c.advice or STATIC["h2d"]  # rank_causes chose between the two from the batch
    if c.stage in ("data_item", "collate"):
        s = c.sites[0] if c.sites else None
        # the shared graph only where the item's time is graph code (found by a user trial: a
        # networkx degree feature per item was told the node-mask graph needs nothing else)
        tail = ("; the node-mask shared graph (workbook_lib.nodemask) needs nothing else per "
                "sample" if c.stage == "data_item" and s is not None and (
                    graph_code(s.library) or s.graph_share >= GRAPH_SHARE) else "")
        return STATIC[c.stage] + tail + _held(c, "the data item" if c.stage == "data_item"
                                              else "the collate")
    if c.stage == "optimizer":  # its tensors (rank_causes), or the pipeline's own code's time
        if c.advice:
            return c.advice
        return STATIC["optimizer"] + _held(c, "the optimizer") if c.sites else ""
    return STATIC.get(c.stage, "")  # the loop's overhead runs no code of the pipeline's

