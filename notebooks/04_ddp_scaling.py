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
# # 04 · DDP scaling, and the gap decomposed
#
# Real data-parallel training: PyTorch's `DistributedDataParallel`, launched by `torchrun`
# (gloo on CPU, NCCL on GPU) with as many processes as the allocation holds and the same threads
# and DataLoader workers per rank at every world size. Every rank runs notebook 03's training
# loop; each launch interleaves every variant in the same rounds (DDP, `no_sync()`, gradient
# accumulation, the loss all-gather toggled, strong scaling) and the two strategies whose gap is
# decomposed; the launches alternate between world sizes (1, 2, 1, 2). Communication is measured
# per rank by DDP's own comm hook, the wait for a slower rank apart from the transfer. Then: a
# ring all-reduce model fitted on all-reduces timed here, predictions for other world sizes and
# links, and the epoch-time gap between the two `gap_strategies` as steps per epoch x time per
# step x DDP factor (a ratio of separate launches, always applied with its IQR).

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
num_workers: int = 0  # DataLoader worker processes (0: load in the main process)
pin_memory: bool = False  # DataLoader pin_memory (CUDA runs)
persistent_workers: bool = False  # DataLoader persistent_workers
world_sizes: List[int] = [1, 2]  # DDP world sizes launched with torchrun
backend: str = 'auto'  # torch.distributed backend: auto (gloo/nccl), gloo, nccl
nnodes: int = 1  # nodes of the torchrun launch (set by the SLURM scripts)
rdzv_endpoint: Optional[str] = None  # torchrun rendezvous host:port for several nodes (null: a free local port)
ddp_strategy: Optional[str] = None  # strategy or pipeline of the DDP scaling runs (null: node_mask_shared when it is among the strategies, else the slow pipeline of gap_strategies)
ddp_batch_size: int = 8  # per-rank batch of weak scaling; strong scaling keeps ddp_batch_size x the largest world size as the global batch
ddp_steps: int = 20  # fewest timed DDP steps per variant
ddp_budget_s: float = 60.0  # seconds of timed DDP steps per world size (split over its alternated launches)
grad_accum_steps: int = 2  # micro-batches of the accumulation comparison
bucket_cap_mb: float = 25.0  # DDP gradient bucket size in MB
use_ddp_gather: bool = False  # the investigation's loss-side all-gather of predictions (the other setting is measured too)
ddp_timeout_s: float = 300.0  # a launch silent this long is stopped (longer than the longest training step)
link_bandwidth_gbps: Optional[float] = None  # all-reduce bus bandwidth in GB/s for predictions (null: fitted here)
link_latency_us: Optional[float] = None  # all-reduce latency in microseconds for predictions (null: fitted here)
gap_strategies: List[str] = ['replicated_mask_cpu', 'dango_wildtype']  # the two strategies or pipelines whose gap the verdict explains (slow, fast); when not given and 'pipelines' names two or more, the first two pipelines
run_dir: str = "runs/interactive"  # where results go (a relative path is taken from the repository root)

# %%
from IPython.display import display

from workbook_lib.report import ddp_view as view
from workbook_lib.running.notebook import setup
from workbook_lib.running.results import checksums, load_result, write_results
from workbook_lib.studies import ddp as study

NB = setup(globals(), notebook="04_ddp_scaling")  # the snapshot is cached before any rank starts

# %% [markdown]
# ## What this allocation can run

# %%
plan, launched = study.run_ddp(NB.params, NB.device, NB.run_dir)
display(view.plan_text(plan))

# %% [markdown]
# ## Step time and scaling

# %%
timing = load_result(NB.run_dir, "03_data_vs_model_timing", NB.params)
slow, fast = NB.params.gap_strategies
ratio_03 = (timing.loops.ratio(timing.loops.arm(slow), timing.loops.arm(fast))
            if timing and slow in timing.loops.strategies and fast in timing.loops.strategies
            else None)
ddp = study.analyse(NB.params, plan, launched, NB.run_dir, ratio_03=ratio_03)
display(view.failures_note(ddp))
display(view.step_table(ddp))
view.scaling_plot(ddp, NB.device_label)

# %% [markdown]
# ## Communication, measured

# %%
display(view.comm_table(ddp))

# %% [markdown]
# ## Gradient accumulation with `no_sync()`, and the loss all-gather

# %%
display(view.variants_table(ddp, NB.params.grad_accum_steps, NB.params.use_ddp_gather))

# %% [markdown]
# ## Ring all-reduce model and predictions

# %%
display(view.ring_text(ddp))
display(view.prediction_table(ddp))
display(view.presets_table(ddp))

# %% [markdown]
# ## The gap, decomposed

# %%
display(view.gap_text(ddp))
view.gap_plot(ddp, NB.device_label)

# %% [markdown]
# ## Results

# %%
path = write_results(NB.run_dir, "04_ddp_scaling", ddp, NB.params, headline=view.headline(ddp),
                     snapshot_checksum=NB.graph.checksum,
                     files=ddp.log_files(NB.run_dir),
                     inputs=checksums(NB.run_dir, ["03_data_vs_model_timing"] if timing else []))
display(view.saved(path, view.headline(ddp)))
