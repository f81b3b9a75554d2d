"""A TorchCell-style Lazy pipeline, written as a user writes one from the README: every sample is
the whole gene graph with a boolean mask per edge type (False on every edge that touches a
deleted gene), the collate puts the samples' graphs in one PyG ``Batch`` (a copy of every
``edge_index`` per sample), and the model runs a masked GIN per edge type
(``torch_geometric.nn.GINConv`` with a trainable ``eps``: every message computed, then multiplied
by the mask), ``torch.nn.Dropout(0.1)`` after every layer and before the head, and a wildtype pass
beside the perturbed one (the dual forward). The model loops over the batch's samples in Python,
one graph at a time.

``tests/rewrites/vectorized_dropout_gin.py`` is its rewrite without that loop.
``make_edge_dropout`` is the same model with ``torch_geometric.utils.dropout_edge`` (p = 0.1,
``training=self.training``) in every convolution as well: randomness in functional form, which
no dropout module shows.
"""
import torch
from torch import nn
from torch_geometric.data import Batch, HeteroData
from torch_geometric.nn import GINConv, HeteroConv
from torch_geometric.utils import dropout_edge

from workbook_lib.pipelines import Pipeline


class MaskedGIN(GINConv):
    """GIN with a trainable eps whose messages are multiplied by a per-edge mask."""

    def __init__(self, hidden: int, edge_dropout: float = 0.0):
        super().__init__(nn.Linear(hidden, hidden), train_eps=True)
        self.edge_dropout = edge_dropout

    def forward(self, x, edge_index, edge_mask):
        if self.edge_dropout:
            edge_index, kept = dropout_edge(edge_index, p=self.edge_dropout,
                                            training=self.training)
            edge_mask = edge_mask[kept]
        # propagate_type: (x: OptPairTensor, edge_mask: Tensor)
        out = self.propagate(edge_index, x=(x, x), edge_mask=edge_mask)
        return self.nn(out + (1 + self.eps) * x)

    def message(self, x_j, edge_mask):
        return x_j * edge_mask.unsqueeze(-1).to(x_j.dtype)


class LazyGIN(nn.Module):
    edge_dropout = 0.0

    def __init__(self, num_genes: int, edge_types: list, hidden: int, layers: int,
                 dropout: float = 0.1):
        super().__init__()
        self.embedding = nn.Parameter(torch.randn(num_genes, hidden) * 0.1)
        self.convs = nn.ModuleList(
            HeteroConv({et: MaskedGIN(hidden, self.edge_dropout) for et in edge_types},
                       aggr="sum") for _ in range(layers))
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, 1)

    def nodes(self, node_id, edge_index_dict, edge_mask_dict):
        x = self.embedding[node_id]
        for conv in self.convs:
            x = self.dropout(conv({"gene": x}, edge_index_dict,
                                  edge_mask_dict=edge_mask_dict)["gene"].relu())
        return x

    def forward(self, batch: Batch, wildtype: HeteroData):
        pooled = []
        for i in range(batch.num_graphs):  # one sample's graph at a time
            g = batch.get_example(i)
            pooled.append(self.nodes(g["gene"].node_id, g.edge_index_dict,
                                     g.edge_mask_dict).mean(dim=0))
        wt = self.nodes(wildtype["gene"].node_id, wildtype.edge_index_dict,
                        wildtype.edge_mask_dict).mean(dim=0)
        return self.head(self.dropout(torch.stack(pooled) - wt)).squeeze(-1)


class PerturbedGraphs(torch.utils.data.Dataset):
    """Item i: the gene graph with sample i's genes deleted (edge masks)."""

    def __init__(self, graph: HeteroData, deleted, y):
        self.graph, self.deleted, self.y = graph, deleted, y

    def __len__(self):
        return len(self.deleted)

    def __getitem__(self, i):
        data = HeteroData()
        data["gene"].node_id = torch.arange(self.graph["gene"].num_nodes)
        for et in self.graph.edge_types:
            ei = self.graph[et].edge_index
            data[et].edge_index = ei.clone()
            data[et].edge_mask = ~(torch.isin(ei[0], self.deleted[i])
                                   | torch.isin(ei[1], self.deleted[i]))
        data.y = self.y[i]
        return data


def wildtype_graph(graph: HeteroData) -> HeteroData:
    wt = HeteroData()
    wt["gene"].node_id = torch.arange(graph["gene"].num_nodes)
    for et in graph.edge_types:
        wt[et].edge_index = graph[et].edge_index
        wt[et].edge_mask = torch.ones(graph[et].edge_index.shape[1], dtype=torch.bool)
    return wt


class LazyGINPipeline(Pipeline):
    def __init__(self, graph: HeteroData, model: nn.Module, deleted, y, batch_size, device):
        self.device, self.batch_size = torch.device(device), batch_size
        self.graph, self.model = graph, model.to(self.device)
        self.deleted, self.y = deleted, y
        self.wildtype = wildtype_graph(graph).to(self.device)

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


def samples(num_genes: int, n: int, seed: int):
    """``(deleted [n, 3], y [n])``: three deleted genes per sample, a label that depends on them."""
    g = torch.Generator().manual_seed(seed)
    deleted = torch.stack([torch.randperm(num_genes, generator=g)[:3] for _ in range(n)])
    y = torch.randn(num_genes, generator=g)[deleted].sum(dim=1)
    return deleted, y


def build(params, graph, device, model_class, pipeline_class=LazyGINPipeline):
    data = graph.to_hetero_data()
    model = model_class(graph.num_genes, data.edge_types, params["hidden"], params["layers"])
    b = params["batch_size_lazy"]
    deleted, y = samples(graph.num_genes, 8 * b, params["seed"])
    return pipeline_class(data, model, deleted, y, b, device)


class LazyGINEdgeDropout(LazyGIN):
    edge_dropout = 0.1


def make_pipeline(params, graph, device):
    return build(params, graph, device, LazyGIN)


def make_edge_dropout(params, graph, device):
    return build(params, graph, device, LazyGINEdgeDropout)
