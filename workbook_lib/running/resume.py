"""``--resume``: which notebooks of a run folder an earlier run left complete, and which inputs
may be read without being rerun.

A notebook counts as complete only when its results JSON says so, every file it lists exists,
and its HTML exists; it is kept when its params (those a result depends on: where a run executes
is not compared), snapshot and inputs (the results of the notebooks it reads, by checksum) are
unchanged.
"""
from __future__ import annotations

from pathlib import Path

from ..configs.validation import Params
from ..catalog import inputs_of, requires_of
from ..configs.validation import results_relevant
from ..exceptions import ParamsError
from ..records import to_json
from .results import file_checksum, read_meta, results_path


# files other commands write into a run folder that a notebook reads when present:
# notebook -> ((key in its recorded inputs, file name), ...)
FILE_INPUTS = {"05_verdict": (("bench", "bench.json"),)}


def completeness(out_dir: Path, name: str, params: Params,
                 checksum: str | None = None) -> tuple[bool, str]:
    """(complete, why not) for ``--resume``: results complete with the same result-relevant
    params and snapshot, every file written present, the HTML present, inputs unchanged."""
    meta = read_meta(out_dir, name)
    if meta is None:
        return False, "no readable results"
    if not meta.complete:
        return False, "results marked incomplete"
    if results_relevant(meta.params) != to_json(results_relevant(params)):
        changed = sorted(k for k in set(meta.params) | set(params)
                         if meta.params.get(k) != to_json(params).get(k)
                         and k in results_relevant(params))
        return False, f"params changed ({', '.join(changed[:5])})"
    if checksum is not None and meta.snapshot_checksum not in (None, checksum):
        return False, "snapshot changed"
    missing = [f for f in meta.files if not (out_dir / f).exists()]
    if missing:
        return False, f"{len(missing)} file(s) it wrote are missing"
    if not (out_dir / f"{name}.html").is_file():
        return False, "no HTML report"
    for dep in inputs_of(name):
        path = results_path(out_dir, dep)
        if dep in meta.inputs:
            if not path.is_file() or file_checksum(path) != meta.inputs[dep]:
                return False, f"its input {dep} changed"
        elif dep in requires_of(name):
            return False, f"made without its input {dep}"
        elif path.is_file() and getattr(read_meta(out_dir, dep), "complete", False):
            # an optional input complete now, made after it (e.g. after a cancelled job)
            return False, f"made without its input {dep}, which is complete now"
    for dep, fname in FILE_INPUTS.get(name, ()):
        path = out_dir / fname
        if path.is_file() and meta.inputs.get(dep) != file_checksum(path):
            return False, f"{fname} in the run folder is not the one it quoted"
        if not path.is_file() and dep in meta.inputs:
            return False, f"{fname} it quoted is gone"
    return True, ""


def check_inputs_match(out: Path, names: list[str], params: Params) -> None:
    """Refuse to run a notebook on inputs made with other params: a notebook run now (e.g.
    ``--only 05 --set hidden=8``) whose input is not run now but present in the run folder,
    made with different result-relevant params, would label old measurements with new params.
    """
    now = to_json(results_relevant(params))
    for name in names:
        for dep in inputs_of(name):
            if dep in names:
                continue
            meta = read_meta(out, dep)
            if meta is None:
                continue
            made = results_relevant(meta.params)
            changed = sorted(k for k in set(made) | set(now) if made.get(k) != now.get(k))
            if changed:
                shown = ", ".join(f"{k}={made.get(k)!r} there, {now.get(k)!r} now"
                                  for k in changed[:3])
                raise ParamsError(
                    f"{name} reads {dep}, made in {out} with other params ({shown}"
                    f"{', ...' if len(changed) > 3 else ''}); run {dep} too (add it to --only, "
                    "or drop --only) or use the params it was made with", key=changed[0],
                    value=now.get(changed[0]))
