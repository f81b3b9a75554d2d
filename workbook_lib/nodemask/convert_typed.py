"""The fused typed layer of a converted encoder: a linear map of the concatenated per-type sums of
identity GINs, run by :class:`~workbook_lib.nodemask.batch.NodeMaskBatch`'s own kernels.

``lin(cat([GIN_t(h, A_t) for each edge type t it reads]))`` with ``GIN_t`` an identity-``nn`` GIN (one
fixed ``eps``, one aggregation) is ``sum_t A_t (h W_t^T) + (1 + eps) h (sum_t W_t)^T + b``: each
type's map can act before the aggregation, on the few rows that changed, and the mapped messages
are pushed along those rows' out-edges straight into the layer's output, where the conv-by-conv
form aggregates every type on every changed receiver and maps each of those rows after. This
is the form :mod:`.batch` and :mod:`.delta` compute for the workbook's own model
(``first_layer_delta`` when ``h`` is the input ``x``; ``delta_layer`` when ``h``'s changed rows
lie within the batch's correction rows, the deleted genes and their out-neighbours along the
types the layer reads), on the graph of those types; a ReLU
that is the map's only user runs inside the push. Elsewhere the conv-by-conv form is used.

Written here because the pattern is this library's subject (which layers of a user's model
reduce to its own kernels); the kernels are the ones the hand-written delta form uses.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GINConv
from torch_geometric.nn.dense.linear import Linear as PygLinear

# a forward reading one of these as a layer's only user: the ReLU runs inside the push
_RELU_FUNCTIONS = (torch.relu, F.relu)


@dataclass(eq=False)
class TypedLayer:
    """One ``lin(cat([GIN_t(src, edges_t)]))`` in the traced forward (fx nodes), with its
    aggregation (``"sum"`` or ``"mean"``, as :class:`SharedGraph` names them); its fixed eps, equal
    in every part, is read from the parts' buffer at each call."""

    lin: fx.Node
    cat: fx.Node
    parts: list
    src: fx.Node
    relu: fx.Node | None
    aggr: str

    def nodes(self) -> list:
        """Every fx node the fused layer computes."""
        return self.parts + [self.cat, self.lin] + ([self.relu] if self.relu is not None else [])


def identity_gin(m: nn.Module, kind: type) -> bool:
    """A conv a fused typed layer takes: an identity GIN, fixed eps, sum or mean."""
    return kind is GINConv and isinstance(m.nn, nn.Identity) and \
        not isinstance(m.eps, nn.Parameter) and m.aggr in ("add", "sum", "mean")


def _relu_user(node: fx.Node, named: dict) -> fx.Node | None:
    """The ReLU that is ``node``'s only user (its only input), or None."""
    if len(node.users) != 1:
        return None
    u = next(iter(node.users))
    if u.args != (node,) or u.kwargs:
        return None
    if u.op == "call_function" and u.target in _RELU_FUNCTIONS:
        return u
    if u.op == "call_method" and u.target == "relu":
        return u
    if u.op == "call_module" and type(named[u.target]) is nn.ReLU and \
            not named[u.target].inplace:
        return u
    return None


def typed_layers(graph: fx.Graph, named: dict, kind_of, fused_cat) -> dict:
    """``{fx node: TypedLayer}`` for every node of every fused typed layer of the traced forward.

    Args:
        graph: the traced forward; named: the encoder's modules by path.
        kind_of: ``kind_of(module, path)``, the supported conv class a module computes as.
        fused_cat: ``fused_cat(node)``, a feature concatenation whose one user is a linear map.
    """
    found: dict = {}
    for cat in graph.nodes:
        if not fused_cat(cat):
            continue
        lin = next(iter(cat.users))
        m = named[lin.target]
        if not isinstance(m, (nn.Linear, PygLinear)) or \
                isinstance(m.weight, nn.parameter.UninitializedParameter):
            continue
        parts = list(cat.args[0])
        ok = all(p.op == "call_module" and len(p.args) == 2 and not p.kwargs and
                 len(p.users) == 1 and isinstance(p.args[1], fx.Node) for p in parts)
        if not ok or len({p.args[0] for p in parts}) != 1:
            continue
        convs = [named[p.target] for p in parts]
        try:
            if not all(identity_gin(c, kind_of(c, p.target)) for c, p in zip(convs, parts)):
                continue
        except ValueError:
            continue
        aggr = {"mean" if c.aggr == "mean" else "sum" for c in convs}
        if len({float(c.eps) for c in convs}) != 1 or len(aggr) != 1:
            continue
        layer = TypedLayer(lin, cat, parts, parts[0].args[0], _relu_user(lin, named), aggr.pop())
        for node in layer.nodes():
            found[node] = layer
    return found


def type_order(keys: list, graph_keys: list) -> tuple[tuple, list] | None:
    """The edge types the parts read, in the graph's order, and per type the index of the part
    reading it; None unless each part reads its own edge type of the graph."""
    if len(set(keys)) != len(keys) or not set(keys) <= set(graph_keys):
        return None
    types = tuple(k for k in graph_keys if k in set(keys))
    return types, [keys.index(k) for k in types]
