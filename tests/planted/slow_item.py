"""Planted: heavy per-sample work in the dataset item (a hop-distance feature by a Python BFS)."""
from collections import deque

import torch
from torch.utils.data import Dataset

from planted_common import MyPipeline


class HopDataset(Dataset):
    """Each sample with every gene's hop distance from its deleted genes (computed per item)."""

    def __init__(self, deleted, y, edge_index, num_genes):
        self.deleted, self.y, self.n = deleted, y, num_genes
        self.neighbours = [[] for _ in range(num_genes)]
        for s, d in edge_index.t().tolist():
            self.neighbours[s].append(d)

    def __len__(self):
        return len(self.y)

    def _hops(self, sources):
        dist = [-1] * self.n
        queue = deque(sources)
        for g in queue:
            dist[g] = 0
        while queue:
            g = queue.popleft()
            for h in self.neighbours[g]:
                if dist[h] < 0:
                    dist[h] = dist[g] + 1
                    queue.append(h)
        for _ in range(3):  # the feature normalised three ways, as the user's notebook did
            hops = torch.tensor(dist, dtype=torch.float32)
            hops = (hops - hops.mean()) / (hops.std() + 1e-6)
        return hops

    def __getitem__(self, i):
        return self.deleted[i], self.y[i], self._hops(self.deleted[i].tolist())


class SlowItem(MyPipeline):
    def dataset(self):
        return HopDataset(self.deleted, self.y, self.edge_index.cpu(), self.num_genes)


def make_pipeline(params, graph, device):
    return SlowItem(graph, device)
