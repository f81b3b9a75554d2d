# %% [markdown]
# # 02 · Mask cost model and strategy comparison
#
# The investigation proposed a cost model for one layer and edge type with E edges, hidden
# size H and a fraction p of edges removed:
#
# * masking: `T_mask ≈ β·E·H + α·E`
# * filtering on device: `T_filter ≈ (γ + δ)·E + β·(1−p)·E·H`
# * a replicated batch: everything times B.
#
# This notebook **measures** α, β, γ, δ by timing sweeps (warm-up, device sync, repeats; median
# and IQR), checks the fitted model on held-out configurations, predicts where filtering beats
# masking, compares two ways of computing the same messages (gather-scatter vs CSR product),
# times one layer of each strategy across batch size, and runs the full-size benchmark of the
# node-mask shared graph (strategy 6) against replicated masks (strategy 2). Every strategy runs
# the same model (`workbook_lib.model.PerturbGIN`) and is first re-checked for exactness.

# %% tags=["parameters"]
params_file = "../params/default.yaml"  # a params file (path or name in params/); None: schema defaults
params = {}  # overrides, validated by the same schema as the file
run_dir = "../runs/interactive"  # where the results JSON goes

# %%
import tempfile
import time

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display

from workbook_lib.analysis import benchmarks
from workbook_lib.analysis import costmodel
from workbook_lib.report import plotting
from workbook_lib.running import results
from workbook_lib.data import snapshots
from workbook_lib.running.notebook import setup
from workbook_lib.strategies import REGISTRY

NB = setup(params_file, params)
P, device, DEV, graph = NB.params, NB.device, NB.device_label, NB.graph
REP = P["repeats"]
print(graph.describe(), "| device:", DEV, "| warm-up", P["warmup"], "| repeats", REP)

# %% [markdown]
# ## Exactness, re-checked here
# Strategies 1-6 against the plain reference (per-sample PyG `subgraph` + `GINConv`) on an
# induced subgraph of this snapshot: the largest relative error over node outputs and every
# parameter gradient. (The test suite proves the same on small random graphs, sum and mean,
# k = 0, 1, 3, shared neighbours, B = 1 and more.)

# %%
small = snapshots.induced_subgraph(graph, min(P["exactness_genes"], graph.num_genes))
exact = benchmarks.exactness_report(small, list(REGISTRY), k=P["perturbation_k"], aggr=P["aggr"],
                                    hidden=min(P["hidden"], 16), seed=P["seed"],
                                    storage_dir=tempfile.mkdtemp(prefix="wb-masks-"))
display(pd.Series(exact, name=f"max rel. error vs reference ({small.describe()})").to_frame())
assert max(exact.values()) < 1e-4, exact

# %% [markdown]
# ## Timing sweeps and fitted coefficients
# Random graphs over this snapshot's gene count; E and H from `sweep_edges`, `sweep_hidden`,
# p from `sweep_p`. α, β (and a constant c) are fitted on masked gather-scatter layers at every E
# but the largest; γ on `isin` keep-mask construction, δ on `nonzero` + gather of kept edges.

# %%
cfg = costmodel.SweepConfig(num_nodes=graph.num_genes, edges=P["sweep_edges"], hidden=P["sweep_hidden"],
                            p=P["sweep_p"], device=device, warmup=P["warmup"], repeats=REP,
                            seed=P["seed"])
t0 = time.perf_counter()
rows = costmodel.sweep(cfg)
sweep_df = pd.DataFrame(rows)
coef = costmodel.fit(rows)
val = costmodel.validate(coef, rows)
print(f"sweep: {len(rows)} measurements in {time.perf_counter() - t0:.1f} s")
coef_df = pd.DataFrame({"value": coef, "unit": costmodel.COEFF_UNITS})
coef_df["per 1M edges (ms)"] = [coef["alpha"] * 1e9, coef["beta"] * 1e9 * P["hidden"],
                               coef["gamma"] * 1e9, coef["delta"] * 1e9, coef["c"] * 1e3]
