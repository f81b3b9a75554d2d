"""A pipeline that fails, diverges or stalls costs only its own figures, never the run's answer.

Each pipeline under ``tests/faulty/`` is the README's example broken in one way a user met (see
its README), run beside the same working one (``fine``): refused by the preflight in one line
where the rule can be checked before any work, else recorded by the notebook that met it (02's
memory probes, 03's loop, 04's DDP launches) with its stage, while the other pipeline's figures
stand. Library functions are driven directly; one test runs notebook 03 end to end.
"""
import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

from workbook_lib import cli
from workbook_lib.studies import timing as study
from workbook_lib.common.watchdog import Stalled, Watchdog
from workbook_lib.configs.validation import load_params_file, validate
from workbook_lib.exceptions import PipelineError
from workbook_lib.failures import PipelineFailure
from workbook_lib.pipelines import build_pipeline, check_pipeline
from workbook_lib.results.ddp import DDPResult
from workbook_lib.results.timing import PIPELINED, LoopStudy
from workbook_lib.running.notebook import load_checked_snapshot
from workbook_lib.training import loop

ROOT = Path(__file__).resolve().parent.parent
FAULTY = ROOT / "tests" / "faulty"
CI = ROOT / "params" / "ci.yaml"
MODES = [*loop.MODES, PIPELINED]


def _params(bad: str, other: str = "fine", **extra) -> dict:
    raw = dict(load_params_file(CI))
    raw.update(strategies=[], gap_strategies=[bad, other],
               pipelines=[f"{FAULTY / bad}.py:make_pipeline", f"{FAULTY / other}.py:make_pipeline"],
               **extra)
    return validate(raw)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def graph():
    return load_checked_snapshot(load_params_file(CI))


def _children() -> list:
    """Live processes started by this one, but multiprocessing's fork server and resource
    tracker (an earlier memory probe's; they live as long as this process, by design)."""
    time.sleep(0.3)
    return [c for c in psutil.Process().children(recursive=True)
            if c.status() != psutil.STATUS_ZOMBIE and not (
                c.ppid() == os.getpid() and "from multiprocessing." in " ".join(c.cmdline()))]


def _fine_intact(lo, p) -> None:
    assert lo.strategies == ["fine"]
    for m in MODES:
        a = lo.arm("fine", m)
        assert a.timed_steps >= p["loop_steps"] and a.nonfinite_steps == 0
    assert "fine" not in lo.failures


def _run(args: list[str], capsys) -> tuple[int, list[str]]:
    rc = cli.main(["run", "--params", str(CI), "--quiet", *args])
    return rc, capsys.readouterr().err.strip().splitlines()


# ------------------------------------------------------------------ the preflight
def test_forward_reaching_into_the_model_is_refused_in_one_line(tmp_path, capsys):
    """A whole run includes notebook 04, whose DDP wrapper lacks the attribute: refused."""
    out = tmp_path / "run"
    rc, err = _run(["--out", str(out), "--set", "strategies=[]", "--set",
                    f'pipelines=["{FAULTY}/calls_submodule.py:make_pipeline",'
                    f'"{FAULTY}/fine.py:make_pipeline"]'], capsys)
    assert rc == 2 and len(err) == 1, err
    assert "pipeline 'calls_submodule'" in err[0] and "forward uses model.conv" in err[0]
    assert "DistributedDataParallel" in err[0] and "call model(...)" in err[0]
    assert not out.exists()


def test_without_04_the_same_forward_is_a_warning_and_runs(tmp_path, capsys):
    """Notebook 04 left out (``--only``): no DDP wrapper in the run, so the rule is a warning
    naming what 04 would do, and the notebooks run the pipeline as it is."""
    out = tmp_path / "run"
    rc, err = _run(["--out", str(out), "--only", "01", "--set", "strategies=[]", "--set",
                    f'pipelines=["{FAULTY}/calls_submodule.py:make_pipeline",'
                    f'"{FAULTY}/fine.py:make_pipeline"]'], capsys)
    assert rc == 0, err
    warned = [ln for ln in err if ln.startswith("warning:")]
    assert len(warned) == 1 and "forward uses model.conv" in warned[0], err
    assert "it would fail in notebook 04, which this run leaves out" in warned[0]
    assert (out / "01_graph_inventory.json").is_file()


