"""A converted encoder's per-node modules and its readout over a whole batch, a chunk of rows at
a time on a CPU.

Once a deletion's change has reached every gene, a per-node module after a dense layer (a
``LayerNorm``, a ReLU) and the readout's own operators each make a ``[B * N, H]`` tensor in the
forward and another in the backward: 47 MB at the real spec (B = 28, N = 6,607, H = 64). glibc
serves an allocation above its mmap threshold with fresh pages from the kernel and hands them back
when it is freed (the threshold starts at 128 KiB and rises to the size of a freed mapped block,
but never past 32 MiB), so each such tensor costs 11,600 page faults at every step
(:mod:`.workspace`). The TorchCell-shaped step at the real spec on this project's 2-core CPU took
3.36 s with glibc's defaults and 2.66 s with freed memory kept by its settings (which are the
user's to choose, not a library's; medians of 7 steps, each setting in a process of its own).

:class:`RowChunks` runs a per-node module or function a chunk of rows at a time (each row's
computation as in one call; to rounding where a parameter's gradient is added chunk by chunk, or
a product's blocking follows the rows), its output and its input's gradient in :mod:`.workspace`
buffers, so that only chunk-sized tensors come from the allocator (once the threshold has risen
past them, from the heap). :class:`PickChunks` and :func:`chunked_readout` run a PyG aggregation
readout a chunk of samples at a time: the aggregations of :data:`CHUNK_AGGREGATIONS` reduce each
sample's rows alone, so a chunk's output is its samples' output (tested against one call, and
both against the per-sample reference, in ``tests/test_convert_chunks.py``). A readout of
another kind (a user's own aggregation, a median or a sort, whose index arithmetic or fill value
reads the batch), or holding a module that may mix samples (a norm with batch statistics in train
mode, a dropout that draws, a kind not in :data:`ROW_MODULES`), runs in one call, as before.

In one process, alternating with one call per module, the step took a median 0.908x of the time
per round (8 rounds, per-round ratios 0.79-1.12; medians 2.67 against 2.92 s per batch of 28:
in the same process the one-call form gains from the heap the chunked rounds leave grown). Chunks
are 4 MiB (16,384 rows of 64 float32 features), the readout's two samples: against 1 MiB the
step took 1.003x, against 16 MiB 1.033x (medians of per-round ratios, 8 rounds each).

On a GPU, PyTorch's caching allocator already reuses blocks: one call, one chunk. Under autocast,
or where a ``TorchFunctionMode`` or ``TorchDispatchMode`` watches at the forward (the sync counter,
``equal``'s guards; ``torch.device`` as a context), or a module or a parameter has hooks
(``equal``'s rounding probe), the whole tensor is one call, as the model runs it (a mode entered
between a forward and its backward sees the backward's chunks). PyTorch has no tool for this in
eager mode (its CPU allocator keeps no cache, and ``torch.utils.checkpoint`` recomputes a region
but allocates its outputs whole), hence this module.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
import torch_geometric.nn.aggr as _aggr
from torch_geometric.nn.aggr import Aggregation
from torch_geometric.nn.dense.linear import Linear as PygLinear

from ..common.host import cache_blocks
from .convert_dense import hookless
from .workers import watched
from .workspace import take
from .parts import timed_function

try:  # what MultiAggregation builds for its simple parts (PyG 2.3 on)
    from torch_geometric.nn.aggr.fused import FusedAggregation as _Fused
except ImportError:  # pragma: no cover - older PyG
    _Fused = None

# bytes per chunk: under glibc's mmap threshold once it has risen (at most 32 MiB); measured
# against 1 and 16 MiB (the module's docstring)
CHUNK_BYTES = 4 << 20

# the modules a chunked readout may hold: each computes every row alone in any mode (a norm
# with batch statistics, or a dropout, is allowed only where it does too: see ``_row_module``)
ROW_MODULES = (nn.Linear, PygLinear, nn.Identity, nn.Sequential, nn.ModuleList, nn.ReLU,
               nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Softplus,
               nn.PReLU, nn.Mish, nn.Hardtanh, nn.LayerNorm)

# the PyG aggregations a readout may be chunked by samples with: each sample's output from its
# own rows alone (exact types: a subclass may compute otherwise; the fused one is what
# MultiAggregation builds of its sum, mean, min, max, var and std parts); median, quantile and sort
# aggregations are not (their index arithmetic fails on a chunk whose edge sample has no rows;
# the sort fills with the batch's minimum)
CHUNK_AGGREGATIONS = tuple(getattr(_aggr, name) for name in (
    "SumAggregation", "MeanAggregation", "MaxAggregation", "MinAggregation", "MulAggregation",
    "VarAggregation", "StdAggregation", "SoftmaxAggregation", "PowerMeanAggregation",
    "VariancePreservingAggregation", "AttentionalAggregation", "MultiAggregation")
    if hasattr(_aggr, name)) + ((_Fused,) if _Fused is not None else ())

# the functions (and tensor methods) a chunk of rows may run: elementwise, one tensor in and out
ROW_FUNCTIONS = (torch.relu, F.relu, torch.sigmoid, torch.tanh, F.gelu, F.silu, F.elu,
                 F.leaky_relu, F.softplus, F.mish)
ROW_METHODS = ("relu", "sigmoid", "tanh")


def row_function(node: fx.Node) -> bool:
    """Whether a traced call is one of :data:`ROW_FUNCTIONS` or :data:`ROW_METHODS`."""
    if node.op == "call_method":
        return node.target in ROW_METHODS
    return node.op == "call_function" and node.target in ROW_FUNCTIONS


def may_chunk(x: torch.Tensor) -> bool:
    """Whether work on ``x`` may run in chunks: on a CPU, not under autocast or a mode."""
    return x.device.type == "cpu" and not watched() and not torch.is_autocast_enabled("cpu")


def chunk_rows(x: torch.Tensor) -> int | None:
    """Rows per chunk of ``x`` (about :data:`CHUNK_BYTES`), or None where ``x`` runs in one call:
    where :func:`may_chunk` says not, or where it is under two chunks."""
    if x.dim() < 1 or x.shape[0] == 0 or not may_chunk(x):
        return None
    rows = max(1, CHUNK_BYTES // max(1, x[0].numel() * x.element_size()))
    return rows if x.shape[0] >= 2 * rows else None


def plain(m: nn.Module) -> bool:
    """No hooks on ``m``, its submodules or its parameters, and no global module hooks (a chunked
    call would call them once per chunk), and none of its submodules in place
    (``ReLU(inplace=True)``: the backward runs each chunk again on a leaf of its own)."""
    if any(p._backward_hooks for p in m.parameters()):
        return False
    return all(hookless(s) and not getattr(s, "inplace", False) for s in m.modules())


@timed_function
class RowChunks(torch.autograd.Function):
    """``fn(x)`` for a per-row ``fn``, a chunk of ``rows`` rows at a time, into a workspace
    buffer; the backward runs each chunk again with its graph (a chunk's forward is a pass over
    memory near the cache: keeping every chunk's graph instead would hold its tensors past a
    backward that frees the step's) and writes the input's gradient into a workspace buffer,
    adding the parameters' gradients over the chunks in order. A backward that builds a graph
    (``create_graph``) runs ``fn`` on the whole input once more instead, so that its gradient is
    differentiable again.

    The backward runs a module on the tensors it read in the forward (saved, so that one changed
    in place since raises as autograd does; detached, so that a hook on a parameter runs once, on
    its summed gradient) and in the train or eval mode of each of its submodules then
    (:func:`torch.func.functional_call`).

    Args (of ``apply``):
        fn: ``[R, ...] -> [R, ...]``, each row alone: a per-node module, or a function.
        rows: rows per chunk (:func:`chunk_rows`).
        ws: None, or ``(Workspace, site)`` (:mod:`.workspace`).
        x: the input.
        *tensors: a module's parameters then its buffers (``named_parameters`` and
            ``named_buffers`` order); none for a function.
    """

    @staticmethod
    def forward(ctx, fn, rows, ws, x, *tensors):
        n = x.shape[0]
        out = None
        for s in range(0, n, rows):  # (no mode watches: chunk_rows said so)
            t = min(n, s + rows)
            yc = fn(x[s:t])
            if yc.shape[:1] != (t - s,):
                raise ValueError(f"a per-row function gave {yc.shape[0]} rows for {t - s}")
            if out is None:
                out = take(ws, "out", (n,) + tuple(yc.shape[1:]), yc)
            out[s:t].copy_(yc)
        ctx.fn, ctx.rows, ctx.ws = fn, rows, ws
        module = isinstance(fn, nn.Module)
        ctx.modes = [m.training for m in fn.modules()] if module else None
        ctx.names = [k for k, _ in _state(fn)] if module else []
        ctx.save_for_backward(x, *tensors)
        return out

    @staticmethod
    def backward(ctx, g):
        x, *tensors = ctx.saved_tensors
        need = ctx.needs_input_grad
        with _modes(ctx.fn, ctx.modes):
            if torch.is_grad_enabled():  # create_graph: differentiable, the whole input at once
                return (None, None, None) + _grads(ctx.fn, ctx.names, x, tensors, g,
                                                   need[3:], True)
            gx = take(ctx.ws, "gx", x.shape, x) if need[3] else None
            total: list = [None] * len(tensors)
            for s in range(0, x.shape[0], ctx.rows):
                t = min(x.shape[0], s + ctx.rows)
                with cache_blocks(s > 0):
                    gc, *gt = _grads(ctx.fn, ctx.names, x[s:t], tensors, g[s:t],
                                     need[3:], False)
                if gx is not None and gc is not None:
                    gx[s:t].copy_(gc)
                elif gx is not None:
                    gx[s:t].zero_()
                total = [a if b is None else b if a is None else a + b
                         for a, b in zip(gt, total)]
        return (None, None, None, gx, *total)


def _grads(fn, names: list, x: torch.Tensor, tensors: list, g: torch.Tensor, need: tuple,
           create: bool) -> tuple:
    """The gradients of ``fn(x)`` (a module run on ``tensors``, by their ``names``) at ``x`` and
    each tensor where ``need`` says so (None elsewhere), given ``g`` at the output."""
    leaves = [t.detach().requires_grad_(nd) for t, nd in zip(tensors, need[1:])]
    xin = x if create else x.detach().requires_grad_(need[0])
    with torch.enable_grad():
        y = fn(xin) if not isinstance(fn, nn.Module) else torch.func.functional_call(
            fn, dict(zip(names, leaves)), (xin,))
    ins = [a for a, nd in zip([xin] + leaves, need) if nd]
    got = iter(torch.autograd.grad(y, ins, g, create_graph=create, allow_unused=True)
               if ins and y.requires_grad else [None] * len(ins))
    return tuple(next(got) if nd else None for nd in need)


def _state(m: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``m``'s parameters then its buffers, by name (what :class:`RowChunks` saves)."""
    return list(m.named_parameters()) + list(m.named_buffers())


