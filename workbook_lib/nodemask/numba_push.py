"""The delta push's compiled CPU kernels (numba), imported only when numba is, and the compiled
builder of a batch's corrections on the host (:func:`corrections_host`).

The kernels live at module level and call each other through module globals, so that numba's
on-disk cache holds them (a closure over a jitted function misses it in every process). The
threading layer is chosen by :func:`workbook_lib.nodemask.compiled.kernels` before the first
parallel launch. Each per-edge loop prefetches the receiver's row :data:`PREFETCH_AHEAD` edges
ahead (:func:`prefetch_row`: ``llvm.prefetch``, which numba does not expose), and at
H = :data:`WIDE` runs with a fixed trip count; neither changes a result (the same operations in
the same order).
"""
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

# Receivers' rows are requested this many out-edges ahead of their use (2, 4 and 8 ran alike).
PREFETCH_AHEAD = 4

# The hidden width the per-edge loops are also compiled for with a fixed trip count (the real
# spec's H = 64): LLVM then unrolls them with no runtime trip-count and overlap checks per edge
# (0.90x of the push's time at the real size, one thread; other widths take the general loop).
WIDE = 64


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


@njit(inline="always", cache=True, nogil=True, fastmath=True, boundscheck=False)
def pairs_forward(b, slab, ur, base, u, rows, pair_ptr, pair_gene, tptr, tnode, msg_index, t,
                  r, w, per_slot):  # pragma: no cover - jitted
    """Sample ``b``'s ``[N, H]`` slab before its activation: ``base``, each message pushed along its
    type's out-edges (``ur`` a buffer no output aliases), and its deleted rows' corrections."""
    n_nodes, ho = slab.shape
    ne = tnode.shape[0]
    for n in range(n_nodes):
        for j in range(ho):
            slab[n, j] = base[n, j]
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
                    if ho == WIDE:  # a fixed trip count: unrolled, no runtime checks
                        for j in range(WIDE):
                            slab[n, j] += c * ur[j]
                    else:
                        for j in range(ho):
                            slab[n, j] += c * ur[j]
    for p in range(pair_ptr[b], pair_ptr[b + 1]):
        s = pair_gene[p]
        for j in range(ho):
            slab[s, j] += rows[p, j]


@njit(parallel=True, cache=True, nogil=True, fastmath=True, boundscheck=False)
def fwd(out, base, u, rows, pair_ptr, pair_gene, tptr, tnode, msg_index, t, w, per_slot,
        relu):  # pragma: no cover - jitted
    nb, n_nodes, ho = out.shape
    r = pair_gene.shape[0]
    for b in prange(nb):  # one sample's slab per thread: it stays in cache, no atomics
        ur = np.empty_like(u[0])
        pairs_forward(b, out[b], ur, base, u, rows, pair_ptr, pair_gene, tptr, tnode,
                      msg_index, t, r, w, per_slot)
        if relu:
            for n in range(n_nodes):
                for j in range(ho):
                    if out[b, n, j] < 0.0:
                        out[b, n, j] = 0.0

@njit(inline="always", cache=True, nogil=True, fastmath=True, boundscheck=False)
def pairs_backward(b, sc, acc, gu, grows, pair_ptr, pair_gene, tptr, tnode, msg_index, t,
                    r, w, per_slot):  # pragma: no cover - jitted
    """Sample ``b``'s deleted rows' gradients and each message's gradient, summed along its type's
    out-edges into ``acc``, from its rows' gradient ``sc``."""
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
                    if ho == WIDE:
                        for j in range(WIDE):
                            acc[j] += c * sc[n, j]
                    else:
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
    for ch in prange(chunks):  # samples ch, ch + chunks, ...: a slab of its own per chunk
        sl = scratch[ch]
        ur = np.empty_like(u[0])
        for b in range(ch, nb, chunks):
            pairs_forward(b, sl, ur, base, u, rows, pair_ptr, pair_gene, tptr, tnode,
                          msg_index, t, r, w, per_slot)
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


@njit(cache=True, nogil=True, boundscheck=False)
def selection(index, rows):  # pragma: no cover - jitted
    """``(crow, col)`` int32 of the CSR ``[rows, len(index)]`` with a one at ``(index[i], i)``, each
    row's positions ascending (a counting sort; ``kernels.selection_csr`` uses an argsort)."""
    m = index.shape[0]
    crow = np.zeros(rows + 1, dtype=np.int32)
    for i in range(m):
        crow[index[i] + 1] += 1
    for r in range(rows):
        crow[r + 1] += crow[r]
    fill = crow[:-1].copy()
    col = np.empty(m, dtype=np.int32)
    for i in range(m):
        g = index[i]
        col[fill[g]] = i
        fill[g] += 1
    return crow, col


