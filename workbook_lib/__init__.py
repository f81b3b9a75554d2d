"""Helper library of the perturbed-graph GNN performance workbook.

One module per concern: ``params`` (schema), ``snapshots`` (graphs), ``perturbations``,
``inventory`` (sizes), ``timing`` (honest measurement), ``results`` (JSON), ``environment``,
``runner`` (papermill/HTML), ``plotting``; strategies and analyses in later modules.
"""
import warnings

# torch_geometric imports tqdm.auto, which warns in every report that ipywidgets is not
# installed; the workbook's progress bars are plain-text tqdm, so the hint does not apply.
warnings.filterwarnings("ignore", message="IProgress not found")

from .exceptions import ParamsError, SnapshotError, WorkbookError  # noqa: E402,F401

__version__ = "0.1.0"
