# %% [markdown]
# # 04 · DDP scaling, and the 40x gap decomposed
#
# Real data-parallel training: PyTorch's `DistributedDataParallel`, launched by `torchrun`
# (`python -m torch.distributed.run`) from this notebook through `workbook_lib.launcher`, gloo on
# CPU and NCCL on GPU. Each rank writes its own timings; this notebook aggregates them (a
# synchronous step lasts as long as its slowest rank).
#
# Per world size: step time, forward/backward, exposed communication (DDP step minus the same
# step under `no_sync()`), overlap with backward, bytes all-reduced, weak and strong scaling,
# spread across ranks, gradient accumulation with and without `no_sync()`, and the loss-side
# all-gather on and off. Then a ring all-reduce model predicts larger runs, and the brief's
# epoch-time gap is decomposed into steps x step time x DDP overhead.

# %% tags=["parameters"]
params_file = "../params/default.yaml"  # a params file (path or name in params/); None: schema defaults
params = {}  # overrides, validated by the same schema as the file
run_dir = "../runs/interactive"  # where the results JSON and rank logs go

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display

from workbook_lib.distributed import allreduce_model as arm
from workbook_lib.distributed import analysis as da
from workbook_lib.distributed import launcher
from workbook_lib.report import plotting
from workbook_lib.running import results
from workbook_lib.running.notebook import setup
from workbook_lib.strategies import REGISTRY

NB = setup(params_file, params)
P, device, DEV, graph = NB.params, NB.device, NB.device_label, NB.graph  # the graph is cached before any rank starts
run_dir = Path(run_dir)

# %% [markdown]
# ## What this machine can run

# %%
cuda = device.type == "cuda"
backend = P["backend"] if P["backend"] != "auto" else ("nccl" if cuda else "gloo")
notes = []
if backend == "nccl" and not torch.cuda.is_available():
    notes.append("backend 'nccl' was requested but there is no CUDA device: running with gloo instead.")
    backend = "gloo"
capacity = torch.cuda.device_count() if cuda else (os.cpu_count() or 1)
world_sizes = [w for w in P["world_sizes"] if w <= capacity * P["nnodes"]]
skipped = [w for w in P["world_sizes"] if w not in world_sizes]
if skipped:
    notes.append(f"world sizes {skipped} need more {'GPUs' if cuda else 'CPU cores'} than the "
                 f"{capacity} here x {P['nnodes']} node(s): skipped (predicted below instead).")
if 1 not in world_sizes:
    notes.append("world size 1 was not requested: efficiencies are relative to the smallest one run.")
