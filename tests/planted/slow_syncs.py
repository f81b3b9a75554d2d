"""Planted: host syncs in the forward: per sample and edge type, the deleted genes' edges found
with ``.item()`` and ``nonzero``, the perturbed graph taken with a boolean mask."""
import torch

from planted_common import MyPipeline


class SyncModel(torch.nn.Module):
    def __init__(self, base, edge_index_by_type):
        super().__init__()
        self.base, self.types = base, edge_index_by_type

    def forward(self, deleted, edge_index):
        outs = []
        for genes in deleted:  # one sample at a time
            kept = []
            for ei in self.types:  # each edge type, its deleted genes' edges removed
                keep = torch.ones(ei.shape[1], dtype=torch.bool, device=ei.device)
                for g in genes:
                    gene = g.item()
                    touching = ((ei[0] == gene) | (ei[1] == gene)).nonzero()
                    if touching.numel() > 0:
                        keep[touching.squeeze(1)] = False
                kept.append(ei[:, keep])
            x = self.base.conv(self.base.embedding, torch.cat(kept, dim=1)).relu()
            outs.append(self.base.head(x[genes].mean(dim=0)))
        return torch.cat(outs)


class SlowSyncs(MyPipeline):
    def __init__(self, graph, device):
        super().__init__(graph, device)
        data = graph.to_hetero_data()
        types = [data[et].edge_index.to(self.device) for et in data.edge_types]
        self.model = SyncModel(self.model, types)


def make_pipeline(params, graph, device):
    return SlowSyncs(graph, device)
