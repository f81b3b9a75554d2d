"""Following a user's encoder: its forward as a torch.fx graph, checked against what convert supports.

PyG's convolutions, ``HeteroConv`` and the per-node modules are leaves of the trace; the user's
own modules are traced through. Every refusal is a one-line :class:`ConvertError` (where, what,
why, what to do), raised before any sample is computed. Hand-written because a refusal must
name the module path and the line; no library turns an fx graph into that.
"""
from __future__ import annotations

import inspect
import operator
import traceback

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import (GATConv, GATv2Conv, GCNConv, GINConv, GraphConv, HeteroConv,
                                MessagePassing, SAGEConv, TransformerConv)
from torch_geometric.nn import MLP as PygMLP
from torch_geometric.nn import JumpingKnowledge
from torch_geometric.nn.dense.linear import Linear as PygLinear
from torch_geometric.nn.norm import BatchNorm as PygBatchNorm
from torch_geometric.nn.norm import GraphNorm
from torch_geometric.nn.norm import (DiffGroupNorm, GraphSizeNorm, HeteroBatchNorm,
                                     MeanSubtractionNorm, PairNorm)
from torch_geometric.nn.norm import InstanceNorm as PygInstanceNorm
from torch_geometric.nn.norm import LayerNorm as PygLayerNorm

from ..common.probes import is_probe


class ConvertError(ValueError):
    """A module or operation that :func:`~workbook_lib.nodemask.convert.convert` cannot make
    exact on a shared graph (a one-line message: where, what, why, what to do)."""


CONVS = (GINConv, GraphConv, SAGEConv, GCNConv)
ATTENTION = (GATConv, GATv2Conv, TransformerConv)
ACTIVATIONS = (nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.PReLU,
               nn.Softplus, nn.Mish, nn.Identity, nn.SELU, nn.CELU, nn.Hardtanh)
# per row only along the features: dim -1 (or 1, of [N, F]); nn.RMSNorm over one width (torch 2.4)
ALONG_FEATURES = (nn.Softmax, nn.LogSoftmax, nn.Softmin, nn.GLU)
RMS_NORM = (nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()
PER_NODE = (nn.Linear, PygLinear, nn.LayerNorm, nn.Dropout, nn.BatchNorm1d, PygBatchNorm,
            PygLayerNorm, PygMLP, nn.Sequential) + ACTIVATIONS + ALONG_FEATURES + RMS_NORM
KNOWN = ("Linear, activations, softmax or GLU over the features, LayerNorm, RMSNorm, eval "
         "BatchNorm, Dropout")
CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict, PygMLP, PygBatchNorm)
MODE_DEPENDENT = (nn.BatchNorm1d, nn.Dropout, PygMLP)  # per-node in eval mode only
# norms over many rows (PyG's over each graph's nodes: here a sample's genes); PyG's are refused
# as modules, where following their forward refused one of its operations, named by a torch line
ROW_MIXING = (GraphNorm, nn.BatchNorm2d, nn.InstanceNorm1d, nn.GroupNorm, PairNorm,
              MeanSubtractionNorm, DiffGroupNorm, PygInstanceNorm, GraphSizeNorm, HeteroBatchNorm)

# element-wise (per row) functions and methods
ELEMENTWISE_FUNCTIONS = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, torch.add,
    torch.sub, torch.mul, torch.div, torch.relu, torch.sigmoid, torch.tanh, torch.exp,
    torch.abs, F.relu, F.leaky_relu, F.elu, F.gelu, F.silu, F.sigmoid, F.tanh, F.softplus,
    F.mish, F.selu, F.dropout, F.normalize, F.layer_norm, F.linear, torch.cat, torch.concat,
    # found by a user trial, each refused as unknown though it acts on each row alone
    operator.gt, operator.lt, operator.ge, operator.le, operator.eq, operator.ne, operator.pow,
    torch.gt, torch.lt, torch.ge, torch.le, torch.eq, torch.ne, torch.where, torch.clamp,
    torch.clamp_min, torch.clamp_max, torch.clip, torch.minimum, torch.maximum, torch.pow,
    torch.sqrt, torch.rsqrt, torch.square, torch.log, torch.log1p, torch.expm1, torch.sin,
    torch.cos, torch.erf, torch.sign, torch.reciprocal, torch.detach, F.relu6, F.hardtanh,
    F.logsigmoid, F.softsign, F.hardswish, F.hardsigmoid, F.celu, F.prelu, F.tanhshrink,
    F.silu, F.gelu,
    # a review: masks combined element-wise ((h > 0) & (h < 1)), once refused as in-place
    operator.and_, operator.or_, operator.xor, operator.invert, torch.logical_and,
    torch.logical_or, torch.logical_xor, torch.logical_not}
ELEMENTWISE_METHODS = {"relu", "sigmoid", "tanh", "exp", "abs", "add", "sub", "mul", "div",
                       "neg", "__add__", "__mul__", "__sub__", "__truediv__", "__radd__",
                       "__rmul__", "__rsub__", "__rtruediv__", "__pow__", "pow", "sqrt",
                       "rsqrt", "square", "log", "log1p", "clamp", "clamp_min", "clamp_max",
                       "clip", "detach", "sign", "reciprocal", "masked_fill", "where",
                       "minimum", "maximum", "gt", "lt", "ge", "le", "eq", "ne", "float",
                       "double", "contiguous", "logical_and", "logical_or", "logical_xor",
                       "logical_not", "__and__", "__or__", "__xor__", "__invert__"}