@contextlib.contextmanager
def _modes(fn, modes: list | None):
    """Each submodule of a module ``fn`` in the train or eval mode ``modes`` records, put back
    after."""
    if modes is None:
        yield
        return
    mods = list(fn.modules())
    now = [m.training for m in mods]
    for m, t in zip(mods, modes):
        m.training = t
    try:
        yield
    finally:
        for m, t in zip(mods, now):
            m.training = t


def per_row(fn: Callable, x: torch.Tensor, ws) -> torch.Tensor:
    """``fn(x)``, a chunk of rows at a time where :func:`chunk_rows` says so and a module ``fn``
    is :func:`plain`, else in one call.

    Args:
        fn: a per-node module (its parameters and buffers passed on), or a function of ``x``
            alone; each row of the output from that row of ``x`` alone.
        x: the input; ws: None, or ``(Workspace, site)`` (:mod:`.workspace`).
    """
    module = isinstance(fn, nn.Module)
    rows = chunk_rows(x)
    if rows is None or (module and not plain(fn)):
        return fn(x)
    return RowChunks.apply(fn, rows, ws, x, *[t for _, t in (_state(fn) if module else [])])


def _row_module(m: nn.Module) -> bool:
    if isinstance(m, (nn.Dropout, nn.AlphaDropout)):
        return m.p == 0 or not m.training
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return not m.training and m.track_running_stats
    if isinstance(m, Aggregation):
        return type(m) in CHUNK_AGGREGATIONS
    return type(m) in ROW_MODULES