coef_df.loc["beta", "unit"] += f" (x H={P['hidden']} in the last column)"
display(coef_df)
display(Markdown(f"**Prediction error on held-out points** ({val['n_points']} points: masked layers at "
                 f"E = {max(P['sweep_edges']):,}, and every filter layer, which the model predicts "
                 f"from components without fitting): median {val['median_abs_rel']:.0%}, "
                 f"max {val['max_abs_rel']:.0%}."))

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
held = {(pt["kind"], pt["E"], pt["H"], pt["p"]) for pt in val["points"]}
for kind, marker in (("masked", "o"), ("filter_layer", "s")):
    sub = sweep_df[sweep_df.kind == kind]
    pred = [costmodel.predict_mask(coef, r.E, r.H) if kind == "masked"
            else costmodel.predict_filter(coef, r.E, r.H, r.p) for r in sub.itertuples()]
    is_held = [(("masked" if kind == "masked" else "filter"), r.E, r.H, r.p) in held
               for r in sub.itertuples()]
    for flag, fc in ((False, None), (True, "none")):
        m = np.array(is_held) == flag
        if m.any():
            axes[0].scatter(np.array(pred)[m] * 1e3, sub["median"].values[m] * 1e3, marker=marker,
                            facecolors=fc, edgecolors="C0" if kind == "masked" else "C1",
                            label=f"{kind} ({'held out' if flag else 'fitted'})")
lims = [sweep_df["median"].min() * 1e3 * 0.5, sweep_df["median"].max() * 1e3 * 2]
axes[0].plot(lims, lims, "k--", lw=1)
axes[0].set(xscale="log", yscale="log", xlabel="predicted (ms)", ylabel="measured median (ms)")
axes[0].legend(fontsize=8)
plotting.label(axes[0], "Cost model: measured vs predicted", device=DEV,
               sizes=f"E {min(P['sweep_edges']):,}-{max(P['sweep_edges']):,}, H {P['sweep_hidden']}",
               repeats=REP)
for i, hdim in enumerate(P["sweep_hidden"]):
    sub = sweep_df[(sweep_df.kind == "masked") & (sweep_df.H == hdim)]
    axes[1].errorbar(sub.E, sub["median"] * 1e3, yerr=[(sub["median"] - sub.q1) * 1e3,
                     (sub.q3 - sub["median"]) * 1e3], fmt="o", color=f"C{i}", label=f"measured H={hdim}")
    es = np.linspace(min(P["sweep_edges"]), max(P["sweep_edges"]), 50)
    axes[1].plot(es, [costmodel.predict_mask(coef, e, hdim) * 1e3 for e in es], "-", lw=1, color=f"C{i}")
axes[1].set(xlabel="edges E", ylabel="masked layer (ms)")
axes[1].legend(fontsize=8)
plotting.label(axes[1], "Masked gather-scatter layer vs E (lines: fit)", device=DEV, repeats=REP)
plt.show()

# %% [markdown]
# ## Does filtering ever beat masking?
# Filtering pays γ+δ per edge to build the kept edge list and saves β·p·E·H of message work, so
# it wins when `p > (γ + δ − α) / (β·H)`. The perturbations of the brief remove p ≈ 0.1-0.3% of
# edges (notebook 01).

# %%
cross = costmodel.crossover_p(coef, P["hidden"])
e_big = max(graph.num_edges(t) for t in graph.edge_types)
ps = np.linspace(0, 0.99, 100)
fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
axes[0].plot(ps, [costmodel.predict_mask(coef, e_big, P["hidden"]) * 1e3] * len(ps), label="T_mask (predicted)")
axes[0].plot(ps, [costmodel.predict_filter(coef, e_big, P["hidden"], p) * 1e3 for p in ps],
             label="T_filter (predicted)")
if cross is not None:
    axes[0].axvline(cross, color="gray", ls="--", label=f"crossover p = {cross:.3f}")
axes[0].set(xlabel="fraction of edges removed p", ylabel="one layer, one edge type (ms)")
axes[0].legend(fontsize=8)
plotting.label(axes[0], "Predicted masking vs filtering", device=DEV,
               sizes=f"E = {e_big:,} (largest type), H = {P['hidden']}")
e_mid, h_mid = max(P["sweep_edges"]), max(P["sweep_hidden"])
sub_f = sweep_df[(sweep_df.kind == "filter_layer") & (sweep_df.E == e_mid) & (sweep_df.H == h_mid)]
sub_m = sweep_df[(sweep_df.kind == "masked") & (sweep_df.E == e_mid) & (sweep_df.H == h_mid)]
axes[1].errorbar(sub_f.p, sub_f["median"] * 1e3, yerr=[(sub_f["median"] - sub_f.q1) * 1e3,
                 (sub_f.q3 - sub_f["median"]) * 1e3], fmt="s-", label="filter layer (measured)")
axes[1].axhline(float(sub_m["median"].iloc[0]) * 1e3, color="C0", label="masked layer (measured)")
axes[1].set(xlabel="p", ylabel="ms")
axes[1].legend(fontsize=8)
plotting.label(axes[1], "Measured at the sweep points", device=DEV, sizes=f"E = {e_mid:,}, H = {h_mid}",
               repeats=REP)
