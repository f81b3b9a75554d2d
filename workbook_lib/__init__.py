"""Helper library of the perturbed-graph GNN performance workbook.

Where things are done (folder = layer, lower layers never import higher ones):

``data/``          the graph and the samples
    ``snapshots``       the wildtype cell graph: synthetic from a spec (cached, checksummed) or
                        a user's HeteroData
    ``perturbations``   which genes each sample deletes; synthetic labels
    ``inventory``       bytes of every representation (notebook 01)
``strategies/``    how a batch of perturbed graphs is computed (one module per strategy)
    ``base``            the interface: prepared once / dataset item / collate / transfer /
                        device prep / forward; the incidence cache
    ``replicated_mask_cpu``, ``replicated_mask_stored``, ``device_mask`` (where masks are
                        built: CPU workers, disk, the device), ``subgraph_cpu``,
                        ``replicated_filter_device``, ``node_mask_shared``, ``dango_wildtype``
    ``model``, ``reference``, ``sparse_ops`` (the products every strategy uses)
``nodemask``       the fix as a public API: per-sample aggregation on one shared graph
``measurement/``   how anything is measured
    ``timing``          THE timer: device sync, warm-up excluded, repeats to a precision
                        target, Stat (median, IQR, n), interleaved ratios, the loop's StepClock
    ``memory``          peak memory of a step (fresh process, high-water mark reset), fits
    ``syncs``           host syncs: set_sync_debug_mode on CUDA, dispatcher-level on CPU
    ``profiling``, ``trace_analysis``   warm-step profiles by exclusive time
``training/``      ``factory`` (params -> graph, strategy, model), ``loop`` (the DataLoader
                   training loop, its arms and variants, interleaving)
``distributed/``   ``launcher`` (torchrun), ``worker`` (one rank), ``study`` (notebook 04),
                   ``allreduce_model``, ``plan`` (world sizes from the allocation)
``analysis/``      the notebooks' experiments and conclusions: ``costmodel``, ``benchmarks``,
                   ``bench`` (the full-size benchmark), ``mask_cost`` (02), ``timing_study`` (03),
                   ``claims``, ``verdict`` (05), ``adoption`` (06), ``compare``, ``stability``
``report/``        what a reader sees: ``plotting``, ``tables``, one ``*_view`` per notebook,
                   ``html`` (export, index page), ``progress`` (terminal only)
``running/``       ``params`` (the schema), ``notebook`` (a notebook's setup), ``notebooks``
                   (sources and builds), ``runner`` (papermill), ``results`` (JSON),
                   ``environment``, ``slurm``, ``cli``, ``processes``, ``runlock`` (one
                   writer per notebook of a run folder), ``kernel`` (this clone's kernel)
``catalog``, ``paths``, ``records``, ``exceptions``: names, locations, typed JSON, errors.
"""
import warnings

# PyTorch flags its sparse CSR API as beta on every construction: a statement about the API,
# not about any figure; reports stay free of it. (tqdm's ipywidgets hint likewise.)
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
warnings.filterwarnings("ignore", message="IProgress not found")

from .exceptions import ParamsError, SnapshotError, WorkbookError  # noqa: E402,F401

__version__ = "0.2.0"
