"""Delta propagation: a middle layer whose per-sample cost follows what a deletion changed.

After an incremental first layer, sample ``b``'s features are ``h1_b = h1 + d1_b``, where ``d1_b``
is non-zero only on the rows ``R_b`` of :class:`~workbook_lib.nodemask.batch.Corrections` (the
deleted genes and their out-neighbours). The next layer's masked input is
``D_b h1_b = h1 + e_b`` with ``e_b = d1_b`` on the kept rows of ``R_b`` and ``-h1`` on the deleted
genes, so for sum aggregation

    ``sum_t A_t (D_b h1_b) W_t^T = sum_t A_t h1 W_t^T + sum_t A_t (e_b W_t^T)``:

the wildtype part is one product per batch, and each sample adds a *push* of
``u_b = e_b W_t^T`` (``|R_b| x H x T x H_out`` dense work) along the out-edges of ``R_b`` only
(``|edges leaving R_b| x H_out``), not all ``E`` edges. Mean aggregation divides each message
by the receiving row's per-sample degree ``deg_tb`` (it differs from the wildtype's only at the
out-neighbours of deleted genes) and corrects the wildtype part on those rows with
``S_t (1 / deg_tb - 1 / deg_t) W_t^T`` (``S`` the wildtype sums): exact as well.

The push (:func:`push`) is a column-sliced sparse product. Stock PyTorch has none that is fast on
a CPU (``index_add_`` of gathered messages, CSC products and column-filtered CSR builds all cost
about as much as the full product there), so two kernels compute it:

* ``numba`` (CPU default when ``numba`` is installed): a compiled loop, parallel over samples
  (each sample writes only its own ``[N, H]`` slab, which stays in a core's cache, so no atomics);
  its backward is a gather, parallel over the rows of ``R_b``. Numba is the maintained way to
  compile such a loop that installs from PyPI as a wheel on a fresh machine (no compiler needed
  at run time, unlike ``torch.utils.cpp_extension``).
* ``torch`` (the fallback, and the CUDA path, where ``index_add_`` is native): per sample, the
  out-edges of ``R_b`` are enumerated on the device with a known size (no sync) and the gathered
  messages are added with ``index_add_``.

Both give the same result as the plain reference (float32 rounding), outputs and gradients; the
test suite runs both. With more than three layers, layers between the second and the last need
the full per-sample product (by then nearly every gene has changed): only the second layer is
delta-propagated.
"""
from __future__ import annotations

import os

import numpy as np
import torch

PUSH_KERNELS = ("numba", "torch")

_NUMBA = None  # (forward, backward) once compiled; False when numba is unavailable


def _numba_kernels():
    """Compile (once per process; cached on disk by numba) the push kernels, or False."""
    global _NUMBA
    if _NUMBA is not None:
        return _NUMBA
    if os.environ.get("WORKBOOK_NO_NUMBA"):
        _NUMBA = False
        return _NUMBA
    try:
        import numba
        from numba import njit, prange
    except ImportError:
        _NUMBA = False
        return _NUMBA

    @njit(parallel=True, cache=True, nogil=True)
    def fwd(out, u, pair_ptr, pair_gene, ptr, slot, t, w, has_w):  # pragma: no cover - jitted
        nb = pair_ptr.shape[0] - 1
        ho = u.shape[2]
        for b in prange(nb):
            for p in range(pair_ptr[b], pair_ptr[b + 1]):
                s = pair_gene[p]
                for e in range(ptr[s], ptr[s + 1]):
                    sl = slot[e]
                    n = sl // t
                    ty = sl - n * t
                    if has_w:
                        c = w[b, sl]
                        for j in range(ho):
                            out[b, n, j] += c * u[p, ty, j]
                    else:
                        for j in range(ho):
                            out[b, n, j] += u[p, ty, j]

    @njit(parallel=True, cache=True, nogil=True)
    def bwd(gu, g, pair_sample, pair_gene, ptr, slot, t, w, has_w):  # pragma: no cover
        np_ = pair_gene.shape[0]
        ho = g.shape[2]
        for p in prange(np_):
            b = pair_sample[p]
            s = pair_gene[p]
            for e in range(ptr[s], ptr[s + 1]):
                sl = slot[e]
                n = sl // t
                ty = sl - n * t
                c = w[b, sl] if has_w else 1.0
                for j in range(ho):
                    gu[p, ty, j] += c * g[b, n, j]

    _NUMBA = (fwd, bwd, numba)
    return _NUMBA