plt.show()
print("crossover p:", "none in [0, 1)" if cross is None else f"{cross:.4f}")

# %% [markdown]
# ## Gather-scatter vs CSR sparse-dense product
# The same sum aggregation, with every message materialised (`h[src]`, then `index_add_`) or as
# one sparse product `A @ h` (no per-edge tensor).

# %%
gs = sweep_df[sweep_df.kind == "unmasked"].set_index(["E", "H"])["median"]
sp = sweep_df[sweep_df.kind == "spmm"].set_index(["E", "H"])["median"]
forms = pd.DataFrame({"gather_scatter_ms": gs * 1e3, "csr_spmm_ms": sp * 1e3})
forms["speedup"] = forms.gather_scatter_ms / forms.csr_spmm_ms
display(forms.round(3))
fig, ax = plt.subplots(figsize=(8, 4.2))
for hdim in P["sweep_hidden"]:
    f = forms.xs(hdim, level="H")
    ax.plot(f.index, f.gather_scatter_ms, "o-", label=f"gather-scatter H={hdim}")
    ax.plot(f.index, f.csr_spmm_ms, "s--", label=f"CSR product H={hdim}")
ax.set(xscale="log", yscale="log", xlabel="edges E", ylabel="ms (median)")
ax.legend(fontsize=8, ncol=2)
plotting.label(ax, "Two ways to compute the same aggregation", device=DEV, repeats=REP)
plt.show()

# %% [markdown]
# ## Mask generation per sample, each form
# Host forms are timed per batch of samples in one process (a DataLoader worker's work);
# device forms per batch on the device, divided by B.

# %%
mg_b = min(P["batch_size_lazy"], 64)
maskgen = benchmarks.mask_generation_per_sample(graph, P["perturbation_k"], mg_b, device,
                                                warmup=P["warmup"], repeats=REP, seed=P["seed"],
                                                storage_dir=tempfile.mkdtemp(prefix="wb-masks-"))
mg = pd.Series({REGISTRY[k].label: v["per_sample_s"] * 1e3 for k, v in maskgen.items()},
               name="ms per sample")
display(mg.to_frame().round(4))
fig, ax = plt.subplots(figsize=(8, 3.8))
mg.plot.barh(ax=ax, logx=True)
ax.set_xlabel("ms per sample (log)")
plotting.label(ax, "Producing one sample's edge removal", device=DEV,
               sizes=f"{graph.num_edges():,} edges, B = {mg_b}, k = {P['perturbation_k']}", repeats=REP)
plt.show()

# %% [markdown]
# ## One layer across batch size
# One model layer over all edge types (forward), per strategy: replicated masks (2),
# replicated filtering (5), node-mask shared graph (6), single wildtype pass (7). Dotted lines:
# ideal linear scaling from B = 1.

# %%
layer_strats = [s for s in ("replicated_mask_cpu", "replicated_filter_device", "node_mask_shared",
                            "dango_wildtype") if s in P["strategies"]]
layer = benchmarks.layer_time_across_batch(graph, layer_strats, P["layer_batch_sizes"], P["hidden"],
                                           P["perturbation_k"], device, aggr=P["aggr"],
                                           warmup=P["warmup"], repeats=REP, seed=P["seed"])
fig, ax = plt.subplots(figsize=(8, 4.5))
bs = np.array(P["layer_batch_sizes"])
def _arr(byb, key):
    return np.array([np.nan if byb[str(b)][key] is None else byb[str(b)][key] for b in bs]) * 1e3


for i, (name, byb) in enumerate(layer.items()):
    med = _arr(byb, "median")
    ax.errorbar(bs, med, yerr=[med - _arr(byb, "q1"), _arr(byb, "q3") - med], fmt="o-", color=f"C{i}",
                label=REGISTRY[name].label)
    ax.plot(bs, med[0] * bs / bs[0], ":", color=f"C{i}")
    oom = [b for b in bs if byb[str(b)]["median"] is None]
    if oom:  # where the memory limit was
        ax.plot(oom, [np.nanmax(med) * 1.5] * len(oom), "x", color=f"C{i}", ms=10,
                label=f"{REGISTRY[name].label}: out of memory")
ax.set(xscale="log", yscale="log", xlabel="batch size B", ylabel="one layer (ms, median)")
ax.legend(fontsize=8)
plotting.label(ax, "One layer across B (dotted: ideal linear)", device=DEV,
               sizes=f"E = {graph.num_edges():,}, H = {P['hidden']}", repeats=REP)
