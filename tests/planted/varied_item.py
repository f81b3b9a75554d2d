"""Not slow for one reason but varied: each dataset item searches the graph from its deleted
genes to a depth that depends on the sample (1 to 4 hops), so batches cost from a fraction of
the model's step to several times it. The precision tests time it against the fast pipeline:
its steps spread widely, and its median is still known once enough of them are timed."""
from collections import deque

import torch

from planted_common import MyPipeline
from slow_item import HopDataset


class VariedDataset(HopDataset):
    def _hops(self, sources, depth):
        seen = {g: 0 for g in sources}
        queue = deque(sources)
        while queue:
            g = queue.popleft()
            if seen[g] >= depth:
                continue
            for h in self.neighbours[g]:
                if h not in seen:
                    seen[h] = seen[g] + 1
                    queue.append(h)
        return torch.tensor(len(seen), dtype=torch.float32)

    def __getitem__(self, i):
        genes = self.deleted[i].tolist()
        return self.deleted[i], self.y[i], self._hops(genes, 1 + sum(genes) % 4)


class VariedItem(MyPipeline):
    def dataset(self):
        return VariedDataset(self.deleted, self.y, self.edge_index.cpu(), self.num_genes)

    def collate(self, items):
        deleted, y, reach = zip(*items)
        return torch.stack(deleted), torch.stack(y), torch.stack(reach)


def make_pipeline(params, graph, device):
    return VariedItem(graph, device)
