"""A converted encoder's per-node modules and its readout over a whole batch, a chunk of rows at
a time on a CPU.

Once a deletion's change has reached every gene, a per-node module after a dense layer (a
``LayerNorm``, a ReLU) and the readout's own operators each make a ``[B * N, H]`` tensor in the
forward and another in the backward: 47 MB at the real spec (B = 28, N = 6,607, H = 64). glibc
serves an allocation above its mmap threshold (32 MB at most) with fresh pages from the kernel and
hands them back when it is freed, so each such tensor costs 11,600 page faults at every step
(:mod:`.workspace`). In the TorchCell-shaped step at the real spec on this project's 2-core CPU
the step took 3.36 s with glibc's defaults and 2.66 s with freed memory kept by its settings
(which are the user's to choose, not a library's; medians of 7 steps each).

:class:`RowChunks` runs a per-node module or function a chunk of rows at a time (each chunk's
operators exactly as on the whole tensor, row by row), its output and its input's gradient in
:mod:`.workspace` buffers, so that only chunk-sized tensors come from the allocator (below its
threshold: reused from the heap). :class:`PickChunks` and :func:`chunked_readout` run a PyG
aggregation readout a chunk of samples at a time: an aggregation reduces each sample's rows
alone, so a chunk's output is its samples' output (tested against one call, and both against the
per-sample reference, in ``tests/test_convert_chunks.py``). A readout that may mix samples (a
norm with batch statistics in train mode, a dropout that draws, a module of a kind not listed in
:data:`ROW_MODULES`) runs in one call, as before.

With the chunks below, the step took 0.908x the time of one call per module (2.67 against
2.92 s per batch of 28, medians of 8 interleaved rounds, per-round ratios 0.79-1.12; 1.2 MB
chunks, 14 readout chunks of two samples).

On a GPU, PyTorch's caching allocator already reuses blocks: one call, one chunk. Where a
``TorchFunctionMode`` or ``TorchDispatchMode`` watches (the sync counter, ``equal``'s guards) or a
module has hooks (``equal``'s rounding probe), the whole tensor is one call, as the model runs
it. PyTorch has no tool for this in eager mode (its CPU allocator keeps no cache, and
``torch.utils.checkpoint`` recomputes a region but allocates its outputs whole), hence this
module.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch_geometric.nn.aggr import Aggregation
from torch_geometric.nn.dense.linear import Linear as PygLinear

from ..common.host import cache_blocks
from .workspace import take

# bytes per chunk: a chunk's tensors stay well under glibc's mmap threshold (and near the cache)
CHUNK_BYTES = 4 << 20

# the modules a chunked readout may hold: each computes every row alone in any mode (a norm
# with batch statistics, or a dropout, is allowed only where it does too: see ``_row_module``)
ROW_MODULES = (nn.Linear, PygLinear, nn.Identity, nn.Sequential, nn.ModuleList, nn.ReLU,
               nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Sigmoid, nn.Tanh, nn.Softplus,
               nn.PReLU, nn.Mish, nn.Hardtanh, nn.LayerNorm)

# the functions (and tensor methods) a chunk of rows may run: elementwise, one tensor in and out
ROW_FUNCTIONS = (torch.relu, F.relu, torch.sigmoid, torch.tanh, F.gelu, F.silu, F.elu,
                 F.leaky_relu, F.softplus, F.mish)
ROW_METHODS = ("relu", "sigmoid", "tanh")


def row_function(node: fx.Node) -> bool:
    """Whether a traced call is one of :data:`ROW_FUNCTIONS` or :data:`ROW_METHODS`."""
    if node.op == "call_method":
        return node.target in ROW_METHODS
    return node.op == "call_function" and node.target in ROW_FUNCTIONS


def _watched() -> bool:
    return bool(_get_current_function_mode_stack() or _get_current_dispatch_mode_stack())


def chunk_rows(x: torch.Tensor) -> int | None:
    """Rows per chunk of ``x`` (about :data:`CHUNK_BYTES`), or None where ``x`` runs in one call:
    on a GPU, under a mode, or where it is under two chunks."""
    if x.device.type != "cpu" or x.dim() < 1 or x.shape[0] == 0 or _watched():
        return None
    rows = max(1, CHUNK_BYTES // max(1, x[0].numel() * x.element_size()))
    return rows if x.shape[0] >= 2 * rows else None


def plain(m: nn.Module) -> bool:
    """No hooks on ``m`` or any of its submodules, and no global module hooks (a chunked call
    would call them once per chunk), and none of them in place (``ReLU(inplace=True)``: a
    chunk's input is a leaf of its own graph)."""
    import torch.nn.modules.module as hooks

    glob = (hooks._global_forward_hooks, hooks._global_forward_pre_hooks,
            hooks._global_backward_hooks, hooks._global_backward_pre_hooks)
    if any(glob):
        return False
    return not any(s._forward_hooks or s._forward_pre_hooks or s._backward_hooks or
                   s._backward_pre_hooks or getattr(s, "inplace", False) for s in m.modules())


class RowChunks(torch.autograd.Function):
    """``fn(x)`` for a per-row ``fn``, a chunk of ``rows`` rows at a time, into a workspace
    buffer; the backward runs each chunk again with its graph (a chunk's forward is a pass over
    memory in cache: keeping every chunk's graph instead would hold its tensors past a backward
    that frees the step's) and writes the input's gradient into a workspace buffer, adding the
    parameters' gradients over the chunks in order. A backward that builds a graph
    (``create_graph``) runs ``fn`` on the whole input once more instead, so that its gradient is
    differentiable again.

    Args (of ``apply``):
        fn: ``[R, ...] -> [R, ...]``, each row alone and the same at every call (a per-node
            module or function: nothing drawn, no state changed).
        rows: rows per chunk (:func:`chunk_rows`).
        ws: None, or ``(Workspace, site)`` (:mod:`.workspace`).
        x: the input.
        *params: the tensors ``fn`` reads besides ``x`` that may need a gradient (a module's
            parameters).
    """

    @staticmethod
    def forward(ctx, fn, rows, ws, x, *params):
        n = x.shape[0]
        out = None
        for s in range(0, n, rows):
            t = min(n, s + rows)
            with cache_blocks(s > 0):
                yc = fn(x[s:t])
            if yc.shape[:1] != (t - s,):
                raise ValueError(f"a per-row function gave {yc.shape[0]} rows for {t - s}")
            if out is None:
                out = take(ws, "out", (n,) + tuple(yc.shape[1:]), yc)
            out[s:t].copy_(yc)
        ctx.fn, ctx.rows, ctx.ws = fn, rows, ws
        ctx.save_for_backward(x, *params)
        return out

    @staticmethod
    def backward(ctx, g):
        x, *params = ctx.saved_tensors
        need = ctx.needs_input_grad
        want = [p for p, nd in zip(params, need[4:]) if nd]
        if torch.is_grad_enabled():  # create_graph: differentiable, the whole input at once
            with torch.enable_grad():
                y = ctx.fn(x)
            ins = ([x] if need[3] else []) + want
            got = list(torch.autograd.grad(y, ins, g, create_graph=True, allow_unused=True))
            gx = (got.pop(0) if got else None) if need[3] else None
            return (None, None, None, gx, *_aligned(got, need[4:]))
        gx = take(ctx.ws, "gx", x.shape, x) if need[3] else None
        gp: list = [None] * len(want)
        for s in range(0, x.shape[0], ctx.rows):
            t = min(x.shape[0], s + ctx.rows)
            with cache_blocks(s > 0):
                xc = x[s:t].detach().requires_grad_(need[3])
                with torch.enable_grad():
                    yc = ctx.fn(xc)
                ins = ([xc] if need[3] else []) + want
                got = list(torch.autograd.grad(yc, ins, g[s:t], allow_unused=True)) \
                    if ins and yc.requires_grad else [None] * len(ins)
                if need[3]:
                    gc = got.pop(0)
                    if gc is None:
                        gx[s:t].zero_()
                    else:
                        gx[s:t].copy_(gc)
                for k, gk in enumerate(got):
                    if gk is not None:
                        gp[k] = gk if gp[k] is None else gp[k].add_(gk)
        return (None, None, None, gx, *_aligned(gp, need[4:]))


def _aligned(got: list, need: tuple) -> list:
    """``got`` (one per needed parameter, in order) spread over every parameter's slot."""
    it = iter(got)
    return [next(it) if nd else None for nd in need]


def per_row(fn: Callable, x: torch.Tensor, weights: list, ws) -> torch.Tensor:
    """``fn(x)``, a chunk of rows at a time where :func:`chunk_rows` says so (``fn`` each row
    alone; ``weights``: what it reads that may need a gradient), else in one call."""
    rows = chunk_rows(x)
    if rows is None:
        return fn(x)
    return RowChunks.apply(fn, rows, ws, x, *weights)


def _row_module(m: nn.Module) -> bool:
    if isinstance(m, (nn.Dropout, nn.AlphaDropout)):
        return m.p == 0 or not m.training
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        return not m.training and m.track_running_stats
    return type(m) in ROW_MODULES or isinstance(m, Aggregation)


def chunkable_readout(readout: nn.Module) -> bool:
    """Whether ``readout`` computes each sample's output from its rows alone, whatever the
    batch: a PyG aggregation, every submodule a per-row kind (:data:`ROW_MODULES`, an eval-mode
    norm, a dropout that does not draw), no hooks."""
    return isinstance(readout, Aggregation) and plain(readout) and \
        all(_row_module(s) for s in readout.modules())


class PickChunks(torch.autograd.Function):
    """Rows of ``cat([wt, values])`` in chunks (per chunk ``c``: ``out_c[pos_w] = wt[src_w]``,
    ``out_c[pos_v] = values[src_v]``), one output per chunk; the backward adds every chunk's
    gradient into ``wt``'s and ``values``' shapes, ``values``' in a workspace buffer.

    Args (of ``apply``): ws (None or ``(Workspace, site)``), wt ``[N, H]``, values ``[R, H]``,
    then per chunk ``pos_w, src_w, pos_v, src_v``.
    """

    @staticmethod
    def forward(ctx, ws, wt, values, *idx):
        ctx.save_for_backward(*idx)
        ctx.ws, ctx.shapes = ws, (wt.shape, values.shape)
        outs = []
        for j in range(0, len(idx), 4):
            pw, sw, pv, sv = idx[j:j + 4]
            with cache_blocks(j > 0):
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
    outs = []
    for j, (x, i, (s0, s1)) in enumerate(zip(parts, index, cuts)):
        with cache_blocks(j > 0):
            outs.append(readout(x, index=i, dim_size=s1 - s0))
    return torch.cat(outs, 0)
