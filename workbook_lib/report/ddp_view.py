"""What notebook 04's reader sees."""
from __future__ import annotations

import numpy as np
from IPython.display import Markdown

from ..results.stat import within_noise
from ..results.cpu import OWN_PROCESSES, causes_text
from .. import pipelines
from ..results.ddp import DDPResult, Plan
from . import plotting
from .failures_view import failures_note as _failures_note
from ..common.text import one_line
from .tables import saved  # noqa: F401 - its notebook calls view.saved
from .tables import HEADLINE_MAX, fmt_bytes, fmt_pct, fmt_ratio, fmt_stat, fmt_time_stat, table


def label(name: str) -> str:
    return pipelines.label(name)


def failures_note(r: DDPResult):
    """Each pipeline that failed in a rank, in one line with the rank's traceback collapsed."""
    return _failures_note(getattr(r, "failures", {}) or {}, what="The DDP figures")


def _missing(r: DDPResult) -> str:
    """Why there are no DDP figures at all."""
    f = (getattr(r, "failures", {}) or {}).get(r.scaling_strategy)
    if f is not None:
        return f"No DDP figures: the scaling pipeline failed ({f.line()})."
    return "No DDP figures: no world size was launched."


def plan_text(pl: Plan) -> Markdown:
    lines = [f"Backend **{pl.backend}** on {pl.device_type}; capacity "
             f"{pl.capacity_per_node} {'GPUs' if pl.device_type == 'cuda' else 'CPU cores'} "
             f"per node ({pl.capacity_source}), {pl.nnodes} node(s)."]
    lines.append(f"Every world size runs {pl.launches[0].threads_per_rank if pl.launches else '-'}"
                 f" thread(s) and {pl.launches[0].workers_per_rank if pl.launches else '-'} "
                 f"DataLoader worker(s) per rank (the allocation's {pl.cpus} CPUs, "
                 f"{pl.cpus_source}, over the most ranks per node), so that the DDP factor does "
                 "not measure the threads; launches alternate between world sizes.")
    for ln in pl.launches:
        gpu = ", one GPU per rank" if pl.device_type == "cuda" else ""
        extra = (f"; also its arms with {ln.threads_all} threads, interleaved (the thread effect)"
                 if ln.threads_all else "")
        lines.append(f"- world size {ln.world_size}: {ln.nnodes} node(s) x "
                     f"{ln.procs_per_node} process(es){gpu}{extra}")
    for w, why in pl.skipped.items():
        lines.append(f"- world size {w}: **skipped**: {why}")
    lines += [f"- note: {n}" for n in pl.notes]
    if pl.device_type == "cpu":
        lines.append("\nOn a CPU the ranks share the allocation's cores (each gets its share of "
                     "threads), so a larger world size brings no new hardware: weak-scaling "
                     "efficiency here shows DDP's costs plus the cores being split, not what "
                     "more GPUs would give.")
    return Markdown("\n".join(lines))


def _loss_cell(stages: dict) -> str:
    """The loss's forward and its own backward, each the slowest rank's median."""
    parts = [stages[k] for k in ("loss", "loss_backward") if k in stages]
    return " + ".join(fmt_time_stat(p) for p in parts) if parts else "in the forward"


