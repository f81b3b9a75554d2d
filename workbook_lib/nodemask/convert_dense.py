"""A dense layer of GIN-MLPs summed over edge types, in one pass per sample (what TorchCell's
encoder computes once a deletion's change has reached every gene).

The pattern: ``sum(GINConv(Sequential(Linear, ReLU, Linear), eps_t)(h, edges[t]) for t)``, every
conv dense (all rows differ from the wildtype) and reading the same input. Run op by op through
autograd, each of the nine types makes about ten passes over ``[B * N, H]`` tensors (47 MB each
at the real spec, far beyond any cache) in the forward and twice that in the backward, each pass
bound by memory, not by multiply-adds. :class:`DenseGinSum` runs it a block of samples at
a time instead (one sample on a CPU: 1.7 MB, in cache): per type the aggregation, the GIN sum,
both linear maps and the ReLU, accumulated into the layer's output; its backward likewise. It
keeps each type's GIN sum and ReLU output for the backward (``[T, B, N, F]`` and ``[T, B, N, H]``).
On a CPU with several compute threads its samples are split between workers, one compute thread
each (:mod:`.workers`: 0.857x the layer's time at the real spec on 2 cores).
PyTorch has no tool that fuses this: ``torch.compile`` does not take sparse CSR products, and a
cached plan of kernels would still make each pass over memory. In the TorchCell-shaped step at
the real spec on this project's 2-core CPU the whole step took 3.68 s per batch of 28 against
4.13 s with this layer op by op (medians of 8 interleaved rounds; the layer alone, op by op as a
plain autograd graph, 6.1 s against 1.6 s). Exact to rounding (the same products per row as the
conv-by-conv form, the biases added first), tested in float64 against the per-sample reference
(``tests/test_convert.py``); the backwards are first-order only (a second derivative through them
raises: :mod:`.first_order`).

:class:`GinMlp` is the same per-row work for one GIN of that shape computed conv by conv (a delta
layer's changed rows, or a dense one outside such a sum): its GIN sum, both maps and the ReLU, a
block of rows at a time. On 170,000 rows of 64 features (a second layer's changed rows at the
real spec), forward and backward: 93 ms against 115 ms op by op with freed memory kept, 157
against 195 ms with glibc's defaults (medians of 7 interleaved; blocks of 1,024 and 16,384 rows
took 105 and 97 ms). In the whole TorchCell-shaped step that is within the step's noise.

:class:`DeltaGinSum` is the sum over types of such GINs in a delta layer (TorchCell's second
layer at the real spec: every conv delta, about a million changed rows in all), a sample at a
time: each sample's rows of the sum stay in cache while each type's MLP adds into them. The
TorchCell-shaped step at the real spec took 0.946x the time with it than with :class:`GinMlp`
per type and the sum after (2.84 against 3.02 s per batch of 28, median per-round ratio of 8
interleaved rounds), and its samples side by side in :mod:`.workers` 0.928x the time of one
sample after another with every compute thread per operator (8 rounds).
"""
from __future__ import annotations

import torch
import torch.nn.modules.module as module_hooks
from torch import nn
from torch_geometric.nn.dense.linear import Linear as PygLinear

from ..common.host import cache_blocks
from .compiled import kernels
from .first_order import first_order
from .workers import spread, workers
from .workspace import take
from .parts import timed_function


