"""Planted: heavy work in the collate (per-sample adjacency lists without the deleted
genes, turned into each gene's degree)."""
import torch
from torch.utils.data import default_collate

from planted_common import MyPipeline


class SlowCollate(MyPipeline):
    def __init__(self, graph, device):
        super().__init__(graph, device)
        self.pairs = self.edge_index.cpu().t().tolist()

    def collate(self, items):
        batch = default_collate(items)
        degrees = []
        for deleted in batch[0].tolist():  # each sample's perturbed graph as adjacency lists
            gone = set(deleted)
            adj = {}
            for s, d in self.pairs:
                if s not in gone and d not in gone:
                    adj.setdefault(s, []).append(d)
            degrees.append(torch.tensor([len(adj.get(g, ())) for g in range(self.num_genes)]))
        return batch[0], batch[1], torch.stack(degrees)  # each gene's degree, per sample


def make_pipeline(params, graph, device):
    return SlowCollate(graph, device)
