"""Figure helpers: every figure says device, sizes and repeat count."""
from __future__ import annotations

import matplotlib.pyplot as plt


def setup() -> None:
    """Consistent, readable defaults for the reports."""
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    plt.rcParams["figure.dpi"] = 100
    plt.rcParams["figure.autolayout"] = True


def label(ax, title: str, *, device: str | None = None, sizes: str | None = None,
          repeats: int | None = None) -> None:
    """Title plus a second line with the measurement context."""
    second = " | ".join(s for s in (sizes, f"{repeats} repeats (median, IQR)" if repeats else None)
                        if s)
    lines = [title] + [s for s in (device, second) if s]
    ax.set_title("\n".join(lines), fontsize=9)
