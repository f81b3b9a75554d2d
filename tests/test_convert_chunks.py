"""workbook_lib.nodemask.chunks: a converted encoder's per-node modules and its readout a chunk of
rows (of samples) at a time on a CPU, exact against the per-sample reference and against one
call; one call wherever chunks could change what runs (a mode watching, hooks, a module in place,
a readout that may mix samples)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn.aggr import AttentionalAggregation, MeanAggregation

from test_convert import DELETED, F_IN, GRAPH, H, N, GinMlpSums, _check, _float64, _reference
from workbook_lib.nodemask import chunks, convert
from workbook_lib.nodemask.workspace import Workspace


def _counted(monkeypatch) -> dict:
    """Chunks of every size (a row, a sample), and a count of each chunked call."""
    calls = {"rows": 0, "pick": 0}
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 1)
    rows, pick = chunks.RowChunks.apply, chunks.PickChunks.apply

    def count_rows(*a):
        calls["rows"] += 1
        return rows(*a)

    def count_pick(*a):
        calls["pick"] += 1
        return pick(*a)
    monkeypatch.setattr(chunks.RowChunks, "apply", count_rows)
    monkeypatch.setattr(chunks.PickChunks, "apply", count_pick)
    return calls


class Tail(nn.Module):
    """A linear map, a GIN-MLP sum, then the chunked kinds: a module (LayerNorm), a method
    (``relu``), a function (``F.gelu``) and an activation module."""

    def __init__(self):
        super().__init__()
        self.body = GinMlpSums("relu")
        self.norm, self.act = nn.LayerNorm(H), nn.Tanh()

    def forward(self, x, edges):
        return self.act(F.gelu(self.norm(self.body(x, edges)).relu()))


@pytest.mark.parametrize("readout", ["attention", "mean_aggr", "mean_kept", None])
def test_chunked_modules_and_readout_equal_the_reference(monkeypatch, readout):
    """Every per-node module and function after a dense layer, and a PyG aggregation readout,
    in chunks of one row (one sample): outputs and every gradient equal the per-sample
    reference in float64, at two steps, the second on the first's workspace."""
    calls = _counted(monkeypatch)
    with _float64():
        torch.manual_seed(0)
        enc = Tail()
        ro = {"attention": lambda: AttentionalAggregation(nn.Sequential(
            nn.Linear(H, 4), nn.ReLU(), nn.Linear(4, 1)), nn.Linear(H, H)),
            "mean_aggr": MeanAggregation}.get(readout, lambda: readout)()
        _check(enc, GRAPH, ro)
    assert calls["rows"] > 0
    assert calls["pick"] == (2 if readout in ("attention", "mean_aggr") else 0)


def test_chunks_and_one_call_agree(monkeypatch):
    """The same batch with chunks of one row and in one call: the same outputs and gradients
    (to rounding: the parameters' gradients are added chunk by chunk)."""
    with _float64():
        torch.manual_seed(3)
        enc = Tail()
        ro = AttentionalAggregation(nn.Linear(H, 1))
        x = torch.randn(N, F_IN, requires_grad=True)
        params = list(enc.parameters()) + list(ro.parameters()) + [x]
        got = []
        for size in (1, 1 << 40):
            monkeypatch.setattr(chunks, "CHUNK_BYTES", size)
            out = convert(enc, GRAPH, readout=ro)(x, DELETED)
            got.append([out] + list(torch.autograd.grad(out.pow(2).sum(), params)))
    for a, b in zip(*got):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_a_second_order_gradient_and_a_retained_graph_run_through_chunks(monkeypatch):
    """create_graph through chunked per-node calls (a GCN encoder's linear map and ReLU between
    its layers: their gradient differentiable again, the whole input once more) and a retained
    graph's second backward through the chunked tail: both the reference's."""
    from test_convert import TYPES, Encoder

    calls = _counted(monkeypatch)
    with _float64():
        torch.manual_seed(1)
        enc, graph = Encoder("gcn", "single", "linear"), GRAPH[TYPES[0]]
        fast = convert(enc, graph)
        fast.workspace = Workspace(min_bytes=0)
        x = torch.randn(N, F_IN, requires_grad=True)
        grads = []
        for out in (fast(x, DELETED), _reference(enc, x, graph, DELETED, None)):
            (gx,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
            (ggx,) = torch.autograd.grad(gx.pow(2).sum(), x)
            grads.append(ggx)
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-9, atol=1e-10)
        assert calls["rows"] > 0
        before = calls["rows"]
        tail = convert(Tail(), GRAPH, readout=AttentionalAggregation(nn.Linear(H, 1)))
        out = tail(x, DELETED).pow(2).sum()
        first = torch.autograd.grad(out, x, retain_graph=True)[0]
        torch.testing.assert_close(torch.autograd.grad(out, x)[0], first, rtol=0, atol=0)
    assert calls["rows"] > before and calls["pick"] == 1


def test_chunks_only_where_nothing_can_tell():
    """One call on a device other than the CPU, under a mode (the sync counter, equal's dtype
    guard), for a tensor under two chunks; a module with a hook or in place is not plain; a
    readout whose modules may mix samples (a train-mode BatchNorm, a drawing dropout, a kind not
    listed) or hold a hook is not chunked."""
    from workbook_lib.measurement.precision import dtype_guard
    from workbook_lib.measurement.syncs import SyncCounter

    big = torch.zeros(4 * chunks.CHUNK_BYTES // (64 * 4), 64)
    assert chunks.chunk_rows(big) == chunks.CHUNK_BYTES // (64 * 4)
    assert chunks.chunk_rows(big[:10]) is None
    assert chunks.chunk_rows(torch.zeros(big.shape, device="meta")) is None
    with dtype_guard(torch.float64):
        assert chunks.chunk_rows(big.double()) is None
    with SyncCounter("cpu").count():
        assert chunks.chunk_rows(big) is None
    ln = nn.LayerNorm(4)
    assert chunks.plain(ln) and not chunks.plain(nn.ReLU(inplace=True))
    ln.register_forward_hook(lambda *a: None)
    assert not chunks.plain(ln)

    def gate(*mods):
        return AttentionalAggregation(nn.Sequential(nn.Linear(4, 4), *mods, nn.Linear(4, 1)))
    assert chunks.chunkable_readout(gate(nn.ReLU())) and chunks.chunkable_readout(
        MeanAggregation())
    assert chunks.chunkable_readout(gate(nn.BatchNorm1d(4).eval(), nn.Dropout(0.5).eval()))
    assert not chunks.chunkable_readout(gate(nn.BatchNorm1d(4)))  # train mode: the batch's
    assert not chunks.chunkable_readout(gate(nn.Dropout(0.1)))
    assert not chunks.chunkable_readout(gate(nn.Softmax(dim=0)))  # not a listed kind
    assert not chunks.chunkable_readout(nn.Linear(4, 4))  # not an aggregation
    hooked = gate(nn.ReLU())
    hooked.gate_nn[0].register_forward_hook(lambda *a: None)
    assert not chunks.chunkable_readout(hooked)


def test_sample_chunks_cover_the_batch_in_order():
    per = chunks.CHUNK_BYTES // (100 * 64 * 4)
    cuts = chunks.sample_chunks(5 * per + 1, 100, 64, 4)
    assert cuts[0] == (0, per) and cuts[-1] == (5 * per, 5 * per + 1)
    assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
    assert chunks.sample_chunks(2 * per - 1, 100, 64, 4) == [(0, 2 * per - 1)]
