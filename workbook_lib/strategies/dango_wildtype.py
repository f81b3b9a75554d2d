"""Strategy 7: DANGO-style single wildtype pass.

Message passing once per step on the unperturbed graph, then the embeddings of the deleted
genes go through a small attention head. Different semantics (the graph is never perturbed):
the floor any exact method is measured against. Its cost does not grow with B. It aggregates
with the same stacked CSR product (and prepared transpose) as the node-mask shared graph.
"""
from __future__ import annotations

from ..strategies.base import Strategy
from ..strategies.node_mask_shared import NodeMaskShared


class DangoWildtype(NodeMaskShared):
    name = "dango_wildtype"
    label = "7 DANGO-style wildtype pass"
    number = 7
    exact = False
    replicated = False
    layout = "sample_major"

    def device_prepare(self, batch):
        return Strategy.device_prepare(self, batch)  # only the indices are needed

    def node_outputs(self, model, ctx):
        raise NotImplementedError("the DANGO-style strategy computes no perturbed-graph nodes")

    def predict(self, model, ctx, dual=False):
        wt = model.wildtype_forward(self)
        return model.attention_head(wt, ctx["pert"])
