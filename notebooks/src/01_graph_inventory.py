# %% [markdown]
# # 01 · Graph size inventory
#
# How big is the cell graph, and how many bytes does each representation a pipeline may carry
# cost per sample, per batch and for the whole dataset? This notebook computes them from the
# snapshot (nothing is assumed), checks the brief's size claims, and measures how local a
# perturbation is (edges removed, genes within 1-3 hops of the deleted genes).
#
# Run it from JupyterLab with the defaults below, or through
# `python -m workbook_lib run --params params/default.yaml`, which injects `params` and `run_dir`.

# %% tags=["parameters"]
params_file = "../params/default.yaml"  # a params file (path or name in params/); None: schema defaults
params = {}  # overrides, validated by the same schema as the file
run_dir = "../runs/interactive"  # where the results JSON goes

# %%
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Markdown, display

from workbook_lib.data import inventory
from workbook_lib.data import perturbations
from workbook_lib.report import plotting
from workbook_lib.running import results
from workbook_lib.running.notebook import setup
from workbook_lib.running.params import mean_k

t0 = time.perf_counter()
NB = setup(params_file, params)
setup_s = time.perf_counter() - t0
P, graph = NB.params, NB.graph
pd.DataFrame({"value": {k: repr(v) for k, v in P.items()}}).T

# %%
print(graph.describe(), f"- set up and loaded in {setup_s:.1f} s on {NB.device_label}")
print("checksum", graph.checksum[:16], "| ignored types:", graph.ignored or "none")

# %% [markdown]
# ## Edge types

# %%
types = pd.DataFrame(inventory.edge_type_table(graph))
total = types[["edges", "bytes_int64", "bytes_int32"]].sum()
display(types.style.format({"nodes": "{:,}", "edges": "{:,}", "bytes_int64": inventory.human_bytes,
                            "bytes_int32": inventory.human_bytes}))
print(f"total edges {int(total.edges):,}; edge_index {inventory.human_bytes(total.bytes_int64)} "
      f"(int64), {inventory.human_bytes(total.bytes_int32)} (int32)")

# %%
fig, ax = plt.subplots(figsize=(9, 4))
x = np.arange(len(types))
ax.bar(x - 0.2, types.edges, 0.4, label="edges")
ax.bar(x + 0.2, types.nodes, 0.4, label="nodes touched")
ax.set_xticks(x, types.name, rotation=35, ha="right")
ax.set_yscale("log")
ax.legend()
plotting.label(ax, "Edges and nodes touched per edge type (log scale)",
               sizes=f"{graph.name}, scale {graph.scale:g}, {graph.num_genes:,} genes")
plt.show()

# %% [markdown]
# ## Perturbations: removed edges and hop coverage
# An edge is removed when either endpoint is deleted. Hop coverage: the fraction of all genes
# within h hops (all edge types, both directions) of a sample's deleted genes.

# %%
pert = perturbations.sample_perturbations(graph.num_genes, P["perturbation_k"],
                                          P["num_perturbations"], seed=P["seed"])
removed = inventory.removed_edge_counts(graph, pert)
removed_frac = removed / graph.num_edges()
hops = inventory.hop_coverage(graph, pert, hops=3)
print(f"{len(pert)} perturbations, k = {P['perturbation_k']}: removed edges per sample "
      f"mean {removed.mean():,.0f} ({removed_frac.mean():.3%}), max {removed_frac.max():.3%}")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
axes[0].hist(removed_frac * 100, bins=30)
axes[0].set_xlabel("edges removed per sample (% of all edges)")
axes[0].set_ylabel("samples")
plotting.label(axes[0], "Removed-edge fraction",
               sizes=f"{len(pert)} samples, k={P['perturbation_k']}, {graph.num_edges():,} edges")
axes[1].boxplot([hops[:, h] * 100 for h in range(3)], tick_labels=["1 hop", "2 hops", "3 hops"])
axes[1].plot([1, 2, 3], hops.mean(0) * 100, "o-", label="mean")
axes[1].set_ylabel("genes within reach (% of all genes)")
axes[1].legend()
plotting.label(axes[1], "Hop coverage of the deleted genes", sizes=f"{len(pert)} samples")
plt.show()

