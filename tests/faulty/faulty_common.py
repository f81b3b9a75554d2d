"""What every faulty pipeline shares: the README example's model and pipeline, unchanged but for
the batch size (8)."""
import torch
from torch.utils.data import TensorDataset, default_collate
from torch_geometric.nn import SAGEConv

from workbook_lib.pipelines import Pipeline

BATCH = 8


class GeneModel(torch.nn.Module):
    def __init__(self, num_genes, hidden):
        super().__init__()
        self.embedding = torch.nn.Parameter(torch.randn(num_genes, hidden) * 0.1)
        self.conv = SAGEConv(hidden, hidden)
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, deleted, edge_index):
        x = self.conv(self.embedding, edge_index).relu()
        return self.head(x[deleted].mean(dim=1)).squeeze(-1)


class MyPipeline(Pipeline):
    def __init__(self, graph, device, batch_size=BATCH):
        self.device, self.batch_size = torch.device(device), batch_size
        data = graph.to_hetero_data()  # the snapshot as a PyG HeteroData
        self.edge_index = torch.cat([data[et].edge_index for et in data.edge_types], dim=1)
        self.edge_index = self.edge_index.to(self.device)
        self.num_genes = graph.num_genes
        self.model = GeneModel(graph.num_genes, hidden=32).to(self.device)
        g = torch.Generator().manual_seed(0)
        self.deleted = torch.randint(0, graph.num_genes, (512, 3), generator=g)
        self.y = torch.randn(512, generator=g)

    def dataset(self):
        return TensorDataset(self.deleted, self.y)

    def collate(self, items):
        return default_collate(items)

    def forward(self, model, batch):
        deleted, _y = batch[0], batch[1]
        return model(deleted, self.edge_index)

    def loss(self, output, batch):
        return torch.nn.functional.mse_loss(output, batch[1])
