"""Helper library of the perturbed-graph GNN performance workbook.

Where things are done: one room per folder (or top-level module), rooms on numbered floors, the
bottom first. A module imports from its own floor or below, never from above. ``LAYERS`` is this
map as data; ``tests/test_layers.py`` checks every import against it and refuses any cycle.

0  ``exceptions``, ``paths``, ``records``, ``catalog``, ``failures``, ``common/``: errors,
   locations, typed JSON, the names of strategies and notebooks, a pipeline's failure record,
   and what every floor uses (``common``: atomic files, locks, one-line text, devices, progress,
   processes, argparse types, the stall watchdog)
1  ``results/``     every record a run writes and reads back, typed and free of PyTorch: one
                   module per notebook (``inventory``, ``mask_cost``, ``timing``, ``ddp``,
                   ``verdict``, ``adoption``, ``bench``) and the parts they are made of
                   (``stat``, ``cpu``, ``memory``, ``profile``, ``floor``, ``trace``, ``meta``)
2  ``configs/``     the params schema (``schema``, ``validation``: ``Params``), its checks,
                   YAML loading, ``pipelines`` specs and the notebooks' parameters cells
3  ``measurement/``, ``traces/`` how anything is measured (``timing``, ``memory``, ``syncs``,
                   ``cpu``, ``profiling``, ``code_sites``, ``precision``): a callable it is
                   given, nothing of pipelines or params; ``traces`` reads a Chrome trace
4  ``nodemask/``    the fix as a public API: per-sample aggregation on one shared graph
5  ``data/``        the graph (``snapshots``) and the samples (``perturbations``)
6  ``strategies/``  the built-in strategies, the workbook's model, the reference
7  ``pipelines/``   THE seam of what is measured: ``protocol`` (a pipeline, stage by stage),
                   ``builtin``, ``loading`` (user pipelines), ``lightning``
8  ``training/``    the DataLoader training loop over any pipeline (``loop``, ``arms``),
                   ``timed_data``, ``factory``, ``step_memory``
9  ``distributed/`` DDP through torchrun: ``launcher``, ``worker`` (one rank), ``plan``
10 ``running/``     the run folder with papermill (``run_folder``, ``papermill_run``,
                   ``resume``, ``runlock``), a notebook's setup, results files, SLURM, kernel
11 ``studies/``     one notebook, one study: ``inventory`` (01), ``mask_cost/`` (02), ``timing/``
                   (03), ``ddp/`` (04), ``verdict/`` (05), ``adoption/`` (06)
12 ``tools/``       the commands that are no notebook: ``compare``, ``headlines``,
                   ``stability``, ``selftest``
13 ``report/``      what a reader sees: one ``*_view`` per notebook and command page, plots,
                   tables, the HTML pages and what the commands print; views render records
14 ``cli/``, ``__main__``: ``python -m workbook_lib``: ``parser`` and ``commands``
"""
import warnings

# PyTorch flags its sparse CSR API as beta on every construction: a statement about the API,
# not about any figure; reports stay free of it. (tqdm's ipywidgets hint likewise.)
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
warnings.filterwarnings("ignore", message="IProgress not found")

from .exceptions import ParamsError, SnapshotError, WorkbookError  # noqa: E402,F401

__version__ = "0.2.0"

# The map above as data: its floors, bottom first (tests/test_layers.py keeps both true).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("exceptions", "paths", "records", "catalog", "failures", "common"),
    ("results",),
    ("configs",),
    ("measurement", "traces"),
    ("nodemask",),
    ("data",),
    ("strategies",),
    ("pipelines",),
    ("training",),
    ("distributed",),
    ("running",),
    ("studies",),
    ("tools",),
    ("report",),
    ("cli", "__main__"),
)
