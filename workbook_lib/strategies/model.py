"""The one model every strategy runs: GIN-style layers over several gene-gene edge types.

Layer l, for every edge type t:  ``x_t = (1 + eps) * h + AGG_t(h)`` (GIN update with an
identity MLP; AGG = sum by default, mean as an option), then the types are combined by one
linear map of their concatenation, ``h' = ReLU(W_l [x_1 | ... | x_T] + b_l)`` (no ReLU after the
last layer). Input: a learnable gene embedding. Readout: mean over genes, a linear head; with
``dual=True`` the Lazy model's "dual forward" (perturbed minus wildtype pooled embedding).

The *strategy* decides how AGG_t is computed for a batch of perturbed graphs (that is what
the workbook compares); the arithmetic is the same for all, so differences are the pipeline's.
"""
from __future__ import annotations

import torch
from torch import nn


class PerturbGIN(nn.Module):
    """GIN-style multi-edge-type model over the gene graph.

    Args:
        num_genes: number of gene nodes N.
        edge_types: edge type names, in a fixed order.
        hidden: hidden size H (default 64).
        layers: message-passing layers L (default 3).
        eps: GIN epsilon, fixed (default 0.0).
        seed: initialisation seed (default 0), so two models built alike are equal.
    """

    def __init__(self, num_genes: int, edge_types: list[str], hidden: int = 64,
                 layers: int = 3, eps: float = 0.0, seed: int = 0):
        super().__init__()
        if hidden <= 0:
            raise ValueError(f"'hidden' must be a positive integer (got {hidden})")
        if layers <= 0:
            raise ValueError(f"'layers' must be a positive integer (got {layers})")
        if not edge_types:
            raise ValueError("'edge_types' must not be empty")
        g = torch.Generator().manual_seed(seed)
        self.num_genes, self.edge_types, self.hidden, self.num_layers = \
            num_genes, list(edge_types), hidden, layers
        self.eps = eps
        self.embedding = nn.Parameter(torch.randn(num_genes, hidden, generator=g) * 0.1)
        t = len(self.edge_types)
        self.lins = nn.ModuleList(nn.Linear(t * hidden, hidden) for _ in range(layers))
        for lin in self.lins:
            bound = 1.0 / (t * hidden) ** 0.5
            with torch.no_grad():
                lin.weight.copy_((torch.rand(lin.weight.shape, generator=g) * 2 - 1) * bound)
                lin.bias.copy_((torch.rand(lin.bias.shape, generator=g) * 2 - 1) * bound)
        self.query = nn.Parameter(torch.randn(hidden, generator=g) * 0.1)  # DANGO-style head
        self.head = nn.Linear(hidden, 1)
        with torch.no_grad():  # every parameter from the seeded generator: same seed, same model
            bound = 1.0 / hidden ** 0.5
            self.head.weight.copy_((torch.rand(self.head.weight.shape, generator=g) * 2 - 1)
                                   * bound)
            self.head.bias.copy_((torch.rand(self.head.bias.shape, generator=g) * 2 - 1) * bound)

    def forward(self, strategy, ctx: dict, dual: bool = False) -> torch.Tensor:
        """Predictions ``[B]`` for a batch prepared by ``strategy`` (so that wrappers such as
        DistributedDataParallel see a normal ``forward`` call)."""
        return strategy.predict(self, ctx, dual=dual)

    def combine(self, layer: int, h: torch.Tensor,
                aggregated: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """One layer's update from the per-type aggregations.

        A list of T tensors shaped like ``h`` (the replicated strategies) is combined as the
        Lazy model does: ``lin(cat_t((1 + eps) h + agg_t))``. A tensor ``[..., T, H]`` (the
        shared-graph strategies) is combined in the algebraically equal fused form
        ``agg W^T + (1 + eps) h (sum_t W_t)^T + b``, which never concatenates T copies of ``h``.
        """
        lin = self.lins[layer]
        if isinstance(aggregated, torch.Tensor):
            t = aggregated.shape[-2]
            wsum = lin.weight.view(lin.weight.shape[0], t, -1).sum(1)
            out = aggregated.reshape(*aggregated.shape[:-2], -1) @ lin.weight.T + \
                (1.0 + self.eps) * (h @ wsum.T) + lin.bias
        else:
            selfterm = h if self.eps == 0 else (1.0 + self.eps) * h
            out = lin(torch.cat([selfterm + a for a in aggregated], dim=-1))
        return torch.relu(out) if layer < self.num_layers - 1 else out

    def node_forward(self, strategy, ctx) -> torch.Tensor:
        """Perturbed-graph node embeddings ``[B, N, H]`` computed the strategy's way."""
        h = strategy.initial(self.embedding, ctx)
        for layer in range(self.num_layers):
            h = self.combine(layer, h, strategy.aggregate_all(h, ctx))
        return strategy.to_sample_major(h, ctx)

    def wildtype_forward(self, strategy) -> torch.Tensor:
        """Wildtype node embeddings ``[N, H]``, aggregated the strategy's way."""
        h = self.embedding
        for layer in range(self.num_layers):
            h = self.combine(layer, h, strategy.wildtype_aggregate_all(h))
        return h

    def readout(self, nodes: torch.Tensor, wildtype: torch.Tensor | None = None) -> torch.Tensor:
        """Mean over genes then the head: ``[B]``; minus the wildtype pool for the dual forward."""
        pooled = nodes.mean(dim=-2)
        if wildtype is not None:
            pooled = pooled - wildtype.mean(dim=0)
        return self.head(pooled).squeeze(-1)

    def attention_head(self, wildtype: torch.Tensor, pert: torch.Tensor) -> torch.Tensor:
        """DANGO-style head: attention over the wildtype embeddings of the deleted genes.

        ``pert`` is ``[B, k]`` padded with -1; a sample that deletes nothing pools zeros.
        """
        valid = pert >= 0
        hp = wildtype[pert.clamp(min=0)]  # [B, k, H]
        scores = (hp @ self.query).masked_fill(~valid, float("-inf"))
        attn = torch.softmax(scores, dim=-1).nan_to_num(0.0) * valid
        pooled = (attn.unsqueeze(-1) * hp).sum(dim=1)
        return self.head(pooled).squeeze(-1)
