"""Real torchrun launches (gloo, CPU) and the all-reduce model."""
import time

import psutil
import pytest

from workbook_lib.distributed import allreduce_model as arm
from workbook_lib.distributed import analysis as da
from workbook_lib.distributed import launcher
from workbook_lib.running import params as params_mod
from workbook_lib.data import snapshots
from workbook_lib.exceptions import LaunchError


@pytest.fixture(scope="module")
def tiny_params():
    p = params_mod.validate({"scale": 0.002, "hidden": 4, "layers": 1, "device": "cpu",
                             "perturbation_k": 2, "grad_accum_steps": 2})
    snapshots.load_snapshot(p)  # cache it before ranks start
    return p


def _config(p, **extra):
    return {"params": p, "strategies": [{"name": "node_mask_shared", "batch_size": 2, "full": True},
                                        {"name": "dango_wildtype", "batch_size": 4}],
            "steps": 2, "warmup": 1, "timeout_s": 60, **extra}


def _no_orphans(out_dir):
    time.sleep(0.5)
    for f in out_dir.glob("rank*.pid"):
        pid = int(f.read_text())
        if psutil.pid_exists(pid):
            try:
                assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"rank pid {pid} alive"
            except psutil.NoSuchProcess:
                pass


def test_two_rank_gloo_run_completes(tiny_params, tmp_path):
    r = launcher.launch("workbook_lib.distributed.worker", _config(tiny_params), nproc_per_node=2,
                        out_dir=tmp_path, timeout_s=120, threads_per_rank=1)
    assert set(r.ranks) == {0, 1}
    for rank in r.ranks.values():
        assert rank["backend"] == "gloo" and rank["world_size"] == 2
        s = rank["strategies"]["node_mask_shared"]
        assert len(s["ddp"]["step"]) == 2 and s["grad_bytes"] > 0
        assert {"strong", "accum_no_sync", "accum_sync_every", "ddp_gather_toggled"} <= set(s)
    summary = da.summarize_world(r.ranks, "node_mask_shared")
    assert summary["world_size"] == 2 and summary["step_median"] > 0
    _no_orphans(tmp_path)


def test_failing_rank_is_named_and_nothing_is_left(tiny_params, tmp_path):
    with pytest.raises(LaunchError) as e:
        launcher.launch("workbook_lib.distributed.worker", _config(tiny_params, fail_rank=1),
                        nproc_per_node=2, out_dir=tmp_path, timeout_s=120, threads_per_rank=1)
    assert "rank 1 failed" in str(e.value) and "injected failure" in str(e.value)
    _no_orphans(tmp_path)


def test_hanging_rank_times_out(tiny_params, tmp_path):
    t0 = time.time()
    with pytest.raises(LaunchError, match="silent"):
        launcher.launch("workbook_lib.distributed.worker", _config(tiny_params, hang_rank=0),
                        nproc_per_node=2, out_dir=tmp_path, timeout_s=8, threads_per_rank=1)
    assert time.time() - t0 < 60
    _no_orphans(tmp_path)


def test_free_port_is_bindable():
    import socket
    port = launcher.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_ring_model_and_fit():
    assert arm.ring_allreduce_seconds(1e9, 1, 10, 5) == 0.0
    t = arm.ring_allreduce_seconds(1e9, 4, 10.0, 20.0, num_calls=2)
    assert t == pytest.approx(1.5 * 1e9 / 10e9 + 40e-6)
    samples = [{"bytes": b, "seconds": arm.ring_allreduce_seconds(b, 2, 5.0, 30.0)}
               for b in (1e3, 1e5, 1e6, 1e7)]
    fit = arm.fit_ring(samples, 2)
    assert fit["bandwidth_gbps"] == pytest.approx(5.0, rel=1e-6)
    assert fit["latency_us"] == pytest.approx(30.0, rel=1e-6)
    assert arm.num_buckets(60 * 2**20, 25) == 3
    assert arm.predict_step(1.0, 1e9, 2, {"bandwidth_gbps": 1.0, "latency_us": 0.0},
                            overlap=0.5, bucket_cap_mb=1e6) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="'world_size'"):
        arm.ring_allreduce_seconds(1, 0, 1, 1)


def test_gap_decomposition_multiplies_out():
    def rk(times_slow, times_fast):
        return {0: {"strategies": {"a": {"batch_size": 28, "ddp": {"step": times_slow}},
                                   "b": {"batch_size": 64, "ddp": {"step": times_fast}}}}}
    res = {1: rk([2.0, 2.0], [0.5, 0.5]), 2: {**rk([3.0, 3.0], [0.5, 0.5]),
                                                1: rk([3.0, 3.0], [0.5, 0.5])[0]}}
    g = da.gap_decomposition(res, "a", "b", num_samples=6400)
    assert g["per_step_ratio"] == pytest.approx(4.0)
    assert g["ddp_factor"] == pytest.approx(1.5)
    assert g["total"] == pytest.approx(g["steps_ratio"] * 4.0 * 1.5)
