"""How a built-in strategy splits its work, separating *where* it happens.

A strategy is what :class:`~workbook_lib.pipelines.builtin.BuiltinPipeline` runs with the
workbook's model behind the pipeline protocol (:mod:`workbook_lib.pipelines.protocol`), the seam
every notebook measures through; the stages below map onto the protocol's one to one.

=================  =============================================  ==========================
stage              method                                         where it runs
=================  =============================================  ==========================
prepared once      ``prepare()`` -> ``prepared`` (host/device)    before training
dataset item       ``make_item(index, pert_row)``                 DataLoader worker (host)
collate            ``collate(items)``                             DataLoader worker (host)
transfer           ``to_device(batch)``                           host -> device
device prep        ``device_prepare(batch)`` -> ctx               device (masks, filtering)
forward            ``predict(model, ctx)`` / ``node_outputs``     device
=================  =============================================  ==========================

Layouts of node features inside the forward: ``[B*N, H]`` for the replicated strategies (one
graph copy per sample, node ``b*N + i``), ``[B, N, H]`` for the shared-graph ones.
"""
from __future__ import annotations

import torch

from ..strategies import sparse_ops
from ..data.snapshots import CellGraph

FORMS = ("gather_scatter", "spmm")


def tensor_bytes(obj) -> int:
    """Bytes held by the tensors in a (nested) dict/list."""
    if isinstance(obj, torch.Tensor):
        if obj.layout == torch.sparse_csr:
            return sum(t.numel() * t.element_size()
                       for t in (obj.crow_indices(), obj.col_indices(), obj.values()))
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


