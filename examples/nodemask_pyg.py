"""Example 3: example 1 (``lazy_pyg.py``) rewritten with ``workbook_lib.nodemask``.

The same model (the same parameters, the same masked-GIN layers, the same dual forward) and the
same samples, but no sample carries a graph: a batch is the ``[B, k]`` deleted genes and the
labels, and every sample shares one ``SharedGraph``. Deleting genes zeroes their rows before and
after each sparse product, which is exactly what masking every edge that touches them does, so the
outputs and gradients equal example 1's to float32 rounding (the test suite checks it).

What changed against example 1: the dataset returns indices, the collate stacks them, and the
model's layers call ``batch.first_layer`` / ``batch.layer`` / ``batch.pooled_layer`` instead of
``HeteroConv`` on B graph copies.
"""
import torch
from torch import nn
from torch.utils.data import TensorDataset, default_collate

from perturbation_data import deletions_per_sample, make_samples
from workbook_lib.nodemask import SharedGraph
from workbook_lib.pipelines import Pipeline


class NodeMaskLazy(nn.Module):
    """Example 1's ``LazyHetero`` (same parameters, same names) on a shared graph."""

    def __init__(self, num_genes: int, edge_types: list, hidden: int, layers: int):
        super().__init__()
        self.embedding = nn.Parameter(torch.randn(num_genes, hidden) * 0.1)
        self.convs = nn.ModuleList()  # example 1's convolutions hold no parameters
        self.lins = nn.ModuleList(nn.Linear(len(edge_types) * hidden, hidden)
                                  for _ in range(layers))
        self.head = nn.Linear(hidden, 1)

    def forward(self, deleted, graph: SharedGraph):
        nb = graph.batch(deleted)
        last = len(self.lins) - 1
        if last == 0:
            pooled = nb.pooled_layer(self.embedding, self.lins[0].weight, self.lins[0].bias)
            wt = self.wildtype_layer(graph, self.embedding, 0)
        else:
            # layer 1 incrementally (its input, the embedding, is the same for every sample)
            h, wt = nb.first_layer(self.embedding, self.lins[0].weight, self.lins[0].bias)
            for i in range(1, last):
                h = nb.layer(h, self.lins[i].weight, self.lins[i].bias)
                wt = self.wildtype_layer(graph, wt, i)
            # the last layer, pooled: the mean over genes of a linear layer is linear
            pooled = nb.pooled_layer(h, self.lins[last].weight, self.lins[last].bias)
            wt = self.wildtype_layer(graph, wt, last)
        return self.head(pooled - wt.mean(dim=0)).squeeze(-1)  # the dual forward

    def wildtype_layer(self, graph: SharedGraph, x, i):
        n, h = x.shape
        agg = graph.wildtype_aggregate(x)  # [N, T, H]
        out = self.lins[i]((x.unsqueeze(1) + agg).reshape(n, -1))
        return out.relu() if i < len(self.lins) - 1 else out


class NodeMaskPipeline(Pipeline):
    title = "the Lazy model on a shared graph (workbook_lib.nodemask)"
    exact = True  # the same perturbed graphs as example 1 (tests/test_equal.py checks it)

    def __init__(self, graph: SharedGraph, model, deleted, y, batch_size, device):
        self.device = torch.device(device)
        self.graph, self.model, self.batch_size = graph, model.to(self.device), batch_size
        self.deleted, self.y = deleted, y

    def dataset(self):
        return TensorDataset(self.deleted, self.y)

    def collate(self, items):
        return default_collate(items)

    def forward(self, model, inputs):
        deleted, _y = inputs
        return model(deleted, self.graph)

    def loss(self, output, batch):
        return torch.nn.functional.mse_loss(output, batch[1])

    def shared_forward(self, model):
        """The wildtype pass of the dual forward (every layer on the unperturbed graph)."""
        x = model.embedding
        for i in range(len(model.lins)):
            x = model.wildtype_layer(self.graph, x, i)
        return x


def make_pipeline(params, graph, device):
    if params["aggr"] != "sum":
        raise ValueError("this example implements sum aggregation only (as example 1 does)")
    data = graph.to_hetero_data()
    torch.manual_seed(params["seed"])  # the same initial parameters as example 1
    model = NodeMaskLazy(graph.num_genes, data.edge_types, params["hidden"], params["layers"])
    shared = SharedGraph(data, aggr="sum", device=device)
    b = params["batch_size_lazy"]
    deleted, y = make_samples(graph.num_genes, 32 * b, deletions_per_sample(params), params["seed"])
    return NodeMaskPipeline(shared, model, deleted, y, b, device)
