"""The plain reference every exact strategy is tested against: per sample, PyG ``subgraph``
removes the edges of the deleted genes, and PyG's ``GINConv`` (identity MLP) aggregates."""
from __future__ import annotations

import torch
from torch_geometric.nn import GINConv
from torch_geometric.utils import subgraph

from ..strategies.model import PerturbGIN
from ..data.perturbations import node_keep_mask
from ..data.snapshots import CellGraph


def reference_node_outputs(model: PerturbGIN, graph: CellGraph, pert: torch.Tensor,
                           aggr: str = "sum") -> torch.Tensor:
    """Perturbed-graph node embeddings ``[B, N, H]``, one sample at a time."""
    conv = GINConv(torch.nn.Identity(), eps=model.eps, train_eps=False,
                   aggr="add" if aggr == "sum" else "mean")
    outs = []
    for row in pert:
        keep = node_keep_mask(row.unsqueeze(0), graph.num_genes)[0]
        edges = {t: subgraph(keep, ei, relabel_nodes=False, num_nodes=graph.num_genes)[0]
                 for t, ei in graph.edge_index.items()}
        h = model.embedding
        for layer in range(model.num_layers):
            x = torch.cat([conv(h, edges[t]) for t in model.edge_types], dim=-1)
            h = model.lins[layer](x)
            if layer < model.num_layers - 1:
                h = torch.relu(h)
        outs.append(h)
    return torch.stack(outs)


def reference_wildtype(model: PerturbGIN, graph: CellGraph, aggr: str = "sum") -> torch.Tensor:
    """Wildtype node embeddings ``[N, H]`` (no deletion)."""
    empty = torch.full((1, 0), -1, dtype=torch.long)
    return reference_node_outputs(model, graph, empty, aggr)[0]


def reference_predict(model, graph, pert, aggr="sum", dual=False) -> torch.Tensor:
    nodes = reference_node_outputs(model, graph, pert, aggr)
    wt = reference_wildtype(model, graph, aggr) if dual else None
    return model.readout(nodes, wt)
