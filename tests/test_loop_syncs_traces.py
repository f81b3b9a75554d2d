import json

import pytest
import torch

from workbook_lib.training import loop
from workbook_lib.measurement import trace_analysis as ta
from workbook_lib.strategies.model import PerturbGIN
from workbook_lib.data.perturbations import sample_perturbations
from workbook_lib.measurement.profiling import profile_steps
from workbook_lib.strategies import make_strategy
from workbook_lib.measurement.syncs import SyncCounter

from conftest import make_graph


def syncs_n_times(x, n):
    for i in range(n):
        x[i % x.numel()].item()


@pytest.mark.parametrize("n", [0, 1, 7, 25])
def test_sync_counter_counts_exactly(n):
    c = SyncCounter("cpu")
    with c.count():
        syncs_n_times(torch.arange(5), n)
    assert c.total == n and c.by_kind.get("item", 0) == n


def test_sync_counter_kinds():
    c = SyncCounter("cpu")
    x = torch.arange(6)
    with c.count():
        x.tolist()
        x.nonzero()
        _ = x[x > 2]
        torch.isin(x, x)  # no sync
        x + 1  # no sync
    assert dict(c.by_kind) == {"tolist": 1, "nonzero": 1, "bool_index": 1}


def _write_trace(tmp_path, events):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "name": n, "ts": ts, "dur": d, "pid": 1, "tid": tid, "cat": "cpu_op"}
        for n, ts, d, tid in events]}))
    return p


def test_exclusive_breakdown_adds_up(tmp_path):
    # one step of 100 us: forward [10, 50) with ops inside, backward [50, 90), loop overhead
    ev = [("ProfilerStep#1", 0, 100, 1),
          ("wb:forward", 10, 40, 1), ("aten::linear", 12, 30, 1), ("aten::addmm", 14, 20, 1),
          ("wb:backward", 50, 40, 1), ("AddmmBackward0", 52, 30, 1), ("aten::mm", 55, 20, 1),
          ("wb:optimizer", 92, 6, 1),
          ("autograd_thread_op", 52, 30, 2)]  # another thread: excluded from the breakdown
    events = ta.load_trace(_write_trace(tmp_path, ev))
    excl = ta.exclusive_breakdown(events)
    assert sum(excl.values()) == pytest.approx(100e-6)
    assert excl["forward"] == pytest.approx(40e-6) and excl["backward"] == pytest.approx(40e-6)
    assert excl["optimizer"] == pytest.approx(6e-6)
    assert excl[ta.UNTRACKED] == pytest.approx(14e-6)
    assert ta.covered_seconds(events) == pytest.approx(100e-6)
    naive = ta.naive_breakdown(ta.load_trace(_write_trace(tmp_path, ev)))
    assert sum(naive.values()) > 2.5 * 100e-6  # nested durations counted many times
    assert naive["forward"] == pytest.approx((40 + 30 + 20) * 1e-6)


def test_clamp_schedule():
    assert ta.clamp_schedule(10, 1, 1, 3) == ({"wait": 1, "warmup": 1, "active": 3}, None)
    sched, note = ta.clamp_schedule(2, 1, 1, 3)
    assert sched == {"wait": 0, "warmup": 0, "active": 2} and "clamped" in note
    sched, _ = ta.clamp_schedule(1, 5, 5, 5)
    assert sched["active"] == 1
    with pytest.raises(ValueError, match="'steps'"):
        ta.clamp_schedule(0, 1, 1, 1)


@pytest.fixture(scope="module")
def small():
    g = make_graph(num_genes=30, types={"a": 80, "b": 40}, seed=2)
    return g, sample_perturbations(30, 2, 64, seed=0)


@pytest.mark.parametrize("mode", loop.MODES)
def test_run_loop_modes(small, mode):
    g, pert = small
    s = make_strategy("replicated_mask_cpu", g)
    m = PerturbGIN(g.num_genes, g.edge_types, hidden=4, layers=2)
    r = loop.run_loop(s, m, pert, mode=mode, batch_size=4, steps=3, warmup_steps=1, dual=True)
    assert len(r.step_seconds) == 3 and r.it_per_s > 0
    assert {"loader_wait", "h2d", "device_prep", "forward", "worker_fetch"} <= set(r.stage_medians)
    assert ("optimizer" in r.stage_medians) == (mode == "full")


def test_run_loop_with_workers_and_sync_count(small):
    g, pert = small
    s = make_strategy("device_mask_loop", g)
    m = PerturbGIN(g.num_genes, g.edge_types, hidden=4, layers=1)
    r = loop.run_loop(s, m, pert, mode="data", batch_size=4, steps=2, warmup_steps=1,
                      num_workers=2)
    assert r.syncs_per_step == s.syncs_per_batch(pert[:4]) == 4 * 2 + 2 * 8 * 2
    assert r.stage_medians["worker_fetch"] > 0


def test_run_loop_rejects_short_input(small):
    g, pert = small
    s = make_strategy("node_mask_shared", g)
    m = PerturbGIN(g.num_genes, g.edge_types, hidden=4, layers=1)
    with pytest.raises(ValueError, match="'pert' must hold"):
        loop.run_loop(s, m, pert[:3], mode="data", batch_size=4, steps=1)


def test_profile_short_run_clamps_and_covers(small, tmp_path):
    g, pert = small
    s = make_strategy("node_mask_shared", g)
    m = PerturbGIN(g.num_genes, g.edge_types, hidden=4, layers=2)
    out = profile_steps(s, m, pert, batch_size=4, trace_path=tmp_path / "tr.json", steps=2,
                        wait=1, warmup=1, active=3)
    assert out["note"] and (tmp_path / "tr.json").is_file()
    assert 0.9 < out["coverage"] < 1.1
    assert out["naive_total_over_wall"] > out["coverage"]


def test_project_epochs():
    p = loop.project_epochs(0.5, 28, 332313, ranks=4, ddp_factor=1.2)
    assert p["steps_per_epoch"] == 2374
    assert p["epochs_per_day"] == pytest.approx(86400 / (2374 * 0.6))