threads = max(1, (os.cpu_count() or 1) // max(world_sizes)) if not cuda else None
print(f"backend {backend}; world sizes run: {world_sizes}; {DEV}; "
      f"{'threads per rank ' + str(threads) if threads else ''}")
for n in notes:
    print("NOTE:", n)

# %% [markdown]
# ## Launch the runs

# %%
scaling = P["ddp_strategy"]
slow, fast = P["gap_strategies"]
bs = {"dango_wildtype": P["batch_size_dango"]}
specs = [{"name": scaling, "batch_size": P["ddp_batch_size"], "full": True}]
for name in (slow, fast):
    if name != scaling:
        specs.append({"name": name, "batch_size": bs.get(name, P["batch_size_lazy"])})
worker_params = {**P, "backend": backend}
launches = {}
for ws in world_sizes:
    r = launcher.launch("workbook_lib.distributed.worker",
                        {"params": worker_params, "strategies": specs, "steps": P["ddp_steps"],
                         "warmup": P["warmup"], "timeout_s": P["ddp_timeout_s"]},
                        nproc_per_node=ws // P["nnodes"] if P["nnodes"] > 1 else ws,
                        nnodes=P["nnodes"], rdzv_endpoint=P["rdzv_endpoint"],
                        out_dir=run_dir / "ddp_04" / f"world{ws}", timeout_s=P["ddp_timeout_s"],
                        threads_per_rank=threads)
    launches[ws] = r.ranks
    print(f"world size {ws}: {r.seconds:.1f} s; rank logs in {r.out_dir}")

# %%
summary = {ws: da.summarize_world(ranks, scaling) for ws, ranks in launches.items()}
eff = da.efficiencies(summary)
tab = pd.DataFrame({ws: {"step (s)": s["step_median"], "IQR (s)": s["step_iqr"],
                         "forward (s)": s["forward_median"], "backward (s)": s["backward_median"],
                         "optimizer (s)": s["optimizer_median"], "no_sync step (s)": s["no_sync_median"],
                         "exposed comm (s)": s["exposed_comm_s"], "all-reduce of grads (s)": s["allreduce_grad_s"],
                         "overlap": s["overlap"], "comm fraction": s["comm_fraction"],
                         "bytes all-reduced / step": s["grad_bytes"] if ws > 1 else 0,
                         "rank spread": s["rank_spread"], "weak eff.": eff["weak"].get(ws),
                         "strong eff.": eff["strong"].get(ws)} for ws, s in summary.items()})
display(Markdown(f"**{REGISTRY[scaling].label}**, per-rank batch {P['ddp_batch_size']}, "
                 f"{P['ddp_steps']} steps after {P['warmup']} warm-up, bucket {P['bucket_cap_mb']} MB, "
                 f"loss all-gather {'on' if P['use_ddp_gather'] else 'off'}"))
display(tab)

# %%
SIZES = f"{REGISTRY[scaling].label}, B/rank={P['ddp_batch_size']}, {graph.num_edges():,} edges, H={P['hidden']}"
wss = np.array(sorted(summary))
fig, axes = plt.subplots(1, 3, figsize=(16, 4.3))
med = np.array([summary[w]["step_median"] for w in wss])
iqr = np.array([summary[w]["step_iqr"] for w in wss])
axes[0].errorbar(wss, med, yerr=iqr / 2, fmt="o-", label="weak (B/rank fixed)")
axes[0].plot(wss, [med[0]] * len(wss), "k:", label="ideal weak")
if all("strong_median" in summary[w] for w in wss):
    sm = np.array([summary[w]["strong_median"] for w in wss])
    axes[0].plot(wss, sm, "s-", label="strong (global batch fixed)")
    axes[0].plot(wss, sm[0] * wss[0] / wss, "k--", lw=1, label="ideal strong")
axes[0].set(xscale="log", yscale="log", xlabel="world size", ylabel="step time (s)")
axes[0].set_xticks(wss, [str(w) for w in wss])
axes[0].legend(fontsize=8)
plotting.label(axes[0], "Step time vs world size", device=DEV, sizes=SIZES, repeats=P["ddp_steps"])
axes[1].plot(wss, [eff["weak"].get(w, np.nan) for w in wss], "o-", label="weak")
axes[1].plot(wss, [eff["strong"].get(w, np.nan) for w in wss], "s-", label="strong")
axes[1].axhline(1, color="k", ls=":")
axes[1].set(xscale="log", xlabel="world size", ylabel="efficiency", ylim=(0, 1.2))
axes[1].set_xticks(wss, [str(w) for w in wss])
axes[1].legend(fontsize=8)
plotting.label(axes[1], "Scaling efficiency (1 = ideal)", device=DEV, sizes=f"backend {backend}")
comp = [summary[w]["no_sync_median"] for w in wss]
comm = [summary[w]["exposed_comm_s"] for w in wss]
other = [max(0.0, summary[w]["step_median"] - c - e) for w, c, e in zip(wss, comp, comm)]
axes[2].bar([str(w) for w in wss], comp, label="compute (no_sync step)")
axes[2].bar([str(w) for w in wss], comm, bottom=comp, label="exposed communication")
axes[2].bar([str(w) for w in wss], other, bottom=np.add(comp, comm), label="rest")
axes[2].set(xlabel="world size", ylabel="s per step")
axes[2].legend(fontsize=8)
plotting.label(axes[2], "Compute vs communication", device=DEV, repeats=P["ddp_steps"])
plt.show()

# %% [markdown]
# ## Gradient accumulation with `no_sync()` vs all-reducing every micro-batch, and the loss all-gather
# Same effective batch (`grad_accum_steps` micro-batches of the per-rank batch): with `no_sync()`
# only the last micro-batch all-reduces.

# %%
ga = pd.DataFrame({ws: {"accum + no_sync (s/opt step)": s.get("accum_no_sync_median"),
                        "accum, all-reduce every micro-batch (s/opt step)": s.get("accum_sync_every_median"),
                        f"loss all-gather {'on' if P['use_ddp_gather'] else 'off'} (s/step)": s["step_median"],
                        f"loss all-gather {'off' if P['use_ddp_gather'] else 'on'} (s/step)": s.get("ddp_gather_toggled_median")}
                   for ws, s in summary.items()})
display(ga)
fig, ax = plt.subplots(figsize=(7, 3.8))
ga.T.plot.bar(ax=ax, rot=0)
ax.set(xlabel="world size", ylabel="seconds")
ax.legend(fontsize=7)
plotting.label(ax, f"DDP vs accumulation ({P['grad_accum_steps']} micro-batches), all-gather on/off",
               device=DEV, sizes=SIZES, repeats=P["ddp_steps"])
plt.show()

# %% [markdown]
# ## Ring all-reduce model and predictions
# `t = 2(n-1)/n · bytes / bandwidth + latency` (per DDP bucket). Bandwidth and latency are fitted
# on all-reduces timed here (or taken from `link_bandwidth_gbps` / `link_latency_us`); presets show
# what the same model predicts on NVLink, PCIe and InfiniBand.

# %%
link = da.link_from_measurements(summary)
if P["link_bandwidth_gbps"] is not None:
    link = {"bandwidth_gbps": P["link_bandwidth_gbps"], "latency_us": P["link_latency_us"] or 0.0,
            "source": "params link_bandwidth_gbps / link_latency_us"}
if link is None:
    link = {**arm.LINK_PRESETS["pcie gen4"], "source": "preset 'pcie gen4' (no world size >= 2 ran here)"}
print(f"link: {link['bandwidth_gbps']:.3g} GB/s, {link['latency_us']:.3g} us ({link['source']})")
pred_ws = sorted(set(P["world_sizes"]) | {1, 2, 4, 8})
pred = da.predictions(summary, link, pred_ws, bucket_cap_mb=P["bucket_cap_mb"])
cmp = pd.DataFrame({"predicted (s)": pred, "measured (s)": {w: summary[w]["step_median"] for w in summary}})
cmp["error"] = (cmp["predicted (s)"] - cmp["measured (s)"]) / cmp["measured (s)"]
display(cmp)
base = summary.get(1) or summary[min(summary)]
presets = pd.DataFrame({name: {ws: arm.predict_step(base["no_sync_median"], base["grad_bytes"], ws, l,
                                                   bucket_cap_mb=P["bucket_cap_mb"])
                               for ws in (2, 4, 8, 16)} for name, l in arm.LINK_PRESETS.items()})
display(Markdown("**Predicted step time (s) on other links** (no overlap assumed; compute from the "
                 "single-rank step here; across nodes use the InfiniBand column):"))
display(presets)
fig, ax = plt.subplots(figsize=(7, 4))
ax.plot(list(pred), list(pred.values()), "o--", label=f"predicted ({link['source']})")
ax.plot(list(summary), [s["step_median"] for s in summary.values()], "s", ms=9, label="measured")
ax.set(xscale="log", xlabel="world size", ylabel="step time (s)")
ax.legend(fontsize=8)
plotting.label(ax, "Predicted vs measured step time", device=DEV, sizes=SIZES)
plt.show()

# %% [markdown]
# ## The brief's 40x, decomposed
# Epoch-time ratio between the two `gap_strategies` (defaults: replicated masks at batch 28 vs
# DANGO-style at batch 64) = steps-per-epoch ratio x per-step-time ratio x DDP-overhead ratio,
# each measured here.

# %%
gap = da.gap_decomposition(launches, slow, fast, num_samples=int(P["num_samples"] * 0.8))
terms = [("steps per epoch", gap["steps_ratio"]), ("time per step", gap["per_step_ratio"]),
         ("DDP overhead", gap["ddp_factor"])]
fig, ax = plt.subplots(figsize=(7, 4))
logs = np.log10([t[1] for t in terms])
cum = np.concatenate([[0], np.cumsum(logs)])
for i, ((name, v), lg) in enumerate(zip(terms, logs)):
    ax.bar(i, lg, bottom=cum[i], color="C3" if lg > 0 else "C2")
    ax.text(i, cum[i] + lg / 2, f"x{v:.2f}", ha="center", va="center")
ax.bar(len(terms), cum[-1], color="C0")
ax.text(len(terms), cum[-1] / 2, f"x{gap['total']:.1f}", ha="center", va="center", color="w")
ax.axhline(np.log10(40), color="k", ls=":", label="the brief's 40x")
ax.set_xticks(range(len(terms) + 1), [t[0] for t in terms] + ["epoch-time ratio"])
ax.set_ylabel("log10(ratio)")
ax.legend(fontsize=8)
plotting.label(ax, f"{REGISTRY[slow].label} vs {REGISTRY[fast].label}", device=DEV,
               sizes=f"B {gap['batch_sizes'][slow]} vs {gap['batch_sizes'][fast]}, world size {gap['world_size']}",
               repeats=P["ddp_steps"])
plt.show()
share = {name: np.log(v) / np.log(gap["total"]) if gap["total"] > 1 else None for name, v in terms}
display(Markdown(
    f"On this snapshot and device the epoch-time ratio is **{gap['total']:.1f}x** (brief: 40x): "
    + "; ".join(f"{name} x{v:.2f}" + (f" ({share[name]:.0%} of the log-gap)" if share[name] is not None else "")
                for name, v in terms) + "."))

# %%
res = {
    "step_time_s": {ws: s["step_median"] for ws, s in summary.items()},
    "step_iqr_s": {ws: s["step_iqr"] for ws, s in summary.items()},
    "scaling_efficiency": eff["weak"],
    "strong_scaling_efficiency": eff["strong"],
    "comm_fraction": {ws: s["comm_fraction"] for ws, s in summary.items()},
    "overlap": {ws: s["overlap"] for ws, s in summary.items()},
    "bytes_allreduced_per_step": {ws: (s["grad_bytes"] if ws > 1 else 0) for ws, s in summary.items()},
    "rank_spread": {ws: s["rank_spread"] for ws, s in summary.items()},
    "grad_accum_vs_ddp": {ws: {"accum_no_sync_s": s.get("accum_no_sync_median"),
                               "accum_sync_every_s": s.get("accum_sync_every_median"),
                               "accum_steps": s.get("accum_steps")} for ws, s in summary.items()},
    "ddp_gather": {ws: {"param_on": P["use_ddp_gather"], "step_s": s["step_median"],
                        "toggled_step_s": s.get("ddp_gather_toggled_median")} for ws, s in summary.items()},
    "predicted_step_time_s": pred,
    "link": link,
    "link_presets_step_time_s": presets.to_dict(),
    "gap_decomposition": gap,
    "backend": backend,
    "world_sizes_run": world_sizes,
    "world_sizes_skipped": skipped,
    "notes": notes,
    "strategy": scaling,
    "ddp_logging": {ws: s.get("ddp_logging") for ws, s in summary.items()},
    "device": DEV,
}
w_max = max(summary)
headline = (f"{REGISTRY[scaling].label}: weak efficiency {eff['weak'].get(w_max, float('nan')):.2f} at "
            f"{w_max} ranks ({backend}); gap {slow} vs {fast} = {gap['total']:.1f}x "
            f"(steps x{gap['steps_ratio']:.2f}, step time x{gap['per_step_ratio']:.2f}, DDP x{gap['ddp_factor']:.2f})")
path = results.write_results(run_dir, "04_ddp_scaling", res, P, headline=headline,
                             snapshot_checksum=graph.checksum)
display(Markdown(f"**Headline.** {headline}\n\nResults: `{path}`"))
