"""Helper library of the perturbed-graph GNN performance workbook.

Where things are done: one room per folder (or top-level module), rooms on numbered floors, the
bottom first. A module imports from its own floor or below, never from above: at the bottom what
every floor reads, at the top what drives everything. ``LAYERS`` (below) is this map as data;
``tests/test_layers.py`` checks every import against it (imports inside functions too), allows at
most 3 that climb, each with its reason, and refuses any import cycle.

0  ``exceptions``, ``paths``, ``records``, ``catalog``, ``failures``, ``common/``: errors,
   locations, typed JSON, the names of strategies and notebooks, the one record of a pipeline
   that failed in a notebook (``failures``), and what every floor uses (``common``):
    ``files``           atomic writes with the umask's mode
    ``locks``           ``flock`` on a lock file (run folder, snapshot cache, GPU probes)
    ``text``            a message on one line; rows as aligned columns (the terminal's tables)
    ``device``          ``device`` -> torch.device; the host memory a run may use; the CPU
                        allocator setting
    ``progress``        progress bars and stage notes, on the terminal only
    ``processes``       stopping processes we started
    ``argtypes``        the command line's paths and numbers, one error each (argparse types)
    ``watchdog``        a stage that stops making progress: stopped (SIGALRM) and named
1  ``configs/``     the one schema of every params file, ``--set``, papermill ``-p`` and
                   parameters cell:
    ``schema``          frozen, typed, one field per key (read as a mapping too)
    ``checks``, ``specs``   value checks; ``pipelines`` entries parsed and checked as plain
                        strings (importing them is ``pipelines.loading``'s)
    ``loading``, ``validation``, ``filesystem``   the hardened YAML loader; ``validate``
                        (types by pydantic; ``Params``, ``params.replace``) and its checks
                        across keys and on disk
    ``cells``           the help text, and which keys each notebook's parameters cell reads
2  ``measurement/``, ``traces/`` how anything is measured: it measures a callable it is given
                   and knows nothing of pipelines or params; ``traces`` reads a Chrome trace
    ``timing``          THE timer: device sync, warm-up excluded, repeats to a precision
                        target, Stat (median, IQR, n), interleaved ratios, the loop's StepClock
    ``memory``          peak memory of a step (fresh process, high-water mark reset; the caller
                        hands in the set-up that builds the step), fits
    ``syncs``           host syncs: set_sync_debug_mode on CUDA, dispatcher-level on CPU
    ``precision``       float32 tolerance for sums in another order (CUDA atomics)
    ``profiling``       warm-step profiles by exclusive time (read with ``traces``)
    ``cpu``             the meter beside every timed region and its /proc readers;
                        ``cpu_allowance`` (the CPUs a process may use, how threads fit),
                        ``cpu_share`` (what a figure got of them: contended or not, and why)
  ``traces/``         any Chrome trace by range, kind, operator, per thread and GPU stream,
                        exclusive times that add up (the ``trace`` command; its page:
                        ``report/trace_view``); it measures nothing: ``reading`` (events,
                        nesting, exclusive times), ``breakdown`` (per row), ``diff``
3  ``nodemask/``    the fix as a public API: per-sample aggregation on one shared graph
    ``graph``, ``batch``, ``kernels``   the shared graph, a batch's layers, sparse products
    ``delta``           delta propagation: the second layer's per-sample push (numba/PyTorch)
4  ``results/``    what each notebook's results file holds, typed (one module per notebook:
                   ``inventory``, ``mask_cost``, ``timing``, ``ddp``, ``verdict``, ``adoption``;
                   ``bench`` the full-size benchmark's): everything ``load_result`` reads back
5  ``data/``        the graph and the samples
    ``snapshots``       the wildtype cell graph: synthetic from a spec (cached, checksummed) or
                        a user's HeteroData
    ``perturbations``   which genes each sample deletes; synthetic labels
6  ``strategies/``  how the built-in pipelines compute a batch of perturbed graphs (one module
                   per strategy)
    ``base``            how a strategy splits its work: prepared once / dataset item / collate /
                        transfer / device prep / aggregation; the incidence cache
    ``replicated_mask_cpu``, ``replicated_mask_stored``, ``device_mask`` (where masks are
                        built: CPU workers, disk, the device), ``subgraph_cpu``,
                        ``replicated_filter_device``, ``node_mask_shared``, ``dango_wildtype``
    ``model``, ``reference``, ``sparse_ops`` (the products every strategy uses)
7  ``pipelines/``   THE seam of what is measured: a training pipeline, stage by stage
    ``protocol``        the interface every measured thing implements: dataset / collate /
                        transfer / device prep / forward / loss, its model and batch size
    ``builtin``         the built-in strategies + the workbook's model as pipelines
    ``loading``         user pipelines (params key ``pipelines``): import, build, check on a batch
    ``lightning``       a LightningModule + LightningDataModule as a pipeline
8  ``training/``    ``factory`` (params -> graph, strategy, model), ``loop`` (the DataLoader
                   training loop over any pipeline, interleaving), ``arms`` (an arm and its
                   variant, a stage timed), ``timed_data`` (dataset and collate timing
                   themselves in the workers),
                   ``step_memory`` (a pipeline's training step for the memory probe)
9  ``distributed/`` the DDP machinery: ``launcher`` (torchrun), ``worker`` (one rank), ``plan``
                   (world sizes from the allocation)
10 ``running/``     running the notebooks: ``run_folder`` (every notebook in order into a run
                   folder, with papermill), ``papermill_run`` (one notebook and its HTML
                   report), ``resume`` (what an earlier run left complete), ``notebook`` (a
                   notebook's setup), ``notebooks`` (sources, builds, ``--only``), ``results``
                   (JSON), ``environment``, ``slurm`` (one job per notebook, chained),
                   ``runlock`` (one writer per notebook of a run folder), ``kernel`` (this
                   clone's kernel)
11 ``studies/``     one notebook, one study, named after it (its view: ``report/<name>_view``):
    ``inventory``       01: bytes of every representation
    ``mask_cost/``      02: ``costmodel`` (masking against filtering), ``layers`` (mask
                        generation, one layer across B, exactness), ``bench`` (the strategy
                        benchmark, also the ``bench`` command; ``rates``, its achieved rates;
                        ``bench_text``, its words), ``memory`` (peak memory), ``forward_masks``
                        (the dual forward's mask bytes)
    ``timing/``         03: the training loop of every pipeline; ``stages`` (what a step's time
                        goes to), ``stored_masks`` (stored masks read cold and warm)
    ``ddp/``            04: launches, ``summary`` (ranks -> figures), ``allreduce_model``
    ``verdict/``        05: the inputs and the verdict; ``gap``, ``causes``, ``recommend`` (the
                        fix), ``claims`` (every claim by a stated rule)
    ``adoption/``       06: training both pipelines; ``equality`` (the check, also the
                        ``equal`` command), ``parameters`` (how two models' parameters pair),
                        ``seeded_runs`` (one seeded run, tensors compared), ``fix_speedups``
12 ``tools/``       the commands that are no notebook: ``compare``, ``headlines`` (a run
                   folder's figures), ``stability`` (and its repeated runs), ``selftest`` (a new
                   machine checked before a long run)
13 ``report/``      what a reader sees: ``plotting``, ``tables``, one ``*_view`` per notebook
                   (and its sections: ``bench_view``, ``cpu_view``, ``profile_view``,
                   ``stage_style``)
                   and per command's page (``trace_view``, ``compare_view``,
                   ``stability_view``), ``html`` (the run folder's index), ``pages`` (one look:
                   every page from ``templates/workbook/page.html.j2`` and ``workbook.css``),
                   ``terminal`` (what the commands without a page print)
14 ``cli/``, ``__main__``: ``python -m workbook_lib`` (run, params, bench, trace, selftest...):
                   ``parser`` (every command and its arguments), ``commands`` (one function each)
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
    ("configs",),
    ("measurement", "traces"),
    ("nodemask",),
    ("results",),
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
