"""Graph size inventory: bytes of every representation a pipeline may carry (notebook 01).

All sizes are computed from the graph and the sampled perturbations; nothing is assumed.
"""
from __future__ import annotations

import numpy as np
import torch

from ..data.perturbations import node_keep_mask
from ..data.snapshots import CellGraph

INT64 = 8
INT32 = 4
BOOL = 1

REPRESENTATIONS = (
    "perturbation_indices",
    "removed_edge_indices",
    "edge_masks",
    "replicated_edge_index",
)
REPRESENTATION_LABELS = {
    "perturbation_indices": "perturbation indices (int64)",
    "removed_edge_indices": "indices of removed edges (int64)",
    "edge_masks": "boolean edge masks (1 B/edge, all types)",
    "replicated_edge_index": "replicated edge_index (int64, 1 copy/sample)",
}

# The brief's figures, with how each was computed here (the 'basis').
BRIEF_CLAIMS = (
    ("masks per batch (B=28)", 65e6, "mask bytes/sample x 28"),
    ("masks per batch, dual forward (B=28)", 130e6,
     "the wildtype pass needs no mask: same bytes as the single forward"),
    ("mask bytes per sample", 2.5e6, "1 byte per edge, all edge types"),
    ("mask storage for the dataset", 848e9, "mask bytes/sample x num_samples"),
    ("incidence cache", 19e6, "each edge under both endpoints, int64, plus offsets per type"),
)


def edge_type_table(graph: CellGraph) -> list[dict]:
    """Per edge type: nodes touched, edges and ``edge_index`` bytes in int64 and int32."""
    rows = []
    for t in graph.edge_types:
        e = graph.num_edges(t)
        rows.append({"name": t, "nodes": graph.nodes_touched(t), "edges": e,
                     "bytes_int64": 2 * e * INT64, "bytes_int32": 2 * e * INT32})
    return rows


def incidence_cache_bytes(graph: CellGraph) -> int:
    """Gene -> incident edge positions per type: every edge under both endpoints (int64),
    plus ``num_genes + 1`` int64 offsets per type."""
    return sum(2 * graph.num_edges(t) * INT64 + (graph.num_genes + 1) * INT64
               for t in graph.edge_types)


def removed_edge_counts(graph: CellGraph, pert: torch.Tensor, chunk: int = 16) -> np.ndarray:
    """Edges removed per sample (an edge is removed when either endpoint is deleted)."""
    counts = np.zeros(pert.shape[0], dtype=np.int64)
    for start in range(0, pert.shape[0], chunk):
        deleted = ~node_keep_mask(pert[start:start + chunk], graph.num_genes)  # [b, N]
        tot = torch.zeros(deleted.shape[0], dtype=torch.long)
        for ei in graph.edge_index.values():
            tot += (deleted[:, ei[0]] | deleted[:, ei[1]]).sum(1)
        counts[start:start + chunk] = tot.numpy()
    return counts


def symmetric_union_adjacency(graph: CellGraph) -> torch.Tensor:
    """All edge types together, both directions, as a CSR 0/1 matrix ``[N, N]``."""
    n = graph.num_genes
    ei = torch.cat(list(graph.edge_index.values()), dim=1)
    codes = torch.unique(torch.cat([ei[0] * n + ei[1], ei[1] * n + ei[0]]))
    rows, cols = codes // n, codes % n
    crow = torch.zeros(n + 1, dtype=torch.long)
    crow[1:] = torch.bincount(rows, minlength=n).cumsum(0)
    return torch.sparse_csr_tensor(crow, cols, torch.ones(codes.numel()), size=(n, n),
                                   check_invariants=False)


def hop_coverage(graph: CellGraph, pert: torch.Tensor, hops: int = 3,
                 chunk: int = 64) -> np.ndarray:
    """Fraction of genes within 1..``hops`` hops of the deleted genes (undirected, all types).

    Returns ``[num_samples, hops]``. The deleted genes themselves count as within reach.
    """
    if hops <= 0:
        raise ValueError(f"'hops' must be a positive integer (got {hops})")
    adj = symmetric_union_adjacency(graph)
    n = graph.num_genes
    out = np.zeros((pert.shape[0], hops))
    for start in range(0, pert.shape[0], chunk):
        reach = (~node_keep_mask(pert[start:start + chunk], n)).T.float()  # [N, b]
        for h in range(hops):
            reach = ((adj @ reach) + reach > 0).float()
            out[start:start + chunk, h] = (reach.sum(0) / n).numpy()
    return out


def per_sample_bytes(graph: CellGraph, mean_k: float, mean_removed_edges: float) -> dict:
    """Bytes per sample of each representation a pipeline may carry."""
    e = graph.num_edges()
    return {
        "perturbation_indices": mean_k * INT64,
        "removed_edge_indices": mean_removed_edges * INT64,
        "edge_masks": e * BOOL,
        "replicated_edge_index": 2 * e * INT64,
    }


def per_batch_bytes(per_sample: dict, batch_sizes: list[int]) -> dict:
    """``{representation: {"B": bytes}}`` - every representation is linear in B."""
    return {rep: {str(b): v * b for b, v in ((b, per_sample[rep]) for b in batch_sizes)}
            for rep in per_sample}


def dataset_bytes(per_sample: dict, num_samples: int) -> dict:
    return {rep: v * num_samples for rep, v in per_sample.items()}


def claims_table(mask_bytes_per_sample: float, incidence_bytes: float,
                 num_samples: int) -> list[dict]:
    """The brief's claimed sizes next to the values computed here and the ratio."""
    computed = {
        "masks per batch (B=28)": mask_bytes_per_sample * 28,
        "masks per batch, dual forward (B=28)": mask_bytes_per_sample * 28,
        "mask bytes per sample": mask_bytes_per_sample,
        "mask storage for the dataset": mask_bytes_per_sample * num_samples,
        "incidence cache": incidence_bytes,
    }
    return [{"claim": name, "claimed_bytes": claimed, "computed_bytes": computed[name],
             "ratio_computed_over_claimed": computed[name] / claimed, "basis": basis}
            for name, claimed, basis in BRIEF_CLAIMS]


def human_bytes(n: float) -> str:
    """1234567 -> '1.23 MB' (decimal units, as the brief uses)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} TB"
