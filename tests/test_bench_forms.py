"""What the benchmark's figures say they are: the shared graph's labels name the path its step
took and the push kernel (a 2-layer step is plain, never "delta"); the replicated forms are
measured at the shared form's batch when the memory estimate fits, else quoted as measured at the
largest batch that ran, labelled with it, the projection from B = 1, 2 beside it with its error
at the largest batch measured; without numba the push
falls back to 'pull' with one warning, and the kernel is recorded."""

import pytest
import torch

from workbook_lib.studies.mask_cost.bench import (ReplicatedPlan, bench_layers, replicated_fit,
                                                  replicated_plan)
from workbook_lib.data.snapshots import CellGraph, content_checksum
from workbook_lib.measurement.timing import Stat
from workbook_lib.nodemask import NodeMaskBatch, compiled, delta
from workbook_lib.strategies import build_ctx, make_strategy
from workbook_lib.strategies.model import PerturbGIN

from conftest import make_graph

GB = 1e9


@pytest.fixture(scope="module")
def graph():
    g = make_graph(num_genes=20, types={"a": 60, "b": 30}, seed=5)
    return CellGraph("tiny", 20, g.edge_index, "test", content_checksum(20, g.edge_index))


# ----------------------------------------------------------------- the replicated forms' batch
def test_replicated_plan_measures_at_the_shared_batch_when_the_estimate_fits():
    p = replicated_plan(28, per_sample_bytes=0.5 * GB, budget=20 * GB, max_batch=64)
    assert p.at_compared and p.batches == (1, 2, 28) and "B = 28 fits" in p.rule


def test_replicated_plan_projects_when_the_estimate_does_not_fit():
    p = replicated_plan(28, per_sample_bytes=1.0 * GB, budget=10.5 * GB, max_batch=64)
    assert not p.at_compared and p.batches == (1, 2, 10)  # the largest fitting batch, to check
    assert "does not fit" in p.rule and "largest fitting B = 10" in p.rule
    capped = replicated_plan(28, per_sample_bytes=0.1 * GB, budget=20 * GB, max_batch=8)
    assert not capped.at_compared and capped.batches == (1, 2, 8)
    assert "bench_replicated_max_batch = 8" in capped.rule
    tiny = replicated_plan(28, per_sample_bytes=3 * GB, budget=2 * GB, max_batch=64)
    assert tiny.batches == (1,) and not tiny.at_compared  # not even B = 1 fits: tried anyway


def test_replicated_plan_small_compared_batches():
    assert replicated_plan(2, 1 * GB, 20 * GB, 64).batches == (1, 2)
    assert replicated_plan(1, 1 * GB, 20 * GB, 64).batches == (1, 2)


@pytest.mark.parametrize("kw", [dict(compared=0), dict(max_batch=0),
                                dict(per_sample_bytes=0.0), dict(budget=-1.0)])
def test_replicated_plan_refuses_bad_input(kw):
    args = dict(compared=7, per_sample_bytes=1.0, budget=10.0, max_batch=64) | kw
    with pytest.raises(ValueError, match="must be"):
        replicated_plan(**args)


def _steps(per_sample_ms: dict[int, float], rounds=5) -> dict[str, Stat]:
    """Steps of a replicated form whose per-sample cost grows with B (as measured: the
    per-sample feature table grows), a little noise per round."""
    out = {}
    for b, ms in per_sample_ms.items():
        out[f"rep@{b}"] = Stat.from_samples([b * ms * 1e-3 * (1 + 0.01 * i)
                                             for i in range(rounds)])
    return out


GROWING = {1: 150.0, 2: 155.0, 10: 300.0, 28: 567.2}  # ms per sample at each B