plt.show()
display(pd.DataFrame({REGISTRY[n].label: {b: (v["median"] * 1e3 if v["median"] is not None else v["reason"])
                                          for b, v in d.items()}
                      for n, d in layer.items()}).round(2).rename_axis("B (ms)"))

# %% [markdown]
# ## Full-size benchmark: node-mask shared graph vs replicated masks
# Real spec (scale 1.0) when `full_size_benchmark: true` (as in `params/full.yaml`); otherwise
# this snapshot's scale (a reduced-size rehearsal). B = `full_size_batch`, k, H and layers from
# params, forward + backward. Strategy 2 runs twice: as the brief's model computes it
# (gather-scatter, every message materialised, then masked) and in its best form (masks as the
# values of one sparse product). Both are exact. Strategy 2's cost is linear in B, so it runs
# at the largest batch that fits (and `replicated_max_batch`) and is compared per sample.

# %%
big = snapshots.load_snapshot(P, scale=1.0) if P["full_size_benchmark"] else graph
full = benchmarks.full_size_comparison(big, batch_size=P["full_size_batch"], k=P["perturbation_k"],
                                       hidden=P["hidden"], layers=P["layers"], device=device,
                                       aggr=P["aggr"], warmup=P["warmup"], repeats=REP,
                                       seed=P["seed"], replicated_max_batch=P["replicated_max_batch"])
fdf = pd.DataFrame([{"strategy": REGISTRY[r["strategy"]].label, "form": r["form"], "B": r["batch_size"],
                     "why this B": r["batch_reason"], "step median (s)": r["step"]["median"],
                     "IQR (s)": r["step"]["iqr"],
                     "per sample (ms)": r["per_sample_s"] * 1e3 if r["per_sample_s"] else np.nan,
                     "peak device memory": r["peak_device_bytes"], "note": r["reason"]}
                    for r in full["rows"].values()])
display(fdf)
fig, ax = plt.subplots(figsize=(8, 3.5))
ax.barh(fdf.strategy + " / " + fdf.form, fdf["per sample (ms)"])
ax.set(xscale="log", xlabel="ms per sample, forward + backward (log)")
plotting.label(ax, f"{'Full-size' if P['full_size_benchmark'] else 'Reduced-size'} benchmark", device=DEV,
               sizes=f"{big.num_edges():,} edges, H={P['hidden']}, L={P['layers']}, k={P['perturbation_k']}",
               repeats=REP)
plt.show()
def _x(v):
    return "n/a (out of memory)" if v is None else f"{v:.1f}x"


display(Markdown(
    f"**Per sample, the node-mask shared graph is {_x(full['ratio_vs_brief_form'])} faster than the brief's "
    f"form** of strategy 2 (gather-scatter, measured at B = {full['rows']['replicated_mask_cpu:gather_scatter']['batch_size']}) "
    f"and {_x(full['ratio_vs_sparse_form'])} faster than its sparse-product form, at "
    f"{big.num_edges():,} edges on {DEV} (a ratio below 1 means slower). The second ratio is what "
    f"replication alone costs; the first adds what materialising every message costs."))

# %% [markdown]
# ## Peak memory per strategy and batch size
# One forward + backward step per point, each in a fresh process (peak resident-set growth on CPU,
# `torch.cuda.max_memory_allocated` on GPU). A point that runs out of memory is kept as such and the
# sweep goes on. A linear fit per strategy gives the largest batch within `memory_budget_gb`. With
# `memory_full_size`, the replicated strategy (the brief's gather-scatter form, dual forward) and the
# node-mask shared graph are also measured at the real size with the brief's model (H=64, 3 layers):
# the brief saw the replicated model run out of memory at batch 38 on an 80 GB GPU.

# %%
from workbook_lib.measurement import memory

mem_strats = [("replicated_mask_cpu", "gather_scatter"), ("replicated_mask_cpu", "spmm"),
              ("node_mask_shared", "spmm")]
mem_rows = memory.sweep(P, mem_strats, P["memory_batch_sizes"], scale=graph.scale, hidden=P["hidden"],
                        layers=P["layers"], device=str(device), dual=P["dual_forward"])
budget = P["memory_budget_gb"] * 1e9
largest = {}
for name, form in mem_strats:
    pts = [r for r in mem_rows if r["strategy"] == name and r["form"] == form]
    largest[f"{name}:{form} @ scale {graph.scale:g}"] = memory.fit_largest_batch(pts, budget)
