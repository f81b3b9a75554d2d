"""What each DDP rank runs (:class:`WorkerConfig`): the run's params and the launch's own settings,
written by the launcher as ``config.json`` and read back typed by :mod:`.worker`."""
from __future__ import annotations

from dataclasses import dataclass, fields

from ..configs.validation import Params, validate


@dataclass(frozen=True)
class WorkerConfig:
    """One launch of the DDP worker.

    Attributes:
        params: the run's params (validated again in each rank).
        scaling_strategy, gap_strategies: the pipeline whose scaling is timed, and the gap's pair.
        batch_size, global_batch: per rank, and across ranks at the largest world size.
        steps, steps_cap, warmup, budget_s: the loop's timed steps (at least, at most), warm-up
            steps and time budget.
        timeout_s: the launch's time limit; pg_timeout_s the process group's (set by the
            launcher, with out_dir and threads).
        workers, threads_all: DataLoader workers per rank (None: the params'), and the
            all-threads arms' threads (smallest world size only).
        fail_rank, hang_rank, slow_rank, slow_rank_delay_s, slow_start_s: a rank made to fail,
            hang, wait before each step, or wait once in its start-up (its "setup" stage, no
            progress meanwhile) (the launcher's tests).
    """

    params: Params
    scaling_strategy: str
    gap_strategies: list[str]
    batch_size: int
    global_batch: int
    steps: int
    steps_cap: int
    warmup: int
    budget_s: float
    timeout_s: float
    workers: int | None = None
    threads_all: int | None = None
    out_dir: str = ""
    threads: int | None = None
    pg_timeout_s: float | None = None
    fail_rank: int | None = None
    hang_rank: int | None = None
    slow_rank: int | None = None
    slow_rank_delay_s: float = 0.0
    slow_start_s: float = 0.0

    @classmethod
    def from_json(cls, data: dict) -> WorkerConfig:
        """The config a rank reads back (its params validated again)."""
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"the DDP worker's config has unknown keys {unknown}")
        return cls(**{**data, "params": validate(data["params"], source="ddp worker config")})
