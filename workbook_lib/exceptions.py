"""Exceptions the workbook raises on purpose, each with structured fields (as papermill's
``exceptions`` module does), so a caller can act on the key, rank or notebook concerned."""
from __future__ import annotations

from typing import Any


class WorkbookError(Exception):
    """Base class of every error the workbook raises on purpose."""


class ParamsError(WorkbookError, ValueError):
    """Params are invalid (raised before any work starts).

    Attributes:
        key: the offending key (None when the problem is not one key's).
        value: the value given for it.
    """

    def __init__(self, message: str, *, key: str | None = None, value: Any = None):
        super().__init__(message)
        self.key, self.value = key, value


class ArgumentError(WorkbookError):
    """A command-line argument is invalid (raised by ``common.argtypes`` while argparse parses,
    before any work). Not a ``ValueError`` on purpose: argparse would turn that into its own
    two-line message; this one reaches ``cli.main``, which prints it in one line (exit 2)."""


class SnapshotError(WorkbookError):
    """A snapshot spec or graph file is missing, malformed or inconsistent.

    Attributes:
        path: the file concerned (None when not a file's problem).
    """

    def __init__(self, message: str, *, path: str | None = None):
        super().__init__(message)
        self.path = path


class NotebookFailedError(WorkbookError):
    """One or more notebooks failed during ``run``.

    Attributes:
        failures: the failed notebooks' outcomes (name, cell, error).
    """

    def __init__(self, message: str, failures: list | None = None):
        super().__init__(message)
        self.failures = failures or []


class LaunchError(WorkbookError):
    """A torchrun launch failed.

    Attributes:
        kind: ``failed`` (a rank raised or died), ``hung`` (a rank stopped reporting),
            ``no results`` or ``start`` (torchrun could not start).
        rank: the rank identified as the cause (None when none could be).
        world_size: the launch's world size.
        last_output: the tail of that rank's log.
    """

    def __init__(self, message: str, *, kind: str = "failed", rank: int | None = None,
                 world_size: int | None = None, last_output: str = ""):
        super().__init__(message)
        self.kind, self.rank, self.world_size, self.last_output = kind, rank, world_size, \
            last_output


class IncompleteInputsError(WorkbookError):
    """A notebook that draws others together found some of them missing or incomplete.

    Attributes:
        missing: the notebooks whose complete results are absent.
        reasons: why each is absent ("not run", "made with other params (...)"...).
    """

    def __init__(self, message: str, missing: list[str], reasons: dict[str, str] | None = None):
        super().__init__(message)
        self.missing = missing
        self.reasons = dict(reasons or {})


class RunComparisonError(WorkbookError):
    """Run folders cannot be compared (different snapshots, missing results...)."""


class PipelineError(WorkbookError, ValueError):
    """A pipeline named in the ``pipelines`` params key cannot be used (raised before any timing).

    Attributes:
        pipeline: the pipeline's name (or its spec, when it could not be built).
        problem: what is wrong, in one line.
    """

    def __init__(self, pipeline: str, problem: str):
        super().__init__(f"pipeline '{pipeline}': {problem}")
        self.pipeline, self.problem = pipeline, problem


class TraceError(WorkbookError, ValueError):
    """A file given as a profiler trace is not one (not JSON, no ``traceEvents``, no timed events).

    Attributes:
        path: the file concerned.
    """

    def __init__(self, message: str, *, path: str | None = None):
        super().__init__(message)
        self.path = path
