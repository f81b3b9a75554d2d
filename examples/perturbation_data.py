"""The samples the three examples train on, as a researcher's own data would be: which genes each
sample deletes, and a label that depends on them (a fixed per-gene effect plus noise, so the model
can learn it)."""
import torch


def make_samples(num_genes: int, num_samples: int, k: int = 3, seed: int = 0):
    """``(deleted [num_samples, k] gene indices, y [num_samples] labels)``, deterministic in seed."""
    g = torch.Generator().manual_seed(seed)
    deleted = torch.stack([torch.randperm(num_genes, generator=g)[:k] for _ in range(num_samples)])
    effect = torch.randn(num_genes, generator=g)
    y = effect[deleted].sum(dim=1) + 0.1 * torch.randn(num_samples, generator=g)
    return deleted, y


def deletions_per_sample(params: dict) -> int:
    """k from the workbook's params (an int, or the largest k of a distribution)."""
    k = params["perturbation_k"]
    return k if isinstance(k, int) else max(k)
