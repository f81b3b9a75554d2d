"""nodemask.convert_dense.DeltaGinSum: a delta layer's sum over edge types of GIN-MLPs a sample at a
time on a CPU, exact against the per-sample reference (float64, outputs and every gradient) and
against the conv-by-conv form; conv by conv wherever it does not apply (another MLP, a mode
watching, a GPU)."""
import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch_geometric.nn import GINConv
from torch_geometric.nn.aggr import AttentionalAggregation

from test_convert import (DELETED, F_IN, GRAPH, H, N, GinMlpSums, _check, _float64, _forms,
                          _graph, _reference)
from test_convert import convert_module
from workbook_lib.nodemask import convert, convert_dense


def _counted(monkeypatch, spread_to: int | None = None) -> dict:
    """A count of the fused sums' calls and of the samples each spread over workers (``spread_to``
    workers at most, whatever the machine's threads; None: as the machine has)."""
    calls = {"sums": 0, "spread": []}
    apply = convert_dense.DeltaGinSum.apply

    def count(*a):
        calls["sums"] += 1
        return apply(*a)
    monkeypatch.setattr(convert_dense.DeltaGinSum, "apply", count)
    monkeypatch.setattr(convert_module, "DeltaGinSum", convert_dense.DeltaGinSum)
    if spread_to is not None:
        monkeypatch.setattr(convert_dense, "workers",
                            lambda dev, n: calls["spread"].append(n) or min(spread_to, n))
    monkeypatch.setattr(convert_module, "DENSE_SHARE", 10.0)  # every layer stays delta
    return calls


# DeltaGinSum's sample groups: one sample at a time, groups of a few samples by their rows (the
# default's groups: this graph's samples change few rows), one group per worker
GROUPS = [0, 12, 10**9]


@pytest.mark.parametrize("group_rows", GROUPS)
@pytest.mark.parametrize("spread_to", [1, 3])
@pytest.mark.parametrize("kind", ["relu", "mean", "nobias", "pyg", "inplace", "tanh", "widths"])
def test_a_delta_sum_of_gin_mlps_is_fused_and_exact(monkeypatch, kind, spread_to, group_rows):
    """Where a layer is delta, a sum of its GIN-MLPs over the edge types runs a sample, or a
    group of samples with few rows, at a time (one worker, or three side by side): exact, outputs and every gradient, at a hub, a leaf, an
    isolated gene, two adjacent genes and a sample that deletes nothing (no changed rows of any
    type); explain marks its convs ``delta*``. Another MLP (``tanh``, ``widths``) is computed conv
    by conv, exact all the same."""
    calls = _counted(monkeypatch, spread_to)
    monkeypatch.setattr(convert_dense, "GROUP_ROWS", group_rows)
    fused = kind not in ("tanh", "widths")
    with _float64():
        readout = {"pyg": AttentionalAggregation(torch.nn.Linear(H, 1)), "nobias": None}.get(
            kind, "mean_kept")
        fast = _check(GinMlpSums(kind), GRAPH, readout)
        forms = _forms(fast.explain(DELETED))
    for layer in (0, 1):
        for et in GRAPH:
            assert forms[f"convs.{layer}.{'__'.join(et)}"] == ("delta*" if fused else "delta")
    assert (calls["sums"] >= 2 * 2) if fused else calls["sums"] == 0  # 2 layers, 2 steps
    if fused and spread_to > 1:
        assert len(DELETED) in calls["spread"]


def test_the_fused_delta_sum_equals_the_conv_by_conv_form_and_runs_only_unwatched(monkeypatch):
    """The same batch with the delta sums fused and conv by conv (a mode watching this thread's
    operators turns them off, as it does the workers: the sync counter and equal's guards see
    the GPU's path): equal outputs and gradients to rounding, in float64."""
    calls = _counted(monkeypatch)

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with _float64():
        torch.manual_seed(3)
        enc = GinMlpSums("relu")
        fast = convert(enc, GRAPH, readout="mean_kept")
        x = torch.randn(N, F_IN, requires_grad=True)
        params = list(enc.parameters()) + [x]
        results, seen = [], []
        for watch in (False, True):
            seen.append(calls["sums"])
            with Watch() if watch else torch.enable_grad():
                out = fast(x, DELETED)
                got = torch.autograd.grad(out.square().sum(), params)
            results.append((out.detach(), got))
    seen.append(calls["sums"])
    assert seen[2] == seen[1] > seen[0], seen  # fused unwatched only
    (o1, g1), (o0, g0) = results
    torch.testing.assert_close(o1, o0, rtol=1e-12, atol=1e-13)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


