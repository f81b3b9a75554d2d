"""Strategy 7: DANGO-style single wildtype pass.

Message passing once per step on the unperturbed graph, then the embeddings of the deleted
genes go through a small attention head. Different semantics (the graph is never perturbed):
the floor any exact method is measured against. Its cost does not grow with B.
"""
from __future__ import annotations

from .base import Strategy


class DangoWildtype(Strategy):
    name = "dango_wildtype"
    label = "7 DANGO-style wildtype pass"
    number = 7
    exact = False
    replicated = False

    def __init__(self, graph, **kw):
        kw.setdefault("form", "spmm")
        super().__init__(graph, **kw)

    def node_outputs(self, model, ctx):
        raise NotImplementedError("the DANGO-style strategy computes no perturbed-graph nodes")

    def predict(self, model, ctx, dual=False):
        wt = model.wildtype_forward(self.wildtype_aggregate)
        return model.attention_head(wt, ctx["pert"])
