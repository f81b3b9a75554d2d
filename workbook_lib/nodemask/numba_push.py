"""The delta push's compiled CPU kernels (numba), imported only when numba is.

They live at module level, not inside a function: numba's on-disk cache keys a function by its
code and its closure, and a closure holding another jitted function pickles differently in every
process, so the backward kernels (which call :func:`pairs_backward`) missed the cache and were
recompiled in every process that ran them (about 15 s on the 2-core reference machine: each
notebook kernel, each DDP rank). Called through module globals, every kernel is compiled once
and then loaded from ``__pycache__``. The threading layer is chosen by the caller
(:func:`workbook_lib.nodemask.delta._numba_kernels`) before the first parallel launch.

Each push walks a message's out-edges and reads (backward) or adds to (forward) the receiver's
row of the sample's ``[N, H]`` slab (1.7 MB at the real size: larger than a core's 512 KB L2, so
most rows come from L3, at scattered addresses the hardware prefetcher cannot guess). The
receivers are known ahead in the edge list, so each loop asks for the row
:data:`PREFETCH_AHEAD` edges ahead (:func:`prefetch_row`, LLVM's ``llvm.prefetch``, which
numba does not expose: a small intrinsic). It changes no result (the same operations in the same
order); on the 2-core machine at the real graph size, B = 28, two threads, the pooled push ran
0.93x forward and 0.90-0.95x backward of the time without it (paired medians of 5-7 interleaved
rounds, IQR 0.01-0.14, the machine loaded by other jobs).
"""
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

# Receivers' rows are requested this many out-edges ahead of their use (2, 4 and 8 ran alike).
PREFETCH_AHEAD = 4