# a matrix product is per row when only its left operand is per gene (``h @ W``)
MATMUL = {operator.matmul, torch.matmul, torch.mm}
# random draws: each sample's forward draws its own, where a conversion would draw once
RANDOM = {torch.rand, torch.randn, torch.randint, torch.rand_like, torch.randn_like,
          torch.randint_like, torch.bernoulli, torch.normal, torch.multinomial, torch.randperm,
          torch.poisson}
RANDOM_METHODS = {"bernoulli", "bernoulli_", "normal_", "uniform_", "random_",
                  "exponential_", "geometric_", "log_normal_", "cauchy_"}
# per row when their dim is the features' (-1, or 1 of an [N, F] value); a reduction only with
# keepdim=True (its [N, 1] then broadcasts row by row)
ALONG_FEATURES_FUNCTIONS = {F.softmax, F.log_softmax, torch.softmax, torch.log_softmax, F.glu}
ALONG_FEATURES_METHODS = {"softmax", "log_softmax"}
REDUCING_METHODS = {"mean", "sum", "amax", "amin", "max", "min"}
# .max(dim=...) and .min(dim=...) return (values, indices): read by [0], [1] or .values, .indices
PAIR_METHODS = {"max", "min"}
ROW_OPS = ("element-wise arithmetic and comparisons, where, clamp, activations, h @ W with a "
           "weight, a feature slice h[:, a:b], cat along the features, softmax or a keepdim "
           "reduction over the features, stack along a new last dim and a reduction over it")


class _Tracer(fx.Tracer):
    """Leaves: PyG message passing, HeteroConv, the per-node modules, the registered classes."""

    def __init__(self, register: dict):
        super().__init__()
        self.register = register
        self.record_stack_traces = True

    def is_leaf_module(self, m: nn.Module, name: str) -> bool:
        if isinstance(m, (MessagePassing, HeteroConv, GraphNorm) + PER_NODE + ROW_MIXING):
            return not (type(m) is nn.Sequential)
        if type(m) in self.register:
            return True
        return super().is_leaf_module(m, name)


def _library(frame: str) -> bool:
    return "/torch/" in frame or "/torch_geometric/" in frame


def user_line(stack: str | None, op: str | None = None) -> str:
    """``file:line`` of the innermost frame of ``stack`` outside PyTorch and PyG, or ``?``;
    followed by `` (inside f())`` where that line calls a PyTorch or PyG function ``f`` (not
    the operation ``op`` itself) that made the operation (``global_mean_pool``, say: the user
    did not write its ``.dim()``)."""
    if not stack:
        return "?"
    frames = [ln.strip() for ln in stack.splitlines() if ln.strip().startswith("File ")]
    for i in range(len(frames) - 1, -1, -1):
        fr = frames[i]
        if not _library(fr):
            parts = fr.split('"')
            rest = parts[2].split(",") if len(parts) > 2 else []
            where = f"{parts[1]}:{rest[1].strip().split()[-1]}" if len(rest) > 1 else fr
            inner = frames[i + 1] if i + 1 < len(frames) else ""
            name = inner.rsplit(" in ", 1)[1].strip() if " in " in inner else None
            if name and "/torch/fx/" not in inner and name != op:
                where += f" (inside {name}())"
            return where
    return "?"


# where PyG's poolings over nodes live (a trace stopped inside one: the encoder pools); the
# pool folder also holds graph builders (knn_graph...), which are not poolings: its glob.py only
GLOBAL_POOLS, AGGREGATIONS = "/torch_geometric/nn/pool/glob.py", "/torch_geometric/nn/aggr/"


def _users(filename: str) -> bool:
    """A frame of the user's code: not PyTorch's or PyG's (:func:`_library`), nor this
    module's."""
    return not _library(filename) and "convert_trace" not in filename


def _pooling(encoder: nn.Module, frames: list) -> str:
    """The PyG pooling over nodes the innermost user line called, from the frames below it
    (outermost first): ``global_mean_pool``, an aggregation module by class and path
    (``AttentionalAggregation (pool)``); "" where none of them is one."""
    paths = {id(m): p for p, m in encoder.named_modules()}
    for f in frames:
        name = f.f_code.co_filename
        if name.endswith(GLOBAL_POOLS) and f.f_code.co_name.startswith("global_"):
            return f.f_code.co_name
        if AGGREGATIONS in name:
            m = f.f_locals.get("self")
            if isinstance(m, nn.Module):
                return f"{type(m).__name__} ({paths.get(id(m), '?')})"
            return "aggregation module"
    return ""


def pools_message(what: str, where: str) -> str:
    """The refusal of a PyG pooling over the genes (``what``) inside the encoder, at ``where``."""
    return (f"PyG's {what} at {where} pools over the genes inside the encoder; convert takes an "
            "encoder that returns one row per gene, [N, H]: return the rows and pass the "
            "pooling to convert (readout=\"mean\", \"mean_kept\", \"sum_kept\" or an "
            "aggregation module, which stays yours)")


