"""Notebook 03's experiments: the training loop of every strategy in every mode, data-vs-model
ratios, host syncs per step, and warm-step profiles by exclusive time; every figure comes from
:func:`workbook_lib.training.loop.run_arms`, so ratios between strategies are paired by round.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from ...configs.schema import DataSection, MeasureSection
from ...configs.validation import Params
from ...data.perturbations import sample_perturbations
from ...data.snapshots import CellGraph
from ...measurement.code_sites import DEVICE_SITE_CALLS, RECORDED, data_sites, device_sites
from ...measurement.profiling import ProfileResult, profile_steps
from ...measurement.syncs import SyncCounter, method_for
from ...measurement.timing import Stat, StepClock
from ...failures import NONFINITE, PipelineFailed, PipelineFailure, failure_from
from ...common.progress import note, progress
from ...pipelines import build_pipeline, compared_names
from ...strategies import make_strategy
from ...training import loop
from ...pipelines.builtin import batch_size_for
from ...results.timing import (arm_key, ArmResult, HALF, LoopStudy, OptimizerShape, PIPELINED,
                               ReportedFigure, SanityFlag, StepBound, StoredReads, SyncPoint,
                               SyncStudy)
from .encoder import encoders_of
from .growth import growth, second_batch
from .own_code import OwnCode
from .stages import step_bound

LAZY, DANGO = "replicated_mask_cpu", "dango_wildtype"
MAX_DISTINCT_SAMPLES = 400  # per strategy; the stream cycles over them


def run_sizes(edges: int, params, batches: dict[str, int]) -> str:
    """The charts' sizes line: the built-in strategies' model sizes where the run compares any,
    each pipeline of the user's own with its batch (found by a user trial: a run of two
    pipelines of the user's own was captioned with the built-in models' H, L, k and B)."""
    from ...strategies import REGISTRY

    own = [n for n in batches if n not in REGISTRY]
    builtin = [n for n in batches if n in REGISTRY]
    parts = [f"{edges:,} edges"]
    if builtin:
        bs = ([f"{params.batch_size_lazy} (perturbed-graph strategies)"]
              if any(n != DANGO for n in builtin) else []) + \
            ([f"{params.batch_size_dango} (DANGO-style)"] if DANGO in builtin else [])
        parts.append(f"H={params.hidden}, L={params.layers}, k={params.perturbation_k}, "
                     f"B={' / '.join(bs)}")
    if own:
        parts.append("B=" + ", ".join(f"{batches[n]} ({n})" for n in own)
                     + " (pipelines of your own: their models' sizes are their own)")
    return ", ".join(parts)


def run_loops(params: Params, graph: CellGraph, device: torch.device, *,
              strategies: list[str] | None = None) -> LoopStudy:
    """The loop of every pipeline (built-in strategies and the ``pipelines`` of the params) in
    the four modes (``params``: batch sizes, loop settings).

    A pipeline that cannot be built, or whose step raises or stalls (``stall_timeout_s``), is
    recorded in ``failures`` and left out of ``strategies``; the others are measured as if it
    were not there. One whose loss is not finite keeps its figures and is recorded too."""
    names = list(strategies or compared_names(params))
    warm, lo, hi = params.warmup, params.loop_steps, params.loop_max_steps
    rows_needed = (warm + 1 + hi) * (len(loop.MODES) + 1)
    interleaved = params.num_workers == 0
    store = Path(tempfile.mkdtemp(prefix="wb-masks-"))
    arms, made, opts = [], {}, {}
    pair = set(params.gap_strategies or [])
    growth_note: dict[str, str] = {}
    failures: dict[str, PipelineFailure] = {}
    stall = params.stall_timeout_s
    try:
        for name in names:
            # distinct samples for every step, capped (strategy 3 stores a mask per sample); a
            # user pipeline serves its own dataset. One stream per pipeline: with interleaving
            # its four modes take turns on it
            n_items = None
            if name in params.strategies:
                b = batch_size_for(params.loop, name)
                n_items = min(rows_needed * b, max(8 * b, MAX_DISTINCT_SAMPLES))
            try:
                pipe = build_pipeline(params, name, graph, device, n_items=n_items,
                                      storage_dir=store)
                opt = pipe.configure_optimizer([p for p in pipe.model.parameters()
                                                if p.requires_grad])
                loader = loop.make_loader(pipe, num_workers=params.num_workers,
                                          pin_memory=params.pin_memory,
                                          persistent_workers=params.persistent_workers,
                                          stall_timeout_s=stall)
            except Exception as exc:  # noqa: BLE001 - this pipeline only: recorded
                failures[name] = build_failure(exc, name, "03")
                note(f"03: {failures[name].line()}; the other pipelines go on")
                continue
            made[name] = pipe
            opts[name] = optimizer_shape(opt)
            for mode in loop.MODES:
                arms.append(loop.Arm(arm_key(name, mode), pipe, loader, loop.Variant(mode, mode),
                                     optimizer=opt))
            # the full step synchronized only at its start and end (the pipelined step)
            arms.append(loop.Arm(arm_key(name, PIPELINED), pipe, loader,
                                 loop.Variant(PIPELINED, "full", sync_stages=False),
                                 optimizer=opt))
            if name in pair:  # the full step at a second batch size: how each stage grows
                try:
                    half = loop.make_loader(pipe, second_batch(pipe.batch_size),
                                            num_workers=params.num_workers,
                                            pin_memory=params.pin_memory,
                                            persistent_workers=params.persistent_workers,
                                            stall_timeout_s=stall)
                except ValueError as exc:  # a dataset too small for it: this figure only
                    growth_note[name] = str(exc)
                else:
                    arms.append(loop.Arm(arm_key(name, HALF), pipe, half,
                                         loop.Variant(HALF, "full"), optimizer=opt,
                                         optional=True))
        res = loop.run_arms(arms, warmup_steps=warm, min_steps=lo, max_steps=hi,
                            target=params.precision_target, budget_s=params.loop_budget_s,
                            interleave=interleaved, desc="03 loop", failures=failures,
                            stall_timeout_s=stall, notebook="03",
                            # the gap's steps (pipelined) and the causes' (full), each pair's
                            # per-round ratio known to the target
                            pairs=[tuple(arm_key(n, m) for n in params.gap_strategies)
                                   for m in (PIPELINED, "full")]
                            if len(pair) == 2 else ()) if arms else {}
        for key in [k for k in failures if k.endswith("/" + HALF)]:  # an optional arm's
            growth_note[key.split("/")[0]] = failures.pop(key).line()
        for n in [n for n in names if n in made and n not in failures]:
            f = nonfinite_failure(n, [a for a in res.values() if a.strategy == n])
            if f is not None:
                record_failure(failures, f)
                note(f"03: {f.line()}")
        shared = shared_pass_times({n: made[n] for n in measured_names(names, made, failures)},
                                   params.measure, device, failures)
        encoders = encoders_of({n: made[n] for n in measured_names(names, made, failures)},
                               device=device, warmup=params.warmup,
                               min_rounds=params.min_repeats, target=params.precision_target,
                               max_time_s=params.time_budget_s, failures=failures)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    measured = measured_names(names, made, failures)
    sizes = run_sizes(graph.num_edges(), params, {n: made[n].batch_size for n in measured})
    from ...running.environment import device_label
    from ...measurement.cpu import fit_threads

    threads = fit_threads(workers=params.num_workers)  # what setup applied, and why
    study = LoopStudy(
        device=device_label(device), sizes=sizes, strategies=measured,
        batch_sizes={n: made[n].batch_size for n in made}, interleaved=interleaved,
        settings={"warmup_steps": warm, "min_steps": lo, "max_steps": hi,
                  "precision_target": params.precision_target,
                  "budget_s": params.loop_budget_s, "num_workers": params.num_workers,
                  "pin_memory": params.pin_memory and device.type == "cuda",
                  "persistent_workers": params.persistent_workers,
                  "dual_forward": params.dual_forward,
                  "threads": torch.get_num_threads(), "threads_why": threads.why},
        arms=res, exact={n: getattr(made[n], "exact", None) for n in made},
        labels={n: made[n].label for n in made}, shared_pass=shared, failures=failures,
        growth_note=growth_note, encoders=encoders, optimizers=opts,
        num_genes=graph.num_genes)
    study.growth = {n: g for n in measured if n in pair and (g := growth(study, n))}
    return study


def optimizer_shape(opt) -> OptimizerShape:
    """What ``opt`` steps over: its parameter tensors and their elements, and its foreach and
    fused flags as set."""
    if opt is None or not isinstance(getattr(opt, "param_groups", None), list):
        # none, or an object with step() and zero_grad() alone (the loop needs no more: a review)
        return OptimizerShape(type(opt).__name__ if opt is not None else "", 0, 0)
    params = [p for g in opt.param_groups for p in g.get("params", [])]
    first = opt.param_groups[0] if opt.param_groups else {}
    return OptimizerShape(type(opt).__name__, len(params), sum(p.numel() for p in params),
                          first.get("foreach"), first.get("fused"))


def measured_names(names: list[str], made: dict, failures: dict[str, PipelineFailure]
                   ) -> list[str]:
    """The pipelines built whose figures stand (no failure, or one that kept them)."""
    return [n for n in names if n in made and (n not in failures or failures[n].figures_kept)]


def record_failure(failures: dict[str, PipelineFailure], f: PipelineFailure) -> None:
    """Keep one failure per pipeline: the one that lost its figures over one that kept them."""
    old = failures.get(f.pipeline)
    if old is None or (old.figures_kept and not f.figures_kept):
        failures[f.pipeline] = f


def build_failure(exc: BaseException, name: str, notebook: str) -> PipelineFailure:
    """The record of a pipeline that could not be built or checked (its check names the
    stage: "pipeline 'x': forward raised ...")."""
    from ...exceptions import PipelineError

    if isinstance(exc, PipelineFailed):
        exc.failure.notebook = notebook
        return exc.failure
    f = failure_from(exc, pipeline=name, notebook=notebook, stage="build")
    if isinstance(exc, PipelineError):
        f.message = exc.problem
    return f


def nonfinite_failure(name: str, arms: list[ArmResult]) -> PipelineFailure | None:
    """The record of a pipeline whose loss was NaN or infinite in some arm (its figures kept,
    marked), or None."""
    bad = [a for a in arms if a.nonfinite_steps]
    if not bad:
        return None
    first = min(bad, key=lambda a: a.first_nonfinite_step)
    n_bad = sum(a.nonfinite_steps for a in bad)
    n_all = sum(a.loss_steps for a in arms)
    when = (f"from step {first.first_nonfinite_step}" if n_bad == n_all else
            f"at {n_bad} of {n_all} steps, first at step {first.first_nonfinite_step} of "
            f"'{first.mode}'")
    return PipelineFailure(name, "03", "loss", NONFINITE,
                           f"the loss was not finite {when} ({first.nonfinite_value}): its "
                           "timings are of a diverged step", step=first.first_nonfinite_step,
                           mode=first.variant, figures_kept=True)


def shared_pass_times(pipelines: dict, measure: MeasureSection, device: torch.device,
                      failures: dict[str, PipelineFailure] | None = None) -> dict[str, Stat]:
    """The forward-only time (no grad) of each pipeline's shared pass, where it has one (one
    that raises is recorded in ``failures`` when given, stage "shared pass"), repeated as
    ``measure`` (``params.measure``) says."""
    from ...measurement.timing import measure as timed

    out = {}
    for name, pipe in pipelines.items():
        fn = getattr(pipe, "shared_forward", None)
        if fn is None:
            continue
        try:
            with torch.no_grad():
                if fn(pipe.model) is None:
                    continue

                def run(pipe=pipe):
                    with torch.no_grad():
                        pipe.shared_forward(pipe.model)
                out[name] = timed(run, device=device, warmup=measure.warmup,
                                  min_repeats=measure.min_repeats,
                                  target=measure.precision_target,
                                  max_time_s=measure.time_budget_s,
                                    label=f"{name} shared pass")
        except Exception as exc:  # noqa: BLE001 - the pipeline's own pass: recorded
            if failures is None:
                raise
            f = failure_from(exc, pipeline=name, notebook="03", stage="shared pass")
            f.figures_kept = True  # the loop's figures stand; its shared pass is not timed
            record_failure(failures, f)
            note(f"03: {f.line()}")
    return out


def sanity_check(study: LoopStudy) -> list[SanityFlag]:
    """data <= forward <= forward_backward <= full per strategy, within noise: a pair is flagged
    when the smaller mode's lower quartile is above the larger mode's upper quartile."""
    flags = []
    for name in study.strategies:
        for lo_m, hi_m in zip(loop.MODES, loop.MODES[1:]):
            a, b = study.arm(name, lo_m).step, study.arm(name, hi_m).step
            if a.q1 > b.q3:
                flags.append(SanityFlag(name, lo_m, hi_m, a.median * 1e3, b.median * 1e3))
    return flags


DATA_STAGES = ("loader_wait", "h2d", "device_prep")


def data_stage_seconds(arm: ArmResult) -> Stat:
    """Per step, the data stages themselves: waiting for the loader (fetch + collate when it
    runs in the main process), the host-to-device copy and the device preparation; the
    harness's own cost (the loop between stages) left out."""
    parts = [arm.stages[s].samples for s in DATA_STAGES if s in arm.stages]
    return Stat.from_samples([sum(p[i] for p in parts)
                              for i in range(arm.step.n)]).with_cpu(arm.step.cpu)


