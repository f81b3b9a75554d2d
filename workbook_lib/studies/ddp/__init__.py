"""Notebook 04's experiment: plan the world sizes, launch each with torchrun (alternately,
:data:`ROUNDS` times each), summarize, fit the ring model, decompose the gap. A pipeline that
fails in a rank is recorded and the launch made again without it; other failures fail 04.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ...configs.validation import Params
from ...exceptions import LaunchError
from ...failures import NONFINITE, PipelineFailure
from ...measurement.timing import Stat
from ...common.progress import note
from ...configs.validation import ddp_strategy
from ...results.ddp import DDPResult, Plan, Prediction
from . import allreduce_model as arm
from .summary import efficiencies, gap_decomposition, summarize, within_noise
from ...distributed import worker
from ...distributed.launcher import launch
from ...distributed.worker_config import WorkerConfig
from ...distributed.plan import plan

ROUNDS = 2  # launches per world size, alternated


@dataclass
class Launches:
    """What :func:`run_ddp` launched: per world size its plan and results, the pipelines that
    failed, and the folders of the launches they ended (kept for their logs)."""

    by_world: dict = field(default_factory=dict)  # world -> (Launch, [LaunchResult])
    failures: dict[str, PipelineFailure] = field(default_factory=dict)
    failed_dirs: list[Path] = field(default_factory=list)


def rank_failure(out_dir: Path) -> PipelineFailure | None:
    """The first failure a rank of the launch in ``out_dir`` recorded for a pipeline (its
    ``rank{R}.failure.json``), or None."""
    files = sorted(Path(out_dir).glob("rank*.failure.json"), key=lambda p: p.stat().st_mtime_ns)
    for f in files:
        try:
            rec = PipelineFailure.from_json(json.loads(f.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            continue
        rec.notebook = "04"
        return rec
    return None


def run_ddp(params: Params, device: torch.device, run_dir: Path,
            rounds: int = ROUNDS) -> tuple[Plan, Launches]:
    """Launch every world size the allocation can place, alternately ``rounds`` times; a
    pipeline that fails in a rank is recorded and the launch made again without it (see the
    module docstring)."""
    pl = plan(params.world_sizes, backend=params.backend, device=device,
              nnodes=params.nnodes, num_workers=params.num_workers)
    got = Launches()
    if not pl.launches:
        return pl, got
    slow, fast = params.gap_strategies
    scaling = ddp_strategy(params)
    cfg = WorkerConfig(params=params.replace(backend=pl.backend), scaling_strategy=scaling,
                       gap_strategies=[slow, fast], batch_size=params.ddp_batch_size,
                       global_batch=params.ddp_batch_size * max(params.world_sizes),
                       steps=params.ddp_steps, steps_cap=3 * params.ddp_steps,
                       warmup=max(1, params.warmup), budget_s=params.ddp_budget_s / rounds,
                       timeout_s=params.ddp_timeout_s)
    got.by_world = {ln.world_size: (ln, []) for ln in pl.launches}
    for i in range(rounds):
        for ln in pl.launches:
            folder = f"world{ln.world_size}" + (f"_r{i + 1}" if i else "")
            retry = 0
            while True:
                if scaling in got.failures:
                    return pl, got  # no scaling arms, nothing to launch
                note(f"04: launch {i + 1}/{rounds} of world size {ln.world_size} ({ln.nnodes} "
                     f"node(s) x {ln.procs_per_node}, {ln.threads_per_rank} thread(s) and "
                     f"{ln.workers_per_rank} DataLoader worker(s) per rank)")
                out_dir = run_dir / "ddp_04" / (folder + (f"_retry{retry}" if retry else ""))
                gap = [g for g in (slow, fast) if g not in got.failures]
                try:
                    res = launch(worker.__name__,
                                 replace(cfg, gap_strategies=gap, workers=ln.workers_per_rank,
                                         threads_all=ln.threads_all),
                                 nproc_per_node=ln.procs_per_node, nnodes=ln.nnodes,
                                 rdzv_endpoint=params.rdzv_endpoint, out_dir=out_dir,
                                 timeout_s=params.ddp_timeout_s,
                                 threads_per_rank=ln.threads_per_rank)
                except LaunchError:
                    f = rank_failure(out_dir)
                    if f is None or f.pipeline in got.failures:
                        raise  # not one pipeline's failure: the launch failed
                    got.failures[f.pipeline] = f
                    got.failed_dirs.append(out_dir)
                    rest = ("no DDP figures (it is the scaling strategy)" if f.pipeline == scaling
                            else "launching again without it")
                    note(f"04: {f.line()}; {rest}")
                    retry += 1
                    continue
                got.by_world[ln.world_size][1].append(res)
                break
    return pl, got


def analyse(params: Params, pl: Plan, launched: Launches | dict, run_dir: Path,
            ratio_03: Stat | None = None) -> DDPResult:
    """Every figure of notebook 04 from the launches (``launched``: :func:`run_ddp`'s, or its
    ``by_world`` dict). A pipeline that failed is left out of every launch's figures; no gap is
    decomposed when one of the two gap pipelines failed, and there are no figures at all when
    the scaling pipeline did (or nothing could be launched)."""
    by_world = launched.by_world if isinstance(launched, Launches) else launched
    failures = dict(launched.failures) if isinstance(launched, Launches) else {}
    failed_dirs = list(launched.failed_dirs) if isinstance(launched, Launches) else []
    slow, fast = params.gap_strategies
    scaling = ddp_strategy(params)
    gap_names = [g for g in (slow, fast) if g not in failures]
    runs = {w: (ln, res) for w, (ln, res) in sorted(by_world.items()) if res}
    if scaling in failures:
        runs = {}
    worlds = {w: summarize([r.ranks for r in res], scaling=scaling, gap=gap_names,
                           procs_per_node=ln.procs_per_node, nnodes=ln.nnodes,
                           workers_per_rank=ln.workers_per_rank)
              for w, (ln, res) in runs.items()}
    for name in gap_names + [scaling]:
        f = _nonfinite(name, runs)
        if f is not None and name not in failures:
            failures[name] = f
            note(f"04: {f.line()}")
    logs = {}
    for _w, (_ln, results) in by_world.items():
        for d in [res.out_dir for res in results]:
            logs.update(_log_entry(d, run_dir))
    for d in failed_dirs:
        logs.update(_log_entry(d, run_dir))
    link = arm.LINK_PRESETS["PCIe gen4"]
    if not worlds:
        return DDPResult(plan=pl, scaling_strategy=scaling, gap_strategies=[slow, fast],
                         worlds={}, weak={}, strong={}, ring=None, link=link,
                         link_source="nothing measured", predictions=[], presets={}, gap=None,
                         ratio_03=ratio_03, agrees_with_03=None, logs=logs, failures=failures)
    weak, strong = efficiencies(worlds)
    samples = [(w, b, st.median) for w, s in worlds.items() if w > 1 for b, st in s.allreduce]
    ring = arm.fit_ring(samples) if len(samples) >= 2 else None
    if params.link_bandwidth_gbps is not None:
        link = {"bandwidth_gbps": params.link_bandwidth_gbps,
                "latency_us": params.link_latency_us or 0.0}
        source = "params link_bandwidth_gbps / link_latency_us"
    elif ring is not None:
        link, source = ring.link(), (f"fitted on all-reduces timed here at world sizes "
                                     f"{ring.world_sizes} (in-sample error "
                                     f"{ring.median_abs_rel_error:.0%})")
    else:
        source = "preset 'PCIe gen4' (no world size >= 2 ran here)"
    top = max(worlds)
    ref = worlds[top]
    overlap = ref.overlap or 0.0  # 0 by construction with one bucket
    measured_ws = set(worlds)
    preds = []
    for w in sorted(w for w in measured_ws | {2, 4, 8, 16} if w >= top):
        comm = arm.comm_seconds(ref.grad_bytes, w, link, bucket_cap_mb=params.bucket_cap_mb)
        step = ref.variants["no_sync"].median + (1 - overlap) * comm
        preds.append(Prediction(w, comm, step, worlds[w].step.median if w in worlds else None,
                                w > max(ring.world_sizes if ring else [1])))
    presets = {name: {w: arm.comm_seconds(ref.grad_bytes, w, lk,
                                          bucket_cap_mb=params.bucket_cap_mb)
                      for w in (2, 4, 8, 16)} for name, lk in arm.LINK_PRESETS.items()}
    gap = agrees = None
    if len(gap_names) == 2:
        # each gap pipeline's batch as its ranks ran it (a user pipeline chooses its own)
        ranks = next(iter(runs.values()))[1][0].ranks
        r0 = ranks[min(ranks)]
        gap = gap_decomposition(worlds, slow, fast,
                                {s: int(r0["arms"][f"{s}/gap"]["batch_size"])
                                 for s in (slow, fast)})
        if ratio_03 is not None:
            agrees = within_noise(gap.per_step_ratio.ratio_to(ratio_03))
    return DDPResult(plan=pl, scaling_strategy=scaling,
                     gap_strategies=[slow, fast], worlds=worlds, weak=weak, strong=strong,
                     ring=ring, link=link, link_source=source, predictions=preds,
                     presets=presets, gap=gap, ratio_03=ratio_03, agrees_with_03=agrees,
                     logs=logs, failures=failures)


def _log_entry(out_dir: Path, run_dir: Path) -> dict[str, str]:
    try:
        rel = str(Path(out_dir).resolve().relative_to(Path(run_dir).resolve()))
    except ValueError:
        rel = str(out_dir)
    return {Path(rel).name: rel}


def _nonfinite(name: str, runs: dict) -> PipelineFailure | None:
    """A pipeline whose loss was not finite in some rank's arm of it (figures kept, marked)."""
    for w, (_ln, results) in runs.items():
        for res in results:
            for rank, doc in sorted(res.ranks.items()):
                for arm_name, a in doc["arms"].items():
                    mine = arm_name.split("/")[0] == name
                    if mine and a.get("nonfinite_steps"):
                        return PipelineFailure(
                            name, "04", "loss", NONFINITE,
                            f"the loss was not finite ({a.get('nonfinite_value') or 'NaN'}) at "
                            f"{a['nonfinite_steps']} of {a.get('loss_steps')} steps of "
                            f"'{arm_name}' on rank {rank} at world size {w}, first at step "
                            f"{a.get('first_nonfinite_step')}: its timings are of a diverged "
                            "step", step=a.get("first_nonfinite_step"), mode=arm_name,
                            rank=int(rank), figures_kept=True)
    return None
