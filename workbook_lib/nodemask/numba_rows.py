"""Compiled row scatters for :class:`~workbook_lib.nodemask.convert_dense.DeltaGinSum` and for
the backward of a delta group's product (``_SpMMParts`` in :mod:`.convert`) (numba), imported
only when numba is (through :func:`workbook_lib.nodemask.compiled.kernels`).

Why not ``index_add_``: on a CPU, PyTorch 2.13 runs ``index_add_`` over rows of a 2-D tensor as
``scatter_add_`` with the index expanded to every element (an index read per element), and with
``alpha != 1`` or an int32 index one add per row. A sum of GIN-MLPs a sample at a time makes
about three million such row scatters per step of the TorchCell-shaped encoder at the real spec
(each type's changed rows into the sum, and into its wildtypes' gradients). Per row of 64
float32, one thread, 5,000 rows into 6,607: the sum's ``out[pos] += o - wt[genes]`` took 31 ns
as ``index_select``, ``sub`` and ``index_add_``, 12 ns here; a gradient's ``acc[genes] += g *
fac`` (``mul`` and ``index_add_``) 23 against 8 ns into one accumulator in cache, 54 against
26-32 ns with 18 accumulators of 1.7 MB in turn, as a worker holds them. The step: 0.963x its
time (IQR 0.032, 10 interleaved rounds).

Each is the same operations per element, in the same order, as the PyTorch ops it replaces
(rows are added in index order; an index repeated within a call adds in that order too), so
results are equal bit for bit (``tests/test_numba_rows.py``), with one exception: ``addcmul_``,
whose ``z + x * e`` PyTorch 2.13's CPU kernel rounds once (a fused multiply-add), where
:func:`gin_sum_rows` rounds the product and the sum each (to that rounding).

The row passes of :class:`~workbook_lib.nodemask.convert_dense.DeltaGinSum` each do in one pass
over a block's rows what took several: :func:`gin_sum_rows` the GIN sum's four PyTorch passes
(``index_select``, ``mul``, ``add``, ``addcmul``); :func:`take_add_at` the gradient rows'
``index_select`` and their compiled scatter into the wildtype's gradient; and
:func:`gin_sum_rows_backward` the gradient at ``x`` (``mul`` by ``1 + eps``) and the compiled
scaled scatter into the wildtype aggregation's gradient. On the TorchCell-shaped encoder at the
real spec, the layer's forward and backward on its captured inputs took 0.929x the time (IQR
0.126, 16 interleaved rounds), the whole step 0.968x (IQR 0.064, 14 interleaved rounds) on this
project's 2-core Intel machine. Arrays are numpy views of CPU
tensors of one float dtype (bfloat16 and float16 are not taken); rows are the last axis's runs.
Indices are not checked (``boundscheck=False``: an index out of range writes outside the array,
where ``index_add_`` raises): they come from the plan, which makes them in range.
"""
from numba import njit


@njit(cache=True, nogil=True, boundscheck=False)
def add_diff_at(out, pos, o, sub, genes):  # pragma: no cover - jitted
    """``out[pos[i]] += o[i] - sub[genes[i]]`` for each row ``i`` of ``o``, in order."""
    for i in range(pos.shape[0]):
        p, q = pos[i], genes[i]
        for k in range(out.shape[1]):
            out[p, k] += o[i, k] - sub[q, k]


@njit(cache=True, nogil=True, boundscheck=False)
def add_scaled_at(acc, idx, src, fac):  # pragma: no cover - jitted
    """``acc[idx[i]] += src[i] * fac[i, 0]`` for each row ``i`` of ``src``, in order."""
    for i in range(idx.shape[0]):
        r, f = idx[i], fac[i, 0]
        for k in range(acc.shape[1]):
            acc[r, k] += src[i, k] * f


@njit(cache=True, nogil=True, boundscheck=False)
def add_csr_t(out, crow, col, val, g, r0):  # pragma: no cover - jitted
    """``out[col[p]] += val[p] * g[i]`` for each row ``i`` of ``g`` and each entry ``p`` of row
    ``r0 + i`` of the CSR ``(crow, col, val)``, rows and entries in order: ``out += a[r0:r0 +
    len(g)].T @ g`` without the transpose.

    A delta group's product ``a @ cat([wildtype, D])`` reads, per output row, a few changed
    input rows of its own sample (a window of about 250 KB at the real spec); its backward
    through the transpose reads, per input row, its output rows' gradients (a sample's window of
    up to 1.7 MB), a cache miss each. This kernel streams the gradient's rows in order and adds
    into the input rows' window instead: at the real spec (the TorchCell-shaped second layer's
    group, 16 M entries at B = 28, F = 64) 196 ms on two threads against 333 ms through the
    transposes (PyTorch's CSR product, two compute threads; medians of 7). The step: 0.989x
    its time (IQR 0.084, 12 interleaved rounds; within this machine's noise). The sum per input
    row is the same, added in another order (to rounding)."""
    for i in range(g.shape[0]):
        r = r0 + i
        for p in range(crow[r], crow[r + 1]):
            c, v = col[p], val[p]
            for k in range(out.shape[1]):
                out[c, k] += v * g[i, k]


@njit(cache=True, nogil=True, boundscheck=False)
def gin_sum_rows(z, agg, wt, genes, fac, x, e):  # pragma: no cover - jitted
    """``z[i] = (agg[i] + wt[genes[i]] * fac[i, 0]) + x[i] * e`` for each row ``i`` of ``z``
    (``e``: an array of one value)."""
    c = e[0]
    for i in range(z.shape[0]):
        q, f = genes[i], fac[i, 0]
        for k in range(z.shape[1]):
            z[i, k] = (agg[i, k] + wt[q, k] * f) + x[i, k] * c


@njit(cache=True, nogil=True, boundscheck=False)
def take_add_at(dst, src, pos, acc, idx):  # pragma: no cover - jitted
    """``dst[i] = src[pos[i]]``, then ``acc[idx[i]] += dst[i]``, for each row ``i`` of ``dst``,
    in order."""
    for i in range(dst.shape[0]):
        p, r = pos[i], idx[i]
        for k in range(dst.shape[1]):
            v = src[p, k]
            dst[i, k] = v
            acc[r, k] += v


@njit(cache=True, nogil=True, boundscheck=False)
def gin_sum_rows_backward(gx, gz, e, acc, idx, fac):  # pragma: no cover - jitted
    """``gx[i] = gz[i] * e`` and ``acc[idx[i]] += gz[i] * fac[i, 0]`` for each row ``i`` of
    ``gz``, in order (``e``: an array of one value)."""
    c = e[0]
    for i in range(gz.shape[0]):
        r, f = idx[i], fac[i, 0]
        for k in range(gz.shape[1]):
            v = gz[i, k]
            gx[i, k] = v * c
            acc[r, k] += v * f
