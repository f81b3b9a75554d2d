# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation
#   kernelspec:
#     display_name: GNN perturbation workbook
#     language: python
#     name: gnn-workbook
# ---

# %% [markdown]
# # 03 · Data-only vs model timing
#
# The experiment the slow model's users planned and could not run cleanly: the same training
# loop, through a real `torch.utils.data.DataLoader`, with and without the model, for every
# pipeline (the built-in strategies and your own, named in `pipelines`). Four modes per pipeline:
# **data only** (fetch, process, collate, transfer and device prep: no model call), **+ forward**
# (and the loss), **+ backward**, and the **full step** (+ the optimizer).
# Every stage is timed between device syncs; warm-up steps are never recorded; each
# (strategy, mode) arm repeats until its step time's median is known to within the precision target.
# Then: epochs per day on one rank, host syncs per step, and profiles of warm steps broken down
# by exclusive time; when built-in strategies ran, the ratios the investigation reported are set
# beside this run's.

# %% tags=["parameters"]
# The params keys this notebook reads (every key: python -m workbook_lib params); papermill sets them with -p KEY VALUE or -f FILE.yaml, and also takes any other key
from typing import Dict, List, Optional, Union  # for the annotations below
snapshot: str = 'string12'  # spec name in data_snapshots/ (e.g. 'string12') or path to a torch.save'd HeteroData
scale: float = 0.1  # edge-count multiplier, 1.0 is the real graph
seed: int = 0  # seed of graph generation and perturbation sampling
device: str = 'auto'  # cpu, cuda or auto (cuda when available)
batch_sizes: List[int] = [1, 8, 28, 64]  # batch sizes of per-batch size figures
perturbation_k: Union[int, Dict[int, float]] = 3  # genes deleted per sample: an int, or a mapping k -> probability
num_samples: int = 332313  # dataset size for storage and epoch projections
num_perturbations: int = 200  # perturbations sampled for removed-edge and hop statistics
cache_dir: str = 'data_snapshots/cache'  # where generated graphs are cached (relative to the repository root)
hidden: int = 32  # hidden size H (the real model: 64)
layers: int = 2  # message-passing layers (the real model: 3)
aggr: str = 'sum'  # neighbour aggregation: sum or mean
dual_forward: bool = True  # the Lazy model's dual forward (wildtype pass + perturbed pass)
strategies: List[str] = ['subgraph_cpu', 'replicated_mask_cpu', 'replicated_mask_stored', 'device_mask_loop', 'device_mask_vectorized', 'replicated_filter_device', 'node_mask_shared', 'dango_wildtype']  # built-in strategies to compare (may be empty when 'pipelines' names two or more)
pipelines: List[str] = []  # your own training pipelines: 'package.module:factory' or 'path/to/file.py:factory', optionally 'NAME ...'; the factory(params, graph, device) returns a pipeline (README: Diagnose your own pipeline)
cpu_allocator_cache: bool = True  # keep freed memory in the glibc heap during CPU timings (as PyTorch's CUDA caching allocator does on GPUs); without it large-batch CPU steps measure page faults
warmup: int = 1  # untimed warm-up calls or steps before anything is timed
min_repeats: int = 5  # fewest timed repeats of a figure
precision_target: float = 0.1  # repeat a figure until its median is known to within this fraction (its 95% interval's half-width; or its time budget is spent)
time_budget_s: float = 2.0  # seconds one benchmark figure may spend on repeats beyond min_repeats
stall_timeout_s: float = 300.0  # a stage of a pipeline's step (data item, collate, forward...) running this long has stalled: that pipeline is stopped and recorded, the others go on (once it has run a step, also 20x its slowest step, at least 30 s)
batch_size_lazy: int = 7  # batch of the perturbed-graph strategies (the investigation's Lazy model: 28)
batch_size_dango: int = 16  # batch of the DANGO-style strategy (the investigation: 64)
loop_steps: int = 10  # fewest timed training steps per strategy and mode
loop_max_steps: int = 20  # most timed training steps per strategy and mode
loop_budget_s: float = 110.0  # seconds of timed loop steps before arms stop at loop_steps
num_workers: int = 0  # DataLoader worker processes (0: load in the main process)
pin_memory: bool = False  # DataLoader pin_memory (CUDA runs)
persistent_workers: bool = False  # DataLoader persistent_workers
profile_wait: int = 1  # torch.profiler schedule: wait steps (at least 1)
profile_warmup: int = 1  # torch.profiler schedule: warm-up steps (at least 1)
profile_active: int = 2  # torch.profiler schedule: recorded steps
gap_strategies: List[str] = ['replicated_mask_cpu', 'dango_wildtype']  # the two strategies or pipelines whose gap the verdict explains (slow, fast); when not given and 'pipelines' names two or more, the first two pipelines
run_dir: str = "runs/interactive"  # where results go (a relative path is taken from the repository root)

# %%
from IPython.display import display

from workbook_lib.report import timing_view as view
from workbook_lib.results.timing import TimingResult
from workbook_lib.running.notebook import setup
from workbook_lib.running.results import write_results
from workbook_lib.studies import timing as study

NB = setup(globals())
display(view.settings(NB.params, NB.graph, NB.device_label, NB.threads))

# %% [markdown]
# ## The loop, per pipeline and mode

# %%
loops = study.run_loops(NB.params, NB.graph, NB.device)
display(view.loop_table(loops))
view.loop_plot(loops)