# %% [markdown]
# ## Bytes per representation

# %%
per_sample = inventory.per_sample_bytes(graph, mean_k(P["perturbation_k"]), float(removed.mean()))
per_batch = inventory.per_batch_bytes(per_sample, P["batch_sizes"])
dataset = inventory.dataset_bytes(per_sample, P["num_samples"])
inc_bytes = inventory.incidence_cache_bytes(graph)
table = pd.DataFrame({
    "per sample": per_sample,
    **{f"batch {b}": {r: per_batch[r][str(b)] for r in per_sample} for b in P["batch_sizes"]},
    f"dataset ({P['num_samples']:,} samples)": dataset,
}).rename(index=inventory.REPRESENTATION_LABELS)
display(table.map(inventory.human_bytes))
print(f"incidence cache (prepared once, not per sample): {inventory.human_bytes(inc_bytes)}")

# %%
fig, ax = plt.subplots(figsize=(8, 4.5))
bs = np.array(P["batch_sizes"])
for rep in per_sample:
    ax.plot(bs, [per_batch[rep][str(b)] for b in bs], "o-", label=inventory.REPRESENTATION_LABELS[rep])
ax.axhline(inc_bytes, color="gray", ls="--", label="incidence cache (once)")
ax.set_xscale("log")
ax.set_yscale("log")
ax.set_xlabel("batch size B")
ax.set_ylabel("bytes per batch")
ax.legend(fontsize=8)
plotting.label(ax, "Bytes per batch by representation",
               sizes=f"{graph.name} x{graph.scale:g}, {graph.num_edges():,} edges, k={P['perturbation_k']}")
plt.show()

# %% [markdown]
# ## The brief's size claims
# The claims were made about the real graph (scale 1.0). At another scale the computed values
# shrink with the edge count; run with `params/full.yaml` (or `scale: 1.0`) to check them as made.

# %%
claims = pd.DataFrame(inventory.claims_table(per_sample["edge_masks"], inc_bytes, P["num_samples"]))
display(claims.style.format({"claimed_bytes": inventory.human_bytes,
                             "computed_bytes": inventory.human_bytes,
                             "ratio_computed_over_claimed": "{:.2f}"}))

# %%
res = {
    "num_genes": graph.num_genes,
    "total_edges": graph.num_edges(),
    "edge_types": [{"name": r["name"], "nodes": r["nodes"], "edges": r["edges"]}
                   for r in inventory.edge_type_table(graph)],
    "mask_bytes_per_sample": per_sample["edge_masks"],
    "mask_bytes_per_batch": per_batch["edge_masks"],
    "replicated_edge_index_bytes_per_batch": per_batch["replicated_edge_index"],
    "incidence_cache_bytes": inc_bytes,
    "dataset_mask_storage_bytes": dataset["edge_masks"],
    "dataset_storage_bytes": dataset,
    "bytes_per_sample": per_sample,
    "removed_edge_fraction": {"mean": float(removed_frac.mean()),
                              "median": float(np.median(removed_frac)),
                              "max": float(removed_frac.max())},
    "hop_coverage": {str(h + 1): float(hops[:, h].mean()) for h in range(3)},
    "claims": claims.to_dict("records"),
    "graph": {"name": graph.name, "source": graph.source, "scale": graph.scale},
}
b_ref = 28 if "28" in per_batch["edge_masks"] else str(P["batch_sizes"][-1])
headline = (f"{graph.num_edges():,} edges over {graph.num_genes:,} genes; masks "
            f"{inventory.human_bytes(per_sample['edge_masks'])}/sample, "
            f"{inventory.human_bytes(per_batch['edge_masks'][str(b_ref)])} per batch of {b_ref}; "
            f"a perturbation removes {removed_frac.mean():.2%} of edges but reaches "
            f"{hops[:, 1].mean():.0%} of genes within 2 hops")
path = results.write_results(run_dir, "01_graph_inventory", res, P, headline=headline,
                             snapshot_checksum=graph.checksum)
display(Markdown(f"**Headline.** {headline}\n\nResults: `{path}`"))
