"""CUDA paths driven from the CPU where the same code runs: the pipelined step's syncs, the loss
tolerance on CUDA, the CUDA-event comm timing (skipped without CUDA), the fix's delta step with
its GPU structure."""
import pytest
import torch

from workbook_lib.studies.adoption import loss_tolerance
from workbook_lib.measurement import timing
from workbook_lib.measurement.precision import float32_tolerance


def _count_syncs(monkeypatch, synced: bool) -> tuple[int, dict]:
    calls = []
    monkeypatch.setattr(timing, "sync", lambda dev: calls.append(dev))
    clock = timing.StepClock("cpu")
    with clock.step(timed=True):
        for name in ("h2d", "forward", "backward"):
            with clock.stage(name, synced):
                pass
    return len(calls), clock.steps[0]


def test_pipelined_step_syncs_only_at_its_start_and_end(monkeypatch):
    n_synced, rec = _count_syncs(monkeypatch, True)
    assert n_synced == 2 + 2 * 3 and "forward" in rec
    n_piped, rec = _count_syncs(monkeypatch, False)
    assert n_piped == 2  # the step's own start and end: the device runs across its stages
    assert "forward" not in rec and "issue:forward" in rec  # never booked as the stage's time


def test_loss_tolerance_is_float32_rounding_on_cpu_and_derived_on_cuda():
    class G:
        num_genes = 1000
        edge_index = {"a": torch.stack([torch.arange(900), torch.zeros(900, dtype=torch.long)])}
    assert loss_tolerance("cpu: x (2 threads)", G, 3)[0] == 1e-5
    tol, basis = loss_tolerance("cuda: NVIDIA H100", G, 3)
    assert tol == float32_tolerance(G, 3, floor=1e-5) and tol > 1e-5 and "CUDA" in basis


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_comm_timer_times_cuda_work_with_events():
    """CUDA events bracket device work the host never waits for."""
    from workbook_lib.distributed.worker import CommTimer

    t = CommTimer(1, torch.device("cuda", 0))
    t.begin_step()
    t.calls.append(t._now())
    torch.cuda._sleep(50_000_000)
    t.done.append(t._now())
    (ready, finished), = t.bucket_seconds()
    assert finished - ready > 1e-3