def trace(encoder: nn.Module, edge_keys: list | None, register: dict) -> fx.Graph:
    """The encoder's forward as an fx graph: ``encoder(x, edge_index)`` when ``edge_keys`` is None,
    else ``encoder(x, {key: edge_index})``, one placeholder per key. Raises ConvertError, naming the
    line, where the forward cannot be followed (control flow on a tensor's value, a data read)."""
    params = [p for p in inspect.signature(encoder.forward).parameters.values()]
    if len(params) < 2:
        raise ConvertError(f"{type(encoder).__name__}.forward takes {len(params)} argument(s); "
                           "convert needs forward(x, edge_index) or forward(x, edge_index_dict)")
    concrete = {} if edge_keys is None else {params[1].name: {k: fx.PH for k in edge_keys}}
    for p in params[2:]:  # convert calls forward(x, edges): a further argument at its default
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is p.empty:
            raise ConvertError(f"{type(encoder).__name__}.forward needs the argument "
                               f"{p.name!r}, which convert does not pass (it calls forward(x, "
                               "edges)); give it a default or set it on the module")
        concrete[p.name] = p.default
    before = _rng_states()
    try:
        graph = _Tracer(register).trace(encoder, concrete_args=concrete or None)
    except ConvertError:
        raise
    except KeyError as e:  # the forward reads an edge type the graph does not have
        raise ConvertError(f"the forward of {type(encoder).__name__} reads edge type "
                           f"{e.args[0]!r}, which the graph does not have (its keys: "
                           f"{list(edge_keys or [])}); key the graph as the forward reads it, "
                           "e.g. by PyG (src, rel, dst) tuples") from None
    except Exception as e:  # fx's TraceError, or a Proxy used as a value
        stack = list(traceback.walk_tb(e.__traceback__))  # (frame, line), outermost first
        user = [i for i, (f, _) in enumerate(stack) if _users(f.f_code.co_filename)]
        where = f"{stack[user[-1]][0].f_code.co_filename}:{stack[user[-1]][1]}" if user else "?"
        pooling = _pooling(encoder, [f for f, _ in stack[user[-1] + 1:]] if user else [])
        if pooling:  # a review: a PyG pooling in the encoder was told about its control flow
            raise ConvertError(pools_message(pooling, where)) from None
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        # control flow is fx's usual stop; others are a traced value used as a Python one (a
        # size to slice by, an edge utility's checks: found by a user trial, told 'control flow')
        iterated = "cannot be iterated" in msg
        # found by a user trial: PyG's idiom after a HeteroConv, {k: v.relu() for k, v in
        # h.items()}, was told about control flow in 599 characters
        fix = ("a HeteroConv's output dict (or a tensor) cannot be iterated where convert "
               "follows the forward: index it by its keys instead (h = {'gene': "
               "h['gene'].relu()})"
               if iterated else
               "write it without control flow on tensor values or shapes (a width known when "
               "the module is built: decide it in __init__)" if "control flow" in msg else
               "write it without using a tensor's values or sizes as Python values there (a "
               "size such as h.size(0) or x.shape[0]: a count known when the module is built, "
               "fixed in __init__)")
        if iterated:
            msg = "a traced value is iterated"
        raise ConvertError(f"the forward of {type(encoder).__name__} cannot be followed at "
                           f"{where} ({msg}): {fix} (fx-traceable), or use the masked-copies "
                           "model") from None
    if _drew(before, _rng_states()):  # a draw of a fixed size runs once, at the trace: its
        _restore_rng(before)  # values baked in, where each sample's forward draws afresh
        raise ConvertError(f"the forward of {type(encoder).__name__} draws random numbers (a "
                           "torch.randn of a fixed size, an init in forward), which each "
                           "sample's forward draws afresh and a conversion would draw once; "
                           "draw them outside the encoder and pass them in, or keep the masked "
                           "copies")
    _drop_guards(graph, {p.name for p in params[2:]})
    return graph


def _drop_guards(graph: fx.Graph, names: set) -> None:
    """Remove the placeholders fx keeps for arguments traced at a fixed value (``names``) and the
    checks it adds on them (``x == value``, ``torch._assert``): the forward used the value."""
    for node in list(graph.nodes):
        if node.op != "placeholder" or not any(_named_for(str(node.target), n) for n in names):
            continue
        doomed, todo = [], [node]
        while todo:
            n = todo.pop()
            doomed.append(n)
            todo.extend(n.users)
        for n in reversed(list(dict.fromkeys(doomed))):
            if not n.users:
                graph.erase_node(n)