# %% [markdown]
# ## Pipelines that failed
# A pipeline whose step raised or stalled (no progress within `stall_timeout_s`) is left out of
# every figure of this notebook, and the others are measured as if it were not there; one whose
# loss was NaN or infinite keeps its figures, marked (they are of a diverged step).

# %%
display(view.failures_note(loops))

# %% [markdown]
# ## What the process got of the CPUs
# Another job on the same CPUs slows every step alike, so the IQR stays small while the figures
# are wrong: each arm's CPU share says whether it was measured alone, and a contended one says by
# whom (other jobs, or this run's own processes outnumbering its CPUs). A contended arm is marked
# in every table and the verdict does not rest on it.

# %%
display(view.cpu_table(loops))
view.cpu_plot(loops)

# %% [markdown]
# ## Where a full step goes
# Each stage is timed between device syncs. Python's garbage collector runs inside whichever stage
# it interrupts: the last column says how much of the steps' time it took (with DataLoader
# workers, a column more gives their own collections, which the training process never sees).

# %%
display(view.stage_table(loops))
view.stage_plot(loops)

# %% [markdown]
# ## How each stage grows with the samples of a batch
# The gap's two pipelines run their full step at a second batch size beside the others: a stage
# that is one pass over a shared graph costs the same whatever the batch, one that copies the
# graph or loops over the samples grows, and a loop makes more operator calls per sample.

# %%
display(view.growth_table(loops))

# %% [markdown]
# ## Your encoder, converted
# A pipeline that offers its encoder (`shared_encoder(batch)`: the encoder, its input, the gene
# graph and the batch's deleted genes) has it timed on B masked copies against its exact
# conversion to one shared graph (`workbook_lib.nodemask.convert`), with the conversion's floor
# and the layer from which every gene changes; or the one line that says why it does not convert.

# %%
display(view.encoder_table(loops))

# %% [markdown]
# ## What bounds each step
# Data-bound, model-bound (or transfer-, preparation-, overhead-bound) by the stage group with the
# largest share of the full step, and sync-bound on a GPU when its device prep, forward and
# backward make at least one host sync per sample (more for each extra sample where two batch
# sizes ran, else the step's syncs over its batch).

# %%
bounds = study.step_bounds(loops)
display(view.bound_table(bounds))

# %% [markdown]
# ## Synchronized stages against a pipelined step

# %%
display(view.pipelined_table(loops))

# %% [markdown]
# ## Sanity check: more work never takes less time
# Data only <= + forward <= + backward <= full step, per strategy, within the noise.

# %%
sanity = study.sanity_check(loops)
display(view.sanity_note(sanity))

# %% [markdown]
# ## Worker-side data pipeline

# %%
display(view.worker_table(loops))

# %% [markdown]
# ## The investigation's data-vs-model figures, measured here

# %%
reported = study.reported_figures(loops)
display(view.reported_table(reported))

# %% [markdown]
# ## Stored masks: cold and warm reads
# The loop reads masks written just before it, so its reads come from the page cache. Here the
# same per-item read of strategy 3, with the file's pages dropped first (cold) and again right
# after (warm).

# %%
reads = study.stored_reads(NB.params, NB.graph)
display(view.stored_reads_table(reads))

# %% [markdown]
# ## Epochs per day on one rank

# %%
epochs = study.epochs_per_day(loops, NB.params.num_samples)
display(view.epochs_table(loops, epochs, NB.params.num_samples))

# %% [markdown]
# ## Host syncs per step
# A sync drains the GPU's queue so the host can read a value (`.item()`, `nonzero`, boolean-mask
# indexing...), and every copy of a batch tensor from pageable (not pinned) memory waits for the
# copy. The loop form of on-device mask generation (4a) syncs once per gene slot and twice per
# deleted gene and edge type.

# %%
syncs = study.sync_study(loops, NB.graph, NB.params, NB.device)
display(view.sync_table(syncs))
view.sync_plot(syncs)

# %% [markdown]
# ## Profiles of warm steps, by exclusive time
# Each event's self time (its duration minus its children's) is attributed to the innermost
# enclosing loop stage, so the categories add up to the profiled wall time. Summing every
# event's duration instead counts parents and children again and again: that is how a whole
# training step once appeared as "optimizer 24%".

# %%
profiles = study.profile_strategies(NB.params, NB.graph, NB.device, loops=loops,
                                    trace_dir=NB.run_dir / "traces_03", run_dir=NB.run_dir)
display(view.profile_table(profiles, loops))
view.profile_plot(profiles, NB.device_label, pick=(NB.params.gap_strategies or [None])[0])

# %% [markdown]
# ## Where each stage's time is in the pipelines' code
# Two more steps recorded with Python stacks (the data stages: two batches under cProfile): each
# stage's time at the function of the pipeline's own files that holds it, the mean of the two
# and each one's.

# %%
display(view.code_table(profiles))

# %% [markdown]
# ## Results

# %%
result = TimingResult(loops, sanity, reported, epochs, syncs, profiles, study.fastest_exact(loops),
                      stored_reads=reads, bounds=bounds)
path = write_results(NB.run_dir, "03_data_vs_model_timing", result, NB.params,
                     headline=view.headline(result, NB.params.gap_strategies),
                     snapshot_checksum=NB.graph.checksum, files=[p.trace for p in profiles.values()])
display(view.saved(path, view.headline(result, NB.params.gap_strategies)))
