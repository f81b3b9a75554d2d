"""nodemask.convert_dense.DeltaGinSum: a delta layer's sum over edge types of GIN-MLPs a sample at a
time on a CPU, exact against the per-sample reference (float64, outputs and every gradient) and
against the conv-by-conv form; conv by conv wherever it does not apply (another MLP, a mode
watching, a GPU)."""
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch_geometric.nn.aggr import AttentionalAggregation

from test_convert import DELETED, F_IN, GRAPH, H, N, GinMlpSums, _check, _float64, _forms
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


@pytest.mark.parametrize("spread_to", [1, 3])
@pytest.mark.parametrize("kind", ["relu", "mean", "nobias", "pyg", "inplace", "tanh", "widths"])
def test_a_delta_sum_of_gin_mlps_is_fused_and_exact(monkeypatch, kind, spread_to):
    """Where a layer is delta, a sum of its GIN-MLPs over the edge types runs a sample at a time
    (one worker, or three side by side): exact, outputs and every gradient, at a hub, a leaf, an
    isolated gene, two adjacent genes and a sample that deletes nothing (no changed rows of any
    type); explain marks its convs ``delta*``. Another MLP (``tanh``, ``widths``) is computed conv
    by conv, exact all the same."""
    calls = _counted(monkeypatch, spread_to)
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
    assert plan.delta_sums
    cpu = fast._live_dense_sums(plan, torch.device("cpu"))[0]
    cuda = fast._live_dense_sums(plan, torch.device("cuda"))[0]
    assert sum(isinstance(k, tuple) for k in cpu) == len(plan.delta_sums) == 2
    assert not any(isinstance(k, tuple) for k in cuda)