def test_a_delta_sum_on_another_device_runs_conv_by_conv(monkeypatch):
    """On a GPU (here its device type asked for, the plan's sums found), the delta sums are not
    fused: the live sums for a CPU include them, for CUDA only the dense ones."""
    _counted(monkeypatch)
    with _float64():
        fast = convert(GinMlpSums("relu"), GRAPH, readout="mean_kept")
        plan = fast.plan(DELETED, N)
    kinds = [fs.kind for fs in plan.fused_sums.values()]
    assert kinds.count("delta") == 2, kinds
    cpu = fast._live_sums(plan, torch.device("cpu"))[0]
    cuda = fast._live_sums(plan, torch.device("cuda"))[0]
    assert [fs.kind for fs, _ in cpu.values()] == kinds
    assert "delta" not in [fs.kind for fs, _ in cuda.values()]
    assert len(cuda) == kinds.count("dense")


THREE = ["a", "b", "c"]


def _three(hub_to_all: bool) -> dict:
    """Three edge types on N genes (two of test_convert's graphs' types); with ``hub_to_all``,
    gene 0 also sends an edge to every other gene on each type, so that deleting it changes
    every gene's row at the first layer (the sum's rows are every row)."""
    parts = list(_graph(0).values()) + [next(iter(_graph(1).values()))]
    out = {}
    for name, ei in zip(THREE, parts):
        if hub_to_all:
            rest = torch.arange(1, N)
            ei = torch.cat([ei, torch.stack([torch.zeros_like(rest), rest])], 1)
        out[("gene", name, "gene")] = ei
    return out


class Reversed(nn.Module):
    """Two layers of three GIN-MLPs called in the types' order a, b, c and summed c + b + a
    (the sum's order is not the group's); ``frozen``: some parameters of one type only need
    no gradient."""

    def __init__(self, frozen: bool = False, input_frozen: bool = False):
        super().__init__()
        self.lin = nn.Linear(F_IN, H)
        self.convs = nn.ModuleList(nn.ModuleDict({
            t: GINConv(nn.Sequential(nn.Linear(H, 2 * H), nn.ReLU(), nn.Linear(2 * H, H)),
                       train_eps=True, eps=0.1 * i - 0.2) for i, t in enumerate(THREE)})
            for _ in range(2))
        self.norm = nn.LayerNorm(H)
        if frozen:
            self.lin.weight.requires_grad_(False)
            self.convs[0]["a"].eps.requires_grad_(False)
            self.convs[1]["b"].nn[0].weight.requires_grad_(False)
            self.convs[1]["c"].nn[2].bias.requires_grad_(False)
        if input_frozen:  # the first layer's input and one of its types need no gradient
            self.lin.requires_grad_(False)
            self.convs[0]["a"].requires_grad_(False)

    def forward(self, x, edges):
        x = self.lin(x).relu()
        for convs in self.convs:
            out = {t: convs[t](x, edges[("gene", t, "gene")]) for t in THREE}
            x = self.norm((out["c"] + out["b"] + out["a"]).relu())
        return x


def _check_trainable(encoder, graph, deleted, readout="mean_kept", x_grad: bool = True):
    """As test_convert's check, over the parameters that need a gradient (and x's, if
    ``x_grad``)."""
    torch.manual_seed(1)
    x = torch.randn(N, F_IN, requires_grad=x_grad)
    fast = convert(encoder, graph, readout=readout)
    ref = _reference(encoder, x, graph, deleted, readout)
    w = torch.randn_like(ref)
    params = [p for p in encoder.parameters() if p.requires_grad] + ([x] if x_grad else [])
    want = torch.autograd.grad((ref * w).sum(), params)
    for _ in range(2):
        out = fast(x, deleted)
        torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
        for a, b in zip(torch.autograd.grad((out * w).sum(), params), want):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    return fast


