"""What notebook 01's reader sees."""
from __future__ import annotations

import numpy as np
from IPython.display import Markdown

from ..results.inventory import REPRESENTATION_LABELS
from ..results.inventory import InventoryResult
from . import plotting
from ..common.text import one_line
from .tables import saved  # noqa: F401 - its notebook calls view.saved
from .tables import HEADLINE_MAX, fmt_bytes, fmt_pct, table


def _sizes(r: InventoryResult) -> str:
    return f"{r.graph_name}, scale {r.scale:g}, {r.num_genes:,} genes, {r.total_edges:,} edges"


def summary(r: InventoryResult) -> Markdown:
    ign = f" Ignored node/edge types: {', '.join(r.ignored_types)}." if r.ignored_types else ""
    return Markdown(f"**{r.graph_name}** ({r.source}, scale {r.scale:g}): {r.num_genes:,} genes, "
                    f"{len(r.edge_types)} edge types, {r.total_edges:,} directed edges.{ign}")


def edge_type_table(r: InventoryResult):
    rows = [{"edge type": t.name, "nodes touched": f"{t.nodes:,}", "edges": f"{t.edges:,}",
             "edge_index (int64)": fmt_bytes(t.bytes_int64),
             "edge_index (int32)": fmt_bytes(t.bytes_int32)} for t in r.edge_types]
    rows.append({"edge type": "total", "nodes touched": "", "edges": f"{r.total_edges:,}",
                 "edge_index (int64)": fmt_bytes(sum(t.bytes_int64 for t in r.edge_types)),
                 "edge_index (int32)": fmt_bytes(sum(t.bytes_int32 for t in r.edge_types))})
    return table(rows)


def edge_type_plot(r: InventoryResult) -> None:
    fig, ax = plotting.plt.subplots(figsize=(9, 4))
    names = [t.name for t in r.edge_types]
    x = np.arange(len(names))
    ax.bar(x, [t.edges for t in r.edge_types], color=plotting.PALETTE[0])
    ax.set_xticks(x, names, rotation=35, ha="right")
    ax.set_ylabel("directed edges")
    plotting.plain_ticks(ax, "y")
    plotting.title(ax, "Edges per edge type", sizes=_sizes(r))
    plotting.show(fig, "Bar chart of the number of directed edges of each edge type.")


def locality_text(r: InventoryResult) -> Markdown:
    f = r.removed_edge_fraction
    h = r.hop_coverage
    return Markdown(
        f"Over {r.num_perturbations} sampled perturbations (k = {r.perturbation_k}), a sample "
        f"removes a median **{fmt_pct(f.median, 2)}** of all edges (IQR {fmt_pct(f.iqr, 2)}, "
        f"max {fmt_pct(max(f.samples), 2)}), yet its deleted genes reach a median "
        f"{fmt_pct(h[1].median, 0)} of all genes within 1 hop, {fmt_pct(h[2].median, 0)} within 2 "
        f"and {fmt_pct(h[3].median, 0)} within 3 (all edge types, both directions). "
        + ("A deletion touches few edges, but after two message-passing layers it can change "
           "most embeddings (more than half of the genes are within 2 hops)."
           if h[2].median > 0.5 else
           f"Within 2 hops, as far as two message-passing layers reach, lie "
           f"{fmt_pct(h[2].median, 0)} of the genes: at this graph's size a deletion's change "
           "reaches fewer than half of them in two layers."))


def locality_plot(r: InventoryResult) -> None:
    fig, axes = plotting.plt.subplots(1, 2, figsize=(11, 4))
    axes[0].hist(np.array(r.removed_edge_fraction.samples) * 100, bins=30,
                 color=plotting.PALETTE[0])
    axes[0].set(xlabel="edges removed per sample (% of all edges)", ylabel="samples")
    plotting.title(axes[0], "Removed-edge fraction",
                   sizes=f"{r.num_perturbations} samples, k={r.perturbation_k}")
    hops = sorted(r.hop_coverage)
    axes[1].boxplot([np.array(r.hop_coverage[h].samples) * 100 for h in hops],
                    tick_labels=[f"{h} hop{'s' if h > 1 else ''}" for h in hops])
    axes[1].set_ylabel("genes within reach (% of all genes)")
    axes[1].set_ylim(0, 100)
    plotting.title(axes[1], "Genes within reach of the deleted genes",
                   sizes=f"{r.num_perturbations} samples")
    plotting.show(fig, "Left: histogram of the percentage of edges each sampled perturbation "
                       "removes. Right: box plots of the percentage of genes within 1, 2 and 3 "
                       "hops of the deleted genes.")


def footprint_table(r: InventoryResult):
    """Per layer and edge type: the genes and edges a perturbation changes (the measured basis
    of delta propagation's per-sample cost)."""
    def f(st):
        return f"{fmt_pct(st.median, 1)} (IQR {fmt_pct(st.iqr, 1)})"
    rows = [{"layer": row.layer, "edge type": row.edge_type,
             "genes whose aggregation changes" if row.edge_type != "all" else "genes changed":
             f(row.genes), "edges whose message changes": f(row.edges)}
            for row in r.footprint]
    for row in rows:  # one column for both kinds of gene fraction
        key = "genes whose aggregation changes"
        if key not in row:
            row[key] = row.pop("genes changed") + " (output)"
        row["edges whose message changes"] = row.pop("edges whose message changes")
    return table(rows, caption=f"Per sample over {r.num_perturbations} perturbations "
                               f"(k = {r.perturbation_k}), median and IQR. Layer 1's changed "
                               "messages are the edges leaving the deleted genes (the "
                               "incremental first layer's work); layer 2's are the edges leaving "
                               "the genes layer 1 changed (the delta layer's work per sample); "
                               "'all' rows: genes whose layer output changed, and every type's "
                               "changed messages over all edges.")


