"""Helper library of the perturbed-graph GNN performance workbook.

One module per concern: ``params`` (schema), ``snapshots`` (graphs), ``perturbations``,
``inventory`` (sizes), ``timing`` (honest measurement), ``results`` (JSON), ``environment``,
``runner`` (papermill/HTML), ``plotting``; strategies and analyses in later modules.
"""
from .exceptions import ParamsError, SnapshotError, WorkbookError  # noqa: F401

__version__ = "0.1.0"