def test_fit_at_the_shared_batch_is_the_measurement_not_the_line():
    plan = ReplicatedPlan((1, 2, 28), 28, True, "B = 28 fits")
    fit = replicated_fit(_steps(GROWING), "rep", plan)
    assert fit.measured and fit.per_sample.median == pytest.approx(0.5672 * 1.02)
    # the line through B = 1 and 2 says 160 ms at B = 28: 0.28x the measurement, shown
    assert fit.projected.median == pytest.approx((2 * 0.150 - 2 * 0.155 + 28 * 0.155 * 2 - 28 *
                                                  0.150) / 28 * 1.02, rel=1e-6)
    assert fit.check_batch == 28 and fit.projection_error.median == pytest.approx(
        fit.projected.median / fit.per_sample.median, rel=1e-6)
    assert fit.projection_error.median < 0.5
    assert fit.basis == "measured at B = 28 (the shared form's batch)"
    assert "0.28x the measurement at B = 28" in fit.error_text


def test_fit_that_does_not_fit_is_quoted_as_measured_at_the_largest_batch():
    plan = ReplicatedPlan((1, 2, 10), 28, False, "B = 28 does not fit")
    fit = replicated_fit(_steps(GROWING), "rep", plan)
    # the figure quoted is B = 10's measurement, never the projection (0.54x of it here)
    assert not fit.measured and fit.quoted_batch == 10
    assert fit.per_sample.median == pytest.approx(0.300 * 1.02)
    assert fit.per_sample.median > 1.5 * fit.projected.median
    assert fit.basis.startswith("measured at B = 10, the largest batch that ran (B = 28 does "
                                "not fit)")
    assert fit.at_least and "rose from B = 2 to B = 10" in fit.basis and "at least" in fit.basis
    assert "same batch" not in fit.basis and "shared form's batch" not in fit.basis
    assert fit.short_basis == "measured at B = 10"
    # the projection beside it, labelled as one, with its error where measured
    assert fit.check_batch == 10 and fit.projection_error.median < 1.0  # underestimates
    assert fit.projection_text.startswith("projected from B = 1, 2 to B = 28")
    assert "at B = 10" in fit.projection_text
    # a per-sample cost that fell with B is quoted as measured, without "at least"
    falling = replicated_fit(_steps({1: 300.0, 2: 200.0, 10: 150.0}), "rep", plan)
    assert falling.quoted_batch == 10 and not falling.at_least
    assert "at least" not in falling.basis


def test_fit_falls_back_to_the_largest_measured_batch_when_the_planned_one_ran_out_of_memory():
    steps = _steps(GROWING)
    del steps["rep@28"]  # skipped: out of memory at B = 28
    fit = replicated_fit(steps, "rep", ReplicatedPlan((1, 2, 28), 28, True, "B = 28 fits"))
    assert not fit.measured and "did not run" in fit.rule and fit.quoted_batch == 2
    assert fit.per_sample.median == pytest.approx(0.155 * 1.02)
    assert fit.projection_error is None and "unknown" in fit.error_text
    only_b1 = replicated_fit({"rep@1": steps["rep@1"]}, "rep",
                             ReplicatedPlan((1,), 28, False, "B = 2 does not fit"))
    assert only_b1.basis.startswith("measured at B = 1, the largest batch that ran")
    assert not only_b1.at_least and "B = 2 did not run" in only_b1.projection_text
    assert replicated_fit({}, "rep", ReplicatedPlan((1,), 28, False, "")) is None


def test_a_projection_that_is_noise_says_so():
    steps = _steps({1: 150.0, 2: 70.0, 10: 300.0})  # B = 2's step faster than B = 1's
    fit = replicated_fit(steps, "rep", ReplicatedPlan((1, 2, 10), 28, False, "B = 28 does not "
                                                                             "fit"))
    assert fit.projected.median <= 0 and "the projection is noise" in fit.projection_text
    assert fit.per_sample.median > 0 and fit.quoted_batch == 10  # the measurement is quoted
    ok = replicated_fit(_steps(GROWING), "rep", ReplicatedPlan((1, 2, 10), 28, False, "x"))
    assert "noise" not in ok.projection_text