def _prefetch_codegen(write: int):
    def codegen(context, builder, signature, args):
        arr, row = args
        ary = context.make_array(signature.args[0])(context, builder, arr)
        stride = builder.extract_value(ary.strides, 0)
        nbytes = builder.mul(builder.extract_value(ary.shape, 1),
                             ir.Constant(stride.type, signature.args[0].dtype.bitwidth // 8))
        row = builder.sext(row, stride.type) if row.type != stride.type else row
        i8p = ir.IntType(8).as_pointer()
        start = builder.gep(builder.bitcast(ary.data, i8p), [builder.mul(row, stride)])
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0i8")
        with cgutils.for_range_slice(builder, ir.Constant(stride.type, 0), nbytes,
                                     ir.Constant(stride.type, 64)) as (off, _):
            builder.call(fn, [builder.gep(start, [off]), ir.Constant(i32, write),
                              ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return codegen


@intrinsic
def prefetch_row(typingctx, arr, row):
    """Ask the cache for row ``row`` of the C-contiguous 2-D ``arr``, one request per 64-byte
    line, to be read (``llvm.prefetch``: a hint, no fault, no effect on results)."""
    return types.void(arr, row), _prefetch_codegen(0)


@intrinsic
def prefetch_row_w(typingctx, arr, row):
    """As :func:`prefetch_row`, the row to be written."""
    return types.void(arr, row), _prefetch_codegen(1)


@njit(parallel=True, cache=True, nogil=True, fastmath=True, boundscheck=False)
def fwd(out, base, u, rows, pair_ptr, pair_gene, tptr, tnode, msg_index, t, w, per_slot,
        relu):  # pragma: no cover - jitted
    nb, n_nodes, ho = out.shape
    r = pair_gene.shape[0]
    ne = tnode.shape[0]
    for b in prange(nb):  # one sample's slab per thread: it stays in cache, no atomics
        slab = out[b]
        ur = np.empty_like(u[0])  # the message, in a buffer no output can alias
        for n in range(n_nodes):
            for j in range(ho):
                out[b, n, j] = base[n, j]
        for p in range(pair_ptr[b], pair_ptr[b + 1]):
            s = pair_gene[p]
            for ty in range(t):  # each message once, pushed along its type's out-edges
                q = msg_index[ty * r + p]
                if q < 0:
                    continue
                for j in range(ho):
                    ur[j] = u[q, j]
                for e in range(tptr[s * t + ty], tptr[s * t + ty + 1]):
                    if e + PREFETCH_AHEAD < ne:  # past the group: the next type's receivers
                        prefetch_row_w(slab, tnode[e + PREFETCH_AHEAD])
                    n = tnode[e]
                    c = w[b, n * t + ty] if per_slot else w[b, n]
                    if c != 0.0:
                        for j in range(ho):
                            slab[n, j] += c * ur[j]
        for p in range(pair_ptr[b], pair_ptr[b + 1]):
            s = pair_gene[p]
            for j in range(ho):
                out[b, s, j] += rows[p, j]
        if relu:
            for n in range(n_nodes):
                for j in range(ho):
                    if out[b, n, j] < 0.0:
                        out[b, n, j] = 0.0

@njit(inline="always", cache=True, nogil=True, fastmath=True, boundscheck=False)
def pairs_backward(b, sc, acc, gu, grows, pair_ptr, pair_gene, tptr, tnode, msg_index, t,
                    r, w, per_slot):  # pragma: no cover - jitted
    """Sample ``b``'s deleted rows and messages, from its rows' gradient ``sc``: each
    deleted gene's row gradient, and each message's gradient summed along its type's
    out-edges in ``acc`` (shared by ``bwd`` and ``bwd_pool``)."""
    ho = sc.shape[1]
    ne = tnode.shape[0]
    for p in range(pair_ptr[b], pair_ptr[b + 1]):
        s = pair_gene[p]
        for j in range(ho):
            grows[p, j] = sc[s, j]
        for ty in range(t):
            q = msg_index[ty * r + p]
            if q < 0:
                continue
            for j in range(ho):
                acc[j] = 0.0
            for e in range(tptr[s * t + ty], tptr[s * t + ty + 1]):
                if e + PREFETCH_AHEAD < ne:
                    prefetch_row(sc, tnode[e + PREFETCH_AHEAD])
                n = tnode[e]
                c = w[b, n * t + ty] if per_slot else w[b, n]
                if c != 0.0:
                    for j in range(ho):
                        acc[j] += c * sc[n, j]
            for j in range(ho):
                gu[q, j] = acc[j]

@njit(parallel=True, cache=True, nogil=True, fastmath=True, boundscheck=False)
def bwd(gu, grows, gbase, scratch, g, out, pair_ptr, pair_gene, tptr, tnode, msg_index, t,
        w, per_slot, relu):  # pragma: no cover - jitted
    nb, n_nodes, ho = g.shape
    chunks = gbase.shape[0]
    r = pair_gene.shape[0]
    for ch in prange(chunks):  # samples ch, ch + chunks, ...: each chunk its own buffers
        sc = scratch[ch]
        acc = np.empty_like(gu[0])  # a message's gradient, summed apart from every input
        for b in range(ch, nb, chunks):
            for n in range(n_nodes):  # the gradient before the ReLU, once per sample
                for j in range(ho):
                    v = g[b, n, j]
                    if relu and out[b, n, j] <= 0.0:
                        v = 0.0
                    sc[n, j] = v
                    gbase[ch, n, j] += v
            pairs_backward(b, sc, acc, gu, grows, pair_ptr, pair_gene, tptr, tnode,
                            msg_index, t, r, w, per_slot)

@njit(parallel=True, cache=True, nogil=True, fastmath=True, boundscheck=False)
def fwd_pool(pooled, mask, scratch, base, u, rows, pair_ptr, pair_gene, tptr, tnode,
             msg_index, t, w, per_slot, wp):  # pragma: no cover - jitted
    nb, kk, ho = pooled.shape
    n_nodes = base.shape[0]
    chunks = scratch.shape[0]
    r = pair_gene.shape[0]
    ne = tnode.shape[0]
    for ch in prange(chunks):  # samples ch, ch + chunks, ...: a slab of its own per chunk
        sl = scratch[ch]
        ur = np.empty_like(u[0])
        for b in range(ch, nb, chunks):
            for n in range(n_nodes):
                for j in range(ho):
                    sl[n, j] = base[n, j]
            for p in range(pair_ptr[b], pair_ptr[b + 1]):
                s = pair_gene[p]
                for ty in range(t):
                    q = msg_index[ty * r + p]
                    if q < 0:
                        continue
                    for j in range(ho):
                        ur[j] = u[q, j]
                    for e in range(tptr[s * t + ty], tptr[s * t + ty + 1]):
                        if e + PREFETCH_AHEAD < ne:
                            prefetch_row_w(sl, tnode[e + PREFETCH_AHEAD])
                        n = tnode[e]
                        c = w[b, n * t + ty] if per_slot else w[b, n]
                        if c != 0.0:
                            for j in range(ho):
                                sl[n, j] += c * ur[j]
            for p in range(pair_ptr[b], pair_ptr[b + 1]):
                s = pair_gene[p]
                for j in range(ho):
                    sl[s, j] += rows[p, j]
            for k in range(kk):
                for j in range(ho):
                    pooled[b, k, j] = 0.0
            for n in range(n_nodes):  # ReLU, then this row's share of every weighted sum
                for j in range(ho):
                    if sl[n, j] > 0.0:
                        mask[b, n, j] = 1
                    else:
                        sl[n, j] = 0.0
                        mask[b, n, j] = 0
                for k in range(kk):
                    c = wp[b, k, n]
                    if c != 0.0:
                        for j in range(ho):
                            pooled[b, k, j] += c * sl[n, j]

@njit(parallel=True, cache=True, nogil=True, fastmath=True, boundscheck=False)
def bwd_pool(gu, grows, gbase, scratch, gpooled, mask, wp, pair_ptr, pair_gene, tptr, tnode,
             msg_index, t, w, per_slot):  # pragma: no cover - jitted
    nb, kk, ho = gpooled.shape
    n_nodes = mask.shape[1]
    chunks = gbase.shape[0]
    r = pair_gene.shape[0]
    for ch in prange(chunks):
        sc = scratch[ch]
        acc = np.empty_like(gu[0])
        for b in range(ch, nb, chunks):
            for n in range(n_nodes):  # the rows' gradient, through the ReLU
                for j in range(ho):
                    sc[n, j] = 0.0
                for k in range(kk):
                    c = wp[b, k, n]
                    if c != 0.0:
                        for j in range(ho):
                            sc[n, j] += c * gpooled[b, k, j]
                for j in range(ho):
                    if mask[b, n, j] == 0:
                        sc[n, j] = 0.0
                    gbase[ch, n, j] += sc[n, j]
            pairs_backward(b, sc, acc, gu, grows, pair_ptr, pair_gene, tptr, tnode,
                            msg_index, t, r, w, per_slot)