def harness_seconds(arm: ArmResult) -> Stat:
    """Per step, what is not a data stage: in the data mode, the harness's own cost."""
    data = data_stage_seconds(arm).samples
    return Stat.from_samples([w - d for w, d in zip(arm.step.samples, data)]).with_cpu(
        arm.step.cpu)


def reported_figures(study: LoopStudy, gap: tuple[str, str] | list[str] = (LAZY, DANGO)
                     ) -> list[ReportedFigure]:
    """The investigation's figures for the gap's two pipelines (slow, fast; by default the Lazy
    and the DANGO-style strategies): data-only and data+model it/s ratios (fast over slow), the
    data stages apart from the harness, data pipeline per sample, and the model-only per-batch
    ratio. The claimed values are the investigation's (its Lazy and DANGO models); for other
    pipelines they are a reference."""
    if len(gap) != 2 or not set(gap) <= set(study.strategies):
        return []  # one pipeline alone, or a gap this run did not time
    slow, fast = gap
    s_name, f_name = ("Lazy", "DANGO") if (slow, fast) == (LAZY, DANGO) else (slow, fast)
    lo = {m: study.arm(slow, m) for m in loop.MODES}
    hi = {m: study.arm(fast, m) for m in loop.MODES}
    model = study.model_seconds(slow).ratio_to(study.model_seconds(fast))
    ls, ds = data_stage_seconds(lo["data"]), data_stage_seconds(hi["data"])
    return [
        ReportedFigure("data_only_ratio", f"data-only step (no model call): {f_name} it/s over "
                       f"{s_name} it/s", 56.0, study.ratio(lo["data"], hi["data"]), "x"),
        ReportedFigure("data_stages_ratio", "data stages only (loader wait + transfer + device "
                       f"prep, the harness apart): {s_name} over {f_name}", 56.0,
                       ls.ratio_to(ds, paired=study.interleaved and ls.n == ds.n), "x"),
        ReportedFigure("harness_lazy_ms", "the harness's own cost per data-only step (the loop "
                       f"between stages), {s_name}", 0.0,
                       harness_seconds(lo["data"]).scaled(1e3, "ms"), "ms"),
        ReportedFigure("harness_dango_ms", "the harness's own cost per data-only step, "
                       f"{f_name}", 0.0, harness_seconds(hi["data"]).scaled(1e3, "ms"), "ms"),
        ReportedFigure("data_model_ratio", f"data + model: {f_name} it/s over {s_name} it/s",
                       19.0, study.ratio(lo["full"], hi["full"]), "x", (s_name, f_name)),
        ReportedFigure("lazy_data_ms", f"data pipeline per sample, {s_name}", 27.3,
                       lo["data"].ms_per_sample, "ms"),
        ReportedFigure("dango_data_ms", f"data pipeline per sample, {f_name}", 0.22,
                       hi["data"].ms_per_sample, "ms"),
        ReportedFigure("model_batch_ratio",
                       f"one batch, forward + backward + optimizer: {s_name} over {f_name}", 1.6,
                       model, "x"),
    ]