@njit(cache=True, nogil=True, boundscheck=False)
def corrections_host(deleted, ptr, slot, n, t, sends, in_ptr, in_slot):  # pragma: no cover
    """Every index of ``corrections.corrections`` for ``deleted`` ``[B, k]`` (``-1`` pads) in one
    single-threaded compiled pass: the same arrays, in the same order, as the PyTorch version."""
    bsz, kk = deleted.shape
    nv = 0
    for b in range(bsz):
        for j in range(kk):
            if deleted[b, j] >= 0:
                nv += 1
    samples = np.empty(nv, np.int64)
    genes = np.empty(nv, np.int64)
    total = 0
    itotal = 0
    i = 0
    for b in range(bsz):
        for j in range(kk):
            g = deleted[b, j]
            if g >= 0:
                samples[i] = b
                genes[i] = g
                total += ptr[g + 1] - ptr[g]
                itotal += in_ptr[g + 1] - in_ptr[g]
                i += 1
    # the rows: (sample, gene) keys of every out-edge's receiver and of every deleted gene
    rowid = np.full(bsz * n, -1, np.int64)
    e_gene = np.empty(total, np.int64)
    e_slot = np.empty(total, np.int64)
    e_key = np.empty(total, np.int64)
    e = 0
    for i in range(nv):
        b, g = samples[i], genes[i]
        rowid[b * n + g] = 0
        for x in range(ptr[g], ptr[g + 1]):
            s = slot[x]
            e_gene[e] = g
            e_slot[e] = s
            e_key[e] = b * n + s // t
            rowid[e_key[e]] = 0
            e += 1
    r = 0
    for key in range(bsz * n):
        if rowid[key] == 0:
            rowid[key] = r
            r += 1
    pair_sample = np.empty(r, np.int64)
    pair_gene = np.empty(r, np.int64)
    pair_ptr = np.zeros(bsz + 1, np.int64)
    for key in range(bsz * n):
        p = rowid[key]
        if p >= 0:
            pair_sample[p] = key // n
            pair_gene[p] = key % n
            pair_ptr[key // n + 1] += 1
    for b in range(bsz):
        pair_ptr[b + 1] += pair_ptr[b]
    is_del = np.zeros(r, np.bool_)
    for i in range(nv):
        is_del[rowid[samples[i] * n + genes[i]]] = True
    pair_out = np.empty(r, np.int64)
    entries = np.zeros(bsz, np.int64)
    for p in range(r):
        pair_out[p] = ptr[pair_gene[p] + 1] - ptr[pair_gene[p]]
        entries[pair_sample[p]] += pair_out[p]
    # the batch's distinct deleted genes, ascending, and each entry's index among them
    src_of = np.full(n, -1, np.int64)
    for i in range(nv):
        src_of[genes[i]] = 0
    ng = 0
    for g in range(n):
        if src_of[g] == 0:
            src_of[g] = ng
            ng += 1
    source_gene = np.empty(ng, np.int64)
    for g in range(n):
        if src_of[g] >= 0:
            source_gene[src_of[g]] = g
    entry_pair = np.empty(total, np.int64)
    entry_slot = np.empty(total, np.int64)
    entry_msg = np.empty(total, np.int64)
    source_index = np.empty(total, np.int64)
    changed = np.zeros(r * t, np.bool_)
    for e in range(total):
        p = rowid[e_key[e]]
        ty = e_slot[e] % t
        entry_pair[e] = p
        entry_slot[e] = p * t + ty
        source_index[e] = src_of[e_gene[e]]
        entry_msg[e] = source_index[e] * t + ty
        changed[p * t + ty] = True
    nq = 0
    for q in range(r * t):
        if changed[q]:
            nq += 1
    changed_slot = np.empty(nq, np.int64)
    nq = 0
    for q in range(r * t):
        if changed[q]:
            changed_slot[nq] = q
            nq += 1
    # the delta layer's messages: (type, row) where the row's gene sends on the type, type-major
    msg_index = np.full(t * r, -1, np.int64)
    type_counts = np.zeros(t, np.int64)
    m = 0
    for ty in range(t):
        for p in range(r):
            if sends[ty, pair_gene[p]] != 0:
                msg_index[ty * r + p] = m
                m += 1
                type_counts[ty] += 1
    msg_pair = np.empty(m, np.int64)
    msg_crow = np.zeros(r + 1, np.int32)
    msg_col = np.empty(m, np.int32)
    c = 0
    for p in range(r):  # each row's messages, type order: msg_back
        for ty in range(t):
            q = msg_index[ty * r + p]
            if q >= 0:
                msg_pair[q] = p
                msg_col[c] = q
                c += 1
        msg_crow[p + 1] = c
    # the pooled layer's weights: sample b loses the in-edges (j -> s, type t) of each deleted s
    pool_drop = np.empty(itotal, np.int64)
    x = 0
    for i in range(nv):
        g = genes[i]
        for y in range(in_ptr[g], in_ptr[g + 1]):
            pool_drop[x] = samples[i] * (t * n) + in_slot[y]
            x += 1
    nd = 0
    for p in range(r):
        if is_del[p]:
            nd += 1
    deleted_pair = np.empty(nd, np.int64)
    nd = 0
    for p in range(r):
        if is_del[p]:
            deleted_pair[nd] = p
            nd += 1
    deleted_gene = pair_gene[deleted_pair]
    return (pair_sample, pair_gene, is_del, entry_slot, e_gene, pair_out, changed_slot,
            pair_ptr, entries, source_gene, source_index, deleted_pair, deleted_gene, msg_pair,
            msg_index, type_counts, pool_drop, entry_msg, entry_pair, msg_crow, msg_col)


@njit(cache=True, nogil=True, boundscheck=False)
def csr_pair(r, c, v, nrows, ncols):  # pragma: no cover - jitted
    """CSR ``[nrows, ncols]`` of the COO entries ``(r, c, v)`` and of its transpose, by two
    stable counting sorts (by row, then those by column): ``(crow, col, val, tcrow, tcol,
    tval)``, int64 pointers and indices, float64 values."""
    m = r.shape[0]
    crow = np.zeros(nrows + 1, dtype=np.int64)
    tcrow = np.zeros(ncols + 1, dtype=np.int64)
    for i in range(m):
        crow[r[i] + 1] += 1
        tcrow[c[i] + 1] += 1
    for i in range(nrows):
        crow[i + 1] += crow[i]
    for i in range(ncols):
        tcrow[i + 1] += tcrow[i]
    fill = crow[:-1].copy()
    col = np.empty(m, dtype=np.int64)
    val = np.empty(m, dtype=np.float64)
    for i in range(m):
        p = fill[r[i]]
        col[p] = c[i]
        val[p] = v[i]
        fill[r[i]] = p + 1
    tfill = tcrow[:-1].copy()
    tcol = np.empty(m, dtype=np.int64)
    tval = np.empty(m, dtype=np.float64)
    for row in range(nrows):
        for p in range(crow[row], crow[row + 1]):
            q = tfill[col[p]]
            tcol[q] = row
            tval[q] = val[p]
            tfill[col[p]] = q + 1
    return crow, col, val, tcrow, tcol, tval


@njit(cache=True, nogil=True, boundscheck=False)
def own_rows(genes, self_in, n, crow, col):  # pragma: no cover - jitted
    """A delta conv's own rows over ``cat([wildtype, D])`` as CSR pointers and columns, written
    into ``crow`` (one more than the rows) and ``col``: row ``i`` its gene's wildtype column,
    then ``n + self_in[i]`` where its input changed (``self_in[i] >= 0``); each entry is 1 (the
    caller's). The entries ``csr_pair`` sorts them into, made in row order: no sort."""
    p = 0
    crow[0] = 0
    for i in range(genes.shape[0]):
        col[p] = genes[i]
        p += 1
        if self_in[i] >= 0:
            col[p] = n + self_in[i]
            p += 1
        crow[i + 1] = p


@njit(cache=True, nogil=True, boundscheck=False)
def mark_receivers(flat, out_ptr, out_dst, n, out):  # pragma: no cover - jitted
    """Set ``out[b * n + t]`` for every out-neighbour ``t`` of each row ``flat = b * n + j``
    (``out``: flat bool ``[B * N]``), without making the list of receivers."""
    for i in range(flat.shape[0]):
        f = flat[i]
        base = f - f % n
        j = f % n
        for e in range(out_ptr[j], out_ptr[j + 1]):
            out[base + out_dst[e]] = True


@njit(cache=True, nogil=True, boundscheck=False)
def push_count(f_in, lo, hi, out_ptr, out_dst, keep, pos_out, n, crow, tcrow, tshared,
               transpose):  # pragma: no cover - jitted
    """:func:`push_block`'s first pass over the changed inputs ``f_in[lo:hi]``: each entry
    counted in ``crow[row + 1]``, and, with ``transpose``, in ``tcrow[col + 1]`` for a kept
    input's column or in ``tshared[gene]`` for a deleted one's (a gene's column is shared by
    every sample)."""
    for i in range(lo, hi):
        f = f_in[i]
        b, j = f // n, f % n
        kept = keep[f]
        for e in range(out_ptr[j], out_ptr[j + 1]):
            t = b * n + out_dst[e]
            if keep[t]:
                crow[pos_out[t] + 1] += 1
                if transpose:
                    if kept:
                        tcrow[n + i + 1] += 1
                    else:
                        tshared[j] += 1


@njit(cache=True, nogil=True, boundscheck=False)
def push_fill(f_in, lo, hi, out_ptr, out_dst, keep, cnt, mean, pos_out, n, fill, tfill,
              tshared_fill, col, val, tcol, tval, transpose):  # pragma: no cover - jitted
    """:func:`push_block`'s second pass over ``f_in[lo:hi]``: each entry written at its row's
    next place (``fill``) and, with ``transpose``, its column's (``tfill``, or ``tshared_fill``
    for a gene's)."""
    for i in range(lo, hi):
        f = f_in[i]
        b, j = f // n, f % n
        kept = keep[f]
        c = n + i if kept else j
        for e in range(out_ptr[j], out_ptr[j + 1]):
            t = b * n + out_dst[e]
            if keep[t]:
                v = 1.0 if kept else -1.0
                if mean:
                    v = v / max(cnt[t], 1.0)
                r = pos_out[t]
                p = fill[r]
                col[p] = c
                val[p] = v
                fill[r] = p + 1
                if transpose:
                    if kept:
                        q = tfill[c]
                        tfill[c] = q + 1
                    else:
                        q = tshared_fill[j]
                        tshared_fill[j] = q + 1
                    tcol[q] = r
                    tval[q] = v


def push_block(f_in, out_ptr, out_dst, keep, cnt, mean, pos_out, n, rows, ncol, itype, vtype,
               parts: int = 1, pool=None, transpose: bool = True):
    """The push entries of one delta conv as CSR ``[rows, ncol]`` and its transpose, in two
    passes over the changed inputs' out-edges (``f_in``: flat (sample, gene) of the changed
    inputs, ascending): an edge to a kept gene ``t`` is an entry at row ``pos_out[t]``, column
    ``n + i`` (+1) for a kept input ``i`` or its gene (-1) for a deleted one, divided by
    ``max(cnt[t], 1)`` for a mean: ``(crow, col, val, tcrow, tcol, tval)``, pointers and
    indices in ``itype``'s dtype, values in ``vtype``'s (empty arrays: the caller's choice, int32
    and float32 halve the bytes written; 0.38 s against 0.25 s per TorchCell-shaped plan).

    With ``parts`` > 1 and a ``pool`` (a ``concurrent.futures`` executor), the inputs are cut
    into that many runs of whole samples, each pass running the runs at once (the compiled
    passes release the GIL; numba's own threading layer is not used, so planning in a thread
    of its own beside a parallel kernel is safe). A row takes entries from one sample only, so
    each row's entries keep their order; a gene's column takes each run's entries after the
    runs before it: the result is the same arrays, entry for entry, as in one part.

    With ``transpose`` False the transpose is not made (``tcrow, tcol, tval`` None): a CPU's
    backward of the push does not read it (it scatters through the rows, ``_SpMMParts`` in
    :mod:`.convert`), and its column-ordered writes were about a third of the passes' time
    (the TorchCell-shaped plan at the real spec). The row arrays are the same, entry for entry.
    """
    return push_counts(f_in, out_ptr, out_dst, keep, cnt, mean, pos_out, n, rows, ncol, itype,
                       vtype, parts, pool, transpose).fill(pool=pool)


def _each(fn, args_of, runs: list, pool) -> None:
    """``fn`` over each run of whole samples: the first in this thread, the others in
    ``pool``'s (the compiled passes release the GIL), or all in this thread without a pool."""
    if pool is None:
        for k, (lo, hi) in enumerate(runs):
            fn(*args_of(k, lo, hi))
        return
    jobs = [pool.submit(fn, *args_of(k, lo, hi)) for k, (lo, hi) in enumerate(runs[1:], 1)] \
        if len(runs) > 1 else []
    fn(*args_of(0, *runs[0]))
    for j in jobs:
        j.result()


class PushCounts:
    """:func:`push_block`'s first pass done (:func:`push_counts`): ``crow``, the rows' pointers,
    and ``m``, the entries, known; :meth:`fill` runs the second pass, into arrays of the
    caller's (a delta group's CSR, the blocks of its convs one after another: no copy into it)
    or new ones, once. ``runs`` is how many runs of samples the passes take: :meth:`fill` runs
    them in the pool it is given (the runs after the first; without one, one after another in
    its own thread), the same arrays either way."""

    def __init__(self, args: tuple, runs: list, crow, tcrow, tshared):
        self._args, self._runs = args, runs
        self.runs = len(runs)
        self.crow, self._tcrow, self._tshared = crow, tcrow, tshared
        self.m = int(crow[-1])
        self.vtype = args[9].dtype  # the values' dtype
        self._filled = False

    def fill(self, col=None, val=None, pool=None) -> tuple:
        """The second pass: ``(crow, col, val, tcrow, tcol, tval)`` as :func:`push_block`
        returns them, ``col`` and ``val`` written into the arrays given (``m`` entries each,
        slices of larger arrays may be given; an integer and a float dtype that hold them: a
        sum's values are +-1, a mean's are made in float64), else new (``itype``'s and
        ``vtype``'s dtypes)."""
        if self._filled:  # its pointers are the returned arrays, and the transpose's are
            raise ValueError("push fill: this push was filled already")  # summed in place
        self._filled = True
        (f_in, out_ptr, out_dst, keep, cnt, mean, pos_out, n, itype, vtype,
         transpose) = self._args
        crow, tcrow, tshared, m = self.crow, self._tcrow, self._tshared, self.m
        col = np.empty(m, dtype=itype.dtype) if col is None else col
        val = np.empty(m, dtype=vtype.dtype) if val is None else val
        if col.shape[0] != m or val.shape[0] != m:
            raise ValueError(f"push fill: {m} entries are written, into arrays of "
                             f"{col.shape[0]} and {val.shape[0]}")
        fill = crow[:-1].copy()
        if transpose:
            tcrow[1:n + 1] = tshared.sum(0)
            np.cumsum(tcrow, out=tcrow)
            starts = tcrow[:n] + np.cumsum(tshared, 0) - tshared  # each run's first place
        else:  # nothing of the transpose's is written: empty stand-ins of the kernel's types
            starts = tshared
        tcol = np.empty(m if transpose else 0, dtype=itype.dtype)
        tval = np.empty(m if transpose else 0, dtype=vtype.dtype)
        tfill = tcrow[:-1].copy()
        _each(push_fill, lambda k, lo, hi: (
            f_in, lo, hi, out_ptr, out_dst, keep, cnt, mean, pos_out, n, fill, tfill,
            starts[k].copy(), col, val, tcol, tval, transpose), self._runs, pool)
        if not transpose:
            return crow, col, val, None, None, None
        return crow, col, val, tcrow, tcol, tval


def push_counts(f_in, out_ptr, out_dst, keep, cnt, mean, pos_out, n, rows, ncol, itype, vtype,
                parts: int = 1, pool=None, transpose: bool = True) -> PushCounts:
    """:func:`push_block`'s first pass (its arguments): the counts, the second pass left to
    :meth:`PushCounts.fill`."""
    m_in = f_in.shape[0]
    cuts = [0]
    if parts > 1 and pool is not None and m_in > 1:
        samples = f_in // n
        genes = f_in % n
        work = np.cumsum(out_ptr[genes + 1] - out_ptr[genes])  # out-edges read, to each input
        for k in range(1, parts):  # runs of about equal work, cut at a sample's first input
            at = min(m_in - 1, int(np.searchsorted(work, k * work[-1] / parts)))
            c = int(np.searchsorted(samples, samples[at]))
            if cuts[-1] < c < m_in:
                cuts.append(c)
    cuts.append(m_in)
    runs = list(zip(cuts[:-1], cuts[1:]))
    crow = np.zeros(rows + 1, dtype=itype.dtype)
    tcrow = np.zeros(ncol + 1 if transpose else 1, dtype=itype.dtype)
    tshared = np.zeros((len(runs), n if transpose else 0), dtype=itype.dtype)
    _each(push_count, lambda k, lo, hi: (f_in, lo, hi, out_ptr, out_dst, keep, pos_out, n, crow,
                                         tcrow, tshared[k], transpose), runs, pool)
    np.cumsum(crow, out=crow)
    return PushCounts((f_in, out_ptr, out_dst, keep, cnt, mean, pos_out, n, itype, vtype,
                       transpose), runs, crow, tcrow, tshared)
