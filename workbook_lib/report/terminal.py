"""What the commands without a page of their own print on the terminal: the notebooks (``list``),
params (``params FILE``), a run's outcome per notebook (``run``), the scripts ``slurm`` wrote.
The commands with a page print its summary from its view (``trace_view``, ``stability_view``,
``equality_view``)."""
from __future__ import annotations

from pathlib import Path

from ..configs.validation import Params
from ..catalog import BY_NAME
from ..common.text import text_table


def notebook_lines(names: list[str]) -> list[str]:
    """One line per notebook: its name and title."""
    return text_table([[n, BY_NAME[n].title if n in BY_NAME else ""] for n in names])


def params_lines(params: Params) -> list[str]:
    """One ``key: value`` line per param."""
    return [f"{k}: {v!r}" for k, v in params.items()]


def run_lines(outcomes, out_dir: str | Path) -> list[str]:
    """One line per notebook of a run (status, name, seconds or ``kept``), 05's answer in one
    line when it wrote one, then the index; from the run's ``outcomes`` and folder ``out_dir``.
    """
    from ..running.results import read_meta

    lines = text_table([[o.status, o.name, "kept" if o.status == "kept" else f"{o.seconds:.1f} s"]
                        for o in outcomes], "<<>")
    verdict = read_meta(out_dir, "05_verdict")  # the answer, as the index leads with it
    if verdict is not None and verdict.complete and verdict.headline:
        lines.append(f"Answer: {verdict.headline}")
    return lines + [f"Reports: {Path(out_dir).resolve() / 'index.html'}"]


def slurm_lines(paths: dict[str, Path]) -> list[str]:
    """Each script ``slurm`` wrote, then how to submit them."""
    lines = text_table([[kind, path] for kind, path in paths.items()])
    submit = (f"bash {paths['submit']}" if "submit" in paths else f"sbatch {paths['sbatch']}")
    return lines + [f"Submit with: {submit}"]
