"""Figure conventions of every report: titles say what was measured, where, at which sizes and
how often; linear axes unless values span decades (then labelled log); plain tick labels, bytes
in MB or GB; figures shown as PNG with alt text (:func:`show`).
"""
from __future__ import annotations

import base64
import io

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import (FuncFormatter, LogLocator, MaxNLocator,  # noqa: E402,F401
                               NullFormatter, NullLocator)

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]


def setup() -> None:
    """Readable defaults for the reports."""
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    plt.rcParams.update({"figure.dpi": 100, "figure.autolayout": True,
                         "axes.formatter.useoffset": False,
                         "axes.formatter.limits": (-4, 6), "axes.titlesize": 10,
                         "legend.fontsize": 8})


def title(ax, what: str, *, device: str | None = None, sizes: str | None = None,
          repeats: str | None = None) -> None:
    """Title line plus a line of context: device | sizes | repeats."""
    ctx = " | ".join(s for s in (device, sizes, repeats) if s)
    ax.set_title(what + (f"\n{ctx}" if ctx else ""), fontsize=9)


def _plain(v: float, _pos=None) -> str:
    """0.5, 2, 300, 20k, 1.5M: plain numbers that stay short."""
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    if a >= 1 and float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:g}"


def log_subs(lo: float, hi: float) -> tuple[float, ...]:
    """Labelled ticks per decade of a log axis from ``lo`` to ``hi``: 1, 2, 5 within about two
    decades, only the powers of ten beyond (more would overprint)."""
    if lo <= 0 or hi <= lo:
        return (1.0,)
    decades = np.log10(hi / lo)
    return (1.0, 2.0, 5.0) if decades <= 1.5 else (1.0, 3.0) if decades <= 2.5 else (1.0,)


def plain_ticks(ax, axis: str = "both") -> None:
    """Plain tick labels (1, 10, 100; 0.5) on linear or log axes; on a log axis only as many
    labelled ticks as fit, and no minor-tick labels (``3x10^0`` beside plain labels)."""
    for name in ("x", "y") if axis == "both" else (axis,):
        a = ax.xaxis if name == "x" else ax.yaxis
        if a.get_scale() == "log":
            lo, hi = sorted(ax.get_xlim() if name == "x" else ax.get_ylim())
            a.set_major_locator(LogLocator(base=10, subs=log_subs(lo, hi)))
            a.set_minor_formatter(NullFormatter())
        a.set_major_formatter(FuncFormatter(_plain))


def value_axis(ax, values, quantity: str, note: str = "", axis: str = "x") -> None:
    """A bar chart's value axis: linear, unless the values span more than two decades, then
    log and the label says so (a log axis makes 45 against 71 look like a large gap); plain
    ticks either way. ``note`` follows the scale remark in the label."""
    vals = np.asarray(values, dtype=float)
    span = vals.max() / max(vals.min(), 1e-9)
    set_label = ax.set_xlabel if axis == "x" else ax.set_ylabel
    if span > 100:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
        set_label(f"{quantity} (log scale: values span {int(np.log10(span))} decades){note}")
    else:
        set_label(f"{quantity}{note}")
    plain_ticks(ax, axis)


def bytes_ticks(ax, axis: str = "y") -> str:
    """Tick labels in MB or GB (decimal, as the investigation did); returns the unit chosen."""
    a = ax.yaxis if axis == "y" else ax.xaxis
    lo, hi = (ax.get_ylim() if axis == "y" else ax.get_xlim())
    top = max(abs(lo), abs(hi))
    unit, div = ("GB", 1e9) if top >= 2e9 else (("MB", 1e6) if top >= 2e6 else ("kB", 1e3))
    a.set_major_formatter(FuncFormatter(lambda v, _p: _plain(round(v / div, 3))))
    return unit


def show(fig, alt: str) -> None:
    """Display ``fig`` as a PNG with alt text (kept in the HTML report), then close it."""
    from IPython.display import display

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    display({"image/png": data, "text/plain": alt}, raw=True,
            metadata={"image/png": {"alt": alt}})