def stored_read_perturbations(data: DataSection, graph: CellGraph, n: int = 64) -> torch.Tensor:
    """The perturbations whose stored masks :func:`~.stored_masks.stored_mask_reads` reads
    (``data``: ``params.data``)."""
    return sample_perturbations(graph.num_genes, data.perturbation_k, n, seed=data.seed + 3)


def epochs_per_day(study: LoopStudy, num_samples: int) -> dict[str, float]:
    """Epochs per 24 h on one rank from each strategy's full step (arithmetic on a measured
    step time; multi-rank projections need each pipeline's step factor from notebook 04: see
    05)."""
    out = {}
    for name in study.strategies:
        a = study.arm(name, "full")
        out[name] = loop.project_epochs(a.step.median, a.samples_per_step,
                                        num_samples)["epochs_per_day"]
    return out


def sync_study(study: LoopStudy, graph: CellGraph, params: Params,
               device: torch.device) -> SyncStudy:
    """Syncs per step of every strategy (from the loop's counted step) and how the loop form of
    device mask generation (4a) scales with B, k and the number of edge types."""
    per = {n: study.arm(n, "full").syncs_per_step for n in study.strategies}
    kinds = {n: study.arm(n, "full").sync_kinds for n in study.strategies}
    scaling = []
    types = graph.edge_types
    if "device_mask_loop" not in params.strategies:  # the investigation's loop form: not run
        types = []
    for t in (sorted({1, min(3, len(types)), len(types)}) if types else []):
        sub = CellGraph(graph.name, graph.num_genes, {e: graph.edge_index[e] for e in types[:t]},
                        graph.source, graph.checksum, graph.scale)
        s4 = make_strategy("device_mask_loop", sub, device=device)
        for b in params.batch_sizes:
            for k in (1, 3, 5):
                pk = sample_perturbations(graph.num_genes, k, b, seed=params.seed).to(device)
                c = SyncCounter(device)
                with c.count():
                    s4.make_masks(pk)
                scaling.append(SyncPoint(b, k, t, c.total, s4.syncs_per_batch(pk)))
    return SyncStudy(method=method_for(device), per_step=per, kinds=kinds, scaling=scaling)


