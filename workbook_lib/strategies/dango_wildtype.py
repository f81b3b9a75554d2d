"""Strategy 7: DANGO-style single wildtype pass.

Message passing once per step on the unperturbed graph, then the embeddings of the deleted
genes go through a small attention head. Different semantics (the graph is never perturbed):
the floor any exact method is measured against. Its cost does not grow with B. Its products are
the node-mask shared graph's (same prepared matrices and kernels), so the two compare like with
like.
"""
from __future__ import annotations

from .base import Strategy
from .node_mask_shared import NodeMaskShared


class DangoWildtype(NodeMaskShared):
    name = "dango_wildtype"
    label = "7 DANGO-style wildtype pass"
    title = "the DANGO-style wildtype pass"
    number = 7
    exact = False
    replicated = False

    def collate(self, items):
        return Strategy.collate(self, items)  # only the indices

    def device_prepare(self, batch):
        return Strategy.device_prepare(self, batch)

    def node_outputs(self, model, ctx):
        raise NotImplementedError("the DANGO-style strategy computes no perturbed-graph nodes")

    def one_layer(self, model, h, ctx):
        return model.combine(0, h, self.wildtype_aggregate_all(h))

    def predict(self, model, ctx, dual=False):
        return model.attention_head(model.wildtype_forward(self), ctx["pert"])
