"""The training loop of notebook 03: a real DataLoader, four modes, per-stage attribution.

Modes: ``data`` (fetch, process, collate, transfer, device prep, and a trivial loss so the loop
is real), ``forward`` (+ model forward and loss), ``forward_backward`` (+ backward) and
``full`` (+ AdamW step). Each main-process stage is timed between device syncs and wrapped in a
``wb:<stage>`` profiler range; worker-side fetch/process and collate times are measured inside
the workers and travel back with the batch.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch.profiler import record_function
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from ..strategies import Strategy
from ..measurement.syncs import SyncCounter
from ..measurement.timing import StageTimer

MODES = ("data", "forward", "forward_backward", "full")
MAIN_STAGES = ("loader_wait", "h2d", "device_prep", "forward", "backward", "optimizer")
WORKER_STAGES = ("worker_fetch", "worker_collate")


def synthetic_labels(pert: torch.Tensor) -> torch.Tensor:
    """A deterministic scalar label per perturbation (the workbook times, it does not learn)."""
    return torch.sin((pert.clamp(min=0).float() + 1).sum(-1) * 0.37)


class PerturbationDataset(Dataset):
    """Dataset item i = ``strategy.make_item(i, pert[i])`` plus its label, timed in the worker."""

    def __init__(self, strategy: Strategy, pert: torch.Tensor):
        self.strategy, self.pert = strategy, pert
        self.labels = synthetic_labels(pert)

    def __len__(self):
        return len(self.pert)

    def __getitem__(self, i):
        t0 = time.perf_counter()
        item = self.strategy.make_item(i, self.pert[i])
        item["y"] = self.labels[i]
        item["_fetch_s"] = time.perf_counter() - t0
        return item


class TimedCollate:
    """The strategy's collate, timed, with the items' fetch times summed (runs in workers)."""

    def __init__(self, strategy: Strategy):
        self.strategy = strategy

    def __call__(self, items):
        t0 = time.perf_counter()
        batch = self.strategy.collate(items)
        batch["y"] = torch.stack([it["y"] for it in items])
        collate_s = time.perf_counter() - t0
        batch["_worker"] = {"fetch_s": sum(it["_fetch_s"] for it in items),
                            "collate_s": collate_s}
        return batch


def make_loader(strategy: Strategy, pert: torch.Tensor, batch_size: int, *, num_workers: int = 0,
                pin_memory: bool = False, persistent_workers: bool = False) -> DataLoader:
    return DataLoader(PerturbationDataset(strategy, pert), batch_size=batch_size, shuffle=False,
                      num_workers=num_workers, collate_fn=TimedCollate(strategy),
                      pin_memory=pin_memory, drop_last=True,
                      persistent_workers=persistent_workers and num_workers > 0)


@dataclass
class LoopResult:
    strategy: str
    mode: str
    batch_size: int
    steps: int
    stage_medians: dict = field(default_factory=dict)
    step_seconds: list = field(default_factory=list)
    syncs_per_step: float = 0.0
    sync_kinds: dict = field(default_factory=dict)
    step_spans: list = field(default_factory=list)  # (start, end) perf_counter of each step

    @property
    def step_median(self) -> float:
        s = sorted(self.step_seconds)
        return s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])

    @property
    def it_per_s(self) -> float:
        return 1.0 / self.step_median

    @property
    def ms_per_sample(self) -> float:
        return 1e3 * self.step_median / self.batch_size


@contextmanager
def _stage(timer: StageTimer, name: str):
    """Time a stage (between device syncs) inside a ``wb:<stage>`` profiler range."""
    with record_function(f"wb:{name}"), timer.stage(name):
        yield


def run_loop(strategy: Strategy, model, pert: torch.Tensor, *, mode: str, batch_size: int,
             steps: int, warmup_steps: int = 1, dual: bool = False, num_workers: int = 0,
             pin_memory: bool = False, persistent_workers: bool = False,
             count_syncs: bool = True, profiler=None, progress: bool = False) -> LoopResult:
    """Run ``warmup_steps + steps`` training steps of one strategy in one mode.

    ``pert`` must hold at least ``(warmup_steps + steps) * batch_size`` perturbations.
    ``profiler`` (a started ``torch.profiler.profile``) is stepped once per step when given.
    """
    if mode not in MODES:
        raise ValueError(f"'mode' must be one of {list(MODES)} (got {mode!r})")
    if steps <= 0:
        raise ValueError(f"'steps' must be a positive integer (got {steps})")
    need = (warmup_steps + steps) * batch_size
    if len(pert) < need:
        raise ValueError(f"'pert' must hold at least {need} perturbations (got {len(pert)})")
    device = strategy.device
    loader = make_loader(strategy, pert[:need], batch_size, num_workers=num_workers,
                         pin_memory=pin_memory and device.type == "cuda",
                         persistent_workers=persistent_workers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3) if mode == "full" else None
    timer = StageTimer(device)
    counter = SyncCounter(device)
    result = LoopResult(strategy.name, mode, batch_size, steps)
    it = iter(loader)
    total = warmup_steps + steps
    for step in tqdm(range(total), desc=f"{strategy.name}/{mode}", disable=not progress,
                     leave=False):
        t_start = time.perf_counter()
        timed = step >= warmup_steps
        if not timed:
            timer = StageTimer(device)
        with _stage(timer, "loader_wait"):
            batch = next(it)
        worker = batch.pop("_worker")
        timer.add("worker_fetch", worker["fetch_s"])
        timer.add("worker_collate", worker["collate_s"])
        ctr = counter.count() if (count_syncs and timed) else nullcontext()
        with ctr:
            with _stage(timer, "h2d"):
                batch = strategy.to_device(batch, non_blocking=pin_memory)
            with _stage(timer, "device_prep"):
                ctx = strategy.device_prepare(batch)
            y = batch["y"]
            if mode == "data":
                with _stage(timer, "forward"):  # the trivial loss
                    loss = ((y - model.head.bias) ** 2).mean()
                with _stage(timer, "backward"):
                    loss.backward()
            else:
                with _stage(timer, "forward"):
                    loss = ((strategy.predict(model, ctx, dual=dual) - y) ** 2).mean()
                if mode in ("forward_backward", "full"):
                    with _stage(timer, "backward"):
                        loss.backward()
        # the optimizer is outside the sync count: AdamW keeps its step counters on the host
        # (so its .item() calls never wait for a GPU), which a CPU run cannot tell apart
        if opt is not None:
            with _stage(timer, "optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        if mode in ("data", "forward_backward"):
            model.zero_grad(set_to_none=True)
        if timed:
            timer.next_step()
        result.step_spans.append((t_start, time.perf_counter()))
        if profiler is not None:
            profiler.step()
    del it
    done = timer.completed()
    result.step_seconds = [sum(s.get(k, 0.0) for k in MAIN_STAGES) for s in done]
    result.stage_medians = timer.medians()
    result.syncs_per_step = counter.total / max(1, len(done))
    result.sync_kinds = {k: v / max(1, len(done)) for k, v in counter.by_kind.items()}
    return result


def project_epochs(step_seconds: float, batch_size: int, num_samples: int, *, ranks: int = 1,
                   ddp_factor: float = 1.0, train_fraction: float = 0.8) -> dict:
    """Steps per epoch x time per step, projected to epoch time and epochs per 24 h.

    With ``ranks`` data-parallel ranks each step processes ``ranks * batch_size`` samples and
    takes ``step_seconds * ddp_factor`` (``ddp_factor`` = step time at that world size over the
    single-rank step time, from notebook 04; 1.0 when unknown)."""
    if batch_size <= 0 or ranks <= 0:
        raise ValueError(f"'batch_size' and 'ranks' must be positive (got {batch_size}, {ranks})")
    steps = math.ceil(num_samples * train_fraction / (batch_size * ranks))
    epoch_s = steps * step_seconds * ddp_factor
    return {"steps_per_epoch": steps, "epoch_seconds": epoch_s, "epochs_per_day": 86400 / epoch_s}
