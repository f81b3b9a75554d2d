"""Peak memory of one training step, measured in a fresh process per point.

Each point (strategy, batch size, graph scale, model size) runs ``python -m workbook_lib.memory
CONFIG`` in its own process, so the peak belongs to that step alone: on CPU the growth of the
peak resident set (``ru_maxrss``) over the set-up, on GPU ``torch.cuda.max_memory_allocated``.
A point that runs out of memory (host ``MemoryError``, CUDA OOM, or the process killed by the
kernel's OOM killer) is recorded as ``None`` with the reason, and the sweep goes on. A linear fit
``bytes(B) = fixed + per_sample * B`` gives the largest batch that fits a budget.
"""
from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys

from ..running.results import to_jsonable


def _probe(cfg: dict) -> dict:
    import torch

    from ..analysis.benchmarks import step_time  # noqa: F401  (imports the model stack once)
    from ..strategies.model import PerturbGIN
    from ..running.params import validate
    from ..data.perturbations import sample_perturbations
    from ..data.snapshots import load_snapshot
    from ..strategies import build_ctx, make_strategy

    p = validate(cfg["params"], source="memory probe")
    device = torch.device(cfg["device"])
    graph = load_snapshot(p, scale=cfg["scale"])
    s = make_strategy(cfg["strategy"], graph, aggr=p["aggr"], device=device, form=cfg["form"])
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=cfg["hidden"],
                       layers=cfg["layers"], seed=p["seed"]).to(device)
    pert = sample_perturbations(graph.num_genes, p["perturbation_k"], cfg["batch_size"],
                                seed=p["seed"])
    dual = cfg["dual"] and s.exact
    if device.type == "cuda":
        torch.cuda.synchronize()
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base_dev = torch.cuda.memory_allocated(device)
    ctx = build_ctx(s, pert)
    loss = s.predict(model, ctx, dual=dual).sum()
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out = {"host_peak_bytes": peak_rss - base_rss, "device_peak_bytes": None}
    if device.type == "cuda":
        out["device_peak_bytes"] = torch.cuda.max_memory_allocated(device) - base_dev
    return out


def measure_point(params: dict, *, strategy: str, batch_size: int, scale: float, hidden: int,
                  layers: int, device: str = "cpu", form: str = "gather_scatter",
                  dual: bool = True, timeout_s: float = 600.0) -> dict:
    """Peak memory of one fwd+bwd step in a fresh process: ``{"bytes", "host_peak_bytes",
    "device_peak_bytes", "reason"}`` with ``bytes=None`` and a reason when it did not fit."""
    cfg = {"params": to_jsonable(params), "strategy": strategy, "batch_size": batch_size,
           "scale": scale, "hidden": hidden, "layers": layers, "device": device,
           "form": form, "dual": dual}
    base = {"strategy": strategy, "form": form, "batch_size": batch_size, "scale": scale,
            "hidden": hidden, "layers": layers, "device": device}
    try:
        proc = subprocess.run([sys.executable, "-m", "workbook_lib.measurement.memory", json.dumps(cfg)],
                              capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "OMP_NUM_THREADS": os.environ.get(
                                  "OMP_NUM_THREADS", str(os.cpu_count() or 1))})
    except subprocess.TimeoutExpired:
        return {**base, "bytes": None, "host_peak_bytes": None, "device_peak_bytes": None,
                "reason": f"timed out after {timeout_s:.0f} s"}
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
        if proc.returncode in (-9, 137):
            reason = "out of memory (process killed by the OOM killer)"
        elif "out of memory" in proc.stderr.lower() or "MemoryError" in proc.stderr:
            reason = f"out of memory ({err})"
        else:
            reason = f"failed (exit {proc.returncode}): {err}"
        return {**base, "bytes": None, "host_peak_bytes": None, "device_peak_bytes": None,
                "reason": reason}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    main = res["device_peak_bytes"] if device.startswith("cuda") else res["host_peak_bytes"]
    return {**base, **res, "bytes": main, "reason": None}


def sweep(params: dict, strategies: list[tuple[str, str]], batch_sizes: list[int], **kw) -> list:
    """Every (strategy, form) x batch size; out-of-memory points are kept as None."""
    from tqdm import tqdm

    rows = []
    for (name, form) in tqdm(strategies, desc="memory sweep"):
        for b in batch_sizes:
            rows.append(measure_point(params, strategy=name, form=form, batch_size=b, **kw))
    return rows


def fit_largest_batch(points: list[dict], budget_bytes: float) -> dict:
    """Fit ``bytes = fixed + per_sample * B`` on the measured points (None skipped) and give
    the largest B within ``budget_bytes`` (None when fewer than two points were measured)."""
    pts = [(p["batch_size"], p["bytes"]) for p in points if p.get("bytes") is not None]
    if len({b for b, _ in pts}) < 2:
        return {"fixed_bytes": None, "per_sample_bytes": None, "largest_batch": None,
                "budget_bytes": budget_bytes}
    n = len(pts)
    mb = sum(b for b, _ in pts) / n
    my = sum(y for _, y in pts) / n
    slope = sum((b - mb) * (y - my) for b, y in pts) / sum((b - mb) ** 2 for b, _ in pts)
    fixed = my - slope * mb
    if slope <= 0:
        return {"fixed_bytes": fixed, "per_sample_bytes": None, "largest_batch": None,
                "budget_bytes": budget_bytes,
                "reason": "no per-sample growth above measurement noise at these sizes"}
    largest = math.floor((budget_bytes - fixed) / slope)
    return {"fixed_bytes": fixed, "per_sample_bytes": slope, "largest_batch": max(0, largest),
            "budget_bytes": budget_bytes}


if __name__ == "__main__":
    print(json.dumps(_probe(json.loads(sys.argv[1]))))
