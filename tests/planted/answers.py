"""The answer each planted pipeline gets against the fast one, as a Markdown table (docs/figures.md,
"The answer names the code"): notebook 03's loop and profiles at the ci params on one intra-op
thread, then the verdict's causes.

    .venv/bin/python tests/planted/answers.py [NAME ...]
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "planted")]

from test_planted import CASES, _Timing, pair_in_child  # noqa: E402

from workbook_lib.studies import verdict as V  # noqa: E402


def main(names: list[str]) -> None:
    import tempfile

    torch.set_num_threads(1)
    print("| planted | gap (IQR, n) | first cause, share | the function the answer names | "
          "advice |")
    print("|---|---|---|---|---|")
    for slow in names or list(CASES):
        p, loops, profiles = pair_in_child(slow, tempfile.mkdtemp())
        gap = V.measure_gap(loops, slow, "fast", p["num_samples"])
        causes = V.rank_causes(_Timing(loops, profiles), slow, "fast", gap, "cpu")
        first = V.first_causes(causes)
        r = gap.ratio
        fig = f"{r.median:.3g}x ({r.iqr:.2g}, {r.n})" + (" contended" if gap.contended else "")
        if not first:
            print(f"| {slow} | {fig} | none | | |")
            continue
        c = first[0]
        site = (f"`{c.sites[0].function}` ({c.sites[0].file}:{c.sites[0].line}), "
                f"{c.sites[0].share:.0%} of its extra time, first in {c.sites[0].first_in} of "
                f"{c.sites[0].recorded} recorded steps" if c.sites else c.sites_note)
        print(f"| {slow} | {fig} | {c.cause} {c.share:.0%} | {site} | "
              f"{c.advice or 'none: ' + c.finding} |")


if __name__ == "__main__":
    main(sys.argv[1:])
