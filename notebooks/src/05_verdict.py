# %% [markdown]
# # 05 · Verdict
#
# Draws notebooks 01-04 of this run folder together (a missing one is named, not fatal):
#
# 1. **Why** is one strategy slower than the other? The epoch-time difference between the two
#    `gap_strategies` (defaults: replicated masks vs DANGO-style), split into causes and ranked
#    by their measured share.
# 2. **Which claims of the brief hold?** Each with its status (held, failed, not testable here)
#    and the number behind it.
# 3. **What to do:** the fastest exact strategy, its measured speedup and memory, and what a
#    user must change in their pipeline to adopt it.

# %% tags=["parameters"]
params_file = "../params/default.yaml"  # a params file (path or name in params/); None: schema defaults
params = {}  # overrides, validated by the same schema as the file
run_dir = "../runs/interactive"  # the run folder whose results are drawn together

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from workbook_lib.running import environment
from workbook_lib.report import plotting
from workbook_lib.running import results
from workbook_lib.analysis import verdict
from workbook_lib.running.params import notebook_params
from workbook_lib.data.snapshots import load_spec
from workbook_lib.running.params import snapshot_spec_path
from workbook_lib.strategies import REGISTRY

P = notebook_params(params_file, params)
plotting.setup()
run_dir = Path(run_dir)
found, missing = verdict.load_run(run_dir)
env = results.read_results(run_dir, next(iter(found))) if found else None
DEV = env["_meta"]["environment"]["device_label"] if env else environment.device_label(
    environment.resolve_device(P["device"]))
print(f"run folder: {run_dir.resolve()}")
print("found:", list(found) or "none")
if missing:
    display(Markdown("**Missing results** (their parts of the verdict are skipped): "
                     + ", ".join(f"`{m}`" for m in missing)))
checks = {nb: r["_meta"].get("snapshot_checksum") for nb, r in found.items()}
if len(set(checks.values())) > 1:
    display(Markdown(f"**Warning:** the results come from different snapshots: {checks}"))

# %% [markdown]
# ## 1 · Causes of the gap, ranked

# %%
slow, fast = P["gap_strategies"]
r03, r04 = found.get("03_data_vs_model_timing"), found.get("04_ddp_scaling")
causes = []
if r03 and slow in r03["stage_seconds"] and fast in r03["stage_seconds"]:
    causes = verdict.rank_gap_causes(r03, slow, fast, num_samples=P["num_samples"], r04=r04)
    cdf = pd.DataFrame(causes)
    display(cdf.style.format({"slow_s_per_epoch": "{:,.0f}", "fast_s_per_epoch": "{:,.0f}",
                              "difference_s": "{:,.0f}", "share": "{:.1%}"}))
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.barh(cdf.cause[::-1], cdf.share[::-1] * 100)
    ax.set_xlabel("share of the epoch-time difference (%)")
    plotting.label(ax, f"Why {REGISTRY[slow].label} is slower than {REGISTRY[fast].label}", device=DEV,
                   sizes=f"1 rank, batch {r03['batch_sizes'][slow]} vs {r03['batch_sizes'][fast]}, "
                         f"{P['num_samples']:,} samples")
    plt.show()
    if r04 and r04.get("gap_decomposition"):
        g = r04["gap_decomposition"]
        display(Markdown(
            f"Epoch-time ratio at {g['world_size']} rank(s): **{g['total']:.1f}x** = steps per epoch "
            f"x{g['steps_ratio']:.2f} (batch {g['batch_sizes'][slow]} vs {g['batch_sizes'][fast]}) x time per "
            f"step x{g['per_step_ratio']:.2f} x DDP overhead x{g['ddp_factor']:.2f} (notebook 04). "
            f"The brief observed about 40x on 4 GPUs."))
else:
    print(f"notebook 03 results with both {slow} and {fast} are needed for this section")

# %% [markdown]
# ## 2 · The brief's claims

# %%
spec_edges = None
if snapshot_spec_path(P["snapshot"]) is not None:
    spec = load_spec(P["snapshot"])
    spec_edges = sum(int(t["edges"]) for t in spec["edge_types"].values())
