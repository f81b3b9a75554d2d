"""What a notebook records when one pipeline fails: one record, the same in every notebook.

A pipeline that raises, stalls or trains on a non-finite loss costs only its own figures: the
study that lost it (02's memory, 03's loop, 04's DDP) keeps ``failures: dict[str,
PipelineFailure]`` beside the others' figures, its view shows each in one line, and the verdict
says what is missing and why. :class:`PipelineFailed` carries a record from where the failure
happened (a step, a DataLoader worker, a DDP rank) to the study.
"""
from __future__ import annotations

import traceback as _tb
from dataclasses import dataclass

from .common.text import one_line
from .exceptions import WorkbookError
from .records import Record

# the protocol's stages as a reader names them, and what else can fail for one pipeline
STAGES = ("build", "data item", "collate", "transfer", "device prep", "forward", "loss",
          "backward", "optimizer", "shared pass", "memory probe", "DDP launch")
# the training loop's timed stages -> the protocol's (the loader wait is named by the dataset
# or collate wrapper that was running; "data item or collate" where a worker could not say)
LOOP_STAGE_NAMES = {"loader_wait": "data item or collate", "h2d": "transfer",
                    "device_prep": "device prep", "forward": "forward", "loss": "loss",
                    "loss_backward": "loss", "backward": "backward", "optimizer": "optimizer",
                    "step": "training step"}

RAISED, STALLED, NONFINITE = "raised", "stalled", "nonfinite_loss"
KINDS = (RAISED, STALLED, NONFINITE)


def describe_exception(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line (the message cut to ``limit`` characters)."""
    msg = one_line(exc, limit)
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


@dataclass
class PipelineFailure(Record):
    """One pipeline's failure in one notebook.

    Attributes:
        pipeline: the pipeline's name (a built-in strategy or an entry of ``pipelines``).
        notebook: the notebook that lost it ("02", "03", "04").
        stage: one of :data:`STAGES` ("data item or collate" when a worker stopped unsaid).
        kind: ``raised``, ``stalled`` or ``nonfinite_loss`` (figures kept, marked).
        message: what happened, in one line.
        traceback: the Python traceback (the rank's, the worker's or the probe's), or "".
        step: the arm's step it happened at (0 = its first, warm-up included), when known.
        mode: the loop mode or DDP arm ("full", "forward", "gap"...), or "".
        waited_s: for a stall, how long the stage had run.
        rank: for notebook 04, the rank that failed.
        figures_kept: the pipeline's figures are in the study (those of a diverged step).
    """

    pipeline: str
    notebook: str
    stage: str
    kind: str
    message: str
    traceback: str = ""
    step: int | None = None
    mode: str = ""
    waited_s: float | None = None
    rank: int | None = None
    figures_kept: bool = False

    def line(self) -> str:
        """The failure in one line, for reports and the terminal."""
        if self.kind == NONFINITE:
            return f"'{self.pipeline}': {self.message}"
        ctx = [f"mode {self.mode}" if self.mode else "",
               f"step {self.step}" if self.step is not None else "",
               f"rank {self.rank}" if self.rank is not None else ""]
        ctx_s = f" ({', '.join(c for c in ctx if c)})" if any(ctx) else ""
        what = "stalled" if self.kind == STALLED else "failed"
        kept = ("its figures are kept" if self.figures_kept else "its figures are missing")
        return f"'{self.pipeline}' {what} in {self.stage}{ctx_s}: {self.message}; {kept}"


class PipelineFailed(WorkbookError):
    """One pipeline failed (raised, stalled) while a notebook ran it.

    Attributes:
        failure: the :class:`PipelineFailure` to record.
    """

    def __init__(self, failure: PipelineFailure):
        super().__init__(failure.line())
        self.failure = failure

    @property
    def details(self) -> dict:
        """The record as JSON (a memory probe passes it to its parent this way)."""
        return self.failure.to_json()


def failure_from(exc: BaseException, *, pipeline: str, notebook: str, stage: str,
                 step: int | None = None, mode: str = "") -> PipelineFailure:
    """A record of ``exc`` (a stall when it is a :class:`~workbook_lib.common.watchdog.Stalled`),
    with its traceback."""
    from .common.watchdog import Stalled

    tb = "".join(_tb.format_exception(type(exc), exc, exc.__traceback__))
    if isinstance(exc, Stalled):
        return PipelineFailure(pipeline, notebook, exc.stage or stage, STALLED, one_line(exc),
                               tb, step, mode, waited_s=exc.waited_s)
    return PipelineFailure(pipeline, notebook, stage, RAISED,
                           f"{stage} raised {describe_exception(exc)}", tb, step, mode)