def hookless(m: nn.Module) -> bool:
    """No hooks on the module, and no global module hooks (a fused form does not call it)."""
    own = (m._forward_hooks, m._forward_pre_hooks, m._backward_hooks, m._backward_pre_hooks)
    glob = [getattr(module_hooks, name, None) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks")]
    return not any(own) and not any(glob)


def _linear(m: nn.Module) -> bool:
    return type(m) in (nn.Linear, PygLinear) and hookless(m) and \
        isinstance(m.weight, torch.Tensor) and \
        not isinstance(m.weight, nn.parameter.UninitializedParameter)


def gin_mlp(conv: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """A GIN's two linear maps if its ``nn`` is exactly ``Sequential(Linear, ReLU, Linear)``
    (``nn.Linear`` or PyG's ``Linear``, initialized, not subclassed, no forward hooks) and its
    eps a tensor; else None.

    Args:
        conv: a ``GINConv`` (or a subclass registered as one).
    """
    seq = getattr(conv, "nn", None)
    if type(seq) is not nn.Sequential or len(seq) != 3 or type(seq[1]) is not nn.ReLU:
        return None
    if not (_linear(seq[0]) and _linear(seq[2]) and hookless(seq) and hookless(seq[1])) or \
            not isinstance(conv.eps, torch.Tensor):
        return None
    return seq[0], seq[2]


ROWS = 4096  # rows per block on a CPU: each block's z and ReLU output 1 MB at 64 features
# DeltaGinSum's samples run in groups of consecutive samples whose rows of the sum are at most
# this many (at least one sample per group; 0 or less: one sample at a time, as before)
GROUP_ROWS = ROWS


def sample_groups(u_off, lo: int, hi: int, budget: int | None = None) -> list[tuple[int, int]]:
    """Samples ``lo..hi-1`` cut into runs ``(s0, s1)`` of consecutive samples whose rows (from
    ``u_off``, each sample's first row) add up to at most ``budget`` (:data:`GROUP_ROWS`), a
    sample alone where its own rows exceed it: a layer whose samples change few rows runs a few
    operators per group instead of per sample."""
    budget = GROUP_ROWS if budget is None else budget
    out, s0 = [], lo
    while s0 < hi:
        s1 = s0 + 1
        while budget > 0 and s1 < hi and u_off[s1 + 1] - u_off[s0] <= budget:
            s1 += 1
        out.append((s0, s1))
        s0 = s1
    return out


def block_rows(device: torch.device, rows: int) -> int:
    """Rows per block of :class:`GinMlp`: :data:`ROWS` on a CPU, all on a GPU."""
    return ROWS if device.type == "cpu" else max(1, rows)


def _maps(z, w1, b1, r) -> None:
    """``r = relu(z @ w1.T + b1)``, written into ``r``."""
    if b1 is None:
        torch.mm(z, w1.t(), out=r)
    else:
        torch.addmm(b1, z, w1.t(), out=r)
    r.clamp_min_(0)


def _maps_backward(g, z, r, w1, w2, grads, out=None):
    """One block's backward through ``lin2(relu(lin1(z)))`` (``g`` at its output): adds the
    weight and bias gradients into ``grads`` (slots ``e, w1, b1, w2, b2``; None where not
    needed, ``b2``'s left to the caller) and returns the gradient at ``z``."""
    if grads[3] is not None:
        grads[3].addmm_(g.t(), r)
    gu = torch.mm(g, w2)
    # the ReLU's backward in place, as autograd computes it (one pass; ``mul_(r > 0)`` is two)
    torch.ops.aten.threshold_backward.grad_input(gu, r, 0, grad_input=gu)
    if grads[2] is not None:
        grads[2] += gu.sum(0)
    if grads[1] is not None:
        grads[1].addmm_(gu.t(), z)
    return torch.mm(gu, w1) if out is None else torch.mm(gu, w1, out=out)


def _gin_rows(agg, x, e, w1, b1, w2, b2, z, r, out, wt=None, genes=None, gfac=None) -> None:
    """A block of a GIN-MLP's rows, into ``z`` (its GIN sum), ``r`` (the ReLU's output) and
    ``out``: ``lin2(relu(lin1(agg + e * x)))``, with ``wt`` given ``agg + wt[genes] * gfac`` in
    the op-by-op order (:class:`GinMlp`'s blocks)."""
    if wt is None:
        torch.addcmul(agg, x, e, out=z)
    else:
        torch.index_select(wt, 0, genes, out=z)
        z.mul_(gfac)
        torch.add(agg, z, out=z).addcmul_(x, e)
    _maps(z, w1, b1, r)
    if b2 is None:
        torch.mm(r, w2.t(), out=out)
    else:
        torch.addmm(b2, r, w2.t(), out=out)


def _gin_rows_backward(g, x, z, r, e, w1, w2, grads, gz_out, gx_out=None) -> torch.Tensor:
    """The backward of :func:`_gin_rows` for a block (``g`` at its output): the weight and
    bias gradients added into ``grads`` (slots ``e, w1, b1, w2``; ``b2``'s left to the caller),
    the gradient at ``agg`` written into ``gz_out`` and returned, at ``x`` into ``gx_out``."""
    gz = _maps_backward(g, z, r, w1, w2, grads, out=gz_out)
    if grads[0] is not None:
        grads[0] += torch.dot(gz.view(-1), x.reshape(-1))
    if gx_out is not None:
        torch.mul(gz, e, out=gx_out)
    return gz


@timed_function
class GinMlp(torch.autograd.Function):
    """A GIN whose ``nn`` is ``Sequential(Linear, ReLU, Linear)`` on its rows:
    ``lin2(relu(lin1(agg + e * x)))``, ``[R, F] -> [R, H]``, a block of rows at a time (each
    block's GIN sum and ReLU output stay in cache between the maps, and are kept for the
    backward). Op by op, each of the five steps is a pass over ``[R, F]`` tensors of the
    layer's size.

    A delta layer's aggregation has a wildtype part, ``wt[genes] * gfac`` (the rows' wildtype
    aggregation, scaled): given ``wt``, each block adds it to its ``agg`` rows while in cache,
    the same operations in the same order as ``agg + wt[genes] * gfac`` op by op, which makes
    three passes over ``[R, F]`` tensors and two of their allocations (its gradient at ``wt``
    is one ``index_add_`` over all rows: per block it ran slower). On 153,000 rows of 64,
    forward and backward, against that sum op by op then this function: 0.93x the time with
    freed memory kept, 0.82x with glibc's defaults (medians of 11 interleaved).

    Args (of ``apply``):
        agg, x: ``[R, F]``, the rows' aggregation (less its wildtype part, if given) and their
            own input.
        rows: rows per block (:func:`block_rows`).
        e, w1, b1, w2, b2: ``1 + eps``, the maps' weights and biases (biases may be None).
        wt, genes, gfac: None, or ``[N, F]`` wildtype aggregation, ``[R]`` each row's gene and
            ``[R, 1]`` its factor.
        ws: None, or ``(Workspace, site)``: where the large buffers come from
            (:mod:`.workspace`).
    """

    @staticmethod
    def forward(ctx, agg, x, rows, e, w1, b1, w2, b2, wt=None, genes=None, gfac=None, ws=None):
        n = agg.shape[0]
        agg, x = agg.contiguous(), x.contiguous()
        z = take(ws, "z", agg.shape, agg)
        r = take(ws, "r", (n, w1.shape[0]), agg)
        out = take(ws, "out", (n, w2.shape[0]), agg)
        for s in range(0, n, rows):  # a GPU runs all rows as one block: counted once
            with cache_blocks(s > 0):
                t = min(n, s + rows)
                _gin_rows(agg[s:t], x[s:t], e, w1, b1, w2, b2, z[s:t], r[s:t], out[s:t],
                          *((None,) * 3 if wt is None else (wt, genes[s:t], gfac[s:t])))
        ctx.rows, ctx.ws = rows, ws
        ctx.wt_rows = None if wt is None else wt.shape[0]
        ctx.save_for_backward(x, z, r, e, w1, b1, w2, b2, genes, gfac)
        return out

    @staticmethod
    @first_order("the converted form's fused GIN-MLP blocks")
    def backward(ctx, g):
        x, z, r, e, w1, b1, w2, b2, genes, gfac = ctx.saved_tensors
        need = ctx.needs_input_grad
        grads = [torch.zeros_like(p) if p is not None and need[3 + k] else None
                 for k, p in enumerate((e, w1, b1, w2, b2))]
        g = g.contiguous()
        gagg = take(ctx.ws, "gagg", z.shape, z)
        gx = take(ctx.ws, "gx", x.shape, x) if need[1] else None
        gwt = z.new_zeros(ctx.wt_rows, z.shape[1]) if ctx.wt_rows is not None and need[8] \
            else None
        for s in range(0, g.shape[0], ctx.rows):  # counted once, as in the forward
            with cache_blocks(s > 0):
                t = min(g.shape[0], s + ctx.rows)
                _gin_rows_backward(g[s:t], x[s:t], z[s:t], r[s:t], e, w1, w2, grads, gagg[s:t],
                                   None if gx is None else gx[s:t])
        if gwt is not None:
            gwt.index_add_(0, genes, torch.mul(gagg, gfac,
                                               out=take(ctx.ws, "gs", gagg.shape, gagg)))
        if grads[4] is not None:
            grads[4] = g.sum(0)
        return (gagg if need[0] else None, gx, None, *grads, gwt, None, None, None)


def block_product(a: torch.Tensor, x: torch.Tensor, out: torch.Tensor, add: bool = False):
    """``out[i] (+)= a @ x[i]`` for every sample ``i`` of a block (``x``, ``out``: ``[blk, N,
    F]``; ``a`` CSR ``[N, N]``): one sample's product straight into its rows; a larger block
    (a GPU's whole batch) as one sparse product over the block gene-major, ``[N, blk * F]``
    (each output element the same sum over the same row of ``a``), where a product per sample
    made B x T calls per layer."""
    blk, n, f = x.shape
    if blk == 1:
        torch.addmm(out[0], a, x[0], beta=1 if add else 0, out=out[0])
        return
    prod = torch.mm(a, x.transpose(0, 1).reshape(n, blk * f)).view(n, blk, f).transpose(0, 1)
    if add:
        out.add_(prod)
    else:
        out.copy_(prod)


def block_size(device: torch.device, batch: int) -> int:
    """Samples per block: one on a CPU (its rows stay in cache), the whole batch on a GPU (each
    type's aggregation, maps, ReLU and running sum one kernel each over every sample; not
    measured here)."""
    return 1 if device.type == "cpu" else batch


@timed_function
class DenseGinSum(torch.autograd.Function):
    """``sum_t lin2_t(relu(lin1_t(z_t)))`` as ``[B * N, H]``, sample-major, where
    ``z_t = scale[:, t] * (a_t @ (keep * x)) + e_t * x`` per sample (``a_t`` the type's CSR
    adjacency ``[N, N]``, ``e_t = 1 + eps_t``; ``scale`` zeroes a deleted gene's row, and for a
    mean divides by the kept in-degree).

    Args (of ``apply``):
        x: ``[B, N, F]``, the layer's input (deleted genes' rows as computed).
        keep: ``[B, N, 1]``, 0 at deleted genes, else 1.
        scale: ``[B, T, N, 1]``.
        block: samples per block (:func:`block_size`).
        mats: per type ``(a_t, a_t transposed)``, both CSR.
        ws: None, or ``(Workspace, site)`` (:mod:`.workspace`).
        *params: per type ``e_t, lin1.weight, lin1.bias, lin2.weight, lin2.bias`` (biases may
            be None).
    """

    @staticmethod
    def forward(ctx, x, keep, scale, block, mats, ws, *params):
        b, n, f = x.shape
        ps = [params[5 * j:5 * j + 5] for j in range(len(mats))]
        h1, h2 = ps[0][1].shape[0], ps[0][3].shape[0]
        x = x.contiguous()
        z = take(ws, "z", (len(mats), b, n, f), x)
        r = take(ws, "r", (len(mats), b, n, h1), x)
        flat = take(ws, "out", (b * n, h2), x)  # returned as made: a view could not be changed
        out = flat.view(b, n, h2)  # in place
        bias = [p[4] for p in ps if p[4] is not None]
        bias = sum(bias) if bias else None  # every type's lin2 bias, once
        xk = torch.mul(x, keep, out=take(ws, "xk", x.shape, x))

        def blocks(lo: int, hi: int) -> None:  # samples lo..hi-1, a block at a time
            for s0 in range(lo, hi, block):
                s1 = min(hi, s0 + block)
                with cache_blocks(s0 > 0):  # the block's work, which a GPU runs once: counted
                    acc = out[s0:s1].view(-1, h2)  # once
                    if bias is not None:
                        acc.copy_(bias.expand_as(acc))
                    else:
                        acc.zero_()
                    for j, (a, _) in enumerate(mats):
                        e, w1, b1, w2, _ = ps[j]
                        zj, rj = z[j, s0:s1], r[j, s0:s1].view(-1, h1)
                        block_product(a, xk[s0:s1], zj)
                        zj.mul_(scale[s0:s1, j]).addcmul_(x[s0:s1], e)
                        _maps(zj.view(-1, f), w1, b1, rj)
                        acc.addmm_(rj, w2.t())
        k = workers(x.device, -(-b // block))
        spread(blocks, b, k)  # whole blocks per worker: block is 1 where k > 1 (a CPU)
        ctx.mats, ctx.block, ctx.ws = mats, block, ws
        ctx.save_for_backward(x, keep, scale, z, r, *params)
        return flat

    @staticmethod
    @first_order("the converted form's fused GIN-MLP blocks")
    def backward(ctx, g):
        x, keep, scale, z, r, *params = ctx.saved_tensors
        mats, block, ws = ctx.mats, ctx.block, ctx.ws
        need = ctx.needs_input_grad[6:]
        b, n, f = x.shape
        ps = [params[5 * j:5 * j + 5] for j in range(len(mats))]
        h1, h2 = ps[0][1].shape[0], ps[0][3].shape[0]
        g = g.contiguous().view(b, n, h2)

        def zeros() -> list:
            return [[torch.zeros_like(p) if p is not None and need[5 * j + k] else None
                     for k, p in enumerate(pp)] for j, pp in enumerate(ps)]
        gx = take(ws, "gx", x.shape, x).zero_() if ctx.needs_input_grad[0] else None
        gk = take(ws, "gk", x.shape, x).zero_() if ctx.needs_input_grad[0] else None

        def blocks(lo: int, hi: int) -> list:  # samples lo..hi-1: their weight gradients
            grads = zeros()
            for s0 in range(lo, hi, block):
                s1 = min(hi, s0 + block)
                with cache_blocks(s0 > 0):  # as in the forward: the block's work counted once
                    gs, xb = g[s0:s1].view(-1, h2), x[s0:s1]
                    for j, (_, at) in enumerate(mats):
                        e, w1, _, w2, _ = ps[j]
                        gj = grads[j]
                        gz = _maps_backward(gs, z[j, s0:s1].view(-1, f),
                                            r[j, s0:s1].view(-1, h1), w1, w2, gj).view(-1, n, f)
                        if gj[0] is not None:
                            gj[0] += torch.dot(gz.view(-1), xb.reshape(-1))
                        if gx is not None:
                            gx[s0:s1].addcmul_(gz, e)
                            gz.mul_(scale[s0:s1, j])
                            block_product(at, gz, gk[s0:s1], add=True)
            return grads
        parts = spread(blocks, b, workers(x.device, -(-b // block)))
        grads = parts[0]
        for other in parts[1:]:  # each worker's partial sums, in the workers' order
            for gj, oj in zip(grads, other):
                for t, o in zip(gj, oj):
                    if t is not None:
                        t += o
        gb2 = g.sum((0, 1)) if any(gg[4] is not None for gg in grads) else None
        if gx is not None:
            gx.addcmul_(gk, keep)
        for j, gj in enumerate(grads):  # one tensor per parameter: autograd may keep it
            if gj[4] is not None:
                gj[4] = gb2 if j == 0 else gb2.clone()
        return (gx, None, None, None, None, None, *[gg for gj in grads for gg in gj])


def _most(idx, groups) -> int:
    """The most changed rows of one type in one of ``groups`` (at least 1)."""
    return max([1] + [o[s1] - o[s0] for *_, o in idx for s0, s1 in groups])


def _np(t: torch.Tensor):
    """A CPU tensor's values as a contiguous numpy array (one row per row; a tensor of one value,
    such as ``1 + eps``, as an array of one)."""
    return t.detach().contiguous().numpy() if t.dim() > 1 else t.detach().reshape(-1).numpy()


@timed_function
class DeltaGinSum(torch.autograd.Function):
    """The rows ``U`` of a sum over edge types of GIN-MLPs in a delta layer, a sample at a time
    (or a group of consecutive samples whose rows of ``U`` are few, :func:`sample_groups`: a
    first layer's, whose samples change a few hundred rows, ran about 20 operators per sample
    and type; the TorchCell-shaped step at the real spec 0.988x [IQR 0.036] the time of one
    sample at a time, 10 interleaved rounds, that layer 63 against 81 ms per step):
    each sample's rows of ``U`` start as the summed wildtype's (``wt[gene_u]``; ``wt`` itself
    where ``U`` is every row), then per type ``t``, in the sum's order, that sample's changed
    rows ``i`` of the type add ``lin2_t(relu(lin1_t(z_i))) - wto_t[gene_i]`` at their places
    ``pos_t[i]`` in ``U``, with ``z_i = agg_t[i] + wta_t[gene_i] * gfac_t[i] + e_t * x_t[i]``.
    These are :class:`GinMlp`'s operations per type and then the sum's (``_SumAt`` in
    :mod:`.convert`), per row in the same order. Conv by conv, each type's output rows, their
    wildtype, their difference and the sum's gradient at them are each written over the whole
    batch (a TorchCell-shaped second layer at the real spec: about a million rows of 64 per
    pass) and read back; here each sample's rows of the sum stay in cache while its types add
    into them, and the backward gathers each type's gradient rows from them. The row scatters
    (into the sum, and into each type's wildtype gradients) and the passes around the maps (the
    GIN sum; the gradient rows' gather; the gradient at ``x``) are compiled
    (:mod:`.numba_rows`: the same operations in the same order, the GIN sum's ``x * e`` rounded
    before its add). Only on a CPU,
    with nothing watching its operators (:func:`.workers.watched`); whole samples run side by
    side in :mod:`.workers`. Exact to rounding, first-order only (:mod:`.first_order`),
    tested in float64 against the per-sample reference and the conv-by-conv form
    (``tests/test_convert_delta_sum.py``).

    Args (of ``apply``):
        wt: ``[N, H]``, the sum's wildtype.
        gene_u: None (``U`` is every row, sample-major) or ``[R_u]``, each row's gene.
        u_off: ``B + 1`` ints, each sample's first row in ``U``.
        ws: None, or ``(Workspace, site)`` (:mod:`.workspace`).
        idx: per type ``(genes, gfac, pos, off)``: ``[R_t]`` genes, ``[R_t, 1]`` factors,
            ``[R_t]`` places in ``U``, ``B + 1`` ints (each sample's first changed row).
        *params: per type ``agg, x`` (``[R_t, F]``), ``wta`` (``[N, F]``), ``wto`` (``[N, H]``),
            ``e, w1, b1, w2, b2`` (biases may be None).
    """

    @staticmethod
    def forward(ctx, wt, gene_u, u_off, ws, idx, *params):
        ps = [params[9 * j:9 * j + 9] for j in range(len(idx))]
        h1, h = ps[0][5].shape[0], ps[0][7].shape[0]
        b = len(u_off) - 1
        out = take(ws, "out", (u_off[-1], h), wt)
        z = [take(ws, ("z", j), p[0].shape, p[0]) for j, p in enumerate(ps)]
        r = [take(ws, ("r", j), (p[0].shape[0], h1), p[0]) for j, p in enumerate(ps)]

        add_diff_at, gin_sum_rows = kernels().add_diff_at, kernels().gin_sum_rows  # see
        out_np = out.detach().numpy()                                              # .numba_rows
        at_np = [(genes.numpy(), pos.numpy()) for genes, _, pos, _ in idx]
        wto_np, agg_np, x_np, wta_np, e_np = ([_np(p[k]) for p in ps] for k in (3, 0, 1, 2, 4))
        gfac_np = [i[1].numpy() for i in idx]

        def samples(lo: int, hi: int) -> None:
            groups = sample_groups(u_off, lo, hi)
            o = wt.new_empty(_most(idx, groups), h)
            for s, s1 in groups:
                with cache_blocks(s > lo):  # a group's work: counted once
                    ou = out[u_off[s]:u_off[s1]]
                    if gene_u is None:  # each sample's rows are every row
                        ou.view(s1 - s, -1, h).copy_(wt)
                    else:
                        torch.index_select(wt, 0, gene_u[u_off[s]:u_off[s1]], out=ou)
                    for j, (_, _, _, _, _, w1, b1, w2, b2) in enumerate(ps):
                        off = idx[j][3]
                        i0, i1 = off[s], off[s1]
                        if i1 == i0:
                            continue
                        oo = o[:i1 - i0]
                        zz, rr = z[j][i0:i1], r[j][i0:i1]
                        # zz = agg + wta[genes] * gfac + e * x: _gin_rows's four passes in one
                        gin_sum_rows(zz.numpy(), agg_np[j][i0:i1], wta_np[j], at_np[j][0][i0:i1],
                                     gfac_np[j][i0:i1], x_np[j][i0:i1], e_np[j])
                        _maps(zz, w1, b1, rr)
                        if b2 is None:
                            torch.mm(rr, w2.t(), out=oo)
                        else:
                            torch.addmm(b2, rr, w2.t(), out=oo)
                        # out[pos] += oo - wto[genes]: index_select, sub and index_add_
                        add_diff_at(out_np, at_np[j][1][i0:i1], oo.numpy(), wto_np[j],
                                    at_np[j][0][i0:i1])
        spread(samples, b, workers(wt.device, b))
        ctx.idx, ctx.u_off, ctx.ws, ctx.n = idx, u_off, ws, wt.shape[0]
        ctx.save_for_backward(gene_u, *[t for j, p in enumerate(ps)
                                        for t in (p[1], z[j], r[j], *p[4:])])
        return out

    @staticmethod
    @first_order("the converted form's fused GIN-MLP blocks")
    def backward(ctx, g):
        gene_u, *saved = ctx.saved_tensors
        idx, u_off, ws, n = ctx.idx, ctx.u_off, ctx.ws, ctx.n
        need = ctx.needs_input_grad
        t = len(idx)
        ps = [saved[8 * j:8 * j + 8] for j in range(t)]  # x, z, r, e, w1, b1, w2, b2
        nd = [need[5 + 9 * j:14 + 9 * j] for j in range(t)]
        b = len(u_off) - 1
        g = g.contiguous()
        h = g.shape[1]
        gagg = [take(ws, ("gagg", j), p[1].shape, p[1]) for j, p in enumerate(ps)]
        gx = [take(ws, ("gx", j), p[0].shape, p[0]) if nd[j][1] else None
              for j, p in enumerate(ps)]

        k = kernels()  # compiled row passes: see .numba_rows
        add_scaled_at, take_add_at, gin_sum_rows_backward = \
            k.add_scaled_at, k.take_add_at, k.gin_sum_rows_backward
        at_np = [(genes.numpy(), gfac.numpy()) for genes, gfac, _, _ in idx]
        g_np, pos_np, e_np = g.numpy(), [i[2].numpy() for i in idx], [_np(p[3]) for p in ps]

        def samples(lo: int, hi: int) -> list:
            gwt = g.new_zeros(n, h) if need[0] else None
            per = [[g.new_zeros(n, p[1].shape[1]) if nd[j][2] else None,
                    g.new_zeros(n, h) if nd[j][3] else None]
                   + [torch.zeros_like(q) if q is not None and nd[j][4 + k] else None
                      for k, q in enumerate(p[3:])] for j, p in enumerate(ps)]
            groups = sample_groups(u_off, lo, hi)
            go = g.new_empty(_most(idx, groups), h)
            for s, s1 in groups:
                with cache_blocks(s > lo):  # as in the forward
                    if gwt is not None:
                        if gene_u is None:
                            for q in range(s, s1):  # sample by sample, as the sums' order
                                gwt += g[u_off[q]:u_off[q + 1]]
                        else:
                            gwt.index_add_(0, gene_u[u_off[s]:u_off[s1]], g[u_off[s]:u_off[s1]])
                    for j, (x, z, r, e, w1, _, w2, _) in enumerate(ps):
                        _, _, pos, off = idx[j]
                        i0, i1 = off[s], off[s1]
                        if i1 == i0:
                            continue
                        gwta, gwto, *sums = per[j]  # sums: e, w1, b1, w2, b2
                        gb2 = sums[4]
                        gob = go[:i1 - i0]
                        if gwto is not None:  # negated once, after the sum: see below
                            # gob = g[pos]; gwto.index_add_(0, genes, gob): in one pass
                            take_add_at(gob.numpy(), g_np, pos_np[j][i0:i1], gwto.numpy(),
                                        at_np[j][0][i0:i1])
                        else:
                            torch.index_select(g, 0, pos[i0:i1], out=gob)
                        if gb2 is not None:
                            gb2 += gob.sum(0)
                        if gx[j] is not None and gwta is not None:
                            gz = _maps_backward(gob, z[i0:i1], r[i0:i1], w1, w2, sums,
                                                out=gagg[j][i0:i1])
                            if sums[0] is not None:
                                sums[0] += torch.dot(gz.view(-1), x[i0:i1].reshape(-1))
                            # gx = gz * e; gwta.index_add_(0, genes, gz * gfac): in one pass
                            gin_sum_rows_backward(gx[j][i0:i1].numpy(), gz.numpy(), e_np[j],
                                                  gwta.numpy(), at_np[j][0][i0:i1],
                                                  at_np[j][1][i0:i1])
                            continue
                        gz = _gin_rows_backward(
                            gob, x[i0:i1], z[i0:i1], r[i0:i1], e, w1, w2, sums,
                            gagg[j][i0:i1], None if gx[j] is None else gx[j][i0:i1])
                        if gwta is not None:
                            # gwta.index_add_(0, genes, gz * gfac)
                            add_scaled_at(gwta.numpy(), at_np[j][0][i0:i1], gz.numpy(),
                                          at_np[j][1][i0:i1])
            return [gwt, per]
        parts = spread(samples, b, workers(g.device, b))
        gwt, per = parts[0]
        for ogwt, oper in parts[1:]:  # each worker's partial sums, in the workers' order
            if gwt is not None:
                gwt += ogwt
            for pj, oj in zip(per, oper):
                for a, o in zip(pj, oj):
                    if a is not None:
                        a += o
        grads = []
        for j in range(t):
            if per[j][1] is not None:  # -(a + b) is -a + -b: added as is, negated once (the
                per[j][1].neg_()       # same values; an untouched row's zeros are now -0.0)
            grads += [gagg[j] if nd[j][0] else None, gx[j], *per[j]]
        return (gwt, None, None, None, None, *grads)
