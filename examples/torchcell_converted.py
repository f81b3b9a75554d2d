"""Example 5: example 4 (``torchcell_pyg.py``) through ``workbook_lib.nodemask.convert``.

The same encoder class, parameters, pooling and samples; a batch is the ``[B, k]`` deleted genes
and the labels, and ``convert(encoder, graph, readout=pool)`` runs the encoder on one shared
graph, per sample only on the rows a deletion changes. Exact: sample b is the encoder on the
graph less its genes with their input rows zeroed, pooled over its kept genes, as in example 4
(``tests/test_pipelines.py`` checks outputs and gradients).
"""
import torch
from torch import nn
from torch.utils.data import TensorDataset, default_collate
from torch_geometric.nn.aggr import AttentionalAggregation

from perturbation_data import deletions_per_sample, make_samples
from torchcell_pyg import TorchCellEncoder
from workbook_lib.nodemask import convert
from workbook_lib.pipelines import Pipeline


class TorchCellConverted(nn.Module):
    """Example 4's ``TorchCellModel`` (same parameters, same names), converted."""

    def __init__(self, num_genes: int, edges: dict, hidden: int, layers: int):
        super().__init__()
        self.embedding = nn.Parameter(torch.randn(num_genes, hidden) * 0.1)
        self.encoder = TorchCellEncoder(list(edges), hidden, layers)
        self.pool = AttentionalAggregation(nn.Linear(hidden, 1))
        self.head = nn.Linear(hidden, 1)
        self.fast = convert(self.encoder, edges, readout=self.pool)  # the one new line

    def forward(self, deleted):
        return self.head(self.fast(self.embedding, deleted)).squeeze(-1)


class TorchCellConvertedPipeline(Pipeline):
    title = "a TorchCell-shaped model, converted (workbook_lib.nodemask.convert)"
    exact = True  # the same perturbed graphs as example 4

    def __init__(self, edges: dict, model, deleted, y, batch_size, device):
        self.device = torch.device(device)
        self.edges, self.model, self.batch_size = edges, model.to(self.device), batch_size
        self.deleted, self.y = deleted, y

    def dataset(self):
        return TensorDataset(self.deleted, self.y)

    def collate(self, items):
        return default_collate(items)

    def to_device(self, batch, non_blocking=False):
        deleted, y = batch  # deleted stays on the host: the plan is made there, no sync
        return deleted, y.to(self.device, non_blocking=non_blocking)

    def forward(self, model, inputs):
        deleted, _y = inputs
        return model(deleted)

    def loss(self, output, batch):
        return torch.nn.functional.mse_loss(output, batch[1].to(output.device))

    def shared_encoder(self, batch):
        """``(encoder, x, graph, deleted)`` (see example 4)."""
        return self.model.encoder, self.model.embedding, self.edges, batch[0]


def make_pipeline(params, graph, device):
    data = graph.to_hetero_data()
    edges = {et: data[et].edge_index for et in data.edge_types}
    torch.manual_seed(params["seed"])  # the same initial parameters as example 4
    model = TorchCellConverted(graph.num_genes, edges, params["hidden"], params["layers"])
    b = params["batch_size_lazy"]
    deleted, y = make_samples(graph.num_genes, 32 * b, deletions_per_sample(params), params["seed"])
    return TorchCellConvertedPipeline(edges, model, deleted, y, b, device)
