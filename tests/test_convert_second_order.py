"""Second derivatives through a converted encoder (create_graph=True, then a gradient of the
gradient at x): across convolution x container x readout, each equals the per-sample
reference's in float64, or, where the converted form computes first derivatives only (a GIN
whose nn is Sequential(Linear, ReLU, Linear): its fused blocks), raises ConvertError at the
create_graph backward. Found by this test: a sum over a per-type module dict and every fused
GIN-MLP block left their terms out without a word (PyTorch's once_differentiable raises only
where its node runs, and a gradient at x through other paths does not run it)."""
import pytest
import torch
from torch import nn
from torch_geometric.nn import AttentionalAggregation

from workbook_lib.nodemask import convert
from workbook_lib.nodemask.convert_trace import ConvertError

from test_convert import DELETED, F_IN, GRAPH, H, N, TYPES, Encoder, _reference

FIRST_ORDER_ONLY = {"gin"}  # Sequential(Linear, ReLU, Linear) GINs: the fused blocks


def _second(fast_or_enc, x, graph, readout, converted: bool) -> tuple:
    out = fast_or_enc(x, DELETED) if converted else _reference(fast_or_enc, x, graph, DELETED,
                                                                readout)
    (gx,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
    (ggx,) = torch.autograd.grad(gx.pow(2).sum(), x)
    return gx.detach(), ggx


@pytest.mark.parametrize("readout", [None, "attention"])
@pytest.mark.parametrize("container", ["single", "hetero", "moduledict"])
@pytest.mark.parametrize("conv", ["gin", "gin_mean", "graph_add", "graph_mean", "sage_mean",
                                  "sage_sum", "gcn"])
def test_a_second_derivative_equals_the_references_or_raises(conv, container, readout):
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        enc = Encoder(conv, container, "layernorm")
        graph = GRAPH[TYPES[0]] if container == "single" else GRAPH
        ro = AttentionalAggregation(nn.Linear(H, 1)) if readout == "attention" else None
        fast = convert(enc, graph, readout=ro)
        x = torch.randn(N, F_IN, requires_grad=True)
        if conv in FIRST_ORDER_ONLY:
            with pytest.raises(ConvertError, match="second derivative .* first derivatives "
                                                   "only"):
                _second(fast, x, graph, ro, True)
            return
        gx, got = _second(fast, x, graph, ro, True)
        gx_ref, want = _second(enc, x, graph, ro, False)
    finally:
        torch.set_default_dtype(torch.float32)
    torch.testing.assert_close(gx, gx_ref, rtol=1e-9, atol=1e-10)
    # a second derivative that is zero but for rounding (a piecewise-linear path) is compared
    # at the first derivative's scale
    scale = max(float(want.abs().max()), float(gx_ref.abs().max()))
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10 * scale)
