"""The measurement core: every test fails when the figure it guards is wrong."""
import contextlib
import json
import subprocess
import sys
import time

import pytest
import torch

from workbook_lib.measurement import memory, timing
from workbook_lib.measurement.syncs import SyncCounter
from workbook_lib.records import Record, from_json, to_json


# ------------------------------------------------------------------ timing
def test_stat_summary_and_precision():
    s = timing.Stat.from_samples([1.0, 2.0, 3.0, 4.0, 5.0], target=0.1)
    assert (s.median, s.q1, s.q3, s.iqr, s.n) == (3.0, 2.0, 4.0, 2.0, 5)
    assert not s.precise and s.rel_iqr == pytest.approx(2 / 3)
    tight = timing.Stat.from_samples([1.0, 1.01, 0.99, 1.0], target=0.1)
    assert tight.precise
    with pytest.raises(ValueError, match="'samples'"):
        timing.Stat.from_samples([])


def test_paired_and_independent_ratios():
    a = timing.Stat.from_samples([2.0, 4.0, 6.0])
    b = timing.Stat.from_samples([1.0, 2.0, 3.0])
    paired = a.ratio_to(b, paired=True)  # drift cancels: every round is exactly 2x
    assert paired.median == 2.0 and paired.iqr == 0.0
    indep = a.ratio_to(b)
    assert indep.median == 2.0 and indep.iqr > 0  # the spread of each counts


def test_measure_excludes_warmup_and_repeats_to_min():
    calls = []

    def slow_first():
        calls.append(1)
        time.sleep(0.3 if len(calls) == 1 else 0.005)
    st = timing.measure(slow_first, warmup=1, min_repeats=5, max_time_s=0.5)
    assert st.n >= 5
    assert st.median < 0.05  # the 0.3 s warm-up call is not in the figure
    with pytest.raises(ValueError, match="'min_repeats'"):
        timing.measure(lambda: None, min_repeats=0)


def test_interleave_rounds_and_paired_ratio():
    res = timing.interleave({"a": lambda: time.sleep(0.004), "b": lambda: time.sleep(0.002)},
                            min_rounds=5, max_time_s=2)
    assert res.rounds >= 5 and res.stats["a"].n == res.rounds
    assert 1.3 < res.ratio("a", "b").median < 2.7


def test_interleave_stops_on_the_judged_variants_only(monkeypatch):
    """A probe timed alongside whose spread never settles (alternately 1 and 8 ms) holds the
    rounds to their limit when judged, and not when only the steady variant (10 ms, within
    1%) is judged; it is still timed in every round. The durations are given (the timer
    replaced), so that the rule, not this machine's jitter, is what is tested."""
    seen = {"steady": 0, "probe": 0}

    def timed(fn, device):
        name = fn()
        seen[name] += 1
        if name == "steady":
            return 0.010 * (1 + 0.01 * (seen[name] % 2))
        return 0.008 if seen[name] % 2 else 0.001
    monkeypatch.setattr(timing, "_timed_call", timed)
    fns = {"steady": lambda: "steady", "probe": lambda: "probe"}
    judged = timing.interleave(fns, warmup=0, min_rounds=3, max_rounds=12, target=0.05,
                               max_time_s=5, judged=["steady"])
    every = timing.interleave(fns, warmup=0, min_rounds=3, max_rounds=12, target=0.05,
                              max_time_s=5)
    assert judged.rounds < 12 and judged.stats["probe"].n == judged.rounds
    assert every.rounds == 12
    with pytest.raises(ValueError, match="'judged' must name some of the variants"):
        timing.interleave(fns, judged=["other"])


def test_step_clock_never_records_a_warmup_step():
    clock = timing.StepClock("cpu")
    for i in range(4):
        with clock.step(timed=i > 0):
            with clock.stage("work"):
                time.sleep(1.0 if i == 0 else 0.01)  # a 1 s delay injected into warm-up only
            clock.add("worker", 5.0 if i == 0 else 0.0)
    assert clock.n == 3
    assert clock.wall().median < 0.1 and clock.stages()["work"].median < 0.1
    assert clock.stages()["worker"].median == 0.0
    with pytest.raises(RuntimeError, match="outside a step"):
        with clock.stage("x"):
            pass


