"""The pooled tail of a converted encoder: its last modules, read out as a sum over genes, without
computing their rows.

With a weighted-sum readout (``"mean"``, ``"mean_kept"``, ``"sum_kept"``: sample ``b`` is
``sum_n W[b, n] out_b[n]``, ``W`` zero at the deleted genes), every module after the encoder's
last nonlinearity is affine in its input, so the readout pools that input instead:

- ``Linear``: ``P(lin(v), W) = P(v, W) @ weight.T + bias * sum_n W[b, n]``;
- ``cat`` on features, ``+``, a scalar ``*``: the same of the pooled parts;
- a sum-aggregating convolution over sample ``b``'s graph ``A_b``:
  ``P(A_b v, W) = P(v, A_b^T W)``, one sparse product of width B per edge type (a mean divides
  ``W`` by each gene's kept in-degree first); GIN adds ``(1 + eps) W``, GraphConv and SAGE map
  their two terms (each a ``Linear`` as above);
- the tail's inputs (``v`` computed by the converted layers before it: the wildtype and the
  changed rows) give ``W @ wt`` plus the changed rows' differences weighted by ``W``.

The pooled layer's rows are never formed: per sample, a sparse product over the kept edges
(width 1) and a weighted sum of its input rows, where computing the layer costs its edges times
its width and its maps on every row. Hand-written: the algebra is this library's (the workbook's
own model pools its last layer the same way).
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch import nn
from torch_geometric.nn import GINConv, GraphConv, HeteroConv, MessagePassing, SAGEConv
from torch_geometric.nn.dense.linear import Linear as PygLinear

from .convert_trace import call_dim

POOLED_READOUTS = ("mean", "mean_kept", "sum_kept")
_LINEAR = (nn.Linear, PygLinear)
_NOOP = (nn.Identity, nn.Dropout)  # dropout p > 0 in train mode is refused at the call


def _affine_module(m: nn.Module) -> bool:
    """``m`` maps each row affinely (Linear, identity, dropout, or a Sequential of them)."""
    if isinstance(m, _LINEAR):
        return not isinstance(m.weight, nn.parameter.UninitializedParameter)
    if isinstance(m, _NOOP):
        return True
    return type(m) is nn.Sequential and all(_affine_module(c) for c in m)


def conv_pools(m: nn.Module, kind: type) -> bool:
    """A convolution whose output is affine in its input (GIN with an affine ``nn``, GraphConv,
    SAGE without normalization)."""
    if kind is GINConv:
        return _affine_module(m.nn)
    if kind is GraphConv:
        return True
    return kind is SAGEConv and not m.normalize


def _scalar(a) -> bool:
    return isinstance(a, (int, float)) and not isinstance(a, bool)


def tail_nodes(graph: fx.Graph, named: dict, kind_of) -> set:
    """The fx nodes of the pooled tail: affine nodes whose every user is in the tail or is the
    output (reverse topological order decides users first); empty unless the output is one
    node. ``kind_of(module, path)``: the supported conv class a message-passing module computes
    as (``convert_trace.conv_kind``; the graph is checked before)."""
    if output_value(graph) is None:
        return set()
    tail: set = set()
    genes: set = set()  # what derives from x: a per-gene constant (a weight indexed by a
    for node in graph.nodes:  # fixed type per gene) is not pooled as a value
        if _is_x(node) if node.op == "placeholder" else any(a in genes
                                                            for a in node.all_input_nodes):
            genes.add(node)
    for node in reversed(list(graph.nodes)):
        if node.op == "output" or not node.users:
            continue
        if not all(u in tail or u.op == "output" for u in node.users):
            continue
        if all(a in genes for a in node.all_input_nodes if a.op != "placeholder"
               or _is_x(a)) and _affine_node(node, named, kind_of):
            tail.add(node)
    return tail


def output_value(graph: fx.Graph) -> fx.Node | None:
    """The node the traced forward returns (a one-element list when traced with a dict), or
    None when it returns several."""
    out = next(n for n in graph.nodes if n.op == "output").args[0]
    if isinstance(out, (list, tuple)) and len(out) == 1:
        out = out[0]
    return out if isinstance(out, fx.Node) else None


def _affine_node(node: fx.Node, named: dict, kind_of) -> bool:
    values = [a for a in node.all_input_nodes if a.op != "placeholder" or _is_x(a)]
    if any(a.op == "get_attr" for a in values):
        return False
    if node.op == "call_module":
        m = named[node.target]
        if isinstance(m, HeteroConv):
            return False
        kind = kind_of(m, node.target) if isinstance(m, MessagePassing) else None
        if kind is not None:
            return len(node.args) == 2 and not node.kwargs and conv_pools(m, kind)
        return not isinstance(m, MessagePassing) and _affine_module(m) and len(node.args) == 1
    if node.op != "call_function" or node.kwargs and node.target not in (torch.cat, torch.concat):
        return False
    if node.target in (torch.cat, torch.concat):
        dim = call_dim(node, 0)
        return dim in (-1, 1) and isinstance(node.args[0], (list, tuple))
    if node.target is operator.add:
        a, b = node.args
        return isinstance(b, fx.Node) and (isinstance(a, fx.Node) or (_scalar(a) and a == 0))
    if node.target in (operator.mul, operator.truediv):
        a, b = node.args
        return isinstance(a, fx.Node) and _scalar(b) and (node.target is operator.mul or b != 0)
    return False


def _is_x(node: fx.Node) -> bool:
    return next(n for n in node.graph.nodes if n.op == "placeholder") is node


def linear(m: nn.Module, p: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``P(m(v), W)`` from ``p = P(v, W)`` and ``s = W.sum(1, keepdim=True)`` for an affine
    per-row module ``m`` (:func:`_affine_module`)."""
    if isinstance(m, _LINEAR):
        out = p @ m.weight.t()
        return out + s * m.bias if m.bias is not None else out
    if type(m) is nn.Sequential:
        for c in m:
            p = linear(c, p, s)
    return p