def conv_kind(m: nn.Module, path: str, register: dict) -> type:
    """The supported convolution class ``m`` computes as (its class, or the registered one).
    Raises ConvertError for attention, unregistered message passing, a cached GCN, an unsupported
    aggregation, edge features or a projecting SAGE."""
    cls = type(m)
    kind = register.get(cls, cls if cls in CONVS else None)
    if kind is None:
        if isinstance(m, ATTENTION):
            raise ConvertError(f"{path} ({cls.__name__}): attention normalizes over each row's "
                               "in-edges with a softmax, which convert does not recompute; use "
                               "GINConv, GraphConv, SAGEConv or GCNConv, or the masked copies")
        sup = next((c for c in CONVS if isinstance(m, c)), None)
        if sup is not None:
            raise ConvertError(f"{path} ({cls.__name__}): a subclass of {sup.__name__} whose "
                               "forward may differ; if it computes the same, pass "
                               f"register={{{cls.__name__}: {sup.__name__}}}")
        if "edge_attr" in inspect.signature(m.forward).parameters:
            raise ConvertError(f"{path} ({cls.__name__}): not a supported convolution, and one "
                               "that takes edge features (edge_attr), which convert does not "
                               "support; use GINConv, GraphConv, SAGEConv or GCNConv without "
                               "them, or the masked copies")
        raise ConvertError(f"{path} ({cls.__name__}): not a supported convolution; use GINConv, "
                           "GraphConv, SAGEConv or GCNConv, or register a subclass of one that "
                           "computes as it")
    aggr = getattr(m, "aggr", None)
    if kind is GCNConv:
        if m.cached:
            raise ConvertError(f"{path} (GCNConv): cached=True keeps one graph's normalization, "
                               "but every sample's degrees differ; build it with cached=False")
    elif aggr not in ("add", "sum", "mean"):
        raise ConvertError(f"{path} ({cls.__name__}): aggregation {aggr!r} is not a sum or "
                           "mean (max, min, LSTM and softmax are refused); use aggr='sum' or "
                           "'mean'")
    if kind is SAGEConv and m.project:
        raise ConvertError(f"{path} (SAGEConv): project=True is not supported; build it with "
                           "project=False")
    if kind is GINConv:
        per_node_problem(m.nn, f"{path}.nn", at_convert=True)
    return kind


def per_node_problem(m: nn.Module, path: str, *, at_convert: bool) -> None:
    """Refuse ``m`` (ConvertError) unless it acts on each row alone, in its current mode unless
    ``at_convert``, or if convert cannot see inside it."""
    for name, sub in m.named_modules(prefix=path):
        if isinstance(sub, (GraphNorm,) + ROW_MIXING) or (
                isinstance(sub, PygLayerNorm) and sub.mode != "node"):
            raise ConvertError(f"{name} ({type(sub).__name__}): normalizes over many rows, so "
                               "one sample's output would depend on its other genes and batch "
                               "mates; use nn.LayerNorm or PyG LayerNorm(mode='node')"
                               + (" (in PyG's basic models: norm='layer_norm', "
                                  "norm_kwargs={'mode': 'node'})"
                                  if isinstance(sub, PygLayerNorm) else ""))
        if isinstance(sub, ALONG_FEATURES) and sub.dim not in (-1, 1):
            raise ConvertError(f"{name} ({type(sub).__name__}): dim={sub.dim} is not the "
                               "features' dimension, so it would mix genes (dim=None picks one "
                               "from the input's shape); pass dim=-1")
        if isinstance(sub, (nn.LayerNorm,) + RMS_NORM) and len(sub.normalized_shape) > 1:
            raise ConvertError(f"{name} ({type(sub).__name__}): normalized_shape "
                               f"{tuple(sub.normalized_shape)} spans more than the features, so "
                               "it normalizes across genes and one sample's output would depend "
                               "on its other genes; normalize over the features "
                               f"({type(sub).__name__}(hidden))")
        if isinstance(sub, nn.BatchNorm1d) and sub.running_mean is None:  # found by a user trial
            raise ConvertError(f"{name} (BatchNorm1d): without running statistics "
                               "(track_running_stats=False) it normalizes with the batch's "
                               "statistics in eval mode too, so one sample's output depends on "
                               "its batch mates; build it with track_running_stats=True, or use "
                               "nn.LayerNorm")
        if isinstance(sub, nn.BatchNorm1d) and sub.training and not at_convert:
            raise ConvertError(f"{name} (BatchNorm1d): in train mode it normalizes with the "
                               "batch's statistics, so one sample's output depends on its batch "
                               "mates; call encoder.eval(), or use nn.LayerNorm")
        if not at_convert and sub.training and (
                (isinstance(sub, nn.Dropout) and sub.p > 0)
                or (isinstance(sub, PygMLP) and any(p > 0 for p in sub.dropout))):
            raise ConvertError(f"{name} ({type(sub).__name__}): dropout p>0 in train mode draws "
                               "a different mask per sample; set p=0 or call encoder.eval()")
        if list(sub.children()):
            if not isinstance(sub, CONTAINERS):
                raise ConvertError(f"{name} ({type(sub).__name__}): convert cannot see that this "
                                   "module acts on each row alone; build it from nn.Sequential "
                                   "or PyG MLP of Linear, activations and norms")
        elif not isinstance(sub, PER_NODE):
            raise ConvertError(f"{name} ({type(sub).__name__}): not a per-node module convert "
                               f"knows ({KNOWN})")