def test_under_a_real_ddp_the_same_forward_fails_and_is_named_by_the_rule(graph, tmp_path):
    """What the preflight's wrapper stands for: a real (one-process, gloo) DDP has no 'conv'
    either; without the preflight the loop records the same rule for that pipeline."""
    import torch.distributed as dist

    p = _params("calls_submodule")
    pipe = build_pipeline(p, "calls_submodule", graph, "cpu", check=False)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(pipe.model)
        arm = loop.Arm("calls_submodule/gap", pipe, loop.make_loader(pipe),
                       loop.Variant("ddp", "full"), model=model,
                       optimizer=pipe.configure_optimizer(pipe.model.parameters()))
        failures = {}
        assert loop.run_arms([arm], warmup_steps=1, min_steps=2, max_steps=2, budget_s=30,
                             failures=failures, notebook="04") == {}
    finally:
        dist.destroy_process_group()
    f = failures["calls_submodule"]
    assert (f.stage, f.step, f.mode) == ("forward", 0, "gap")
    assert f.message.startswith("forward uses model.conv, which DDP's wrapper does not have")
    assert "'DistributedDataParallel' object has no attribute 'conv'" in f.traceback


def test_a_batch_a_worker_cannot_send_back_is_refused_with_workers(tmp_path, capsys, graph):
    out = tmp_path / "run"
    rc, err = _run(["--out", str(out), "--only", "03", "--set", "strategies=[]", "--set",
                    "num_workers=1", "--set",
                    f'pipelines=["{FAULTY}/unpicklable_batch.py:make_pipeline",'
                    f'"{FAULTY}/fine.py:make_pipeline"]'], capsys)
    assert rc == 2 and len(err) == 1, err
    assert "pipeline 'unpicklable_batch'" in err[0] and "cannot send" in err[0]
    assert "num_workers: 1" in err[0] and "pickle" in err[0]
    assert not out.exists()
    # in the main process alone the same batch is fine: the rule is the workers'
    p = _params("unpicklable_batch")
    assert build_pipeline(p, "unpicklable_batch", graph, "cpu").preflight_warnings == []
    assert not _children()


def test_the_preflight_leaves_the_model_as_built_and_warns_of_a_nan_loss(graph):
    p = _params("nan_loss")
    pipe = build_pipeline(p, "nan_loss", graph, "cpu", check=False)
    before = {k: v.clone() for k, v in pipe.model.state_dict().items()}
    rng = torch.get_rng_state()
    warnings = check_pipeline(pipe, num_workers=1, stall_timeout_s=30)
    # the check ran an optimizer step on the model (NaN gradients: every weight moved)...
    assert len(warnings) == 1 and "nan_loss" in warnings[0] and "not finite" in warnings[0]
    # ...and left it, and the random state, as they were
    after = pipe.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(rng, torch.get_rng_state())
    assert all(q.grad is None for q in pipe.model.parameters())


def test_a_blocking_first_batch_is_refused_by_the_preflight(graph):
    p = _params("blocking_item")
    pipe = build_pipeline(p, "blocking_item", graph, "cpu", check=False)
    pipe.samples.reads = 10_000  # the filesystem stopped answering before the run
    t0 = time.perf_counter()
    with pytest.raises(PipelineError, match=r"dataset\(\)\[0\] made no progress for 1 s"):
        check_pipeline(pipe, stall_timeout_s=1.0)
    assert time.perf_counter() - t0 < 10


# ------------------------------------------------------------------ notebook 03's loop
def test_a_forward_that_raises_costs_only_its_own_arms(graph):
    from workbook_lib.report import timing_view as view

    p = _params("raises_4th")
    lo = study.run_loops(p, graph, torch.device("cpu"))
    _fine_intact(lo, p)
    f = lo.failures["raises_4th"]
    assert (f.notebook, f.stage, f.kind, f.mode, f.figures_kept) == ("03", "forward", "raised",
                                                                    "full", False)
    # the check's forward was call 1; the loop's warm-up steps of forward, forward_backward
    # and full were calls 2, 3, 4: the full arm's first step (0)
    assert f.step == 0
    assert "RuntimeError: index 9999" in f.message and "raises_4th.py" in f.traceback
    assert not any(k.startswith("raises_4th/") for k in lo.arms)
    # every figure of the notebook is made without it
    assert study.reported_figures(lo, ["raises_4th", "fine"]) == []
    # 'fine' does not state exact = True: nothing here is known to be exact
    assert set(study.step_bounds(lo)) == {"fine"} and study.fastest_exact(lo) is None
    study.sanity_check(lo)
    note = view.failures_note(lo).data
    assert note.count("<details>") == 1 and "failed in forward (mode full, step 0)" in note
    assert "its figures are missing" in note
    view.loop_table(lo).to_html()
    view.stage_table(lo).to_html()
    # the record survives the results file
    back = LoopStudy.from_json(json.loads(json.dumps(lo.to_json())))
    assert back.failures["raises_4th"] == f