def test_loop_warmup_delay_does_not_move_the_median():
    """A 1 s delay in the loop's warm-up step leaves the timed steps' median alone."""
    from conftest import make_graph
    from workbook_lib.data.perturbations import sample_perturbations
    from workbook_lib.strategies import make_strategy
    from workbook_lib.strategies.model import PerturbGIN
    from workbook_lib.training import loop

    g = make_graph(num_genes=20, types={"a": 40})
    s = make_strategy("node_mask_shared", g)
    m = PerturbGIN(g.num_genes, g.edge_types, hidden=4, layers=1)
    pert = sample_perturbations(20, 2, 64, seed=0)
    state = {"n": 0}

    class Slow:  # the first step (the warm-up) sleeps
        def begin_step(self):
            state["n"] += 1

        def end_step(self, clock):
            if state["n"] == 1:
                time.sleep(1.0)
    from workbook_lib.pipelines.builtin import BuiltinPipeline

    pipe = BuiltinPipeline(s, m, pert, 4)
    arm = loop.Arm("a", pipe, loop.make_loader(pipe), loop.Variant("data", "data"),
                   hooks=Slow())
    res = loop.run_arms([arm], warmup_steps=1, min_steps=5, max_steps=5, count_syncs=False)
    assert res["a"].timed_steps == 5 and res["a"].step.median < 0.2
    assert max(res["a"].step.samples) < 0.5


# ------------------------------------------------------------------ memory
def test_peak_of_a_known_allocation_after_a_higher_peak():
    """In a fresh process, as the memory probes run (a test process that ran other tests first
    may hold freed heap that a 300 MB tensor reuses without a page more)."""
    code = ("import json, torch; from workbook_lib.measurement import memory\n"
            "memory.return_freed_memory_to_os()\n"  # as the probes run: freed memory goes back
            "big = torch.ones(250_000_000 // 4 * 4); del big\n"  # the process peaks at 1 GB first
            "pk = memory.peak_during(lambda: torch.ones(75_000_000).add_(1))\n"  # then 300 MB
            "print(json.dumps([pk.bytes, pk.method]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    got, method = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == pytest.approx(300e6, rel=0.10), method


def test_peak_in_a_child_whose_parent_peaked_higher():
    code = ("import torch, json; from workbook_lib.measurement.memory import peak_during\n"
            "pk = peak_during(lambda: torch.ones(75_000_000).add_(1))\n"
            "print(json.dumps(pk.bytes))")
    big = torch.ones(250_000_000)  # 1 GB held by the parent while the child starts
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    del big
    assert json.loads(out.stdout) == pytest.approx(300e6, rel=0.10)


def test_probe_points_are_positive_and_grow_with_batch():
    from workbook_lib.configs.validation import validate
    from workbook_lib.training.step_memory import measure_point

    p = validate({"scale": 0.005, "device": "cpu"})
    pts = [measure_point(p, strategy="replicated_mask_cpu", form="gather_scatter",
                         batch_size=b, scale=0.02, hidden=16, layers=2) for b in (1, 2, 4)]
    assert all(pt.status == memory.STATUS_OK and pt.step_bytes > 0 for pt in pts), pts
    assert pts[0].step_bytes < pts[1].step_bytes < pts[2].step_bytes
    fit = memory.fit_memory(pts, 80e9, "test budget")
    assert fit.status == "ok" and fit.per_sample_bytes > 0 and len(fit.residuals) == 3
    assert fit.extrapolation_factor == fit.largest_batch / 4


SETUP = """
import torch
from workbook_lib.measurement.memory import StepToMeasure

def setup(cfg):
    if cfg.get("fail"):
        raise RuntimeError("the set-up refused")
    return StepToMeasure(lambda: torch.ones(cfg["floats"]).add_(1), torch.device("cpu"))
"""


def test_the_fresh_process_measures_the_callers_step(tmp_path, monkeypatch):
    """The probe knows nothing of pipelines: a set-up handed in by the caller builds the step,
    and the figure is that step's (a 200 MB step reads ~200 MB, a 40 MB one ~40 MB); a set-up
    that fails is recorded as failed with its reason."""
    import importlib

    (tmp_path / "my_step.py").write_text(SETUP)
    monkeypatch.syspath_prepend(str(tmp_path))
    setup = importlib.import_module("my_step").setup
    point = dict(strategy="mine", form="-", batch_size=1, scale=1.0, hidden=1, layers=1)
    big, small = (memory.measure_in_fresh_process(setup, {"floats": n}, point)
                  for n in (50_000_000, 10_000_000))
    assert big.status == small.status == memory.STATUS_OK, (big, small)
    assert big.step_bytes == pytest.approx(200e6, rel=0.10)
    assert small.step_bytes == pytest.approx(40e6, rel=0.25)
    bad = memory.measure_in_fresh_process(setup, {"fail": True}, point)
    assert bad.status == memory.STATUS_FAILED and "the set-up refused" in bad.reason
    with pytest.raises(ValueError, match="module-level function"):
        memory.measure_in_fresh_process(lambda cfg: setup(cfg), {}, point)


def test_fit_refuses_too_few_points_and_no_growth():
    mk = lambda b, v, st=memory.STATUS_OK: memory.MemoryPoint(  # noqa: E731
        "s", "f", b, 1.0, 8, 1, "cpu", st, v, 0)
    few = memory.fit_memory([mk(1, 1e6), mk(2, 2e6), mk(4, None, memory.STATUS_OOM)], 1e9, "x")
    assert few.status == "too few points" and few.largest_batch is None
    assert "out of memory" in few.reason
    flat = memory.fit_memory([mk(1, 5e6), mk(2, 4e6), mk(4, 3e6)], 1e9, "x")
    assert flat.status == "no growth" and flat.largest_batch is None


def test_real_cpu_out_of_memory_is_recognised():
    assert memory.is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried "
                                      "to allocate 1000000000 bytes"))
    assert memory.is_oom(MemoryError())
    assert not memory.is_oom(RuntimeError("shape mismatch"))
    with pytest.raises(RuntimeError) as e:
        torch.empty(1 << 62, dtype=torch.uint8)  # a real allocation failure
    assert memory.is_oom(e.value)


