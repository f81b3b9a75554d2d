"""Planted: DataLoader workers that cannot keep up (run with num_workers: 1): each item computes
every gene's hop distance from each deleted gene separately and from all of them together, work
several times the model's whole step, which the one worker cannot hide behind the model."""
import torch

from slow_item import HopDataset, SlowItem


class PerGeneHopDataset(HopDataset):
    def __getitem__(self, i):
        deleted, y, together = super().__getitem__(i)
        per_gene = [self._hops([g]) for g in deleted.tolist()]
        return deleted, y, torch.stack([together, *per_gene]).mean(dim=0)


class SlowWorkers(SlowItem):
    def dataset(self):
        return PerGeneHopDataset(self.deleted, self.y, self.edge_index.cpu(), self.num_genes)


def make_pipeline(params, graph, device):
    return SlowWorkers(graph, device)
