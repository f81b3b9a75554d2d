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
# compared side by side. With your own pipelines only (`strategies: []`), the two that
# `gap_strategies` names (slow, then its exact rewrite) are trained the same way; where there is
# no such pair, this notebook says why and trains nothing.

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
gap_strategies: List[str] = ['replicated_mask_cpu', 'dango_wildtype']  # the two strategies or pipelines whose gap the verdict explains (slow, fast); when not given and 'pipelines' names two or more, the first two pipelines
adopt_steps: int = 200  # training steps of each pipeline in notebook 06
adopt_optimizer: str = 'sgd'  # optimizer of notebook 06's training: sgd (rounding stays rounding) or adamw (its normalised first steps turn rounding-level gradients into full-size updates)
adopt_lr: float = 0.05  # learning rate of notebook 06's training
run_dir: str = "runs/interactive"  # where results go (a relative path is taken from the repository root)

# %%
from IPython.display import display

from workbook_lib.report import adoption_view as view
from workbook_lib.running.notebook import setup
from workbook_lib.running.results import checksums, load_result, write_results
from workbook_lib.studies import adoption
from workbook_lib.studies.mask_cost import bench

NB = setup(globals(), notebook="06_adopt_fix")

# %% [markdown]
# ## The form of the fix
# With the built-in strategies, the fix runs in the form notebook 02's benchmark measured faster on
# this device (delta propagation, or full middle layers); a run of your own pipelines only trains
# your rewrite as you wrote it, and this section shows nothing.

# %%
mask_cost = load_result(NB.run_dir, "02_mask_cost_model", NB.params)
ddp = load_result(NB.run_dir, "04_ddp_scaling", NB.params)
form = bench.recommended_form(mask_cost.bench if mask_cost else None)  # the faster form in 02
display(view.form_text(form, NB.params.strategies))

# %% [markdown]
# ## Do the two pipelines compute the same?
# Before training, the check of `python -m workbook_lib equal`: both built from the same seed,
# the slow model's parameters copied into the fast one (paired by name), dropout modules switched
# off, one batch through both in float64, outputs, loss and every parameter's gradient compared
# against rounding.

# %%
pair = adoption.check_pair(NB.params, NB.graph, NB.device, middle=form.middle)
display(view.check_text(pair))

# %% [markdown]
# ## The same training, two pipelines

# %%
r = adoption.adopt(NB.params, pair, NB.device, NB.device_label,
                   memory=mask_cost.memory if mask_cost else None, ddp=ddp, graph=NB.graph)
display(view.loss_text(r))
view.loss_plot(r)

# %% [markdown]
# ## Time, memory, epochs per day

# %%
display(view.compare_table(r))

# %% [markdown]
# ## One fix, several speedups
# The speedups of the node-mask shared graph over replicated masks in this run folder, each named
# by what it times.

# %%
display(view.speedups_table(adoption.speedups(NB.run_dir, adoption=r)))

# %% [markdown]
# ## Results

# %%
path = write_results(NB.run_dir, "06_adopt_fix", r, NB.params, headline=view.headline(r),
                     snapshot_checksum=NB.graph.checksum,
                     inputs=checksums(NB.run_dir, [n for n, res in (("02_mask_cost_model", mask_cost),
                                                                   ("04_ddp_scaling", ddp)) if res]
                                      + adoption.speedup_inputs(NB.run_dir)))
display(view.saved(path, view.headline(r)))
