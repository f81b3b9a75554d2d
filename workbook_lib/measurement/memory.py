"""Peak memory of one training step, measured so that the figure belongs to that step.

:func:`peak_during` measures a call in this process: on CPU, ``VmHWM`` after the call (reset
through ``/proc/self/clear_refs``, else an RSS-sampling thread) minus ``VmRSS`` before it; on
CUDA, ``max_memory_reserved`` after the call minus what was reserved before, one probe per GPU
at a time. :func:`measure_in_fresh_process` measures one point in a process forked by
multiprocessing's fork server: the caller's set-up, one warm-up step, then the measured step.
An out-of-memory point is recorded as such. :func:`fit_memory` fits
``bytes = fixed + per_sample * B`` on at least three batch sizes and states how far its
projection extrapolates. Why each choice: docs/development.md, "measurement/memory.py".
"""
from __future__ import annotations

import ctypes
import gc
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..common.files import pin_multiprocessing_temp, system_temp
from ..common.locks import locked
from ..results.memory import (STATUS_BELOW, STATUS_FAILED, STATUS_OK, STATUS_OOM,  # noqa: F401
                              STATUS_TIMEOUT, MemoryFit, MemoryPoint, PeakMemory)

# a probe's process is forked from a server that imported PyTorch once (spawned where there is
# no fork server: another OS)
_START = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"

CPU_RESOLUTION_BYTES = 1 << 20  # RSS moves by about this much without any tensor work

_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory",
             "memoryerror", "failed to allocate")


def is_oom(exc: BaseException) -> bool:
    """Host or device out-of-memory as Python or PyTorch raises it (CPU: ``MemoryError`` or
    ``RuntimeError: DefaultCPUAllocator: can't allocate memory``; CUDA: ``OutOfMemoryError``)."""
    if isinstance(exc, MemoryError):
        return True
    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    return isinstance(exc, RuntimeError) and any(t in str(exc).lower() for t in _OOM_TEXT)


