"""A dense layer of GIN-MLPs summed over edge types, in one pass per sample (what TorchCell's
encoder computes once a deletion's change has reached every gene).

The pattern: ``sum(GINConv(Sequential(Linear, ReLU, Linear), eps_t)(h, edges[t]) for t)``, every
conv dense (all rows differ from the wildtype) and reading the same input. Run op by op through
autograd, each of the nine types makes about ten passes over ``[B * N, H]`` tensors (47 MB each
at the real spec, far beyond any cache) in the forward and twice that in the backward, each pass
bound by memory, not by multiply-adds. :class:`DenseGinSum` runs it a block of samples at
a time instead (one sample on a CPU: 1.7 MB, in cache): per type the aggregation, the GIN sum,
both linear maps and the ReLU, accumulated into the layer's output; its backward likewise. It
keeps each type's GIN sum and ReLU output for the backward (two ``[T, B, N, H]`` buffers).
PyTorch has no tool that fuses this: ``torch.compile`` does not take sparse CSR products, and a
cached plan of kernels would still make each pass over memory. In the TorchCell-shaped step at
the real spec on this project's 2-core CPU the whole step took 3.68 s per batch of 28 against
4.13 s with this layer op by op (medians of 8 interleaved rounds; the layer alone, op by op as a
plain autograd graph, 6.1 s against 1.6 s). Exact: per row the same products as the conv-by-conv
form, tested in float64 against the per-sample reference (``tests/test_convert.py``).
"""
from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn.dense.linear import Linear as PygLinear


def _linear(m: nn.Module) -> bool:
    return isinstance(m, (nn.Linear, PygLinear)) and isinstance(m.weight, torch.Tensor) and \
        not isinstance(m.weight, nn.parameter.UninitializedParameter)


def gin_mlp(conv: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """A GIN's two linear maps if its ``nn`` is exactly ``Sequential(Linear, ReLU, Linear)``
    (``nn.Linear`` or PyG's ``Linear``, initialized) and its eps a tensor; else None.

    Args:
        conv: a ``GINConv`` (or a subclass registered as one).
    """
    seq = getattr(conv, "nn", None)
    if not isinstance(seq, nn.Sequential) or len(seq) != 3 or type(seq[1]) is not nn.ReLU:
        return None
    if not (_linear(seq[0]) and _linear(seq[2])) or not isinstance(conv.eps, torch.Tensor):
        return None
    return seq[0], seq[2]


def block_size(device: torch.device, batch: int) -> int:
    """Samples per block: one on a CPU (its rows stay in cache), the whole batch on a GPU (one
    kernel per step over every sample)."""
    return 1 if device.type == "cpu" else batch


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
        *params: per type ``e_t, lin1.weight, lin1.bias, lin2.weight, lin2.bias`` (biases may
            be None).
    """

    @staticmethod
    def forward(ctx, x, keep, scale, block, mats, *params):
        b, n, f = x.shape
        ps = [params[5 * j:5 * j + 5] for j in range(len(mats))]
        h1, h2 = ps[0][1].shape[0], ps[0][3].shape[0]
        x = x.contiguous()
        z = x.new_empty(len(mats), b, n, f)
        r = x.new_empty(len(mats), b, n, h1)
        out = x.new_empty(b, n, h2)
        bias = [p[4] for p in ps if p[4] is not None]
        xk = x * keep
        for s0 in range(0, b, block):
            s1 = min(b, s0 + block)
            acc = out[s0:s1].view(-1, h2)
            if bias:
                acc.copy_(sum(bias).expand_as(acc))
            else:
                acc.zero_()
            for j, (a, _) in enumerate(mats):
                e, w1, b1, w2, _ = ps[j]
                zj, rj = z[j, s0:s1], r[j, s0:s1].view(-1, h1)
                for i in range(s0, s1):
                    torch.addmm(zj[i - s0], a, xk[i], beta=0, out=zj[i - s0])
                zj.mul_(scale[s0:s1, j]).addcmul_(x[s0:s1], e)
                if b1 is None:
                    torch.mm(zj.view(-1, f), w1.t(), out=rj)
                else:
                    torch.addmm(b1, zj.view(-1, f), w1.t(), out=rj)
                rj.clamp_min_(0)
                acc.addmm_(rj, w2.t())
        ctx.mats, ctx.block = mats, block
        ctx.save_for_backward(x, keep, scale, z, r, *params)
        return out.view(b * n, h2)

    @staticmethod
    def backward(ctx, g):
        x, keep, scale, z, r, *params = ctx.saved_tensors
        mats, block = ctx.mats, ctx.block
        need = ctx.needs_input_grad[5:]
        b, n, f = x.shape
        ps = [params[5 * j:5 * j + 5] for j in range(len(mats))]
        h1, h2 = ps[0][1].shape[0], ps[0][3].shape[0]
        g = g.contiguous().view(b, n, h2)
        grads = [[torch.zeros_like(p) if p is not None and need[5 * j + k] else None
                  for k, p in enumerate(pp)] for j, pp in enumerate(ps)]
        gb2 = g.sum((0, 1)) if any(gg[4] is not None for gg in grads) else None
        gx = torch.zeros_like(x) if ctx.needs_input_grad[0] else None
        gk = torch.zeros_like(x) if ctx.needs_input_grad[0] else None
        for s0 in range(0, b, block):
            s1 = min(b, s0 + block)
            gs, xb = g[s0:s1].view(-1, h2), x[s0:s1]
            for j, (_, at) in enumerate(mats):
                e, w1, _, w2, _ = ps[j]
                gj = grads[j]
                rj = r[j, s0:s1].view(-1, h1)
                if gj[3] is not None:
                    gj[3].addmm_(gs.t(), rj)
                gu = torch.mm(gs, w2).mul_(rj > 0)
                if gj[2] is not None:
                    gj[2] += gu.sum(0)
                if gj[1] is not None:
                    gj[1].addmm_(gu.t(), z[j, s0:s1].view(-1, f))
                if gj[0] is None and gx is None:
                    continue
                gz = torch.mm(gu, w1).view(-1, n, f)
                if gj[0] is not None:
                    gj[0] += torch.dot(gz.view(-1), xb.reshape(-1))
                if gx is not None:
                    gx[s0:s1].addcmul_(gz, e)
                    gz.mul_(scale[s0:s1, j])
                    for i in range(s0, s1):
                        gk[i].addmm_(at, gz[i - s0])
        if gx is not None:
            gx.addcmul_(gk, keep)
        for j, gj in enumerate(grads):  # one tensor per parameter: autograd may keep it
            if gj[4] is not None:
                gj[4] = gb2 if j == 0 else gb2.clone()
        return (gx, None, None, None, None, *[gg for gj in grads for gg in gj])
