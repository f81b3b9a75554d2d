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
# # 05 · Verdict
#
# Why the slow pipeline of the pair is slow on this device, stage by stage, and the fix, from
# what notebooks 01-04 of this run folder measured. It needs notebook 03's timings of the pair;
# 01, 02 and 04 are used when they completed, and the answer names any that did not and why.
# The investigation's claims are judged only when built-in strategies ran.

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
verdict_tie_tolerance: float = 0.15  # exact strategies within this fraction of the fastest count as tied (ties go to the one with the least measured memory per sample)
verdict_check_equal: bool = False  # 05 runs python -m workbook_lib equal on the pair when no kept outcome matches their sources (a pipeline that does not declare itself exact is then the fix only if proven equal)
gap_strategies: List[str] = ['replicated_mask_cpu', 'dango_wildtype']  # the two strategies or pipelines whose gap the verdict explains (slow, fast); when not given and 'pipelines' names two or more, the first two pipelines
run_dir: str = "runs/interactive"  # where results go (a relative path is taken from the repository root)

# %%
from IPython.display import display

from workbook_lib.report import verdict_view as view
from workbook_lib.running.notebook import setup
from workbook_lib.running.results import read_meta, write_results
from workbook_lib.studies import verdict

NB = setup(globals(), load_graph=False, needs_device=False, notebook="05_verdict")
found, inputs, missing = verdict.load_inputs(NB.run_dir, NB.params)
env = read_meta(NB.run_dir, "03_data_vs_model_timing").environment
v = verdict.build_verdict(found, inputs, NB.params, NB.run_dir, env["device_label"],
                          env["device"].split(":")[0], missing)
display(view.answer(v))

# %% [markdown]
# ## The gap, stage by stage
# Each stage's time per epoch, slow minus fast, and how it grows with the samples of a batch
# (the slow pipeline's full step at two batch sizes in notebook 03's loop).

# %%
display(view.causes_table(v))
view.causes_plot(v)

# %% [markdown]
# ## Where the first causes are in your code

# %%
display(view.code_table(v))

# %% [markdown]
# ## The investigation's claims

# %%
display(view.claims_table(v))

# %% [markdown]
# ## The fix

# %%
display(view.recommendation_text(v, NB.run_dir))
display(view.epochs_table(v))
display(view.form(v))

# %%
display(view.adoption(v))

# %% [markdown]
# ## What this run can and cannot say

# %%
display(view.cpu_text(v))

# %% [markdown]
# ## Results

# %%
path = write_results(NB.run_dir, "05_verdict", v, NB.params, headline=view.headline(v),
                     snapshot_checksum=read_meta(NB.run_dir, "03_data_vs_model_timing").snapshot_checksum,
                     inputs=inputs)
display(view.saved(path, view.headline(v)))