def check_hetero(m: HeteroConv, path: str, register: dict) -> dict:
    """``{edge type: supported conv class}`` of a ``HeteroConv``; ConvertError for an aggregation
    other than sum, mean or cat, or an unsupported conv."""
    if m.aggr not in ("sum", "mean", "cat"):
        raise ConvertError(f"{path} (HeteroConv): aggr={m.aggr!r} is not sum, mean or cat; "
                           "build it with one of those")
    return {et: conv_kind(c, f"{path}[{', '.join(et)}]", register)
            for et, c in m.convs.items()}


def node_where(node: fx.Node) -> str:
    """The user's line of an fx node (for messages)."""
    return user_line(node.meta.get("stack_trace") or getattr(node, "stack_trace", None),
                     node.target if isinstance(node.target, str) else
                     getattr(node.target, "__name__", None))


def _given(node: fx.Node) -> int:
    """A call's arguments that are not None (PyG's GCN passes ``edge_weight=None``: found by a
    user trial, refused as edge weights)."""
    return sum(a is not None for a in (*node.args, *node.kwargs.values()))


def check_graph(graph: fx.Graph, encoder: nn.Module, register: dict,
                typed: bool = False) -> None:
    """Raise ConvertError at the first node convert cannot make exact (:func:`conv_kind`,
    :func:`per_node_problem`), naming its module path or line. ``typed``: the graph is a dict
    of edge types (a conv given the whole dict is refused)."""
    modules = dict(encoder.named_modules())
    params = list(inspect.signature(encoder.forward).parameters)
    edges = _reads_edges(graph, params[1]) if len(params) > 1 else set()
    genes = _per_gene(graph, params[0])
    nodes = sorted(graph.nodes, key=lambda nd: nd.op != "call_module")  # modules first
    for node in nodes:
        if node.op in ("call_function", "call_method") and node not in edges and \
                node not in genes and node.target not in RANDOM | RANDOM_METHODS:
            continue  # computed from weights and constants alone: the same for every sample
        if node.op in ("call_function", "call_method") and node not in edges:
            _x_as_dict(node, params[0])
            _per_row_call(node, genes)
        if node.op == "call_module":
            m, path = modules[node.target], node.target
            if isinstance(m, HeteroConv):
                check_hetero(m, path, register)
                if _given(node) > 2:
                    raise ConvertError(f"{path} (HeteroConv) is called with edge features at "
                                       f"{node_where(node)}; convert supports "
                                       "conv(x_dict, edge_index_dict) only")
            elif isinstance(m, MessagePassing) or type(m) in register:
                conv_kind(m, path, register)
                if typed and len(node.args) > 1 and isinstance(node.args[1], dict):
                    raise ConvertError(f"{path} ({type(m).__name__}) is given the whole dict of "
                                       f"edge types at {node_where(node)}; a conv takes one "
                                       "type's edge_index: index the dict by edge type, or "
                                       "wrap the conv in a HeteroConv")
                if _given(node) > 2:
                    raise ConvertError(f"{path} ({type(m).__name__}) is called with edge "
                                       "features or weights at " + node_where(node) + "; convert "
                                       "supports conv(x, edge_index) only")
            else:
                _jk_lstm(modules, path)
                per_node_problem(m, path, at_convert=True)
        elif node in edges:
            what = node.target if node.op == "call_method" else \
                getattr(node.target, "__name__", node.target)
            raise ConvertError(f"{what} at {node_where(node)} reads or changes the graph's "
                               "edges; convert needs each conv to receive the graph as given "
                               "(it drops each sample's edges from 'deleted'): move edge "
                               "changes out of the encoder")
        elif node.op == "call_function":
            if node.target is operator.getitem and isinstance(node.args[1], str):
                continue  # a HeteroConv output's node type
            if _pair_part(node):
                continue  # .max(dim=-1)[0]: the reduction's values (or indices), per row
            if node.target is torch.stack:
                _stack_dim(node)
                continue
            if node.target is F.normalize:  # per row only along the features
                dim = node.kwargs.get("dim", node.args[2] if len(node.args) > 2 else 1)
                if dim not in (1, -1):
                    raise ConvertError(f"F.normalize at {node_where(node)} normalizes over dim "
                                       f"{dim}, across genes, so one sample's output would "
                                       "depend on its other genes; normalize over the features "
                                       "(dim=-1) or move it out of the encoder")
            if node.target is F.layer_norm:  # per row only over the features alone
                shape = node.kwargs.get("normalized_shape",
                                        node.args[1] if len(node.args) > 1 else None)
                if not isinstance(shape, int) and not (
                        isinstance(shape, (tuple, list)) and len(shape) == 1):
                    raise ConvertError(f"F.layer_norm at {node_where(node)} normalizes over "
                                       f"{shape!r}, not one fixed feature width, so it may "
                                       "normalize across genes; pass normalized_shape=(hidden,)"
                                       " or use nn.LayerNorm(hidden)")
            if node.target in ALONG_FEATURES_FUNCTIONS:
                _along_features(node, op_name(node),
                                default=-1 if node.target is F.glu else None)
                continue
            if node.target not in ELEMENTWISE_FUNCTIONS | MATMUL and \
                    not _feature_slice(node):
                what = op_name(node)
                _refuse_in_library(node, what)
                raise ConvertError(f"{what} at {node_where(node)} is not a per-row operation "
                                   f"convert knows ({ROW_OPS}): write that part with those, or "
                                   "keep the masked copies")
        elif node.op == "call_method" and node.target in PAIR_METHODS and \
                len(node.args) > 1 and isinstance(node.args[1], fx.Node) and \
                "dim" not in node.kwargs:
            continue  # h.max(other): element-wise, as torch.maximum (a review)
        elif node.op == "call_method" and node.target in ALONG_FEATURES_METHODS | \
                REDUCING_METHODS:
            # over a stack's new last dim a reduction is per row without keepdim (JK "max")
            _along_features(node, op_name(node), default=None,
                            keepdim=node.target in REDUCING_METHODS, stacked=of_stack(node))
        elif node.op == "call_method" and node.target not in ELEMENTWISE_METHODS:
            _refuse_in_library(node, op_name(node))
            raise ConvertError(f"{op_name(node)} at {node_where(node)} is not a per-row "
                               f"operation convert knows ({ROW_OPS}): write that part with "
                               "those, or keep the masked copies")


