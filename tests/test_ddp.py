"""Real torchrun launches (gloo, CPU): measured communication, and failures named right."""
import json
import os
import signal
import threading
import time

import psutil
import pytest

from workbook_lib.studies.ddp import allreduce_model as arm
from workbook_lib.studies.ddp import summary as da
from workbook_lib.distributed import launcher
from workbook_lib.distributed.plan import plan
from workbook_lib.exceptions import LaunchError
from workbook_lib.measurement.timing import Stat

from ddp_launches import MODULE, config as _config, tiny_params  # noqa: F401 (a fixture)


def _no_orphans(out_dir):
    time.sleep(0.5)
    for f in out_dir.glob("rank*.pid"):
        pid = launcher.local_pid(f)
        if psutil.pid_exists(pid):
            try:
                assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"pid {pid} alive"
            except psutil.NoSuchProcess:
                pass


def test_two_ranks_measure_communication_per_rank_wait_apart(tiny_params, tmp_path):
    """Rank 1 sleeps 80 ms before each step: rank 0's comm hook then waits for it, the transfer
    (the all-reduce after a barrier) does not; the wait is booked on rank 0, not on rank 1."""
    delay = 0.08
    r = launcher.launch(MODULE, _config(tiny_params, slow_rank=1, slow_rank_delay_s=delay),
                        nproc_per_node=2, out_dir=tmp_path, timeout_s=120, threads_per_rank=1)
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
    assert s.world_size == 2 and s.allreduce_grad.median > 0
    c0, c1 = s.comm_per_rank[0], s.comm_per_rank[1]
    assert c0.wait.median > 0.6 * delay, c0  # rank 0 waited for the sleeping rank
    assert c1.wait.median < 0.3 * delay, c1  # the slow rank itself hardly waits
    assert c0.transfer.median < 0.3 * delay  # the transfer carries no wait
    # the step's communication is the least-waiting rank's: near the transfer, not the sleep
    assert s.comm_total.median < 0.3 * delay
    assert c0.buckets == 1 and s.overlap == 0.0 and "by construction" in s.overlap_note
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
        # 20 s without progress: rank 0's own preparation (no heartbeat while it builds the
        # pipeline) took over 6 s on a loaded 2-core machine and was itself taken for a hang
        launcher.launch(MODULE, _config(tiny_params, hang_rank=1), nproc_per_node=2,
                        out_dir=tmp_path, timeout_s=20, threads_per_rank=1, startup_s=6)
    assert time.time() - t0 < 90
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
    return th, box, launcher.local_pid(tmp_path / "rank1.pid")


def test_stopped_rank_named_before_the_waiting_rank_times_out(tiny_params, tmp_path):
    """The launcher's stall timeout (20 s) is below what the waiting rank would wait: the
    process-group timeout is longer than every launcher limit, so rank 1 (stopped) is named,
    not rank 0 with its own "Timed out waiting" (the defect: equal timeouts, rank 0 blamed)."""
    assert launcher.pg_timeout_s(20) > 20 + launcher.STALE_S
    th, box, pid = _launch_in_thread(tiny_params, tmp_path, timeout_s=20)
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
    assert "stopped responding" in str(err) and "no heartbeat" in str(err)
    assert not (tmp_path / "rank0.error").exists()
    _no_orphans(tmp_path)


def test_the_stall_limit_applies_once_every_rank_is_in_its_training_loop(tiny_params,
                                                                         tmp_path):
    """The other way: the same silence in a training step (after start-up) stops the launch."""
    slow = launcher.MIN_TIMEOUT_S + 5
    with pytest.raises(LaunchError) as e:
        launcher.launch(MODULE, _config(tiny_params, steps=2, slow_rank=1,
                                        slow_rank_delay_s=slow),
                        nproc_per_node=2, out_dir=tmp_path, timeout_s=launcher.MIN_TIMEOUT_S,
                        threads_per_rank=1, startup_s=90)
    msg = str(e.value)
    assert e.value.kind == "hung" and "made no progress for 5 s" in msg, msg
    # rank 1 sleeps, rank 0 waits in the step's gradient all-reduce: both in 'training loop',
    # which cannot tell them apart; the message says so, and blames no rank
    assert "no rank reported progress" in msg and e.value.rank is None, msg
    _no_orphans(tmp_path)


def test_the_all_reduce_timings_show_progress_after_each_warm_up_and_repeat(monkeypatch):
    """The phase after the training loop: a tick per size's warm-up and per repeat, so that a
    long run of all-reduces is not taken for a stall (none of them makes a stage change)."""
    import torch
    from workbook_lib.distributed import worker
    from workbook_lib.measurement import timing

    calls = []
    monkeypatch.setattr(worker.dist, "all_reduce", lambda buf: calls.append("reduce"))
    monkeypatch.setattr(worker, "_barrier", lambda device: None)
    monkeypatch.setattr(timing, "sync", lambda device: None)
    out = worker.time_allreduces([4096, 65536, 1 << 20], torch.device("cpu"), 4,
                                 tick=lambda: calls.append("tick"))
    assert [o["bytes"] for o in out] == [4096, 65536, 1 << 20]
    per_size = ["reduce", "reduce", "tick"] + ["reduce", "tick"] * 4
    assert calls == per_size * 3