if P["memory_full_size"]:
    full_rows = []
    for (name, form), bss in ((("replicated_mask_cpu", "gather_scatter"), [1, 2]),
                              (("node_mask_shared", "spmm"), [1, 4])):
        pts = [memory.measure_point(P, strategy=name, form=form, batch_size=b, scale=1.0, hidden=64,
                                    layers=3, device=str(device), dual=True) for b in bss]
        full_rows += pts
        largest[f"{name}:{form} @ real size, H=64, L=3"] = memory.fit_largest_batch(pts, budget)
    mem_rows += full_rows
mdf = pd.DataFrame(mem_rows)
mdf["GB"] = mdf["bytes"].map(lambda v: None if v is None or pd.isna(v) else v / 1e9)
display(mdf[["strategy", "form", "scale", "hidden", "layers", "batch_size", "GB", "reason"]])
ldf = pd.DataFrame(largest).T
ldf["per sample (GB)"] = ldf.per_sample_bytes.map(lambda v: None if v is None else v / 1e9)
display(Markdown(f"**Largest batch within {P['memory_budget_gb']:g} GB** (linear fit on the measured points):"))
display(ldf[["per sample (GB)", "largest_batch"]])
fig, ax = plt.subplots(figsize=(8, 4))
for i, (key, g) in enumerate(mdf.groupby(["strategy", "form", "scale"], sort=False)):
    ok = g[g.GB.notna()]
    ax.plot(ok.batch_size, ok.GB, "o-", color=f"C{i}", label=f"{key[0]} / {key[1]} @ x{key[2]:g}")
    bad = g[g.GB.isna()]
    if len(bad):
        ax.plot(bad.batch_size, [ok.GB.max() if len(ok) else 1] * len(bad), "x", ms=10, color=f"C{i}",
                label=f"{key[0]} / {key[1]}: out of memory")
ax.set(xlabel="batch size", ylabel="peak memory of a step (GB)")
ax.legend(fontsize=7)
plotting.label(ax, "Peak memory per step", device=DEV, sizes=f"measured in fresh processes")
plt.show()

# %%
res = {
    "coefficients": {k: {"value": coef[k], "unit": costmodel.COEFF_UNITS[k]}
                     for k in ("alpha", "beta", "gamma", "delta")},
    "intercept_s": coef["c"],
    "crossover_p": cross,
    "prediction_error": {"median_abs_rel": val["median_abs_rel"], "max_abs_rel": val["max_abs_rel"],
                         "n_points": val["n_points"]},
    "layer_time_s": {**{n: {b: v["median"] for b, v in d.items()} for n, d in layer.items()},
                     "E": graph.num_edges(), "H": P["hidden"]},
    "exact": exact,
    "mask_generation_ms_per_sample": {k: v["per_sample_s"] * 1e3 for k, v in maskgen.items()},
    "gather_scatter_vs_spmm": [{"E": e, "H": h, **r} for (e, h), r in forms.to_dict("index").items()],
    "full_size_ratio_shared_vs_replicated": {
        "value": full["ratio_vs_brief_form"],
        "replicated_form": "gather_scatter",
        "ratio_vs_sparse_form": full["ratio_vs_sparse_form"],
        "batch_sizes": {k: r["batch_size"] for k, r in full["rows"].items()},
        "batch_reasons": {k: r["batch_reason"] for k, r in full["rows"].items()},
        "per_sample_s": {k: r["per_sample_s"] for k, r in full["rows"].items()},
        "peak_device_bytes": {k: r["peak_device_bytes"] for k, r in full["rows"].items()},
        "full_size": bool(P["full_size_benchmark"]), **full["sizes"],
    },
    "memory": {"points": mem_rows, "largest_batch": largest,
               "budget_gb": P["memory_budget_gb"]},
    "sweep": rows,
    "device": DEV,
}
headline = (f"beta {coef['beta'] * 1e9:.2f} ns/(edge·ch); crossover p = "
            f"{'none' if cross is None else f'{cross:.3f}'}; held-out error median {val['median_abs_rel']:.0%}; "
            f"node-mask shared graph vs replicated masks (brief's form), per sample: "
            f"{_x(full['ratio_vs_brief_form'])} at {big.num_edges():,} edges")
path = results.write_results(run_dir, "02_mask_cost_model", res, P, headline=headline,
                             snapshot_checksum=graph.checksum)
display(Markdown(f"**Headline.** {headline}\n\nResults: `{path}`"))