def _jk_lstm(modules: dict, path: str) -> None:
    """ConvertError naming PyG's ``JumpingKnowledge(mode="lstm")`` where the module refused is
    its LSTM or attention (a user trial was told 'jk.lstm (LSTM): not a per-node module')."""
    parent = path.rsplit(".", 1)[0] if "." in path else ""
    jk = modules.get(parent)
    if isinstance(jk, JumpingKnowledge) and jk.mode == "lstm":
        raise ConvertError(f"{parent} (JumpingKnowledge, mode='lstm'): its LSTM over each "
                           "gene's layer outputs is not a module convert follows; use "
                           "mode='cat' or 'max' (jk='cat' or jk='max' in PyG's basic models), "
                           "which convert")


def _x_as_dict(node: fx.Node, x_arg: str) -> None:
    """ConvertError for a forward that reads its first argument as a dict of node types'
    features (``x_dict["gene"]``, ``x_dict.get("gene")``: a module ``to_hetero`` returns, passed
    as it is; a user trial was told '.get() ... is not a per-row operation'), where convert
    passes ``x`` itself."""
    src = node.args[0] if node.args else None
    if not (isinstance(src, fx.Node) and src.op == "placeholder" and
            _named_for(str(src.target), x_arg)):
        return
    if (node.op == "call_method" and node.target in ("get", "items", "keys", "values")) or \
            (node.target is operator.getitem and isinstance(node.args[1], str)):
        raise ConvertError(
            f"the encoder reads its first argument as a dict of node features "
            f"({op_name(node)} at {node_where(node)}), but convert passes x itself, [N, F]: "
            "wrap it in a module whose forward(x, edge_index_dict) returns "
            "self.net({'gene': x}, edge_index_dict)['gene'] (docs/fix-api.md: an encoder "
            "written on dicts, such as to_hetero's)")


def call_dim(node: fx.Node, default):
    """A call's ``dim``: by keyword, else its second argument (after the tensor, for a function
    and a method alike), else ``default``."""
    return node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else default)


def of_stack(node: fx.Node) -> bool:
    """A call on the result of ``torch.stack`` (a value ``[N, F, L]`` where the stack is along a
    new last dim, as PyG's ``JumpingKnowledge("max")`` makes: the run checks the shapes)."""
    src = node.args[0] if node.args else None
    return isinstance(src, fx.Node) and src.op == "call_function" and src.target is torch.stack


def _pair_part(node: fx.Node) -> bool:
    """``r[0]``, ``r[1]``, ``r.values`` or ``r.indices`` of ``r = h.max(dim=...)`` (or
    ``.min``): one part of a per-row reduction's result."""
    src = node.args[0] if node.args else None
    if not (isinstance(src, fx.Node) and src.op == "call_method" and
            src.target in PAIR_METHODS):
        return False
    return (node.target is operator.getitem and node.args[1:2] in ((0,), (1,))) or (
        node.target is getattr and node.args[1:2] in (("values",), ("indices",)))


def _stack_dim(node: fx.Node) -> None:
    """ConvertError for ``torch.stack`` along the genes' dim (0, its default): per row along
    any other (the run checks a negative one against the value's rank)."""
    dim = call_dim(node, 0)
    if dim == 0:
        _refuse_in_library(node, "torch.stack")
        raise ConvertError(f"torch.stack at {node_where(node)} stacks along dim 0, the genes', "
                           "so its rows are not the genes; stack along a new last dim "
                           "(dim=-1) or move it out of the encoder")


def _rng_states() -> list:
    """torch's generators' states: the CPU's, and each CUDA device's where CUDA is in use."""
    states = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states += torch.cuda.get_rng_state_all()
    return [bytes(t.numpy()) for t in states]


def _drew(before: list, after: list) -> bool:
    """Whether a generator's state moved: the CPU's, and CUDA's where both readings have them
    (a trace that merely initialised CUDA is no draw: a review)."""
    if before[0] != after[0]:
        return True
    return len(before) == len(after) and before != after


