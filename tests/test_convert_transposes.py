"""A delta group's row-block transposes: a plan for an encoder on a CPU makes none (its backward
scatters through the rows); a watched forward (the GPU's path on a CPU) makes them from the
plan's CSR; a plan for a GPU makes them with the push; a backward that builds a graph makes
them from the product's CSR. Every way the same matrices; watched or not, the same results; a
second derivative through a group, the reference's."""
import torch
from torch.overrides import TorchFunctionMode

from workbook_lib.nodemask import convert

from test_convert import DELETED, F_IN, GRAPH, N, Encoder, GinMlpSums
from test_convert_second_order import _second

convert_module = __import__("sys").modules["workbook_lib.nodemask.convert"]


class _Watch(TorchFunctionMode):
    """Watches every operator and changes none (as the sync counter does)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _groups(plan) -> list:
    return [(("g", id(src)), sizes) for src, (_, sizes) in plan.groups.items()]


def _dense_transposes(plan, g, sizes) -> list:
    """Each row block of the group's host CSR, transposed, as dense matrices."""
    a = torch.sparse_csr_tensor(*(plan.index[g + ("a", s)] for s in ("crow", "col", "val")),
                                plan.index[g + ("a", "shape")]).to_dense()
    return [blk.t() for blk in a.split(sizes)]


def _at(plan, g, j, rows, cols) -> torch.Tensor:
    return torch.sparse_csr_tensor(*(plan.index[g + ("at", j, s)] for s in ("crow", "col", "val")),
                                   (rows, cols)).to_dense()


def test_a_cpu_plan_makes_no_transposes_and_a_watched_forward_makes_the_same_as_a_gpus(
        monkeypatch):
    torch.manual_seed(0)
    enc = GinMlpSums("relu").double()
    fast = convert(enc, GRAPH, readout="mean_kept")
    x = torch.randn(N, F_IN, dtype=torch.float64, requires_grad=True)
    params = list(enc.parameters()) + [x]
    results = []
    for watch in (False, True):
        fast.clear_plan()
        with _Watch() if watch else torch.enable_grad():
            out = fast(x, DELETED)
            results.append((out.detach(), torch.autograd.grad(out.square().sum(), params)))
        plan = fast.plan(DELETED, N)
        groups = _groups(plan)
        assert groups and not plan.transposes
        made = [convert_module._has_transposes(plan, g, len(s)) for g, s in groups]
        assert made == [watch] * len(groups)  # made by the watched forward only
    watched_plan = plan
    (o0, g0), (o1, g1) = results
    torch.testing.assert_close(o1, o0, rtol=1e-12, atol=1e-13)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
    # a plan for an encoder on a GPU: the push makes the transposes (not run here: planned only)
    monkeypatch.setattr(type(fast), "_device", lambda self: torch.device("cuda"))
    fast.clear_plan()
    gpu_plan = fast.plan(DELETED, N)
    assert gpu_plan.transposes
    for (g, sizes), (gw, _) in zip(_groups(gpu_plan), _groups(watched_plan)):
        for part in ("crow", "col", "val"):  # the product itself: the same arrays either way
            want, got = gpu_plan.index[g + ("a", part)], watched_plan.index[gw + ("a", part)]
            assert want.dtype == got.dtype and torch.equal(want, got), part
        ncol = gpu_plan.index[g + ("a", "shape")][1]
        for j, want in enumerate(_dense_transposes(gpu_plan, g, sizes)):
            assert want.abs().sum() > 0
            assert torch.equal(_at(gpu_plan, g, j, ncol, sizes[j]), want)
            assert torch.equal(_at(watched_plan, gw, j, ncol, sizes[j]), want)


def test_a_backward_that_builds_a_graph_through_a_delta_group_makes_its_transposes(monkeypatch):
    """create_graph=True on a CPU (no transposes in the plan): the group product's backward
    makes them from its CSR; the second-order gradient equals the reference's (float64)."""
    made = []
    real = convert_module._block_transposes
    monkeypatch.setattr(convert_module, "_block_transposes",
                        lambda a, sizes: made.append(len(sizes)) or real(a, sizes))
    torch.manual_seed(0)
    enc = Encoder("graph_add", "hetero", "linear").double()
    fast = convert(enc, GRAPH)
    x = torch.randn(N, F_IN, dtype=torch.float64, requires_grad=True)
    _, got = _second(fast, x, GRAPH, None, True)
    _, want = _second(enc, x, GRAPH, None, False)
    assert made and not fast.plan(DELETED, N).transposes
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