def test_a_loss_that_is_not_finite_is_recorded_and_marked(graph):
    from workbook_lib.report import timing_view as view

    p = _params("nan_loss")
    lo = study.run_loops(p, graph, torch.device("cpu"))
    assert lo.strategies == ["nan_loss", "fine"]
    f = lo.failures["nan_loss"]
    assert (f.kind, f.stage, f.step, f.figures_kept) == ("nonfinite_loss", "loss", 0, True)
    assert f.line() == ("'nan_loss': the loss was not finite from step 0 (NaN): its timings "
                        "are of a diverged step")
    for m in MODES:
        a = lo.arm("nan_loss", m)
        assert a.timed_steps >= p["loop_steps"]  # its timings are kept
        if m == "data":  # no loss in the data-only step
            assert a.loss_steps == 0 and a.nonfinite_steps == 0
        else:
            assert a.nonfinite_steps == a.loss_steps > 0 and a.first_nonfinite_step == 0
            assert a.nonfinite_value == "NaN"
        assert lo.arm("fine", m).nonfinite_steps == 0
    assert "nan_loss (loss not finite)" in view.loop_table(lo).to_html()


def test_a_loss_that_turns_nan_later_names_its_first_step():
    """One arm, a loss finite for three steps, then NaN: counted from the right step."""
    class Diverges(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(2))
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return x * self.w * (float("nan") if self.calls > 3 else 1.0)

    class P:
        name, batch_size, device = "diverges", 2, torch.device("cpu")
        model = Diverges()
        dataset = staticmethod(lambda: [torch.ones(2)] * 8)
        collate = staticmethod(torch.stack)
        to_device = staticmethod(lambda b, non_blocking=False: b)
        prepare = staticmethod(lambda b: b)
        forward = staticmethod(lambda model, x: model(x))
        loss = staticmethod(lambda out, b: out.sum())
    pipe = P()
    arm = loop.Arm("diverges/forward", pipe, loop.make_loader(pipe), loop.Variant("forward",
                                                                                  "forward"))
    res = loop.run_arms([arm], warmup_steps=1, min_steps=5, max_steps=5, count_syncs=False,
                        budget_s=30)["diverges/forward"]
    assert (res.loss_steps, res.nonfinite_steps, res.first_nonfinite_step) == (6, 3, 3)


def test_a_blocking_item_stalls_in_the_main_process(graph):
    p = _params("blocking_item", stall_timeout_s=2.0)
    t0 = time.perf_counter()
    lo = study.run_loops(p, graph, torch.device("cpu"))
    assert time.perf_counter() - t0 < 45
    _fine_intact(lo, p)
    f = lo.failures["blocking_item"]
    assert (f.kind, f.stage) == ("stalled", "data item")
    assert 2.0 <= f.waited_s < 4.0 and "made no progress" in f.message
    assert "blocking_item.py" in f.traceback and "time.sleep(3600)" in f.traceback


@pytest.mark.parametrize("faulty, stage", [("blocking_item", "data item"),
                                           ("unstoppable_item", "data item or collate")])
def test_a_blocked_dataloader_worker_is_named_and_ended(faulty, stage, graph):
    """One DataLoader worker: the worker stops its own blocked read and names the stage; where
    no signal reaches it, the DataLoader's timeout ends the wait. No process is left."""
    p = _params(faulty, stall_timeout_s=2.0, num_workers=1)
    t0 = time.perf_counter()
    lo = study.run_loops(p, graph, torch.device("cpu"))
    assert time.perf_counter() - t0 < 50
    _fine_intact(lo, p)
    f = lo.failures[faulty]
    assert (f.kind, f.stage, f.mode) == ("stalled", stage, "data")
    assert f.waited_s >= 2.0
    assert not _children()


