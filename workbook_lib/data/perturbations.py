"""Perturbations: which genes each sample deletes (seeded), padded to ``[n, k_max]`` with -1."""
from __future__ import annotations

import numpy as np
import torch

PAD = -1


def sample_perturbations(num_genes: int, k: int | dict, n: int, seed: int = 0) -> torch.Tensor:
    """Sample ``n`` perturbations of ``k`` distinct genes each.

    Args:
        num_genes: genes in the graph.
        k: genes deleted per sample, or a mapping ``k -> probability``.
        n: number of samples.
        seed: RNG seed (default 0); the same seed gives the same perturbations.

    Returns:
        int64 ``[n, k_max]``, each row's genes distinct, rows with fewer genes padded with -1.
    """
    if n <= 0:
        raise ValueError(f"'n' must be a positive integer (got {n})")
    ks = np.asarray(sorted(k)) if isinstance(k, dict) else np.asarray([k])
    kmax = int(ks.max())
    if int(ks.min()) < 0:
        raise ValueError(f"'k' must be >= 0 (got {k})")
    if kmax > num_genes:
        raise ValueError(f"'k' must not exceed num_genes={num_genes} (got {kmax})")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 7919]))
    if isinstance(k, dict):
        probs = np.asarray([k[kk] for kk in sorted(k)], dtype=float)
        per_row = rng.choice(ks, size=n, p=probs / probs.sum())
    else:
        per_row = np.full(n, kmax)
    out = np.full((n, kmax), PAD, dtype=np.int64)
    if kmax == 0:
        return torch.from_numpy(out)
    chunk = max(1, 4_000_000 // num_genes)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        keys = rng.random((stop - start, num_genes))
        idx = np.argpartition(keys, kmax - 1, axis=1)[:, :kmax] if kmax < num_genes else \
            np.argsort(keys, axis=1)
        out[start:stop] = idx[:, :kmax]
    cols = np.arange(kmax)[None, :]
    out[cols >= per_row[:, None]] = PAD
    return torch.from_numpy(out)


def node_keep_mask(pert: torch.Tensor, num_genes: int) -> torch.Tensor:
    """``[B, N]`` bool, False at deleted genes (padding ignored). No host sync."""
    b = pert.shape[0]
    keep = torch.ones(b, num_genes + 1, dtype=torch.bool, device=pert.device)
    idx = torch.where(pert >= 0, pert, torch.full_like(pert, num_genes))
    keep.scatter_(1, idx, False)
    return keep[:, :num_genes]


def synthetic_labels(pert: torch.Tensor) -> torch.Tensor:
    """A deterministic scalar label per perturbation (the workbook times training; it does not
    need real phenotypes, only a loss with the right shape)."""
    return torch.sin((pert.clamp(min=0).float() + 1).sum(-1) * 0.37)
