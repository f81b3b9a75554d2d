"""Example 2: the DANGO-style baseline, written the way a PyG user writes it.

Message passing runs once per step on the unperturbed (wildtype) gene graph: a ``HeteroConv`` of
``SAGEConv`` per edge type per layer. The embeddings of each sample's deleted genes then go
through a small attention head. A batch carries only the deleted genes' indices and the labels.
It does not compute the perturbed graph (``exact = False``): it is the floor an exact model is
measured against.

    python -m workbook_lib run --set 'pipelines=["examples/lazy_pyg.py:make_pipeline",
                                                 "examples/dango_pyg.py:make_pipeline"]'
"""
import torch
from torch import nn
from torch.utils.data import TensorDataset, default_collate
from torch_geometric.nn import HeteroConv, SAGEConv

from perturbation_data import deletions_per_sample, make_samples
from workbook_lib.pipelines import Pipeline


class Dango(nn.Module):
    def __init__(self, num_genes: int, edge_types: list, hidden: int, layers: int):
        super().__init__()
        self.embedding = nn.Parameter(torch.randn(num_genes, hidden) * 0.1)
        self.convs = nn.ModuleList(
            HeteroConv({et: SAGEConv(hidden, hidden) for et in edge_types}, aggr="sum")
            for _ in range(layers))
        self.query = nn.Parameter(torch.randn(hidden) * 0.1)
        self.head = nn.Linear(hidden, 1)

    def forward(self, deleted, edge_index_dict):
        x = self.embedding
        for i, conv in enumerate(self.convs):  # one pass over the wildtype graph per step
            x = conv({"gene": x}, edge_index_dict)["gene"]
            if i < len(self.convs) - 1:
                x = x.relu()
        genes = x[deleted]  # [B, k, H]
        attn = torch.softmax(genes @ self.query, dim=-1)
        return self.head((attn.unsqueeze(-1) * genes).sum(dim=1)).squeeze(-1)


class DangoPipeline(Pipeline):
    title = "the DANGO-style model (PyG, one wildtype pass)"
    exact = False

    def __init__(self, edge_index_dict, model, deleted, y, batch_size, device):
        self.device = torch.device(device)
        self.model, self.batch_size = model.to(self.device), batch_size
        self.deleted, self.y = deleted, y
        self.edge_index_dict = {et: ei.to(self.device) for et, ei in edge_index_dict.items()}

    def dataset(self):
        return TensorDataset(self.deleted, self.y)

    def collate(self, items):
        return default_collate(items)

    def forward(self, model, inputs):
        deleted, _y = inputs
        return model(deleted, self.edge_index_dict)

    def loss(self, output, batch):
        return torch.nn.functional.mse_loss(output, batch[1])

    def shared_forward(self, model):
        return None  # the wildtype pass is the whole forward


def make_pipeline(params, graph, device):
    data = graph.to_hetero_data()
    torch.manual_seed(params["seed"])
    model = Dango(graph.num_genes, data.edge_types, params["hidden"], params["layers"])
    b = params["batch_size_dango"]
    deleted, y = make_samples(graph.num_genes, 32 * b, deletions_per_sample(params), params["seed"])
    return DangoPipeline(data.edge_index_dict, model, deleted, y, b, device)