def chunkable_readout(readout: nn.Module) -> bool:
    """Whether ``readout`` computes each sample's output from its rows alone, whatever the
    batch: one of :data:`CHUNK_AGGREGATIONS`, every submodule of it another or a per-row kind
    (:data:`ROW_MODULES`, an eval-mode norm, a dropout that does not draw), no hooks."""
    return type(readout) in CHUNK_AGGREGATIONS and plain(readout) and \
        all(_row_module(s) for s in readout.modules())


@timed_function
class PickChunks(torch.autograd.Function):
    """Rows of ``cat([wt, values])`` without making it, in chunks (per chunk ``c``:
    ``out_c[pos_w] = wt[src_w]``, ``out_c[pos_v] = values[src_v]``), one output per chunk (a
    converted encoder's every pick is one chunk of it); the backward adds every chunk's gradient
    into ``wt``'s and ``values``' shapes, ``values``' in a workspace buffer.

    Args (of ``apply``): ws (None or ``(Workspace, site)``), wt ``[N, H]``, values ``[R, H]``,
    then per chunk ``pos_w, src_w, pos_v, src_v``.
    """

    @staticmethod
    def forward(ctx, ws, wt, values, *idx):
        ctx.save_for_backward(*idx)
        ctx.ws, ctx.shapes = ws, (wt.shape, values.shape)
        outs = []
        for j in range(0, len(idx), 4):  # (several only where no mode watches: may_chunk)
            pw, sw, pv, sv = idx[j:j + 4]
            out = wt.new_empty(pw.numel() + pv.numel(), wt.shape[1])
            out.index_copy_(0, pw, wt.index_select(0, sw))
            out.index_copy_(0, pv, values.index_select(0, sv))
            outs.append(out)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        idx = ctx.saved_tensors
        (wshape, vshape), like = ctx.shapes, next(g for g in grads if g is not None)
        gw = like.new_zeros(wshape) if ctx.needs_input_grad[1] else None
        gv = None if not ctx.needs_input_grad[2] else like.new_zeros(vshape) \
            if torch.is_grad_enabled() else take(ctx.ws, "gv", vshape, like).zero_()
        for j, g in zip(range(0, len(idx), 4), grads):
            if g is None:
                continue
            pw, sw, pv, sv = idx[j:j + 4]
            with cache_blocks(j > 0):
                if gw is not None:
                    gw.index_add_(0, sw, g.index_select(0, pw))
                if gv is not None:
                    gv.index_add_(0, sv, g.index_select(0, pv))
        return (None, gw, gv) + (None,) * len(idx)


def sample_chunks(batch: int, num_rows: int, width: int, itemsize: int) -> list[tuple]:
    """``[(first, stop), ...]``: samples per readout chunk, about :data:`CHUNK_BYTES` of
    ``num_rows`` rows of ``width`` per sample; one chunk where the batch is under two."""
    per = max(1, CHUNK_BYTES // max(1, num_rows * width * itemsize))
    if batch < 2 * per:
        return [(0, batch)]
    return [(s, min(batch, s + per)) for s in range(0, batch, per)]


def chunked_readout(readout: nn.Module, parts: list, index: list, cuts: list) -> torch.Tensor:
    """``[B, H]``: ``readout`` per chunk of samples, concatenated.

    Args:
        readout: a :func:`chunkable_readout` aggregation.
        parts: per chunk its rows ``[R_c, H]`` (its samples' kept rows, in order).
        index: per chunk each row's sample within the chunk ``[R_c]``.
        cuts: per chunk ``(first, stop)`` sample.
    """
    return torch.cat([readout(x, index=i, dim_size=s1 - s0)  # (no mode watches: may_chunk)
                      for x, i, (s0, s1) in zip(parts, index, cuts)], 0)
