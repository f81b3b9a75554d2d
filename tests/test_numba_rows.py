"""The compiled row scatters (workbook_lib.nodemask.numba_rows) equal the PyTorch ops they
replace in DeltaGinSum, bit for bit, in float32 and float64, with repeated and unsorted rows."""
import pytest
import torch

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
def test_add_at_equals_index_add(dtype, repeat):
    n, m, h, idx, src, acc, _ = _case(dtype, repeat)
    want = acc.clone().index_add_(0, idx, src)
    kernels().add_at(acc.numpy(), idx.numpy(), src.numpy())
    assert torch.equal(acc, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("repeat", [False, True])
def test_add_scaled_at_equals_mul_index_add(dtype, repeat):
    n, m, h, idx, src, acc, g = _case(dtype, repeat)
    fac = torch.rand(m, 1, generator=g, dtype=dtype) * 3
    want = acc.clone().index_add_(0, idx, src * fac)
    kernels().add_scaled_at(acc.numpy(), idx.numpy(), src.numpy(), fac.numpy())
    assert torch.equal(acc, want)


def test_rows_of_a_slice_only():
    """A slice of the index and source (as the fused sum passes a sample's rows) touches only
    the rows it names."""
    acc = torch.zeros(6, 2)
    idx = torch.tensor([0, 5, 2, 3])
    src = torch.ones(4, 2)
    kernels().add_at(acc.numpy(), idx.numpy()[1:3], src.numpy()[1:3])
    assert acc.sum(1).tolist() == [0, 0, 2, 0, 0, 2]
