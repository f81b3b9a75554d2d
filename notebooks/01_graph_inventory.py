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
# # 01 · Graph size inventory
#
# How big is the cell graph, and how many bytes does each representation a pipeline may carry
# cost per sample, per batch and for the whole dataset? Everything here is computed from the
# snapshot and sampled perturbations; nothing is assumed. Then: how local is a perturbation
# (edges removed, genes within 1-3 hops of the deleted genes)?

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
run_dir: str = "runs/interactive"  # where results go (a relative path is taken from the repository root)

# %%
from IPython.display import display

from workbook_lib.report import inventory_view as view
from workbook_lib.running.notebook import setup
from workbook_lib.running.results import write_results
from workbook_lib.studies import inventory

NB = setup(globals(), needs_device=False)
inv = inventory.inventory(NB.params, NB.graph)
display(view.summary(inv))

# %% [markdown]
# ## Edge types

# %%
display(view.edge_type_table(inv))
view.edge_type_plot(inv)

# %% [markdown]
# ## How local is a perturbation?
# An edge is removed when either endpoint is deleted. Reach: the fraction of all genes within h
# hops (all edge types, both directions) of a sample's deleted genes.

# %%
display(view.locality_text(inv))
view.locality_plot(inv)

# %% [markdown]
# ## What a perturbation changes, layer by layer
# Per layer and edge type, the fraction of genes whose aggregation differs from the wildtype's
# and the fraction of edges whose message does: the measured basis of delta propagation.

# %%
display(view.footprint_text(inv))
display(view.footprint_table(inv))

# %% [markdown]
# ## Bytes per representation

# %%
display(view.bytes_table(inv, NB.params.num_samples))
view.bytes_plot(inv)

# %% [markdown]
# ## At the real size
# The investigation's size claims were made about the real graph; this arithmetic uses the real edge
# counts whatever this run's scale.

# %%
display(view.real_size_table(inv))

# %% [markdown]
# ## Results

# %%
path = write_results(NB.run_dir, "01_graph_inventory", inv, NB.params, headline=view.headline(inv),
                     snapshot_checksum=NB.graph.checksum)
display(view.saved(path, view.headline(inv)))