@pytest.mark.parametrize("group_rows", GROUPS)
@pytest.mark.parametrize("spread_to", [1, 3])
@pytest.mark.parametrize("case", ["reversed", "frozen", "input_frozen", "every_row"])
def test_three_types_summed_out_of_order_with_frozen_parts_or_every_row_changed(monkeypatch,
                                                                                 case,
                                                                                 spread_to,
                                                                                 group_rows):
    """Three types summed in another order than their calls (each type's parameters with its
    own rows), some parameters of one type only frozen (each type's own flags), the first
    layer's input and one of its types frozen (no gradient at any of its wildtype
    aggregations, nor at that type's wildtype output: the sum's backward skips them), and a
    batch whose first layer's sum covers every row (every sample deletes a hub that sends to
    every gene; the rows then start as the wildtype's at every row, and its gradient is the
    samples' sum; the second layer then dense): exact, the delta sums fused."""
    calls = _counted(monkeypatch, spread_to)
    monkeypatch.setattr(convert_dense, "GROUP_ROWS", group_rows)
    graph = _three(case == "every_row")
    deleted = torch.tensor([[0, -1]] * 4) if case == "every_row" else DELETED
    with _float64():
        fast = _check_trainable(Reversed(frozen=case == "frozen",
                                         input_frozen=case == "input_frozen"), graph, deleted,
                                x_grad=case != "input_frozen")
        forms = _forms(fast.explain(deleted))
        plan = fast.plan(deleted, N)
    second = "dense*" if case == "every_row" else "delta*"  # its input is then every row
    assert [forms[f"convs.{i}.{t}"] for i in (0, 1) for t in THREE] == \
        ["delta*"] * 3 + [second] * 3, forms
    assert calls["sums"] >= 4
    dense = [plan.rows[node].dense for node, fs in plan.fused_sums.items() if fs.kind == "delta"]
    assert dense[0] == (case == "every_row"), dense


@pytest.mark.parametrize("first", ["call", "explain"])
@pytest.mark.parametrize("encoder", ["gin_mlp_sums", "gcn"])
def test_a_batch_first_seen_under_inference_mode_then_trains(monkeypatch, encoder, first):
    """A call (its workers too: three here) or explain under ``torch.inference_mode``, then the
    same batch trained: what the first kept (the plan, the graph on the device, the buffers) is
    not made of inference tensors, and the training call is exact (found by a review: it
    failed, "Inference tensors cannot be saved for backward"; the workers' in-place writes
    failed under inference mode too)."""
    from test_convert import Encoder
    _counted(monkeypatch, 3)
    with _float64():
        torch.manual_seed(2)
        enc = GinMlpSums("relu") if encoder == "gin_mlp_sums" else \
            Encoder("gcn", "moduledict", "layernorm")
        x = torch.randn(N, F_IN, requires_grad=True)
        fast = convert(enc, GRAPH, readout="mean_kept", num_nodes=N)
        with torch.inference_mode():
            seen = fast(x, DELETED) if first == "call" else fast.explain(DELETED)
        ref = _reference(enc, x, GRAPH, DELETED, "mean_kept")
        out = fast(x, DELETED)
        torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
        params = list(enc.parameters()) + [x]
        for a, b in zip(torch.autograd.grad(out.sum(), params),
                        torch.autograd.grad(ref.sum(), params)):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
        if first == "call":
            torch.testing.assert_close(seen, ref.detach(), rtol=1e-9, atol=1e-10)