# ------------------------------------------------------------------ the stall rule
def test_the_stall_limit_follows_the_slowest_step_within_the_timeout():
    assert loop.stall_limit(None, 1.0) is None
    assert loop.stall_limit(300.0, None) == 300.0  # no step seen yet
    assert loop.stall_limit(300.0, 0.01) == loop.STALL_FLOOR_S  # fast steps: the floor
    assert loop.stall_limit(300.0, 5.0) == 100.0  # 20x the slowest step
    assert loop.stall_limit(300.0, 60.0) == 300.0  # never beyond the timeout
    assert loop.stall_limit(2.0, 0.01) == 2.0


def test_a_watchdog_outside_the_main_thread_reports_and_stops_nothing():
    said, done = [], []

    def work():
        with Watchdog(announce=said.append, why="test") as wd:
            assert not wd.signals
            with wd.watch("'x' (full)", "forward", 0.3):
                time.sleep(1.2)  # not interrupted: signals reach the main thread only
            done.append(True)
    th = threading.Thread(target=work)
    th.start()
    th.join(10)
    assert done == [True]
    assert len(said) == 1 and said[0].startswith("STALLED: 'x' (full): forward made no progress")


def test_a_watchdog_in_the_main_thread_stops_the_stage_once_past_its_limit():
    before = signal.getsignal(signal.SIGALRM)
    outer_left = signal.getitimer(signal.ITIMER_REAL)[0]  # pytest-timeout's, if any
    with Watchdog() as wd:
        with wd.watch("'x'", "collate", 5.0):
            time.sleep(0.05)  # within the limit: untouched
        t0 = time.perf_counter()
        with pytest.raises(Stalled) as e:
            with wd.watch("'x'", "collate", 0.2):
                time.sleep(30)
        assert 0.2 <= time.perf_counter() - t0 < 2
        assert e.value.stage == "collate" and e.value.waited_s >= 0.2
    # an outer alarm (pytest-timeout's) gets its handler and the rest of its time back
    assert signal.getsignal(signal.SIGALRM) is before
    assert (signal.getitimer(signal.ITIMER_REAL)[0] > 0) == (outer_left > 0)


# ------------------------------------------------------------------ notebooks 02 and 04
def test_02_a_memory_probe_that_raises_is_recorded_with_its_traceback():
    from workbook_lib.studies.mask_cost.memory import probe_failure
    from workbook_lib.measurement.memory import MemoryPoint
    from workbook_lib.report.mask_cost_view import memory_failures
    from workbook_lib.training.step_memory import measure_point

    p = _params("fixed_batch_shape")
    pt = measure_point(p, strategy="fixed_batch_shape", batch_size=2, scale=p["scale"],
                       hidden=p["hidden"], layers=p["layers"], form="own", timeout_s=300)
    assert pt.status == "failed" and "shape '[8]' is invalid" in pt.reason
    assert "fixed_batch_shape.py" in pt.traceback
    ok = MemoryPoint("fixed_batch_shape", "own", 8, p["scale"], p["hidden"], p["layers"], "cpu",
                     "ok", step_bytes=4 << 20, setup_bytes=1 << 20)
    f = probe_failure("fixed_batch_shape", [pt, ok])
    assert (f.notebook, f.stage, f.kind, f.step) == ("02", "forward", "raised", 0)
    assert f.mode == "memory probe, B=2" and f.figures_kept  # the B=8 point stands
    html = memory_failures(type("M", (), {"failures": {"fixed_batch_shape": f}})()).data
    assert "failed in forward" in html and "<details>" in html
    assert probe_failure("fine", [ok]) is None


