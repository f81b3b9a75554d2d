"""Example 4: a TorchCell-shaped model, written the way a PyG user writes it.

Per edge type a ``GINConv`` whose two-layer MLP follows the sum, with a trainable eps; the types
summed, then ``LayerNorm`` and ReLU, per layer; attention pooling over each sample's kept genes.
Every sample is the whole gene graph with a boolean mask per edge type (False on every edge
touching a deleted gene) and the deleted genes' input rows zeroed; the collate puts the B samples'
graphs in one ``Batch`` (B masked copies). ``examples/torchcell_converted.py`` is the same model
through ``workbook_lib.nodemask.convert``.

    python -m workbook_lib run --set 'pipelines=["examples/torchcell_pyg.py:make_pipeline"]'
"""
import torch
from torch import nn
from torch_geometric.data import Batch, HeteroData
from torch_geometric.nn import GINConv
from torch_geometric.nn.aggr import AttentionalAggregation

from perturbation_data import deletions_per_sample, make_samples
from workbook_lib.pipelines import Pipeline


class TorchCellEncoder(nn.Module):
    """``encoder(x, edge_index_dict) -> [N, H]``: per layer, per edge type a GIN (two-layer MLP,
    trainable eps), the types summed, LayerNorm, ReLU."""

    def __init__(self, edge_types: list, hidden: int, layers: int):
        super().__init__()
        self.convs = nn.ModuleList(
            nn.ModuleDict({"__".join(et): GINConv(nn.Sequential(
                nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden)), train_eps=True)
                for et in edge_types})
            for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))

    def forward(self, x, edge_index_dict):
        for convs, norm in zip(self.convs, self.norms):
            x = sum(convs["__".join(et)](x, ei) for et, ei in edge_index_dict.items())
            x = norm(x).relu()
        return x


class TorchCellModel(nn.Module):
    """Gene embedding, the encoder on B masked copies, attention pooling over kept genes, a head."""

    def __init__(self, num_genes: int, edge_types: list, hidden: int, layers: int):
        super().__init__()
        self.embedding = nn.Parameter(torch.randn(num_genes, hidden) * 0.1)
        self.encoder = TorchCellEncoder(edge_types, hidden, layers)
        self.pool = AttentionalAggregation(nn.Linear(hidden, 1))
        self.head = nn.Linear(hidden, 1)

    def forward(self, batch):
        keep = batch["gene"].keep
        x = self.embedding[batch["gene"].node_id] * keep.unsqueeze(-1)  # deleted rows zeroed
        edges = {et: batch[et].edge_index[:, batch[et].edge_mask] for et in batch.edge_types}
        h = self.encoder(x, edges)
        pooled = self.pool(h[keep], batch["gene"].batch[keep], dim_size=batch.num_graphs)
        return self.head(pooled).squeeze(-1)


class MaskedGraphs(torch.utils.data.Dataset):
    """Item i: the gene graph with sample i's genes deleted (masks built here, in the worker)."""

    def __init__(self, graph: HeteroData, deleted, y):
        self.graph, self.deleted, self.y = graph, deleted, y

    def __len__(self):
        return len(self.deleted)

    def __getitem__(self, i):
        data = HeteroData()
        n = self.graph["gene"].num_nodes
        data["gene"].node_id = torch.arange(n)
        keep = torch.ones(n, dtype=torch.bool)
        keep[self.deleted[i]] = False
        data["gene"].keep = keep
        for et in self.graph.edge_types:
            ei = self.graph[et].edge_index
            data[et].edge_index = ei
            data[et].edge_mask = keep[ei[0]] & keep[ei[1]]
        data.deleted, data.y = self.deleted[i].unsqueeze(0), self.y[i]
        return data


class TorchCellPipeline(Pipeline):
    title = "a TorchCell-shaped model (PyG, B masked copies)"
    exact = True  # every sample's own perturbed graph

    def __init__(self, graph: HeteroData, model: nn.Module, deleted, y, batch_size, device):
        self.graph, self.model, self.batch_size = graph, model.to(device), batch_size
        self.device = torch.device(device)
        self.deleted, self.y = deleted, y
        self.edges = {et: graph[et].edge_index.to(self.device) for et in graph.edge_types}

    def dataset(self):
        return MaskedGraphs(self.graph, self.deleted, self.y)

    def collate(self, items):
        return Batch.from_data_list(items)

    def forward(self, model, inputs):
        return model(inputs)

    def loss(self, output, batch):
        return torch.nn.functional.mse_loss(output, batch.y)

    def shared_encoder(self, batch):
        """``(encoder, x, graph, deleted)``: the encoder this pipeline runs on every sample's
        graph, its input, the shared graph and the batch's deleted genes (``[B, k]``)."""
        return self.model.encoder, self.model.embedding, self.edges, batch.deleted


def make_pipeline(params, graph, device):
    """The workbook's factory: ``(params, graph, device) -> pipeline``."""
    data = graph.to_hetero_data()
    torch.manual_seed(params["seed"])
    model = TorchCellModel(graph.num_genes, data.edge_types, params["hidden"], params["layers"])
    b = params["batch_size_lazy"]
    deleted, y = make_samples(graph.num_genes, 32 * b, deletions_per_sample(params), params["seed"])
    return TorchCellPipeline(data, model, deleted, y, b, device)