# ------------------------------------------------------------------ syncs
def test_each_syncing_operator_is_counted_once():
    x = torch.arange(6)
    m = x > 2
    ops = {
        "item/bool/int/float": lambda: x[0].item(),
        "nonzero": lambda: x.nonzero(),
        "boolean-mask indexing": lambda: x[m],
        "repeat_interleave": lambda: torch.repeat_interleave(x, torch.ones(6, dtype=torch.long)),
        "unique": lambda: torch.unique(x),
        "masked_select": lambda: torch.masked_select(x, m),
        "bincount": lambda: torch.bincount(x),
        "equal/allclose": lambda: torch.equal(x, x),
        "copy to host": lambda: x.tolist(),
    }
    for kind, fn in ops.items():
        c = SyncCounter("cpu")
        with c.count():
            fn()
        assert dict(c.by_kind) == {kind: 1}, (kind, dict(c.by_kind))
    c = SyncCounter("cpu")
    with c.count():  # none of these would sync on a GPU
        torch.repeat_interleave(x, torch.ones(6, dtype=torch.long), output_size=6)
        torch.isin(x, x)
        x + 1
        torch.where(m, x, 0)
    assert c.total == 0, dict(c.by_kind)
    c = SyncCounter("cpu")
    with c.count():  # one copy to the host, whatever reads it there (found by a user trial:
        x.detach().cpu().numpy()  # .numpy() counted a second sync)
    assert dict(c.by_kind) == {"copy to host": 1}, dict(c.by_kind)


def _host_reads(x, inner=contextlib.nullcontext):
    chained = SyncCounter("cpu")
    with chained.count(), inner():  # one sync on a GPU each: the copy; its reads are on the host
        x.cpu().tolist()
        x.to("cpu").tolist()
        x[:1].cpu().item()
    apart = SyncCounter("cpu")
    with apart.count(), inner():  # the same tensor read on later lines: .cpu() returned x
        y = x.cpu()  # itself on a CPU run, and x.tolist() on a GPU would sync again: each
        # counted
        y.tolist()
        z = x[:1].cpu()
        z.item()
    return chained, apart