class Strategy:
    """Base class. Subclasses set ``name``, ``label``, ``exact``, ``layout`` and override
    the stages they change."""

    name = "base"
    label = "base"  # numbered, for tables ("6 node-mask shared graph")
    title = "base"  # for sentences ("the node-mask shared graph")
    number = 0  # the strategy's number in the investigation
    exact = True  # computes the perturbed-graph forward exactly (strategy 7 does not)
    layout = "sample_major"
    replicated = True  # carries one graph copy per sample

    def __init__(self, graph: CellGraph, *, aggr: str = "sum",
                 device: torch.device | str = "cpu", form: str = "gather_scatter"):
        if aggr not in ("sum", "mean"):
            raise ValueError(f"'aggr' must be 'sum' or 'mean' (got {aggr!r})")
        if form not in FORMS:
            raise ValueError(f"'form' must be one of {list(FORMS)} (got {form!r})")
        self.graph = graph
        self.aggr = aggr
        self.device = torch.device(device)
        self.form = form
        self.n = graph.num_genes
        self.host: dict = {}  # prepared once, on the host
        self.dev: dict = {}  # prepared once, on the device
        self._prepared = False

    # ------------------------------------------------------------------ prepared once
    def prepare(self) -> "Strategy":
        """Build what is prepared once. Always keeps the wildtype graph on the device (for
        the dual forward's wildtype pass)."""
        if self._prepared:
            return self
        for t, ei in self.graph.edge_index.items():
            self.dev[f"wt_{t}"] = ei.to(self.device)
        self._prepare()
        self._prepared = True
        return self

    def _prepare(self) -> None:
        pass

    def __getstate__(self):
        # DataLoader workers only build items and batches (host work): device structures stay
        # in the main process (CUDA tensors cannot cross into a forked worker anyway)
        state = self.__dict__.copy()
        state["dev"] = {}
        return state

    # ------------------------------------------------------------------ data pipeline
    def make_item(self, index: int, pert_row: torch.Tensor) -> dict:
        """One dataset item (runs in a DataLoader worker). Default: the indices only."""
        return {"index": index, "pert": pert_row}

    def collate(self, items: list[dict]) -> dict:
        """Build a batch on the host (runs in a DataLoader worker)."""
        return {"pert": torch.stack([it["pert"] for it in items]),
                "index": torch.tensor([it["index"] for it in items])}

    def to_device(self, batch: dict, non_blocking: bool = False) -> dict:
        def move(v):
            if isinstance(v, torch.Tensor):  # already there: no copy (and nothing to count)
                return v if v.device == self.device else v.to(self.device,
                                                              non_blocking=non_blocking)
            if isinstance(v, dict):
                return {k: move(x) for k, x in v.items()}
            return v
        return move(batch)

    def device_prepare(self, batch: dict) -> dict:
        """On-device work before the model (mask generation, filtering). Returns the ctx."""
        return {"B": batch["pert"].shape[0], "pert": batch["pert"]}

    # ------------------------------------------------------------------ forward
    def initial(self, embedding: torch.Tensor, ctx: dict) -> torch.Tensor:
        return embedding.repeat(ctx["B"], 1)  # [B*N, H]

    def aggregate(self, h: torch.Tensor, edge_type: str, ctx: dict) -> torch.Tensor:
        raise NotImplementedError

    def aggregate_all(self, h: torch.Tensor, ctx: dict) -> list[torch.Tensor] | torch.Tensor:
        """Every edge type's aggregation: a list (default: one call per type) or a stacked
        ``[T, *h.shape]`` tensor when a strategy computes all types in one product."""
        return [self.aggregate(h, t, ctx) for t in self.graph.edge_types]

    def one_layer(self, model, h: torch.Tensor, ctx: dict) -> torch.Tensor:
        """One middle layer of ``model`` (its layer 0) over every edge type, for per-sample
        features ``h`` in this strategy's layout (the one-layer benchmark)."""
        return model.combine(0, h, self.aggregate_all(h, ctx))

    def to_sample_major(self, h: torch.Tensor, ctx: dict) -> torch.Tensor:
        return h.view(ctx["B"], self.n, -1)

    def wildtype_aggregate(self, h: torch.Tensor, edge_type: str) -> torch.Tensor:
        """Aggregation over the unperturbed graph, in this strategy's message form."""
        ei = self.dev[f"wt_{edge_type}"]
        if self.form == "spmm":
            key = f"wt_csr_{edge_type}"
            if key not in self.dev:
                self.dev[key] = sparse_ops.csr_from_sorted(ei[0], ei[1], self.n, self.n)
            out = sparse_ops.spmm(self.dev[key], h)
        else:
            out = sparse_ops.gather_scatter(h, ei[0], ei[1], self.n)
        if self.aggr == "mean":
            key = f"wt_deg_{edge_type}"
            if key not in self.dev:
                self.dev[key] = sparse_ops.in_degree(ei[1], self.n)
            out = sparse_ops.mean_divide(out, self.dev[key])
        return out

    def wildtype_aggregate_all(self, h: torch.Tensor) -> list[torch.Tensor] | torch.Tensor:
        """Every edge type's wildtype aggregation (a list, or one stacked tensor)."""
        return [self.wildtype_aggregate(h, t) for t in self.graph.edge_types]

    def node_outputs(self, model, ctx: dict) -> torch.Tensor:
        """Perturbed-graph node embeddings ``[B, N, H]``."""
        return model.node_forward(self, ctx)

    def predict(self, model, ctx: dict, dual: bool = False) -> torch.Tensor:
        """Scalar prediction per sample ``[B]`` (``dual``: minus the wildtype pool)."""
        nodes = self.node_outputs(model, ctx)
        wt = model.wildtype_forward(self) if dual else None
        return model.readout(nodes, wt)

    # ------------------------------------------------------------------ helpers
    def replicate(self, edge_type: str, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """B copies of the wildtype edges on the device, offset by ``b * N`` (sorted by dst)."""
        ei = self.dev[f"wt_{edge_type}"]
        off = (torch.arange(batch_size, device=ei.device) * self.n).unsqueeze(1)
        return (ei[0].unsqueeze(0) + off).reshape(-1), (ei[1].unsqueeze(0) + off).reshape(-1)


class ReplicatedAggregateMixin:
    """Aggregation over a batched (replicated or per-sample) edge list in the ctx:
    ``ctx["edges"][t] = (src, dst, weight_or_None)`` with dst sorted."""

    def _replicated_aggregate(self, h, edge_type, ctx):
        src, dst, w = ctx["edges"][edge_type]
        num = ctx["B"] * self.n
        if self.form == "spmm":
            key = ("csr", edge_type)
            if key not in ctx:
                ctx[key] = sparse_ops.csr_from_sorted(src, dst, num, num, w)
            out = sparse_ops.spmm(ctx[key], h)
        else:
            out = sparse_ops.gather_scatter(h, src, dst, num, w)
        if self.aggr == "mean":
            key = ("deg", edge_type)
            if key not in ctx:
                ctx[key] = sparse_ops.in_degree(dst, num, w)
            out = sparse_ops.mean_divide(out, ctx[key])
        return out


def offset_concat(edge_lists: list[torch.Tensor], n: int) -> torch.Tensor:
    """Concatenate per-sample ``[2, E_b]`` edge lists, offsetting sample b's ids by ``b * n``."""
    return torch.cat([ei + b * n for b, ei in enumerate(edge_lists)], dim=1)


def incidence_cache(graph: CellGraph) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Gene -> positions of its incident edges, per type: ``(offsets [N+1], positions)``;
    every edge is listed under both endpoints (a self-loop would be listed twice)."""
    out = {}
    n = graph.num_genes
    for t, ei in graph.edge_index.items():
        e = ei.shape[1]
        nodes = torch.cat([ei[0], ei[1]])
        pos = torch.cat([torch.arange(e), torch.arange(e)])
        order = torch.argsort(nodes, stable=True)
        offsets = torch.zeros(n + 1, dtype=torch.long)
        offsets[1:] = torch.bincount(nodes, minlength=n).cumsum(0)
        out[t] = (offsets, pos[order])
    return out


def build_ctx(strategy: Strategy, pert: torch.Tensor, indices: list[int] | None = None) -> dict:
    """Run the whole host pipeline in-process for one batch: items, collate, transfer, device
    prep. (The DataLoader does the first two in workers; this is for tests and benchmarks.)"""
    indices = list(range(len(pert))) if indices is None else indices
    items = [strategy.make_item(i, row) for i, row in zip(indices, pert)]
    return strategy.device_prepare(strategy.to_device(strategy.collate(items)))
