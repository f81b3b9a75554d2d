"""A family of small pipelines, written as a user writes one from the README's example
(``my_pipeline.py``), habits and mistakes included. ``tests/test_matrix.py`` draws sets of them
and runs each set through the notebooks. One file, one factory per member:

=============  ==============================================================================
factory        what the user wrote
=============  ==============================================================================
``fast``       the README's example as it is (exact)
``slow``       the same model with a Python loop over the samples in the forward (exact)
``inexact``    one pass over the unperturbed graph, the deleted genes read out (exact = False)
``raises``     ``slow``, whose forward raises on its 4th call (a bug hit late)
``nan``        ``fast`` with a loss that is NaN from the first step
``submodule``  a forward that calls ``model.conv`` directly (DDP wraps the model: it breaks)
``lightning``  the README's model as a LightningModule with a LightningDataModule
``stalls``     ``fast`` whose dataset item blocks on its 20th read (a filesystem that stopped
               answering)
``unused``     ``slow`` with a layer the forward never uses (fine alone; DDP's reducer refuses
               it from the second step: it fails in notebook 04 only)
=============  ==============================================================================
"""
import time

import torch
from torch.utils.data import DataLoader, TensorDataset, default_collate
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


class LoopModel(GeneModel):
    """The perturbed graph per sample: a loop over the batch, one graph pass each."""

    def forward(self, deleted, edge_index):
        n = self.embedding.shape[0]
        outs = []
        for genes in deleted:
            alive = torch.ones(n, device=deleted.device).index_fill(0, genes, 0.0)
            keep = alive[edge_index[0]] * alive[edge_index[1]]
            x = self.embedding * alive[:, None]
            x = self.conv(x, edge_index[:, keep > 0]).relu()
            for _ in range(3):  # the user's model smooths over 3 more hops
                x = 0.5 * x + 0.5 * self.conv(x, edge_index[:, keep > 0]).relu()
            outs.append(self.head(x[genes].mean(dim=0)))
        return torch.cat(outs)


class MyPipeline(Pipeline):
    def __init__(self, graph, device, batch_size=BATCH, model_class=GeneModel):
        self.device, self.batch_size = torch.device(device), batch_size
        data = graph.to_hetero_data()  # the snapshot as a PyG HeteroData
        self.edge_index = torch.cat([data[et].edge_index for et in data.edge_types], dim=1)
        self.edge_index = self.edge_index.to(self.device)
        torch.manual_seed(0)
        self.model = model_class(graph.num_genes, hidden=16).to(self.device)
        g = torch.Generator().manual_seed(0)
        self.deleted = torch.randint(0, graph.num_genes, (256, 3), generator=g)
        self.y = torch.randn(256, generator=g)

    def dataset(self):
        return TensorDataset(self.deleted, self.y)

    def collate(self, items):
        return default_collate(items)

    def forward(self, model, batch):
        deleted, _y = batch
        return model(deleted, self.edge_index)

    def loss(self, output, batch):
        return torch.nn.functional.mse_loss(output, batch[1])


def fast(params, graph, device):
    return MyPipeline(graph, device)


def slow(params, graph, device):
    return MyPipeline(graph, device, model_class=LoopModel)


class Inexact(MyPipeline):
    exact = False  # the unperturbed graph: another model than the perturbed one


def inexact(params, graph, device):
    return Inexact(graph, device, batch_size=2 * BATCH)


class Raises(MyPipeline):
    calls = 0

    def forward(self, model, batch):
        self.calls += 1
        if self.calls == 4:
            raise RuntimeError("index 7 is out of bounds for dimension 0 with size 3")
        return super().forward(model, batch)


def raises(params, graph, device):
    return Raises(graph, device, model_class=LoopModel)


class NanLoss(MyPipeline):
    def loss(self, output, batch):
        return torch.nn.functional.mse_loss(output, batch[1]) * float("nan")


def nan(params, graph, device):
    return NanLoss(graph, device)


class Submodule(MyPipeline):
    def forward(self, model, batch):
        deleted, _y = batch
        x = model.conv(model.embedding, self.edge_index).relu()  # reaches into the model
        return model.head(x[deleted].mean(dim=1)).squeeze(-1)


def submodule(params, graph, device):
    return Submodule(graph, device)


class SlowDisk(torch.utils.data.Dataset):
    """Items read from a network filesystem that stops answering at the 20th read."""

    def __init__(self, deleted, y):
        self.deleted, self.y, self.reads = deleted, y, 0

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        self.reads += 1
        if self.reads == 20:
            time.sleep(3600)
        return self.deleted[i], self.y[i]


class Stalls(MyPipeline):
    def __init__(self, graph, device):
        super().__init__(graph, device)
        self.data = SlowDisk(self.deleted, self.y)

    def dataset(self):
        return self.data


def stalls(params, graph, device):
    return Stalls(graph, device)


class WithUnused(LoopModel):
    def __init__(self, num_genes, hidden):
        super().__init__(num_genes, hidden)
        self.spare = torch.nn.Linear(hidden, hidden)  # kept for an experiment, never called


def unused(params, graph, device):
    return MyPipeline(graph, device, model_class=WithUnused)


def lightning(params, graph, device):
    import lightning.pytorch as pl

    from workbook_lib.pipelines.lightning import LightningPipeline

    base = MyPipeline(graph, device)

    class LitGenes(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = base.model
            self.register_buffer("edge_index", base.edge_index)

        def training_step(self, batch, batch_idx):
            deleted, y = batch
            return torch.nn.functional.mse_loss(self.net(deleted, self.edge_index), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class GenesData(pl.LightningDataModule):
        def train_dataloader(self):
            return DataLoader(TensorDataset(base.deleted, base.y), batch_size=BATCH)

    return LightningPipeline(LitGenes(), GenesData(), device, name="lightning")