device_type = "cuda" if (env and env["_meta"]["environment"]["device"].startswith("cuda")) else "cpu"
claim_rows = verdict.claims(found, spec_edges, device_type)
cl = pd.DataFrame(claim_rows)
if len(cl):
    colors = {verdict.HELD: "background-color:#dfd", verdict.FAILED: "background-color:#fdd",
              verdict.UNTESTABLE: "background-color:#eee"}
    display(cl.style.map(lambda v: colors.get(v, ""), subset=["status"]))
    counts = cl.status.value_counts()
    print(", ".join(f"{k}: {v}" for k, v in counts.items()))
else:
    print("no results to check claims against")

# %% [markdown]
# ## 3 · Recommendation

# %%
rec = verdict.recommendation(found, tie_tolerance=P["verdict_tie_tolerance"])
if rec:
    ms = pd.Series({REGISTRY[k].label: v for k, v in rec["all_ms_per_sample"].items()}).sort_values()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    ax.barh(ms.index[::-1], ms.values[::-1], color=["C2" if k == rec["label"] else "C0" for k in ms.index[::-1]])
    ax.set_xscale("log")
    ax.set_xlabel("full training step, ms per sample (log)")
    plotting.label(ax, "Exact strategies, full step per sample (notebook 03)", device=DEV)
    plt.show()
    text = [f"### Use **{rec['label']}**",
            f"- Full training step: **{rec['ms_per_sample']:.2f} ms per sample** on {DEV}"
            + (f", **{rec['speedup_per_sample']:.1f}x** faster than {REGISTRY[rec['baseline']].label}"
               if rec.get("speedup_per_sample") else "") + " (notebook 03, same model, exact)."]
    if rec.get("full_size_ratio_vs_brief_form"):
        text.append(f"- Forward + backward, per sample, against replicated masks: "
                    f"{rec['full_size_ratio_vs_brief_form']:.1f}x vs the brief's gather-scatter form, "
                    f"{rec['full_size_ratio_vs_sparse_form']:.1f}x vs its sparse-product form (notebook 02).")
    mem = rec.get("memory") or {}
    for key, fit in (mem.get("largest_batch") or {}).items():
        if fit.get("largest_batch") is not None and fit["per_sample_bytes"] > 1e6:
            text.append(f"- Memory ({key}): {fit['per_sample_bytes'] / 1e9:.2f} GB per sample + "
                        f"{fit['fixed_bytes'] / 1e9:.2f} GB fixed: largest batch in "
                        f"{fit['budget_bytes'] / 1e9:.0f} GB = **{fit['largest_batch']}**.")
    if len(rec["tied_with_fastest"]) > 1:
        text.append(f"- Within {rec['tie_tolerance']:.0%} of the fastest ({REGISTRY[rec['fastest']].label}) "
                    f"at this scale: {', '.join(REGISTRY[s].label for s in rec['tied_with_fastest'])}; "
                    "the tie goes to the least memory per sample measured in notebook 02.")
    for name, per in rec["memory_per_sample_bytes"].items():
        text.append(f"- Measured memory per sample, {REGISTRY[name].label}: {per / 1e6:,.0f} MB.")
    text.append(f"- **What to change:** {rec['adoption']}")
    if rec["strategy"] != "node_mask_shared":
        text.append("- Note: on this run the node-mask shared graph was not chosen; notebook 02's "
                    "per-layer and full-size comparisons show where its advantage appears (it grows "
                    "with edges per node, batch size and device parallelism).")
    display(Markdown("\n".join(text)))
else:
    print("notebook 03 results are needed for a recommendation")

# %%
res = {
    "found": list(found), "missing": missing,
    "gap_causes": causes,
    "gap": ({"total_ratio": r04["gap_decomposition"]["total"], **r04["gap_decomposition"]}
            if r04 and r04.get("gap_decomposition") else None),
    "claims": claim_rows,
    "recommendation": rec,
}
top = causes[0]["cause"] if causes else "n/a"
headline = ((f"use {rec['label']} ({rec['ms_per_sample']:.1f} ms/sample"
             + (f", {rec['speedup_per_sample']:.1f}x vs replicated masks" if rec.get('speedup_per_sample') else "")
             + ")") if rec else "no recommendation (notebook 03 missing)") + \
           f"; top cause of the gap: {top}; claims held/failed/untestable: " + \
           "/".join(str(sum(c["status"] == s for c in claim_rows))
                    for s in (verdict.HELD, verdict.FAILED, verdict.UNTESTABLE))
path = results.write_results(run_dir, "05_verdict", res, P, headline=headline,
                             snapshot_checksum=next(iter(checks.values()), None))
display(Markdown(f"**Headline.** {headline}\n\nResults: `{path}`"))
