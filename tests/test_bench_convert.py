"""The benchmark's convert section (tiny sizes, no timing thresholds): its forms are exact on the
bench's small graph (the TorchCell-shaped encoder against its masked copies in float64, the
workbook's model against its hand-written delta form on kept genes), its record round-trips
JSON (an older result without it still loads), and the CLI lines and the report's tables show it
labelled (the floor's line computed, the rest measured; where the converted step's time goes,
part by part, beside each part's floor)."""
import json

import pytest
import torch

from workbook_lib.results.bench import BenchResult
from workbook_lib.strategies import build_ctx, make_strategy
from workbook_lib.strategies.model import PerturbGIN
from workbook_lib.studies.mask_cost.bench import replicated_plan
from workbook_lib.studies.mask_cost.convert_bench import (convert_section, exact_errors,
                                                          masked_step)

from conftest import make_graph

PERT = torch.tensor([[0, 3, -1], [5, 6, 7], [-1, -1, -1], [29, 1, -1]])


@pytest.fixture(scope="module")
def graph():
    return make_graph(num_genes=30, types={"a": 80, "b": 40, "c": 20}, seed=5)


@pytest.mark.parametrize("aggr", ["sum", "mean"])
def test_the_converted_forms_are_exact(graph, aggr):
    errs = exact_errors(graph, PERT, hidden=8, layers=3, aggr=aggr, seed=0)
    assert errs["torchcell_converted"] < 1e-12  # float64
    assert errs["own_converted"] < 1e-5  # float32, the hand-written kernels' type


def test_rel_error_reads_a_rounding_zero_reference_against_the_largest_value():
    from workbook_lib.studies.mask_cost.convert_bench import rel_error
    big, zero = torch.tensor([1.0, -4.0]), torch.tensor([3e-16])
    assert rel_error([big, torch.tensor([4e-16])], [big, zero]) < 1e-12  # rounding: equal
    assert rel_error([big, torch.tensor([1e-3])], [big, zero]) > 1e-4  # not rounding
    # a small reference that is not zero keeps its own scale: off by itself is off by 100%
    assert rel_error([big, torch.tensor([2e-3])], [big, torch.tensor([1e-3])]) == 1.0
    assert rel_error([big * 1.001], [big]) == pytest.approx(1e-3, rel=1e-3)


def test_the_masked_copies_are_the_per_sample_graphs(graph):
    """Sample b of the masked step equals the model run on graph_b alone (B = 1)."""
    from workbook_lib.studies.mask_cost.convert_bench import TorchCellModel

    m = TorchCellModel(30, graph.edge_types, 8, 2, seed=0).double()
    batched = masked_step(m, graph.edge_index, PERT, 30)[1]()
    alone = torch.cat([masked_step(m, graph.edge_index, PERT[i:i + 1], 30)[1]()
                       for i in range(len(PERT))])
    torch.testing.assert_close(batched, alone)


def _probe(macs: float):
    a = torch.randn(60, 60)
    return (lambda: a @ a), macs


@pytest.fixture(scope="module")
def bench(graph):
    from conftest import ROOT
    from workbook_lib.configs.validation import load_params_file

    ci_params = load_params_file(ROOT / "params" / "ci.yaml")
    p = ci_params.replace(hidden=8, layers=3, min_repeats=3, warmup=0, time_budget_s=0.02,
                          precision_target=0.9, bench_replicated_max_batch=2)
    model = PerturbGIN(30, graph.edge_types, hidden=8, layers=3, seed=0)
    strat = make_strategy("node_mask_shared", graph, aggr=p.aggr, device="cpu")

    def own_step():
        model.zero_grad(set_to_none=True)
        strat.predict(model, build_ctx(strat, PERT)).sum().backward()
    conv = convert_section(p, graph, torch.device("cpu"), pert=PERT, own_model=model,
                           own_step=own_step, machine={"sparse_gmacs": 1.0, "dense_gmacs": 2.0,
                                                       "sparse_source": "s",
                                                       "dense_source": "d"},
                           masked_plan=replicated_plan(4, 1e6, 1e9, 2),
                           probes={"sparse": _probe(2e6), "dense": _probe(3e6),
                                   "dense_shaped": _probe(1e6)})
    b = BenchResult("cpu", {"edges": 140, "hidden": 8, "layers": 3, "k": 3}, False, {}, {},
                    None, None, None, 0.0, convert=conv)
    return BenchResult.from_json(json.loads(json.dumps(b.to_json())))


