"""CUDA paths driven from the CPU where the same code runs: the pipelined step's syncs, the loss
tolerance on CUDA, the CUDA-event comm timing (skipped without CUDA)."""
import pytest
import torch

from workbook_lib.analysis.adoption import loss_tolerance
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