def step_table(r: DDPResult):
    if not r.worlds:
        return Markdown(_missing(r))
    rows = []
    for w, s in r.worlds.items():
        rows.append({
            "world size": w, "threads/rank": ", ".join(map(str, sorted(set(s.threads_per_rank)))),
            "step (DDP)": fmt_time_stat(s.step),
            "no_sync step": fmt_time_stat(s.variants["no_sync"]),
            "forward": fmt_time_stat(s.stages["forward"]),
            "loss (forward + backward)": _loss_cell(s.stages),
            "backward": fmt_time_stat(s.stages["backward"]),
            "weak eff.": fmt_stat(r.weak[w]), "strong eff.": fmt_stat(r.strong[w]),
            "rank spread (compute)": fmt_pct(s.rank_spread),
            "CPU, worst rank": _cpu_cell(s.step.cpu)})
    s0 = next(iter(r.worlds.values()))
    return table(rows, caption=f"{label(r.scaling_strategy)}, per-rank batch {s0.batch_size}; "
                               f"strong scaling keeps the global batch {s0.global_batch}. A "
                               "synchronous step lasts as long as its slowest rank: per step, "
                               "the maximum over ranks. Efficiencies relative to the smallest "
                               "world size run (1 = ideal). CPU, worst rank: the share of the "
                               "CPU its compute threads asked for that the worst rank got over "
                               "its timed steps, its CPU use (CPU time / wall x threads, "
                               "DataLoader workers not counted), other jobs' use of its CPUs "
                               "(the machine's busy time minus this run's processes') and the "
                               "machine's CPU pressure; contended below 80% got, by other jobs "
                               "(from 0.1 CPU) or by this run's own ranks and workers. "
                               + causes_text(s.step.cpu for s in r.worlds.values()))


def _cpu_cell(c) -> str:
    if c is None:
        return "not recorded"
    got = "n/a" if c.got is None else c.got_text()
    pressure = "n/a" if c.pressure is None else f"{c.pressure:.0%}"
    others = "" if c.others is None else f", other jobs {c.others:.2f} CPU"
    why = "" if not c.contended else f" by {c.cause}" + (
        f" ({c.configuration()}: {c.fitting()})" if c.cause == OWN_PROCESSES
        and c.oversubscribed else "")
    return (f"got {got}, use {c.use_text()} of {c.threads} thread(s){others}, pressure "
            f"{pressure}"
            + (f" CONTENDED{why}" if c.contended else ""))


def comm_table(r: DDPResult):
    rows = []
    for w, s in r.worlds.items():
        if w == 1:
            continue
        for rank, c in sorted(s.comm_per_rank.items()):
            rows.append({
                "world size": w, "rank": rank, "gradient bytes": fmt_bytes(s.grad_bytes),
                "buckets": f"{c.buckets:g}",
                "comm hook per step": fmt_time_stat(c.hook),
                "transfer: all-reduce of those bytes after a barrier": fmt_time_stat(c.transfer),
                # what is not the transfer: waiting for the other ranks, or, on a CPU, for a
                # core (found by a user trial: both ranks 'waited' 2 ms for the other)
                "hook beyond the transfer (waiting for other ranks or for a CPU)":
                    fmt_time_stat(c.wait),
                "overlap with backward": (f"{fmt_pct(s.overlap)} ({s.overlap_note})"
                                          if s.overlap is not None else "-"),
                "DDP - no_sync, synchronous step (for comparison)":
                    fmt_time_stat(s.ddp_minus_no_sync)})
    if not rows:
        return Markdown(_missing(r) if not r.worlds else
                        "Only world size 1 ran: no communication to measure.")
    s = next(v for w, v in r.worlds.items() if w > 1)
    return table(rows, caption=f"Communication per rank, measured by DDP's own comm hook: "
                               f"{s.comm_method}. The hook's time includes waiting for a slower "
                               "rank to reach the same all-reduce; the transfer is the "
                               "all-reduce of the gradient bytes timed directly after a barrier, "
                               "and the wait the difference. A rank that waits long is the "
                               "faster one: the slow rank is the one that waits least.")


