"""Real torchrun launches (gloo, CPU): measured communication, and failures named right."""
import json
import os
import signal
import threading
import time

import psutil
import pytest

from workbook_lib.distributed import allreduce_model as arm
from workbook_lib.distributed import analysis as da
from workbook_lib.distributed import launcher
from workbook_lib.distributed.plan import plan
from workbook_lib.exceptions import LaunchError
from workbook_lib.measurement.timing import Stat
from workbook_lib.running import params as params_mod
from workbook_lib.data import snapshots

MODULE = "workbook_lib.distributed.worker"


@pytest.fixture(scope="module")
def tiny_params():
    p = params_mod.validate({"scale": 0.002, "hidden": 4, "layers": 1, "device": "cpu",
                             "perturbation_k": 2, "grad_accum_steps": 2, "batch_size_lazy": 2,
                             "batch_size_dango": 4, "ddp_batch_size": 2,
                             "exactness_genes": 10})
    snapshots.load_snapshot(p)  # cache it before ranks start
    return p


def _config(p, steps=3, **extra):
    return {"params": p, "scaling_strategy": "node_mask_shared",
            "gap_strategies": ["replicated_mask_cpu", "dango_wildtype"], "batch_size": 2,
            "global_batch": 4, "steps": steps, "steps_cap": steps, "warmup": 1,
            "budget_s": 60, "timeout_s": 60, **extra}


def _no_orphans(out_dir):
    time.sleep(0.5)
    for f in out_dir.glob("rank*.pid"):
        pid = int(f.read_text())
        if psutil.pid_exists(pid):
            try:
                assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"pid {pid} alive"
            except psutil.NoSuchProcess:
                pass


def test_two_ranks_measure_communication(tiny_params, tmp_path):
    r = launcher.launch(MODULE, _config(tiny_params), nproc_per_node=2, out_dir=tmp_path,
                        timeout_s=120, threads_per_rank=1)
    assert set(r.ranks) == {0, 1}
    for rank in r.ranks.values():
        assert rank["backend"] == "gloo" and rank["threads"] == 1
        assert {"node_mask_shared/ddp", "node_mask_shared/no_sync", "node_mask_shared/strong",
                "replicated_mask_cpu/gap"} <= set(rank["arms"])
        ddp = rank["arms"]["node_mask_shared/ddp"]
        assert ddp["timed_steps"] == 3 and "comm_exposed" in ddp["extra"]
        assert "comm_total" not in rank["arms"]["node_mask_shared/no_sync"]["extra"]
    s = da.summarize(r.ranks, scaling="node_mask_shared",
                     gap=["replicated_mask_cpu", "dango_wildtype"], procs_per_node=2, nnodes=1)
    assert s.world_size == 2 and s.comm_total.median > 0 and s.allreduce_grad.median > 0
    assert s.comm_exposed.median <= s.comm_total.median * 1.01 + 1e-6
    assert s.strong_batch == 2 and s.global_batch == 4
    _no_orphans(tmp_path)


def test_failing_rank_is_named(tiny_params, tmp_path):
    with pytest.raises(LaunchError) as e:
        launcher.launch(MODULE, _config(tiny_params, fail_rank=1), nproc_per_node=2,
                        out_dir=tmp_path, timeout_s=120, threads_per_rank=1)
    assert e.value.rank == 1 and e.value.kind == "failed"
    assert "rank 1 failed" in str(e.value) and "injected failure" in str(e.value)
    _no_orphans(tmp_path)


def test_hung_rank_is_named_not_the_one_waiting(tiny_params, tmp_path):
    t0 = time.time()
    with pytest.raises(LaunchError) as e:
        launcher.launch(MODULE, _config(tiny_params, hang_rank=1), nproc_per_node=2,
                        out_dir=tmp_path, timeout_s=6, threads_per_rank=1)
    assert time.time() - t0 < 60
    assert e.value.kind == "hung" and e.value.rank == 1, str(e.value)
    assert "waiting for it: rank 0" in str(e.value)
    _no_orphans(tmp_path)


def _launch_in_thread(p, tmp_path, timeout_s):
    box = {}

    def go():
        try:
            launcher.launch(MODULE, _config(p, steps=100000, budget_s=600), nproc_per_node=2,
                            out_dir=tmp_path, timeout_s=timeout_s, threads_per_rank=1)
        except LaunchError as exc:
            box["error"] = exc
    th = threading.Thread(target=go)
    th.start()
    deadline = time.time() + 90
    beats = {}
    while time.time() < deadline:
        beats = launcher.read_heartbeats(tmp_path)
        if len(beats) == 2 and all(b.get("stage") == "training loop" for b in beats.values()):
            break
        time.sleep(0.2)
    assert len(beats) == 2, "the ranks never reached the training loop"
    return th, box, int((tmp_path / "rank1.pid").read_text())