def caused_by_oom(exc: BaseException) -> bool:
    """:func:`is_oom` for ``exc`` or an exception it was raised from or during (a pipeline's
    failure record wraps the error its code raised)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if is_oom(e):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def oom_text(text: str) -> bool:
    """True when an error message (e.g. a child's stderr) reports an out-of-memory."""
    low = text.lower()
    return any(t in low for t in _OOM_TEXT)


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise OSError(f"{key} not in /proc/self/status")


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _rss() -> int:
    try:
        return _status_bytes("VmRSS:")
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss


def peak_during(fn: Callable[[], object], device: torch.device | str = "cpu") -> PeakMemory:
    """Run ``fn()`` and return its peak memory above the level just before it.

    Args:
        fn: the work (e.g. one training step).
        device: ``cpu`` (resident set of this process) or a CUDA device (allocated memory).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        # the caching allocator keeps what earlier work freed: give it back first, so that the
        # step's reserved peak is what the step takes from the device (its blocks, rounding and
        # fragmentation), not what an earlier step left cached
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_reserved(dev)
        alloc_before = torch.cuda.memory_allocated(dev)
        fn()
        torch.cuda.synchronize(dev)
        alloc = torch.cuda.max_memory_allocated(dev) - alloc_before
        return PeakMemory(torch.cuda.max_memory_reserved(dev) - before, before,
                          "torch.cuda.max_memory_reserved after empty_cache and "
                          f"reset_peak_memory_stats (tensors alone: {alloc / 1e6:.3g} MB "
                          "max_memory_allocated)")
    if _reset_hwm():
        before = _rss()
        fn()
        return PeakMemory(max(0, _status_bytes("VmHWM:") - before), before,
                          "VmHWM after resetting it (/proc/self/clear_refs) minus VmRSS before")
    before = _rss()
    peak = [before]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        fn()
    finally:
        stop.set()
        th.join()
    peak[0] = max(peak[0], _rss())
    return PeakMemory(peak[0] - before, before, "RSS sampled every 1 ms by a thread")


def return_freed_memory_to_os() -> bool:
    """glibc: serve every block above 64 KiB by mmap and give it back at free (fixed
    thresholds, so a peak does not stay resident after the step). False where not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return libc.mallopt(m_mmap_threshold, 64 * 1024) == 1 and \
        libc.mallopt(m_trim_threshold, 128 * 1024) == 1


@dataclass
class StepToMeasure:
    """What a set-up (run in the fresh process) hands the measurement: the step, the device it
    runs on, and what to do between the warm-up step and the measured one."""

    step: Callable[[], object]
    device: torch.device
    after_warm_up: Callable[[], object] = lambda: None


def _probe(send, log: str, threads: int, setup: Callable[[dict], StepToMeasure],
           cfg: dict) -> None:
    """The fresh process: its output to ``log``, the caller's thread count and the platform's
    start method (a DataLoader's workers start as in the caller), an end when the caller ends,
    then :func:`_child`; sends its dict, or, when the set-up or a step raises, the traceback
    (also on stderr), the exception's ``details`` (a dict the set-up may attach) and whether it
    was an out-of-memory (:func:`caused_by_oom`)."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    multiprocessing.set_start_method(None, force=True)  # not the fork server's, inherited
    caller = multiprocessing.parent_process().sentinel  # ready when the caller is gone
    threading.Thread(target=lambda: multiprocessing.connection.wait([caller]) and os._exit(1),
                     daemon=True).start()  # killed, interrupted: the probe does not outlive it
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    try:
        send.send(_child(setup, cfg))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which records it
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        sys.stderr.flush()
        details = getattr(exc, "details", None)
        send.send({"failed": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
                   "traceback": tb, "details": details if isinstance(details, dict) else {},
                   "oom": caused_by_oom(exc)})


def _child(setup: Callable[[dict], StepToMeasure], cfg: dict) -> dict:
    """The caller's set-up builds the step, then one warm-up step, then the measured step."""
    freed = return_freed_memory_to_os()  # after the imports, before the set-up's allocations
    target = setup(cfg)
    device = torch.device(target.device)
    target.step()
    target.after_warm_up()
    gc.collect()
    peak = peak_during(target.step, device)
    method = peak.method + ("" if freed or device.type == "cuda"
                            else " (glibc thresholds not set: freed memory may stay resident)")
    return {"step_bytes": peak.bytes, "setup_bytes": peak.before_bytes, "method": method}


def _run_fresh(setup: Callable, cfg: dict, threads: int,
               timeout_s: float) -> tuple[dict | None, int | None, str]:
    """:func:`_probe` in a process forked from multiprocessing's fork server: what it sent
    (None if it died first; ``{"timed out": True}`` past ``timeout_s``, when it is killed), its
    exit code, and its stdout and stderr."""
    ctx = multiprocessing.get_context(_START)
    if _START == "forkserver":  # the server is started once per process, on the first probe
        ctx.set_forkserver_preload(["torch", __name__, setup.__module__])
    recv, send = ctx.Pipe(duplex=False)
    with tempfile.NamedTemporaryFile(prefix="workbook-probe-", suffix=".log") as log:
        proc = ctx.Process(target=_probe, args=(send, log.name, threads, setup, cfg),
                           name="workbook-memory-probe")
        pin_multiprocessing_temp()  # a socket path that fits, whatever TMPDIR is
        proc.start()
        send.close()
        try:
            got = recv.recv() if recv.poll(timeout_s) else {"timed out": True}
        except EOFError:  # died without a word: killed, or crashed
            got = None
        if got is not None and got.get("timed out"):
            proc.kill()
        proc.join()
        recv.close()
        return got, proc.exitcode, log.read().decode(errors="replace")


def probe_threads() -> int:
    """The compute threads of a probe: ``OMP_NUM_THREADS`` when set (what a fresh PyTorch
    process would take), else this process's PyTorch setting. A study that runs probes side by
    side divides the CPUs by this, the same figure the probes run with."""
    try:
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    except (KeyError, ValueError):
        return torch.get_num_threads()


def measure_in_fresh_process(setup: Callable[[dict], StepToMeasure], cfg: dict, point: dict, *,
                             device: str = "cpu", timeout_s: float = 900.0) -> MemoryPoint:
    """Peak memory of one step in a fresh process (see module docs).

    Args:
        setup: a module-level function (it is pickled by name) that the fresh process calls
            with ``cfg`` and that returns a :class:`StepToMeasure` (what to build belongs to
            the caller's layer, not here).
        cfg: the set-up's argument (picklable).
        point: the :class:`MemoryPoint` fields that name the point (strategy, form, batch_size,
            scale, hidden, layers).
        device: where the step runs (``cpu`` or a CUDA device; one probe per GPU at a time).
        timeout_s: the fresh process's time limit; past it, it is killed.
    """
    try:
        pickle.dumps(setup)
    except Exception as exc:  # noqa: BLE001 - pickle raises several kinds
        raise ValueError(f"'setup' must be a module-level function, picklable by name (got "
                         f"{setup!r}: {exc})") from None
    base = dict(point, device=device)
    t0 = time.perf_counter()
    with gpu_lock(device):
        res, code, output = _run_fresh(setup, cfg, probe_threads(), timeout_s)
    secs = time.perf_counter() - t0
    if res is not None and res.get("timed out"):
        return MemoryPoint(**base, status=STATUS_TIMEOUT, seconds=secs,
                           reason=f"the probe ran longer than {timeout_s:.0f} s")
    if res is None or "failed" in res:
        err = output.strip().splitlines()[-1] if output.strip() else ""
        if code in (-9, 137):
            return MemoryPoint(**base, status=STATUS_OOM, seconds=secs,
                               reason="the probe was killed by the kernel (OOM killer)")
        # the probe's own word when it sent one (the exception itself, not text that may quote
        # a user's message); its output only when it died without one
        if res.get("oom") if res is not None else oom_text(output):
            return MemoryPoint(**base, status=STATUS_OOM, seconds=secs, reason=err)
        res = res or {}
        return MemoryPoint(**base, status=STATUS_FAILED, seconds=secs,
                           reason=res.get("failed") or f"exit {code}: {err}",
                           traceback=res.get("traceback") or output[-5000:],
                           details=res.get("details") or {})
    status, reason = STATUS_OK, None
    if not device.startswith("cuda") and res["step_bytes"] < CPU_RESOLUTION_BYTES:
        status = STATUS_BELOW
        reason = (f"{res['step_bytes'] / 1e6:.2f} MB is below the {CPU_RESOLUTION_BYTES / 1e6:.1f}"
                  " MB resolution of resident-set measurements")
    return MemoryPoint(**base, status=status, step_bytes=res["step_bytes"],
                       setup_bytes=res["setup_bytes"], method=res["method"], reason=reason,
                       seconds=secs)


@contextmanager
def gpu_lock(device: str):
    """Holds an exclusive lock per GPU (``workbook-gpu-<uuid or index>.lock`` in the machine's
    temporary folder, shared by every user) for CUDA devices, so that two probes (two notebooks, two clones) never measure
    one GPU at once; a no-op for the CPU."""
    dev = torch.device(device)
    if dev.type != "cuda":
        yield
        return
    idx = dev.index or 0
    try:
        ident = str(torch.cuda.get_device_properties(idx).uuid)
    except Exception:  # noqa: BLE001 - older builds have no uuid: the index
        ident = str(idx)
    with locked(system_temp() / f"workbook-gpu-{ident}.lock", shared_by_all=True):
        yield


def device_budget(device: torch.device | str) -> tuple[float, str]:
    """The memory a run on ``device`` has: for CPU runs the tightest of host RAM, an rlimit, a
    cgroup and SLURM's request; on CUDA what ``mem_get_info`` says is free (after this process's
    allocator gave its cache back) plus what this process's allocator still holds for live
    tensors: the CUDA context and other processes' memory are not available to a step."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(dev)
        held = torch.cuda.memory_reserved(dev)
        props = torch.cuda.get_device_properties(dev)
        return float(free + held), (f"GPU memory free for tensors ({props.name}: "
                                    f"{(free + held) / 1e9:.1f} of {total / 1e9:.1f} GB; "
                                    "mem_get_info, context and other processes excluded)")
    from ..common.device import memory_limit

    return memory_limit()


def fit_memory(points: list[MemoryPoint], budget_bytes: float, budget_label: str, *,
               label: str = "", min_points: int = 3) -> MemoryFit:
    """Least-squares line through the usable points; the projection needs ``min_points``
    distinct batch sizes and a positive slope, and otherwise says why it was not made."""
    usable = [p for p in points if p.usable]
    out = MemoryFit(label=label or (points[0].label if points else ""),
                    budget_bytes=budget_bytes, budget_label=budget_label)
    out.points = [(p.batch_size, float(p.step_bytes)) for p in usable]
    sizes = {b for b, _ in out.points}
    if len(sizes) < min_points:
        bad = [f"B={p.batch_size}: {p.status}" for p in points if not p.usable]
        out.status = "too few points"
        out.reason = (f"{len(sizes)} usable batch size(s), {min_points} needed"
                      + (f" ({'; '.join(bad)})" if bad else ""))
        return out
    n = len(out.points)
    mb = sum(b for b, _ in out.points) / n
    my = sum(y for _, y in out.points) / n
    slope = sum((b - mb) * (y - my) for b, y in out.points) / sum(
        (b - mb) ** 2 for b, _ in out.points)
    icpt = my - slope * mb
    out.per_sample_bytes, out.intercept_bytes = slope, icpt
    out.residuals = [y - (icpt + slope * b) for b, y in out.points]
    out.max_abs_rel_residual = max(abs(r) / y for r, (_, y) in zip(out.residuals, out.points))
    out.setup_bytes = float(max(p.setup_bytes or 0 for p in usable))
    out.largest_measured_batch = max(sizes)
    if slope <= 0:
        out.status = "no growth"
        out.reason = "the step's peak does not grow with the batch size at these points"
        return out
    free = budget_bytes - out.setup_bytes - icpt
    out.largest_batch = max(0, math.floor(free / slope))
    out.extrapolation_factor = out.largest_batch / out.largest_measured_batch
    return out