def scaling_plot(r: DDPResult, device: str) -> None:
    if not r.worlds:
        return
    ws = np.array(sorted(r.worlds))
    fig, axes = plotting.plt.subplots(1, 2, figsize=(12, 4.2))
    for i, (name, get) in enumerate((("weak (per-rank batch fixed)", lambda s: s.step),
                                     ("strong (global batch fixed)",
                                      lambda s: s.variants["strong"]))):
        med = np.array([get(r.worlds[w]).median for w in ws]) * 1e3
        lo = np.array([get(r.worlds[w]).q1 for w in ws]) * 1e3
        hi = np.array([get(r.worlds[w]).q3 for w in ws]) * 1e3
        axes[0].errorbar(ws, med, yerr=[med - lo, hi - med], fmt="o-", capsize=3,
                         color=plotting.PALETTE[i], label=name)
    axes[0].set(xlabel="world size", ylabel="step time (ms)")
    axes[0].set_xticks(ws, [str(w) for w in ws])
    axes[0].set_ylim(bottom=0)
    axes[0].legend()
    plotting.title(axes[0], "Step time against world size", device=device,
                   repeats="median, IQR whiskers")
    for i, (name, eff) in enumerate((("weak", r.weak), ("strong", r.strong))):
        med = np.array([eff[w].median for w in ws])
        axes[1].plot(ws, med, "o-", color=plotting.PALETTE[i], label=name)
    axes[1].axhline(1, color="k", ls=":", lw=1)
    top = max(1.2, max(max(e.median for e in r.weak.values()),
                       max(e.median for e in r.strong.values())) * 1.1)
    axes[1].set(xlabel="world size", ylabel="efficiency (1 = ideal)", ylim=(0, top))
    axes[1].set_xticks(ws, [str(w) for w in ws])
    axes[1].legend()
    plotting.title(axes[1], "Scaling efficiency", device=device)
    plotting.show(fig, "Left: step time against world size for weak and strong scaling with "
                       "IQR whiskers. Right: weak and strong scaling efficiency against world "
                       "size, 1 being ideal.")


def variants_table(r: DDPResult, accum: int, gather_on: bool):
    if not r.worlds:
        return Markdown(_missing(r))
    rows = []
    for w, s in r.worlds.items():
        rows.append({
            "world size": w,
            f"accumulate {accum}, all-reduce the last (no_sync)": fmt_time_stat(
                s.variants["accum_last"]) if "accum_last" in s.variants else "n/a",
            f"accumulate {accum}, all-reduce every one": fmt_time_stat(s.variants["accum_every"])
            if "accum_every" in s.variants else "n/a",
            f"loss all-gather {'off' if gather_on else 'on'} / {'on' if gather_on else 'off'}":
                fmt_stat(s.gather_ratio, unit="x") if s.gather_ratio is not None else
                "not measured (the pipeline's loss takes no gather argument)",
            "changes the step beyond noise": "" if s.gather_ratio is None else
            "no" if within_noise(s.gather_ratio) else "yes"})
    return table(rows, caption="Per optimizer step. The all-gather ratio is paired by round; it "
                               "'changes nothing' when 1 lies inside its IQR.")


def ring_text(r: DDPResult) -> Markdown:
    if not r.worlds:
        return Markdown(_missing(r))
    f = r.ring
    same = f is not None and f.bandwidth_gbps == r.link["bandwidth_gbps"] and \
        f.latency_us == r.link["latency_us"]  # the link is the fit: say it once
    if same:
        return Markdown(f"Link used for the predictions: {f.bandwidth_gbps:.3g} GB/s, "
                        f"{f.latency_us:.3g} us per hop ({r.link_source}"
                        + ("; " + "; ".join(f.notes) if f.notes else "") + "). Step "
                        "predictions keep each rank's compute as measured at the largest world "
                        "size run and add the part of the predicted all-reduce not hidden behind "
                        "backward.")
    extra = "" if f is None else (f" The fit: {f.bandwidth_gbps:.3g} GB/s, "
                                  f"{f.latency_us:.3g} us per hop, in-sample error "
                                  f"{f.median_abs_rel_error:.0%}"
                                  + ("; " + "; ".join(f.notes) if f.notes else "") + ".")
    return Markdown(f"Link used for the predictions: {r.link['bandwidth_gbps']:.3g} GB/s, "
                    f"{r.link['latency_us']:.3g} us per hop ({r.link_source}).{extra} Step "
                    "predictions keep each rank's compute as measured at the largest world size "
                    "run and add the part of the predicted all-reduce not hidden behind backward.")


