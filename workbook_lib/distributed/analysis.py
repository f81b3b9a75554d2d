"""Aggregating DDP rank results into scaling numbers, predictions and the gap decomposition."""
from __future__ import annotations

import math
import statistics

import numpy as np

from ..distributed import allreduce_model as arm


def _median(xs):
    return float(statistics.median(xs)) if xs else float("nan")


def _iqr(xs):
    return float(np.percentile(xs, 75) - np.percentile(xs, 25)) if xs else float("nan")


def synchronous_steps(ranks: dict, strategy: str, variant: str, key: str = "step") -> list[float]:
    """Per-step time of the slowest rank (a synchronous step ends when the last rank does)."""
    series = [r["strategies"][strategy][variant][key] for r in ranks.values()]
    return [max(vals) for vals in zip(*series)]


def summarize_world(ranks: dict, strategy: str) -> dict:
    """Scaling numbers of one world size for the fully measured strategy."""
    ws = len(ranks)
    s0 = next(iter(ranks.values()))["strategies"][strategy]
    ddp = synchronous_steps(ranks, strategy, "ddp")
    nos = synchronous_steps(ranks, strategy, "no_sync")
    out = {"world_size": ws, "batch_size": s0["batch_size"], "grad_bytes": s0["grad_bytes"],
           "step_median": _median(ddp), "step_iqr": _iqr(ddp),
           "forward_median": _median(synchronous_steps(ranks, strategy, "ddp", "forward")),
           "backward_median": _median(synchronous_steps(ranks, strategy, "ddp", "backward")),
           "optimizer_median": _median(synchronous_steps(ranks, strategy, "ddp", "optimizer")),
           "no_sync_median": _median(nos)}
    per_rank = [_median(r["strategies"][strategy]["ddp"]["step"]) for r in ranks.values()]
    out["rank_medians"] = per_rank
    out["rank_spread"] = (max(per_rank) - min(per_rank)) / out["step_median"]
    exposed = max(0.0, out["step_median"] - out["no_sync_median"]) if ws > 1 else 0.0
    ar = [a for a in next(iter(ranks.values()))["allreduce"]]
    grad_ar = min(ar, key=lambda a: abs(a["bytes"] - out["grad_bytes"]))["seconds"] if ws > 1 \
        else 0.0
    out["allreduce_grad_s"] = grad_ar
    out["exposed_comm_s"] = exposed
    out["comm_fraction"] = exposed / out["step_median"]
    out["overlap"] = (min(1.0, max(0.0, 1.0 - exposed / grad_ar)) if ws > 1 and grad_ar > 0
                      else None)
    for v in ("strong", "accum_no_sync", "accum_sync_every", "ddp_gather_toggled"):
        if v in s0:
            out[f"{v}_median"] = _median(synchronous_steps(ranks, strategy, v))
    out["strong_batch_size"] = s0.get("strong_batch_size")
    out["accum_steps"] = s0.get("accum_steps")
    out["ddp_logging"] = s0.get("ddp_logging")
    out["allreduce"] = ar
    return out


def efficiencies(summary: dict[int, dict]) -> dict:
    """Weak (per-rank batch fixed) and strong (global batch fixed) scaling efficiency."""
    base = summary.get(1)
    weak, strong = {}, {}
    for ws, s in summary.items():
        if base:
            weak[ws] = base["step_median"] / s["step_median"]
            if "strong_median" in s and "strong_median" in base:
                strong[ws] = base["strong_median"] / (ws * s["strong_median"])
    return {"weak": weak, "strong": strong}


def link_from_measurements(summary: dict[int, dict]) -> dict | None:
    """Fit the ring model on the largest measured world size >= 2 (None if there is none)."""
    multi = [ws for ws in summary if ws >= 2]
    if not multi:
        return None
    ws = max(multi)
    fit = arm.fit_ring(summary[ws]["allreduce"], ws)
    fit["source"] = f"fitted on timed all-reduces at world size {ws}"
    return fit


def predictions(summary: dict[int, dict], link: dict, world_sizes: list[int], *,
                bucket_cap_mb: float) -> dict[int, float]:
    """Predicted step time per world size from the single-rank compute time, the gradient
    bytes, the link and the measured overlap."""
    base = summary.get(1) or summary[min(summary)]
    overlaps = [s["overlap"] for ws, s in sorted(summary.items()) if s.get("overlap") is not None]
    overlap = overlaps[-1] if overlaps else 0.0
    compute = base["no_sync_median"]
    return {ws: arm.predict_step(compute, base["grad_bytes"], ws, link,
                                 bucket_cap_mb=bucket_cap_mb, overlap=overlap)
            for ws in world_sizes}


def gap_decomposition(rank_results: dict[int, dict], slow: str, fast: str, *,
                      num_samples: int) -> dict:
    """Epoch-time ratio slow/fast = steps-per-epoch ratio x per-step-time ratio x DDP factor.

    ``rank_results`` maps world size -> launch ranks; the per-step ratio is taken on one rank,
    the DDP factor at the largest world size measured (1.0 if only one rank was run).
    """
    ws_max = max(rank_results)

    def step(ws, name):
        return _median(synchronous_steps(rank_results[ws], name, "ddp"))
    b_slow = next(iter(rank_results[ws_max].values()))["strategies"][slow]["batch_size"]
    b_fast = next(iter(rank_results[ws_max].values()))["strategies"][fast]["batch_size"]
    steps_ratio = math.ceil(num_samples / (b_slow * ws_max)) / math.ceil(
        num_samples / (b_fast * ws_max))
    base = min(rank_results)
    per_step = step(base, slow) / step(base, fast)
    ddp_factor = ((step(ws_max, slow) / step(base, slow)) / (step(ws_max, fast) / step(base, fast))
                  if ws_max != base else 1.0)
    return {"steps_ratio": steps_ratio, "per_step_ratio": per_step, "ddp_factor": ddp_factor,
            "total": steps_ratio * per_step * ddp_factor, "world_size": ws_max,
            "batch_sizes": {slow: b_slow, fast: b_fast}, "strategies": [slow, fast]}
