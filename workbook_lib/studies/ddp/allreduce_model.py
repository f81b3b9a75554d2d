"""Ring all-reduce time model: ``t(n, bytes) = 2(n-1)*latency + 2(n-1)/n * bytes / bandwidth``,
fitted on all-reduces timed here (gloo on CPU, NCCL on GPU) or taken from a preset or params;
a prediction beyond the measured world sizes says it is an extrapolation, with the fit's error.
"""
from __future__ import annotations

import math

import numpy as np

from ...results.ddp import RingFit

# Typical per-GPU all-reduce bus bandwidth (GB/s) and per-hop latency (us); orders of magnitude
# only: measure on your cluster and pass link_bandwidth_gbps / link_latency_us.
LINK_PRESETS = {
    "NVLink (H100 SXM)": {"bandwidth_gbps": 150.0, "latency_us": 5.0},
    "PCIe gen4": {"bandwidth_gbps": 20.0, "latency_us": 10.0},
    "InfiniBand HDR 200 Gb/s": {"bandwidth_gbps": 22.0, "latency_us": 15.0},
    "10 GbE": {"bandwidth_gbps": 1.1, "latency_us": 50.0},
}


def ring_allreduce_seconds(num_bytes: float, world_size: int, bandwidth_gbps: float,
                           latency_us: float, num_calls: int = 1) -> float:
    """Predicted time of all-reducing ``num_bytes`` over ``world_size`` ranks in ``num_calls``
    calls (e.g. DDP buckets), each paying the per-hop latency ``2(n-1)`` times."""
    if world_size <= 0:
        raise ValueError(f"'world_size' must be a positive integer (got {world_size})")
    if bandwidth_gbps <= 0:
        raise ValueError(f"'bandwidth_gbps' must be positive (got {bandwidth_gbps})")
    if world_size == 1:
        return 0.0
    n = world_size
    return (2 * (n - 1) / n * num_bytes / (bandwidth_gbps * 1e9)
            + num_calls * 2 * (n - 1) * latency_us * 1e-6)


def fit_ring(samples: list[tuple[int, float, float]]) -> RingFit:
    """Fit from ``[(world_size, bytes, seconds), ...]`` with world sizes >= 2."""
    pts = [(n, b, t) for n, b, t in samples if n >= 2]
    if len(pts) < 2:
        raise ValueError(f"need at least 2 all-reduce timings at world size >= 2 (got {len(pts)})")
    x = np.array([[2 * (n - 1), 2 * (n - 1) / n * b] for n, b, _ in pts])
    y = np.array([t for *_, t in pts])
    (lat, inv_bw), *_ = np.linalg.lstsq(x, y, rcond=None)
    notes = []
    if inv_bw <= 0:
        notes.append("the bandwidth term came out non-positive (timings dominated by latency "
                      "at these sizes): bandwidth set to the largest size / its time")
        n, b, t = max(pts, key=lambda p: p[1])
        inv_bw = t / (2 * (n - 1) / n * b)
    if lat < 0:  # no negative time: refit with none (found by a user trial: the negative
        # latency predicted -2.3 ms all-reduces at 16 ranks)
        notes.append(f"the latency term came out negative ({lat * 1e6:.3g} us: below the "
                     "noise), so the bandwidth is refitted with latency 0")
        lat = 0.0
        inv_bw = float(x[:, 1] @ y / (x[:, 1] @ x[:, 1]))
    pred = x @ np.array([lat, inv_bw])
    err = float(np.median(np.abs(pred - y) / y))
    return RingFit(bandwidth_gbps=1.0 / inv_bw / 1e9, latency_us=float(lat) * 1e6,
                   world_sizes=sorted({n for n, _, _ in pts}), points=len(pts),
                   median_abs_rel_error=err, notes=notes)


def num_buckets(num_bytes: float, bucket_cap_mb: float) -> int:
    return max(1, math.ceil(num_bytes / (bucket_cap_mb * 1024 * 1024)))


def comm_seconds(grad_bytes: float, world_size: int, link: dict, *,
                 bucket_cap_mb: float = 25.0) -> float:
    """Predicted all-reduce time of one step's gradients in DDP buckets."""
    return ring_allreduce_seconds(grad_bytes, world_size, link["bandwidth_gbps"],
                                  link["latency_us"], num_buckets(grad_bytes, bucket_cap_mb))


