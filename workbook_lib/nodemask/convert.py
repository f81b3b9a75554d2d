"""convert: a user's PyG encoder, run exactly on one shared graph with per-sample deleted genes.

``fast = convert(encoder, graph)``; ``fast(x, deleted)`` is, per sample ``b``,
``encoder(x_b, graph_b)`` (see :func:`convert`). The wildtype is computed once per call; per
sample, each layer recomputes only its changed rows (flattened over the batch as (sample, gene)
pairs): their wildtype aggregation plus what the changed inputs push along their out-edges (GCN,
whose scale is per edge, pulls each changed row's in-edges), or takes the dense form (every
sample in one product) when counted work says so. Modules after the last nonlinearity before a
weighted-sum readout are pooled (:mod:`.convert_pool`). Rows are planned on the host from
``deleted``, so a CUDA call reads nothing back.

Hand-written (per-row forms of GIN, GraphConv, SAGE and GCN) because PyG computes every row of a
graph, and the exact changed rows of a deletion are this library's subject.
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import operator
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GCNConv, GINConv, GraphConv, HeteroConv, MessagePassing, SAGEConv
from torch_geometric.nn.aggr import Aggregation
from torch_geometric.nn.dense.linear import Linear as PygLinear

from ..common.host import cache_blocks, host_side
from ..results.floor import ConvertFloor, FloorPart
from .batch import DeltaFeatures, NodeMaskBatch
from .delta import push, push_pooled
from .convert_pool import POOLED_READOUTS, Pooler, output_value, tail_nodes
from .convert_trace import (MATMUL, MODE_DEPENDENT, ConvertError, along_features, call_dim,
                            check_graph, conv_kind, node_where, of_stack, op_name,
                            per_node_problem, refuse_hooks, trace)
from .chunks import (PickChunks, chunkable_readout, chunked_readout, may_chunk, per_row,
                     row_function, sample_chunks)
from .compiled import kernels
from .convert_dense import (DeltaGinSum, DenseGinSum, GinMlp, block_product, block_rows,
                            block_size, gin_mlp)
from .convert_typed import identity_gin, type_order, typed_layers
from .corrections import corrections, validate_deleted
from .floor import _dense, _sparse
from .kernels import csr_index_dtype
from .graph import SharedGraph
from .workers import spread, watched, workers
from .workspace import Workspace, take
from . import parts as _parts
from .parts import timed_function

READOUTS = ("mean", "mean_kept", "sum_kept")
# a layer takes the dense form when its delta form's counted work (edges read plus rows
# computed) exceeds this share of the dense form's: the delta form's entries are scattered over
# a table and each changed row adds a gather, where the dense form is one wide product
DENSE_SHARE = 0.5
# plans started by plan_ahead and not yet used, at most
AHEAD = 4


@dataclass
class _Edges:
    """One edge type on the host: in-edges grouped by target, out-edges grouped by source."""

    key: object
    index: torch.Tensor  # [2, E] as given
    in_ptr: torch.Tensor
    in_src: torch.Tensor
    out_ptr: torch.Tensor
    out_dst: torch.Tensor
    deg: torch.Tensor  # [N] in-degree
    num_nodes: int
    loop: torch.Tensor | None = None  # [N] bool: the gene has a self-loop
    repeated_loop: int = -1  # a gene whose self-loop is there more than once (-1: none)

    @classmethod
    def of(cls, key, index: torch.Tensor, n: int) -> "_Edges":
        """Args: key: the edge type; index: [2, E]; n: genes."""
        if index.dim() != 2 or index.shape[0] != 2:
            raise ValueError(f"edge_index of {key!r} must be [2, E] (got {list(index.shape)})")
        ei = index.detach().long().cpu()
        if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
            raise ValueError(f"edge_index of {key!r} has node ids outside 0..{n - 1}")
        src, dst = ei[0], ei[1]
        o_in, o_out = torch.argsort(dst, stable=True), torch.argsort(src, stable=True)
        deg = torch.bincount(dst, minlength=n)
        loop = torch.zeros(n, dtype=torch.bool)
        loops = torch.bincount(src[src == dst], minlength=n)
        loop[loops > 0] = True
        repeated = int(loops.argmax()) if n and int(loops.max()) > 1 else -1
        return cls(key, index, _ptr(deg), src[o_in], _ptr(torch.bincount(src, minlength=n)),
                   dst[o_out], deg, n, loop, repeated)

    def receivers(self, flat: torch.Tensor) -> torch.Tensor:
        """Flat (sample, gene) ``b*N + n`` of every out-neighbour of the rows ``flat``."""
        n = self.num_nodes
        f = flat.numpy()
        nbr, owner = _expand(self.out_ptr, torch.from_numpy(f % n))
        return torch.from_numpy((f // n)[owner.numpy()] * n + self.out_dst.numpy()[nbr.numpy()])

    def lost(self, keep: torch.Tensor) -> torch.Tensor:
        """``[B, N]``: in-edges each gene loses per sample (sources deleted there)."""
        b, n = keep.shape
        gone = (~keep).view(-1).nonzero().flatten()
        recv = self.receivers(gone)
        return torch.bincount(recv, minlength=b * n).view(b, n)


def _reach(e: _Edges, rows: torch.Tensor, flat: torch.Tensor,
           lowered: torch.Tensor | None) -> torch.Tensor:
    """``[B, N]``: ``rows`` and the receivers of its rows ``flat`` (and of ``lowered``), marked
    by a compiled pass over their out-edges (the list of receivers is as long as the edges read:
    about 15 million for a TorchCell-shaped second layer at the real spec)."""
    b, n = rows.shape
    out = rows.clone().view(-1)
    mark = kernels().mark_receivers
    args = (e.out_ptr.numpy(), e.out_dst.numpy(), n, out.numpy())
    mark(flat.numpy(), *args)
    if lowered is not None:
        mark(lowered.numpy(), *args)
    return out.view(b, n)


def _refuse_repeated_loops(e: _Edges, path: str) -> None:
    """ConvertError where a gene has its self-loop more than once on a GCN's edge type: PyG's
    ``gcn_norm`` (``add_remaining_self_loops``) keeps one of them, which the conversion, summing
    every edge, does not (found by a review: 0.083 off PyG)."""
    if e.repeated_loop >= 0:
        where = "" if e.key is None else f" on edge type {e.key!r}"
        raise ConvertError(f"{path} (GCNConv): gene {e.repeated_loop} has its self-loop more "
                           f"than once{where}; PyG's GCN keeps one (add_remaining_self_loops) "
                           "while every other conv sums them all: drop the repeated self-loops "
                           "(torch_geometric.utils.coalesce), or use add_self_loops=False")


_GCN_FILL: dict = {}


def gcn_fill(m: nn.Module) -> float:
    """The weight of the self-loop PyG's ``gcn_norm`` adds to a gene without one, for this GCN's
    flags: 0 without ``add_self_loops``; else read once from ``gcn_norm`` itself on a two-gene
    graph (without edge weights, PyG adds loops of weight 1 even with ``improved=True``, in the
    versions this was written against; reading it keeps convert equal to the installed PyG)."""
    if not m.add_self_loops:
        return 0.0
    if m.improved not in _GCN_FILL:
        from torch_geometric.nn.conv.gcn_conv import gcn_norm
        ei, w = gcn_norm(torch.tensor([[0], [1]]), None, 2, improved=bool(m.improved),
                         add_self_loops=True, dtype=torch.float64)
        loop1 = float(w[(ei[0] == 1) & (ei[1] == 1)][0])  # = fill / (1 + fill)
        _GCN_FILL[m.improved] = loop1 / (1.0 - loop1)
    return _GCN_FILL[m.improved]


def _inv_sqrt(d: torch.Tensor) -> torch.Tensor:
    """``d^-1/2``, 0 where ``d`` is 0 (PyG's GCN normalization)."""
    return torch.where(d > 0, d.clamp(min=1e-300).pow(-0.5), torch.zeros_like(d))


def _kept_out(plan, e: _Edges) -> np.ndarray:
    """``[B, N]``: each gene's out-edges to kept genes per sample on ``e`` (once per type)."""
    key = ("kept_out", e.key)
    if key not in plan.index:
        b, n = plan.keep.shape
        gone = (~plan.keep).view(-1).nonzero().flatten().numpy()
        pos, owner = (t.numpy() for t in _expand(e.in_ptr, torch.from_numpy(gone % n)))
        lost = np.bincount((gone // n)[owner] * n + e.in_src.numpy()[pos], minlength=b * n)
        outdeg = np.diff(e.out_ptr.numpy())
        plan.index[key] = (outdeg[None, :] - lost.reshape(b, n))
    return plan.index[key]


# At most this many threads build one push (each a run of whole samples; see push_block).
PUSH_PARTS = 8
_PUSH_POOL: list = [None, None]  # the executor, and the process that made it
_PUSH_LOCK = threading.Lock()


def _push_parts(batch: int) -> int:
    """Runs a push is built in: PyTorch's thread count, at most :data:`PUSH_PARTS` and one
    per sample. On the 2-core CPU at the real spec, a TorchCell-shaped plan's pushes took
    0.165 s of its 0.31 s in one part."""
    return max(1, min(torch.get_num_threads(), PUSH_PARTS, batch))


def _push_pool(parts: int):
    """The threads a push's runs after the first go to: one pool for the process, made at the
    first ask under a lock, with :data:`PUSH_PARTS` - 1 threads at most (started as runs come;
    never shut down, so a plan in another thread never finds its pool gone; a forked process,
    a data loader's worker, makes its own: its parent's threads are not in it); None for one
    run."""
    if parts < 2:
        return None
    with _PUSH_LOCK:
        if _PUSH_POOL[0] is None or _PUSH_POOL[1] != os.getpid():
            _PUSH_POOL[:] = [ThreadPoolExecutor(PUSH_PARTS - 1, thread_name_prefix="push"),
                             os.getpid()]
        return _PUSH_POOL[0]


def _push_host(e: _Edges, rows_in: "_Rows", rows_out: "_Rows", keep: torch.Tensor,
               cnt: torch.Tensor, mean: bool, transpose: bool = True) -> dict:
    """The push form of a delta conv over ``cat([wildtype, D])``, ``D`` the changed input rows
    less their wildtype: per output row, its changed (kept) in-neighbours' ``D`` and its deleted
    in-neighbours' wildtype negated (``push``: CSR and its transpose by two compiled passes,
    :func:`~workbook_lib.nodemask.numba_push.push_block`'s: the first here, the counts, the
    second by :func:`_plan_groups` into the delta group's CSR), its own input (``self``: the wildtype
    row, plus ``D`` where it changed), and the factor of its wildtype aggregation (``gfac``: 0
    for a deleted gene; a mean's ``deg / kept deg``). Its work is the changed inputs'
    out-edges, where pulling reads every in-edge of every changed row. Without ``transpose``,
    the push's transpose is not made (None)."""
    b, n = keep.shape
    keep_np = keep.numpy().reshape(-1)
    cnt_np = cnt.numpy().reshape(-1).astype(np.float64)
    q = rows_out.flat.numpy()
    # each (sample, edge) is at most one entry; a sum's entries are +-1, exact in any float
    # dtype (a mean's 1 / count is made in float64 and converted at its use)
    itype = np.int32 if csr_index_dtype(b * int(e.out_dst.numel()), n + rows_in.count,
                                        rows_out.count) == torch.int32 else np.int64
    parts = _push_parts(b)
    push = kernels().push_counts(
        rows_in.flat.numpy(), e.out_ptr.numpy(), e.out_dst.numpy(), keep_np, cnt_np, mean,
        rows_out.pos, n, rows_out.count, n + rows_in.count, np.empty(0, itype),
        np.empty(0, np.float64 if mean else np.float32), parts, _push_pool(parts), transpose)
    gfac = keep_np[q].astype(np.float64)
    if mean:
        gfac = gfac * e.deg.numpy()[q % n] / np.maximum(cnt_np[q], 1.0)
    return {"push": push, "genes": q % n, "self_in": rows_in.pos[q], "gfac": gfac}


def _kept_degree(plan, e: _Edges) -> torch.Tensor:
    """``[B, N]``: each gene's kept in-degree per sample on ``e`` (counted once per edge type,
    with the batch's kept edges, ``plan.kept_edges``)."""
    if e.key not in plan.kept_degree:
        plan.kept_degree[e.key] = (e.deg.unsqueeze(0) - e.lost(plan.keep)) * plan.keep
        plan.kept_edges[e.key] = int(plan.kept_degree[e.key].sum())
    return plan.kept_degree[e.key]


def _ptr(counts: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(counts.numel() + 1, dtype=torch.long)
    out[1:] = torch.cumsum(counts, 0)
    return out


def _expand(ptr: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(entry positions, owner index) of the CSR ranges ``ptr[rows]..ptr[rows+1]`` (numpy, host)."""
    ptr_np, rows_np = ptr.numpy(), rows.numpy()
    first = ptr_np[rows_np]
    cnt = ptr_np[rows_np + 1] - first
    owner = np.repeat(np.arange(rows_np.size, dtype=np.int64), cnt)
    start = np.repeat(first - (np.cumsum(cnt) - cnt), cnt)
    return torch.from_numpy(start + np.arange(start.size, dtype=np.int64)), torch.from_numpy(owner)


class _Rows:
    """Which (sample, gene) rows of a value are computed apart from its wildtype (``mask``
    ``[B, N]`` bool; ``dense``: every row, sample-major) and which of them differ from it
    (``changed``, default ``mask``: fewer only where a layer took the dense form)."""

    def __init__(self, mask: torch.Tensor, dense: bool = False, changed=None):
        b, n = mask.shape
        self.mask, self.dense, self.num_nodes = mask, dense, n
        self._changed = mask if changed is None else changed  # or a function that counts it
        self.flat = torch.arange(b * n) if dense else \
            torch.from_numpy(np.flatnonzero(mask.numpy()))
        self._pos: np.ndarray | None = None

    @property
    def changed(self) -> torch.Tensor:
        """``[B, N]`` bool: the rows that differ from the wildtype (counted when first read)."""
        if callable(self._changed):
            self._changed = self._changed()
        return self._changed

    @property
    def count(self) -> int:
        return int(self.flat.numel())

    @property
    def pos(self) -> np.ndarray:
        """``[B * N]``: each row's place among the changed rows, -1 where unchanged."""
        if self._pos is None:
            self._pos = np.full(self.mask.numel(), -1, dtype=np.int64)
            self._pos[self.flat.numpy()] = np.arange(self.count, dtype=np.int64)
        return self._pos

    def lookup(self, flat: torch.Tensor) -> torch.Tensor:
        """Indices of rows ``flat`` in ``cat([wildtype, values])``."""
        f = flat.numpy()
        p = self.pos[f]
        return torch.from_numpy(np.where(p >= 0, self.num_nodes + p, f % self.num_nodes))

    @staticmethod
    def union(rows: list["_Rows"]) -> "_Rows":
        """The rows changed in any of ``rows`` (itself when all are one)."""
        if all(r is rows[0] for r in rows):
            return rows[0]
        mask, changed = rows[0].mask.clone(), rows[0].changed.clone()
        for r in rows[1:]:
            mask |= r.mask
            changed |= r.changed
        return _Rows(mask, any(r.dense for r in rows) or bool(mask.all()), changed)


@dataclass
class _Val:
    """A per-sample node value: the wildtype ``[N, H]`` and the changed rows' values."""

    wt: torch.Tensor
    values: torch.Tensor
    rows: _Rows
    _table: torch.Tensor | None = None

    def table(self) -> torch.Tensor:
        """``cat([wt, values])``, made once (every edge type of a layer reads it)."""
        if self._table is None:
            self._table = torch.cat([self.wt, self.values])
        return self._table


def _push_rows(nb, parts: tuple, relu: bool) -> torch.Tensor:
    """``[B * N, H]``: every row of a fused layer, pushed (``delta.push`` of
    ``NodeMaskBatch.delta_parts``)."""
    base, u, w, rows = parts
    out = push(nb.graph, nb.corrections(), base, u, w, nb.push_kernel, rows=rows, relu=relu)
    return out.reshape(-1, out.shape[-1])


class _PushedVal(_Val):
    """A fused layer's output with its ReLU (:meth:`ConvertedEncoder._run_typed`): every row,
    pushed when first read (``values``), or read by a weighted sum over genes inside the push
    without being written (:meth:`pooled`, the pooled readout's dense input)."""

    def __init__(self, nb, parts: tuple, rows: "_Rows"):
        self.nb, self.parts, self.rows, self._table = nb, parts, rows, None
        self.wt = torch.relu(parts[0])
        self._values: torch.Tensor | None = None

    @property
    def values(self) -> torch.Tensor:
        if self._values is None:
            self._values = _push_rows(self.nb, self.parts, relu=True)
        return self._values

    def pooled(self, weights: torch.Tensor) -> torch.Tensor:
        """``[B, K, H]``: ``weights`` ``[B, K, N]`` times each sample's rows."""
        base, u, w, rows = self.parts
        return push_pooled(self.nb.graph, self.nb.corrections(), base, u, w, weights,
                           self.nb.push_kernel, rows=rows)


@dataclass
class _ConvPlan:
    """One convolution and edge type: its changed rows and what recomputes them."""

    path: str
    kind: type
    edges: _Edges
    rows_in: _Rows
    rows_out: _Rows
    entries: int  # edges read per batch: pushed or pulled (delta), kept x samples (dense)
    host: dict  # index tensors: src, dst, weight, self_idx, self_coef (delta); keep, ... (dense)
    src: object = None  # the fx node of its input: the convs reading one value share products
    mean: bool = False  # mean aggregation
    grouped: bool = False  # its aggregation comes from its group's products (_plan_groups)
    dense_group: bool = False  # dense, its aggregation from its dense group's one product
    changed_entries: int = 0  # the fewer of pull and push entries, per batch (the floor)


@dataclass
class _CatParts:
    """A concatenation on features left unmade: its parts and its changed rows (the union of
    theirs), for the linear map that reads it (:meth:`ConvertedEncoder._run_linear_of_cat`)."""

    parts: list
    rows: "_Rows"


@dataclass
class _PooledPlan:
    """A module of the pooled tail (:mod:`.convert_pool`): its rows are never computed."""

    node: fx.Node
    edges: _Edges | None  # a conv's edge type


@dataclass
class _TypedPlan:
    """One conv of a fused typed layer (:mod:`.convert_typed`): its edge type and input rows."""

    path: str
    edges: _Edges
    rows_in: "_Rows"


@dataclass
class _TypedLin:
    """The linear map of a fused typed layer: its input's and its output's rows and its form
    (``first``: the input is x, the output the correction rows; ``push``: every row)."""

    rows_in: "_Rows"
    rows_out: "_Rows"
    form: str


@dataclass
class _FusedSum:
    """A sum over edge types of GIN-MLPs that runs fused (:mod:`.convert_dense`): ``kind``
    ``"dense"`` (one dense group's convs, :class:`.convert_dense.DenseGinSum`) or ``"delta"`` (one
    delta group's, :class:`.convert_dense.DeltaGinSum`, on a CPU only); its convs in the sum's
    order; its operand fx nodes (None for a HeteroConv's sum)."""

    kind: str
    convs: list
    ops: list | None


class _Plan:
    """The host plan of one batch (``keep`` ``[B, N]``, False at deleted genes): rows per fx node,
    one :class:`_ConvPlan` per conv and edge type."""

    def __init__(self, keep: torch.Tensor, training: bool = False, transposes: bool = True):
        self.keep, self.training = keep, training  # the encoder's mode it was planned in
        # whether the delta groups' transposes are made with the plan (a GPU's backward reads
        # them; a CPU's are made only where it takes the transposed products: see
        # ConvertedEncoder._group_products, _host_transposes and _block_transposes)
        self.transposes = transposes
        self.batch_size, self.num_nodes = keep.shape
        self.rows: dict = {}
        self.convs: dict[tuple, _ConvPlan] = {}
        self.order: list[tuple] = []  # (path, kind name, rows or conv plan) in forward order
        self._dev: dict = {}
        self.index: dict = {}
        self.kept_degree: dict = {}  # per edge type
        self.kept_edges: dict = {}  # per edge type
        self.groups: dict = {}  # input fx node -> (conv plans, row sizes): one product each
        self.dense_groups: dict = {}  # input fx node -> the dense convs reading it
        self.deleted: torch.Tensor | None = None  # [B, k] on the host
        self.typed: dict = {}  # typed layer's linear node -> (form or None, type order, types)
        self.corr: dict = {}  # edge types -> the batch's Corrections along them, their rows
        self.fused_sums: dict[fx.Node, _FusedSum] = {}  # sum fx node -> its fused sum

    def put(self, key, t: torch.Tensor) -> None:
        """Keep a host index made while planning, for :meth:`dev`."""
        self.index[key] = t

    def of_rows(self, rows: "_Rows", what: str) -> tuple:
        """The key under which an index of ``rows`` is kept, for :meth:`dev`: ``"gene"``
        (``flat % N``), ``"sample"`` (``flat // N``) or ``"flat"``; made at the first ask, one host
        tensor (and one copy per device) however many parts of the plan read it."""
        key = ("rows", id(rows), what)
        if key not in self.index:
            f, n = rows.flat, self.num_nodes
            self.put(key, f % n if what == "gene" else f // n if what == "sample" else f)
        return key

    def rows_on(self, rows: "_Rows", what: str, device: torch.device) -> torch.Tensor:
        """:meth:`of_rows`' index of ``rows`` on ``device`` (through :meth:`dev`)."""
        return self.dev(self.of_rows(rows, what), None, device)

    def dev(self, key, t: torch.Tensor | None, device: torch.device,
            dtype: torch.dtype | None = None) -> torch.Tensor:
        """``t`` (or the index :meth:`put` under ``key``) on ``device``, pinned, non-blocking;
        in ``dtype`` if given (converted once)."""
        k = (key, device, dtype)
        if k not in self._dev:
            t = self.index[key] if t is None else t
            if dtype is not None:
                t = t.to(dtype)
            with host_side():  # pinned and non-blocking: no sync on a GPU
                if device.type == "cuda":
                    t = t.pin_memory()
                self._dev[k] = t.to(device, non_blocking=True)
        return self._dev[k]


TRACE_TOLERANCE = 1e-9  # relative, in float64: rounding, not a different computation


class ConvertedEncoder(nn.Module):
    """The exact shared-graph form of a user's encoder (see :func:`convert`)."""

    def __init__(self, encoder: nn.Module, graph, readout=None, register: dict | None = None,
                 num_nodes: int | None = None):
        super().__init__()
        self.register = dict(register or {})
        for cls, target in self.register.items():
            if target not in (GINConv, GraphConv, SAGEConv, GCNConv):
                raise ValueError(f"register maps {cls.__name__} to {target!r}: the target must "
                                 "be GINConv, GraphConv, SAGEConv or GCNConv")
            if not (isinstance(cls, type) and issubclass(cls, target)):
                # found by a user trial: a MessagePassing of its own, registered as GraphConv,
                # met an AttributeError (its lin_rel) at the first call
                raise ValueError(
                    f"register maps {getattr(cls, '__name__', cls)!s} to {target.__name__}, "
                    f"but it is not a subclass of {target.__name__}: convert computes a "
                    f"registered class with {target.__name__}'s own parameters, so register "
                    f"only a subclass of it (keep its parameters and change what its message "
                    f"does to a mask), or build the layer from {target.__name__} itself")
        if not (readout is None or readout in READOUTS or isinstance(readout, Aggregation)):
            raise ValueError(f"'readout' must be None, one of {list(READOUTS)} or a PyG "
                             f"aggregation module (got {readout!r})")
        self.encoder = encoder  # the user's module (its parameters, not copies)
        self.readout_module = readout if isinstance(readout, Aggregation) else None
        self.readout_kind = None if isinstance(readout, Aggregation) else readout
        self.keys, self.graph_in, n = _edge_dict(graph)
        ids = 1 + max((int(e.max()) for e in self.graph_in.values() if e.numel()), default=-1)
        if num_nodes is not None:
            try:
                given = None if isinstance(num_nodes, bool) else operator.index(num_nodes)
            except TypeError:
                given = None
            if given is None or given < max(ids, 1) or (n is not None and given != n):
                raise ValueError(f"'num_nodes' must be an int of at least {max(ids, 1)} (the "
                                 "graph's node ids)" + ("" if n is None else
                                                        f", the HeteroData's {n}") +
                                 f" (got {num_nodes!r})")
            n = given
        self.num_nodes = n if n is not None else ids
        self._counted = n is None  # N counted from the edges: genes past the last edge unseen
        self._edges: dict[int, dict] = {}
        self._graphs: dict[bool, fx.Graph] = {}
        self._named = dict(encoder.named_modules())
        self._traced_attrs: dict = {}  # per mode: (called, followed paths, their attributes)
        self._graph(encoder.training)
        self._state: dict = {"plan": None, "grouped": {}, "ahead": {},  # (not module
                             "pool": None, "sites": None}  # attributes: cheaper)
        self._widths: dict = {}
        self._device_graph: dict = {}
        self.workspace = Workspace()  # large CPU buffers kept between calls (.workspace)
        self.register_state_dict_post_hook(_leave_out_shared)
        self.register_load_state_dict_pre_hook(_fill_shared)
        self._check_hooks()

    def __getstate__(self):
        """Copies and pickles leave out the plans, the planning thread and the device caches
        (sparse tensors, which do not copy; made again at the next call)."""
        state = self.__dict__.copy()
        state["_state"] = {"plan": None, "grouped": {}, "ahead": {}, "pool": None, "sites": None}
        state["_device_graph"] = {}
        state["workspace"] = Workspace(self.workspace.min_bytes)
        return state

    # --- structure -------------------------------------------------------------------------

    def _graph(self, training: bool) -> fx.Graph:
        """The traced forward in this mode (``self.training`` is read at trace time)."""
        if training not in self._graphs:
            g = trace(self.encoder, self.keys, self.register)
            check_graph(g, self.encoder, self.register, typed=self.keys is not None)
            self._graphs[training] = g
            called, followed = self._traced_paths(g)  # what it calls, and the values it froze
            self._traced_attrs[training] = (called, followed,
                                            self._attributes(followed, called))
        return self._graphs[training]

    def edges(self, n: int) -> dict:
        """``{key: _Edges}`` for ``n`` genes (built once per node count)."""
        if n not in self._edges:
            if n < self.num_nodes:
                raise ValueError(f"x has {n} rows but " + (
                    f"the graph has node ids up to {self.num_nodes - 1}" if self._counted else
                    f"the graph has {self.num_nodes} genes (convert's num_nodes, or the "
                    "HeteroData's)"))
            self._edges[n] = {k: _Edges.of(k, e, n) for k, e in self.graph_in.items()}
        return self._edges[n]

    def _device(self) -> torch.device:
        """Where the encoder runs, as a plan is made: its first parameter's device (a lazy
        one's skipped), else its graph's."""
        for p in self.encoder.parameters():
            if not isinstance(p, nn.parameter.UninitializedParameter):
                return p.device
        for e in self.graph_in.values():
            return e.device
        return torch.device("cpu")

    def _graph_on(self, device: torch.device):
        if device not in self._device_graph:
            moved = {k: e.to(device) for k, e in self.graph_in.items()}
            self._device_graph[device] = moved[None] if self.keys is None else moved
        return self._device_graph[device]

    # --- the plan (host) -------------------------------------------------------------------

    def plan(self, deleted: torch.Tensor, n: int | None = None) -> _Plan:
        """The host plan of ``deleted`` ``[B, k]`` (cached for the last batch; one
        :meth:`plan_ahead` started is waited for and used). Made outside
        ``torch.inference_mode``: a later training call may use it (see :meth:`forward`)."""
        if torch.is_inference_mode_enabled():
            with torch.inference_mode(False):
                return self.plan(deleted, n)
        with host_side():  # made on the host from a host 'deleted': no sync on a GPU
            key, d = self._plan_key(deleted, n)
            cached = self._state["plan"]
            if cached is not None and cached[0] == key:
                return cached[1]
            ahead = self._state["ahead"].pop(key, None)
            if ahead is None:
                other = [k for k in self._state["ahead"] if k[1:] == key[1:]]
                if other:  # planned ahead for another gene count: it would go unused
                    self._state["ahead"].pop(other[0])  # not kept to fail again
                    raise ValueError(
                        f"plan_ahead planned these deletions for {other[0][0]} genes but x has "
                        f"{key[0]} rows (" + (self._n_hint(other[0][0]) if self._counted else
                                              f"pass n={key[0]} to plan_ahead") + ")")
            # planned ahead: only the wait for it is this thread's (its own label)
            with _parts.timed(_parts.PLAN if ahead is None else _parts.PLAN_WAITED):
                plan = ahead.result() if ahead is not None else \
                    self._make_plan(d, key[0], key[1])
        self._state["plan"] = (key, plan)
        return plan

    def plan_ahead(self, deleted: torch.Tensor, n: int | None = None) -> None:
        """Start planning the next batch's ``deleted`` in a background thread, so that the host
        plan overlaps the current step (on a GPU the host is otherwise idle while the step runs;
        its large parts, NumPy and compiled, release the GIL). The call with the same
        ``deleted``, in the same train or eval mode, waits for it and uses it; an error it met
        is raised there. ValueError at once for a bad ``deleted``. Keeps at most
        :data:`AHEAD` plans started and not yet used (the oldest is dropped)."""
        with host_side():  # as plan(): made on the host from a host 'deleted'
            key, d = self._plan_key(deleted, n)
        ahead = self._state["ahead"]
        if key in ahead or (self._state["plan"] is not None and self._state["plan"][0] == key):
            return
        self.edges(key[0])  # what plans share is made here, not in two threads at once
        self._sums(key[1])
        self._tail(key[1])
        for node, tl in self._typed(key[1]).items():
            found = self._typed_types(tl)
            if node is tl.lin and found is not None:  # the graph its corrections are made on
                self._shared(key[0], tl.aggr, torch.device("cpu"), found[0])
        kernels()
        if self._state["pool"] is None:
            self._state["pool"] = ThreadPoolExecutor(1, thread_name_prefix="convert-plan")
        while len(ahead) >= AHEAD:
            ahead.pop(next(iter(ahead)))
        ahead[key] = self._state["pool"].submit(self._make_plan, d, key[0], key[1])

    def _plan_key(self, deleted: torch.Tensor, n: int | None) -> tuple[tuple, torch.Tensor]:
        n = n or self._seen_nodes()
        try:
            d = validate_deleted(deleted, n).cpu()
        except ValueError as e:
            d = deleted if isinstance(deleted, torch.Tensor) else None
            if not self._unsure_n(n) or d is None or d.numel() == 0 or d.is_floating_point() \
                    or int(d.max()) < n:  # the hint only for a gene past the edges' count
                raise
            raise ValueError(f"{e} ({self._n_hint(n)})") from None
        if d.shape[0] == 0:
            raise ValueError("'deleted' has no rows: B must be at least 1 (a row of -1 deletes "
                             "nothing)")
        return (n, self.encoder.training, tuple(d.shape), d.numpy().tobytes()), d

    def _make_plan(self, d: torch.Tensor, n: int, training: bool) -> _Plan:
        keep = torch.ones(d.shape[0], n, dtype=torch.bool)
        b_idx = torch.arange(d.shape[0]).unsqueeze(1).expand_as(d)
        keep[b_idx[d >= 0], d[d >= 0]] = False
        plan = _Plan(keep, training, transposes=self._device().type != "cpu")
        plan.deleted = d
        edges = self.edges(n)
        tail = self._tail(training)
        for node in self._graph(training).nodes:
            if node in tail:
                plan.rows[node] = None
                self._plan_pooled_node(node, plan, edges)
                continue
            plan.rows[node] = self._plan_node(node, plan, edges)
            if node.op == "output":
                out = node.args[0]
                if tail:
                    self._plan_pooled_readout(plan, tail)
                else:
                    self._plan_readout(plan, plan.rows[out[0] if isinstance(out, (list, tuple))
                                                        else out])
        _plan_groups(plan)
        self._plan_fused_sums(plan)
        return plan

    def _plan_fused_sums(self, plan: _Plan) -> None:
        """The sums whose operands are exactly one dense group's convs, or one delta group's
        (:func:`_plan_groups`), each a GIN whose ``nn`` is ``Sequential(Linear, ReLU, Linear)`` of
        one shape for all (:meth:`_maps`) read by nothing but the sum: each such sum is computed
        a sample at a time (:mod:`.convert_dense`; a delta one only on a CPU)."""
        tail = self._tail(plan.training)
        for node in self._graph(plan.training).nodes:  # a HeteroConv's sum over its types
            m = self._named.get(node.target) if node.op == "call_module" else None
            if isinstance(m, HeteroConv) and m.aggr == "sum" and node not in tail:
                cps = [plan.convs.get((f"{node.target}[{_key(et)}]", et))
                       for et in m.convs.keys()]  # (iterating PyG's dict gives its str keys)
                cps = [c for c in cps if c is not None]
                if cps and all(c.kind is GINConv for c in cps):
                    self._fuse_sum(plan, node, cps, None)
        for node, ops in self._sums(plan.training)[1].items():
            if node in tail:  # the pooled readout's: never computed
                continue
            cps = []
            for o in ops:
                m = self._named.get(o.target) if o.op == "call_module" else None
                cp = plan.convs.get((o.target, plan.rows[o.args[1]][1])) \
                    if isinstance(m, nn.Module) and len(o.args) > 1 and \
                    isinstance(plan.rows.get(o.args[1]), tuple) else None
                if cp is None or not (cp.dense_group or cp.grouped) or \
                        cp.kind is not GINConv or len(o.users) != 1:
                    break
                cps.append(cp)
            else:
                self._fuse_sum(plan, node, cps, ops)

    def _fuse_sum(self, plan: _Plan, node: fx.Node, cps: list, ops: list | None) -> None:
        """Keep the sum at ``node`` of the GIN convs ``cps`` (in the sum's order; ``ops`` its
        operand nodes, None for a HeteroConv's sum) as a fused sum if they are exactly one
        dense group or one delta group, their MLPs of one shape (:meth:`_maps`)."""
        if not all(c.dense_group or c.grouped for c in cps):
            return
        dense = cps[0].dense_group
        group = plan.dense_groups.get(cps[0].src, []) if dense else \
            plan.groups.get(cps[0].src, ([], None))[0]
        if len(cps) != len(group) or {id(c) for c in cps} != {id(c) for c in group} \
                or self._maps(group) is None:
            return
        if dense:
            plan.fused_sums[node] = _FusedSum("dense", group, ops)
        else:
            rows = _sum_rows(plan, node)
            if ops is None:  # a HeteroConv's: its places at the union rows, as a sum's
                _plan_sum(plan, [c.rows_out for c in cps], rows)
            plan.fused_sums[node] = _FusedSum("delta", cps, ops)
            _plan_delta_sum(plan, cps, rows)

    def _maps(self, cps: list) -> list | None:
        """Each conv's two linear maps (:func:`.convert_dense.gin_mlp`), all of one shape; None
        if any conv is not such a GIN now (a hook registered since the plan was made, say)."""
        maps = [gin_mlp(self._conv_module(c.path, c.edges.key)) for c in cps]
        if any(m is None for m in maps) or len({(a.weight.shape, b.weight.shape)
                                                for a, b in maps}) != 1:
            return None
        return maps

    def _live_sums(self, plan: _Plan, dev: torch.device | None = None) -> tuple[dict, set]:
        """The plan's fused sums still fused at this call, each with its convs' maps
        (:meth:`_maps` checked again: a plan is cached per batch): the dense ones, and with a
        CPU ``dev`` and nothing watching this thread's operators (:func:`.workers.watched`) the
        delta ones; and the operand fx nodes they compute."""
        delta_here = dev is not None and dev.type == "cpu" and not watched()
        live = {}
        for node, fs in plan.fused_sums.items():
            maps = self._maps(fs.convs) if fs.kind == "dense" or delta_here else None
            if maps is not None:
                live[node] = (fs, maps)
        return live, {o for fs, _ in live.values() for o in fs.ops or ()}

    def clear_plan(self) -> None:
        """Forget the cached plan of the last batch (the next call plans afresh)."""
        self._state["plan"] = None

    def _plan_node(self, node: fx.Node, plan: _Plan, edges: dict):
        env = plan.rows
        typed = self._typed(plan.training)
        if node in typed and self._typed_form(typed[node], plan, edges) is not None:
            return self._plan_typed(node, typed[node], plan, edges)
        if node.op == "placeholder":
            if _ph_index(node) == 0:
                return _Rows(~plan.keep)  # x: the deleted genes' rows are zero
            return ("edges", None if self.keys is None else self.keys[_ph_index(node) - 1])
        if node.op in ("get_attr", "output"):
            return None
        if node.op == "call_module":
            m = self._named[node.target]
            if isinstance(m, HeteroConv):
                rows_in = next(iter(_arg_rows(node.args[0], env)))
                src = next(iter(node.args[0].values()))
                per_type = [self._plan_conv(f"{node.target}[{_key(et)}]", c, edges[et],
                                            rows_in, plan, src)
                            for et, c in m.convs.items() if et in edges]
                rows = _Rows.union(per_type)
                for r in per_type:
                    _plan_to_rows(plan, r, rows)
                return {et[2]: rows for et in m.convs.keys()}
            if isinstance(m, MessagePassing) or type(m) in self.register:
                key = env[node.args[1]][1]
                return self._plan_conv(node.target, m, edges[key], env[node.args[0]], plan,
                                       node.args[0])
            rows = env[node.args[0]]
            plan.order.append((node.target, type(m).__name__, rows))
            return rows
        if node.op == "call_function" and isinstance(env.get(node.args[0]), dict):
            return env[node.args[0]][node.args[1]]
        inner, final = self._sums(plan.training)
        if node in inner:
            return None  # computed by the chain's last add
        if node in final:
            found = [env[o] for o in final[node]]
            if not all(isinstance(r, _Rows) for r in found):
                raise ConvertError(f"{node.name}: a sum of module outputs reads a value that is "
                                   "not per gene")
            rows = _Rows.union(found)
            _plan_sum(plan, found, rows)
            return rows
        found = list(_arg_rows(list(node.args) + list(node.kwargs.values()), env))
        if not found:
            return None
        rows = _Rows.union(found)
        for r in found:
            _plan_to_rows(plan, r, rows)
        plan.of_rows(rows, "gene")
        return rows

    def _typed(self, training: bool) -> dict:
        """``{fx node: TypedLayer}`` of the fused typed layers (:mod:`.convert_typed`)."""
        key = ("typed", training)
        if key not in self._device_graph:
            self._device_graph[key] = typed_layers(self._graph(training), self._named,
                                                   self._kind_of, self._fused_cat)
        return self._device_graph[key]

    def _shared(self, n: int, aggr: str, dev: torch.device, types: tuple,
                dtype: torch.dtype | None = None) -> SharedGraph:
        """The graph of edge types ``types`` as the workbook's own kernels take it, its matrices
        in ``dtype`` if given (made once per size, aggregation, device, types and dtype)."""
        key = ("shared", n, aggr, dev, types, dtype)
        if key not in self._device_graph:
            self._device_graph[key] = SharedGraph(
                {str(i): e for i, (k, e) in enumerate(self.graph_in.items()) if k in types},
                num_nodes=n, aggr=aggr, device=dev) if dtype is None else \
                self._shared(n, aggr, dev, types).with_dtype(dtype)
        return self._device_graph[key]

    def _typed_types(self, tl) -> tuple[tuple, list] | None:
        """The edge types a typed layer's parts read (in the graph's order) and, per type, the
        part reading it (``convert_typed.type_order``)."""
        keys = [None if self.keys is None else self.keys[_ph_index(p.args[1]) - 1]
                if p.args[1].op == "placeholder" else object() for p in tl.parts]
        return type_order(keys, list(self.graph_in))

    def _typed_form(self, tl, plan: _Plan, edges: dict) -> str | None:
        """This batch's form of a typed layer: ``first`` (its input is x), ``push`` (its input's
        changed rows lie within the batch's correction rows along the types it reads), or None
        (conv by conv: two parts read one edge type, the graph has self-loops, or the input has
        changed elsewhere)."""
        if tl.lin in plan.typed:
            return plan.typed[tl.lin][0]
        found = self._typed_types(tl)
        rows, form = plan.rows.get(tl.src), None
        types, order = found if found is not None else ((), None)
        if found is not None and isinstance(rows, _Rows) and not rows.dense and \
                not any(bool(edges[k].loop.any()) for k in types):
            r = self._correction_rows(plan, tl.aggr, types)
            if tl.src.op == "placeholder" and _ph_index(tl.src) == 0:
                form = "first"
            elif not bool((rows.mask & ~r.mask).any()):
                form = "push"
        plan.typed[tl.lin] = (form, order, types)
        return form

    def _correction_rows(self, plan: _Plan, aggr: str, types: tuple) -> _Rows:
        """The batch's correction rows along ``types`` (the deleted genes and their
        out-neighbours), with the :class:`Corrections` the fused layers reading those types run
        on (one compiled pass, made once per plan and types)."""
        if types not in plan.corr:
            sg = self._shared(plan.num_nodes, aggr, torch.device("cpu"), types)
            corr = corrections(sg.out_edges, plan.deleted)
            mask = torch.zeros(plan.batch_size, plan.num_nodes, dtype=torch.bool)
            mask[corr.pair_sample, corr.pair_gene] = True
            rows = _Rows(mask)
            plan.corr[types] = (corr, rows)
            plan.put(("corr_gene", types), corr.pair_gene)
            plan.put(("corr_flat", types), rows.flat)
            plan.put(("corr_deleted", types), corr.pair_deleted)
        return plan.corr[types][1]

    def _plan_typed(self, node: fx.Node, tl, plan: _Plan, edges: dict):
        """A node of a fused typed layer: its parts and concatenation are not computed; the map
        gives the correction rows (``first``) or every row (``push``); the ReLU is inside."""
        rows_in = plan.rows[tl.src]
        if node is tl.relu:
            return plan.rows[tl.lin]
        if node is not tl.lin:
            if node is not tl.cat:
                e = edges[plan.rows[node.args[1]][1]]
                plan.order.append((node.target, "GINConv", _TypedPlan(node.target, e, rows_in)))
            return None
        form, _, types = plan.typed[tl.lin]
        corr_rows = plan.corr[types][1]
        n = plan.num_nodes
        if form == "first":
            rows_out = corr_rows
        else:
            es = [edges[k] for k in types]

            def changed():
                out = rows_in.mask.clone()
                for e in es:
                    out |= _reach(e, rows_in.mask, rows_in.flat, None)
                return out
            rows_out = _Rows(torch.ones(plan.batch_size, n, dtype=torch.bool), dense=True,
                             changed=changed)
            plan.put(("typed_pos", id(tl.lin)),
                     torch.from_numpy(corr_rows.pos[rows_in.flat.numpy()]))
            plan.of_rows(rows_in, "gene")
        plan.order.append((tl.lin.target, type(self._named[tl.lin.target]).__name__,
                           _TypedLin(rows_in, rows_out, form)))
        return rows_out

    def _tail(self, training: bool) -> set:
        """The pooled tail's fx nodes (:mod:`.convert_pool`; none without a weighted-sum
        readout)."""
        key = ("tail", training)
        if key not in self._device_graph:
            self._device_graph[key] = set() if self.readout_kind not in POOLED_READOUTS else \
                tail_nodes(self._graph(training), self._named, self._kind_of)
        return self._device_graph[key]

    def _kind_of(self, m: nn.Module, path: str) -> type:
        return conv_kind(m, path, self.register)

    def _plan_pooled_node(self, node: fx.Node, plan: _Plan, edges: dict) -> None:
        """A tail node's plan: its place in :meth:`explain` and, for a conv, its edge type's kept
        in-degrees (a mean's divisor)."""
        if node.op != "call_module":
            return
        m = self._named[node.target]
        e = None
        if isinstance(m, MessagePassing):
            e = edges[plan.rows[node.args[1]][1]]
            _kept_degree(plan, e)
        plan.order.append((node.target, type(m).__name__, _PooledPlan(node, e)))

    def _plan_pooled_readout(self, plan: _Plan, tail: set) -> None:
        """The host indexes of the pooled readout: the readout's weights ``W`` ``[B, N]`` (zero at
        deleted genes), and per tail input its changed rows' genes, samples and flat rows."""
        keep = plan.keep.double()
        scale = {"mean": 1.0 / plan.num_nodes, "sum_kept": 1.0}.get(self.readout_kind)
        plan.put(("w0",), keep * scale if scale is not None else
                 keep / plan.keep.sum(1, keepdim=True).clamp(min=1))
        plan.put(("keepf",), keep)
        for key, cnt in plan.kept_degree.items():
            plan.put(("inv_cnt", key), 1.0 / cnt.double().clamp(min=1))
        for node in tail:
            for a in node.all_input_nodes:
                rows = plan.rows.get(a)
                if a in tail or not isinstance(rows, _Rows) or rows.dense:
                    continue
                for what in ("gene", "sample", "flat"):
                    plan.of_rows(rows, what)

    def _plan_readout(self, plan: _Plan, rows: _Rows) -> None:
        """The readout's host indexes (see :meth:`_readout`)."""
        n = plan.num_nodes
        if self.readout_kind is None and self.readout_module is None:
            _plan_full(plan, rows)
        elif self.readout_module is not None:
            kept = plan.keep.view(-1).nonzero().flatten()
            _put_pick(plan, ("kept",), rows.lookup(kept))
            plan.put(("kept_b",), kept // n)
        else:
            plan.of_rows(rows, "gene")
            plan.put(("r_kept",), plan.keep.view(-1)[rows.flat])
            plan.of_rows(rows, "sample")
            plan.put(("nkept",), plan.keep.sum(1, keepdim=True).clamp(min=1))

    def _plan_conv(self, path: str, m: nn.Module, e: _Edges, rows_in: _Rows,
                   plan: _Plan, src=None) -> _Rows:
        kind = conv_kind(m, path, self.register)
        if (path, e.key) in plan.convs:
            # only a GIN a fused layer takes can be part of one, which may reuse its convs
            fusable = identity_gin(m, kind)
            raise ConvertError(f"{_name(plan.convs[(path, e.key)])} is called twice on one edge "
                               "type, which a layer run conv by conv cannot do"
                               + (" (a fused layer can; self-loops on its types, for one, keep "
                                  "a layer from being fused: docs/fix-api.md)" if fusable else "")
                               + "; give each call its own conv module, or keep the masked "
                               "copies for weights tied on purpose")
        if kind is GCNConv and m.normalize and m.add_self_loops:
            _refuse_repeated_loops(e, path)
        keep, (b, n) = plan.keep, plan.keep.shape
        cnt = _kept_degree(plan, e)
        gcn_norm = kind is GCNConv and m.normalize
        if gcn_norm:  # a deletion's receivers lose degree: their out-neighbours change too
            lowered = ((cnt != e.deg.unsqueeze(0)) & keep).view(-1).nonzero().flatten()
        if rows_in.dense:  # every row is computed (no receivers to follow): the dense form
            mask = torch.ones(b, n, dtype=torch.bool)
        else:
            mask = _reach(e, rows_in.mask, rows_in.flat, lowered if gcn_norm else None)
        if not rows_in.dense:
            changed = mask
        elif bool(rows_in.changed.all()):
            changed = rows_in.changed
        else:  # computed rows are all rows: follow the rows that really differ
            changed = _reach(e, rows_in.changed, torch.from_numpy(
                np.flatnonzero(rows_in.changed.numpy())), lowered if gcn_norm else None)
        kept_edges = plan.kept_edges[e.key]
        delta_rows = _Rows(mask)
        cnt_np = cnt.numpy().reshape(-1)
        entries = int(cnt_np[delta_rows.flat.numpy()].sum())  # the pull: changed rows' in-edges
        pull = entries
        push = kind is not GCNConv and src is not None  # the push: changed inputs' out-edges
        if push and not rows_in.dense:
            entries = int(_kept_out(plan, e).reshape(-1)[rows_in.flat.numpy()].sum())
        dense = rows_in.dense or (entries + delta_rows.count) > DENSE_SHARE * (kept_edges + b * n)
        dinv = self_coef = None
        if gcn_norm:  # per sample: a gene without a self-loop there gets one of weight `fill`
            fill = gcn_fill(m) * ~(e.loop.unsqueeze(0) & keep)
            dinv = _inv_sqrt(cnt.double() + fill)
            self_coef = fill * dinv * dinv
        aggr_mean = kind is not GCNConv and m.aggr == "mean"
        if dense:
            _plan_full(plan, rows_in)
            rows_out = _Rows(torch.ones(b, n, dtype=torch.bool), dense=True, changed=changed)
            host = {"keep": keep.double(), "inv_cnt": 1.0 / cnt.double().clamp(min=1),
                    "dinv": dinv, "self_coef": self_coef}
            entries = kept_edges
        elif push:
            rows_out = delta_rows
            host = _push_host(e, rows_in, rows_out, keep, cnt, aggr_mean, plan.transposes)
        else:
            rows_out = delta_rows
            q = rows_out.flat
            qn_np = q.numpy() % n
            pos, owner = (t.numpy() for t in _expand(e.in_ptr, torch.from_numpy(qn_np)))
            qo = q.numpy()[owner]
            qb, j = qo // n, e.in_src.numpy()[pos]
            keep_np = keep.numpy().reshape(-1)
            ok = keep_np[qb * n + j] & keep_np[qo]
            qb, qo, j, owner = qb[ok], qo[ok], j[ok], owner[ok]
            crow = np.zeros(q.numel() + 1, dtype=np.int64)
            np.cumsum(np.bincount(owner, minlength=q.numel()), out=crow[1:])
            host = {"src": rows_in.lookup(torch.from_numpy(qb * n + j)),  # owner ascending
                    "crow": torch.from_numpy(crow), "self_idx": rows_in.lookup(q)}
            qb, qn, j, owner = (torch.from_numpy(t) for t in (qb, qo % n, j, owner))
            if aggr_mean:
                host["weight"] = torch.from_numpy(1.0 / cnt_np[qo].astype(np.float64))
            elif gcn_norm:
                host["weight"] = dinv[qb, j] * dinv[qb, qn]
                host["self_coef"] = self_coef.view(-1)[q]
        cp = _ConvPlan(path, kind, e, rows_in, rows_out, entries, host, src, aggr_mean)
        if dense:  # the fewer of pulling the rows that differ and pushing the inputs that do
            pull = int(cnt_np[np.flatnonzero(changed.numpy())].sum())
            cp.changed_entries = pull if not push else min(pull, int(_kept_out(plan, e).reshape(
                -1)[np.flatnonzero(rows_in.changed.numpy())].sum()))
        else:  # the fewer of the two as well (a deleted leaf's lost edge: pushed, never pulled)
            cp.changed_entries = min(pull, entries)
        plan.convs[(path, e.key)] = cp
        plan.order.append((path, kind.__name__, cp))
        return rows_out

    # --- execution -------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, deleted: torch.Tensor) -> torch.Tensor:
        """``[B, N, H]`` (no readout) or ``[B, H]``: sample ``b`` is the encoder on the graph
        less ``deleted[b]``'s genes (see :func:`convert`), for ``x`` ``[N, F]`` (the result on its
        device) and ``deleted`` ``[B, k]``, ``-1`` padded (on the host: no sync). Raises
        ValueError for a bad ``deleted`` or ``x``, train-mode BatchNorm or dropout p>0, or a call
        under autocast. Under ``torch.inference_mode`` it runs without gradients outside it:
        what it keeps for later calls (the batch's plan, the graph on the device, its buffers)
        would otherwise be inference tensors, which a later training call cannot save for its
        backward (found by a review: after an inference call, the same batch failed to train)."""
        if torch.is_inference_mode_enabled():
            with torch.inference_mode(False), torch.no_grad():
                return self.forward(x, deleted)
        self._check_x(x)  # (first: autocast has no state for some devices, such as meta)
        if torch.is_autocast_enabled(x.device.type):  # a user trial: a raw NotImplementedError
            raise ConvertError(  # from a sparse product, for three kinds of conv in four
                f"fast(x, deleted) under torch.autocast({x.device.type!r}): the converted form "
                f"computes in x's dtype ({_dtype_name(x.dtype)}), and its sparse products have no "
                "kernel in autocast's lower precision on every device; call it with autocast "
                f"off (with torch.autocast({x.device.type!r}, enabled=False): ...)")
        self._check_mode()
        self._check_hooks()
        self._check_structure()
        if self.encoder.training not in self._state.setdefault("traced_checked", set()):
            self._check_traced(x)
        return self._run(x, self.plan(deleted, x.shape[0]))

    def _check_x(self, x: torch.Tensor) -> None:
        """ValueError, one line, for an ``x`` the converted form cannot take, before any work (a
        user trial: a wrong width or dtype surfaced as torch's error from inside the run):
        ``[N, F]``; on the device of the encoder's parameters; floating x of their dtype, and of
        a dtype that sparse products take on a CPU; as wide as at the first call (whose width
        the encoder's own forward checks: :meth:`_check_traced`). A non-floating x is the
        encoder's to take (one that casts it itself: a review)."""
        if x.dim() != 2:
            raise ValueError(f"x must be [N, F] (got {list(x.shape)})")
        params = [p for p in self.encoder.parameters()
                  if not isinstance(p, nn.parameter.UninitializedParameter)]
        devs = sorted({str(p.device) for p in params})
        if devs and str(x.device) not in devs:
            raise ValueError(f"x is on {x.device} but the encoder's parameters are on "
                             f"{' and '.join(devs)}: pass x.to({devs[0]!r})")
        dt = _dtype_name(x.dtype)
        own = sorted({_dtype_name(p.dtype) for p in params if p.is_floating_point()})
        cpu_ok = ("float32", "float64")
        if x.device.type == "cpu" and any(o not in cpu_ok for o in own):
            raise ValueError(f"the encoder's parameters are {' and '.join(own)}: on a CPU the "
                             "converted form runs float32 or float64 (torch's sparse products "
                             "take no other dtype there); convert encoder.float() instead")
        if x.is_floating_point() and own and dt not in own:
            raise ValueError(f"x is {dt} but the encoder's parameters are {' and '.join(own)}: "
                             f"pass x.to(torch.{own[0]}), or move the encoder to {dt} and "
                             "convert it again")
        if x.device.type == "cpu" and x.is_floating_point() and dt not in cpu_ok:
            raise ValueError(f"x is {dt}: on a CPU the converted form runs float32 or float64 "
                             "(torch's sparse products take no other dtype there)")
        width = self._state.get("width")
        if width is not None and x.shape[1] != width:
            raise ValueError(f"x has {x.shape[1]} features but had {width} at the first call: "
                             "the encoder's first layer takes one width")

    def _traced_paths(self, graph: fx.Graph) -> tuple[tuple, tuple]:
        """(the module paths ``graph`` calls, the paths of the modules whose forward it followed:
        inlined, the values they read are constants of the graph). Followed: the encoder and
        every module fx recorded an operation under (``nn_module_stack``), a module of
        functional operations with no module call in it included (a review: such a gate's
        temperature went unwatched)."""
        called = tuple(dict.fromkeys(n.target for n in graph.nodes if n.op == "call_module"))
        seen = {p for n in graph.nodes for p, _ in (n.meta.get("nn_module_stack") or {}).values()}
        followed = ("",) + tuple(p for p in dict.fromkeys(sorted(seen))
                                 if p and p not in called and p in self._named)
        return called, followed

    def _attributes(self, followed: tuple, called: tuple = ()) -> dict:
        """The public attributes of the ``followed`` modules that are not modules or tensors
        (numbers, strings, flags, lists, dicts, config objects), deep-copied to compare later
        (one that cannot be copied is kept as itself, compared by identity); and the plain ones
        (numbers, strings, flags) of the ``called`` modules, which a followed forward may read
        (a review: ``* self.conv.scale``, 7.7 off)."""
        out = {}
        for p in followed:
            for k, v in vars(_attr(self.encoder, p) if p else self.encoder).items():
                if k.startswith("_") or k == "training" or \
                        isinstance(v, (nn.Module, torch.Tensor)) or callable(v):
                    continue
                try:
                    out[(p, k)] = copy.deepcopy(v)
                except Exception:  # noqa: BLE001 - a user's object: compared by identity
                    out[(p, k)] = v
        for p in called:
            out.update(((p, k), v) for k, v in vars(_attr(self.encoder, p)).items()
                       if not k.startswith("_") and k != "training" and
                       isinstance(v, (bool, int, float, str, type(None))))
        return out

    def _check_structure(self) -> None:
        """Refuse a call after a module the trace calls or followed was replaced since convert,
        or after an attribute of a followed module changed in a way that changes the trace
        (found by a user trial: a gate's temperature annealed, residual flags flipped, a
        submodule replaced after convert: the converted form kept the traced values and the old
        modules, 0.22-0.71 off, silently). A changed attribute is traced again and refused only
        if the new trace differs: a counter the forward keeps, or a value it never reads, is not
        refused (a review). Each path and traced value is looked up, not every module walked."""
        training = self.encoder.training
        called, followed, then = self._traced_attrs[training]
        for p in called + followed:
            try:
                now = _attr(self.encoder, p) if p else self.encoder
            except AttributeError:
                now = None
            if now is not self._named.get(p):
                raise ConvertError(f"the module at {p or 'the encoder'} was replaced or removed "
                                   "since convert, and the converted form calls the modules it "
                                   "found then; call convert(...) again after such a change")
        # the values traced against today's, key by key (a key added since was not read)
        changed = [(p, k) for (p, k), v in then.items()
                   if not _same(v, vars(self._named[p]).get(k, _MISSING))]
        if not changed:
            return
        again = trace(self.encoder, self.keys, self.register)  # does the change change it?
        if self._same_trace(again, self._graph(training)):
            self._traced_attrs[training] = (called, followed,
                                            self._attributes(followed, called))
            return
        what = changed[0]
        now = vars(self._named[what[0]]).get(what[1], "removed")
        raise ConvertError(f"{what[0] + '.' if what[0] else 'encoder.'}{what[1]} changed "
                           f"({then[what]!r} -> {now!r}) since convert "
                           "traced the forward, and traced again it differs: the converted form "
                           "runs the forward as first traced; call convert(...) again after such "
                           "a change (a value the forward reads at each call belongs in a "
                           "tensor buffer or parameter)")

    def _same_trace(self, a: fx.Graph, b: fx.Graph) -> bool:
        """Two traces compute alike: the same code, the tensor constants fx names for each trace
        (``_tensor_constant0``, ``1``...) compared by value."""
        def sig(g: fx.Graph) -> tuple[str, list]:
            consts = [_attr(self.encoder, str(n.target)) for n in g.nodes if n.op == "get_attr"
                      and str(n.target).startswith("_tensor_constant")]
            return re.sub(r"_tensor_constant\d+", "_tensor_constant",
                          g.python_code("self").src), consts
        (ca, ta), (cb, tb) = sig(a), sig(b)
        return ca == cb and len(ta) == len(tb) and all(
            x.shape == y.shape and x.dtype == y.dtype and bool(torch.equal(x, y))
            for x, y in zip(ta, tb))

    def _check_traced(self, x: torch.Tensor) -> None:
        """Once per mode, at the first call: the traced forward run converted on a sample that
        deletes nothing against the encoder's own forward on the whole graph, read out alike.
        What fx's trace does not follow as PyTorch runs it differs there (found by user trials:
        an in-place ``+=`` on a tensor another name held, 0.35 off; a registered GIN whose
        message doubled its input, 5.1 off; both silent). In float64 on copies of the encoder
        and readout module (their floating tensors all cast, and float64 the default dtype for
        tensors the forward makes), to :data:`TRACE_TOLERANCE`, so that a small difference is
        not lost in rounding (a review: a message scaled by 1.002 passed a float32 tolerance);
        where the copy cannot be made or run in float64 (a review: a float32 tensor made in the
        forward), on the modules themselves in their dtype, to ``100 * eps`` of it. What
        differs only on a sample's graph (a registered subclass's mask) is not caught."""
        try:
            got, want = self._traced_pair(x, float64=True)
            tol, where = TRACE_TOLERANCE, "in float64"
        except Exception:  # noqa: BLE001 - the user's forward in float64: checked as it runs
            try:
                with torch.no_grad():
                    self.encoder(x, self._graph_on(x.device))
            except RuntimeError as e:  # the user's own forward refuses this x's shape: said
                # so in one line; any other failure is raised as it is (a review)
                first = (str(e).strip().splitlines() or [""])[0]
                if not re.search(r"shape|size|mat1 and mat2", first):
                    raise
                raise ValueError(f"the encoder's own forward fails on x {list(x.shape)} "
                                 f"({_dtype_name(x.dtype)}): {first}: check x's "
                                 "width against the encoder's first layer") from e
            got, want = self._traced_pair(x, float64=False)
            tol = 100 * torch.finfo(x.dtype).eps if x.is_floating_point() else 1e-3
            where = f"in {_dtype_name(x.dtype)}, where float64 could not run it"
        with torch.no_grad():
            scale = float(want.abs().max()) if want.numel() else 0.0
            off = float((got - want).abs().max()) / max(scale, 1e-300) if want.numel() else 0.0
        if not off <= tol:
            fx_words = ("its forward does something fx's trace does not follow as PyTorch runs "
                        "it, such as an in-place operation (h += 1) on a tensor another name "
                        "also holds (write it out of place: h = h + 1)")
            raise ConvertError(
                f"on the whole graph the converted form differs from the encoder's own forward "
                f"by {off:.3g} of its largest value ({where}): "
                + (f"a class in register={{{self._register_names()}}} does not compute as the "
                   "convolution it is declared as (register only a subclass whose forward "
                   "computes as that class: its message may only scale by an edge mask), or "
                   + fx_words if self.register else fx_words))
        self._state["traced_checked"].add(self.encoder.training)
        self._state["width"] = x.shape[1]

    def _traced_pair(self, x: torch.Tensor, float64: bool) -> tuple:
        """(the converted form of a sample deleting nothing, the encoder's own forward on the
        whole graph read out alike): on float64 copies, or on the modules themselves."""
        def cast(m: nn.Module) -> nn.Module:
            m = m.double()
            for sub in m.modules():  # plain tensor attributes (fx's constants among them)
                for k, v in list(vars(sub).items()):
                    if isinstance(v, torch.Tensor) and v.is_floating_point() and \
                            not isinstance(v, nn.Parameter):
                        setattr(sub, k, v.double())
            return m
        if float64:
            enc = cast(copy.deepcopy(self.encoder))
            ro = cast(copy.deepcopy(self.readout_module)) \
                if self.readout_module is not None else self.readout_kind
            twin = ConvertedEncoder(enc, self._graph_on(x.device), readout=ro,
                                    register=self.register, num_nodes=max(self.num_nodes,
                                                                          x.shape[0]))
            twin._graphs = {enc.training: self._graph(self.encoder.training)}  # this trace's
            twin._device_graph = {}  # (its values), not the copy's own: derived again from it
            twin.workspace = Workspace(min_bytes=1 << 62)  # keeps nothing: one call
            x = x.detach().double()
        else:
            twin, enc = self, self.encoder
        before = torch.get_default_dtype()
        with torch.no_grad():
            try:
                if float64:
                    torch.set_default_dtype(torch.float64)  # tensors the forward makes
                none = torch.full((1, 1), -1, dtype=torch.long)
                got = twin._run(x, twin.plan(none, x.shape[0]))
                want = enc(x, self._graph_on(x.device))
            finally:
                torch.set_default_dtype(before)
            if twin.readout_module is not None:
                want = twin.readout_module(want, index=torch.zeros(
                    want.shape[0], dtype=torch.long, device=want.device), dim_size=1)
            elif self.readout_kind == "sum_kept":
                want = want.sum(0, keepdim=True)
            elif self.readout_kind is not None:
                want = want.mean(0, keepdim=True)
            else:
                want = want.unsqueeze(0)
        if not float64:
            self._state["plan"] = None  # the check's plan is not the call's
        return got, want

    def _register_names(self) -> str:
        return ", ".join(f"{c.__name__}: {k.__name__}" for c, k in self.register.items())

    def _run(self, x: torch.Tensor, plan: _Plan) -> torch.Tensor:
        """The planned batch's output (a pooled tail's readout comes out of the execution)."""
        out = self._execute(x, plan)
        if isinstance(out, torch.Tensor):
            return out
        with _parts.timed("readout"):
            return self._readout(out, plan)

    def _called(self, training: bool) -> tuple:
        """The module paths the traced forward calls (its ``call_module`` nodes) in this mode."""
        self._graph(training)
        return self._traced_attrs[training][0]

    def _not_called(self, training: bool) -> tuple:
        """``(path, module, followed)`` of the modules the converted form does not call: the
        encoder and every module whose forward the trace followed (inlined; ``followed``), each
        convolution and HeteroConv with the convolutions and aggregation modules in it, a linear
        map fused with its typed convs (and its ReLU module) or run per part of a
        concatenation, and every module of a pooled tail. A fused GIN-MLP's maps are not: a
        hook on them unfuses it (``gin_mlp``)."""
        key = ("not called", training)
        if key not in self._device_graph:
            tail, typed = self._tail(training), self._typed(training)
            whole = {tl.lin.target for tl in typed.values()} | {
                p.target for tl in typed.values() for p in tl.parts} | {
                tl.relu.target for tl in typed.values()
                if tl.relu is not None and tl.relu.op == "call_module"}  # run in the push
            called = self._called(training)
            # the encoder and every module fx traced through (its forward inlined, a hook of
            # its called at trace time or not at all): none is called
            followed = {p: self._named[p]  # (a review: a module of functional operations
                        for p in self._traced_attrs[training][1]}  # too)
            computed: dict = {}
            for node in self._graph(training).nodes:
                if node.op != "call_module":
                    continue
                m = self._named[node.target]
                if node in tail or node.target in whole:
                    computed.update(m.named_modules(prefix=node.target))
                elif isinstance(m, (HeteroConv, MessagePassing)) or type(m) in self.register:
                    computed.update((p, s) for p, s in m.named_modules(prefix=node.target)
                                    if isinstance(s, (HeteroConv, MessagePassing, Aggregation))
                                    or type(s) in self.register)
                elif node.args and isinstance(node.args[0], fx.Node) and \
                        self._fused_cat(node.args[0]):
                    computed[node.target] = m
            self._device_graph[key] = tuple(
                [(p, m, True) for p, m in followed.items()]
                + [(p, m, False) for p, m in computed.items() if p not in followed])
        return self._device_graph[key]

    def _check_hooks(self) -> None:
        """Refuse a call hook on a module the converted form does not call (found by a user
        trial: a forward pre-hook on a conv, a hook on a pooled Linear and the legacy weight_norm
        were skipped, the output off by 18% to 110%)."""
        for path, m, followed in self._not_called(self.encoder.training):
            refuse_hooks(m, path, followed=followed)

    def _check_mode(self) -> None:
        """Refuse, in the encoder's current mode, what mixes rows only in train mode (among the
        modules the forward calls, and theirs)."""
        called = self._called(self.encoder.training)
        for path, m in self.encoder.named_modules():
            if isinstance(m, MODE_DEPENDENT) and (path in called or path.startswith(
                    tuple(c + "." for c in called))):
                per_node_problem(m, path, at_convert=False)

    def wildtype(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, H]``: the encoder on the whole graph."""
        return self.encoder(x, self._graph_on(x.device))

    def _execute(self, x: torch.Tensor, plan: _Plan) -> _Val:
        env: dict = {}
        self._state["grouped"] = {}  # this call's grouped products, per input fx node
        self._state["sites"] = itertools.count()  # this call's workspace sites, in call order
        dev = x.device
        graph_dev = self._graph_on(dev)
        sums = self._sums(self.encoder.training)
        tail = self._tail(self.encoder.training)
        typed = self._typed(self.encoder.training)
        fused, in_fused = self._live_sums(plan, dev)
        timing = _parts.active()  # each node's forward a part of its own (.parts)
        try:
            for node in self._graph(self.encoder.training).nodes:
                if timing:
                    if node in tail:  # a pooled tail's module: computed by the readout, at output
                        _parts.cover("readout", str(node.target) if node.op == "call_module"
                                     else node.name)
                    else:
                        _parts.switch(self._part_label(node, fused, tail))
                rows = plan.rows[node]
                if node in tail:
                    continue
                if node in typed and plan.typed[typed[node].lin][0] is not None:
                    tl = typed[node]
                    env[node] = self._run_typed(tl, env, plan, dev) if node is tl.lin else \
                        env[tl.lin] if node is tl.relu else None
                    continue
                if node.op == "output" and tail:
                    return self._pooled_readout(output_value(node.graph), tail, env, plan, dev)
                if node.op == "placeholder":
                    if isinstance(rows, _Rows):
                        env[node] = _Val(x, x.new_zeros(rows.count, x.shape[1]), rows)
                    else:
                        env[node] = graph_dev if rows[1] is None else graph_dev[rows[1]]
                elif node.op == "get_attr":
                    env[node] = _attr(self.encoder, node.target)
                elif node.op == "output":
                    out = node.args[0]
                    val = env[out[0] if isinstance(out, (list, tuple)) else out]
                    if isinstance(val, _Val) and val.wt.dim() != 2:  # a review: an IndexError
                        raise ConvertError(  # in a readout
                            f"the encoder returns a value of shape {list(val.wt.shape)} on the "
                            "whole graph; convert needs [N, H], one row per gene")
                    return val
                elif node in in_fused:
                    env[node] = None  # computed by its fused sum
                elif node in fused and node.op == "call_module":  # a HeteroConv's sum, fused
                    val = self._run_fused_sum(node, fused[node], env[next(iter(
                        node.args[0].values()))], plan, dev)
                    env[node] = {et[2]: val for et in self._named[node.target].convs.keys()}
                elif node.op == "call_module":
                    env[node] = self._run_module(node, plan, env, dev)
                elif node.op == "call_function" and isinstance(env.get(node.args[0]), dict):
                    env[node] = env[node.args[0]][node.args[1]]
                elif node in sums[0]:
                    env[node] = None  # computed by the chain's last add
                elif node in fused:
                    env[node] = self._run_fused_sum(node, fused[node],
                                                    env[sums[1][node][0].args[0]], plan, dev)
                elif node in sums[1]:
                    env[node] = self._run_sum([env[o] for o in sums[1][node]], rows, plan, dev)
                elif self._fused_cat(node) and all(isinstance(env.get(a), _Val)
                                                   for a in node.args[0]):
                    env[node] = _CatParts([env[a] for a in node.args[0]], rows)
                else:
                    env[node] = self._run_function(node, rows, env, plan, dev)
            raise ValueError("the traced forward has no output")
        finally:
            if timing:
                _parts.switch(None)

    def _part_label(self, node: fx.Node, fused: dict, tail: set) -> str:
        """The part a node's time is booked to (:mod:`.parts`): a fused sum's convs' common
        path with ``*`` (``convs.1.*``), a module's path, the readout, or the node's name."""
        owner = next((f for f, (fs, _) in fused.items() if node in (fs.ops or ())), None)
        if owner is not None:  # an operand its fused sum computes: booked to the sum
            node = owner
        if node in fused:
            names = [_name(c) for c in fused[node][0].convs]
            if len(names) == 1:
                return names[0]
            common = os.path.commonprefix(names)
            cut = max(common.rfind("."), common.rfind("["))
            return (common[:cut + 1] if cut >= 0 else common) + "*"
        if node.op == "call_module":
            return str(node.target)
        if node.op == "output":
            return "readout" if tail else "output"
        return node.name

    def _site(self) -> tuple:
        """The next workspace site of this call: ``(workspace, ordinal)`` (:mod:`.workspace`;
        a call's sites come in the order of the traced forward, the same at every step)."""
        return self.workspace, next(self._state["sites"])

    def _sums(self, training: bool) -> tuple[set, dict]:
        """Chains of ``+`` over module outputs: the inner adds and, per last add, its operands in
        order (summed at once: one union of changed rows, one pick per operand)."""
        key = ("sums", training)
        if key in self._device_graph:
            return self._device_graph[key]

        def is_add(n):
            return n.op == "call_function" and n.target is operator.add and len(n.args) == 2 \
                and not n.kwargs

        def module_value(a):
            return isinstance(a, fx.Node) and a.op == "call_module" and \
                not isinstance(self._named[a.target], HeteroConv)

        inner: set = set()
        final: dict = {}
        for n in self._graph(training).nodes:
            if not is_add(n):
                continue
            a0, a1 = n.args
            zero = isinstance(a0, int) and not isinstance(a0, bool) and a0 == 0
            if not module_value(a1) or not (zero or module_value(a0) or a0 in inner):
                continue
            users = list(n.users)
            if len(users) == 1 and is_add(users[0]) and users[0].args[0] is n and \
                    module_value(users[0].args[1]):
                inner.add(n)
            elif isinstance(a0, fx.Node) and a0 in inner:
                ops, cur = [], n
                while cur is n or (isinstance(cur, fx.Node) and cur in inner):
                    ops.append(cur.args[1])
                    cur = cur.args[0]
                if isinstance(cur, fx.Node):
                    ops.append(cur)
                final[n] = ops[::-1]
        self._device_graph[key] = (inner, final)
        return inner, final

    def _run_sum(self, vals: list, rows: _Rows, plan: _Plan, dev) -> _Val:
        """The sum of ``vals`` at ``rows``: the wildtypes summed left to right, as the chain of
        adds; the values as :class:`_SumAt` (the summed wildtype at every row, plus each
        operand's changed rows less its wildtype)."""
        wt = vals[0].wt + vals[1].wt
        for v in vals[2:]:
            wt = wt.add_(v.wt)
        k = ("sum", id(rows))
        ops = []
        for v in vals:
            ops += [v.wt, v.values, plan.dev(k + (id(v.rows), "pos"), None, dev),
                    plan.rows_on(v.rows, "gene", dev)]
        gene_u = None if rows.dense else plan.rows_on(rows, "gene", dev)
        return _Val(wt, _SumAt.apply(wt, plan.batch_size, gene_u, self._site(), *ops), rows)

    def _run_module(self, node: fx.Node, plan: _Plan, env: dict, dev):
        m = self._named[node.target]
        if isinstance(m, HeteroConv):
            vin = env[next(iter(node.args[0].values()))]
            outs = []
            for et, conv in m.convs.items():
                k = (f"{node.target}[{_key(et)}]", et)
                if k in plan.convs:
                    outs.append(self._run_conv(plan.convs[k], conv, vin, plan, dev))
            rows = plan.rows[node][next(iter(plan.rows[node]))]
            outs = [_to_rows(v, rows, plan, dev) for v in outs]
            if m.aggr == "cat":
                val = _Val(torch.cat([v.wt for v in outs], -1),
                           torch.cat([v.values for v in outs], -1), rows)
            else:
                val = _Val(sum(v.wt for v in outs), sum(v.values for v in outs), rows)
                if m.aggr == "mean":
                    val = _Val(val.wt / len(outs), val.values / len(outs), rows)
            return {et[2]: val for et in m.convs.keys()}
        if isinstance(m, MessagePassing) or type(m) in self.register:
            key = plan.rows[node.args[1]][1]
            return self._run_conv(plan.convs[(node.target, key)], m, env[node.args[0]], plan,
                                  dev)
        v = env[node.args[0]]
        if isinstance(v, _CatParts):
            return self._run_linear_of_cat(m, v, plan, dev)
        with _parts.timed(_parts.WILDTYPE):
            wt = m(v.wt)
        return _Val(wt, per_row(m, v.values, self._site()), v.rows)  # (:mod:`.chunks`)

    def _run_typed(self, tl, env: dict, plan: _Plan, dev) -> _Val:
        """A fused typed layer (:mod:`.convert_typed`) by the workbook's own kernels: each type's
        map before the push, the ReLU inside it."""
        form, order, types = plan.typed[tl.lin]
        corr_rows = plan.corr[types][1]
        m = self._named[tl.lin.target]
        vin = env[tl.src]
        b, n = plan.keep.shape
        ho, t = m.weight.shape[0], len(order)
        w = m.weight if order == list(range(t)) else \
            m.weight.view(ho, t, -1)[:, order].reshape(ho, -1)  # blocks in the graph's order
        nb = self._node_batch(plan, tl.aggr, types, dev, vin.wt.dtype)
        relu = tl.relu is not None
        eps = self._named[tl.parts[0].target].eps  # its buffer (equal in every part): no read
        for p in tl.parts:
            self._widths[(p.target, plan.rows[p.args[1]][1])] = int(ho)
        if form == "first":
            h = nb.first_layer_delta(vin.wt, w, m.bias, eps=eps, relu=relu)
            gene = plan.dev(("corr_gene", types), None, dev)
            values = h.wildtype.index_select(0, gene) + h.delta
            # a deleted gene's own row: its x is zero and it receives nothing, so the map's bias
            # (the kernels keep its x there: the workbook's model never reads that row)
            own = values.new_zeros(ho) if m.bias is None else m.bias
            own = own.relu() if relu else own
            deleted = plan.dev(("corr_deleted", types), None, dev).unsqueeze(1)
            return _Val(h.wildtype, torch.where(deleted, own, values), plan.rows[tl.lin])
        gene = plan.rows_on(vin.rows, "gene", dev)
        d = vin.values - vin.wt.index_select(0, gene)
        if vin.rows.count != corr_rows.count:  # within the correction rows, not all
            d = d.new_zeros(corr_rows.count, d.shape[1]).index_copy(
                0, plan.dev(("typed_pos", id(tl.lin)), None, dev), d)
        parts = nb.delta_parts(DeltaFeatures(vin.wt, d, plan.dev(("corr_flat", types), None,
                                                                 dev), b), w, m.bias, eps)
        if relu:  # its rows made only if read: a pooled readout reads them inside the push
            return _PushedVal(nb, parts, plan.rows[tl.lin])
        return _Val(parts[0], _push_rows(nb, parts, relu=False), plan.rows[tl.lin])

    def _node_batch(self, plan: _Plan, aggr: str, types: tuple, dev, dtype) -> NodeMaskBatch:
        """The batch as the workbook's own kernels take it, on ``dev`` (made once per plan)."""
        key = ("node_batch", aggr, types, dev, dtype)
        if key not in plan._dev:
            corr = plan.corr[types][0]
            corr = corr if dev.type == "cpu" else corr.to(dev)
            corr = dataclasses.replace(corr, **{  # the CPU backward's selections, in dtype
                f: getattr(corr, f).to(dtype) for f in corr.BACKWARD_ONLY_ON_CPU
                if getattr(corr, f) is not None and getattr(corr, f).dtype != dtype})
            nb = NodeMaskBatch(self._shared(plan.num_nodes, aggr, dev, types, dtype),
                               plan.deleted, corr, validate=False)
            nb.keep = nb.keep.to(dtype)
            plan._dev[key] = nb
        return plan._dev[key]

    def _fused_cat(self, node: fx.Node) -> bool:
        """A ``torch.cat`` on features of module outputs whose one user is a linear map: the map
        runs per part, each on its own changed rows (:meth:`_run_linear_of_cat`)."""
        if node.op != "call_function" or node.target not in (torch.cat, torch.concat) or \
                len(node.users) != 1 or node.kwargs.get("out") is not None:
            return False
        dim = call_dim(node, 0)
        user = next(iter(node.users))
        return dim in (-1, 1) and isinstance(node.args[0], (list, tuple)) and \
            all(isinstance(a, fx.Node) for a in node.args[0]) and \
            user.op == "call_module" and user.args == (node,) and not user.kwargs and \
            isinstance(self._named[user.target], (nn.Linear, PygLinear))

    def _run_linear_of_cat(self, m: nn.Module, cat: "_CatParts", plan: _Plan, dev) -> _Val:
        """``m(cat(parts, -1))`` as the sum over parts of ``part @ W_part^T`` (plus the bias): each
        part's map on its own changed rows, then summed at the concatenation's rows, where the
        concatenation would copy every part to every changed row at the full width first."""
        widths = [v.wt.shape[1] for v in cat.parts]
        if sum(widths) != m.weight.shape[1]:  # let the plain call raise its own error
            return _Val(m(torch.cat([v.wt for v in cat.parts], -1)),
                        m(torch.cat([_to_rows(v, cat.rows, plan, dev).values
                                     for v in cat.parts], -1)), cat.rows)
        wt = values = None
        for v, w in zip(cat.parts, m.weight.split(widths, dim=1)):
            with _parts.timed(_parts.WILDTYPE):
                part_wt = F.linear(v.wt, w)
            u = _to_rows(_Val(part_wt, F.linear(v.values, w), v.rows), cat.rows, plan, dev)
            wt = u.wt if wt is None else wt + u.wt
            values = u.values if values is None else values + u.values
        if m.bias is not None:
            wt, values = wt + m.bias, values + m.bias
        return _Val(wt, values, cat.rows)

    def _run_conv(self, cp: _ConvPlan, m: nn.Module, vin: _Val, plan: _Plan, dev) -> _Val:
        kind, h = cp.kind, cp.host
        if cp.grouped:
            return self._run_grouped(cp, m, vin, plan, dev)
        if cp.dense_group:
            return self._run_dense_grouped(cp, m, vin, plan, dev)
        with _parts.timed(_parts.WILDTYPE):
            wt = self._wildtype_conv(cp, m, vin.wt, dev)
        k = (cp.path, cp.edges.key)
        gcn = kind is GCNConv
        if cp.rows_out.dense:
            b, n = plan.keep.shape
            full = _full(vin, plan, dev, self._site())  # [B, N, F]
            src = m.lin(full) if gcn else full
            keep = plan.dev(k + ("keep",), h["keep"], dev, src.dtype).unsqueeze(-1)
            scale = keep
            if gcn and m.normalize:
                dinv = plan.dev(k + ("dinv",), h["dinv"], dev, src.dtype).unsqueeze(-1)
                scale = keep * dinv
            a = self._adjacency(cp.edges, dev, src.dtype)
            w = src.shape[-1]
            agg = torch.sparse.mm(a, (src * scale).transpose(0, 1).reshape(n, b * w))
            agg = agg.view(n, b, w).transpose(0, 1) * scale
            if not gcn and m.aggr == "mean":
                agg = agg * plan.dev(k + ("inv",), h["inv_cnt"], dev, src.dtype).unsqueeze(-1)
            self_x, agg = src.reshape(b * n, w), agg.reshape(b * n, w)
            if gcn and m.normalize:
                self_x = self_x * plan.dev(k + ("sc",), h["self_coef"], dev,
                                           src.dtype).reshape(b * n, 1)
        else:
            table = vin.table()
            if gcn:
                table = m.lin(table)
            # the changed rows' in-edges as one CSR product: a gather and scatter-add whose
            # backward on the CPU is a serial scatter (several times the product's time)
            val = plan.dev(k + ("w",), h["weight"], dev, table.dtype) if "weight" in h \
                else table.new_ones(h["src"].numel())
            a = torch.sparse_csr_tensor(plan.dev(k + ("crow",), h["crow"], dev),
                                        plan.dev(k + ("src",), h["src"], dev), val,
                                        (cp.rows_out.count, table.shape[0]),
                                        check_invariants=False)
            agg = torch.sparse.mm(a, table)
            self_x = table.index_select(0, plan.dev(k + ("self",), h["self_idx"], dev))
            if gcn and m.normalize:
                self_x = self_x * plan.dev(k + ("sc",), h["self_coef"], dev,
                                           table.dtype).unsqueeze(1)
        self._widths[k] = int(agg.shape[-1])
        return _Val(wt, _finish(cp.kind, m, agg, self_x, ws=self._site()), cp.rows_out)

    def _group_products(self, src, vin: _Val, plan: _Plan, dev) -> tuple:
        """A delta group's two stacked products, made at its first conv's call: the wildtype's
        aggregations (split per conv), the push and own rows over ``cat([wildtype, D])``
        (:func:`_push_host`, split per conv: push, own, push, ...), and each conv's place."""
        grouped = self._state["grouped"]
        g = ("g", id(src))
        if src not in grouped:
            cps, sizes = plan.groups[src]
            with _parts.timed(_parts.WILDTYPE):
                wt = _StackedSpMM.apply(vin.wt, *self._wildtype_stack(cps, dev, vin.wt.dtype))
            have = _has_transposes(plan, g, len(sizes))
            if not have and (dev.type != "cpu" or watched()):  # a GPU's backward, or a watched
                with host_side():  # one (which takes the transposed products): made here
                    _host_transposes(plan, g, sizes)
                have = True
            ncol = plan.index[g + ("a", "shape")][1]
            a, *ats = (torch.sparse_csr_tensor(
                plan.dev(t + ("crow",), None, dev), plan.dev(t + ("col",), None, dev),
                plan.dev(t + ("val",), None, dev, vin.wt.dtype),
                shape, check_invariants=False)
                for t, shape in [(g + ("a",), plan.index[g + ("a", "shape")])]
                + ([(g + ("at", i), (ncol, c)) for i, c in enumerate(sizes)] if have else []))
            gene = plan.rows_on(vin.rows, "gene", dev)
            d = vin.values - vin.wt.index_select(0, gene)
            delta = _SpMMParts.apply(torch.cat([vin.wt, d]), a, sizes, self._site(), *ats)
            grouped[src] = (wt.split(vin.wt.shape[0]), delta,
                            {id(c): i for i, c in enumerate(cps)})
        return grouped[src]

    def _run_grouped(self, cp: _ConvPlan, m: nn.Module, vin: _Val, plan: _Plan, dev) -> _Val:
        """A delta conv whose aggregation comes from its group's two stacked products
        (:meth:`_group_products`)."""
        wts, deltas, at = self._group_products(cp.src, vin, plan, dev)
        i = at[id(cp)]
        k = ("g", id(cp.src)) + (cp.path, cp.edges.key)
        genes = plan.dev(k + ("genes",), None, dev)
        gfac = plan.dev(k + ("gfac",), None, dev, vin.wt.dtype)
        self._widths[(cp.path, cp.edges.key)] = int(vin.wt.shape[-1])
        with _parts.timed(_parts.WILDTYPE):
            wt = _finish(cp.kind, m, wts[i], vin.wt, ws=self._site())
        return _Val(wt, _finish(cp.kind, m, deltas[2 * i], deltas[2 * i + 1],
                                (wts[i], genes, gfac), ws=self._site()), cp.rows_out)

    def _run_fused_sum(self, node: fx.Node, live: tuple, vin: _Val, plan: _Plan, dev) -> _Val:
        """A fused sum (``live``: its :class:`_FusedSum` and its convs' maps, from
        :meth:`_live_sums`; ``vin`` its convs' input), by its kind."""
        fs, maps = live
        run = self._run_dense_sum if fs.kind == "dense" else self._run_delta_sum
        return run(node, fs.convs, maps, vin, plan, dev)

    def _run_delta_sum(self, node: fx.Node, cps: list, maps: list, vin: _Val, plan: _Plan,
                       dev) -> _Val:
        """A sum of one delta group's GIN-MLPs (``cps`` in the sum's order, ``maps`` theirs;
        ``vin`` their input): the wildtype conv by conv on ``[N, F]`` and summed as the chain of
        adds, the changed rows by :class:`.convert_dense.DeltaGinSum`."""
        rows = _sum_rows(plan, node)
        wts, deltas, at = self._group_products(cps[0].src, vin, plan, dev)
        dtype = vin.wt.dtype
        mods = [self._conv_module(c.path, c.edges.key) for c in cps]
        with _parts.timed(_parts.WILDTYPE):
            wto = [_finish(GINConv, m, wts[at[id(c)]], vin.wt, ws=self._site())
                   for m, c in zip(mods, cps)]
            wt = wto[0] + wto[1] if len(wto) > 1 else wto[0]  # (a HeteroConv's may be one)
            for w in wto[2:]:
                wt = wt.add_(w)
        idx, params = [], []
        for c, m, w, (lin1, lin2) in zip(cps, mods, wto, maps):
            i = at[id(c)]
            k = ("g", id(c.src), c.path, c.edges.key)
            idx.append((plan.dev(k + ("genes",), None, dev),
                        plan.dev(k + ("gfac",), None, dev, dtype),
                        plan.dev(("sum", id(rows), id(c.rows_out), "pos"), None, dev),
                        plan.index[("dsum_off", id(c.rows_out))]))
            params += [deltas[2 * i], deltas[2 * i + 1], wts[i], w, 1 + m.eps, lin1.weight,
                       lin1.bias, lin2.weight, lin2.bias]
            self._widths[(c.path, c.edges.key)] = int(vin.wt.shape[-1])
        gene_u = None if rows.dense else plan.rows_on(rows, "gene", dev)
        return _Val(wt, DeltaGinSum.apply(wt, gene_u, plan.index[("dsum_off", id(rows))],
                                          self._site(), idx, *params), rows)

    def _run_dense_grouped(self, cp: _ConvPlan, m: nn.Module, vin: _Val, plan: _Plan,
                           dev) -> _Val:
        """A dense conv (not GCN) whose aggregation, with its dense group's, is a block of
        samples at a time (:class:`_SlabParts`: a sample on a CPU, the whole batch on a GPU),
        per type the adjacency times the input with its deleted rows zeroed; then each row
        scaled by whether it is kept (a deleted gene receives nothing) and, for a mean, by its
        kept in-degree."""
        key = ("dense", cp.src)
        grouped = self._state["grouped"]
        if key not in grouped:
            cps = plan.dense_groups[cp.src]
            b, n = plan.keep.shape
            full = _full(vin, plan, dev, self._site())  # [B, N, F]
            f, dtype = full.shape[-1], full.dtype
            keep = plan.dev(("keep_bn1",), None, dev, dtype)
            mats = [self._stack([c.edges], [False], dev, dtype) for c in cps]
            scale = plan.dev(("dscale", id(cp.src)), None, dev, dtype)  # [B, T, N, 1]
            aggs = _SlabParts.apply(full * keep, scale, block_size(dev, b), self._site(),
                                    *[m[0] for m in mats], *[m[1] for m in mats])
            with _parts.timed(_parts.WILDTYPE):
                wt = _StackedSpMM.apply(vin.wt, *self._wildtype_stack(cps, dev, dtype))
            grouped[key] = (wt.split(n), aggs, full.reshape(b * n, f),
                            {id(c): i for i, c in enumerate(cps)})
        wts, aggs, self_x, at = grouped[key]
        i = at[id(cp)]
        self._widths[(cp.path, cp.edges.key)] = int(aggs[i].shape[-1])
        with _parts.timed(_parts.WILDTYPE):
            wt = _finish(cp.kind, m, wts[i], vin.wt, ws=self._site())
        return _Val(wt, _finish(cp.kind, m, aggs[i], self_x, ws=self._site()), cp.rows_out)

    def _run_dense_sum(self, node: fx.Node, cps: list, maps: list, vin: _Val, plan: _Plan,
                       dev) -> _Val:
        """A sum of one dense group's GIN-MLPs (``cps``, ``maps`` theirs; ``vin`` their input):
        the wildtype conv by conv on ``[N, F]``, the batch by
        :class:`.convert_dense.DenseGinSum`."""
        full = _full(vin, plan, dev, self._site())  # [B, N, F]
        b, n, f = full.shape
        dtype = full.dtype
        mods = [self._conv_module(c.path, c.edges.key) for c in cps]
        with _parts.timed(_parts.WILDTYPE):
            wts = _StackedSpMM.apply(vin.wt, *self._wildtype_stack(cps, dev, dtype)).split(n)
            wt = None
            for m, w in zip(mods, wts):
                o = _finish(GINConv, m, w, vin.wt, ws=self._site())
                wt = o if wt is None else wt + o
        params = []
        for m, (lin1, lin2) in zip(mods, maps):
            params += [1 + m.eps, lin1.weight, lin1.bias, lin2.weight, lin2.bias]
        for c in cps:
            self._widths[(c.path, c.edges.key)] = int(f)
        values = DenseGinSum.apply(
            full, plan.dev(("keep_bn1",), None, dev, dtype),
            plan.dev(("dscale", id(cps[0].src)), None, dev, dtype), block_size(dev, b),
            [self._stack([c.edges], [False], dev, dtype) for c in cps], self._site(), *params)
        return _Val(wt, values, _sum_rows(plan, node))

    def _wildtype_stack(self, cps: list, dev, dtype) -> tuple:
        """The convs' stacked wildtype aggregations (CSR ``[len(cps) * N, N]``), then each conv's
        own transpose (CSR ``[N, N]``): :class:`_StackedSpMM`'s arguments."""
        pairs = [self._stack([c.edges], [c.mean], dev, dtype) for c in cps]
        a = pairs[0][0] if len(cps) == 1 else self._stack(
            [c.edges for c in cps], [c.mean for c in cps], dev, dtype, pair=False)[0]
        return (a, *(at for _, at in pairs))

    def _stack(self, edges: list, means: list, dev, dtype, pair: bool = True) -> tuple:
        """CSR ``[len(edges) * N, N]``: the edge types' adjacencies stacked (a mean's rows divided
        by the wildtype in-degree), and its transpose (None unless ``pair``); made once per
        graph."""
        key = ("stack", tuple(id(e) for e in edges), tuple(means), dev, dtype, pair)
        if key not in self._device_graph:
            rows, cols, vals, off = [], [], [], 0
            for e, mean in zip(edges, means):
                n = e.num_nodes
                cnt = e.in_ptr[1:] - e.in_ptr[:-1]
                rows.append(torch.repeat_interleave(torch.arange(n), cnt) + off)
                cols.append(e.in_src)
                w = torch.ones(e.in_src.numel(), dtype=torch.float64)
                if mean:
                    w = w / torch.repeat_interleave(cnt.clamp(min=1).double(), cnt)
                vals.append(w)
                off += n
            n = edges[0].num_nodes
            self._device_graph[key] = _csr_pair(torch.cat(rows), torch.cat(cols),
                                                torch.cat(vals), off, n, dev, dtype, pair)
        return self._device_graph[key]

    def _wildtype_conv(self, cp: _ConvPlan, m: nn.Module, x: torch.Tensor, dev) -> torch.Tensor:
        """The conv on the whole graph, as one sparse product (no device read, unlike PyG's GCN)."""
        e, gcn = cp.edges, cp.kind is GCNConv
        src = m.lin(x) if gcn else x
        a = self._adjacency(e, dev, src.dtype)
        if gcn and m.normalize:
            fill = gcn_fill(m)
            dinv = self._degree_scale(e, dev, src.dtype, fill)
            agg = torch.sparse.mm(a, src * dinv) * dinv
            coef = self._device_graph.setdefault(("gcn_self", id(e), dev, src.dtype, fill), (
                fill * ~e.loop).to(src.dtype).unsqueeze(1).to(dev))
            return _finish(cp.kind, m, agg, src * (coef * dinv * dinv))
        agg = torch.sparse.mm(a, src)
        if not gcn and m.aggr == "mean":
            agg = agg * self._degree_scale(e, dev, src.dtype, None)
        return _finish(cp.kind, m, agg, src)

    def _degree_scale(self, e: _Edges, dev, dtype, fill: float | None) -> torch.Tensor:
        """``[N, 1]``: GCN's ``(deg + fill)^-1/2`` (``fill`` on the genes without a self-loop; 0
        where the sum is 0), or ``1 / max(deg, 1)`` when ``fill`` is None."""
        key = ("deg", id(e), dev, dtype, fill)
        if key not in self._device_graph:
            d = e.deg.double()
            s = _inv_sqrt(d + fill * ~e.loop) if fill is not None else 1.0 / d.clamp(min=1)
            self._device_graph[key] = s.to(dtype).unsqueeze(1).to(dev)
        return self._device_graph[key]

    def _adjacency(self, e: _Edges, dev, dtype) -> torch.Tensor:
        key = ("adj", id(e), dev, dtype)
        if key not in self._device_graph:
            n = e.num_nodes
            dst = torch.repeat_interleave(torch.arange(n), e.in_ptr[1:] - e.in_ptr[:-1])
            a = torch.sparse_coo_tensor(torch.stack([dst, e.in_src]),
                                        torch.ones(dst.numel(), dtype=dtype), (n, n),
                                        check_invariants=False)
            self._device_graph[key] = a.coalesce().to_sparse_csr().to(dev)
        return self._device_graph[key]

    def _run_function(self, node: fx.Node, rows: _Rows | None, env: dict, plan: _Plan, dev):
        if node.target is F.dropout or node.target == "dropout":
            training = node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True)
            p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
            if training and p > 0:
                # found by a user trial: an encoder in eval mode was told to call eval(), where
                # F.dropout drops whatever the module's mode unless told training=False (the
                # trace records training=True whether given or left at its default)
                where = node_where(node)
                raise ConvertError(
                    f"F.dropout at {where} (p={p}) " + (
                        "in train mode draws a different mask per sample; set p=0 or call "
                        "encoder.eval()" if self.encoder.training else
                        # a user trial: to_hetero's trace fixed training=self.training to True
                        "drops in any mode: a module made by an fx trace (such as "
                        "to_hetero's) fixed its training argument when it was traced, so the "
                        "mode no longer reaches it; use an nn.Dropout module in the model you "
                        "trace, then call encoder.eval()" if "<eval_with_key>" in where else
                        "drops in any mode (its training argument defaults to True, not to "
                        "the module's mode) and draws a different mask per sample; pass "
                        "training=self.training, or use an nn.Dropout module, then call "
                        "encoder.eval()"))
        if node.target in (torch.cat, torch.concat):
            dim = call_dim(node, 0)
            if dim not in (-1, 1):
                raise ConvertError(f"torch.cat at {node.name} joins along dim {dim}, not the "
                                   "features (dim=-1); convert cannot follow it")
        # a product is per row only for an [N, F] value times a weight (a review: a per-gene
        # [N] value times an [N, K] sums genes; F.linear's too), and a weight is never taken
        # row by row, whatever its first dimension
        if node.target is torch.stack:  # along any dim but the genes' (0, or -(rank + 1))
            dim = call_dim(node, 0)
            ranks = {env[a].wt.dim() for a in node.all_input_nodes if isinstance(env.get(a), _Val)}
            if ranks and any(dim % (r + 1) == 0 for r in ranks):
                raise ConvertError(f"torch.stack at {node_where(node)} stacks along dim {dim}, "
                                   "the genes' for these values; stack along a new last dim "
                                   "(dim=-1) or move it out of the encoder")
        product = node.target in MATMUL or node.target is F.linear
        if along_features(node) or product:  # dim -1 is the features only of an [N, F] value
            dim = call_dim(node, None)
            vals = [a for a in node.all_input_nodes if isinstance(env.get(a), _Val)]
            if node.op == "call_method" and of_stack(node):  # any dim but the genes' (0) of
                # whatever rank (a review: a stack of [N] values, [N, L], summed over dim -2)
                over = [a for a in vals if not (isinstance(dim, int) and
                                                dim % env[a].wt.dim() != 0)]
                if over:
                    raise ConvertError(
                        f"{op_name(node)} at {node_where(node)} runs along dim {dim} of a "
                        f"stacked value of shape {list(env[over[0]].wt.shape)}, the genes' dim "
                        "for that shape, which is across genes; reduce over the stacked dim "
                        "(dim=-1), or move it out of the encoder")
                flat = []
            else:  # (a review: a per-gene [N] value's -1 is the genes)
                flat = [a for a in vals if env[a].wt.dim() != 2]
            if flat:
                shape = list(env[flat[0]].wt.shape)
                raise ConvertError(
                    f"{op_name(node)} at {node_where(node)} " + (
                        f"multiplies a value of shape {shape} (not [genes, features]), which "
                        "sums over genes; multiply an [N, F] value by a weight" if product else
                        f"runs along dim {dim if isinstance(dim, int) else -1} of a value of "
                        f"shape {shape} (not [genes, features]), which is across genes; apply "
                        "it to an [N, F] value") +
                    ", or move it out of the encoder")
        if rows is None:  # no node value involved
            return _call(node, fx.node.map_arg(node.args, lambda a: env[a]),
                         fx.node.map_arg(node.kwargs, lambda a: env[a]))

        def part(which: str):
            def pick(a):
                v = env[a]
                if isinstance(v, _Val):
                    return v.wt if which == "wt" else _to_rows(v, rows, plan, dev).values
                if isinstance(v, torch.Tensor) and which == "values" and not product and \
                        v.dim() >= 2 and v.shape[0] == plan.num_nodes:  # a per-gene constant
                    return v.index_select(0, plan.rows_on(rows, "gene", dev))
                return v
            return (fx.node.map_arg(node.args, pick), fx.node.map_arg(node.kwargs, pick))
        args, kwargs = part("values")
        if row_function(node) and len(args) == 1 and not kwargs and \
                isinstance(args[0], torch.Tensor):  # a chunk of rows at a time (:mod:`.chunks`)
            return _Val(_call(node, *part("wt")), per_row(
                lambda xc: _call(node, (xc,), {}), args[0], self._site()), rows)
        return _Val(_call(node, *part("wt")), _call(node, args, kwargs), rows)

    def _pooled_readout(self, out: fx.Node, tail: set, env: dict, plan: _Plan, dev):
        """``[B, H]``: the weighted-sum readout of the tail's output, from the tail's inputs."""
        b, n = plan.keep.shape
        diffs: dict = {}

        def leaf(v, w):
            if not isinstance(v, _Val):
                raise ConvertError("the pooled readout reads a value that is not per gene")
            if v.rows.dense:
                return torch.bmm(w.unsqueeze(1), v.values.view(b, n, -1)).squeeze(1)
            base = w @ v.wt
            if not v.rows.count:
                return base
            if id(v) not in diffs:
                gene = plan.rows_on(v.rows, "gene", dev)
                diffs[id(v)] = (v, v.values - v.wt.index_select(0, gene))
            wv = w.reshape(-1).index_select(0, plan.rows_on(v.rows, "flat", dev)).unsqueeze(1)
            return base.index_add(0, plan.rows_on(v.rows, "sample", dev),
                                  diffs[id(v)][1] * wv)

        def spread(node, w):
            m = self._named[node.target]
            key = plan.rows[node.args[1]][1]
            e = self.edges(n)[key]
            if m.aggr == "mean":
                w = w * plan.dev(("inv_cnt", key), None, dev, w.dtype)
            a, at = self._stack([e], [False], dev, w.dtype)
            return _SpMM.apply(w.t().contiguous(), at, a).t() * \
                plan.dev(("keepf",), None, dev, w.dtype)

        # two passes: the first records every weight a dense input is read with (and each
        # spread, which the second replays), so that each dense input is read once, by one
        # product with all its weights stacked, not once per weight
        asked: dict = {}
        spreads: list = []

        def ask(v, w):
            if isinstance(v, _Val) and v.rows.dense:
                asked.setdefault(id(v), (v, []))[1].append(w)
            return w.new_zeros(b, v.wt.shape[1]) if isinstance(v, _Val) else leaf(v, w)

        def record(node, w):
            spreads.append(spread(node, w))
            return spreads[-1]

        dtype = next(v.wt.dtype for v in env.values() if isinstance(v, _Val))
        w0 = plan.dev(("w0",), None, dev, dtype)
        Pooler(tail, self._named, self._kind_of, env, ask, record).pool(out, w0)
        answers = {k: list((v.pooled(torch.stack(ws, 1)) if isinstance(v, _PushedVal) else
                            torch.bmm(torch.stack(ws, 1), v.values.view(b, n, -1))).unbind(1))
                   for k, (v, ws) in asked.items()}
        replay = iter(spreads)

        def answer(v, w):
            return answers[id(v)].pop(0) if id(v) in answers else leaf(v, w)

        pooler = Pooler(tail, self._named, self._kind_of, env, answer,
                        lambda node, w: next(replay))
        res = pooler.pool(out, w0)
        for node, width in pooler.widths.items():
            self._widths[(node.target, plan.rows[node.args[1]][1])] = int(width)
        return res

    def _readout(self, out: _Val, plan: _Plan) -> torch.Tensor:
        b, n = plan.keep.shape
        dev = out.wt.device
        if self.readout_kind is None and self.readout_module is None:
            return _full(out, plan, dev, self._site())
        if self.readout_module is not None:
            cuts = sample_chunks(b, n, out.wt.shape[1], out.wt.element_size()) \
                if may_chunk(out.wt) and chunkable_readout(self.readout_module) else [(0, b)]
            if len(cuts) > 1:  # a chunk of samples at a time (:mod:`.chunks`)
                idx, index = _chunk_picks(plan, cuts)
                parts = PickChunks.apply(self._site(), out.wt, out.values, *idx)
                return chunked_readout(self.readout_module, list(parts), index, cuts)
            return self.readout_module(_pick(out, ("kept",), plan, dev),
                                       index=plan.dev(("kept_b",), None, dev), dim_size=b)
        rows = out.rows
        wt_rows = out.wt.index_select(0, plan.rows_on(rows, "gene", dev))
        vals = out.values * plan.dev(("r_kept",), None, dev, out.values.dtype).unsqueeze(1)
        rb = plan.rows_on(rows, "sample", dev)
        total = out.wt.sum(0).expand(b, -1) if not rows.dense else 0
        if not rows.dense:
            total = total - out.wt.new_zeros(b, out.wt.shape[1]).index_add(0, rb, wt_rows)
        total = total + out.wt.new_zeros(b, out.wt.shape[1]).index_add(0, rb, vals)
        if self.readout_kind == "sum_kept":
            return total
        if self.readout_kind == "mean":
            return total / n
        return total / plan.dev(("nkept",), None, dev, total.dtype)

    # --- what a batch costs ----------------------------------------------------------------

    def explain(self, deleted: torch.Tensor) -> str:
        """Per module, in forward order: its form (delta, dense, per-node or pooled), changed rows
        per sample and, for a convolution, its edge type and edges read per sample (delta: the
        changed inputs' out-edges, or for GCN the changed rows' in-edges; dense: every kept
        edge; pooled: the kept edges the readout's weights are spread along)."""
        plan = self.plan(deleted, self._seen_nodes())
        b, n = plan.keep.shape
        dev = next((p.device for p in self.encoder.parameters()), torch.device("cpu"))
        live = self._live_sums(plan, dev)[0].values()
        in_sum = {id(c) for fs, _ in live if fs.kind == "dense" for c in fs.convs}
        in_delta = {id(c) for fs, _ in live if fs.kind == "delta" for c in fs.convs}
        rows_out: list[tuple] = []  # (name, class, form, rows or None, edges read)
        for path, cls, what in plan.order:
            if isinstance(what, _ConvPlan):
                form = ("delta*" if id(what) in in_delta else "delta") \
                    if not what.rows_out.dense else "dense*" if id(what) in in_sum else "dense"
                rows, reads = what.rows_out.changed.sum().item() / b, f"{what.entries / b:.1f}"
                name = _name(what)
            elif isinstance(what, _TypedPlan):
                form, name = "fused", _name_of(path, what.edges.key)
                rows = _reach(what.edges, what.rows_in.mask, what.rows_in.flat,
                              None).sum().item() / b
                reads = f"{_pushed(plan, what) / b:.1f}"
            elif isinstance(what, _TypedLin):
                form, rows, reads, name = "fused", what.rows_out.changed.sum().item() / b, "", path
            elif isinstance(what, _PooledPlan):
                name = path if what.edges is None else _name_of(path, what.edges.key)
                reads = "" if what.edges is None else \
                    f"{plan.kept_edges[what.edges.key] / b:.1f}"
                rows_out.append((name, cls, "pooled", None, reads))
                continue
            else:
                form, rows, reads, name = "per-node", what.changed.sum().item() / b, "", path
            rows_out.append((name, cls, form, rows, reads))
        seen: set = set()
        for i, r in enumerate(rows_out):  # a module called again: primed, as floor() names it
            name = r[0]
            while name in seen:
                name += "'"
            seen.add(name)
            rows_out[i] = (name,) + r[1:]
        wide = max([34] + [len(r[0]) + 1 for r in rows_out])
        lines = [f"convert({type(self.encoder).__name__}): B={b} samples, N={n} genes, "
                 f"{len(self.graph_in)} edge type(s); per sample, mean over the batch",
                 f"  {'module[edge type]':<{wide}} {'class':<10} {'form':<8} "
                 f"{'changed rows':>13} {'edges read':>14}"]
        for name, cls, form, rows, reads in rows_out:
            count = f"{'-':>7}" if rows is None else f"{rows:>7.1f}"
            lines.append(f"  {name:<{wide}} {cls:<10} {form:<8} {count} / {n:<4}{reads:>14}")
        full = next((rows_out[i][0] for i, (_, _, w) in enumerate(plan.order)
                     if isinstance(w, (_ConvPlan, _TypedLin))
                     and bool(w.rows_out.changed.all())), None)  # as its row names it
        lines.append(f"  every gene changes from: {full} (the first module, in forward order, "
                     "at which every gene of every sample has changed)" if full else
                     "  no layer changes every gene")
        lines.append("  (changed rows: those a deletion reaches, whose values can differ from "
                     "the wildtype's, whichever form computes them; some may come out equal, "
                     "at a ReLU's zero say)")
        if any(r[0].endswith("'") for r in rows_out):
            lines.append("  (': the same module called again, as floor() names its parts)")
        readout = {None: "none ([B, N, H])", "mean": "mean over all genes (deleted as 0)",
                   "mean_kept": "mean over kept genes", "sum_kept": "sum over kept genes"}
        lines.append("  readout: " + (readout[self.readout_kind] if self.readout_module is None
                                      else f"{type(self.readout_module).__name__} over kept "
                                           "genes (its own module, run on every kept row)"))
        forms = {r[2] for r in rows_out}  # each form that appears, in words (a user trial
        legend = [(f, words) for f, words in (  # found them defined only in the docs)
            ("delta", "delta: only the changed rows computed, the wildtype's values "
                      "corrected along the edges that carry a change"),
            ("dense", "dense: every row of every sample computed, where the delta form's "
                      f"edges read plus rows computed would exceed {DENSE_SHARE:.0%} of the "
                      "dense form's, or its input is dense"),
            ("per-node", "per-node: a module of each row alone, run on the changed rows"))
            if f in forms or (f + "*") in forms]
        if legend:
            lines.append("  (" + "; ".join(w for _, w in legend) + ")")
        if any(isinstance(w, _TypedLin) for _, _, w in plan.order):
            lines.append("  (fused: a linear map of identity GINs' sums over its edge types, "
                         "each type's map applied before its push, on the changed rows only: "
                         "the workbook's own delta kernels)")
        if in_sum:
            lines.append("  (dense*: a sum of GIN-MLPs over edge types, run a block of samples "
                         "at a time, one on a CPU: each type's aggregation, MLP and the sum "
                         "while in cache)")
        if in_delta:
            lines.append("  (delta*: a sum of GIN-MLPs over edge types, its changed rows run a "
                         "sample at a time on a CPU (consecutive samples with few rows together):"
                         " each type's MLP adds into the samples' rows of the sum while in cache)")
        if any(isinstance(w, _PooledPlan) for _, _, w in plan.order):
            lines.append("  (pooled: affine before the readout, so the readout sums its input "
                         "rows with weights spread along the kept edges; its own rows are never "
                         "computed)")
        return "\n".join(lines)

    def _seen_nodes(self) -> int:
        """The genes of the last call's x (before any call: the graph's, see :func:`convert`)."""
        return max(self._edges) if self._edges else self.num_nodes

    def _unsure_n(self, n: int) -> bool:
        """``n`` is the count of an edge list's node ids, no call having shown x's rows."""
        return self._counted and not self._edges and n == self.num_nodes

    def _n_hint(self, n: int) -> str:
        return (f"{n} genes is the graph's largest node id + 1, counted from its edges before "
                "any call: where the last genes have no edges, pass convert(..., num_nodes=N), "
                "or n=N to plan_ahead")

    def floor(self, deleted: torch.Tensor) -> ConvertFloor:
        """The fewest multiply-adds an exact sample of this batch needs, forward and backward, per
        layer and edge type (``results.floor.ConvertFloor``); ValueError before any call."""
        if not self._widths:
            raise ValueError("floor needs the layer widths: call fast(x, deleted) once first")
        plan = self.plan(deleted, self._seen_nodes())
        b = plan.batch_size
        parts: dict[str, FloorPart] = {}
        wt_sparse = wt_dense = wt_bytes = 0.0
        all_from, after = None, 0.0
        for path, cls, what in plan.order:
            if isinstance(what, _ConvPlan):
                m = self._conv_module(path, what.edges.key)
                w = self._widths.get((what.path, what.edges.key), 0)
                macs = _row_macs(m, what.kind)
                n_in = int(what.rows_in.changed.sum())  # the rows that differ, not those a
                n_out = int(what.rows_out.changed.sum())  # dense form computes
                rows = float(n_in if what.kind is GCNConv else n_out)
                sp = _sparse(what.changed_entries, w, n_in, n_out)
                de = _dense(rows, 1, macs) if macs else (0.0, 0.0)
                name = _name(what)
                wsp = _sparse(int(what.edges.deg.sum()), w, what.edges.num_nodes,
                              what.edges.num_nodes)
                wde = _dense(what.edges.num_nodes, 1, macs) if macs else (0.0, 0.0)
                wt_sparse, wt_dense = wt_sparse + wsp[0], wt_dense + wde[0]
                wt_bytes += wsp[1] + wde[1]
            elif isinstance(what, _TypedPlan):  # the mapped messages, pushed
                e, name = what.edges, _name_of(path, what.edges.key)
                w = self._widths.get((path, e.key), 0)
                n_in = int(what.rows_in.changed.sum())
                sp, de = _sparse(_pushed(plan, what), w, n_in, plan.num_nodes), (0.0, 0.0)
                wsp = _sparse(int(e.deg.sum()), w, e.num_nodes, e.num_nodes)
                wt_sparse, wt_bytes = wt_sparse + wsp[0], wt_bytes + wsp[1]
            elif isinstance(what, _TypedLin):  # each type's map on the changed input rows
                macs = _row_macs(self._named[path], None)
                sp, de, name = (0.0, 0.0), _dense(float(what.rows_in.changed.sum()), 1, macs), path
                wde = _dense(plan.num_nodes, 1, macs)
                wt_dense, wt_bytes = wt_dense + wde[0], wt_bytes + wde[1]
            elif isinstance(what, _PooledPlan):
                sp, de, name = self._pooled_floor(path, what, plan)
            else:
                m = self._named[path]
                macs = _row_macs(m, None)
                if not macs:
                    continue
                sp, de, name = (0.0, 0.0), _dense(float(what.changed.sum()), 1, macs), path
                wde = _dense(plan.num_nodes, 1, macs)
                wt_dense, wt_bytes = wt_dense + wde[0], wt_bytes + wde[1]
            while name in parts:  # a module called twice
                name += "'"
            if all_from is None and isinstance(what, (_ConvPlan, _TypedLin)) and \
                    bool(what.rows_out.changed.all()):
                all_from = name  # as its part is named
            parts[name] = FloorPart(float(sp[0]), float(de[0]), float(sp[1] + de[1]))
            if all_from is not None:
                after += sp[0] + de[0]
        parts["wildtype, once per batch"] = FloorPart(wt_sparse, wt_dense, wt_bytes)
        return ConvertFloor(batch_size=b, num_nodes=plan.num_nodes, parts=parts,
                            all_changed_from=all_from, all_changed_macs=after / b)

    def _pooled_floor(self, path: str, what: _PooledPlan, plan: _Plan):
        """(sparse, dense, name) of a pooled tail module per batch: a conv spreads the weights
        along the kept edges (width 1) and sums its input rows with them; a linear map acts on
        the B pooled rows."""
        b, n = plan.keep.shape
        if what.edges is None:
            return (0.0, 0.0), _dense(float(b), 1, _row_macs(self._named[path], None)), path
        key = what.edges.key
        width = self._widths.get((path, key), 0)
        sp = _sparse(plan.kept_edges[key], 1, b * n, b * n)
        weighted, maps = _dense(float(b * n), width, 1), _dense(float(b), 1, _row_macs(
            self._conv_module(path, key), None))  # its own maps act on the B pooled rows
        return sp, (weighted[0] + maps[0], weighted[1] + maps[1]), _name_of(path, key)

    def _conv_module(self, path: str, key) -> nn.Module:
        if path in self._named:
            return self._named[path]
        base = path[:path.index("[")]
        return self._named[base].convs[key]


def _pushed(plan: _Plan, what: _TypedPlan) -> int:
    """Entries a fused typed conv pushes per batch: its changed inputs' out-edges to kept genes."""
    rows = what.rows_in
    return int(_kept_out(plan, what.edges).reshape(-1)[
        np.flatnonzero(rows.changed.numpy())].sum())


def _key(key) -> str:
    """An edge type for tables: its relation (one node type), or the key itself."""
    return key[1] if isinstance(key, tuple) and len(key) == 3 else str(key)


def _name(cp: _ConvPlan) -> str:
    """``path[relation]`` of a conv and edge type (the path alone for one edge_index)."""
    return _name_of(cp.path, cp.edges.key)


def _name_of(path: str, key) -> str:
    if key is None or path.endswith("]") or _key(key) in path:
        return path
    return f"{path}[{_key(key)}]"


def _ph_index(node: fx.Node) -> int:
    """The position of a placeholder among the graph's placeholders."""
    return [n for n in node.graph.nodes if n.op == "placeholder"].index(node)


def _arg_rows(args, env):
    """Every :class:`_Rows` among ``args`` (nested lists, tuples and dicts)."""
    found = []
    fx.node.map_arg(args, lambda a: found.append(env[a]) if isinstance(env.get(a), _Rows)
                    else None)
    return found


def _attr(module: nn.Module, target: str):
    for part in target.split("."):
        module = getattr(module, part)
    return module


_MISSING = object()


def _same(a, b) -> bool:
    """``a == b`` as one bool; identity where ``==`` gives none (an array, a user's object)."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an ambiguous or failing comparison
        return False


def _dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``, as messages give it."""
    return str(dtype).removeprefix("torch.")


def _call(node: fx.Node, args, kwargs):
    if node.op == "call_method":
        return getattr(args[0], node.target)(*args[1:], **kwargs)
    if node.target in (torch.cat, torch.concat):
        return _cat_features(args, kwargs) if not kwargs.get("out") else \
            node.target(*args, **kwargs)
    return node.target(*args, **kwargs)


def _cat_features(args, kwargs) -> torch.Tensor:
    """``torch.cat(parts, dim=-1)`` of 2-D parts (convert refuses other dims): as one stack and
    a view when the parts are alike, which PyTorch's CPU cat along the last dim is about 3x slower
    at for wide batches."""
    parts = args[0]
    if len(parts) > 1 and all(isinstance(t, torch.Tensor) and t.dim() == 2 and
                              t.shape == parts[0].shape for t in parts):
        return torch.stack(list(parts), 1).view(parts[0].shape[0], -1)
    return torch.cat(parts, -1)


@timed_function
class _SpMM(torch.autograd.Function):
    """``a @ x`` for a CSR ``a`` with its transpose ``at`` given (the backward is one product)."""

    @staticmethod
    def forward(ctx, x, a, at):
        ctx.at = at
        return _csr_mm(a, x)

    @staticmethod
    def backward(ctx, g):
        return (_csr_mm(ctx.at, g) if ctx.needs_input_grad[0] else None), None, None


@timed_function
class _StackedSpMM(torch.autograd.Function):
    """``a @ x`` for a CSR ``a`` of row blocks stacked (``[T * N, N]``: an aggregation per edge
    type), with each block's transpose given (``ats``, ``[N, N]`` each): the backward adds the
    blocks' products with their gradients' rows, one accumulator. The stacked transpose
    (``[N, T * N]``) gathers each entry's row from the whole ``[T * N, F]`` gradient, where a
    block's reads stay in one ``[N, F]`` block: at the real spec (nine types, 2.4 M edges,
    F = 64) on this project's 2-core CPU, 119 ms against 34 ms per product (medians of 10),
    three products per TorchCell-shaped step (the step: 0.954x its time, IQR 0.067, 8
    interleaved rounds). Each output row is the same sum, added block by block (to rounding);
    the stacked transpose is not made."""

    @staticmethod
    def forward(ctx, x, a, *ats):
        ctx.ats = ats
        return _csr_mm(a, x)

    @staticmethod
    def backward(ctx, g):
        if not ctx.needs_input_grad[0]:
            return (None, None) + (None,) * len(ctx.ats)
        return (_sum_transposed(ctx.ats, g.split(ctx.ats[0].shape[0])), None) \
            + (None,) * len(ctx.ats)


@timed_function
class _SpMMParts(torch.autograd.Function):
    """``(a @ x).split(sizes)`` for a CSR ``a`` with each row block's transpose given (or none,
    a CPU's plan: made here, :func:`_block_transposes`, where the backward takes them): the
    backward adds each block's product with its gradient, where a split's backward first
    concatenates the blocks' gradients into one (a copy of the whole output). On a CPU with
    nothing watching its operators and no graph to build, the backward instead streams each
    block's gradient rows through ``a``'s own rows and adds into the input's (compiled,
    :func:`.numba_rows.add_csr_t`, which says why), a run of rows of about equal entries per
    compute thread (:mod:`.workers`), each run into an accumulator of its own, summed in the
    runs' order: the same sums as through the transposes, to rounding."""

    @staticmethod
    def forward(ctx, x, a, sizes, ws, *ats):
        ctx.ats, ctx.ws, ctx.a, ctx.sizes = ats, ws, a, sizes
        ctx.set_materialize_grads(False)  # an unused block's gradient stays None: no work
        return tuple(_csr_mm(a, x, take(ws, "out", (a.shape[0], x.shape[1]), x)).split(sizes))

    @staticmethod
    def backward(ctx, *grads):
        a, acc = ctx.a, None
        if ctx.needs_input_grad[0] and a.device.type == "cpu" and not watched() \
                and not torch.is_grad_enabled() and any(g is not None for g in grads):
            acc = _scatter_parts(a, ctx.sizes, grads, ctx.ws)
        elif ctx.needs_input_grad[0]:
            ats = ctx.ats or _block_transposes(a, ctx.sizes)  # a CPU's plan made none
            acc = _sum_transposed(ats, grads, ctx.ws)
        return (acc, None, None, None) + (None,) * len(ctx.ats)


def _sum_transposed(ats, grads, ws=None) -> torch.Tensor | None:
    """``sum_j ats[j] @ grads[j]`` over the gradients that are not None (None if none): out of
    place where the backward builds a graph (``addmm``'s ``out=`` takes no graph), else into
    one accumulator, the first product's (from ``ws``, :func:`.workspace.take`)."""
    acc = None
    graph = torch.is_grad_enabled()
    for at, g in zip(ats, grads):
        if g is None:
            continue
        if graph:
            acc = at @ g if acc is None else acc + at @ g
        elif acc is None:
            acc = _csr_mm(at, g, take(ws, "gx", (at.shape[0], g.shape[1]), g))
        else:
            torch.addmm(acc, at, g.contiguous(), out=acc)
    return acc


# the fewest entries per run of :func:`_scatter_parts` (a run is a thread's: fewer, and the
# threads' start and the runs' sum cost more than they spare)
SCATTER_RUN_ENTRIES = 1 << 16


def _scatter_parts(a: torch.Tensor, sizes: list, grads: tuple, ws) -> torch.Tensor:
    """``sum_j a_j.T @ grads[j]`` for the row blocks ``a_j`` of the CSR ``a`` (``sizes`` rows
    each; a block whose gradient is None adds nothing), by
    :func:`.numba_rows.add_csr_t`: runs of whole rows of about equal entries, one per
    compute thread (:func:`.workers.workers`), each into its own accumulator (workspace
    buffers), summed in order (at least :data:`SCATTER_RUN_ENTRIES` entries a run)."""
    add = kernels().add_csr_t
    crow, col, val = (t.numpy() for t in (a.crow_indices(), a.col_indices(), a.values()))
    starts = np.cumsum([0] + list(sizes))
    blocks = [(int(starts[j]), g.contiguous()) for j, g in enumerate(grads) if g is not None]
    like = blocks[0][1]
    f = like.shape[1]
    nnz = int(crow[-1])
    k = workers(a.device, max(1, nnz // SCATTER_RUN_ENTRIES))
    cuts = [0] + [int(np.searchsorted(crow, i * nnz / k)) for i in range(1, k)] + [a.shape[0]]

    def runs(lo: int, hi: int) -> list:
        out = []
        for w in range(lo, hi):
            r0, r1 = cuts[w], cuts[w + 1]
            if r1 == r0 and w > 0:
                continue
            acc = take(ws, "gx" if w == 0 else ("gx", w), (a.shape[1], f), like).zero_()
            acc_np = acc.numpy()
            for s, g in blocks:  # each block's rows within this run
                i0, i1 = max(r0, s), min(r1, s + g.shape[0])
                if i1 > i0:
                    add(acc_np, crow, col, val, g[i0 - s:i1 - s].numpy(), i0)
            out.append(acc)
        return out
    accs = [acc for part in spread(runs, k, k) for acc in part]
    for other in accs[1:]:
        accs[0] += other
    return accs[0]


@timed_function
class _SlabParts(torch.autograd.Function):
    """Per edge type ``t``: ``(a[t] @ x_b) * scale[b, t]`` for every sample ``b`` of ``x``
    ``[B, N, F]``, as ``[B * N, F]`` sample-major, each type's rows one contiguous block of one
    buffer, a block of samples at a time (:func:`.convert_dense.block_size`). On a CPU a block is
    one sample: one product per sample and type, its input slab (``x_b``, 1.7 MB at the real
    spec) kept in cache across the types, and the scale applied to each product's block while
    it is still in cache (as one pass over the whole output it took 313 ms of a 4.9 s step of
    the TorchCell-shaped encoder, profiled at the real spec). On a GPU the block is the whole
    batch: one product per type over every sample, gene-major (``block_product``), where a
    product per sample made B x T kernel calls. The backward adds, per block and type, the
    type's transpose ``ats[t]`` times the scaled gradient block."""

    @staticmethod
    def forward(ctx, x, scale, block, ws, *mats):
        t = len(mats) // 2
        a, ats = mats[:t], mats[t:]
        b, n, f = x.shape
        out = take(ws, "out", (t, b, n, f), x)
        x = x.contiguous()
        for s0 in range(0, b, block):
            s1 = min(b, s0 + block)
            with cache_blocks(s0 > 0):  # the block's work, which a GPU runs once: counted once
                for j in range(t):
                    o = out[j, s0:s1]
                    block_product(a[j], x[s0:s1], o)
                    o.mul_(scale[s0:s1, j])
        ctx.ats, ctx.shape, ctx.ws, ctx.block = ats, (b, t, n, f), ws, block
        ctx.save_for_backward(scale)
        return tuple(out.view(t, b * n, f).unbind(0))

    @staticmethod
    def backward(ctx, *grads):
        (scale,) = ctx.saved_tensors
        b, t, n, f = ctx.shape
        gs = [None if g is None else g.view(b, n, f) for g in grads]
        if torch.is_grad_enabled():  # create_graph: out of place, each product differentiable
            terms = [torch.stack([at @ (g[i] * scale[i, j]) for i in range(b)])
                     for j, (at, g) in enumerate(zip(ctx.ats, gs)) if g is not None]
            gx = sum(terms[1:], terms[0]) if terms else scale.new_zeros(b, n, f)
            return (gx, None, None, None) + (None,) * (2 * t)
        gx = take(ctx.ws, "gx", (b, n, f), scale).zero_()
        s = scale.new_empty(min(b, ctx.block), n, f)
        for s0 in range(0, b, ctx.block):
            s1 = min(b, s0 + ctx.block)
            with cache_blocks(s0 > 0):  # as in the forward: the block's work counted once
                for j, (at, g) in enumerate(zip(ctx.ats, gs)):
                    if g is not None:
                        sb = s[:s1 - s0]
                        torch.mul(g[s0:s1], scale[s0:s1, j], out=sb)
                        block_product(at, sb, gx[s0:s1], add=True)
        return (gx, None, None, None) + (None,) * (2 * t)


@timed_function
class _GinSelf(torch.autograd.Function):
    """GIN's ``agg + e * x`` (``e = 1 + eps``, a one-element tensor) in one pass, whose
    backward is one product for ``x`` and one dot product for ``e`` (autograd's ``addcmul``
    makes two products for ``x`` and a product and a sum for ``e``; forward and backward at
    ``[184996, 64]``: 42 ms against 70 ms)."""

    @staticmethod
    def forward(ctx, agg, x, e):
        ctx.save_for_backward(x, e)
        return torch.addcmul(agg, x, e)

    @staticmethod
    def backward(ctx, g):
        x, e = ctx.saved_tensors
        gx = g * e if ctx.needs_input_grad[1] else None
        ge = None
        if ctx.needs_input_grad[2]:
            ge = torch.dot(g.reshape(-1), x.reshape(-1).to(g.dtype)).reshape(e.shape).to(e.dtype)
        return g, gx, ge


def _csr_mm(a: torch.Tensor, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ x`` written into ``out`` or a new buffer (``beta=0``), without ``torch.sparse.mm``'s
    CPU copy."""
    if out is None:
        out = x.new_empty(a.shape[0], x.shape[1])
    return torch.addmm(out, a, x.contiguous(), beta=0, out=out)


def _csr_pair(rows, cols, vals, nrows: int, ncols: int, dev, dtype=None, pair: bool = True):
    """CSR ``[nrows, ncols]`` of COO entries (``rows`` ascending) and its transpose (None
    unless ``pair``)."""
    idx = csr_index_dtype(nrows, ncols, int(rows.numel()))
    out = []
    forms = [(rows, cols, vals, (nrows, ncols))]
    if pair:
        order = torch.argsort(cols, stable=True)
        forms.append((cols[order], rows[order], vals[order], (ncols, nrows)))
    for r, c, v, shape in forms:
        crow = _ptr(torch.bincount(r, minlength=shape[0]))
        out.append(torch.sparse_csr_tensor(crow.to(idx).to(dev), c.to(idx).to(dev),
                                           v.to(dtype).to(dev), shape, check_invariants=False))
    return tuple(out) if pair else (out[0], None)


def _plan_groups(plan: _Plan) -> None:
    """Group the delta convs (not GCN) by the fx node they read: per group, the host CSR of each
    conv's push and own rows over ``cat([wildtype, D])`` (:func:`_push_host`) and, where the
    plan makes them (``plan.transposes``), each row block's transpose; and each value's changed
    rows' genes (for ``D``); the dense convs likewise, for one product."""
    groups: dict = {}
    for cp in plan.convs.values():
        if cp.src is not None and cp.kind is not GCNConv and not cp.rows_out.dense:
            groups.setdefault(cp.src, []).append(cp)
    n = plan.num_nodes
    pair = kernels().csr_pair  # both orientations, by compiled counting sorts
    for src, cps in groups.items():
        # the group's CSR is made in place: each conv's pushed rows, then its own rows, filled
        # into their slices of one pair of arrays (no copy of every block into it)
        owns = [cp.rows_out.count + int(np.count_nonzero(cp.host["self_in"] >= 0)) for cp in cps]
        total = sum(cp.host["push"].m for cp in cps) + sum(owns)
        idx_t = np.int32 if csr_index_dtype(total, n + cps[0].rows_in.count, sum(
            cp.rows_out.count for cp in cps)) == torch.int32 else np.int64
        rows_in = cps[0].rows_in
        ncol = n + rows_in.count
        col_all = np.empty(total, dtype=idx_t)
        val_all = np.empty(total, dtype=np.result_type(*[cp.host["push"].vtype for cp in cps]))
        crows, sizes, nnz = [], [], 0  # nnz: the entries filled so far
        g = ("g", id(src))
        for cp, n_own in zip(cps, owns):
            h, c = cp.host, cp.rows_out.count
            m = h["push"].m
            push = h["push"].fill(col_all[nnz:nnz + m], val_all[nnz:nnz + m],
                                  _push_pool(h["push"].runs))
            h["push"] = None  # its arrays are the group's now
            col, val = col_all[nnz + m:nnz + m + n_own], val_all[nnz + m:nnz + m + n_own]
            if plan.transposes:
                idx = np.arange(c, dtype=np.int64)
                has = h["self_in"] >= 0
                own = pair(np.concatenate([idx, idx[has]]),
                           np.concatenate([h["genes"], n + h["self_in"][has]]),
                           np.ones(c + int(has.sum())), c, ncol)
                col[:], val[:] = own[1], own[2]
                own = (own[0], col, val, *own[3:])
            else:
                crow = np.empty(c + 1, dtype=idx_t)
                kernels().own_rows(h["genes"], h["self_in"], n, crow, col)
                val.fill(1)
                own = (crow, col, val, None, None, None)
            for crow, _, _, tcrow, tcol, tval in (push, own):
                # its pushed rows, then its own rows: one output each
                crows.append(crow[:-1].astype(idx_t, copy=False) + nnz)
                nnz += int(crow[-1])
                if plan.transposes:  # else made only where read (_host_transposes)
                    b = g + ("at", len(sizes))
                    plan.put(b + ("crow",), torch.from_numpy(tcrow.astype(idx_t, copy=False)))
                    plan.put(b + ("col",), torch.from_numpy(tcol.astype(idx_t, copy=False)))
                    plan.put(b + ("val",), torch.from_numpy(
                        tval.astype(val_all.dtype, copy=False)))
                sizes.append(c)
            k = ("g", id(src), cp.path, cp.edges.key)
            plan.put(k + ("genes",), torch.from_numpy(h["genes"]))
            plan.put(k + ("gfac",), torch.from_numpy(h["gfac"]).unsqueeze(1))
        plan.put(g + ("a", "crow"), torch.from_numpy(
            np.concatenate(crows + [np.array([nnz])], dtype=idx_t)))
        plan.put(g + ("a", "col"), torch.from_numpy(col_all))
        plan.put(g + ("a", "val"), torch.from_numpy(val_all))
        plan.index[g + ("a", "shape")] = (sum(sizes), ncol)
        plan.of_rows(rows_in, "gene")
        plan.groups[src] = (cps, sizes)
        for cp in cps:
            cp.grouped = True
    dense: dict = {}
    for cp in plan.convs.values():
        if cp.src is not None and cp.kind is not GCNConv and cp.rows_out.dense:
            dense.setdefault(cp.src, []).append(cp)
    keep = plan.keep.double()
    if dense:
        plan.put(("keep_bn1",), keep.unsqueeze(-1))
    for src, cps in dense.items():
        scale = torch.stack([keep * (cp.host["inv_cnt"] if cp.mean else 1.0) for cp in cps])
        plan.put(("dscale", id(src)), scale.transpose(0, 1).contiguous().unsqueeze(-1))
        plan.dense_groups[src] = cps
        for cp in cps:
            cp.dense_group = True


def _has_transposes(plan: _Plan, g: tuple, blocks: int) -> bool:
    return all(g + ("at", j, "crow") in plan.index for j in range(blocks))


def _host_transposes(plan: _Plan, g: tuple, sizes: list) -> None:
    """Each row block's transpose of the delta group ``g``'s host CSR, kept in the plan as
    :func:`_plan_groups` keeps those it makes: for a plan made without them (its encoder on a
    CPU, ``plan.transposes`` False) read where the transposed products run, on a GPU or under
    a mode that watches operators (:meth:`ConvertedEncoder._group_products`). By the compiled
    counting sort (:func:`.numba_push.csr_pair`): the same entries as the push's own
    transposes, each column's in row order."""
    crow, col, val = (plan.index[g + ("a", s)].numpy() for s in ("crow", "col", "val"))
    ncol = plan.index[g + ("a", "shape")][1]
    pair = kernels().csr_pair
    r0, made = 0, {}
    for j, c in enumerate(sizes):
        lo, hi = int(crow[r0]), int(crow[r0 + c])
        rows = np.repeat(np.arange(c, dtype=np.int64), np.diff(crow[r0:r0 + c + 1]))
        *_, tcrow, tcol, tval = pair(rows, col[lo:hi].astype(np.int64),
                                     val[lo:hi].astype(np.float64), c, ncol)
        b = g + ("at", j)
        made[b + ("crow",)] = torch.from_numpy(tcrow.astype(crow.dtype))
        made[b + ("col",)] = torch.from_numpy(tcol.astype(crow.dtype))
        made[b + ("val",)] = torch.from_numpy(tval.astype(val.dtype))
        r0 += c
    plan.index.update(made)  # all at once: a reader sees every block's or none


def _block_transposes(a: torch.Tensor, sizes: list) -> list:
    """Each row block's transpose of the CSR ``a`` (CSR), for a backward that takes the
    transposed products where the plan made none (a CPU's, building a graph: ``create_graph``;
    on a CPU its pointers are read without a sync)."""
    crow, col, val = a.crow_indices(), a.col_indices(), a.values()
    ptr = crow.numpy()  # a CPU's: read without a sync or an operator
    out, r0 = [], 0
    for c in sizes:
        lo, hi = int(ptr[r0]), int(ptr[r0 + c])
        block = torch.sparse_csr_tensor(crow[r0:r0 + c + 1] - crow[r0], col[lo:hi], val[lo:hi],
                                        (c, a.shape[1]), check_invariants=False)
        out.append(block.t().to_sparse_csr())
        r0 += c
    return out


def _put_pick(plan: _Plan, key, idx: torch.Tensor) -> None:
    """Keep table indices ``idx`` (into ``cat([wt, values])``) split for :func:`_pick`."""
    i = idx.numpy()
    w = i < plan.num_nodes
    pw, pv = np.flatnonzero(w), np.flatnonzero(~w)
    plan.put(key + ("pw",), torch.from_numpy(pw))
    plan.put(key + ("sw",), torch.from_numpy(i[pw]))
    plan.put(key + ("pv",), torch.from_numpy(pv))
    plan.put(key + ("sv",), torch.from_numpy(i[pv] - plan.num_nodes))


def _pick(v: _Val, key, plan: _Plan, dev) -> torch.Tensor:
    """The rows of ``v``'s table that :func:`_put_pick` kept under ``key`` (one chunk of
    :class:`~.chunks.PickChunks`)."""
    return PickChunks.apply(None, v.wt, v.values, *(plan.dev(key + (s,), None, dev)
                                                    for s in ("pw", "sw", "pv", "sv")))[0]


def _chunk_picks(plan: _Plan, cuts: list) -> tuple[list, list]:
    """Per chunk of samples ``cuts`` (on a CPU), the readout pick's indexes
    (:func:`_put_pick`'s four, ``("kept",)``'s rows of the chunk's samples, from 0) and each row's
    sample within the chunk; kept in the plan for its next call."""
    key = ("kept_chunks", tuple(cuts))
    if key not in plan.index:
        kb = plan.index[("kept_b",)]
        if kb.numel() > 1 and bool((kb[1:] < kb[:-1]).any()):  # the kept rows sample-major
            raise RuntimeError("the readout's kept rows are not in sample order")
        at = torch.searchsorted(kb, torch.tensor([c[0] for c in cuts] + [cuts[-1][1]]))
        full = [plan.index[("kept", s)] for s in ("pw", "sw", "pv", "sv")]
        idx, index = [], []
        for (s0, _), lo, hi in zip(cuts, at[:-1].tolist(), at[1:].tolist()):
            for p, src in ((full[0], full[1]), (full[2], full[3])):
                m = (p >= lo) & (p < hi)
                idx += [p[m] - lo, src[m]]
            index.append(kb[lo:hi] - s0)
        plan.index[key] = (idx, index)
    return plan.index[key]


def _to_rows(v: _Val, rows: _Rows, plan: _Plan, dev) -> _Val:
    """``v`` with its values at ``rows`` (a superset of its own rows)."""
    if v.rows is rows:
        return v
    if v.rows.dense and rows.dense:  # every row, in the same order: nothing to pick
        return _Val(v.wt, v.values, rows)
    return _Val(v.wt, _pick(v, ("to", id(v.rows), id(rows)), plan, dev), rows)


def _plan_to_rows(plan: _Plan, src: _Rows, dst: _Rows) -> None:
    """The host index :func:`_to_rows` reads: ``src``'s table rows at ``dst``'s rows."""
    if src is not dst and not (src.dense and dst.dense):
        _put_pick(plan, ("to", id(src), id(dst)), src.lookup(dst.flat))


def _plan_sum(plan: _Plan, found: list, rows: _Rows) -> None:
    """The host indexes :class:`_SumAt` reads for a sum at ``rows`` of values at ``found``: each
    operand's rows' places among ``rows`` and their genes, and ``rows``' genes (none if dense)."""
    k = ("sum", id(rows))
    if not rows.dense:
        plan.of_rows(rows, "gene")
    for r in found:
        plan.put(k + (id(r), "pos"), torch.from_numpy(rows.pos[r.flat.numpy()]))
        plan.of_rows(r, "gene")


def _sum_rows(plan: _Plan, node: fx.Node) -> _Rows:
    """The rows of a sum's value (a HeteroConv's: its one destination type's)."""
    rows = plan.rows[node]
    return next(iter(rows.values())) if isinstance(rows, dict) else rows


def _plan_delta_sum(plan: _Plan, cps: list, rows: _Rows) -> None:
    """Each sample's first row, as ``B + 1`` host ints, among ``rows`` and among each conv's
    changed rows (all sample-major), for :class:`.convert_dense.DeltaGinSum`."""
    b, n = plan.keep.shape
    starts = np.arange(b + 1, dtype=np.int64) * n
    for r in [rows] + [c.rows_out for c in cps]:
        plan.index[("dsum_off", id(r))] = np.searchsorted(r.flat.numpy(), starts).tolist()


@timed_function
class _SumAt(torch.autograd.Function):
    """The values of a sum of values at rows ``rows`` (a union of the operands' rows): the
    summed wildtype ``wt`` at every row (repeated per sample where ``rows`` is dense, else
    gathered at its genes ``gene_u``), then per operand its changed rows less its wildtype,
    ``values_t - wt_t[gene_t]``, added at their places ``pos_t`` (``index_add_``). Picking each
    operand onto ``rows`` and adding (its rows, and its wildtype at the others) wrote every row
    of ``rows`` once per operand: nine full ``[B * N, H]`` passes and a sum for a
    TorchCell-shaped second layer. The backward: the summed gradient per gene for ``wt``, and
    per operand its rows' gradient and, negated and summed per gene, its wildtype's. At the
    real spec (B = 28, pages kept, 4 steps of each, alternating): the sums' forward 77-99 ms
    per step against 115-166 ms picked; their backward alike (113-124 against 115-125 ms).

    Args (of ``apply``): wt ``[N, H]``, b (samples), gene_u (None or ``[R]``), ws (None or
    ``(Workspace, site)``), then per operand ``wt_t [N, H], values_t [R_t, H], pos_t [R_t],
    gene_t [R_t]``.
    """

    @staticmethod
    def forward(ctx, wt, b, gene_u, ws, *ops):
        out = _repeat(wt, b, ws) if gene_u is None else \
            torch.index_select(wt, 0, gene_u, out=take(ws, "out", (gene_u.shape[0], wt.shape[1]),
                                                       wt))
        for j in range(0, len(ops), 4):
            wt_t, values, pos, gene = ops[j:j + 4]
            d = torch.index_select(wt_t, 0, gene, out=take(ws, ("d", j), values.shape, values))
            out.index_add_(0, pos, torch.sub(values, d, out=d))  # values - wt_t[gene]
        ctx.b, ctx.n, ctx.ws = b, wt.shape[0], ws
        ctx.save_for_backward(gene_u, *ops[2::4], *ops[3::4])
        return out

    @staticmethod
    def backward(ctx, g):
        gene_u, *idx = ctx.saved_tensors
        t = len(idx) // 2
        need = ctx.needs_input_grad
        graph = torch.is_grad_enabled()  # create_graph: the same operations, each differentiable
        g = g.contiguous()
        gwt = None
        if need[0]:
            gwt = g.view(ctx.b, ctx.n, -1).sum(0) if gene_u is None else \
                g.new_zeros(ctx.n, g.shape[1]).index_add_(0, gene_u, g)
        grads = []
        for j in range(t):
            pos, gene = idx[j], idx[t + j]
            if not (need[4 + 4 * j] or need[5 + 4 * j]):
                gv = None
            elif graph:  # out= takes no graph
                gv = g.index_select(0, pos)
            else:
                gv = torch.index_select(g, 0, pos, out=take(ctx.ws, ("gv", j), (pos.shape[0],
                                                                              g.shape[1]), g))
            gw = g.new_zeros(ctx.n, g.shape[1]).index_add_(0, gene, gv, alpha=-1) \
                if need[4 + 4 * j] else None
            grads += [gw, gv if need[5 + 4 * j] else None, None, None]
        return (gwt, None, None, None, *grads)


def _plan_full(plan: _Plan, rows: _Rows) -> None:
    """The host indexes :func:`_full` reads (none for dense rows)."""
    if not rows.dense:
        plan.of_rows(rows, "flat")
        plan.of_rows(rows, "gene")


def _full(v: _Val, plan: _Plan, dev, ws: tuple | None = None) -> torch.Tensor:
    """``[B, N, H]``: every sample's rows of ``v`` (``ws``: :class:`_Full`'s)."""
    b, n = plan.keep.shape
    if v.rows.dense:
        return v.values.view(b, n, -1)
    return _Full.apply(v.wt, v.values, plan.rows_on(v.rows, "flat", dev),
                       plan.rows_on(v.rows, "gene", dev), b, ws).view(b, n, -1)


def _repeat(wt: torch.Tensor, b: int, ws: tuple | None) -> torch.Tensor:
    """``wt.repeat(b, 1)`` into a buffer from ``ws``."""
    out = take(ws, "out", (b * wt.shape[0], wt.shape[1]), wt)
    out.view(b, *wt.shape).copy_(wt.expand(b, *wt.shape))
    return out


@timed_function
class _Full(torch.autograd.Function):
    """``[B * N, H]``: ``wt`` repeated per sample, its changed rows ``flat`` (genes ``gene``)
    replaced by ``values``: a sequential copy and R row writes, where picking every row gathers
    B * N; the backward sums the samples' gradients for ``wt`` less those of the changed rows."""

    @staticmethod
    def forward(ctx, wt, values, flat, gene, b, ws=None):
        ctx.save_for_backward(flat, gene)
        ctx.b, ctx.ws = b, ws
        out = _repeat(wt, b, ws)  # a copy even at B = 1 (a reshape would be wt itself)
        return out.index_copy_(0, flat, values)

    @staticmethod
    def backward(ctx, g):
        flat, gene = ctx.saved_tensors
        # (a backward that builds a graph, create_graph=True, cannot write into a given buffer)
        gv = g.index_select(0, flat) if torch.is_grad_enabled() else torch.index_select(
            g, 0, flat, out=take(ctx.ws, "gv", (flat.shape[0], g.shape[1]), g))
        gw = None
        if ctx.needs_input_grad[0]:
            gw = g.view(ctx.b, -1, g.shape[1]).sum(0).index_add_(0, gene, gv, alpha=-1)
        return gw, gv, None, None, None, None


def _finish(kind: type, m: nn.Module, agg: torch.Tensor, x_self: torch.Tensor,
            wt_part: tuple | None = None, ws: tuple | None = None) -> torch.Tensor:
    """A convolution's output rows from their aggregation and their own input rows; with
    ``wt_part`` = ``(wt, genes, gfac)``, the aggregation is ``agg + wt[genes] * gfac`` (a GIN-MLP
    adds that part per block, in :class:`GinMlp`, its buffers from ``ws``)."""
    maps = gin_mlp(m) if kind is GINConv else None
    if maps is not None:  # a tensor eps: agg + (1 + eps) x and both maps, a block at a time
        return GinMlp.apply(agg, x_self, block_rows(agg.device, agg.shape[0]), 1 + m.eps,
                            maps[0].weight, maps[0].bias, maps[1].weight, maps[1].bias,
                            *(wt_part or (None, None, None)), ws)
    if wt_part is not None:
        wt, genes, gfac = wt_part
        agg = agg + wt.index_select(0, genes) * gfac
    if kind is GINConv:  # agg + (1 + eps) x, in one pass where eps is a tensor
        e = 1 + m.eps
        if not isinstance(e, torch.Tensor):
            return m.nn(agg + e * x_self)
        return m.nn(_GinSelf.apply(agg, x_self, e))
    if kind is GraphConv:
        return m.lin_rel(agg) + m.lin_root(x_self)
    if kind is SAGEConv:
        out = m.lin_l(agg)
        if m.root_weight:
            out = out + m.lin_r(x_self)
        return F.normalize(out, p=2.0, dim=-1) if m.normalize else out
    out = agg + x_self if m.normalize else agg  # GCN: the self-loop's term (normalized only)
    return out + m.bias if m.bias is not None else out


def _row_macs(m: nn.Module, kind: type | None) -> int:
    """Multiply-adds per row of a module's linear maps (their weights' sizes)."""
    lins = [s for s in m.modules() if isinstance(s, nn.Linear) or (
        type(s).__name__ == "Linear" and hasattr(s, "weight"))]
    return int(sum(s.weight.numel() for s in lins
                   if not isinstance(s.weight, nn.parameter.UninitializedParameter)))


def _edge_dict(graph) -> tuple[list | None, dict, int | None]:
    """``(keys or None, {key: edge_index}, N or None)`` of an edge_index, dict or HeteroData."""
    if isinstance(graph, torch.Tensor):
        return None, {None: graph}, None
    if isinstance(graph, dict):
        if not graph:
            raise ValueError("the graph dict has no edge type")
        return list(graph), dict(graph), None
    if hasattr(graph, "edge_types") and hasattr(graph, "node_types"):
        types = list(graph.edge_types)
        nodes = {s for s, _, d in types} | {d for s, _, d in types}
        if len(nodes) != 1:
            raise ValueError(f"the HeteroData must have edges between one node type only "
                             f"(got {sorted(nodes)})")
        node = nodes.pop()
        return types, {t: graph[t].edge_index for t in types}, int(graph[node].num_nodes)
    hint = "; pass its .edge_index" if isinstance(getattr(graph, "edge_index", None), (
        torch.Tensor, dict)) else ""
    raise TypeError(f"'graph' must be an edge_index [2, E], a dict of them keyed by edge type, "
                    f"or a HeteroData (got {type(graph).__name__}{hint})")


# what a converted encoder holds of the user's: their modules, registered in it as well
SHARED = ("encoder.", "readout_module.")


def _tensor_id(t) -> tuple | None:
    """Where a state-dict tensor's values live; None for one that has no place of its own to
    compare (empty, sparse, on the meta device, an uninitialized lazy parameter, no storage):
    such a tensor is never taken for another."""
    if not isinstance(t, torch.Tensor) or isinstance(t, nn.parameter.UninitializedTensorMixin) \
            or t.is_sparse or t.is_meta or t.layout != torch.strided:
        return None
    try:
        if t.numel() == 0:
            return None
        return t.device, t.dtype, t.data_ptr(), tuple(t.shape), tuple(t.stride())
    except (RuntimeError, ValueError, NotImplementedError):  # a tensor subclass without storage
        return None


def _leave_out_shared(module, state_dict, prefix: str, local_metadata: dict) -> None:
    """A state-dict post-hook: the converted encoder's copies of the user's tensors are left out
    where the same tensors were saved already under the user's own names (``self.encoder`` and
    ``self.fast = convert(self.encoder, ...)`` in one model), so that adding ``fast`` to a model
    leaves its checkpoint's keys as they were; the names left out are listed in this module's
    metadata (``"shared"``), for :func:`_fill_shared`. Saved alone, ``fast`` keeps its keys."""
    held = {_tensor_id(v) for k, v in state_dict.items() if not k.startswith(prefix)}
    held.discard(None)
    gone = [k for k in state_dict if k.startswith(tuple(prefix + s for s in SHARED))
            and _tensor_id(state_dict[k]) in held]
    for k in gone:
        del state_dict[k]
    if gone:
        local_metadata["shared"] = [k[len(prefix):] for k in gone]


def _fill_shared(module, state_dict, prefix: str, local_metadata: dict, strict, missing,
                 unexpected, errors) -> None:
    """A load pre-hook: the keys :func:`_leave_out_shared` left out (listed in this module's
    metadata), or, for a user's module of which the checkpoint holds no key at all at this
    place (a model's checkpoint from before ``fast`` was added), its every key, are given the
    tensors' current values, so that loading does not call them missing; the user's modules
    load their values under their own names. A key missing beside others of its module is
    still missing."""
    listed = local_metadata.get("shared")
    for sub, m in zip(SHARED, (module.encoder, module.readout_module)):
        if m is None:
            continue
        whole = listed is None and not any(k.startswith(prefix + sub) for k in state_dict)
        for k, v in m.state_dict(keep_vars=True).items():
            key = prefix + sub + k
            if key not in state_dict and (whole or (listed is not None and sub + k in listed)):
                state_dict[key] = v.detach() if isinstance(v, torch.Tensor) else v


def convert(encoder: nn.Module, graph, *, readout=None, register: dict | None = None,
            num_nodes: int | None = None) -> ConvertedEncoder:
    """The exact shared-graph form of ``encoder``: ``fast(x, deleted)`` is, per sample ``b``,
    ``encoder(x_b, graph_b)``, where ``graph_b`` drops every edge touching a gene of ``deleted[b]``
    and ``x_b`` zeroes those genes' rows (their output rows are kept; a readout leaves them out).

    Args:
        encoder: called as ``encoder(x, edge_index)`` or ``encoder(x, edge_index_dict)``;
            returns ``[N, H]``. Its parameters stay its own (``fast.encoder is encoder``).
        graph: an ``edge_index`` ``[2, E]``, a dict of them by PyG edge type, or a one-node-type
            ``HeteroData``.
        readout: None (``[B, N, H]``), ``"mean"`` (all N genes, deleted rows as zero),
            ``"mean_kept"``, ``"sum_kept"`` or a PyG aggregation module (kept genes): ``[B, H]``.
        register: ``{UserConvClass: GINConv}``: a subclass that computes as a supported conv.
        num_nodes: the genes N (default: a HeteroData's, else the largest node id + 1 until a
            call's x shows its rows; give it where the last genes have no edges and batches are
            planned ahead, or explained, before the first call).

    Raises:
        ConvertError: (a ValueError) a module or operation that cannot be made exact, naming its
            path in the encoder.
    """
    return ConvertedEncoder(encoder, graph, readout=readout, register=register,
                            num_nodes=num_nodes)
