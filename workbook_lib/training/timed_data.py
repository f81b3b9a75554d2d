"""The dataset and the collate wrapped to time themselves, in the main process or in a DataLoader
worker, and to report a stage that raised or stalled there (see :mod:`.loop`). Each also counts
the seconds Python's garbage collector ran inside it (:class:`~workbook_lib.measurement.gc_pauses.
GcPauses`): in a worker process, the main process's own count never sees them."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from torch.utils.data import Dataset

from ..common.watchdog import Stalled, Watchdog, current, process_watchdog
from ..common.text import one_line
from ..failures import RAISED, STALLED
from ..measurement.gc_pauses import GcPauses
from ..pipelines.protocol import Pipeline


@dataclass
class DataFailure:
    """What a dataset item or collate that failed hands the loop instead of a batch (picklable:
    it comes back from a DataLoader worker like a batch)."""

    stage: str  # "data item" or "collate"
    kind: str  # raised or stalled
    message: str
    traceback: str
    waited_s: float | None = None


def _in_worker() -> bool:
    from torch.utils.data import get_worker_info

    return get_worker_info() is not None


class TimedDataset(Dataset):
    """The pipeline's dataset, each item read with its fetch time and the garbage collector's
    seconds inside it (timed inside the worker); an item that raises or stalls (``stall_s``)
    becomes a :class:`DataFailure`, as does every later item.
    """

    def __init__(self, pipeline: Pipeline, stall_s: float | None = None):
        self.items = pipeline.dataset()
        self.name = getattr(pipeline, "name", "") or type(pipeline).__name__
        self.stall_s = stall_s
        self.failed: DataFailure | None = None

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        if self.failed is not None:
            return self.failed, (0.0, 0.0)
        wd = _data_watchdog(self.stall_s)
        if wd is not None:
            if wd.limit is None and _in_worker():
                wd.start(f"'{self.name}' (DataLoader worker)", "data item", self.stall_s)
            else:
                wd.rename("data item")
        gc_ = GcPauses()
        gc_.open()
        t0 = time.perf_counter()
        try:
            item = self.items[i]
        except (Exception, Stalled) as exc:  # noqa: BLE001 - the user's item: recorded
            self.failed = _data_failure("data item", exc)
            return self.failed, (0.0, 0.0)
        finally:
            paused = gc_.close()
        return item, (time.perf_counter() - t0, paused)


def _data_watchdog(stall_s: float | None) -> Watchdog | None:
    """The watchdog of the data stages: a DataLoader worker's own (when a limit is set), else
    the loop's in this process (naming the stage only)."""
    if _in_worker():
        return process_watchdog(why="stall_timeout_s") if stall_s else None
    return current()


def _data_failure(stage: str, exc: BaseException) -> DataFailure:
    import traceback

    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if isinstance(exc, Stalled):
        return DataFailure(exc.stage or stage, STALLED, one_line(exc), tb, exc.waited_s)
    return DataFailure(stage, RAISED, f"{stage} raised {type(exc).__name__}: {one_line(exc)}",
                       tb)


class TimedCollate:
    """The pipeline's collate, timed, with the items' fetch times summed (runs in workers);
    returns ``(batch, worker times)``, or ``(DataFailure, times)`` when an item or the collate
    failed. The times: ``fetch_s`` and ``collate_s``, and the garbage collector's seconds inside
    each, ``fetch_gc_s`` and ``collate_gc_s``."""

    def __init__(self, pipeline: Pipeline):
        self.collate = pipeline.collate

    def __call__(self, timed_items):
        zero = {"fetch_s": 0.0, "collate_s": 0.0, "fetch_gc_s": 0.0, "collate_gc_s": 0.0}
        worker = _in_worker()
        try:
            failed = next((it for it, _ in timed_items if isinstance(it, DataFailure)), None)
            if failed is not None:
                return failed, zero
            wd = (process_watchdog() if _worker_watched() else None) if worker else current()
            if wd is not None:
                wd.rename("collate")
            gc_ = GcPauses()
            gc_.open()
            t0 = time.perf_counter()
            try:
                batch = self.collate([it for it, _ in timed_items])
            except (Exception, Stalled) as exc:  # noqa: BLE001 - the user's collate: recorded
                return _data_failure("collate", exc), zero
            finally:
                paused = gc_.close()
            return batch, {"fetch_s": sum(s for _, (s, _g) in timed_items),
                           "collate_s": time.perf_counter() - t0,
                           "fetch_gc_s": sum(g for _, (_s, g) in timed_items),
                           "collate_gc_s": paused}
        finally:
            if worker and _worker_watched():
                process_watchdog().stop()  # this worker's batch is done


def _worker_watched() -> bool:
    from ..common import watchdog

    return os.getpid() in watchdog._PROCESS
