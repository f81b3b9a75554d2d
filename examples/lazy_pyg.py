"""Example 1: the slow model, written the way a PyG user writes it.

Each sample is the whole gene graph as a ``HeteroData`` with a boolean mask per edge type (False
on every edge that touches a deleted gene). The collate puts the B samples' graphs in one
``Batch`` (``Batch.from_data_list``: B copies of every ``edge_index``, offset per sample). The
model is a ``HeteroConv`` of masked GIN convolutions (every message computed, the deleted ones
multiplied by 0), one linear map over the concatenated edge types per layer, and the "dual
forward": the perturbed graphs' pooled embedding minus the wildtype graph's.

Run it through the workbook::

    python -m workbook_lib run --set 'pipelines=["examples/lazy_pyg.py:make_pipeline"]'
"""
import torch
from torch import nn
from torch_geometric.data import Batch, HeteroData
from torch_geometric.nn import HeteroConv, MessagePassing, global_mean_pool

from perturbation_data import deletions_per_sample, make_samples
from workbook_lib.pipelines import Pipeline


class MaskedGINConv(MessagePassing):
    """GIN (eps = 0, identity MLP) whose messages are multiplied by a per-edge mask."""

    def __init__(self):
        super().__init__(aggr="add")

    def forward(self, x, edge_index, edge_mask):
        return x + self.propagate(edge_index, x=x, edge_mask=edge_mask)

    def message(self, x_j, edge_mask):
        return x_j * edge_mask.unsqueeze(-1).to(x_j.dtype)


class LazyHetero(nn.Module):
    def __init__(self, num_genes: int, edge_types: list, hidden: int, layers: int):
        super().__init__()
        self.embedding = nn.Parameter(torch.randn(num_genes, hidden) * 0.1)
        self.convs = nn.ModuleList(
            HeteroConv({et: MaskedGINConv() for et in edge_types}, aggr="cat")
            for _ in range(layers))
        self.lins = nn.ModuleList(nn.Linear(len(edge_types) * hidden, hidden)
                                  for _ in range(layers))
        self.head = nn.Linear(hidden, 1)

    def nodes(self, node_id, edge_index_dict, edge_mask_dict):
        x = self.embedding[node_id]
        for i, (conv, lin) in enumerate(zip(self.convs, self.lins)):
            x = lin(conv({"gene": x}, edge_index_dict, edge_mask_dict=edge_mask_dict)["gene"])
            if i < len(self.lins) - 1:
                x = x.relu()
        return x

    def forward(self, batch, wildtype):
        x = self.nodes(batch["gene"].node_id, batch.edge_index_dict, batch.edge_mask_dict)
        pooled = global_mean_pool(x, batch["gene"].batch)
        wt = self.nodes(wildtype["gene"].node_id, wildtype.edge_index_dict,
                        wildtype.edge_mask_dict).mean(dim=0)  # the dual forward
        return self.head(pooled - wt).squeeze(-1)


class PerturbedGraphs(torch.utils.data.Dataset):
    """Item i: the gene graph with sample i's genes deleted (masks built here, in the worker)."""

    def __init__(self, graph: HeteroData, deleted, y):
        self.graph, self.deleted, self.y = graph, deleted, y

    def __len__(self):
        return len(self.deleted)

    def __getitem__(self, i):
        data = HeteroData()
        data["gene"].node_id = torch.arange(self.graph["gene"].num_nodes)
        for et in self.graph.edge_types:
            ei = self.graph[et].edge_index
            gone = torch.isin(ei[0], self.deleted[i]) | torch.isin(ei[1], self.deleted[i])
            data[et].edge_index = ei
            data[et].edge_mask = ~gone
        data.y = self.y[i]
        return data


class LazyPipeline(Pipeline):
    title = "the Lazy model (PyG, replicated graph + edge masks)"
    exact = True  # every sample's own perturbed graph

    def __init__(self, graph: HeteroData, model: nn.Module, deleted, y, batch_size, device):
        self.graph, self.model, self.batch_size = graph, model.to(device), batch_size
        self.device = torch.device(device)
        self.deleted, self.y = deleted, y
        wt = HeteroData()
        wt["gene"].node_id = torch.arange(graph["gene"].num_nodes)
        for et in graph.edge_types:
            wt[et].edge_index = graph[et].edge_index
            wt[et].edge_mask = torch.ones(graph[et].edge_index.shape[1], dtype=torch.bool)
        self.wildtype = wt.to(self.device)

    def dataset(self):
        return PerturbedGraphs(self.graph, self.deleted, self.y)

    def collate(self, items):
        return Batch.from_data_list(items)

    def prepare(self, batch):
        return batch, self.wildtype

    def forward(self, model, inputs):
        return model(*inputs)

    def loss(self, output, batch):
        return torch.nn.functional.mse_loss(output, batch.y)

    def shared_forward(self, model):
        """The wildtype pass of the dual forward: the same for every sample of a batch."""
        wt = self.wildtype
        return model.nodes(wt["gene"].node_id, wt.edge_index_dict, wt.edge_mask_dict)


def make_pipeline(params, graph, device):
    """The workbook's factory: ``(params, graph, device) -> pipeline``."""
    if params["aggr"] != "sum":
        raise ValueError("this example implements sum aggregation only")
    data = graph.to_hetero_data()
    torch.manual_seed(params["seed"])
    model = LazyHetero(graph.num_genes, data.edge_types, params["hidden"], params["layers"])
    b = params["batch_size_lazy"]
    deleted, y = make_samples(graph.num_genes, 32 * b, deletions_per_sample(params), params["seed"])
    return LazyPipeline(data, model, deleted, y, b, device)