def _issue_bench(lazy_steps: dict[int, float], shared_ms: float = 18.27):
    """A real-spec benchmark as measured (issue 35): the Lazy form at B = 1, 2 and 8 (B = 28
    does not fit), the shared form at B = 28, five rounds."""
    from workbook_lib.results.bench import BenchResult

    rounds = 5
    shared = Stat.from_samples([shared_ms * 1e-3 * (1 + 0.002 * i) for i in range(rounds)],
                               unit="s/sample")
    steps = {f"rep@{b}": Stat.from_samples([t * (1 + 0.002 * i) for i in range(rounds)])
             for b, t in lazy_steps.items()}
    fit = replicated_fit(steps, "rep", ReplicatedPlan((1, 2, 8), 28, False,
                                                      "B = 28 does not fit"))
    fit.projected_ratio = fit.projected.ratio_to(shared, paired=True)
    ratio = fit.per_sample.ratio_to(shared, paired=True)
    return BenchResult(device="cpu", sizes={"layers": 3}, full_size=True, per_sample_s={},
                       steps={}, ratio_vs_lazy_form=ratio, ratio_vs_sparse_form=None,
                       passes_per_sample=None, exact_max_rel_error=0.0,
                       replicated={"replicated_gather_scatter": fit},
                       shared_form="delta, push numba")


def test_the_headline_quotes_the_measured_ratio_labelled_with_its_batch():
    """The issue's run: B = 8 measured 22.5 s per step (2.81 s per sample), the line through
    B = 1, 2 projects 0.50 s per sample at B = 28 (27.6x): the headline quotes 154x."""
    from workbook_lib.report.bench_text import replicated_ratio_text
    from workbook_lib.report import mask_cost_view as view

    b = _issue_bench({1: 1.109, 2: 1.590, 8: 22.5})
    text = replicated_ratio_text(b, "replicated_gather_scatter")
    assert text.startswith("at least 154x") and "Lazy form measured at B = 8" in text
    assert "projected from B = 1, 2 to B = 28: 27.6x, not quoted" in text
    assert "0.20x the measurement at B = 8" in text
    head = view.headline_bench_part(b)
    assert "at least 154x" in head and "measured at B = 8" in head and "27.6x" in head
    assert "154x" in view.bench_text(b).data
    # per-sample cost not rising from B = 2 to B = 8: the measurement, without "at least"
    flat = _issue_bench({1: 1.109, 2: 1.590, 8: 6.0})
    assert replicated_ratio_text(flat, "replicated_gather_scatter").startswith("41.1x")


def test_bench_layers_reaches_the_delta_form():
    assert bench_layers(2, 3) == 3
    assert bench_layers(4, 3) == 4
    assert bench_layers(2, 1) == 2


# ----------------------------------------------------------------- the shared graph's path
def _spy_step(graph, layers, middle, kernel, monkeypatch):
    """One training step of strategy 6; returns (its path label, delta layers run, kernels
    pushed with)."""
    calls = {"delta": 0, "kernels": []}
    real_delta, real_pooled = NodeMaskBatch.delta_layer, NodeMaskBatch.delta_pooled_layer
    real_push, real_push_pooled = delta.push, delta.push_pooled

    def spy_delta(self, *a, **k):
        calls["delta"] += 1
        return real_delta(self, *a, **k)

    def spy_delta_pooled(self, *a, **k):
        calls["delta"] += 1
        return real_pooled(self, *a, **k)

    def spy_push(g, c, base, u, w, kernel=None, **kw):
        calls["kernels"].append(kernel)
        return real_push(g, c, base, u, w, kernel, **kw)

    def spy_push_pooled(g, c, base, u, w, pool, kernel=None, **kw):
        calls["kernels"].append(kernel)
        return real_push_pooled(g, c, base, u, w, pool, kernel, **kw)
    monkeypatch.setattr(NodeMaskBatch, "delta_layer", spy_delta)
    monkeypatch.setattr(NodeMaskBatch, "delta_pooled_layer", spy_delta_pooled)
    monkeypatch.setattr("workbook_lib.nodemask.batch.push", spy_push)
    monkeypatch.setattr("workbook_lib.nodemask.batch.push_pooled", spy_push_pooled)
    model = PerturbGIN(graph.num_genes, graph.edge_types, hidden=4, layers=layers, seed=1)
    s = make_strategy("node_mask_shared", graph, aggr="sum", middle=middle, push_kernel=kernel)
    pert = torch.tensor([[0, 3], [5, -1], [7, 8]])
    s.predict(model, build_ctx(s, pert), dual=True).sum().backward()
    return s.path_label(layers), calls


