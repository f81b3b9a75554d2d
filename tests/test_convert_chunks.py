"""workbook_lib.nodemask.chunks: a converted encoder's per-node modules and its readout a chunk of
rows (of samples) at a time on a CPU, exact against the per-sample reference and against one
call; one call wherever chunks could change what runs (a mode watching, hooks, a module in place,
a readout that may mix samples)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn.aggr import AttentionalAggregation, MeanAggregation

from test_convert import DELETED, F_IN, GRAPH, H, N, GinMlpSums, _check, _float64
from workbook_lib.nodemask import chunks, convert


def _counted(monkeypatch) -> dict:
    """Chunks of every size (a row, a sample), and a count of each chunked call."""
    calls = {"rows": 0, "pick": 0}
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 1)
    rows, pick = chunks.RowChunks.apply, chunks.PickChunks.apply

    def count_rows(*a):
        calls["rows"] += 1
        return rows(*a)

    def count_pick(*a):  # a pick in more than one chunk (every pick is one chunk of it)
        calls["pick"] += len(a) > 3 + 4
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
    from test_workspace import second_order_matches_reference

    calls = _counted(monkeypatch)
    x = second_order_matches_reference(seed=1)
    assert calls["rows"] > 0
    with _float64():
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


@pytest.mark.parametrize("size", [1, 150, 3500])  # chunks of 1 row, of 3 rows, of two samples
@pytest.mark.parametrize("readout", ["attention", "mean_aggr"])
def test_uneven_chunks_and_a_sample_with_every_gene_deleted(monkeypatch, size, readout):
    """Chunks of several rows and samples, the last one shorter (B = 5: samples 2 + 2 + 1), and
    a batch whose second sample deletes every gene (its chunk has no kept row): outputs and
    every gradient equal the reference's and one call's."""
    monkeypatch.setattr(chunks, "CHUNK_BYTES", size)
    every = torch.cat([torch.arange(N)]).unsqueeze(0)
    few = torch.full((4, N), -1)
    few[:, :2] = DELETED[:4]
    deleted = torch.cat([few[:1], every, few[1:]])
    with _float64():
        torch.manual_seed(2)
        enc = Tail()
        ro = AttentionalAggregation(nn.Linear(H, 1)) if readout == "attention" else \
            MeanAggregation()
        x = torch.randn(N, F_IN, requires_grad=True)
        params = [x] + list(enc.parameters()) + list(ro.parameters())
        got = []
        for s in (size, 1 << 40, None):  # chunks, one call, the per-sample reference
            monkeypatch.setattr(chunks, "CHUNK_BYTES", s or 1)
            out = convert(enc, GRAPH, readout=ro)(x, deleted) if s else torch.cat([
                ro(h[keep], index=torch.zeros(int(keep.sum()), dtype=torch.long), dim_size=1)
                for h, keep in _per_sample(enc, x, deleted)])
            got.append([out] + list(torch.autograd.grad(out.pow(2).sum(), params)))
    assert got[0][0][1].abs().max() == 0 or readout == "attention"  # no kept gene: its pool
    for chunked, other in ((got[0], got[1]), (got[0], got[2])):
        for a, b in zip(chunked, other):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def _per_sample(enc, x, deleted):
    """Per sample: the encoder on the graph less its genes (their rows of x zeroed), its kept
    genes."""
    for row in deleted:
        d = row[row >= 0]
        xb = x.clone()
        xb[d] = 0
        keep = torch.ones(N, dtype=torch.bool)
        keep[d] = False
        yield enc(xb, {k: e[:, ~(torch.isin(e[0], d) | torch.isin(e[1], d))]
                       for k, e in GRAPH.items()}), keep


class Chunked(nn.Module):
    def __init__(self, lin):
        super().__init__()
        self.lin = lin

    def forward(self, x):
        return chunks.per_row(self.lin, x, None)


class Plain(Chunked):
    def forward(self, x):
        return self.lin(x)


def test_a_hook_runs_once_and_the_backward_reads_the_forwards_tensors(monkeypatch):
    """A hooked module runs once per forward with chunks on (one call), a parameter's hook once
    per backward; the backward recomputes on the tensors the forward read: a parameter swapped
    by ``functional_call`` gets its gradient, one changed in place since raises, and a module
    switched to train mode between them is recomputed in its forward's mode."""
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 1)
    with _float64():
        torch.manual_seed(4)
        enc = Tail()
        x = torch.randn(N, F_IN, requires_grad=True)
        for hook in ("forward", "parameter"):
            seen = []
            add = lambda *a: seen.append(1)  # noqa: E731
            handle = enc.norm.register_forward_hook(add) if hook == "forward" else \
                enc.norm.weight.register_hook(lambda g: add() or g)
            runs = []
            for size in (1 << 40, 1):  # one call, then chunks of a row
                monkeypatch.setattr(chunks, "CHUNK_BYTES", size)
                seen.clear()
                out = convert(enc, GRAPH, readout="mean_kept")(x, DELETED)
                runs.append((len(seen), torch.autograd.grad(out.pow(2).sum(), enc.norm.weight)))
                runs[-1] = (len(seen), runs[-1][1])
            handle.remove()
            assert runs[0][0] == runs[1][0] > 0, (hook, runs)
            torch.testing.assert_close(runs[0][1], runs[1][1])

        lin = nn.Sequential(nn.Linear(H, H), nn.Dropout(0.5)).eval()
        wrap = Chunked(lin)
        xs = torch.randn(10, H, requires_grad=True)
        other = {"lin.0.weight": torch.randn(H, H, requires_grad=True),
                 "lin.0.bias": torch.randn(H, requires_grad=True)}
        got, want = (torch.autograd.grad(torch.func.functional_call(m, other, (xs,)).sum(),
                                         [xs, *other.values()]) for m in (wrap, Plain(lin)))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
        y = chunks.RowChunks.apply(lin, 3, None, xs, *[t for _, t in lin.named_parameters()])
        lin.train()  # its dropout would draw at a recompute in this mode
        (gx,) = torch.autograd.grad(y.sum(), xs)
        torch.testing.assert_close(gx, torch.autograd.grad(lin.eval()(xs).sum(), xs)[0])
        y = chunks.RowChunks.apply(lin, 3, None, xs, *[t for _, t in lin.named_parameters()])
        with torch.no_grad():
            lin[0].weight.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()