def footprint_text(r: InventoryResult) -> Markdown:
    rows = {(x.layer, x.edge_type): x for x in r.footprint}
    one, two = rows.get((1, "all")), rows.get((2, "all"))
    if one is None:
        return Markdown("No footprint computed.")
    s = (f"Layer 1 changes a median **{fmt_pct(one.genes.median, 1)}** of the genes (the "
         f"deleted genes and their out-neighbours) through {fmt_pct(one.edges.median, 2)} of the "
         "edges.")
    if two is not None:
        s += (f" Layer 2's input therefore differs on those genes only, and the edges leaving "
              f"them are **{fmt_pct(two.edges.median, 1)}** of all edges: the per-sample work "
              f"of a delta-propagated second layer, against 100% for a full product. By layer 2's "
              f"output {fmt_pct(two.genes.median, 0)} of the genes have changed"
              + (", so later layers need the full product." if two.genes.median > 0.5 else
                 ": fewer than half."))
    return Markdown(s)


def bytes_table(r: InventoryResult, num_samples: int):
    rows = []
    for rep, per in r.bytes_per_sample.items():
        row = {"representation": REPRESENTATION_LABELS[rep], "per sample": fmt_bytes(per)}
        for b, v in r.bytes_per_batch[rep].items():
            row[f"batch {b}"] = fmt_bytes(v)
        row[f"dataset ({num_samples:,} samples)"] = fmt_bytes(r.dataset_bytes[rep])
        rows.append(row)
    return table(rows, caption=f"Incidence cache (prepared once, not per sample): "
                               f"{fmt_bytes(r.incidence_cache_bytes)} (int64).")


def bytes_plot(r: InventoryResult) -> None:
    fig, ax = plotting.plt.subplots(figsize=(8, 4.5))
    reps = list(r.bytes_per_sample)
    per = np.array([r.bytes_per_sample[k] for k in reps])
    ax.barh(range(len(reps)), per, color=plotting.PALETTE[:len(reps)])
    ax.set_yticks(range(len(reps)), [REPRESENTATION_LABELS[k] for k in reps], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("bytes per sample (log scale: the representations span "
                  f"{int(np.log10(per.max() / per.min()))} decades)")
    plotting.plain_ticks(ax, "x")
    for i, v in enumerate(per):
        ax.text(v, i, " " + fmt_bytes(v), va="center", fontsize=8)
    plotting.title(ax, "What one sample carries, by representation", sizes=_sizes(r))
    plotting.show(fig, "Horizontal bars on a log axis: bytes per sample of perturbation "
                       "indices, removed-edge indices, boolean edge masks and a replicated "
                       "edge_index.")


def real_size_table(r: InventoryResult):
    rs = r.real_size
    if rs is None:
        return Markdown("A user's graph: no spec, so no real-size arithmetic.")
    rows = [
        {"quantity": "masks per sample (1 byte per edge)", "real size": fmt_bytes(rs.mask_bytes_per_sample)},
        {"quantity": "masks per batch of 28", "real size": fmt_bytes(rs.mask_bytes_per_batch_28)},
        {"quantity": f"masks for the dataset ({rs.num_samples:,} samples)",
         "real size": fmt_bytes(rs.dataset_mask_bytes)},
        {"quantity": "incidence cache, int64 (as this workbook builds it)",
         "real size": fmt_bytes(rs.incidence_cache_bytes_int64)},
        {"quantity": "incidence cache, int32", "real size": fmt_bytes(rs.incidence_cache_bytes_int32)},
    ]
    return table(rows, caption=f"Arithmetic at the real edge count ({rs.total_edges:,}), whatever "
                               "this run's scale." + (
                                   " Notebook 05 checks the investigation's size claims against "
                                   "these." if r.builtin else " A run of your own pipelines only "
                                   "judges no size claim (05 judges them where the built-in "
                                   "strategies run)."))


def _headline(r: InventoryResult) -> str:
    masks = f"masks {fmt_bytes(r.bytes_per_sample['edge_masks'])}/sample"
    if r.builtin:  # the investigation's batch; a user's own pipelines have their own
        b = 28 if 28 in r.bytes_per_batch["edge_masks"] else max(r.bytes_per_batch["edge_masks"])
        masks += f", {fmt_bytes(r.bytes_per_batch['edge_masks'][b])} per batch of {b}"
    else:  # a representation's cost, which a user's pipeline may not use (found by a trial)
        masks = ("boolean edge masks would take "
                 f"{fmt_bytes(r.bytes_per_sample['edge_masks'])}/sample")
    whose = "" if r.builtin else "the snapshot's "  # a user's pipeline may build its own graph
    return (f"{whose}{r.total_edges:,} edges over {r.num_genes:,} genes; {masks}; a perturbation "
            f"removes {fmt_pct(r.removed_edge_fraction.median, 2)} of edges but reaches "
            f"{fmt_pct(r.hop_coverage[2].median, 0)} of genes within 2 hops")


def headline(r: InventoryResult) -> str:
    """One short sentence for the index (see common.text.one_line)."""
    return one_line(_headline(r), HEADLINE_MAX)
