"""The fast side of `slow_objects.py` (written in the same user trial): the same model and task,
the perturbed graphs built with tensor operations only."""
import torch
from torch.utils.data import TensorDataset

from workbook_lib.pipelines import Pipeline


class GeneModel(torch.nn.Module):
    def __init__(self, num_genes, hidden):
        super().__init__()
        from torch_geometric.nn import SAGEConv
        self.num_genes = num_genes
        self.embedding = torch.nn.Parameter(torch.randn(num_genes, hidden) * 0.1)
        self.conv1 = SAGEConv(hidden, hidden)
        self.conv2 = SAGEConv(hidden, hidden)
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, edge_index, num_samples):
        from torch_geometric.nn import global_mean_pool
        x = self.embedding.repeat(num_samples, 1)
        x = self.conv1(x, edge_index).relu()
        x = self.conv2(x, edge_index).relu()
        batch = torch.arange(num_samples, device=x.device).repeat_interleave(self.num_genes)
        return self.head(global_mean_pool(x, batch, size=num_samples)).squeeze(-1)


class FastPipeline(Pipeline):
    exact = True

    def __init__(self, graph, device, batch_size, hidden):
        self.device, self.batch_size = torch.device(device), batch_size
        self.num_genes = graph.num_genes
        self.edge_index = torch.cat([graph.edge_index[t] for t in sorted(graph.edge_index)], dim=1)
        self.model = GeneModel(graph.num_genes, hidden).to(self.device)
        g = torch.Generator().manual_seed(0)
        self.deleted = torch.randint(0, graph.num_genes, (1024, 3), generator=g)
        self.y = torch.randn(1024, generator=g)

    def dataset(self):
        return TensorDataset(self.deleted, self.y)

    def collate(self, items):
        deleted = torch.stack([d for d, _ in items])          # [B, k]
        y = torch.stack([t for _, t in items])
        B, N, E = deleted.shape[0], self.num_genes, self.edge_index.shape[1]
        gone = torch.zeros(B, N, dtype=torch.bool)
        gone.scatter_(1, deleted, True)
        src, dst = self.edge_index
        keep = ~(gone[:, src] | gone[:, dst])                  # [B, E]
        offset = (torch.arange(B) * N).unsqueeze(1)
        s = (src.unsqueeze(0) + offset)[keep]
        d = (dst.unsqueeze(0) + offset)[keep]
        return {"edge_index": torch.stack([s, d]), "y": y}

    def forward(self, model, batch):
        return model(batch["edge_index"], batch["y"].shape[0])

    def loss(self, output, batch):
        return torch.nn.functional.mse_loss(output, batch["y"])


def make_pipeline(params, graph, device):
    return FastPipeline(graph, device, batch_size=params["batch_size_lazy"], hidden=params["hidden"])
