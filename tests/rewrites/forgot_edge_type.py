"""A user's rewrite of ``examples/lazy_pyg.py`` with ``workbook_lib.nodemask`` that forgets one
edge type's deletions: its layers aggregate every edge type through the shared graph, except the
one with the most edges, aggregated by hand (an ``index_add`` over its edges) without the deleted genes' masks.
``python -m workbook_lib equal`` must catch it.

``make_correct`` is the same hand-written path with the masks applied (the control: it equals
example 1, so what ``make_pipeline`` gets wrong is the forgotten deletion alone).
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from nodemask_pyg import NodeMaskLazy, NodeMaskPipeline  # noqa: E402
from perturbation_data import deletions_per_sample, make_samples  # noqa: E402
from workbook_lib.nodemask import SharedGraph  # noqa: E402


class OneTypeByHand(NodeMaskLazy):
    """Example 3's parameters (the same names); every layer per sample, one edge type's
    aggregation written by hand."""

    def __init__(self, *args, hand_type: int, hand_edges: torch.Tensor, apply_deletion: bool):
        super().__init__(*args)
        self.hand_type = hand_type
        self.hand_edges = hand_edges  # [2, E] of that edge type (not a parameter)
        self.apply_deletion = apply_deletion

    def forward(self, deleted, graph: SharedGraph):
        nb = graph.batch(deleted)
        b, t0 = deleted.shape[0], self.hand_type
        h = self.embedding.expand(b, -1, -1)
        wt = self.embedding
        keep = nb.keep.unsqueeze(-1).to(h.dtype)  # [B, N, 1]: 0 on each sample's deleted genes
        src, dst = self.hand_edges.to(h.device)
        for i, lin in enumerate(self.lins):
            agg = nb.aggregate(h)  # [B, N, T, H], every type with the deletions
            x = h * keep if self.apply_deletion else h  # the bug: the deleted genes still send
            hand = torch.zeros_like(h).index_add(1, dst, x[:, src])
            if self.apply_deletion:
                hand = hand * keep  # ... and still receive
            agg = torch.cat([agg[:, :, :t0], hand.unsqueeze(2), agg[:, :, t0 + 1:]], dim=2)
            h = lin((h.unsqueeze(2) + agg).reshape(b, h.shape[1], -1))
            if i < len(self.lins) - 1:
                h = h.relu()
            wt = self.wildtype_layer(graph, wt, i)
        return self.head(h.mean(dim=1) - wt.mean(dim=0)).squeeze(-1)


def _make(params, graph, device, apply_deletion):
    data = graph.to_hetero_data()
    torch.manual_seed(params["seed"])
    # the hand-written type: the one with the most edges
    t0 = max(range(len(data.edge_types)), key=lambda i: data[data.edge_types[i]].num_edges)
    model = OneTypeByHand(graph.num_genes, data.edge_types, params["hidden"], params["layers"],
                          hand_type=t0, hand_edges=data[data.edge_types[t0]].edge_index,
                          apply_deletion=apply_deletion)
    shared = SharedGraph(data, aggr="sum", device=device)
    b = params["batch_size_lazy"]
    deleted, y = make_samples(graph.num_genes, 32 * b, deletions_per_sample(params), params["seed"])
    return NodeMaskPipeline(shared, model, deleted, y, b, device)


def make_pipeline(params, graph, device):
    """The rewrite with the largest edge type's deletions forgotten."""
    return _make(params, graph, device, apply_deletion=False)


def make_correct(params, graph, device):
    """The same rewrite with the deletions applied (equals example 1)."""
    return _make(params, graph, device, apply_deletion=True)
