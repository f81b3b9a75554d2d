"""Notebook 04's experiment: plan the world sizes on the allocation, launch each with torchrun,
summarize, fit the ring model, decompose the gap.

The world sizes are launched alternately, :data:`ROUNDS` times each (1, 2, 1, 2 for world sizes
[1, 2]), so that a slow drift of the machine falls on both sides of the DDP factor and the pairs of
adjacent launches show the launch-to-launch spread; ``ddp_budget_s`` is split over a world size's
launches. Every launch runs the same threads and DataLoader workers per rank (see ``plan``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..measurement.timing import Stat
from ..records import Record
from ..common.progress import note
from ..configs.params import ddp_strategy
from . import allreduce_model as arm
from .analysis import (GapDecomposition, WorldSummary, efficiencies, gap_decomposition,
                       summarize, within_noise)
from .launcher import launch
from .plan import Plan, plan

ROUNDS = 2  # launches per world size, alternated


@dataclass
class Prediction(Record):
    world_size: int
    comm_s: float  # all-reduce of one step's gradients, predicted
    step_s: float
    measured_s: float | None
    extrapolated: bool


@dataclass
class DDPResult(Record):
    plan: Plan
    scaling_strategy: str
    gap_strategies: list[str]
    worlds: dict[int, WorldSummary]
    weak: dict[int, Stat]
    strong: dict[int, Stat]
    ring: arm.RingFit | None
    link: dict
    link_source: str
    predictions: list[Prediction]
    presets: dict[str, dict[int, float]]  # link -> world size -> comm seconds of the gradients
    gap: GapDecomposition
    ratio_03: Stat | None = None  # notebook 03's per-step ratio of the same two strategies
    agrees_with_03: bool | None = None
    logs: dict[str, str] = field(default_factory=dict)  # launch name -> folder (relative)

    def log_files(self, run_dir: Path) -> list[str]:
        """Every file of the launches (torchrun log, rank logs and results), relative."""
        return [f"{d}/{f.name}" for d in self.logs.values()
                for f in sorted((Path(run_dir) / d).glob("*")) if f.is_file()]


def run_ddp(params: dict, device: torch.device, run_dir: Path,
            rounds: int = ROUNDS) -> tuple[Plan, dict]:
    """Launch every world size the allocation can place, alternately ``rounds`` times;
    ``{world: (launch plan, [launch results])}``."""
    pl = plan(params["world_sizes"], backend=params["backend"], device=device,
              nnodes=params["nnodes"], num_workers=params["num_workers"])
    if not pl.launches:
        return pl, {}
    slow, fast = params["gap_strategies"]
    cfg = {"params": {**params, "backend": pl.backend},
           "scaling_strategy": ddp_strategy(params), "gap_strategies": [slow, fast],
           "batch_size": params["ddp_batch_size"],
           "global_batch": params["ddp_batch_size"] * max(params["world_sizes"]),
           "steps": params["ddp_steps"], "steps_cap": 3 * params["ddp_steps"],
           "warmup": max(1, params["warmup"]), "budget_s": params["ddp_budget_s"] / rounds,
           "timeout_s": params["ddp_timeout_s"]}
    out: dict = {ln.world_size: (ln, []) for ln in pl.launches}
    for i in range(rounds):
        for ln in pl.launches:
            folder = f"world{ln.world_size}" + (f"_r{i + 1}" if i else "")
            note(f"04: launch {i + 1}/{rounds} of world size {ln.world_size} ({ln.nnodes} "
                 f"node(s) x {ln.procs_per_node}, {ln.threads_per_rank} thread(s) and "
                 f"{ln.workers_per_rank} DataLoader worker(s) per rank)")
            res = launch("workbook_lib.distributed.worker",
                         {**cfg, "workers": ln.workers_per_rank, "threads_all": ln.threads_all},
                         nproc_per_node=ln.procs_per_node, nnodes=ln.nnodes,
                         rdzv_endpoint=params["rdzv_endpoint"],
                         out_dir=run_dir / "ddp_04" / folder,
                         timeout_s=params["ddp_timeout_s"], threads_per_rank=ln.threads_per_rank)
            out[ln.world_size][1].append(res)
    return pl, out


def analyse(params: dict, pl: Plan, launched: dict, run_dir: Path,
            ratio_03: Stat | None = None) -> DDPResult:
    slow, fast = params["gap_strategies"]
    worlds = {w: summarize([r.ranks for r in res], scaling=ddp_strategy(params),
                           gap=[slow, fast], procs_per_node=ln.procs_per_node, nnodes=ln.nnodes,
                           workers_per_rank=ln.workers_per_rank)
              for w, (ln, res) in sorted(launched.items())}
    weak, strong = efficiencies(worlds)
    samples = [(w, b, st.median) for w, s in worlds.items() if w > 1 for b, st in s.allreduce]
    ring = arm.fit_ring(samples) if len(samples) >= 2 else None
    if params["link_bandwidth_gbps"] is not None:
        link = {"bandwidth_gbps": params["link_bandwidth_gbps"],
                "latency_us": params["link_latency_us"] or 0.0}
        source = "params link_bandwidth_gbps / link_latency_us"
    elif ring is not None:
        link, source = ring.link(), (f"fitted on all-reduces timed here at world sizes "
                                     f"{ring.world_sizes} (in-sample error "
                                     f"{ring.median_abs_rel_error:.0%})")
    else:
        link = arm.LINK_PRESETS["PCIe gen4"]
        source = "preset 'PCIe gen4' (no world size >= 2 ran here)"
    top = max(worlds)
    ref = worlds[top]
    overlap = ref.overlap or 0.0  # 0 by construction with one bucket
    measured_ws = set(worlds)
    preds = []
    for w in sorted(w for w in measured_ws | {2, 4, 8, 16} if w >= top):
        comm = arm.comm_seconds(ref.grad_bytes, w, link, bucket_cap_mb=params["bucket_cap_mb"])
        step = ref.variants["no_sync"].median + (1 - overlap) * comm
        preds.append(Prediction(w, comm, step, worlds[w].step.median if w in worlds else None,
                                w > max(ring.world_sizes if ring else [1])))
    presets = {name: {w: arm.comm_seconds(ref.grad_bytes, w, lk,
                                          bucket_cap_mb=params["bucket_cap_mb"])
                      for w in (2, 4, 8, 16)} for name, lk in arm.LINK_PRESETS.items()}
    # each gap pipeline's batch as its ranks ran it (a user pipeline chooses its own)
    ranks = next(iter(launched.values()))[1][0].ranks
    r0 = ranks[min(ranks)]
    gap = gap_decomposition(worlds, slow, fast, {s: int(r0["arms"][f"{s}/gap"]["batch_size"])
                                                 for s in (slow, fast)})
    agrees = None
    if ratio_03 is not None:
        agrees = within_noise(gap.per_step_ratio.ratio_to(ratio_03))
    logs = {}
    for w, (_ln, results) in launched.items():
        for res in results:
            try:
                rel = str(Path(res.out_dir).resolve().relative_to(Path(run_dir).resolve()))
            except ValueError:
                rel = str(res.out_dir)
            logs[Path(rel).name] = rel
    return DDPResult(plan=pl, scaling_strategy=ddp_strategy(params),
                     gap_strategies=[slow, fast], worlds=worlds, weak=weak, strong=strong,
                     ring=ring, link=link, link_source=source, predictions=preds,
                     presets=presets, gap=gap, ratio_03=ratio_03, agrees_with_03=agrees,
                     logs=logs)