def _restore_rng(states: list) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(states[0]), dtype=torch.uint8))
    if len(states) > 1:
        torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(b), dtype=torch.uint8)
                                      for b in states[1:]])


def _per_gene(graph: fx.Graph, x_arg: str) -> set:
    """The nodes whose value derives from the forward's first argument (the genes' features):
    what differs from sample to sample."""
    found: set = set()
    for node in graph.nodes:
        if (node.op == "placeholder" and _named_for(str(node.target), x_arg)) or any(
                a in found for a in node.all_input_nodes):
            found.add(node)
    return found


def _per_row_call(node: fx.Node, genes: set) -> None:
    """ConvertError for a call on per-gene values that is not per row whatever the rest of the
    checks say: a random draw, an in-place method, a size read, a matrix product whose right
    operand is per gene; returns for a feature slice ``h[:, a:b]`` (accepted here)."""
    what, where = op_name(node), node_where(node)
    if node.target in RANDOM | RANDOM_METHODS:
        raise ConvertError(f"{what} at {where} draws random numbers, which each sample's forward "
                           "draws afresh and a conversion would draw once; draw them outside "
                           "the encoder and pass them in, or keep the masked copies")
    if "(inside " in where and node.op == "call_method":
        return  # a library function's own call (global_mean_pool's .dim()): the function is
        # what the user wrote, named by the message of the checks that follow
    if node.op == "call_method" and node.target in ("size", "shape", "dim", "numel") or \
            (node.op == "call_function" and node.target is getattr and
             node.args[1:2] == ("shape",)):
        raise ConvertError(f"{what} at {where} reads a per-gene value's size, which the "
                           "conversion computes on the rows a deletion changes, not on all the "
                           "genes; use a number fixed when the module is built (its __init__)")
    fix = _out_of_place(node)
    if fix:
        raise ConvertError(f"{what} at {where} changes a per-gene value in place, which the "
                           f"conversion shares between samples; use its out-of-place form ({fix})")
    if node.kwargs.get("inplace") is True or node.kwargs.get("out") is not None:
        raise ConvertError(f"{what} at {where} writes into a tensor (inplace=True or out=), "
                           "which the conversion shares between samples; use its out-of-place "
                           "form")
    if node.target in MATMUL or node.target is F.linear:  # positional or by keyword (a
        left = node.args[0] if node.args else node.kwargs.get("input")  # review: input=...)
        right = node.args[1] if len(node.args) > 1 else node.kwargs.get(
            "other", node.kwargs.get("mat2", node.kwargs.get("weight")))
        if right in genes or left not in genes:
            raise ConvertError(f"{what} at {where} multiplies by a per-gene value on its "
                               "right, which mixes genes; a product is per row only as h @ W "
                               "with a weight W (or use nn.Linear)")


def _out_of_place(node: fx.Node) -> str:
    """The out-of-place form of an in-place call (``.relu()`` for ``h.relu_()``, ``torch.relu(...)``
    for ``torch.relu_(h)``: a user trial), or "" for any other call. A function's name ending in
    ``_`` is in place only where torch or F has it without (``operator.and_`` is ``&``: a
    review); named ``F.`` where only F has it (``F.leaky_relu_`` is torch._C._nn's: a review)."""
    if node.op == "call_method":
        t = str(node.target)
        return f".{t[:-1]}()" if t.endswith("_") and not t.startswith("__") else ""
    name = getattr(node.target, "__name__", "") if node.op == "call_function" else ""
    base = name[:-1]
    if not name.endswith("_") or name.startswith("_") or not node.args or \
            not isinstance(node.args[0], fx.Node) or not (hasattr(torch, base) or
                                                          hasattr(F, base)):
        return ""
    return f"{'F' if hasattr(F, base) and not hasattr(torch, base) else 'torch'}.{base}(...)"


def _feature_slice(node: fx.Node) -> bool:
    """``h[:, a:b]``, ``h[..., k]``: an index that keeps every row and selects only along the
    features (no tensor index)."""
    if node.target is not operator.getitem or len(node.args) < 2:
        return False
    idx = node.args[1]
    if not isinstance(idx, tuple) or len(idx) != 2 or any(isinstance(i, fx.Node) for i in idx):
        return False
    rows, cols = idx
    whole = rows is Ellipsis or (isinstance(rows, slice) and rows == slice(None))
    return whole and (isinstance(cols, (int, slice)) and not (
        isinstance(cols, slice) and any(isinstance(v, fx.Node)
                                        for v in (cols.start, cols.stop, cols.step))))


def op_name(node: fx.Node) -> str:
    """A call's name as messages give it: ``.mean()`` for a method, ``softmax`` for a
    function."""
    return f".{node.target}()" if node.op == "call_method" else \
        getattr(node.target, "__name__", str(node.target))


def along_features(node: fx.Node) -> bool:
    """A call that convert follows along the features' dim (:func:`_along_features`): per row
    only on an ``[N, F]`` value, which the run checks."""
    return (node.op == "call_function" and node.target in ALONG_FEATURES_FUNCTIONS) or (
        node.op == "call_method" and node.target in ALONG_FEATURES_METHODS | REDUCING_METHODS)


