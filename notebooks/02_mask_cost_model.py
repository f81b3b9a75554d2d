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
# # 02 · Mask cost model and strategy comparison
#
# The investigation proposed a cost model for one layer and edge type (E edges, hidden size H,
# a fraction p of edges removed): masking `T_mask ≈ β·E·H + α·E`, filtering on the device
# `T_filter ≈ (γ + δ)·E + β·(1−p)·E·H`, and a replicated batch costs all of it B times. This
# notebook **measures** each term where it is paid, checks the model on held-out sizes and the
# predicted crossover against direct timings, compares two ways of computing the same messages,
# times one layer of each strategy across batch size, benchmarks the node-mask shared graph
# (strategy 6) against replicated masks (strategy 2) per sample, and measures the peak memory of
# a training step. Every strategy runs the same model and is first re-checked for exactness.

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
sweep_edges: List[int] = [20000, 50000, 100000, 200000]  # edge counts E of the cost-model sweeps; the largest is held out of every fit
sweep_hidden: List[int] = [16, 32, 64]  # hidden sizes H of the cost-model sweeps
sweep_p: List[float] = [0.001, 0.01, 0.1, 0.3, 0.6]  # removed-edge fractions p of the filter sweeps
layer_batch_sizes: List[int] = [1, 2, 4, 8]  # batch sizes of the one-layer strategy comparison
exactness_genes: int = 400  # genes of the induced subgraph on which 02 re-checks exactness
bench_full_size: bool = False  # run 02's strategy benchmark at the real spec (scale 1, H 64, 3 layers) instead of this run's sizes
bench_min_layers: int = 3  # fewest layers of 02's strategy benchmark: it runs at max(layers, this), so that the shared graph's delta form (it needs a middle layer, L at least 3) is measured; 1: the run's layers
bench_replicated_max_batch: int = 64  # largest batch at which the benchmark times the replicated forms (they also need the memory estimate to fit): at the shared form's batch when allowed, else projected from B is 1, 2 and labelled so
memory_batch_sizes: List[int] = [1, 2, 4]  # batch sizes of the peak-memory sweep (at least 3 for a fit)
memory_full_size: bool = False  # also measure peak memory at the real spec (scale 1, H 64, 3 layers)
memory_budget_gb: Optional[float] = None  # memory for the largest-batch projection (null: what the run measures on - for CPU runs the tightest of host RAM, an rlimit, a cgroup and SLURM --mem; GPU memory for CUDA runs); when set, also the benchmark's budget for the replicated forms' batch
batch_size_lazy: int = 7  # batch of the perturbed-graph strategies (the investigation's Lazy model: 28)
batch_size_dango: int = 16  # batch of the DANGO-style strategy (the investigation: 64)
run_dir: str = "runs/interactive"  # where results go (a relative path is taken from the repository root)

# %%
import tempfile

from IPython.display import display

from workbook_lib.data import snapshots
from workbook_lib.report import mask_cost_view as view
from workbook_lib.results.mask_cost import MaskCostResult
from workbook_lib.running.notebook import setup
from workbook_lib.running.results import checksums, load_result, write_results
from workbook_lib.studies import mask_cost

NB = setup(globals())
P = NB.params
display(view.builtin_note(mask_cost.builtin_note(P)))

# %% [markdown]
# ## Exactness, re-checked here
# Strategies 1-6 against the plain reference on an induced subgraph of this snapshot. (The test
# suite proves the same on small random graphs: sum and mean, k = 0, 1, 3, shared neighbours,
# B = 1 and more.)

# %%
small = snapshots.induced_subgraph(NB.graph, min(P.exactness_genes, NB.graph.num_genes))
exact = mask_cost.exactness_report(small, P.strategies, k=P.perturbation_k, aggr=P.aggr,
                                   hidden=min(P.hidden, 16), seed=P.seed,
                                   storage_dir=tempfile.mkdtemp(prefix="wb-masks-"),
                                   device=NB.device)
display(view.exactness_table(exact, small.describe()))

# %% [markdown]
# ## The cost model, measured
# Random graphs over this snapshot's gene count, every primitive timed in the same rounds: E from
# `sweep_edges`, H from `sweep_hidden`, p from `sweep_p`.