def test_stopped_rank_is_named(tiny_params, tmp_path):
    th, box, pid = _launch_in_thread(tiny_params, tmp_path, timeout_s=12)
    os.kill(pid, signal.SIGSTOP)
    try:
        th.join(120)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    err = box.get("error")
    assert err is not None and err.kind == "hung" and err.rank == 1, err
    assert "no heartbeat" in str(err)
    _no_orphans(tmp_path)


def test_killed_rank_is_named(tiny_params, tmp_path):
    th, box, pid = _launch_in_thread(tiny_params, tmp_path, timeout_s=60)
    os.kill(pid, signal.SIGKILL)
    th.join(120)
    err = box.get("error")
    assert err is not None and err.rank == 1 and "died" in str(err), err
    _no_orphans(tmp_path)


def test_free_port_is_bindable():
    import socket
    port = launcher.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_two_node_plan_with_every_world_size():
    import torch

    pl = plan([1, 2, 4], backend="auto", device=torch.device("cpu"), nnodes=2,
              cpus=(8, "test"))
    assert [ln.world_size for ln in pl.launches] == [2, 4]
    assert pl.launches[0].procs_per_node == 1 and pl.launches[1].threads_per_rank == 4
    assert "divide over 2 nodes" in pl.skipped[1]
    one = plan([1, 2, 4], backend="nccl", device=torch.device("cpu"), nnodes=1,
               cpus=(2, "SLURM_CPUS_PER_TASK"))
    assert [ln.world_size for ln in one.launches] == [1, 2] and "4" not in str(one.launches)
    assert "SLURM_CPUS_PER_TASK" in one.skipped[4] and one.backend == "gloo" and one.notes


def test_ring_model_fit_presets_and_extrapolation():
    assert arm.ring_allreduce_seconds(1e9, 1, 10, 5) == 0.0
    samples = [(n, b, arm.ring_allreduce_seconds(b, n, 5.0, 30.0))
               for n in (2, 4) for b in (1e3, 1e5, 1e6, 1e7)]
    fit = arm.fit_ring(samples)
    assert fit.bandwidth_gbps == pytest.approx(5.0, rel=1e-6)
    assert fit.latency_us == pytest.approx(30.0, rel=1e-6) and fit.world_sizes == [2, 4]
    preds = {name: arm.comm_seconds(1e6, 8, link) for name, link in arm.LINK_PRESETS.items()}
    assert len(set(round(v, 9) for v in preds.values())) == len(preds)  # each link differs
    with pytest.raises(ValueError, match="at least 2"):
        arm.fit_ring([(1, 1e3, 1e-4)])


def _world(step_slow, step_fast):
    class W:
        pass
    w = W()
    w.per_step_ratio = Stat.from_samples([a / b for a, b in zip(step_slow, step_fast)])
    return w


def test_gap_decomposition_books_ddp_only_beyond_noise():
    base = _world([2.0, 2.1, 1.9, 2.0], [0.5, 0.5, 0.5, 0.5])
    same = _world([2.05, 2.0, 1.95, 2.1], [0.5, 0.51, 0.49, 0.5])
    g = da.gap_decomposition({1: base, 2: same}, "a", "b", {"a": 28, "b": 64})
    assert g.ddp_within_noise and g.total.median == pytest.approx(4.0 * 64 / 28)
    assert g.arithmetic == ["steps per epoch"]
    slower = _world([3.0, 3.1, 2.9, 3.0], [0.5, 0.5, 0.5, 0.5])
    g2 = da.gap_decomposition({1: base, 2: slower}, "a", "b", {"a": 28, "b": 64})
    assert not g2.ddp_within_noise and g2.ddp_factor.median == pytest.approx(1.5)
    assert g2.total.median == pytest.approx(4.0 * 64 / 28 * 1.5)


def test_heartbeat_survives_concurrent_writers(tmp_path):
    """The beat thread and a rank's stage changes write the same file: no lost temp file (the
    writer without its lock raised FileNotFoundError here within a few hundred writes)."""
    from workbook_lib.distributed.worker import Heartbeat

    def hammer(hb):
        hb.start()
        try:
            for i in range(3000):
                hb.set(f"stage {i}")
        finally:
            hb.stop()

    hammer(Heartbeat(tmp_path / "rank0.heartbeat", interval=0.0))
    assert json.loads((tmp_path / "rank0.heartbeat").read_text())["progress"] >= 3000