def _along_features(node: fx.Node, what: str, default, keepdim: bool = False,
                    stacked: bool = False) -> None:
    """ConvertError unless the call's ``dim`` (its second argument, after the tensor, for a
    function and a method alike) is the features', and, for a reduction, ``keepdim=True`` (its
    third). On a stack's value (``stacked``) any dim but the genes' (0) is per row, with or
    without keepdim (a negative one is checked against the rank at the call)."""
    dim = call_dim(node, default)
    kept = node.kwargs.get("keepdim", node.args[2] if len(node.args) > 2 else False)
    if stacked and isinstance(dim, int) and dim != 0:
        return
    if dim not in (-1, 1) or (keepdim and kept is not True):
        _refuse_in_library(node, what)
        need = "dim=-1, keepdim=True" if keepdim else "dim=-1"
        why = (f"with dim={dim!r} is not over each row's features alone, so it may mix genes"
               if dim not in (-1, 1) else "without keepdim=True makes a value convert cannot "
               "follow row by row")
        raise ConvertError(f"{what} at {node_where(node)} {why}; pass {need}, or move it out of "
                           "the encoder")


def _refuse_in_library(node: fx.Node, what: str) -> None:
    """Name the module, where an operation convert refuses was made by the forward of a PyTorch
    or PyG module the trace followed (its line is inside the library; the module is what the
    user wrote): ConvertError, or nothing if the user's own code made it. A PyG global pooling
    over the genes (``global_mean_pool``) is told as one: convert takes the encoder's rows and
    pools them itself (``readout=``; an aggregation module stops the trace, in :func:`trace`)."""
    where = node_where(node)
    inside = where.split(" (inside ", 1)[1][:-3] if " (inside " in where else ""
    if inside.startswith("global_") and inside.endswith("_pool"):  # a review: the message
        raise ConvertError(pools_message(inside, where.split(" (inside ")[0]))  # named
        # global_mean_pool's own .dim()
    stack = list((node.meta.get("nn_module_stack") or {}).values())
    for path, cls in reversed(stack):  # innermost first
        if not isinstance(cls, type) or issubclass(cls, (nn.Sequential, nn.ModuleList,
                                                          nn.ModuleDict)):
            continue  # a container holds the module that made it (a review: blamed)
        if cls.__module__.split(".")[0] not in ("torch", "torch_geometric"):
            return  # the user's own module: its line is the user's
        raise ConvertError(f"{path} ({cls.__name__}): not a per-node module convert knows "
                           f"({KNOWN}): its forward computes {what}, which convert cannot see "
                           "acts on each row alone; move it out of the encoder, or build that "
                           "part from those modules")


def _named_for(target: str, arg: str) -> bool:
    """Whether a placeholder's name is the forward argument ``arg``'s (fx numbers the ones it
    makes for a dict's keys or a fixed value: ``arg_1``...)."""
    return target == arg or (target.startswith(arg + "_") and target[len(arg) + 1:].isdigit())


def _reads_edges(graph: fx.Graph, edge_arg: str) -> set:
    """The function and method calls whose inputs derive from the forward's edge argument
    ``edge_arg`` (its placeholder, or one per key of a dict: ``edge_arg_1``...): operations on
    the graph, not on features (a conv's output is features; a further argument is neither)."""
    found: set = set()
    for node in graph.nodes:
        if node.op == "placeholder":
            if _named_for(str(node.target), edge_arg):
                found.add(node)
        elif node.op in ("call_function", "call_method") and any(
                a in found for a in node.all_input_nodes):
            found.add(node)
    return {nd for nd in found if nd.op != "placeholder"}


def hooks_of(m: nn.Module) -> list[str]:
    """The kinds of call hooks registered on ``m`` ("forward hook", "forward pre-hook",
    "backward hook", PyG's "propagate forward hook", ...), from its ``_*_hooks`` dicts; not
    its state-dict hooks, nor the workbook's own measuring hooks (:mod:`..common.probes`)."""
    out = []
    for name, v in vars(m).items():
        if name.startswith("_") and name.endswith("_hooks") and "state_dict" not in name and \
                isinstance(v, dict) and any(not is_probe(h) for h in v.values()):
            words = name[1:-len("_hooks")].replace("_", " ")
            out.append(words[:-len(" pre")] + " pre-hook" if words.endswith(" pre") else
                       words + " hook")
    return out


def refuse_hooks(m: nn.Module, path: str, followed: bool = False) -> None:
    """ConvertError where a module the converted form does not call has a call hook (it would
    be skipped, or run as it was when traced: silently wrong where it changes the output).
    ``followed``: the trace followed its forward (the encoder, a module of the user's own);
    else the conversion computes it from its weights."""
    kinds = hooks_of(m)
    if kinds:
        where = f"{path} ({type(m).__name__})" if path else f"the encoder ({type(m).__name__})"
        why = ("it follows the module's forward without calling the module" if followed else
               "it computes this module from its weights without calling it")
        raise ConvertError(f"{where} has a {' and a '.join(sorted(set(kinds)))}, which the "
                           f"converted form would not run ({why}); remove the hook, or apply "
                           "what it does outside the encoder (the legacy "
                           "torch.nn.utils.weight_norm and spectral_norm are such hooks)")
