"""Strategy 1: per-sample subgraph in CPU workers (PyG ``subgraph``), then batched.

PyG is imported when the strategy is built (in the parent, before any DataLoader worker
starts), not when this module is: its import is slow, and every process that imports the
strategies would pay it.
"""
from __future__ import annotations

from ..data.perturbations import node_keep_mask
from ..strategies.base import ReplicatedAggregateMixin, Strategy, offset_concat


class SubgraphCPU(ReplicatedAggregateMixin, Strategy):
    name = "subgraph_cpu"
    label = "1 per-sample subgraph (CPU workers)"
    title = "per-sample subgraphs"
    number = 1

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from torch_geometric.utils import subgraph

        self._subgraph = subgraph

    def make_item(self, index, pert_row):
        keep = node_keep_mask(pert_row.unsqueeze(0), self.n)[0]
        edges = {t: self._subgraph(keep, ei, relabel_nodes=False, num_nodes=self.n)[0]
                 for t, ei in self.graph.edge_index.items()}
        return {"index": index, "pert": pert_row, "edges": edges}

    def collate(self, items):
        batch = super().collate(items)
        batch["edge_index"] = {t: offset_concat([it["edges"][t] for it in items], self.n)
                               for t in self.graph.edge_types}
        return batch

    def device_prepare(self, batch):
        ctx = super().device_prepare(batch)
        # per-sample blocks are each sorted by dst and offset by b*N: globally sorted
        ctx["edges"] = {t: (ei[0], ei[1], None) for t, ei in batch["edge_index"].items()}
        return ctx

    def aggregate(self, h, edge_type, ctx):
        return self._replicated_aggregate(h, edge_type, ctx)