def stored_reads(params: Params, graph: CellGraph) -> StoredReads | None:
    """Strategy 3's stored masks read cold and warm (the investigation's storage claim), or None
    when strategy 3 is not among the run's built-in strategies."""
    if "replicated_mask_stored" not in params.strategies:
        return None
    from .stored_masks import stored_mask_reads

    return stored_mask_reads(graph, stored_read_perturbations(params.data, graph))


def profile_strategies(params: Params, graph: CellGraph, device: torch.device, *,
                       trace_dir: str | Path, run_dir: str | Path,
                       strategies: list[str] | None = None,
                       loops: LoopStudy | None = None) -> dict[str, ProfileResult]:
    """Warm full training steps of each strategy under ``torch.profiler``, by exclusive time.

    Strategy 3 is left out: its device work is strategy 2's (its storage read is in the loop).
    With ``loops``, only the pipelines it measured are profiled, and one whose profiled steps
    raise or stall is recorded in ``loops.failures`` (its loop figures kept) and not profiled.
    """
    from ...common.watchdog import Watchdog

    base = strategies or (loops.strategies if loops is not None else compared_names(params))
    names = [n for n in base if n != "replicated_mask_stored"]
    warm = max(1, params.warmup)
    wait, pw, active = params.profile_wait, params.profile_warmup, params.profile_active
    stall = params.stall_timeout_s
    out = {}
    with Watchdog(announce=note, why="stall_timeout_s") as wd:
        for name in progress(names, desc="03 profiles"):
            n_items = ((warm + wait + pw + active) * batch_size_for(params.loop, name)
                       if name in params.strategies else None)
            arm = None
            try:
                pipe = build_pipeline(params, name, graph, device, n_items=n_items, salt=1,
                                      check=loops is None)
                opt = pipe.configure_optimizer([p for p in pipe.model.parameters()
                                                if p.requires_grad])
                arm = loop.Arm(name, pipe, loop.make_loader(pipe), loop.Variant("full"),
                               optimizer=opt)
                arm.watchdog = wd if stall else None
                arm.stream = loop.cycle(arm.loader)
                clock = StepClock(device)

                def step(timed: bool) -> None:
                    if arm.watchdog is not None:
                        wd.arm(stall)
                    try:
                        arm.step(clock, timed=timed)
                    finally:
                        if arm.watchdog is not None:
                            wd.disarm()
                for _ in range(warm):
                    step(False)

                def one() -> float:
                    step(True)
                    return clock.steps[-1]["_wall"]
                out[name] = profile_steps(one, steps_done=warm, wait=wait, warmup=pw,
                                          active=active,
                                          trace_path=Path(trace_dir) / f"{name}.json",
                                          device=device, relative_to=run_dir)
                own = OwnCode(builtin=name in params.strategies)
                stream = arm.stream
                # fetched unprofiled: device_sites's recorded steps and line-marked ones
                arm.stream = iter([next(stream) for _ in range(DEVICE_SITE_CALLS)])
                loop.close_stream(stream)
                out[name].sites, out[name].sites_note = device_sites(
                    lambda: step(False), device=device, own=own)
                ds = pipe.dataset()
                b = pipe.batch_size
                # one batch per recorded call, the next items of the dataset (from its start
                # again where it holds fewer), each call under its own stall timer
                batches: list[list] = [[] for _ in range(RECORDED)]

                def items(k: int) -> None:
                    with wd.watch(f"'{name}' (profiled)", "data item", stall):
                        batches[k].extend(ds[i % len(ds)] for i in range(k * b, (k + 1) * b))

                def collate(k: int) -> None:
                    with wd.watch(f"'{name}' (profiled)", "collate", stall):
                        pipe.collate(batches[k])
                out[name].sites["data_item"] = data_sites(
                    [lambda k=k: items(k) for k in range(RECORDED)], own)
                out[name].sites["collate"] = data_sites(
                    [lambda k=k: collate(k) for k in range(RECORDED)], own)
            except (Exception, PipelineFailed) as exc:  # noqa: BLE001 - this pipeline only
                if loops is None:
                    raise
                f = build_failure(exc, name, "03")
                f.figures_kept = True  # the loop measured it; only its profile is missing
                f.message += " (in its profiled steps: no profile)"
                record_failure(loops.failures, f)
                note(f"03: {f.line()}")
            finally:
                if arm is not None:
                    loop.close_stream(arm.stream)
                    arm.stream = None
    return out


def step_bounds(study: LoopStudy) -> dict[str, StepBound]:
    """What bounds each pipeline's full step (:func:`~.stages.step_bound`)."""
    return {n: step_bound(study.arm(n, "full"), study.growth.get(n)) for n in study.strategies}


def is_exact(study: LoopStudy, name: str) -> bool:
    """Whether a compared pipeline declared that it computes the exact perturbed-graph forward
    (``exact = True``; a built-in strategy: its flag). Not stated is not exact."""
    if name in study.exact:
        return study.exact[name] is True
    from ...strategies import REGISTRY

    return REGISTRY[name].exact if name in REGISTRY else False


def fastest_exact(study: LoopStudy) -> str | None:
    exact = [n for n in study.strategies if is_exact(study, n)]
    return min(exact, key=lambda n: study.arm(n, "full").ms_per_sample.median, default=None)
