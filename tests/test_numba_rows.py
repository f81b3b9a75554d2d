"""The compiled row scatters and row passes (workbook_lib.nodemask.numba_rows) equal the PyTorch
ops they replace in DeltaGinSum, bit for bit (the GIN sum's bit for bit against the unfused ops,
to rounding against addcmul's fused one), in float32 and float64, with repeated and unsorted rows; the
transposed product add_csr_t equals the transpose's product to rounding, and the delta group's
backward that runs it (_SpMMParts) equals the one through the transposes on one and two threads."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from workbook_lib.nodemask.compiled import kernels


def _case(dtype, repeat: bool):
    g = torch.Generator().manual_seed(3)
    n, m, h = 50, 40, 8
    idx = torch.randint(0, n, (m,), generator=g) if repeat else torch.randperm(n, generator=g)[:m]
    src = torch.randn(m, h, generator=g, dtype=dtype)
    acc = torch.randn(n, h, generator=g, dtype=dtype)
    return n, m, h, idx, src, acc, g


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("repeat", [False, True])
def test_add_diff_at_equals_select_sub_index_add(dtype, repeat):
    n, m, h, pos, o, out, g = _case(dtype, repeat)
    genes = torch.randint(0, n, (m,), generator=g)
    sub = torch.randn(n, h, generator=g, dtype=dtype)
    want = out.clone().index_add_(0, pos, o - sub.index_select(0, genes))
    kernels().add_diff_at(out.numpy(), pos.numpy(), o.numpy(), sub.numpy(), genes.numpy())
    assert torch.equal(out, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("repeat", [False, True])
def test_add_scaled_at_equals_mul_index_add(dtype, repeat):
    n, m, h, idx, src, acc, g = _case(dtype, repeat)
    fac = torch.rand(m, 1, generator=g, dtype=dtype) * 3
    want = acc.clone().index_add_(0, idx, src * fac)
    kernels().add_scaled_at(acc.numpy(), idx.numpy(), src.numpy(), fac.numpy())
    assert torch.equal(acc, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("repeat", [False, True])
def test_gin_sum_rows_equals_select_mul_add_addcmul(dtype, repeat):
    """DeltaGinSum's GIN sum of a block of rows: ``agg + wt[genes] * fac + x * e`` op by op,
    bit for bit; ``addcmul_`` (which _gin_rows calls) may fuse its multiply-add into one rounding
    (PyTorch 2.13's CPU kernel does): to that rounding."""
    n, m, h, genes, agg, wt, g = _case(dtype, repeat)
    agg = torch.randn(m, h, generator=g, dtype=dtype)
    x = torch.randn(m, h, generator=g, dtype=dtype)
    fac = torch.rand(m, 1, generator=g, dtype=dtype) * 3
    e = 1 + torch.rand(1, generator=g, dtype=dtype)
    z = torch.add(agg, torch.index_select(wt, 0, genes).mul_(fac))
    got = torch.full_like(z, float("nan"))
    kernels().gin_sum_rows(got.numpy(), agg.numpy(), wt.numpy(), genes.numpy(), fac.numpy(),
                           x.numpy(), e.numpy())
    assert torch.equal(got, z + x * e)
    eps = torch.finfo(dtype).eps
    assert torch.allclose(got, z.clone().addcmul_(x, e), rtol=4 * eps, atol=4 * eps * 10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("repeat", [False, True])
def test_take_add_at_equals_index_select_index_add(dtype, repeat):
    n, m, h, idx, _, acc, g = _case(dtype, repeat)
    src = torch.randn(n, h, generator=g, dtype=dtype)
    pos = torch.randint(0, n, (m,), generator=g)
    want_dst = src.index_select(0, pos)
    want = acc.clone().index_add_(0, idx, want_dst)
    dst = torch.full_like(want_dst, float("nan"))
    kernels().take_add_at(dst.numpy(), src.numpy(), pos.numpy(), acc.numpy(), idx.numpy())
    assert torch.equal(dst, want_dst) and torch.equal(acc, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("repeat", [False, True])
def test_gin_sum_rows_backward_equals_mul_and_scaled_index_add(dtype, repeat):
    n, m, h, idx, gz, acc, g = _case(dtype, repeat)
    fac = torch.rand(m, 1, generator=g, dtype=dtype) * 3
    e = 1 + torch.rand(1, generator=g, dtype=dtype)
    want_gx = torch.mul(gz, e)
    want = acc.clone().index_add_(0, idx, gz * fac)
    gx = torch.full_like(gz, float("nan"))
    kernels().gin_sum_rows_backward(gx.numpy(), gz.numpy(), e.numpy(), acc.numpy(),
                                    idx.numpy(), fac.numpy())
    assert torch.equal(gx, want_gx) and torch.equal(acc, want)


def test_rows_of_a_slice_only():
    """A slice of the index and source (as the fused sum passes a sample's rows) touches only
    the rows it names."""
    acc = torch.zeros(6, 2)
    idx = torch.tensor([0, 5, 2, 3])
    src = torch.ones(6, 2)
    dst = torch.zeros(4, 2)
    kernels().take_add_at(dst.numpy()[1:3], src.numpy(), idx.numpy()[1:3], acc.numpy(),
                          idx.numpy()[1:3])
    assert acc.sum(1).tolist() == [0, 0, 2, 0, 0, 2]
    assert dst.sum(1).tolist() == [0, 2, 2, 0]


def _csr(rows: int, cols: int, dtype, idx_dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    dense = (torch.rand(rows, cols, generator=g) < 0.15).to(dtype) \
        * torch.randn(rows, cols, generator=g, dtype=dtype)
    dense[3] = 0  # an empty row
    a = dense.to_sparse_csr()
    return dense, torch.sparse_csr_tensor(a.crow_indices().to(idx_dtype),
                                          a.col_indices().to(idx_dtype), a.values(), a.shape)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
def test_add_csr_t_equals_the_transposes_product(dtype, tol, idx_dtype):
    dense, a = _csr(30, 20, dtype, idx_dtype, 5)
    g = torch.randn(12, 8, generator=torch.Generator().manual_seed(6), dtype=dtype)
    out = torch.randn(20, 8, dtype=dtype)
    start = out.clone()
    want = out + dense[10:22].t() @ g  # rows 10..21 of a, and only those
    kernels().add_csr_t(out.numpy(), a.crow_indices().numpy(), a.col_indices().numpy(),
                        a.values().numpy(), g.numpy(), 10)
    assert torch.allclose(out, want, rtol=tol, atol=tol)
    assert not torch.allclose(out, start + dense[9:21].t() @ g, rtol=tol, atol=tol)
    assert not torch.allclose(out, start, rtol=tol, atol=tol)


@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("threads", [1, 2])
def test_delta_group_backward_scatter_equals_transposes(threads, idx_dtype, monkeypatch):
    """_SpMMParts' backward on a CPU (the compiled scatter, a run per thread) against the same
    function's backward through the transposes (taken under a mode that watches operators),
    and both against dense products, in float64, with a block whose gradient is None."""
    import importlib
    conv = importlib.import_module("workbook_lib.nodemask.convert")

    calls = []
    real = conv._scatter_parts
    monkeypatch.setattr(conv, "_scatter_parts",
                        lambda a, sizes, grads, ws: calls.append([g is None for g in grads])
                        or real(a, sizes, grads, ws))
    monkeypatch.setattr(conv, "SCATTER_RUN_ENTRIES", 1)  # a run per thread on these few
    runs = []
    spread = conv.spread
    monkeypatch.setattr(conv, "spread", lambda fn, n, k: runs.append(k) or spread(fn, n, k))
    from workbook_lib.nodemask.workspace import Workspace

    dense, a = _csr(40, 25, torch.float64, idx_dtype, 7)
    sizes = [15, 5, 20]
    ws = (Workspace(min_bytes=0), "test")  # the accumulators from it, taken in the workers
    ats = [d.t().contiguous().to_sparse_csr() for d in dense.split(sizes)]
    x = torch.randn(25, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(40, 6, dtype=torch.float64)

    def grad(watch: bool):
        x.grad = None
        parts = conv._SpMMParts.apply(x, a, sizes, ws, *ats)
        loss = (parts[0] * w[:15]).sum() + (parts[2] * w[20:]).sum()  # parts[1] unused
        with _Watch() if watch else _nothing():
            loss.backward()
        return x.grad.clone()

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = grad(False)
        assert calls == [[False, True, False]] and runs == [threads]  # the unused block: None
        want = grad(True)
        assert len(calls) == 1  # watched: through the transposes
    finally:
        torch.set_num_threads(before)
    ref = dense[:15].t() @ w[:15] + dense[20:].t() @ w[20:]
    assert torch.allclose(want, ref, rtol=1e-12, atol=1e-12)
    assert torch.allclose(got, ref, rtol=1e-12, atol=1e-12)


class _Watch(TorchDispatchMode):
    """A mode that watches every operator and changes none (as the sync counter does)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_delta_group_scatter_runs_cut_inside_a_block_and_keep_a_one_row_run(monkeypatch):
    """On two threads, a first row holding most entries makes the first run that row alone, and
    the cut falls inside the first block (rows 0..9): the kernel sees each block's rows within
    each run, rows 0 and 1..9 of block 0 apart, and the sum equals the dense products (a run of
    one row skipped, or a block given whole to the run of its first row, would differ)."""
    import importlib
    conv = importlib.import_module("workbook_lib.nodemask.convert")

    seen = []
    real = kernels()

    class _Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def add_csr_t(out, crow, col, val, g, r0):
            seen.append((r0, g.shape[0]))
            return real.add_csr_t(out, crow, col, val, g, r0)
    monkeypatch.setattr(conv, "kernels", lambda: _Spy())
    monkeypatch.setattr(conv, "SCATTER_RUN_ENTRIES", 1)
    gen = torch.Generator().manual_seed(11)
    rows, cols = 40, 200
    dense = torch.zeros(rows, cols, dtype=torch.float64)
    dense[0] = torch.randn(cols, generator=gen, dtype=torch.float64)  # 200 of about 280 entries
    for r in range(1, rows):
        dense[r, torch.randint(0, cols, (2,), generator=gen)] = 1.0 + r / 10
    a = dense.to_sparse_csr()
    sizes = [10, 30]
    ats = [d.t().contiguous().to_sparse_csr() for d in dense.split(sizes)]
    x = torch.randn(cols, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(rows, 3, dtype=torch.float64)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        parts = conv._SpMMParts.apply(x, a, sizes, None, *ats)
        ((parts[0] * w[:10]).sum() + (parts[1] * w[10:]).sum()).backward()
    finally:
        torch.set_num_threads(before)
    assert sorted(seen) == [(0, 1), (1, 9), (10, 30)]
    assert torch.allclose(x.grad, dense.t() @ w, rtol=1e-12, atol=1e-12)