def test_02_a_loss_without_a_gradient_at_one_batch_size_says_why_and_the_others_are_measured():
    from workbook_lib.report.mask_cost_view import memory_failures
    from workbook_lib.studies.mask_cost.memory import probe_failure
    from workbook_lib.training.step_memory import measure_point

    p = _params("pairwise_loss")
    pts = [measure_point(p, strategy="pairwise_loss", batch_size=b, scale=p["scale"],
                         hidden=p["hidden"], layers=p["layers"], form="own", timeout_s=300)
           for b in (1, 2)]
    assert pts[0].status == "failed", pts[0]
    assert "the loss at a batch of 1 does not require grad" in pts[0].reason
    assert "leave 1 out of memory_batch_sizes" in pts[0].reason
    assert pts[1].status != "failed", pts[1].reason  # a batch of two has a pair
    f = probe_failure("pairwise_loss", pts)
    assert (f.stage, f.mode) == ("loss", "memory probe, B=1") and f.figures_kept == pts[1].usable
    f.figures_kept = False  # the table keeps the pipeline's row (n/a): no "missing" from it
    html = memory_failures(type("M", (), {"failures": {"pairwise_loss": f}})()).data
    assert "&#x27;pairwise_loss&#x27; has no figure among them" in html and "missing from them" not in html


def test_04_a_rank_raising_in_one_pipeline_is_recorded_and_the_rest_measured(tmp_path,
                                                                             monkeypatch):
    from workbook_lib.data import snapshots
    from workbook_lib.studies import ddp as ddp_study
    from workbook_lib.report import ddp_view

    monkeypatch.setenv("FAULTY_RANK", "1")  # rank 1 only, at the 3rd call of its forward
    monkeypatch.setenv("FAULTY_CALL", "3")
    p = validate({
        "scale": 0.002, "hidden": 4, "layers": 1, "device": "cpu", "perturbation_k": 2,
        "grad_accum_steps": 2, "batch_size_lazy": 2, "batch_size_dango": 4,
        "ddp_batch_size": 2, "exactness_genes": 10, "world_sizes": [2], "ddp_steps": 2,
        "ddp_budget_s": 4, "strategies": [], "ddp_strategy": "fine",  # fine scales
        "pipelines": [f"{FAULTY}/raises_4th.py:make_pipeline", f"{FAULTY}/fine.py:make_pipeline"]})
    snapshots.load_snapshot(p)
    pl, got = ddp_study.run_ddp(p, torch.device("cpu"), tmp_path, rounds=1)
    f = got.failures["raises_4th"]
    assert (f.notebook, f.stage, f.kind, f.rank, f.mode) == ("04", "forward", "raised", 1, "gap")
    assert f.step == 2 and "index 9999" in f.message and "raises_4th.py" in f.traceback
    assert (tmp_path / "ddp_04" / "world2" / "rank1.failure.json").exists()
    r = ddp_study.analyse(p, pl, got, tmp_path)
    assert r.gap is None and set(r.failures) == {"raises_4th"}
    assert set(r.worlds) == {2} and set(r.worlds[2].gap_steps) == {"fine"}  # measured again
    assert r.worlds[2].step.n >= 2  # the scaling figures stand
    assert {"world2", "world2_retry1"} <= set(r.logs)  # the failed launch's logs are kept
    assert "No gap decomposed: 'raises_4th' failed in forward" in ddp_view.gap_text(r).data
    assert "No gap decomposed" in ddp_view.headline(r)
    assert ddp_view.failures_note(r).data.count("<details>") == 1
    back = DDPResult.from_json(json.loads(json.dumps(r.to_json())))
    assert back.gap is None and back.failures["raises_4th"] == f
    assert not _children()


# ------------------------------------------------------------------ end to end
def test_notebook_03_completes_with_the_failure_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    rc, _err = _run(["--out", str(out), "--only", "03", "--set", "strategies=[]", "--set",
                     f'pipelines=["{FAULTY}/raises_4th.py:make_pipeline",'
                     f'"{FAULTY}/fine.py:make_pipeline"]'], capsys)
    assert rc == 0
    doc = json.loads((out / "03_data_vs_model_timing.json").read_text())
    f = PipelineFailure.from_json(doc["loops"]["failures"]["raises_4th"])
    assert (f.stage, f.kind, f.step) == ("forward", "raised", 0)
    assert doc["loops"]["strategies"] == ["fine"] and "fine" in doc["profiles"]
    html = (out / "03_data_vs_model_timing.html").read_text()
    assert html.count("failed in forward (mode full, step 0)") >= 1
    assert html.count("<summary>traceback</summary>") == 1