def test_the_section_round_trips_and_labels_its_batches(bench):
    c = bench.convert
    assert set(c.forms) == {"torchcell_masked", "torchcell_converted", "own_converted",
                            "own_handwritten", "few_reach_masked", "few_reach_converted"}
    assert c.forms["torchcell_converted"].batch_size == 4
    assert c.forms["torchcell_masked"].batch_size == 2  # bench_replicated_max_batch
    assert "bench_replicated_max_batch = 2" in c.forms["torchcell_masked"].batch_reason
    assert c.masked_vs_converted.n == c.rounds and c.converted_vs_handwritten is not None
    assert c.floor.batch_size == 4 and c.floor_seconds > 0
    assert c.to_floor() == pytest.approx(c.forms["torchcell_converted"].median / c.floor_seconds)
    assert c.loop.batch_size == 4 and c.loop.n >= 3 and "back to back" in c.loop.label
    assert c.loop_to_floor() == pytest.approx(c.loop.median / c.floor_seconds)
    assert c.floor_same_rounds.n == c.rounds
    assert set(c.round_rates) == {"sparse", "dense", "dense_shaped"}
    assert c.round_rates["sparse"].n == c.rounds and c.round_rates["sparse"].median > 0
    # the floor's dense work at its layer shape's rate: per round, the step over the floor
    # priced at that round's sparse and layer-shaped rates (not the large matmul's)
    assert c.floor_shaped_rounds.n == c.rounds
    conv, rr = c.steps["torchcell_converted"].samples, c.round_rates

    def per_round(dense):
        return [t / 4 / c.floor.seconds_at(s, d)
                for t, s, d in zip(conv, rr["sparse"].samples, rr[dense].samples)]
    assert c.floor_shaped_rounds.samples == pytest.approx(per_round("dense_shaped"))
    assert c.floor_same_rounds.samples == pytest.approx(per_round("dense"))
    assert per_round("dense_shaped") != pytest.approx(per_round("dense"))
    assert c.exact_max_rel_error["torchcell_converted"] < 1e-12
    assert "convs.2" in c.explain and c.few_reach_edges_per_type == 3
    # where the converted step's time goes: its parts, each beside the floor parts it covers
    assert c.parts.steps == 3 and c.parts.step_s > 0 and not c.parts.synchronized
    assert "plan (host)" in c.parts.parts and any(lb.endswith("*") for lb in c.parts.parts)
    booked = sorted(n for r in c.part_rows for n in r.floor_parts)
    assert booked == sorted(c.floor.parts) and c.part_rows[-1].label.startswith("rest")


def test_an_older_section_without_its_parts_shows_no_part_table(bench):
    from workbook_lib.report import mask_cost_view as view
    from workbook_lib.report.bench_text import convert_lines

    data = bench.to_json()
    del data["convert"]["parts"], data["convert"]["part_rows"]
    older = BenchResult.from_json(data)
    assert older.convert.parts is None and older.convert.part_rows == []
    assert "step's time goes" not in "\n".join(convert_lines(older))
    assert "No per-part times" in view.convert_parts_table(older).data


def test_an_older_section_without_the_shaped_floor_shows_no_such_line(bench):
    from workbook_lib.report import mask_cost_view as view
    from workbook_lib.report.bench_text import convert_lines

    data = bench.to_json()
    del data["convert"]["floor_shaped_rounds"]
    del data["convert"]["round_rates"]["dense_shaped"]
    older = BenchResult.from_json(data)
    assert older.convert.floor_shaped_rounds is None
    assert "layer shape" not in "\n".join(convert_lines(older))
    assert "layer shape" not in view.convert_table(older).to_html()
    assert "its floor at each round's rates" in "\n".join(convert_lines(older))


