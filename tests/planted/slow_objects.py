"""Planted (written in a user trial from the README alone): each dataset item builds the
perturbed graph as a dict of Python neighbour lists from a Python copy of the edge list kept by
the pipeline, and the collate turns them into an edge_index pair by pair. Against
`objects_fast.py`, the same model with a tensor-only collate."""
import torch
from torch.utils.data import Dataset
from torch_geometric.nn import SAGEConv, global_mean_pool

from workbook_lib.pipelines import Pipeline


class GeneModel(torch.nn.Module):
    def __init__(self, num_genes, hidden):
        super().__init__()
        self.num_genes = num_genes
        self.embedding = torch.nn.Parameter(torch.randn(num_genes, hidden) * 0.1)
        self.conv1 = SAGEConv(hidden, hidden)
        self.conv2 = SAGEConv(hidden, hidden)
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, edge_index, num_samples):
        x = self.embedding.repeat(num_samples, 1)          # B copies of the genes
        x = self.conv1(x, edge_index).relu()
        x = self.conv2(x, edge_index).relu()
        batch = torch.arange(num_samples, device=x.device).repeat_interleave(self.num_genes)
        return self.head(global_mean_pool(x, batch, size=num_samples)).squeeze(-1)


class PerturbationDataset(Dataset):
    def __init__(self, pipeline):
        self.p = pipeline

    def __len__(self):
        return len(self.p.y)

    def __getitem__(self, i):
        deleted = set(self.p.deleted[i].tolist())
        # neighbour lists of the perturbed graph: target -> [sources], deleted genes cut off
        neighbours = {}
        for src, dst in self.p.edge_list:
            if src in deleted or dst in deleted:
                continue
            neighbours.setdefault(dst, []).append(src)
        return {"deleted": sorted(deleted), "neighbours": neighbours, "y": float(self.p.y[i])}


class SlowPipeline(Pipeline):
    exact = True

    def __init__(self, graph, device, batch_size, hidden):
        self.device, self.batch_size = torch.device(device), batch_size
        self.num_genes = graph.num_genes
        ei = torch.cat([graph.edge_index[t] for t in sorted(graph.edge_index)], dim=1)
        # long-lived Python copy of the graph, made once
        self.edge_list = ei.t().tolist()
        self.model = GeneModel(graph.num_genes, hidden).to(self.device)
        g = torch.Generator().manual_seed(0)
        self.deleted = torch.randint(0, graph.num_genes, (1024, 3), generator=g)
        self.y = torch.randn(1024, generator=g)

    def dataset(self):
        return PerturbationDataset(self)

    def collate(self, items):
        pairs = []
        for b, item in enumerate(items):
            offset = b * self.num_genes
            for dst, srcs in item["neighbours"].items():
                for src in srcs:
                    pairs.append([src + offset, dst + offset])
        edge_index = torch.tensor(pairs, dtype=torch.long).t().contiguous()
        y = torch.tensor([item["y"] for item in items])
        return {"edge_index": edge_index, "y": y}

    def forward(self, model, batch):
        return model(batch["edge_index"], batch["y"].shape[0])

    def loss(self, output, batch):
        return torch.nn.functional.mse_loss(output, batch["y"])


def make_pipeline(params, graph, device):
    return SlowPipeline(graph, device, batch_size=params["batch_size_lazy"], hidden=params["hidden"])
