"""Graph size inventory: bytes of every representation a pipeline may carry (notebook 01).

All sizes are computed from the graph and the sampled perturbations; nothing is assumed.
"""
from __future__ import annotations

import numpy as np
import torch


from ..configs.validation import Params
from ..measurement.timing import Stat
from ..results.inventory import (REPRESENTATION_LABELS, EdgeTypeRow, FootprintRow,  # noqa: F401
                                 InventoryResult, RealSize)
from ..data.perturbations import node_keep_mask, sample_perturbations
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


def footprint(graph: CellGraph, pert: torch.Tensor, layers: int,
              chunk: int = 64) -> list[FootprintRow]:
    """Per layer and edge type, the genes whose aggregation changes and the messages that change
    after the deletions (``R_l``: genes whose layer-``l`` output differs from the wildtype's, grown
    from the type-``t`` out-neighbours of ``R_(l-1)``). The edges leaving ``R_1`` are the delta
    layer's per-sample work (:mod:`workbook_lib.nodemask.delta`); those leaving ``R_0``, the
    incremental first layer's.
    """
    if layers <= 0:
        raise ValueError(f"'layers' must be a positive integer (got {layers})")
    n = graph.num_genes
    mats, outdeg, counts = {}, {}, {}
    for t, ei in graph.edge_index.items():
        e = ei.shape[1]
        counts[t] = e
        mats[t] = torch.sparse_coo_tensor(torch.stack([ei[1], ei[0]]), torch.ones(e), (n, n),
                                          check_invariants=False).coalesce().to_sparse_csr()
        outdeg[t] = torch.bincount(ei[0], minlength=n).float()
    total = sum(counts.values())
    genes = {(l, t): [] for l in range(1, layers + 1) for t in [*graph.edge_types, "all"]}
    edges = {k: [] for k in genes}
    for start in range(0, pert.shape[0], chunk):
        deleted = (~node_keep_mask(pert[start:start + chunk], n)).T.float()  # [N, b]
        prev = deleted
        for layer in range(1, layers + 1):
            changed_any = prev.clone()
            all_edges = torch.zeros(prev.shape[1])
            for t in graph.edge_types:
                ch = (((mats[t] @ prev) + deleted) > 0).float()
                changed_any = torch.maximum(changed_any, ch)
                leaving = outdeg[t] @ prev
                all_edges += leaving
                genes[(layer, t)] += (ch.sum(0) / n).tolist()
                edges[(layer, t)] += (leaving / max(counts[t], 1)).tolist()
            genes[(layer, "all")] += (changed_any.sum(0) / n).tolist()
            edges[(layer, "all")] += (all_edges / max(total, 1)).tolist()
            prev = changed_any
    return [FootprintRow(l, t, Stat.from_samples(genes[(l, t)], unit="fraction"),
                         Stat.from_samples(edges[(l, t)], unit="fraction"))
            for (l, t) in genes]


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
    """``{representation: {B: bytes}}`` - every representation is linear in B."""
    return {rep: {b: per_sample[rep] * b for b in batch_sizes} for rep in per_sample}


def dataset_bytes(per_sample: dict, num_samples: int) -> dict:
    return {rep: v * num_samples for rep, v in per_sample.items()}


def real_size(spec: dict | None, num_genes: int, num_types: int,
              num_samples: int) -> RealSize | None:
    """Byte counts at the spec's real edge count (None for a user's graph: no spec)."""
    if not spec:
        return None
    e = sum(int(t["edges"]) for t in spec["edge_types"].values())
    offsets = num_types * (num_genes + 1)
    return RealSize(total_edges=e, mask_bytes_per_sample=e * BOOL,
                    mask_bytes_per_batch_28=28 * e * BOOL, dataset_mask_bytes=e * num_samples,
                    incidence_cache_bytes_int64=(2 * e + offsets) * INT64,
                    incidence_cache_bytes_int32=(2 * e + offsets) * INT32,
                    num_samples=num_samples)


def inventory(params: Params, graph: CellGraph) -> InventoryResult:
    """Every size notebook 01 reports, computed from the graph and sampled perturbations."""
    from ..configs.validation import mean_k
    from ..strategies.replicated_mask_cpu import measured_replicated_bytes

    pert = sample_perturbations(graph.num_genes, params.perturbation_k,
                                params.num_perturbations, seed=params.seed)
    removed = removed_edge_counts(graph, pert)
    hops = hop_coverage(graph, pert, hops=3)
    per_sample = per_sample_bytes(graph, mean_k(params.perturbation_k), float(removed.mean()))
    per_batch = {rep: {b: v for b, v in by.items()}
                 for rep, by in per_batch_bytes(per_sample, params.batch_sizes).items()}
    measured_masks, measured_inc = measured_replicated_bytes(graph, pert)
    return InventoryResult(
        graph_name=graph.name, source=graph.source, scale=graph.scale,
        num_genes=graph.num_genes, total_edges=graph.num_edges(),
        edge_types=[EdgeTypeRow(**r) for r in edge_type_table(graph)],
        perturbation_k=params.perturbation_k, num_perturbations=len(pert),
        removed_edge_fraction=Stat.from_samples((removed / graph.num_edges()).tolist(),
                                                unit="fraction"),
        hop_coverage={h + 1: Stat.from_samples(hops[:, h].tolist(), unit="fraction")
                      for h in range(hops.shape[1])},
        bytes_per_sample=per_sample, bytes_per_batch=per_batch,
        dataset_bytes=dataset_bytes(per_sample, params.num_samples),
        incidence_cache_bytes=incidence_cache_bytes(graph),
        measured_batch_mask_bytes_per_sample=measured_masks,
        measured_incidence_cache_bytes=measured_inc,
        real_size=real_size(graph.spec, graph.num_genes, len(graph.edge_types),
                            params.num_samples),
        ignored_types=list(graph.ignored),
        footprint=footprint(graph, pert, params.layers),
        builtin=bool(params.strategies))