def prediction_table(r: DDPResult):
    if not r.predictions:
        return Markdown(_missing(r) if not r.worlds else "No prediction was made.")
    rows = [{"world size": p.world_size,
             "all-reduce of the gradients": f"{p.comm_s * 1e3:.3g} ms",
             "predicted step": f"{p.step_s * 1e3:.3g} ms",
             "measured step": "" if p.measured_s is None else f"{p.measured_s * 1e3:.3g} ms",
             "error": "" if p.measured_s is None else fmt_pct((p.step_s - p.measured_s) /
                                                              p.measured_s),
             "basis": "extrapolation beyond the world sizes measured" if p.extrapolated else
             "within the measured range"} for p in r.predictions]
    return table(rows)


def presets_table(r: DDPResult):
    if not r.worlds:
        return Markdown(_missing(r))
    rows = [{"link": name, **{f"{w} ranks": f"{v * 1e3:.3g} ms" for w, v in by.items()}}
            for name, by in r.presets.items()]
    grad = next(iter(r.worlds.values())).grad_bytes
    return table(rows, caption=f"The ring model's all-reduce of one step's gradients "
                               f"({fmt_bytes(grad)}) on other links (presets are orders of "
                               "magnitude; measure yours and set link_bandwidth_gbps / "
                               "link_latency_us).")


def no_gap(r: DDPResult) -> str:
    """Why no gap was decomposed (a gap pipeline, or the scaling one, failed)."""
    fs = getattr(r, "failures", {}) or {}
    why = [fs[n].line() for n in [*r.gap_strategies, r.scaling_strategy]
           if n in fs and not fs[n].figures_kept]
    return ("No gap decomposed: " + ("; ".join(dict.fromkeys(why)) if why else
                                     "nothing was measured") + ".")


def gap_text(r: DDPResult) -> Markdown:
    g = r.gap
    if g is None:
        return Markdown(no_gap(r))
    pairs = ", ".join(f"x{v:.3g}" for v in g.factor_by_pair)
    ddp = (f"DDP factor {fmt_stat(g.ddp_factor)} (measured at {g.world_size} against "
           f"{g.base_world_size} rank(s), {g.threads_per_rank} thread(s) per rank at both; a "
           f"ratio of separate launches, alternated, per launch pair {pairs or '-'}; always "
           "applied, its IQR carried into the total)")
    agree = ""
    if r.ratio_03 is not None:
        agree = (f" Notebook 03 measured the same per-step ratio as {fmt_stat(r.ratio_03)}: "
                 + ("**the two agree within noise**." if r.agrees_with_03 else
                    "**they differ beyond noise** (see notebook 05).")
                 + " (03 runs with all the allocation's threads, 04 at the threads per rank "
                   "of every world size.)")
    threads = ""
    if g.thread_effect is not None:
        threads = (f" Apart from DDP, the threads: at world size {g.base_world_size} the "
                   f"per-step ratio with {g.threads_all} threads over the same with "
                   f"{g.threads_per_rank} is {fmt_stat(g.thread_effect, unit='x')} (paired "
                   "in the same rounds; not part of the gap above).")
    own = ""
    if g.step_factors:
        own = (" Each strategy's own step factor (its step at "
               f"{g.world_size} ranks over {g.base_world_size}, weak scaling): "
               + "; ".join(f"{label(n)} {fmt_stat(f, unit='x')}"
                           for n, f in g.step_factors.items()) + ".")
    # the DDP factor always applied: the ratio at the larger world size, which 05's answer (that
    # books the factor only where it is measured beyond its noise) may not quote (found by a
    # user trial: 2.48x here beside 05's 3.34x, unlabelled)
    return Markdown(
        f"Epoch-time ratio at {g.world_size} ranks of {pipelines.title(g.slow)} (batch "
        f"{g.batch_sizes[g.slow]}) to {pipelines.title(g.fast)} "
        f"(batch {g.batch_sizes[g.fast]}): **{fmt_stat(g.total, unit='x')}** = steps per epoch "
        f"x{g.steps_ratio:.2f} (arithmetic: the batch sizes) x time per step "
        f"{fmt_stat(g.per_step_ratio, unit='x')} (measured at world size {g.base_world_size}, "
        f"paired by round) x {ddp}."
        + (" The investigation observed about 40x on 4 GPUs." if pipelines.is_builtin(g.slow)
           and pipelines.is_builtin(g.fast) else "")  # its figure is about its own models
        + f"{agree}{threads}{own}"
        + f" Notebook 05's answer is the ratio on one process, times this DDP factor only where "
          "the factor is measured beyond its noise (its rule); so the two may differ.")


