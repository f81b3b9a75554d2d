"""A rewrite that keeps a constant as a buffer: a GCN-normalised adjacency the slow pipeline
rebuilds in its forward every step, the fast one once, in ``__init__`` (found by a user trial:
``equal`` called it DIFFERENT at float32's rounding, the buffer built in float32 and cast up).
Both compute ``head(mean over the deleted genes of relu(A relu(A emb W1) W2))``."""
import torch
from torch import nn
from torch.utils.data import TensorDataset, default_collate

from workbook_lib.pipelines import Pipeline


def norm_adj(edge_index: torch.Tensor, n: int) -> torch.Tensor:
    loops = torch.arange(n).repeat(2, 1)
    ei = torch.cat([edge_index, edge_index.flip(0), loops], 1).unique(dim=1)
    deg = torch.zeros(n).index_add_(0, ei[1], torch.ones(ei.shape[1]))
    w = deg[ei[0]].rsqrt() * deg[ei[1]].rsqrt()
    return torch.sparse_coo_tensor(ei, w, (n, n)).coalesce()


class Gcn(nn.Module):
    def __init__(self, n: int, hidden: int, edge_index: torch.Tensor, cached: bool):
        super().__init__()
        self.n, self.edge_index = n, edge_index
        self.emb = nn.Parameter(torch.randn(n, hidden) * 0.1)
        self.lins = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(2))
        self.head = nn.Linear(hidden, 1)
        if cached:
            self.register_buffer("adj", norm_adj(edge_index, n))
        else:
            self.adj = None

    def forward(self, deleted):
        adj = self.adj if self.adj is not None else norm_adj(self.edge_index, self.n)
        h = self.emb
        for lin in self.lins:
            h = torch.relu(torch.sparse.mm(adj, lin(h)))
        return self.head(h[deleted].mean(dim=1)).squeeze(-1)


class Pipe(Pipeline):
    def __init__(self, params, graph, cached, seed_offset=0):
        torch.manual_seed(params["seed"] + seed_offset)
        edges = torch.cat(list(graph.edge_index.values()), 1)
        self.model = Gcn(graph.num_genes, 16, edges, cached)
        self.batch_size = 4
        self.name = "cached" if cached else "rebuilt"
        g = torch.Generator().manual_seed(1)
        self._data = TensorDataset(torch.randint(0, graph.num_genes, (16, 2), generator=g),
                                   torch.randn(16, generator=g))

    def dataset(self):
        return self._data

    def collate(self, items):
        return default_collate(items)

    def forward(self, model, batch):
        return model(batch[0])

    def loss(self, output, batch):
        return ((output - batch[1]) ** 2).mean()


def make_slow(params, graph, device):
    return Pipe(params, graph, cached=False)


def make_fast(params, graph, device):
    return Pipe(params, graph, cached=True)


def make_fast_reseeded(params, graph, device):
    """The rewrite drawing its initial weights from another seed: only a copy of the slow
    model's parameters makes the two start from the same numbers."""
    return Pipe(params, graph, cached=True, seed_offset=1)
