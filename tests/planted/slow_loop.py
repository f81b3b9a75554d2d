"""Planted: a Python loop over the samples in the model: per sample, the perturbed graph's
degree normalisation recomputed and one graph pass (the deleted genes masked by multiplication,
no host sync)."""
import torch

from planted_common import MyPipeline


class LoopModel(torch.nn.Module):
    def __init__(self, base):
        super().__init__()
        self.base = base

    def forward(self, deleted, edge_index):
        n = self.base.embedding.shape[0]
        outs = []
        for genes in deleted:  # one sample at a time
            alive = torch.ones(n, device=deleted.device).index_fill(0, genes, 0.0)
            with torch.no_grad():  # the perturbed graph's in-degree, per type of neighbour
                w = alive[edge_index[0]] * alive[edge_index[1]]
                deg = torch.zeros(n, device=deleted.device).index_add_(0, edge_index[1], w)
                for _ in range(8):  # smoothed over 8 hops, as the user's model does
                    deg = 0.5 * deg + 0.5 * torch.zeros_like(deg).index_add_(
                        0, edge_index[1], deg[edge_index[0]] * w) / deg.clamp(min=1)
            x = self.base.embedding * alive[:, None]
            x = self.base.conv(x, edge_index).relu() * (alive / deg.clamp(min=1).sqrt())[:, None]
            outs.append(self.base.head(x[genes].mean(dim=0)))
        return torch.cat(outs)


class SlowLoop(MyPipeline):
    def __init__(self, graph, device):
        super().__init__(graph, device)
        self.model = LoopModel(self.model)


def make_pipeline(params, graph, device):
    return SlowLoop(graph, device)