class Pooler:
    """``P(node, W)`` over the tail (see the module docstring), for one call.

    Args:
        tail: :func:`tail_nodes`; named: the encoder's modules by path; kind_of: as for
            :func:`tail_nodes`; env: the executed values by fx node (the tail's
            inputs are :class:`~workbook_lib.nodemask.convert._Val`); leaf: ``leaf(val, W)``
            pools a computed value; spread: ``spread(node, W)`` is ``A_b^T W`` (``[B, N]``, zero at
            deleted genes) for the conv node's edge type and aggregation.
    """

    def __init__(self, tail: set, named: dict, kind_of, env: dict, leaf, spread):
        self.tail, self.named, self.kind_of = tail, named, kind_of
        self.env, self.leaf, self.spread = env, leaf, spread
        self._memo: dict = {}
        self.widths: dict = {}  # conv node -> its input's width

    def pool(self, node, w: torch.Tensor) -> torch.Tensor:
        key = (node, id(w))
        if key not in self._memo:
            self._memo[key] = (self._pool(node, w), w)  # w kept alive: its id stays unique
        return self._memo[key][0]

    def _pool(self, node, w: torch.Tensor) -> torch.Tensor:
        if not isinstance(node, fx.Node) or node not in self.tail:
            return self.leaf(self.env[node], w)
        s = w.sum(1, keepdim=True)
        if node.op == "call_module":
            m = self.named[node.target]
            if not isinstance(m, MessagePassing):
                return linear(m, self.pool(node.args[0], w), s)
            x, kind = node.args[0], self.kind_of(m, node.target)
            if kind is GINConv:
                inner = self.pool(x, (1 + m.eps) * w + self.spread(node, w))
                self.widths[node] = inner.shape[-1]
                return linear(m.nn, inner, s)
            agg = self.pool(x, self.spread(node, w))
            self.widths[node] = agg.shape[-1]
            if kind is GraphConv:
                return linear(m.lin_rel, agg, s) + linear(m.lin_root, self.pool(x, w), s)
            out = linear(m.lin_l, agg, s)  # SAGE
            return out + linear(m.lin_r, self.pool(x, w), s) if m.root_weight else out
        if node.target in (torch.cat, torch.concat):
            return torch.cat([self.pool(a, w) for a in node.args[0]], dim=-1)
        a, b = node.args
        if node.target is operator.add:
            return self.pool(b, w) if not isinstance(a, fx.Node) else \
                self.pool(a, w) + self.pool(b, w)
        return self.pool(a, w) * b if node.target is operator.mul else self.pool(a, w) / b
