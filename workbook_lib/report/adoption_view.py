"""What notebook 06's reader sees."""
from __future__ import annotations

import numpy as np
from IPython.display import Markdown

from ..analysis.adoption import AdoptionResult
from . import plotting
from .tables import fmt_bytes, fmt_num, fmt_stat, fmt_time_stat, table


def loss_text(r: AdoptionResult) -> Markdown:
    tol = getattr(r, "tolerance", 1e-5)
    ok = r.max_rel_diff <= tol
    return Markdown(
        f"Over {r.warmup_steps + r.steps} training steps (batch {r.batch_size}, "
        f"{r.optimizer.upper()}, lr {r.lr:g}, the same seed and the same batches), the largest "
        f"relative difference between the two loss curves is **{r.max_rel_diff:.1e}** "
        + (f"(within {tol:.1e}: the same training, to {r.tolerance_basis})." if ok else
           f"(**above {tol:.1e}**: the two trainings diverged beyond {r.tolerance_basis}).")
        + (" Plain SGD keeps the two pipelines' rounding-level differences at rounding level. "
           "AdamW (adopt_optimizer: adamw) divides each gradient by its running RMS: on its "
           "first steps, gradients that cancel to rounding level (the dual forward makes many) "
           "become full-size updates of random sign, and the curves drift apart for reasons "
           "that have nothing to do with the pipelines." if r.optimizer == "sgd" else ""))


def loss_plot(r: AdoptionResult) -> None:
    steps = np.arange(1, len(r.losses["replicated"]) + 1)
    fig, axes = plotting.plt.subplots(1, 2, figsize=(12, 4))
    for i, (k, ls) in enumerate(r.losses.items()):
        axes[0].plot(steps, ls, ["-", "--"][i], color=plotting.PALETTE[i], label=r.labels[k])
    axes[0].set(xlabel="training step", ylabel="loss (MSE)")
    axes[0].legend()
    plotting.title(axes[0], "The same training, two pipelines", device=r.device,
                   sizes=f"batch {r.batch_size}")
    axes[1].plot(steps, np.maximum(np.array(r.rel_diff), 1e-12), color=plotting.PALETTE[2])
    axes[1].set_ylim(bottom=1e-9)
    axes[1].axhline(r.tolerance, color="k", ls=":", lw=1, label=f"{r.tolerance:.1e}")
    axes[1].set(yscale="log", xlabel="training step",
                ylabel="relative difference of the losses (log scale)")
    plotting.plain_ticks(axes[1], "x")
    axes[1].legend()
    plotting.title(axes[1], "Relative difference per step", device=r.device)
    plotting.show(fig, "Left: loss against training step for replicated masks and the node-mask "
                       "shared graph, overlapping. Right: their relative difference per step on a "
                       "log axis, below the tolerance line.")


def compare_table(r: AdoptionResult):
    rows = []
    for k in r.losses:
        row = {"pipeline": r.labels[k], "step": fmt_time_stat(r.step[k]),
               "per sample": fmt_time_stat(r.step[k], per=r.batch_size),
               "peak memory per sample": fmt_bytes(r.memory_per_sample.get(k))}
        row.update({f"epochs per day, {w}": fmt_num(v) for w, v in r.epochs_per_day[k].items()})
        rows.append(row)
    return table(rows, caption=f"Steps timed interleaved (warm-up excluded); the fix is "
                               f"{fmt_stat(r.speedup, unit='x')} faster per step. Memory: "
                               f"notebook 02's fits (when it ran in this folder). Projection: "
                               f"{r.projection_basis}.")


def headline(r: AdoptionResult) -> str:
    return (f"same loss curve to {r.max_rel_diff:.1e} over {len(r.rel_diff)} steps; the fix "
            f"{r.speedup.median:.3g}x faster per step than replicated masks")


def saved(path, headline_text: str) -> Markdown:
    return Markdown(f"**Headline.** {headline_text}\n\nResults: `{path.name}` in the run folder.")