def test_gpu_probes_never_overlap_on_one_gpu():
    """Two probes of one GPU: the second waits for the first's lock (driven without a GPU: the
    lock needs only the device's name); the CPU takes no lock."""
    import threading
    import time

    from workbook_lib.measurement.memory import gpu_lock

    spans = []

    def probe():
        with gpu_lock("cuda:7"):
            t0 = time.perf_counter()
            time.sleep(0.2)
            spans.append((t0, time.perf_counter()))
    ths = [threading.Thread(target=probe) for _ in range(2)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    (a0, a1), (b0, b1) = sorted(spans)
    assert b0 >= a1 - 1e-3  # one after the other
    with gpu_lock("cpu"):
        with gpu_lock("cpu"):  # no lock at all for the CPU: no deadlock
            pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_peak_is_the_reserved_memory_the_step_takes():
    from workbook_lib.measurement.memory import device_budget, peak_during

    dev = torch.device("cuda", 0)
    keep = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    del keep  # cached by the allocator: must not hide the next step's need
    got = peak_during(lambda: torch.empty(32 << 20, dtype=torch.uint8, device=dev), dev)
    assert got.bytes >= 32 << 20 and "max_memory_reserved" in got.method
    budget, label = device_budget(dev)
    assert 0 < budget <= torch.cuda.mem_get_info(dev)[1] and "mem_get_info" in label


def test_environment_keeps_the_device_of_the_jobs_that_used_one(tmp_path, monkeypatch):
    """SLURM: 03 ran on a GPU node, then 05 on a CPU node: the run stays labelled with the GPU
    job's device (each job keeps its own record)."""
    import json

    from workbook_lib.running.run_folder import write_environment
    from workbook_lib.running import environment
    from workbook_lib.configs.validation import load_params_file
    from pathlib import Path

    p = load_params_file(Path(__file__).resolve().parent.parent / "params" / "ci.yaml")
    real = environment.collect

    def fake(params, *, uses_device=True, run_level=False):
        rec = real(params, uses_device=uses_device, run_level=run_level)
        if uses_device:  # the GPU node's view
            rec.update(device="cuda:0", device_label="cuda: NVIDIA H100", created="2026-01-01T00:00:00")
        else:
            rec["created"] = "2026-01-01T01:00:00"  # later: the last job to finish
        return rec
    monkeypatch.setattr(environment, "collect", fake)
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    write_environment(tmp_path, p, ["03_data_vs_model_timing"], resume=True)
    monkeypatch.setenv("SLURM_JOB_ID", "102")
    write_environment(tmp_path, p, ["05_verdict"], resume=True)
    env = json.loads((tmp_path / "environment.json").read_text())
    assert env["device_label"] == "cuda: NVIDIA H100"
    assert [j["slurm_job_id"] for j in env["jobs"]] == ["101", "102"]
    assert sorted(f.name for f in (tmp_path / "environment").iterdir()) == ["101.json", "102.json"]
    # a CPU-only run stays labelled with what it ran on
    only = environment.merge_records([{"created": "1", "uses_device": False, "device": "cpu"}])
    assert only["device"] == "cpu"


def test_cpu_only_notebooks_do_not_need_the_gpu_named_in_params():

    from workbook_lib.configs.validation import validate
    from workbook_lib.running import environment

    if torch.cuda.is_available():
        pytest.skip("checks a node without a GPU")
    rec = environment.collect(validate({"device": "cuda"}), uses_device=False)
    assert rec["device"] == "cpu" and rec["uses_device"] is False
    from workbook_lib.exceptions import ParamsError
    with pytest.raises(ParamsError, match="no CUDA device"):
        environment.collect(validate({"device": "cuda"}), uses_device=True)


def test_a_cpu_only_notebook_runs_on_a_node_without_the_gpu(tmp_path):
    """01 and 05 (needs_device=False) run on the CPU when params name a GPU the node lacks;
    the others still refuse before any work."""
    from pathlib import Path

    from workbook_lib.exceptions import ParamsError
    from workbook_lib.running.notebook import setup
    from workbook_lib.configs.validation import load_params_file

    if torch.cuda.is_available():
        pytest.skip("checks a node without a GPU")
    p = load_params_file(Path(__file__).resolve().parent.parent / "params" / "ci.yaml")
    ns = {**p, "device": "cuda", "run_dir": str(tmp_path / "run")}
    assert setup(dict(ns), load_graph=False, needs_device=False).device.type == "cpu"
    with pytest.raises(ParamsError, match="no CUDA device"):
        setup(dict(ns), load_graph=False)


def test_exactness_report_runs_the_strategies_on_the_given_device(monkeypatch):
    """02's exactness re-check builds every strategy on the run's device (the reference stays on
    the CPU): a device argument that were ignored would leave them on the CPU."""
    from workbook_lib.studies.mask_cost import layers as benchmarks
    from workbook_lib.data.snapshots import induced_subgraph, load_snapshot
    from workbook_lib.configs.validation import load_params_file
    from pathlib import Path

    p = load_params_file(Path(__file__).resolve().parent.parent / "params" / "ci.yaml")
    small = induced_subgraph(load_snapshot(p), 40)
    seen = []
    real = benchmarks.make_strategy

    def spy(name, graph, **kw):
        seen.append(str(kw.get("device")))
        return real(name, graph, **{**kw, "device": "cpu"})  # run it where this machine can
    monkeypatch.setattr(benchmarks, "make_strategy", spy)
    monkeypatch.setattr(benchmarks, "_model_on", lambda m, dev: (seen.append(str(dev)), m)[1])
    got = benchmarks.exactness_report(small, ["node_mask_shared", "replicated_mask_cpu"], k=2,
                                      hidden=4, device="cuda:3")
    assert set(seen) == {"cuda:3"} and max(got.values()) < 1e-4


@pytest.mark.parametrize("aggr", ["sum", "mean"])
@pytest.mark.parametrize("layers", [3, 4])
def test_delta_step_as_it_runs_on_a_gpu_is_exact_and_sync_free(aggr, layers):
    """The fix's delta step with the structure it has on a GPU, driven on the CPU: the
    'index_add' push, and the corrections as ``Corrections.to('cuda')`` leaves them (without
    the CPU's backward tables, so every gather's backward is an index_add_). Outputs, prediction
    (dual forward) and every gradient equal the plain reference's; the step makes no host sync."""
    import dataclasses

    from conftest import make_graph
    from workbook_lib.data.snapshots import CellGraph, content_checksum
    from workbook_lib.measurement.syncs import SyncCounter
    from workbook_lib.nodemask.corrections import Corrections
    from workbook_lib.strategies import make_strategy
    from workbook_lib.strategies.model import PerturbGIN
    from workbook_lib.strategies.reference import reference_node_outputs, reference_predict

    g0 = make_graph(num_genes=24, types={"a": 90, "b": 40, "c": 12}, seed=7)
    graph = CellGraph("gpu-shaped", 24, g0.edge_index, "test", content_checksum(24, g0.edge_index))
    pert = torch.tensor([[0, 3, 9], [5, -1, -1], [2, 7, 11], [0, 1, 2]])
    model = PerturbGIN(24, graph.edge_types, hidden=5, layers=layers, seed=2)
    s = make_strategy("node_mask_shared", graph, aggr=aggr, push_kernel="index_add")
    batch = s.collate([s.make_item(i, row) for i, row in enumerate(pert)])
    gpu_like = dataclasses.replace(batch["corrections"],
                                   **{k: None for k in Corrections.BACKWARD_ONLY_ON_CPU})
    assert all(getattr(batch["corrections"], k) is not None
               for k in Corrections.BACKWARD_ONLY_ON_CPU)  # the CPU has them
    batch["corrections"] = gpu_like
    w = torch.randn(4, 24, 5, generator=torch.Generator().manual_seed(0))

    def run(fn):
        model.zero_grad(set_to_none=True)
        nodes, pred = fn()
        ((nodes * w).sum() + pred.sum()).backward()
        return nodes.detach(), pred.detach(), {n: p.grad.clone() for n, p in
                                               model.named_parameters() if p.grad is not None}
    def step():
        ctx = s.device_prepare(s.to_device(dict(batch)))
        return s.node_outputs(model, ctx), s.predict(model, ctx, dual=True)
    c = SyncCounter("cpu")
    with c.count():  # device preparation, forward and backward
        got = run(step)
    assert c.total == 0, dict(c.by_kind)
    ref = run(lambda: (reference_node_outputs(model, graph, pert, aggr),
                       reference_predict(model, graph, pert, aggr, True)))

    def rel(a, b):
        return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))
    assert rel(got[0], ref[0]) < 2e-5 and rel(got[1], ref[1]) < 2e-5
    assert set(got[2]) == set(ref[2])
    for k in ref[2]:
        assert rel(got[2][k], ref[2][k]) < 2e-5, k
