"""Strategy 6: the node-mask shared graph (the fix; its math is :mod:`workbook_lib.nodemask`).

Every sample shares one unmodified adjacency; deleting genes ``S_b`` zeroes their rows before
and after each sparse product (``A_b X = D_b A (D_b X)``). The batch carries each sample's
deleted genes and the first layer's correction rows (computed by the collate from a per-gene
table): no per-sample edge mask, nothing replicated or stored. A step runs the first layer
incrementally, the second delta-propagated (``middle="delta"``; ``"full"`` for comparison), any
further middle layers in full and the last pooled; ``node_outputs`` runs the last in full.
:meth:`NodeMaskShared.path` names the path a step takes at a given depth and
:meth:`NodeMaskShared.path_label` the label its figures carry. The layers' reasons:
docs/development.md, "strategies/node_mask_shared.py".
"""
from __future__ import annotations


from ..nodemask import NodeMaskBatch, SharedGraph, corrections, validate_deleted
from ..nodemask.delta import default_push_kernel
from .base import Strategy


class NodeMaskShared(Strategy):
    name = "node_mask_shared"
    label = "6 node-mask shared graph"
    title = "the node-mask shared graph"
    number = 6
    layout = "sample_major"
    replicated = False

    MIDDLES = ("delta", "full")

    def __init__(self, graph, *, middle: str = "delta", push_kernel: str | None = None, **kw):
        """Args: ``middle``: ``delta`` (the second layer delta-propagated) or ``full`` (every
        middle layer one product per sample); ``push_kernel``: the delta push's kernel
        (default by device); the rest as :class:`Strategy`."""
        if middle not in self.MIDDLES:
            raise ValueError(f"'middle' must be one of {list(self.MIDDLES)} (got {middle!r})")
        kw.setdefault("form", "spmm")
        super().__init__(graph, **kw)
        self.middle, self.push_kernel = middle, push_kernel
        if middle == "full":
            self.label = self.label + " (full middle layers)"
            self.title = self.title + " with full middle layers"

    def _prepare(self):
        sg = SharedGraph(self.graph.edge_index, self.n, aggr=self.aggr, device=self.device,
                         allow_self_loops=True)  # self-loops are messages, as in the reference
        self.dev["shared"] = sg
        self.host["out_edges"] = sg.out_edges

    def path(self, num_layers: int) -> str:
        """The path :meth:`predict` takes with a ``num_layers``-layer model: ``delta`` (the
        second layer delta-propagated), ``full`` (every middle layer one product per sample) or
        ``plain`` (below 3 layers there is no middle layer: first layer incremental, last
        pooled, the same computation for both ``middle`` values).

        Args:
            num_layers: the model's message-passing layers (at least 1)."""
        if num_layers < 1:
            raise ValueError(f"'num_layers' must be at least 1 (got {num_layers})")
        return "plain" if num_layers < 3 else self.middle

    def step_push_kernel(self) -> str:
        """The delta push's kernel a step uses on this strategy's device (the one asked for, or
        the device's default)."""
        return self.push_kernel or default_push_kernel(self.device)

    def path_label(self, num_layers: int) -> str:
        """What a figure of this strategy's step must say about its path: ``delta, push
        numba``, ``full middle layers`` or ``plain 2-layer (no middle layer)``.

        Args:
            num_layers: the model's message-passing layers."""
        form = self.path(num_layers)
        if form == "plain":
            return f"plain {num_layers}-layer (no middle layer)"
        if form == "full":
            return "full middle layers"
        return f"delta, push {self.step_push_kernel()}"

    @property
    def shared(self) -> SharedGraph:
        return self.dev["shared"]

    def collate(self, items):
        """The host builds (and validates) everything data-dependent: the deleted genes are
        checked and the correction rows and push sizes computed here, so that the training step
        never reads a device value back."""
        batch = super().collate(items)
        batch["pert"] = validate_deleted(batch["pert"], self.n)  # on the host, once
        batch["corrections"] = corrections(self.host["out_edges"], batch["pert"])
        return batch

    def to_device(self, batch, non_blocking=False):
        corr = batch.pop("corrections", None)
        out = super().to_device(batch, non_blocking)
        if corr is not None:
            out["corrections"] = corr.to(self.device) if self.device.type != "cpu" else corr
        return out

    def device_prepare(self, batch):
        ctx = super().device_prepare(batch)
        corr = batch.get("corrections")
        # validated in the collate: re-checking here would read the device's values back
        ctx["nb"] = NodeMaskBatch(self.shared, batch["pert"], corr, validate=corr is None,
                                  push_kernel=self.push_kernel)
        return ctx

    # ------------------------------------------------------------------ forward
    def initial(self, embedding, ctx):
        return embedding.unsqueeze(0).expand(ctx["B"], self.n, embedding.shape[1]).contiguous()

    def aggregate_all(self, h, ctx):
        return ctx["nb"].aggregate(h)  # [B, N, T, H]

    def to_sample_major(self, h, ctx):
        return h

    def wildtype_aggregate_all(self, h):
        return self.shared.wildtype_aggregate(h)  # [N, T, H]

    def one_layer(self, model, h, ctx):
        """One middle layer over every edge type for per-sample features ``h``."""
        lin = model.lins[0]
        return ctx["nb"].layer(h, lin.weight, lin.bias, eps=model.eps,
                               relu=model.num_layers > 1)

    def _layers(self, model, nb: NodeMaskBatch, pooled: bool, dual: bool = False):
        """The perturbed pass (pooled or per gene) and, with ``dual``, the wildtype pass's mean
        over genes. The wildtype pass reuses what the perturbed one computed of it (the first
        layer's output; with delta propagation the second layer's), takes any further middle
        layer in full and its last layer pooled (``SharedGraph.pooled_layer``: weighted sums
        of rows, no product over the edges)."""
        lins, last, eps = model.lins, model.num_layers - 1, model.eps
        wt_pool = None
        if last == 0 and pooled:
            out = nb.pooled_layer(model.embedding, lins[0].weight, lins[0].bias, eps=eps)
            if dual:
                wt_pool = model.wildtype_forward(self).mean(dim=0)
            return out, wt_pool
        first = 1
        # pooled, delta needs a middle layer (last >= 2): the path self.path(last + 1) names
        if self.middle == "delta" and pooled and last == 2:  # the delta layer feeds the pool
            hd = nb.first_layer_delta(model.embedding, lins[0].weight, lins[0].bias, eps=eps)
            h, wt = nb.delta_pooled_layer(hd, lins[1].weight, lins[1].bias, lins[2].weight,
                                          lins[2].bias, eps=eps, with_wildtype=True)
            if dual:
                wt_pool = self.shared.pooled_layer(wt, lins[2].weight, lins[2].bias, eps=eps)
            return h, wt_pool
        if self.middle == "delta" and last >= (2 if pooled else 1):
            hd = nb.first_layer_delta(model.embedding, lins[0].weight, lins[0].bias, eps=eps)
            h, wt = nb.delta_layer(hd, lins[1].weight, lins[1].bias, eps=eps, relu=last > 1,
                                   with_wildtype=True)
            first = 2
        else:
            h, wt = nb.first_layer(model.embedding, lins[0].weight, lins[0].bias, eps=eps,
                                   relu=last > 0)
        for i in range(first, last + (0 if pooled else 1)):
            h = nb.layer(h, lins[i].weight, lins[i].bias, eps=eps, relu=i < last)
        if pooled and last > 0:
            h = nb.pooled_layer(h, lins[last].weight, lins[last].bias, eps=eps)
        if dual:
            for i in range(first, last):
                wt = model.combine(i, wt, self.shared.wildtype_aggregate(wt))
            lin = lins[last]
            wt_pool = self.shared.pooled_layer(wt, lin.weight, lin.bias, eps=eps) \
                if first <= last else wt.mean(dim=0)
        return h, wt_pool

    def node_outputs(self, model, ctx):
        return self._layers(model, ctx["nb"], pooled=False)[0]

    def predict(self, model, ctx, dual=False):
        pooled, wt_pool = self._layers(model, ctx["nb"], pooled=True, dual=dual)  # [B, H]
        if dual:
            pooled = pooled - wt_pool
        return model.head(pooled).squeeze(-1)