# %%
cost = mask_cost.cost_model_study(P, NB.graph.num_genes, NB.device)
display(view.coefficient_table(cost))
view.cost_plot(cost, NB.device_label)

# %% [markdown]
# ## Does filtering ever beat masking?

# %%
inventory = load_result(NB.run_dir, "01_graph_inventory", NB.params)
display(view.crossover_text(cost, inventory.removed_edge_fraction.median if inventory else None))
display(view.crossover_table(cost))

# %% [markdown]
# ## Gather-scatter vs CSR sparse-dense product

# %%
display(view.forms_table(cost))

# %% [markdown]
# ## Producing one sample's edge removal, each form

# %%
maskgen = mask_cost.mask_generation_study(P, NB.graph, NB.device)
display(view.mask_generation_table(maskgen))

# %% [markdown]
# ## One layer across batch size
# One middle layer over every edge type (forward) of replicated masks (2), replicated filtering
# (5), the node-mask shared graph (6) and the wildtype pass (7), interleaved per batch size.

# %%
layers = mask_cost.layer_study(P, NB.graph, NB.device)
view.layer_plot(layers, NB.device_label)

# %% [markdown]
# ## The strategy benchmark: per sample, forward + backward
# The node-mask shared graph in the form this workbook recommends (second layer
# delta-propagated: its per-sample work follows what a deletion changed) and with full middle
# layers, replicated masks in the Lazy model's form and in their sparse-product form, and a
# DANGO-style wildtype step, all in the same rounds. At this run's sizes, or at the real spec
# with `bench_full_size: true`; at least `bench_min_layers` (3) layers, so that the delta form is
# measured. Each shared label names the path its step took and the push kernel. The replicated
# forms are measured at the shared form's batch when their memory estimate fits the budget, else
# at the largest batch that fits, labelled with that batch ("at least" when their per-sample cost
# rose with B); the projection from B = 1, 2 is shown beside it with its error there.

# %%
bres = mask_cost.benchmark(P)
display(view.bench_text(bres))
display(view.bench_table(bres))
view.bench_plot(bres)
display(view.form_of(bres))

# %% [markdown]
# ### What bounds the per-sample sparse product
# On a CPU a CSR product is bound by fetching the dense rows its nonzeros point to: the kernels
# tried differ in how much of the dense operand stays in cache. The step's own sparse and dense
# products, as achieved in one profiled step, beside the best rates measured on this machine;
# then the floor: the fewest multiply-adds an exact sample of this model needs (from the batch's
# own deletions), beside the step's measured counts and the time the floor takes at these rates;
# then the convert section (a TorchCell-shaped encoder converted, against masked copies and its
# floor) and where its converted step's time goes, part by part, beside each part's floor.

# %%
display(view.kernel_table(bres))
display(view.rates_table(bres))
display(view.floor_table(bres))
display(view.convert_table(bres))
display(view.convert_parts_table(bres))

# %% [markdown]
# ## Peak memory of a training step
# One forward + backward step per point in a fresh process; on CPU the resident-set high-water
# mark, reset just before the step; on GPU `torch.cuda.max_memory_allocated`. A pipeline whose
# probe raises or stalls is named above the table, the others' points stand.

# %%
mem = mask_cost.memory_study(P, NB.device)
display(view.memory_failures(mem))
display(view.memory_table(mem))
view.memory_plot(mem)

# %% [markdown]
# ## What the dual forward adds to the masks
# The Lazy model's dual forward runs a wildtype pass beside the perturbed one. The per-edge mask
# bytes its operators read, without and with it (one batch of replicated masks).

# %%
dual = mask_cost.dual_masks(P, NB.graph, NB.device)
display(view.dual_masks_text(dual))

# %% [markdown]
# ## Results

# %%
result = MaskCostResult(NB.device_label, exact, small.describe(), cost, maskgen, layers, bres, mem,
                        dual_masks=dual)
path = write_results(NB.run_dir, "02_mask_cost_model", result, P, headline=view.headline(result),
                     snapshot_checksum=NB.graph.checksum,
                     inputs=checksums(NB.run_dir, ["01_graph_inventory"] if inventory else []))
display(view.saved(path, view.headline(result)))