def test_workers_run_in_inference_mode_where_the_caller_does():
    """.workers.spread: each worker in inference mode where its caller is (thread-local), so
    that it can write into a tensor made there; and not where the caller is not."""
    from workbook_lib.nodemask.workers import spread

    def fill(lo, hi):
        out[lo:hi] += 1  # an in-place write into the caller's tensor
        return torch.is_inference_mode_enabled()
    with torch.inference_mode():
        out = torch.zeros(4)
        assert spread(fill, 4, 2) == [True, True] and out.tolist() == [1.0] * 4
    out = torch.zeros(4)
    assert spread(fill, 4, 2) == [False, False] and out.tolist() == [1.0] * 4


class HeteroGins(nn.Module):
    """Two layers of a ``HeteroConv`` of GIN-MLPs over the types (found by a user trial: such a
    sum ran conv by conv), summed or averaged (``aggr``)."""

    def __init__(self, aggr: str, types: list | None = None):
        super().__init__()
        from torch_geometric.nn import HeteroConv
        self.lin = nn.Linear(F_IN, H)
        self.convs = nn.ModuleList(HeteroConv({
            et: GINConv(nn.Sequential(nn.Linear(H, 2 * H), nn.ReLU(), nn.Linear(2 * H, H)),
                        train_eps=True, eps=0.1 * i)
            for i, et in enumerate(GRAPH if types is None else types)}, aggr=aggr)
            for _ in range(2))
        self.norm = nn.LayerNorm(H)

    def forward(self, x, edges):
        x = self.lin(x).relu()
        for conv in self.convs:
            x = self.norm(conv({"gene": x}, edges)["gene"].relu())
        return x


@pytest.mark.parametrize("spread_to", [1, 3])
@pytest.mark.parametrize("types", ["both", "one", "graph_lacks_one"])
@pytest.mark.parametrize("form", ["delta", "dense", "mean"])
def test_a_heteroconv_sum_of_gin_mlps_is_fused_and_exact(monkeypatch, form, types, spread_to):
    """A HeteroConv(aggr="sum") of GIN-MLPs is such a sum: fused in a delta layer (delta*) and
    in a dense one (dense*), exact, also with one type only, or with a type the graph lacks
    (PyG skips it: one conv runs; a review found that case crashed); aggr="mean" stays conv by
    conv, exact all the same."""
    calls = _counted(monkeypatch, spread_to)
    dense_calls = []
    apply = convert_dense.DenseGinSum.apply
    monkeypatch.setattr(convert_dense.DenseGinSum, "apply",
                        lambda *a: dense_calls.append(1) or apply(*a))
    monkeypatch.setattr(convert_module, "DenseGinSum", convert_dense.DenseGinSum)
    if form == "dense":
        monkeypatch.setattr(convert_module, "DENSE_SHARE", 0.0)
    first = next(iter(GRAPH))
    graph = {first: GRAPH[first]} if types == "graph_lacks_one" else GRAPH
    with _float64():
        fast = _check(HeteroGins("mean" if form == "mean" else "sum",
                                 [first] if types == "one" else None), graph, "mean_kept")
        forms = _forms(fast.explain(DELETED))
    want = {"delta": "delta*", "dense": "dense*", "mean": "delta"}[form]
    got = {k: v for k, v in forms.items() if k.startswith("convs.")}
    assert len(got) == 2 * (len(GRAPH) if types == "both" else 1), forms
    assert set(got.values()) == {want}, forms
    if form != "dense":  # (convert's first-call check runs a small batch of its own, delta)
        assert (calls["sums"] > 0) == (form == "delta")
    assert bool(dense_calls) == (form == "dense")  # the dense sum ran fused


@pytest.mark.parametrize("budget, want", [
    (0, [(0, 1), (1, 2), (2, 3), (3, 4)]),  # one sample at a time
    (5, [(0, 2), (2, 3), (3, 4)]),  # 2 + 3 rows; then 9 alone (over the budget); then 4
    (9, [(0, 2), (2, 3), (3, 4)]),
    (100, [(0, 4)])])
def test_samples_are_grouped_by_their_rows(budget, want):
    u_off = [0, 2, 5, 14, 18]  # rows per sample: 2, 3, 9, 4
    assert convert_dense.sample_groups(u_off, 0, 4, budget) == want
    assert convert_dense.sample_groups(u_off, 1, 3, 100) == [(1, 3)]  # a worker's samples only