def test_a_stall_limit_shorter_than_a_few_heartbeats_is_refused(tiny_params, tmp_path):
    """Progress reaches the launcher with the heartbeats, once a second: a 1 s limit cannot tell
    a healthy rank from a silent one (it stopped a healthy launch on a loaded CI machine)."""
    with pytest.raises(ValueError, match="at least 5 s: ranks report progress once a second"):
        launcher.launch(MODULE, _config(tiny_params, steps=2), nproc_per_node=2,
                        out_dir=tmp_path, timeout_s=1, threads_per_rank=1)
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_several_nodes_without_a_rendezvous_are_refused_before_anything_is_written(tiny_params,
                                                                                    tmp_path):
    out = tmp_path / "launch"
    with pytest.raises(ValueError, match="'rdzv_endpoint' .* is required when nnodes > 1"):
        launcher.launch(MODULE, _config(tiny_params), nproc_per_node=1, nnodes=2, out_dir=out)
    assert not out.exists()


def test_several_nodes_outside_slurm_are_refused_before_anything_is_written(tiny_params,
                                                                          tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    out = tmp_path / "launch"
    with pytest.raises(LaunchError, match="nnodes=2 needs a SLURM allocation") as e:
        launcher.launch(MODULE, _config(tiny_params), nproc_per_node=1, nnodes=2,
                        rdzv_endpoint="127.0.0.1:29500", out_dir=out)
    assert e.value.kind == "start" and not out.exists()


def test_the_silence_allowed_follows_the_launch_phase():
    allowed = lambda beats, started=False, nnodes=1: launcher.allowed_silence_s(  # noqa: E731
        beats, world=2, nnodes=nnodes, started=started, timeout_s=5.0, startup_s=300.0)
    loop, done = {"stage": "training loop"}, {"stage": "done"}
    # importing: a caller's start-up allowance longer than STARTUP_S is kept (it was ignored)
    assert allowed({0: loop}) == 300.0
    assert launcher.allowed_silence_s({}, world=2, nnodes=1, started=False, timeout_s=5.0,
                                      startup_s=6.0) == launcher.STARTUP_S
    assert allowed({0: {"stage": "building model"}, 1: loop}) == 300.0  # starting
    assert allowed({0: loop, 1: loop}, started=True) == 5.0  # training: the stall limit
    assert allowed({0: done, 1: done}, started=True) == 300.0  # tear-down
    assert allowed({}, nnodes=2) == 300.0  # another node's ranks beat elsewhere


def test_diagnose_names_a_rank_that_never_started():
    now = time.time()
    blame, why = launcher.diagnose_stall({0: {"time": now, "stage": "init_process_group "
                                              "(rendezvous)"}}, now=now, world=2)
    assert blame == [1] and "rank 1 never started" in why


def test_pid_files_of_other_hosts_are_never_signalled(tmp_path):
    f = tmp_path / "rank3.pid"
    f.write_text(json.dumps({"pid": os.getpid(), "host": "some-other-node"}))
    assert launcher.local_pid(f) is None
    import socket
    f.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    assert launcher.local_pid(f) == os.getpid()
    f.write_text("garbage")
    assert launcher.local_pid(f) is None


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
    assert pl.launches[0].threads_per_rank == 4  # the same at every world size
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
    # timings whose intercept comes out negative (noise at a CPU's small sizes): no negative
    # latency, so no negative all-reduce predicted at more ranks (found by a user trial)
    noisy = [(2, 1e4, 1e-6), (2, 1e5, 1e-5), (2, 1e6, 1e-3)]
    fit = arm.fit_ring(noisy)
    assert fit.latency_us == 0.0 and "refitted with latency 0" in fit.notes[-1]
    assert all(arm.comm_seconds(1e3, w, fit.link()) >= 0 for w in (2, 8, 16))


def _world(slow: list[list[float]], fast: list[list[float]], threads=1):
    """A world summary with per-launch step series of the two gap strategies."""
    from workbook_lib.studies.ddp.summary import _ratio_series
    from workbook_lib.results.ddp import WorldSummary

    ratio = [_ratio_series(a, b) for a, b in zip(slow, fast)]
    w = WorldSummary.__new__(WorldSummary)
    w.per_step_ratio = Stat.from_samples([x for r in ratio for x in r])
    w.ratio_series = ratio
    w.step_series = {"a": slow, "b": fast}
    w.threads_per_rank, w.thread_effect, w.threads_all = [threads], None, None
    return w


def test_gap_always_applies_the_ddp_factor_with_its_uncertainty():
    """No threshold: a factor whose IQR holds 1 is applied all the same and widens the gap's
    IQR; a real factor multiplies the gap; each strategy gets its own step factor."""
    base = _world([[2.0, 2.1, 1.9, 2.0], [2.0, 2.0, 2.1, 1.9]], [[0.5] * 4, [0.5] * 4])
    near = _world([[2.05, 2.0, 1.95, 2.1], [2.1, 2.0, 1.9, 2.0]], [[0.5, 0.51, 0.49, 0.5]] * 2)
    g = da.gap_decomposition({1: base, 2: near}, "a", "b", {"a": 28, "b": 64})
    assert g.ddp_within_noise  # descriptive only
    assert g.total.median == pytest.approx(g.per_step_ratio.median * 64 / 28 *
                                           g.ddp_factor.median)
    assert g.ddp_factor.median != 1.0 and g.total.iqr > base.per_step_ratio.iqr * 64 / 28
    assert len(g.factor_by_pair) == 2 and g.arithmetic == ["steps per epoch"]
    slower = _world([[3.0, 3.1, 2.9, 3.0], [3.0, 3.0, 3.1, 2.9]], [[0.5] * 4, [0.5] * 4])
    g2 = da.gap_decomposition({1: base, 2: slower}, "a", "b", {"a": 28, "b": 64})
    assert g2.ddp_factor.median == pytest.approx(1.5, rel=0.03)
    assert g2.total.median == pytest.approx(4.0 * 64 / 28 * 1.5, rel=0.03)
    assert g2.step_factors["a"].median == pytest.approx(1.5, rel=0.03)
    assert g2.step_factors["b"].median == pytest.approx(1.0)


def test_launch_factor_pairs_adjacent_launches():
    """A machine that slows down between rounds cancels out of the paired factor: each pair of
    adjacent launches gives its own ratio (kept apart), the pooled factor their spread."""
    base = [[1.0] * 5, [2.0] * 5]  # the second round ran on a machine twice as slow
    top = [[1.2] * 5, [2.4] * 5]
    f = da.launch_factor(top, base)
    assert f.by_pair == pytest.approx([1.2, 1.2]) and f.stat.median == pytest.approx(1.2)
    assert f.stat.iqr == pytest.approx(0.0) and f.pairs == 2
    # without pairing (all of one world size against all of the other) the drift would show
    pooled = Stat.from_samples(sum(top, [])).ratio_to(Stat.from_samples(sum(base, [])))
    assert pooled.iqr > 0.5
    with pytest.raises(ValueError, match="at least one launch"):
        da.launch_factor([], base)


def test_plan_gives_equal_threads_per_rank_at_every_world_size():
    import torch

    pl = plan([1, 2], backend="auto", device=torch.device("cpu"), cpus=(2, "test"))
    assert [ln.threads_per_rank for ln in pl.launches] == [1, 1]
    assert pl.launches[0].threads_all == 2 and pl.launches[1].threads_all is None
    w = plan([1, 2, 4], backend="auto", device=torch.device("cpu"), cpus=(16, "SLURM"),
             num_workers=3)
    assert {(ln.threads_per_rank, ln.workers_per_rank) for ln in w.launches} == {(1, 3)}
    assert w.launches[0].threads_all == 13
    gpu = plan([1, 2], backend="nccl", device=torch.device("cuda"), cpus=(8, "SLURM"),
               gpus=(2, "test"), num_workers=2)
    assert [(ln.threads_per_rank, ln.workers_per_rank) for ln in gpu.launches] == [(2, 2)] * 2
    starved = plan([1, 2], backend="auto", device=torch.device("cpu"), cpus=(2, "t"),
                   num_workers=4)
    assert starved.launches[0].workers_per_rank == 1 and "workers per rank: 1" in starved.notes[-1]


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


@pytest.fixture
def cuda_only_group(tmp_path):
    """A one-process group whose backend serves only CUDA tensors (as NCCL does): any CPU tensor
    in a collective fails, as it did on every NCCL rank at its first stop check."""
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("cuda:gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_cuda_only_group_refuses_cpu_tensors(cuda_only_group):
    """The trap that caught the defect: the stop-flag all-reduce on a CPU tensor fails in a group
    that serves only CUDA (with NCCL, every rank failed at its first stop check)."""
    import torch

    from workbook_lib.distributed import worker

    with pytest.raises(RuntimeError, match="device type cpu"):
        worker._agree(False, torch.device("cpu"))


def test_every_worker_collective_uses_the_rank_device(cuda_only_group, monkeypatch):
    """The worker's collectives put their tensors on the device they are given (a stand-in
    device here; a hard-coded CPU tensor would be recorded as cpu and fail the group)."""
    import torch

    from workbook_lib.distributed import worker

    seen = []

    class Seen(Exception):
        pass

    def spy(t, *a, **k):
        seen.append(t.device.type)
        raise Seen

    monkeypatch.setattr(worker.dist, "all_reduce", spy)
    meta = torch.device("meta")
    for call in (lambda: worker._agree(True, meta),
                 lambda: worker.time_allreduces([4096], meta, 1)):
        with pytest.raises(Seen):
            call()
    assert seen == ["meta", "meta"]


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_worker_collectives_run_on_cuda_in_a_cuda_only_group(cuda_only_group):
    import torch

    from workbook_lib.distributed import worker

    dev = torch.device("cuda", 0)
    assert worker._agree(True, dev) is True
    got = worker.time_allreduces([4096], dev, 2)
    assert got[0]["seconds"].median > 0
