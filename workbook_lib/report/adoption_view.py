"""What notebook 06's reader sees."""
from __future__ import annotations

import numpy as np
from IPython.display import Markdown

from ..results.adoption import AdoptionResult, loss_fall
from . import plotting
from ..common.text import capitalized as _cap, one_line
from .tables import saved  # noqa: F401 - its notebook calls view.saved
from .tables import HEADLINE_MAX, fmt_bytes, fmt_num, fmt_stat, fmt_time_stat, marks, table


def check_text(pair) -> Markdown:
    """The check before training (:func:`workbook_lib.studies.adoption.check_pair`): the pair,
    the equality table, and whether 06 applies."""
    from .equality_view import rows, rule_text

    names = list(pair.names.values())
    head = (f"**The pair:** {' and '.join(f'`{n}`' for n in names)}"
            + (" (the built-in replicated masks and node-mask shared graph)"
               if pair.mode == "builtin" else " (gap_strategies: slow, fast)") + ". "
            if names else "")
    text = head + (f"**06 does not apply here:** {pair.reason}." if not pair.applicable else
                   f"They compute the same before training: {pair.equality.summary()}. The fast "
                   "model starts from the slow model's parameters.")
    eq = pair.equality
    if eq is not None:
        rs = rows(eq)
        cols = list(rs[0])
        def cell(v: str) -> str:
            return v.replace("|", "\\|")

        text += ("\n\n| " + " | ".join(map(cell, cols)) + " |\n|" + "---|" * len(cols) + "\n"
                 + "\n".join("| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rs)
                 + f"\n\nOne batch of {eq.batch_size} through both pipelines' own stages. "
                 f"{eq.conditions()} Rule: {rule_text(eq)}. The same check "
                 "runs from the command line: `python -m workbook_lib equal SLOW FAST`.")
    return Markdown(text)


def loss_text(r: AdoptionResult) -> Markdown:
    if not r.applicable:
        return Markdown(f"**06 does not apply here:** {r.reason}. Nothing was trained.")
    if getattr(r, "nonfinite_step", None) is not None:
        eq = getattr(r, "equality", None)
        return Markdown(f"**{_cap(_diverged(r))}.**" + (
            f" The {eq.precision} check before training found the two pipelines' outputs and "
            "gradients equal; a training that diverges does not compare them."
            if eq is not None and eq.equal else ""))
    tol = getattr(r, "tolerance", 1e-5)
    ok = r.max_rel_diff <= tol
    ref, new = (r.labels[k] for k in r.keys)
    first, last = loss_fall(r.losses[r.keys[0]])
    if r.mode != "builtin":
        return Markdown(
            f"Over {r.warmup_steps + r.steps} training steps (batch {r.batch_size}, "
            f"{r.optimizer.upper()}, lr {r.lr:g} for both, from the same parameters, each "
            f"pipeline's own dataset in order), the loss of {ref} went from {first:.3g} (mean "
            f"of the first steps) to {last:.3g} (the last); the two loss curves differ by at most **{r.max_rel_diff:.1e}** of "
            "their size (the losses' own relative difference: the workbook does not know your "
            "loss, so it cannot bound the predictions from it) "
            + (f"(within {tol:.1e}: the same training, to {r.tolerance_basis})." if ok else
               f"(**above {tol:.1e}**, {r.tolerance_basis}: the trainings of {ref} and {new} "
               "are not shown to be the same)." + _checked(r)))
    fell = ""
    if first > 0:
        fell = (f"The target is learnable: each label is a fixed teacher model's prediction (the "
                f"same architecture from another seed). The loss fell from **{first:.3g}** "
                f"(mean of the first steps) to **{last:.3g}** (the last), a factor of "
                f"{first / last:,.3g}" if last > 0 else "to 0")
        if r.label_variance is not None:
            fell += (f"; predicting the labels' mean alone would give {r.label_variance:.3g}, so "
                     + ("the model also learned how the label depends on the deleted genes"
                        if last < r.label_variance else
                        "most of the fall is the model learning the labels' level, not yet how "
                        "they depend on the deleted genes"))
        fell += ". "
    return Markdown(
        fell + f"Over {r.warmup_steps + r.steps} training steps (batch {r.batch_size}, "
        f"{r.optimizer.upper()}, lr {r.lr:g}, the same seed and the same batches), the two "
        "loss curves imply that the pipelines' predictions differ by at least "
        f"**{r.max_rel_diff:.1e}** of their size (RMS; the largest over the steps) "
        + (f"(within {tol:.1e}: the same training, to {r.tolerance_basis})." if ok else
           f"(**above {tol:.1e}**: the two trainings diverged beyond {r.tolerance_basis}).")
        + " A loss that falls near 0 is not compared by its own relative difference: float32 "
        "rounds the predictions, and a small residual magnifies their rounding in the loss; "
        "each pair of mean squared errors bounds how far apart the predictions are."
        + (" Plain SGD keeps the two pipelines' rounding-level differences at rounding level. "
           "AdamW (adopt_optimizer: adamw) divides each gradient by its running RMS: on its "
           "first steps, gradients that cancel to rounding level (the dual forward makes many) "
           "become full-size updates of random sign, and the curves drift apart for reasons "
           "that have nothing to do with the pipelines." if r.optimizer == "sgd" else ""))


def _checked(r: AdoptionResult) -> str:
    """What the check before training found, where it found the two equal ("" otherwise)."""
    eq = getattr(r, "equality", None)
    if eq is None or not eq.equal:
        return ""
    return (f" The {eq.precision} check before training found the two pipelines' outputs and "
            "gradients equal, so the curves part where float32 rounding grows over the steps, "
            "or where the check's conditions (its batches, dropout switched off) do not hold.")


def loss_plot(r: AdoptionResult) -> None:
    if not r.applicable:
        return
    steps = np.arange(1, len(r.losses[r.keys[0]]) + 1)
    fig, axes = plotting.plt.subplots(1, 2, figsize=(12, 4))
    for i, (k, ls) in enumerate(r.losses.items()):  # a loss not finite is not drawn
        vals = np.array([np.nan if x is None else x for x in ls], dtype=float)
        vals[~np.isfinite(vals)] = np.nan
        axes[0].plot(steps, vals, ["-", "--"][i], color=plotting.PALETTE[i], label=r.labels[k])
    cut = getattr(r, "nonfinite_step", None)
    if cut is not None:
        axes[0].axvline(cut + 1, color="k", ls="--", lw=1,
                        label=f"loss not finite from step {cut + 1}: not compared after")
    axes[0].set(xlabel="training step", yscale="log",
                ylabel="loss (MSE, log scale)" if r.mode == "builtin" else "loss (log scale)")
    if r.label_variance:
        axes[0].axhline(r.label_variance, color="k", ls=":", lw=1,
                        label="variance of the labels (predicting their mean)")
    plotting.plain_ticks(axes[0], "y")
    axes[0].xaxis.set_major_locator(plotting.MaxNLocator(integer=True))
    axes[0].legend(loc="upper right")
    plotting.title(axes[0], "The same training, two pipelines", device=r.device,
                   sizes=f"batch {r.batch_size}")
    floor = 1e-9  # the axis' bottom: exact zeros are drawn on it (and said so)
    rel = np.array(r.rel_diff, dtype=float)  # up to a loss that was not finite
    axes[1].plot(steps[:rel.size], np.maximum(rel, floor), color=plotting.PALETTE[2],
                 label=("predictions' relative difference implied" if r.mode == "builtin"
                        else "the losses' relative difference")
                 + (" (exact zeros drawn at 1e-9)" if (rel < floor).any() else ""))
    axes[1].set_ylim(floor / 2, max(r.tolerance * 10, float(rel.max()) * 3 if rel.size else 1e-4))
    axes[1].axhline(r.tolerance, color="k", ls=":", lw=1,
                    label=f"tolerance {r.tolerance:.1e} (its basis: the text above)")
    axes[1].set(yscale="log", xlabel="training step",
                ylabel=("predictions' difference / their size (log scale)"
                        if r.mode == "builtin" else "loss difference / loss (log scale)"))
    plotting.plain_ticks(axes[1], "y")
    axes[1].xaxis.set_major_locator(plotting.MaxNLocator(integer=True))
    axes[1].legend()
    plotting.title(axes[1], "Relative difference per step", device=r.device)
    ref, new = (r.labels[k] for k in r.keys)
    plotting.show(fig, f"Left: loss against training step for {ref} and {new} on a log axis, "
                       "overlapping" + (", with the loss of predicting the labels' mean dotted"
                                        if r.label_variance else "") + ". Right: per step, "
                       + ("the least relative difference of the two pipelines' predictions that "
                          "their losses imply" if r.mode == "builtin" else
                          "the relative difference of the two losses")
                       + ", on a log axis against the tolerance line.")


def compare_table(r: AdoptionResult):
    if not r.applicable:
        return Markdown("Nothing to compare: 06 trained nothing (see above).")
    rows = []
    for k in r.losses:
        row = {"pipeline": r.labels[k], "step": fmt_time_stat(r.step[k]),
               "per sample": fmt_time_stat(r.step[k], per=r.batch_size),
               "peak memory per sample": fmt_bytes(r.memory_per_sample.get(k))}
        row.update({f"epochs per day, {w}": fmt_num(v) for w, v in r.epochs_per_day[k].items()})
        rows.append(row)
    fix = "the fix" if r.mode == "builtin" else r.labels[r.keys[1]]
    speed = _speed(r.speedup, stat=True)
    return table(rows, caption=f"Steps timed interleaved (warm-up excluded); {fix} is "
                               f"{speed} per step. Memory: "
                               f"notebook 02's fits (when it ran in this folder). Projection: "
                               f"{r.projection_basis}.")


def speedups_table(rows):
    """Every speedup of the fix this run folder holds, with what each one times."""
    if not rows:
        return Markdown("Not run here: these are the built-in fix's speedups over replicated "
                        "masks, and no built-in strategy ran in this folder.")
    out = [{"speedup": r.name, "notebook": r.notebook,
            "value": f"{r.value:.3g}x" + (f" (IQR {r.iqr:.2g})" if r.iqr is not None else ""),
            "what is timed": r.measures, "batches": r.batches, "sizes": r.sizes} for r in rows]
    return table(out, caption="One fix, several speedups: each times something else. The "
                              "training loop and 06 include the data pipeline (the replicated "
                              "side builds masks per sample) and the optimizer, which the "
                              "fix does not speed up as much, so they read lower than the "
                              "benchmark's forward + backward; the benchmark's replicated side "
                              "is measured at the shared form's batch where its memory estimate "
                              "fits, else projected from B = 1, 2 (its 'batches' say which), "
                              "and, with bench.json, at the real spec, where the gap is "
                              "larger.")


def form_text(form, strategies: list[str]) -> Markdown:
    """The built-in fix's form (from notebook 02's benchmark); nothing on a run without
    built-in ``strategies``, where the fix is the user's own rewrite."""
    from .bench_view import form_text as text

    return text(form) if strategies else Markdown("")


def _diverged(r: AdoptionResult) -> str:
    """Where a loss was not finite: which, from which step, and what was compared before it."""
    who = " and ".join(f"'{n}'" for n in r.nonfinite) or "one pipeline"
    before = "" if not r.rel_diff else (
        f"; the curves are identical over the {len(r.rel_diff)} steps before"
        if r.max_rel_diff == 0 else f"; over the {len(r.rel_diff)} steps before, the curves "
        f"differ by at most {r.max_rel_diff:.1e}")
    return (f"not shown to be the same training: the loss of {who} was not finite from step "
            f"{r.nonfinite_step + 1} of {r.warmup_steps + r.steps} ({r.optimizer.upper()}, lr "
            f"{r.lr:g}: the training diverged; a lower adopt_lr compares them){before}")


def _headline(r: AdoptionResult, detail: bool = True) -> str:
    """The headline; without ``detail`` (the index's one line), no tolerance basis and no word
    of the check before training, so that the verdict and the speed fit."""
    if not r.applicable:
        return f"not applicable: {r.reason}"
    if getattr(r, "nonfinite_step", None) is not None:
        return f"{_diverged(r)}; {_speed_words(r)}"
    first, last = loss_fall(r.losses[r.keys[0]])
    tol = getattr(r, "tolerance", 1e-5)
    if r.max_rel_diff == 0:
        curves = "same training: identical loss curves"
    elif r.max_rel_diff <= tol:
        curves = (f"same training: the loss curves put the predictions within "
                  f"{r.max_rel_diff:.1e} of each other (tolerance {tol:.1e})")
    else:
        basis = f" ({r.tolerance_basis})" if detail else ""
        curves = (f"loss curves imply predictions apart by {r.max_rel_diff:.1e}, above the "
                  f"{tol:.1e} tolerance{basis}: not shown to be the same training")
        if detail and _checked(r):
            curves += f" ({_checked(r).strip()})"
    if r.mode != "builtin":
        curves = curves.replace("put the predictions within", "within").replace(
            "imply predictions apart by", "apart by")
        return (f"{curves} over {len(r.rel_diff)} steps (the loss went from {first:.3g} to "
                f"{last:.3g}); {_speed_words(r)}")
    return (f"{curves} over {len(r.rel_diff)} steps (the loss fell from {first:.3g} to "
            f"{last:.3g}); {_speed_words(r)}")


def _speed_words(r: AdoptionResult) -> str:
    """The headline's speed: "the fix Nx faster per step than replicated masks", or, for the
    user's pair, "'fast' Nx faster per step than 'slow'"."""
    if r.mode == "builtin":
        return f"the fix {_speed(r.speedup)} per step than replicated masks"
    ref, new = (r.names[k] for k in r.keys)
    return f"'{new}' {_speed(r.speedup)} per step than '{ref}'"


def _speed(ratio, stat: bool = False) -> str:
    """A step-time ratio (reference over the other, a Stat) as 'Nx faster' or, below 1, 'Nx
    slower' (the inverted ratios); with ``stat``, with its IQR and n (:func:`fmt_stat`); else
    its noisy and contended marks only (found by a user trial: a contended ratio of IQR 1.1 was
    quoted bare)."""
    st, word = (ratio, "faster") if ratio.median >= 1 else (ratio.inverse("ratio"), "slower")
    return f"{fmt_stat(st, unit='x')} {word}" if stat else f"{st.median:.3g}x {word}{marks(st)}"


def headline(r: AdoptionResult) -> str:
    """One short sentence for the index (see common.text.one_line)."""
    return one_line(_headline(r, detail=False), HEADLINE_MAX)
