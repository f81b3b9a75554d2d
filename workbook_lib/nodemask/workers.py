"""Independent blocks of a batch run side by side on a CPU, one compute thread each.

A converted layer that every gene reaches runs a sample at a time on a CPU so that each sample's
tensors stay in cache (:mod:`.convert_dense`). Each of its operators is small (a ``[N, 64]``
product, 0.3 to 1.4 ms at the real spec) and PyTorch splits each one over every compute thread:
the threads meet after every operator, and a weight gradient ``g.T @ r`` (a 64 x 64 output over
6,607 rows) splits badly. Running whole samples side by side instead, each worker thread with
one compute thread of its own, gives each core one sample's work from end to end. On this
project's 2-core machine the TorchCell-shaped dense layer, forward and backward at B = 28 and
the real spec, took 0.857x the time (medians of 6 interleaved rounds: 1.50 s against 1.75 s).
PyTorch has no tool that does this in eager mode (``torch.jit.fork`` runs eager code inline;
its inter-op pool serves TorchScript), hence this module.

The workers run only where nothing watches this thread's operators: no ``TorchFunctionMode`` or
``TorchDispatchMode`` (the sync counter, line marks, ``equal``'s dtype guard and rounding model
see one thread only) and no profiler (03 attributes operators by the Python stack of the thread
that made them). There the blocks run in this thread, in order, as before: the same operations
per sample; the weight gradients' partial sums are added in another order, equal to rounding.
Tested both ways against each other and the per-sample reference (``tests/test_convert.py``).
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import torch
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

T = TypeVar("T")
_POOLS: dict[int, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def _one_thread() -> None:
    """A worker's initializer: one compute thread (OpenMP's and MKL's settings are this
    thread's own; the process's default is put back by :func:`spread`). PyTorch sets a thread's
    threads from the process's default at its first parallel operator unless it has read them
    before: read first, or the worker would take the default put back (found by a test)."""
    torch.get_num_threads()
    torch.set_num_threads(1)


def watched() -> bool:
    """Whether a ``TorchFunctionMode`` or ``TorchDispatchMode`` watches this thread's operators
    (the sync counter, line marks, ``equal``'s guards): work split across threads or chunks
    would look different to it."""
    return bool(_get_current_function_mode_stack() or _get_current_dispatch_mode_stack())


def workers(device: torch.device, blocks: int) -> int:
    """How many blocks run at once: this thread's compute threads on a CPU (at most
    ``blocks``), or 1 (a GPU; one thread; a mode or the profiler watching; one block)."""
    if device.type != "cpu" or blocks < 2 or torch.get_num_threads() < 2:
        return 1
    if watched() or torch._C._autograd._profiler_enabled():
        return 1
    return min(torch.get_num_threads(), blocks)


def spread(run: Callable[[int, int], T], n: int, k: int) -> list[T]:
    """``[run(lo, hi), ...]`` over ``k`` contiguous runs of ``range(n)`` of near equal size:
    in this thread where ``k`` is 1, else each in a worker with one compute thread, without
    gradient recording (as the calling ``autograd.Function`` runs) and in inference mode where
    the caller is (a worker's in-place write to a tensor made in it would fail), results in
    order."""
    if k <= 1:
        return [run(0, n)]
    cuts = [round(i * n / k) for i in range(k + 1)]
    threads = torch.get_num_threads()
    with _LOCK:
        pool = _POOLS.get(k)
        if pool is None:
            pool = _POOLS[k] = ThreadPoolExecutor(k, thread_name_prefix="nodemask-block",
                                                  initializer=_one_thread)

    inference = torch.is_inference_mode_enabled()  # thread-local, as grad mode is

    def quiet(lo: int, hi: int) -> T:
        with torch.inference_mode(inference), torch.no_grad():
            return run(lo, hi)
    try:
        jobs = [pool.submit(quiet, lo, hi) for lo, hi in zip(cuts[:-1], cuts[1:]) if hi > lo]
        return [j.result() for j in jobs]
    finally:
        torch.set_num_threads(threads)  # a worker's start set the process's default to 1