def gap_plot(r: DDPResult, device: str) -> None:
    g = r.gap
    if g is None:
        return
    terms = [("steps per epoch\n(arithmetic)", g.steps_ratio, 0.0),
             ("time per step\n(measured)", g.per_step_ratio.median, g.per_step_ratio.iqr),
             ("DDP factor\n(separate launches)", g.ddp_factor.median, g.ddp_factor.iqr)]
    fig, ax = plotting.plt.subplots(figsize=(8, 4))
    x = np.arange(len(terms) + 1)
    vals = [t[1] for t in terms] + [g.total.median]
    errs = [t[2] / 2 for t in terms] + [g.total.iqr / 2]
    ax.bar(x, vals, yerr=errs, capsize=4, color=[plotting.PALETTE[i] for i in range(4)])
    for i, v in enumerate(vals):
        ax.text(i, v, f" x{v:.3g}", ha="center", va="bottom")
    ax.set_xticks(x, [t[0] for t in terms] + [f"epoch-time ratio\nat {g.world_size} ranks "
                                               "(product)"])
    ax.axhline(1, color="k", lw=1, ls=":")
    ax.set_ylabel("factor (x)")
    plotting.title(ax, f"{label(g.slow)} against {label(g.fast)}: the gap, factor by factor",
                   device=device, sizes=f"batch {g.batch_sizes[g.slow]} vs {g.batch_sizes[g.fast]}",
                   repeats="median, IQR whiskers")
    plotting.show(fig, "Bars: the steps-per-epoch ratio, the per-step time ratio, the DDP factor "
                       "and their product, the epoch-time ratio, with IQR whiskers.")


def headline(r: DDPResult) -> str:
    """One short sentence for the index (at most :data:`HEADLINE_MAX` characters): a contended
    mark first, then the DDP factor of the gap's pair, then the scaling pipeline's weak
    efficiency."""
    parts, mark = [], ""
    g = getattr(r, "gap", None)
    if g is not None and g.world_size != g.base_world_size:
        f = g.ddp_factor
        noise = ("within its noise" if g.ddp_within_noise else
                 "adds to the slow side" if f.median > 1 else "favours the slow side")
        parts.append(f"DDP factor of {label(g.slow)} over {label(g.fast)} at {g.world_size} "
                     f"ranks: {fmt_ratio(f.median)} (IQR {f.iqr:.2g}, {noise})")
        if f.contended:
            mark = "CONTENDED: "
    if r.worlds and r.weak:
        w = max(r.worlds)
        if w > min(r.worlds) and w in r.weak:
            parts.append(f"{label(r.scaling_strategy)} weak efficiency "
                         f"{fmt_ratio(r.weak[w].median)[:-1]} at {w} ranks")
    if not r.worlds:
        parts.append(_missing(r).rstrip("."))
    elif g is None:
        parts.append(no_gap(r).rstrip("."))
    failed = [n for n, f in (getattr(r, "failures", None) or {}).items()]
    if failed:
        parts.append("failed: " + ", ".join(failed))
    text = mark + ("; ".join(parts) or "nothing measured")
    return one_line(text, HEADLINE_MAX)