@pytest.mark.parametrize("layers,middle,label,deltas", [
    (2, "delta", "plain 2-layer (no middle layer)", 0),
    (2, "full", "plain 2-layer (no middle layer)", 0),
    (3, "delta", "delta, push pull", 1),
    (3, "full", "full middle layers", 0),
    (4, "delta", "delta, push pull", 1)])
def test_the_label_names_the_path_the_step_took(graph, layers, middle, label, deltas,
                                                monkeypatch):
    got, calls = _spy_step(graph, layers, middle, "pull", monkeypatch)
    assert got == label and calls["delta"] == deltas
    assert calls["kernels"] == (["pull"] if deltas else [])  # the kernel the label names


def test_path_refuses_a_model_without_layers(graph):
    with pytest.raises(ValueError, match="'num_layers' must be at least 1"):
        make_strategy("node_mask_shared", graph).path(0)


# ----------------------------------------------------------------- the push kernel
def test_the_push_is_compiled_on_a_cpu_and_index_add_on_cuda(graph, monkeypatch):
    assert delta.default_push_kernel("cpu") == "numba"
    assert delta.default_push_kernel(torch.device("cuda")) == "index_add"
    label, calls = _spy_step(graph, 3, "delta", None, monkeypatch)
    assert label == "delta, push numba" and calls["kernels"] == ["numba"]
    label, calls = _spy_step(graph, 3, "delta", "pull", monkeypatch)  # asked for: no fallback
    assert label == "delta, push pull" and calls["kernels"] == ["pull"]


def test_bench_records_its_kernel_in_results_table_and_report(ci_params):
    """The whole benchmark (tiny sizes): the push kernel is in its results, its labels, the CLI
    table and the report's table and text; the replicated forms measured or projected."""
    from workbook_lib.studies.mask_cost.bench import run_bench
    from workbook_lib.report.bench_text import summary_lines
    from workbook_lib.results.bench import BenchResult
    from workbook_lib.report import mask_cost_view as view

    p = ci_params.replace(min_repeats=3, time_budget_s=0.02, precision_target=0.9, hidden=8,
             warmup=0, bench_replicated_max_batch=2)  # B = 4 not allowed: projected
    b = run_bench(p, full_size=False, device="cpu")
    b = BenchResult.from_json(b.to_json())  # what the results file keeps
    assert b.push_kernel == "numba" and b.sizes["layers"] == 3 and b.run_layers == 2
    assert b.shared_form == "delta, push numba"
    assert b.per_sample_s["shared"].label == f"6 node-mask shared graph [{b.shared_form}]"
    assert "full middle layers" in b.per_sample_s["shared_full"].label
    assert "delta push kernel: numba" in summary_lines(b)[0]
    assert "delta push kernel numba" in view.bench_table(b).to_html()
    assert "delta, push numba" in view.bench_text(b).data
    assert any(k.name == "push, numba" for k in b.kernels)
    # the fastest kernel and the dense matmul timed again in the convert section's rounds
    assert b.convert.floor_same_rounds.n == b.convert.rounds
    assert set(b.convert.round_rates) == {"sparse", "dense", "dense_shaped"}
    assert b.convert.floor_shaped_rounds.n == b.convert.rounds
    rep = b.replicated["replicated_gather_scatter"]
    assert not rep.measured and "bench_replicated_max_batch = 2" in rep.rule
    assert "measured at B = 2" in view.bar_label(b, "replicated_gather_scatter")
    assert b.per_sample_s["replicated_gather_scatter"].batch_size == 2
    assert b.per_sample_s["replicated_gather_scatter"].batch_reason.startswith(
        "measured at B = 2, the largest batch that ran")
    assert "Lazy form measured at B = 2" in view.headline_bench_part(b)
    assert "projected from B = 1, 2 to B = 4" in view.headline_bench_part(b)
