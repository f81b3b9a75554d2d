"""Ring all-reduce time model: ``t(n, bytes) = 2 (n-1)/n * bytes / bandwidth + latency``.

Bandwidth and latency are fitted on all-reduces timed here (gloo on CPU, NCCL on GPU) or taken
from a preset / params for links this machine does not have.
"""
from __future__ import annotations

import math

import numpy as np

# Typical per-GPU all-reduce bus bandwidth (GB/s) and per-call latency (us); order of magnitude
# only - measure on your cluster and pass link_bandwidth_gbps / link_latency_us.
LINK_PRESETS = {
    "nvlink (H100 SXM)": {"bandwidth_gbps": 150.0, "latency_us": 10.0},
    "pcie gen4": {"bandwidth_gbps": 20.0, "latency_us": 15.0},
    "infiniband HDR 200 Gb/s": {"bandwidth_gbps": 22.0, "latency_us": 20.0},
}


def ring_allreduce_seconds(num_bytes: float, world_size: int, bandwidth_gbps: float,
                           latency_us: float, num_calls: int = 1) -> float:
    """Predicted time of all-reducing ``num_bytes`` over ``world_size`` ranks in ``num_calls``
    calls (e.g. DDP buckets), each paying the latency once."""
    if world_size <= 0:
        raise ValueError(f"'world_size' must be a positive integer (got {world_size})")
    if bandwidth_gbps <= 0:
        raise ValueError(f"'bandwidth_gbps' must be positive (got {bandwidth_gbps})")
    if world_size == 1:
        return 0.0
    factor = 2.0 * (world_size - 1) / world_size
    return factor * num_bytes / (bandwidth_gbps * 1e9) + num_calls * latency_us * 1e-6


def fit_ring(samples: list[dict], world_size: int) -> dict:
    """Fit bandwidth and latency from ``[{"bytes": b, "seconds": t}, ...]`` at one world size."""
    if world_size < 2:
        raise ValueError(f"'world_size' must be >= 2 to fit a link (got {world_size})")
    factor = 2.0 * (world_size - 1) / world_size
    x = np.array([[factor * s["bytes"], 1.0] for s in samples])
    y = np.array([s["seconds"] for s in samples])
    (slope, intercept), *_ = np.linalg.lstsq(x, y, rcond=None)
    slope = max(slope, 1e-15)
    return {"bandwidth_gbps": 1.0 / slope / 1e9, "latency_us": max(intercept, 0.0) * 1e6,
            "world_size": world_size}


def num_buckets(num_bytes: float, bucket_cap_mb: float) -> int:
    return max(1, math.ceil(num_bytes / (bucket_cap_mb * 1024 * 1024)))


def predict_step(compute_s: float, grad_bytes: float, world_size: int, link: dict, *,
                 bucket_cap_mb: float = 25.0, overlap: float = 0.0) -> float:
    """Step time at ``world_size``: compute plus the part of the all-reduce not hidden behind
    backward (``overlap`` = fraction hidden, measured)."""
    comm = ring_allreduce_seconds(grad_bytes, world_size, link["bandwidth_gbps"],
                                  link["latency_us"], num_buckets(grad_bytes, bucket_cap_mb))
    return compute_s + (1.0 - min(max(overlap, 0.0), 1.0)) * comm
