"""The gene graph's host-side edge lists (:class:`OutEdges`) and the push plan a batch builds from
them (:class:`PushPlan`): small CPU tensors and Python ints, so that DataLoader workers can build a
batch's corrections and no kernel needs a device-to-host read."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .kernels import transpose


@dataclass
class OutEdges:
    """Host copy of the graph's edges, small and picklable (for DataLoader workers), built by
    :func:`out_edges_of`: ``slot[ptr[s]:ptr[s+1]]`` are the slots ``n*T + t`` gene ``s`` sends
    to; ``sends[t, s]`` (``[T, N]`` int32) is 1 when ``s`` has an out-edge of type ``t``;
    ``in_slot[in_ptr[s]:in_ptr[s+1]]`` are the places ``t*N + j`` of ``s``'s in-edges in the
    pooled layer's ``[T, N]`` weights."""

    ptr: torch.Tensor
    slot: torch.Tensor
    num_nodes: int
    num_types: int
    sends: torch.Tensor | None = None
    in_ptr: torch.Tensor | None = None
    in_slot: torch.Tensor | None = None


def out_edges_of(a: torch.Tensor, num_nodes: int, num_types: int) -> OutEdges:
    """The host lists of :class:`OutEdges` from the stacked in-edge matrix ``a`` ``[N*T, N]``
    (row ``n*T + t``: gene ``n``'s in-edges of type ``t``)."""
    a = a.cpu()
    crow, col = a.crow_indices().long(), a.col_indices().long()
    n, t = num_nodes, num_types
    at = transpose(a)
    ptr, slot = at.crow_indices().long(), at.col_indices().long()
    src = torch.repeat_interleave(torch.arange(n), ptr[1:] - ptr[:-1])
    sends = torch.zeros(t, n, dtype=torch.int32)
    sends[slot % t, src] = 1
    row_type = torch.repeat_interleave(torch.arange(n * t) % t, crow[1:] - crow[:-1])
    return OutEdges(ptr, slot, n, t, sends=sends, in_ptr=crow[::t].contiguous(),
                    in_slot=row_type * n + col)


def edge_index_dict(graph) -> tuple[dict[str, torch.Tensor], int | None]:
    """``({type: [2, E] edge_index}, num_nodes or None)`` from a one-node-type ``HeteroData``,
    a dict of edge indices, or an object with ``edge_index`` and ``num_genes`` (``CellGraph``)."""
    if isinstance(graph, dict):
        return dict(graph), None
    if hasattr(graph, "edge_index") and hasattr(graph, "num_genes"):
        return dict(graph.edge_index), int(graph.num_genes)
    if hasattr(graph, "edge_types") and hasattr(graph, "node_types"):
        types = list(graph.edge_types)
        nodes = {s for s, _, d in types} | {d for s, _, d in types}
        if len(nodes) != 1:
            raise ValueError(f"the HeteroData must have edges between one node type only "
                             f"(got {sorted(nodes)}); pass a dict of the gene-gene edge indices")
        node = nodes.pop()
        return ({rel: graph[(s, rel, d)].edge_index for s, rel, d in types},
                int(graph[node].num_nodes))
    raise TypeError(f"'graph' must be a HeteroData, a dict of edge_index tensors or a CellGraph "
                    f"(got {type(graph).__name__})")


class PushPlan:
    """Where a batch's pushes go, built on the host from the correction rows, with per-sample
    row ranges and out-edge counts as Python ints (no kernel reads the device back).

    Args:
        pair_sample, pair_gene: the rows ``R_b`` (sorted by sample), as in ``Corrections``.
        ptr, slot: the graph's out-edge lists (``OutEdges``).
        batch_size: B.
    """

    def __init__(self, pair_sample: torch.Tensor, pair_gene: torch.Tensor, ptr: torch.Tensor,
                 slot: torch.Tensor, batch_size: int):
        ps, pg = pair_sample.cpu(), pair_gene.cpu()
        counts = torch.bincount(ps, minlength=batch_size)
        self.pair_ptr = torch.zeros(batch_size + 1, dtype=torch.long)
        self.pair_ptr[1:] = torch.cumsum(counts, 0)
        deg = (ptr[pg + 1] - ptr[pg]) if pg.numel() else torch.zeros(0, dtype=torch.long)
        per_sample = torch.zeros(batch_size, dtype=torch.long).index_add_(0, ps, deg)
        self.ranges = self.pair_ptr.tolist()
        self.entries = per_sample.tolist()  # out-edges leaving R_b, per sample
        self.pair_out = deg  # [P] out-degree of each row's gene

    @classmethod
    def from_counts(cls, pair_ptr: torch.Tensor, entries: torch.Tensor,
                    pair_out: torch.Tensor) -> "PushPlan":
        """The plan from counts made elsewhere (CPU tensors): ``pair_ptr`` ``[B + 1]`` row offsets,
        ``entries`` ``[B]`` out-edges per sample, ``pair_out`` ``[P]`` each row's out-degree."""
        plan = cls.__new__(cls)
        plan.pair_ptr, plan.pair_out = pair_ptr, pair_out
        plan.ranges, plan.entries = pair_ptr.tolist(), entries.tolist()
        return plan

    @property
    def total_entries(self) -> int:
        return int(sum(self.entries))