def test_the_layer_shaped_probe_times_a_linear_maps_three_products_per_block(monkeypatch):
    """The floor's three products per linear map (forward, the gradient at its input, the
    weight's), each worker on its own block of ROWS rows SHAPED_BLOCKS times on a CPU, one
    product each over every row where the form runs one block (a GPU's rule, stood in for)."""
    from workbook_lib.nodemask import convert_dense, workers as workers_mod
    from workbook_lib.nodemask.convert_dense import ROWS
    from workbook_lib.studies.mask_cost import rates
    from workbook_lib.studies.mask_cost.rates import SHAPED_BLOCKS, shaped_dense_probe

    calls = []
    real = torch.addmm

    def counting(*a, **kw):
        calls.append(a[1].shape)
        return real(*a, **kw)
    monkeypatch.setattr(torch, "addmm", counting)
    k = max(1, workers_mod.workers(torch.device("cpu"), 2 * SHAPED_BLOCKS))
    fn, macs = shaped_dense_probe("cpu", 8, rows=10**6)
    fn()
    assert macs == 3 * k * SHAPED_BLOCKS * ROWS * 8 * 8
    assert calls == [(ROWS, 8)] * (k * SHAPED_BLOCKS)  # each block ROWS rows, not the batch's
    calls.clear()
    monkeypatch.setattr(convert_dense, "block_rows", lambda dev, rows: rows)  # one block
    monkeypatch.setattr(workers_mod, "workers", lambda dev, blocks: 1)
    fn, macs = shaped_dense_probe("cpu", 8, rows=100)
    fn()
    assert macs == 3 * 100 * 8 * 8 and calls == [(100, 8)]
    with pytest.raises(ValueError, match="rows must be positive"):
        rates.shaped_dense_probe("cpu", 8, rows=0)


def test_an_older_result_without_the_section_loads():
    data = BenchResult("cpu", {}, False, {}, {}, None, None, None, 0.0).to_json()
    del data["convert"]
    assert BenchResult.from_json(data).convert is None


def test_the_cli_and_the_report_show_the_section(bench):
    from workbook_lib.report import mask_cost_view as view
    from workbook_lib.report.bench_text import convert_lines

    lines = "\n".join(convert_lines(bench))
    assert "TorchCell-shaped, B masked copies" in lines and "the converted [IQR" in lines
    assert "its floor (computed)" in lines and "the hand-written [IQR" in lines
    assert "converted, back to back" in lines and lines.count("its floor's computed time") == 2
    assert "its floor at each round's rates" in lines and "(same rounds; rates sparse" in lines
    assert "beside the step (same rounds)" in view.convert_table(bench).to_html()
    assert "its floor, dense work at its layer shape's rate" in lines
    assert "its layer shape's dense rate" in lines
    html = view.convert_table(bench).to_html()
    assert "the rate a linear map's three products reach at the encoder's own layer" in html
    assert "workbook's model, converted" in html and "computed" in html
    assert "where the converted TorchCell-shaped step's time goes (B = 4)" in lines
    assert "x its floor" in lines and "plan (host)" in lines
    parts_html = view.convert_parts_table(bench).to_html()
    assert "Where the converted TorchCell-shaped step" in parts_html and "rest (" in parts_html


def test_a_kernel_bound_figure_is_named_with_the_way_out(bench):
    """A step whose CPU time was mostly the kernel's, faulting pages (the masked copies under
    glibc's default allocator at the real spec, measured: an 8.8 s step of 14.8 CPU seconds,
    5.9 of them the kernel's, 1.9 million faults), is named in the CPU lines with how to keep freed memory; the
    same figures computing, or a record without them, are not."""
    import dataclasses

    from workbook_lib.report.bench_text import cpu_lines
    from workbook_lib.results.cpu import CpuShare

    def with_cpu(**kw):
        cpu = CpuShare(wall_s=8.8, cpu_s=14.8, threads=2, allowed=2, intervals=1, run_s=14.8,
                       wait_s=0.1, **kw)
        steps = {k: dataclasses.replace(st, cpu=cpu) for k, st in bench.convert.steps.items()}
        return dataclasses.replace(bench, steps={}, convert=dataclasses.replace(
            bench.convert, steps=steps))

    faulting = "\n".join(cpu_lines(with_cpu(system_s=5.9, page_faults=1_900_000)))
    assert "KERNEL: convert: torchcell_masked" in faulting and "MALLOC_MMAP_MAX_=0" in faulting
    assert "40% of its CPU time in the kernel, 1,900,000 page faults per call" in faulting
    computing = "\n".join(cpu_lines(with_cpu(system_s=0.45, page_faults=45_000)))
    assert "KERNEL" not in computing and "3% of its CPU time in the kernel" in computing
    assert "KERNEL" not in "\n".join(cpu_lines(with_cpu()))