@pytest.mark.parametrize("inside", ["none", "torch.device", "another counter"])
def test_a_host_copy_read_on_its_own_line_is_one_sync_and_a_later_read_another(inside):
    """Noted in an earlier round: ``x.cpu().tolist()`` counted two syncs on a CPU run (one on a
    GPU). A read chained to its copy is the copy's; the same reads on the next lines are not
    told from a device tensor's and count, both ways; the same with another mode inside the
    counter (a review: ``with torch.device(...)`` made every call's line the mode's own)."""
    outer = SyncCounter("cpu")
    with outer.count() if inside == "another counter" else contextlib.nullcontext():
        chained, apart = _host_reads(torch.arange(6), (lambda: torch.device("cpu")) if
                                     inside == "torch.device" else contextlib.nullcontext)
    assert dict(chained.by_kind) == {"copy to host": 3}, dict(chained.by_kind)
    assert dict(apart.by_kind) == {"copy to host": 3, "item/bool/int/float": 1}, \
        dict(apart.by_kind)
    if inside == "another counter":  # the outer one agrees with the inner ones
        assert dict(outer.by_kind) == {"copy to host": 6, "item/bool/int/float": 1}, \
            dict(outer.by_kind)
    c = SyncCounter("cpu")
    with c.count():  # a later .item() of another tensor on the copy's line is still counted
        a = torch.arange(3).cpu(); b = torch.ones(1).item()  # noqa: E702, F841
    assert dict(c.by_kind) == {"copy to host": 1, "item/bool/int/float": 1}, dict(c.by_kind)


def test_sync_count_of_the_loop_form_comes_from_the_dispatcher():
    from conftest import make_graph
    from workbook_lib.strategies import make_strategy

    g = make_graph(num_genes=12, types={"a": 30, "b": 20})
    s = make_strategy("device_mask_loop", g)
    pert = torch.tensor([[0, 3, -1], [4, 5, 6]])
    c = SyncCounter("cpu")
    with c.count():
        s.make_masks(pert)
    assert c.total == s.syncs_per_batch(pert) == 2 * 3 + 2 * 5 * 2
    v = make_strategy("device_mask_vectorized", g)
    c2 = SyncCounter("cpu")
    with c2.count():
        v.make_masks(pert)
    assert c2.total == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_sync_debug_mode_counts_a_real_sync():
    x = torch.arange(6, device="cuda")
    c = SyncCounter("cuda")
    with c.count():
        x.nonzero()
        x[0].item()
    assert c.total >= 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_peak_memory_of_a_known_allocation():
    pk = memory.peak_during(lambda: torch.ones(75_000_000, device="cuda").add_(1), "cuda")
    assert pk.bytes == pytest.approx(300e6, rel=0.05)


# ------------------------------------------------------------------ records
def test_records_round_trip():
    from dataclasses import dataclass, field

    @dataclass
    class Inner(Record):
        a: float
        s: timing.Stat | None = None

    @dataclass
    class Outer(Record):
        by_int: dict[int, Inner]
        pairs: list[tuple[int, float]] = field(default_factory=list)
        nan: float = float("nan")
    o = Outer({1: Inner(0.5, timing.Stat.from_samples([1.0, 2.0]))}, [(1, 2.5)])
    doc = json.loads(json.dumps(o.to_json()))
    back = Outer.from_json(doc)
    assert back.by_int[1].s.median == 1.5 and back.pairs == [(1, 2.5)]
    assert doc["nan"] is None and back.nan != back.nan  # NaN -> null -> NaN
    assert from_json(dict[int, float], {"3": 1}) == {3: 1.0}
    assert to_json(torch.tensor([1, 2])) == [1, 2]


@pytest.mark.parametrize("omp, expect", [("1", 2), (None, 1)])
def test_memory_probes_side_by_side_fit_the_threads_each_probe_runs(monkeypatch, omp, expect):
    """02's probes at once: the allowed CPUs over the threads a probe runs with, the same
    figure the probe takes (OMP_NUM_THREADS first); two probes of 2 threads on 2 CPUs spin
    against each other."""
    from types import SimpleNamespace

    from workbook_lib.configs.validation import validate
    from workbook_lib.studies.mask_cost import memory as study

    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    monkeypatch.setattr(study, "allowed_cpus", lambda: SimpleNamespace(cpus=2))
    sizes = []

    class Stop(Exception):
        pass

    def pool(max_workers):
        sizes.append(max_workers)
        raise Stop
    monkeypatch.setattr(study, "ThreadPoolExecutor", pool)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        p = validate({"scale": 0.002, "device": "cpu"})
        with pytest.raises(Stop):
            study.memory_study(p, torch.device("cpu"))
        threads = memory.probe_threads()
    finally:
        torch.set_num_threads(before)
    assert sizes == [expect] and threads == 2 // expect


def _cycles(n: int = 20000) -> None:
    """Garbage only the cyclic collector frees: lists that hold themselves."""
    for _ in range(n):
        a = []
        a.append(a)


