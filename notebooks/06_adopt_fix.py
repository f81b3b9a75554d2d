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
# # 06 · Adopting the fix
#
# The same model, from the same seed, trained on the same batches twice: with replicated masks
# (the investigation's pipeline: B copies of the graph per batch, a boolean edge mask per sample, every
# message computed and masked) and with the node-mask shared graph (`workbook_lib.nodemask`:
# one shared graph, the deleted genes' indices per sample). Their steps are interleaved in one
# process. The loss curves must agree to float32 rounding; time, memory and epochs per day are
# compared side by side.

# %% tags=["parameters"]
# Every key of the params schema (python -m workbook_lib params); papermill sets them with -p KEY VALUE or -f FILE.yaml
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
strategies: List[str] = ['subgraph_cpu', 'replicated_mask_cpu', 'replicated_mask_stored', 'device_mask_loop', 'device_mask_vectorized', 'replicated_filter_device', 'node_mask_shared', 'dango_wildtype']  # strategies to compare
cpu_allocator_cache: bool = True  # keep freed memory in the glibc heap during CPU timings (as PyTorch's CUDA caching allocator does on GPUs); without it large-batch CPU steps measure page faults
warmup: int = 1  # untimed warm-up calls or steps before anything is timed
min_repeats: int = 5  # fewest timed repeats of a figure
precision_target: float = 0.1  # repeat a figure until IQR/median is at most this (or its time budget is spent)
time_budget_s: float = 2.0  # seconds one benchmark figure may spend on repeats beyond min_repeats
sweep_edges: List[int] = [20000, 50000, 100000, 200000]  # edge counts E of the cost-model sweeps; the largest is held out of every fit
sweep_hidden: List[int] = [16, 32, 64]  # hidden sizes H of the cost-model sweeps
sweep_p: List[float] = [0.001, 0.01, 0.1, 0.3, 0.6]  # removed-edge fractions p of the filter sweeps
layer_batch_sizes: List[int] = [1, 2, 4, 8]  # batch sizes of the one-layer strategy comparison
exactness_genes: int = 400  # genes of the induced subgraph on which 02 re-checks exactness
bench_full_size: bool = False  # run 02's strategy benchmark at the real spec (scale 1, H 64, 3 layers) instead of this run's sizes
bench_replicated_max_batch: int = 2  # largest batch of the replicated strategies in the benchmark (they are compared per sample; their cost is linear in B)
memory_batch_sizes: List[int] = [1, 2, 4]  # batch sizes of the peak-memory sweep (at least 3 for a fit)
memory_full_size: bool = False  # also measure peak memory at the real spec (scale 1, H 64, 3 layers)
memory_budget_gb: Optional[float] = None  # memory for the largest-batch projection (null: what the run measures on - for CPU runs the tightest of host RAM, an rlimit, a cgroup and SLURM --mem; GPU memory for CUDA runs)
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
world_sizes: List[int] = [1, 2]  # DDP world sizes launched with torchrun
backend: str = 'auto'  # torch.distributed backend: auto (gloo/nccl), gloo, nccl
nnodes: int = 1  # nodes of the torchrun launch (set by the SLURM scripts)
rdzv_endpoint: Optional[str] = None  # torchrun rendezvous host:port for several nodes (null: a free local port)
ddp_strategy: str = 'node_mask_shared'  # strategy of the DDP scaling runs
ddp_batch_size: int = 8  # per-rank batch of weak scaling; strong scaling keeps ddp_batch_size x the largest world size as the global batch
ddp_steps: int = 20  # fewest timed DDP steps per variant
ddp_budget_s: float = 60.0  # seconds of timed DDP steps per launch
grad_accum_steps: int = 2  # micro-batches of the accumulation comparison
bucket_cap_mb: float = 25.0  # DDP gradient bucket size in MB
use_ddp_gather: bool = False  # the investigation's loss-side all-gather of predictions (the other setting is measured too)
ddp_timeout_s: float = 300.0  # a launch silent this long is stopped
link_bandwidth_gbps: Optional[float] = None  # all-reduce bus bandwidth in GB/s for predictions (null: fitted here)
link_latency_us: Optional[float] = None  # all-reduce latency in microseconds for predictions (null: fitted here)
verdict_tie_tolerance: float = 0.15  # exact strategies within this fraction of the fastest count as tied (ties go to the one with the least measured memory per sample)
gap_strategies: List[str] = ['replicated_mask_cpu', 'dango_wildtype']  # the two strategies whose gap the verdict explains (slow, fast)
adopt_steps: int = 200  # training steps of each pipeline in notebook 06
adopt_optimizer: str = 'sgd'  # optimizer of notebook 06's training: sgd (rounding stays rounding) or adamw (its normalised first steps turn rounding-level gradients into full-size updates)
adopt_lr: float = 0.05  # learning rate of notebook 06's training
run_dir: str = "runs/interactive"  # where results go (a relative path is taken from the repository root)

# %%
from IPython.display import display

from workbook_lib.analysis import adoption
from workbook_lib.report import adoption_view as view
from workbook_lib.running.notebook import setup
from workbook_lib.running.results import checksums, load_result, write_results

NB = setup(globals())

# %% [markdown]
# ## The same training, two pipelines

# %%
res, losses, batch = adoption.train_both(NB.params, NB.graph, NB.device)
mask_cost, ddp = load_result(NB.run_dir, "02_mask_cost_model"), load_result(NB.run_dir, "04_ddp_scaling")
r = adoption.compare(NB.params, res, losses, batch, NB.device_label,
                     memory=mask_cost.memory if mask_cost else None, ddp=ddp)
display(view.loss_text(r))
view.loss_plot(r)

# %% [markdown]
# ## Time, memory, epochs per day

# %%
display(view.compare_table(r))

# %% [markdown]
# ## Results

# %%
path = write_results(NB.run_dir, "06_adopt_fix", r, NB.params, headline=view.headline(r),
                     snapshot_checksum=NB.graph.checksum,
                     inputs=checksums(NB.run_dir, [n for n, res in (("02_mask_cost_model", mask_cost),
                                                                   ("04_ddp_scaling", ddp)) if res]))
display(view.saved(path, view.headline(r)))