def _np(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor, sharing memory (through DLPack: not a host copy, and not
    counted as one by :mod:`workbook_lib.measurement.syncs`)."""
    return np.from_dlpack(t.detach())


def numba_available() -> bool:
    """True when the compiled CPU push kernel can be used."""
    return bool(_numba_kernels())


def default_push_kernel(device: torch.device | str) -> str:
    """``numba`` on CPU when it is installed, ``torch`` otherwise (CUDA: native ``index_add_``)."""
    return "numba" if torch.device(device).type == "cpu" and numba_available() else "torch"


class PushPlan:
    """Where a batch's pushes go, built on the host (in the collate) from the correction rows.

    Args:
        pair_sample, pair_gene: the rows ``R_b`` (sorted by sample), as in ``Corrections``.
        ptr, slot: the graph's out-edge lists (``OutEdges``).
        batch_size: B.

    Holds per-sample row ranges and out-edge counts as Python ints so that no kernel needs a
    device-to-host read.
    """

    def __init__(self, pair_sample: torch.Tensor, pair_gene: torch.Tensor, ptr: torch.Tensor,
                 slot: torch.Tensor, batch_size: int):
        ps, pg = pair_sample.cpu(), pair_gene.cpu()
        counts = torch.bincount(ps, minlength=batch_size)
        self.pair_ptr = torch.zeros(batch_size + 1, dtype=torch.long)
        self.pair_ptr[1:] = torch.cumsum(counts, 0)
        deg = (ptr[pg + 1] - ptr[pg]) if pg.numel() else torch.zeros(0, dtype=torch.long)
        per_sample = torch.zeros(batch_size, dtype=torch.long).index_add_(0, ps, deg)
        self.ranges = self.pair_ptr.tolist()
        self.entries = per_sample.tolist()  # out-edges leaving R_b, per sample
        self.pair_out = deg  # [P] out-degree of each row's gene

    @property
    def total_entries(self) -> int:
        return int(sum(self.entries))


def _enumerate(plan: PushPlan, b: int, pair_gene: torch.Tensor, pair_out: torch.Tensor,
               ptr: torch.Tensor, slot: torch.Tensor, t: int):
    """Sample ``b``'s out-edges of ``R_b``: ``(row within the batch's pairs, slot)`` on the
    device of ``pair_gene``, built with sizes known on the host."""
    lo, hi, m = plan.ranges[b], plan.ranges[b + 1], plan.entries[b]
    dev = pair_gene.device
    genes, cnt = pair_gene[lo:hi], pair_out[lo:hi]
    rows = torch.repeat_interleave(torch.arange(lo, hi, device=dev), cnt, output_size=m)
    start = torch.repeat_interleave(ptr[genes], cnt, output_size=m)
    offs = torch.repeat_interleave(torch.cumsum(cnt, 0) - cnt, cnt, output_size=m)
    within = torch.arange(m, device=dev) - offs
    return rows, slot[start + within]


class _Push(torch.autograd.Function):
    """``out[b] = base + sum over rows p of sample b, out-edges (n, t) of gene(p):
    w_b[n*T + t] u[p, t]`` (``[B, N, Ho]``); gradients for ``base`` and ``u``."""

    @staticmethod
    def forward(ctx, base, u, inv_deg, graph_ctx):
        kernel, plan, pair_sample, pair_gene, pair_out, ptr, slot, n, t = graph_ctx
        bsz = len(plan.ranges) - 1
        out = base.unsqueeze(0).expand(bsz, n, base.shape[-1]).contiguous()
        u = u.contiguous()
        has_w = inv_deg is not None
        if kernel == "numba":
            fwd = _numba_kernels()[0]
            w = _np(inv_deg.contiguous() if has_w else torch.empty(1, 1))
            fwd(_np(out), _np(u), _np(plan.pair_ptr), _np(pair_gene), _np(ptr), _np(slot), t,
                w, has_w)
        else:
            flat = out.view(bsz * n, -1)
            uf = u.view(-1, u.shape[-1])
            for b in range(bsz):
                if plan.entries[b] == 0:
                    continue
                rows, sl = _enumerate(plan, b, pair_gene, pair_out, ptr, slot, t)
                msg = uf[rows * t + sl % t]
                if has_w:
                    msg = msg * inv_deg[b][sl].unsqueeze(-1)
                flat.index_add_(0, b * n + sl // t, msg)
        ctx.graph_ctx = graph_ctx
        ctx.u_shape = u.shape
        ctx.save_for_backward(inv_deg if has_w else torch.empty(0))
        ctx.has_w = has_w
        return out

    @staticmethod
    def backward(ctx, grad):
        kernel, plan, pair_sample, pair_gene, pair_out, ptr, slot, n, t = ctx.graph_ctx
        (inv_deg,) = ctx.saved_tensors
        grad = grad.contiguous()
        gbase = grad.sum(0) if ctx.needs_input_grad[0] else None
        gu = None
        if ctx.needs_input_grad[1]:
            gu = grad.new_zeros(ctx.u_shape)
            bsz = grad.shape[0]
            if kernel == "numba":
                bwd = _numba_kernels()[1]
                w = _np(inv_deg.contiguous() if ctx.has_w else torch.empty(1, 1))
                bwd(_np(gu), _np(grad), _np(pair_sample), _np(pair_gene), _np(ptr), _np(slot),
                    t, w, ctx.has_w)
            else:
                gflat = grad.view(bsz * n, -1)
                guf = gu.view(-1, gu.shape[-1])
                for b in range(bsz):
                    if plan.entries[b] == 0:
                        continue
                    rows, sl = _enumerate(plan, b, pair_gene, pair_out, ptr, slot, t)
                    msg = gflat[b * n + sl // t]
                    if ctx.has_w:
                        msg = msg * inv_deg[b][sl].unsqueeze(-1)
                    guf.index_add_(0, rows * t + sl % t, msg)
        return gbase, gu, None, None


def push(base: torch.Tensor, u: torch.Tensor, plan: PushPlan, pair_sample: torch.Tensor,
         pair_gene: torch.Tensor, pair_out: torch.Tensor, ptr: torch.Tensor, slot: torch.Tensor,
         num_nodes: int, num_types: int, inv_deg: torch.Tensor | None = None,
         kernel: str = "torch") -> torch.Tensor:
    """``[B, N, Ho]``: ``base`` ``[N, Ho]`` for every sample plus each row ``p``'s messages
    ``u[p, t]`` (``u`` ``[P, T, Ho]``) pushed along its gene's out-edges of type ``t``, scaled
    by ``inv_deg[b, n*T + t]`` when given (mean aggregation). Differentiable in ``base`` and
    ``u``.

    Args:
        kernel: ``numba`` (CPU tensors only) or ``torch``.
    """
    if kernel not in PUSH_KERNELS:
        raise ValueError(f"'push_kernel' must be one of {list(PUSH_KERNELS)} (got {kernel!r})")
    if kernel == "numba":
        if not numba_available():
            raise ValueError("push_kernel='numba' needs the numba package (pip install numba); "
                             "use push_kernel='torch'")
        if base.device.type != "cpu":
            raise ValueError("push_kernel='numba' runs on CPU tensors only; use 'torch'")
        ints = [t.to(torch.int64).contiguous() for t in (pair_sample, pair_gene, ptr, slot)]
        pair_sample, pair_gene, ptr, slot = ints
    gctx = (kernel, plan, pair_sample, pair_gene, pair_out, ptr, slot, num_nodes, num_types)
    return _Push.apply(base, u, inv_deg, gctx)