def test_a_steps_garbage_collection_is_recorded_inside_it_and_nowhere_else():
    """A full collection inside a timed step is its "gc_pause" (and in its wall time), and
    "gc_pause:STAGE" of the stage it ran in; a step without one records 0, a collection between
    steps is in none, a warm-up step keeps none, and a step that raised leaves no callback
    behind."""
    import gc

    from workbook_lib.results.timing import GC_PAUSE

    clock = timing.StepClock("cpu")
    callbacks = len(gc.callbacks)
    was = gc.isenabled()
    gc.disable()  # only the collections the test makes
    try:
        with clock.step(timed=False):
            _cycles()
            gc.collect()
        with clock.step():
            with clock.stage("collate"):
                _cycles()
                gc.collect()
            with clock.stage("forward"):
                time.sleep(0.001)
        _cycles()
        gc.collect()  # between steps
        with clock.step():
            time.sleep(0.01)
        with pytest.raises(ValueError):
            with clock.step():
                raise ValueError("the step failed")
    finally:
        if was:
            gc.enable()
    assert len(gc.callbacks) == callbacks
    assert clock.n == 2
    first, second = (s[GC_PAUSE] for s in clock.steps)
    assert 0 < first <= clock.steps[0]["_wall"] and second == 0.0
    # inside the stage that collected, and no other
    assert clock.steps[0][f"{GC_PAUSE}:collate"] == pytest.approx(first)
    assert f"{GC_PAUSE}:forward" not in clock.steps[0]
    st = clock.stages()[GC_PAUSE]
    assert st.samples == [first, second]


def test_a_pipeline_states_its_garbage_collector_share_and_the_stage_table_shows_it():
    """LoopStudy.gc_pauses: the collector's seconds over the pipeline's timed steps of every
    mode (their summed wall time) and its largest step (a pipeline that never collected: 0%;
    a results file from before the figure: not recorded); 03's stage table shows them."""
    from workbook_lib.report.timing_view import stage_table
    from workbook_lib.results.timing import GC_PAUSE, ArmResult, LoopStudy

    def arm(name, mode, walls, pauses):
        extra = {} if pauses is None else {GC_PAUSE: timing.Stat.from_samples(pauses)}
        return ArmResult(name=name, strategy=name, variant=mode, mode=mode, batch_size=8,
                         micro_batches=1, step=timing.Stat.from_samples(walls),
                         stages={"forward": timing.Stat.from_samples([w / 2 for w in walls])},
                         extra=extra)

    arms = {"heavy/full": arm("heavy", "full", [0.05, 0.05, 0.05], [0.0, 0.001, 0.0]),
            # the full collection fell in another mode's step: it is the pipeline's all the same
            "heavy/data": arm("heavy", "data", [0.02, 0.26, 0.02], [0.0, 0.23, 0.0]),
            "clean/full": arm("clean", "full", [0.05] * 3, [0.0] * 3),
            "old/full": arm("old", "full", [0.05] * 3, None)}
    lo = LoopStudy(device="cpu", sizes="", strategies=["heavy", "clean", "old"],
                   batch_sizes={}, interleaved=True, settings={}, arms=arms)
    share, most, steps = lo.gc_pauses("heavy")
    assert share == pytest.approx(0.231 / 0.45) and most == pytest.approx(0.23) and steps == 6
    assert lo.gc_pauses("clean") == (0.0, 0.0, 3) and lo.gc_pauses("old") is None
    html = stage_table(lo).to_html()
    assert "51%, at most 230 ms in one of 6 steps" in html and html.count(">0%</td>") == 1
    assert "not recorded" in html and "Garbage collector: the time" in html
    assert "its loader workers" not in html  # no workers: the step's own figure holds them
    # with DataLoader workers: their own collections, in a column of their own
    arms["heavy/full"].extra.update({f"{GC_PAUSE}:worker_fetch": timing.Stat.from_samples([0.0] * 3),
                                     f"{GC_PAUSE}:worker_collate": timing.Stat.from_samples(
                                         [0.02, 0.0, 0.01]),
                                     "worker_fetch": timing.Stat.from_samples([0.01] * 3),
                                     "worker_collate": timing.Stat.from_samples([0.03] * 3)})
    lo.settings = {"num_workers": 2}
    html = stage_table(lo).to_html()
    assert "garbage collector, its loader workers" in html
    assert "25%, at most 20 ms in one of 3 steps" in html
    assert "With 2 DataLoader worker process(es) per pipeline" in html
