"""Second derivatives through a converted encoder (create_graph=True, then a gradient of the
gradient at x): across convolution x container x readout x form (the default choice of delta and
dense layers, and every layer dense), each equals the per-sample reference's in float64, or,
where the converted form computes first derivatives only (a GIN whose nn is Sequential(Linear,
ReLU, Linear): its fused blocks; the compiled push of a typed layer), raises ConvertError at the
create_graph backward, also where the gradient arriving there carries no graph (a loss
out.sum()). Found by this test: a sum over a per-type module dict and every fused GIN-MLP block
left their terms out without a word (PyTorch's once_differentiable raises only where its node
runs, and a gradient at x through other paths does not run it)."""
import pytest
import torch
from torch import nn
from torch_geometric.nn import AttentionalAggregation

from workbook_lib.nodemask import convert
from workbook_lib.nodemask.convert_trace import ConvertError

from test_convert import DELETED, F_IN, GRAPH, H, N, TYPES, Encoder, _reference

convert_module = __import__("sys").modules["workbook_lib.nodemask.convert"]
FIRST_ORDER_ONLY = {"gin"}  # Sequential(Linear, ReLU, Linear) GINs: the fused blocks


def _second(fast_or_enc, x, graph, readout, converted: bool, square: bool = True) -> tuple:
    out = fast_or_enc(x, DELETED) if converted else _reference(fast_or_enc, x, graph, DELETED,
                                                                readout)
    (gx,) = torch.autograd.grad((out.pow(2) if square else out).sum(), x, create_graph=True)
    (ggx,) = torch.autograd.grad(gx.pow(2).sum(), x)
    return gx.detach(), ggx


@pytest.mark.parametrize("share", ["default", "all dense"])
@pytest.mark.parametrize("readout", [None, "attention"])
@pytest.mark.parametrize("container", ["single", "hetero", "moduledict"])
@pytest.mark.parametrize("conv", ["gin", "gin_mean", "graph_add", "graph_mean", "sage_mean",
                                  "sage_sum", "gcn"])
def test_a_second_derivative_equals_the_references_or_raises(conv, container, readout, share,
                                                             monkeypatch):
    if share == "all dense":
        monkeypatch.setattr(convert_module, "DENSE_SHARE", 0.0)
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        enc = Encoder(conv, container, "layernorm")
        graph = GRAPH[TYPES[0]] if container == "single" else GRAPH
        ro = AttentionalAggregation(nn.Linear(H, 1)) if readout == "attention" else None
        fast = convert(enc, graph, readout=ro)
        x = torch.randn(N, F_IN, requires_grad=True)
        if conv in FIRST_ORDER_ONLY:
            for square in (True, False):  # out.sum(): the arriving gradient has no graph
                with pytest.raises(ConvertError, match="second derivative .* first derivatives "
                                                       "only"):
                    _second(fast, x, graph, ro, True, square)
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


@pytest.mark.parametrize("readout", [None, "mean"])
def test_a_typed_layers_compiled_push_refuses_a_second_derivative(readout):
    """The workbook's model's shape (identity GINs concatenated, then a linear map): its fused
    layers run the compiled push (``_Push``; pooled into a mean, ``_PushPool``), first-order
    only: ConvertError at the create_graph backward (a raw out= RuntimeError before)."""
    from test_convert import TypedLayers
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        enc = TypedLayers()
        fast = convert(enc, GRAPH, readout=readout, num_nodes=N)
        x = torch.randn(N, F_IN, requires_grad=True)
        with pytest.raises(ConvertError, match="through _Push(Pool)? is not supported"):
            _second(fast, x, GRAPH, readout, True)
        out = fast(x, DELETED)  # first derivatives as before
        (gx,) = torch.autograd.grad(out.sum(), x)
        ref = _reference(enc, x, GRAPH, DELETED, readout)
        (gr,) = torch.autograd.grad(ref.sum(), x)
    finally:
        torch.set_default_dtype(torch.float32)
    torch.testing.assert_close(gx, gr, rtol=1e-9, atol=1e-10)
