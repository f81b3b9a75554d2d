"""Exceptions raised by the workbook library (one module, as in papermill)."""


class WorkbookError(Exception):
    """Base class of every error the workbook raises on purpose."""


class ParamsError(WorkbookError, ValueError):
    """A params file or injected parameter set is invalid (raised before any work starts)."""


class SnapshotError(WorkbookError):
    """A snapshot spec or graph file is missing, malformed or inconsistent."""


class NotebookFailedError(WorkbookError):
    """One or more notebooks failed during ``run``; carries the per-notebook summary."""

    def __init__(self, message: str, failures: list | None = None):
        super().__init__(message)
        self.failures = failures or []


class LaunchError(WorkbookError):
    """A torchrun launch failed: a rank raised, hung past its timeout, or could not start."""


class RunComparisonError(WorkbookError):
    """Two run folders cannot be compared (different snapshots, missing results...)."""