def test_the_floor_at_each_rounds_rates_follows_the_rounds():
    """Per round, the converted sample over its floor priced at that round's probe rates: a
    machine that slows down in one round moves the step and the rates together, and the ratio
    stays; a step that is slower than its floor by itself shows it; without both probes there is
    no figure."""
    from workbook_lib.results.floor import ConvertFloor, FloorPart
    from workbook_lib.results.stat import Stat
    from workbook_lib.studies.mask_cost.convert_bench import floor_in_rounds

    floor = ConvertFloor(batch_size=2, num_nodes=10,
                         parts={"l": FloorPart(sparse_macs=2e9, dense_macs=4e9, bytes=0.0)})
    probes = {"sparse": (None, 1e9), "dense": (None, 4e9)}  # 1 GMAC in 1 s: 1 GMAC/s

    def stats(conv, sparse_t, dense_t):
        return {"torchcell_converted": Stat.from_samples(conv),
                "rate_sparse": Stat.from_samples(sparse_t),
                "rate_dense": Stat.from_samples(dense_t)}
    # per sample: 1e9 sparse at 1 GMAC/s (1 s) + 2e9 dense at 2 GMAC/s (1 s) = 2 s; a step of
    # 2 samples at 6 s is 3 s per sample: 1.5x; the second round half as fast throughout
    same, rates = floor_in_rounds(floor, stats([6.0, 12.0], [1.0, 2.0], [2.0, 4.0]), probes, 2)
    assert same.samples == pytest.approx([1.5, 1.5]) and same.n == 2
    assert rates["sparse"].samples == pytest.approx([1.0, 0.5])
    assert rates["dense"].samples == pytest.approx([2.0, 1.0])
    # the rates hold, the step alone slows in the second round: the ratio says so
    same, _ = floor_in_rounds(floor, stats([4.0, 8.0], [1.0, 1.0], [2.0, 2.0]), probes, 2)
    assert same.samples == pytest.approx([1.0, 2.0])
    assert floor_in_rounds(floor, stats([4.0], [1.0], [2.0]), {"sparse": probes["sparse"]},
                           2) == (None, {})
    # the dense work priced at the layer-shaped probe's rate instead: 2e9 dense at 1 GMAC/s
    # (2 s) + 1 s sparse = 3 s per sample, so the same 3 s sample is 1.0x, where the large
    # matmul's rate put it at 1.5x; without that probe, no figure
    shaped = {**probes, "dense_shaped": (None, 4e9)}
    st = stats([6.0, 12.0], [1.0, 2.0], [2.0, 4.0]) | {
        "rate_dense_shaped": Stat.from_samples([4.0, 8.0])}
    ratio, rates = floor_in_rounds(floor, st, shaped, 2, "dense_shaped")
    assert ratio.samples == pytest.approx([1.0, 1.0]) and set(rates) == {"sparse", "dense_shaped"}
    assert rates["dense_shaped"].samples == pytest.approx([1.0, 0.5])
    assert floor_in_rounds(floor, st, probes, 2, "dense_shaped") == (None, {})


def test_a_drift_between_the_rates_and_the_rounds_is_named(bench):
    """The ratio at the rates measured first and at each round's own rates: apart by more than
    the latter's IQR, a DRIFT line names both; together, none."""
    import dataclasses

    from workbook_lib.report.bench_text import floor_drift
    from workbook_lib.results.stat import Stat

    c = bench.convert
    first = c.to_floor()
    agree = dataclasses.replace(c, floor_same_rounds=Stat.from_samples([first * 0.98, first,
                                                                         first * 1.02]))
    assert floor_drift(agree) == ""
    apart = dataclasses.replace(c, floor_same_rounds=Stat.from_samples([first * 1.5] * 3))
    line = floor_drift(apart)
    assert line.startswith("DRIFT:") and f"{first:.3g}x its floor" in line
    assert f"{first * 1.5:.3g}x [IQR 0]" in line
    assert floor_drift(dataclasses.replace(c, floor_same_rounds=None)) == ""
    from workbook_lib.report import mask_cost_view as view  # the report's caption says it too
    assert "DRIFT:" in view.convert_table(dataclasses.replace(bench, convert=apart)).to_html()
    assert "DRIFT:" not in view.convert_table(dataclasses.replace(bench, convert=agree)).to_html()
    # 20% apart: within a wide IQR, no line; with a narrow one (over 10% apart), a line
    wide = Stat.from_samples([first * 0.9, first * 1.2, first * 1.5])
    narrow = Stat.from_samples([first * 1.19, first * 1.2, first * 1.21])
    assert floor_drift(dataclasses.replace(c, floor_same_rounds=wide)) == ""
    assert floor_drift(dataclasses.replace(c, floor_same_rounds=narrow)).startswith("DRIFT:")