def test_autocast_and_aggregations_that_read_the_batch_run_in_one_call():
    """Under autocast one call; a user's own aggregation, a median, a quantile and a sort are
    not chunked by samples."""
    from torch_geometric.nn.aggr import (Aggregation, MedianAggregation, QuantileAggregation,
                                         SortAggregation)

    class Centred(Aggregation):
        def forward(self, x, index=None, ptr=None, dim_size=None, dim=-2):
            return self.reduce(x - x.mean(0), index, ptr, dim_size, dim, reduce="sum")

    big = torch.zeros(4 * chunks.CHUNK_BYTES // (64 * 4), 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert chunks.chunk_rows(big) is None
    for agg in (Centred(), MedianAggregation(), QuantileAggregation(0.3), SortAggregation(3)):
        assert not chunks.chunkable_readout(agg), agg


def test_sample_chunks_cover_the_batch_in_order():
    per = chunks.CHUNK_BYTES // (100 * 64 * 4)
    cuts = chunks.sample_chunks(5 * per + 1, 100, 64, 4)
    assert cuts[0] == (0, per) and cuts[-1] == (5 * per, 5 * per + 1)
    assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
    assert chunks.sample_chunks(2 * per - 1, 100, 64, 4) == [(0, 2 * per - 1)]


def test_multiaggregations_fused_parts_are_chunked_and_autocast_is_refused(monkeypatch):
    """A user trial: MultiAggregation builds a FusedAggregation of its simple parts, which the
    list lacked (one call); under autocast a converted SAGE encoder raised a raw
    NotImplementedError from a sparse product: refused in one line instead."""
    from test_convert import TYPES, Encoder
    from torch_geometric.nn.aggr import MultiAggregation
    from workbook_lib.nodemask.convert_trace import ConvertError

    assert chunks.chunkable_readout(MultiAggregation(["mean", "max", "std"]))
    calls = _counted(monkeypatch)
    with _float64():
        torch.manual_seed(5)
        _check(Tail(), GRAPH, MultiAggregation(["mean", "max"]))
    assert calls["pick"] == 2
    fast = convert(Encoder("sage_mean", "single", "linear"), GRAPH[TYPES[0]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(ConvertError, match="under torch.autocast.*enabled=False"):
            fast(torch.randn(N, F_IN), DELETED)
