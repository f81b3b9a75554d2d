"""The benchmark's derived figures: the replicated form amortised at the shared form's batch,
and achieved multiply-add rates read from one profiled step."""
import pytest
import torch

from workbook_lib.studies.mask_cost.bench import amortised
from workbook_lib.studies.mask_cost.rates import achieved_rates
from workbook_lib.measurement.timing import Stat
from workbook_lib.nodemask.kernels import MOVE_TAG, dense_inside, sparse_range


def test_amortised_follows_the_per_step_line():
    # t(B) = a + b B with a = 0.5 s per step (a wildtype pass), b = 2 s per sample
    t1 = Stat.from_samples([2.5, 2.6, 2.4])
    t2 = Stat.from_samples([4.5, 4.6, 4.4])
    st = amortised(t1, t2, 28)
    assert st.median == pytest.approx(0.5 / 28 + 2.0)
    # the B = 2 figure carried a quarter second per sample more than that
    assert t2.median / 2 - st.median == pytest.approx(0.25 - 0.5 / 28)
    # a per-step cost that does not exist gives B = 1's figure at every batch
    flat = amortised(Stat.from_samples([2.0, 2.0]), Stat.from_samples([4.0, 4.0]), 28)
    assert flat.median == pytest.approx(2.0)
    assert amortised(t1, None, 28).median == t1.median
    with pytest.raises(ValueError, match="same rounds"):
        amortised(t1, Stat.from_samples([1.0]), 28)


def test_achieved_rates_count_the_products_of_the_step(capfd, monkeypatch):
    monkeypatch.setenv("WORKBOOK_PROGRESS", "1")  # as a terminal run: native stderr passed on
    g = torch.Generator().manual_seed(0)
    a = torch.rand(300, 300, generator=g)
    a = (a * (a > 0.9)).to_sparse_csr()
    x = torch.randn(300, 32, generator=g)
    w1, w2 = torch.randn(32, 48, generator=g), torch.randn(64, 32, generator=g)
    nnz = int(a._nnz())

    def step():
        with sparse_range(nnz * 32):
            dense_inside(1000)  # dense work done inside the sparse kernel: counted, not timed
            y = torch.sparse.mm(a, x)
        with torch.profiler.record_function(MOVE_TAG):  # rows moved by a product of ones
            torch.sparse.mm(a, x)
        return torch.relu(y @ w1).sum() + (w2 @ x.T).sum()
    machine = {"sparse_gmacs": 5.0, "sparse_source": "k", "dense_gmacs": 50.0}
    rates = {f.kind: f for f in achieved_rates(step, "cpu", "s", machine)}
    assert rates["sparse"].macs == nnz * 32  # the sparse mm inside the range is not dense
    assert rates["dense"].macs == 300 * 32 * 48 + 64 * 32 * 300  # not the moved rows
    assert rates["dense"].inside_macs == 1000 and rates["sparse"].inside_macs == 0
    assert rates["dense"].step_macs == rates["dense"].macs + 1000
    for f in rates.values():
        assert 0 < f.seconds <= f.step_seconds
        assert f.gmacs == pytest.approx(f.macs / f.seconds / 1e9)
    assert "USDT" not in capfd.readouterr().err  # the profiler's probe lines stay off it
    assert rates["dense"].machine_gmacs == 50.0 and rates["sparse"].machine_source == "k"
    # a step without sparse products reports none
    assert [f.kind for f in achieved_rates(lambda: x @ w1, "cpu", "s", {})] == ["dense"]


def _bench_with(ratio_samples, layers=3, run_layers=None):
    from workbook_lib.results.bench import BenchResult

    return BenchResult(run_layers=run_layers, device="cpu", sizes={"layers": layers}, full_size=True, per_sample_s={},
                       steps={}, ratio_vs_lazy_form=None, ratio_vs_sparse_form=None,
                       passes_per_sample=None, exact_max_rel_error=0.0,
                       ratio_vs_full_form=Stat.from_samples(ratio_samples, unit="ratio"))


def test_recommended_form_follows_the_measured_ratio():
    from workbook_lib.studies.mask_cost.bench import recommended_form

    assert recommended_form(_bench_with([2.9, 3.1, 3.0])).middle == "delta"
    slower = recommended_form(_bench_with([0.7, 0.8, 0.75]))
    assert slower.middle == "full" and slower.measured and "1.33x" in slower.reason
    same = recommended_form(_bench_with([0.98, 1.01, 0.99], layers=2))
    assert same.middle == "delta" and "same computation" in same.reason
    # the benchmark measured both forms at L = 3 for a 2-layer run: the run's fix takes the
    # plain path, and the form text says so beside the figure it measured for deeper models
    shallow = recommended_form(_bench_with([0.7, 0.8, 0.75], run_layers=2))
    assert shallow.middle == "delta" and not shallow.measured
    assert "2 layers" in shallow.reason and "plain path" in shallow.reason
    assert "0.75x" in shallow.reason and "at L = 3" in shallow.reason
    deep = recommended_form(_bench_with([0.7, 0.8, 0.75], run_layers=3))
    assert deep.middle == "full" and deep.measured
    none = recommended_form(None)
    assert none.middle == "delta" and not none.measured and "not measured here" in none.reason


@pytest.mark.parametrize("aggr", ["sum", "mean"])
def test_kernel_figures_mark_the_products_the_step_takes(aggr):
    """On a CPU the full middle layers take per-type slabs, and with sum aggregation the delta
    path's wildtype layers one stacked product: both are marked as the step's, and the push."""
    from conftest import make_graph
    from workbook_lib.studies.mask_cost.rates import kernel_figures
    from workbook_lib.nodemask import SharedGraph

    graph = make_graph(num_genes=20, types={"a": 40, "b": 20}, seed=1)
    sg = SharedGraph(graph.edge_index, graph.num_genes, aggr=aggr, kernel="slab")
    pert = torch.tensor([[0, 3], [5, -1]])
    figs = kernel_figures(sg, 2, 4, "cpu", target=1.0, max_time_s=2.0, pert=pert)
    used = {f.name for f in figs if f.used_by_step}
    stacked = {"slabs, stacked types"} if aggr == "sum" else set()
    assert used == {"slabs, per type", *stacked} | {f.name for f in figs
                                                    if f.name.startswith("push")}
