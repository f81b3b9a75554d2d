"""Whether a pipeline computes the same as another, as ``equal`` found: kept in the cache folder,
keyed by the two specs' targets and their source files' contents (editing either retires it),
with the other files of the user's code it ran with (editing one retires it too), and read
back by the verdict, which calls a pipeline "proven equal" only on such a proof.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
import time
from pathlib import Path

from ...common.files import atomic_write_text
from ...configs.specs import parse_specs, spec_file
from ...paths import resolve_path
from ...results.adoption import Proof


# what check made a kept outcome: a change to how `equal` decides retires the outcomes kept
# before it (2: both pipelines built with float64 as the default dtype)
CHECK = 2


def _source(target: str) -> Path | None:
    module = target.rsplit(":", 1)[0]
    if module.endswith(".py"):
        return spec_file(module)
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(found.origin) if found is not None and found.origin else None


def _key(slow: str, fast: str) -> tuple[str, list[str]] | None:
    files = [_source(t) for t in (slow, fast)]
    if None in files:
        return None
    h = hashlib.sha256(f"{slow}\n{fast}\n".encode())
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:24], [str(f) for f in files]


def _path(cache_dir: str, key: str) -> Path:
    return resolve_path(cache_dir) / "equal" / f"{key}.json"


def targets(pipelines: list[str], *names: str) -> list[str] | None:
    """The spec targets of the user pipelines ``names`` among the run's ``pipelines`` (the params
    key; None when one is not a user's)."""
    specs = {s.name: s.target for s in parse_specs(list(pipelines))}
    out = [specs.get(n) for n in names]
    return None if None in out else out


def _sha(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def own_files(skip: list[str]) -> dict[str, str]:
    """``{file: sha256}`` of every file of the user's own code loaded in this process (what a
    trace would call the pipeline's: not the standard library, site-packages or this package),
    but ``skip`` (the two specs' files, which key the proof). It may hold more than the
    pipelines import: a proof is then retired more often, never kept wrongly."""
    from ..timing.own_code import OwnCode

    own, out = OwnCode(), {}
    for mod in list(sys.modules.values()):
        f = getattr(mod, "__file__", None)
        if f and f.endswith(".py") and str(Path(f).resolve()) not in skip and own(f) == "own":
            sha = _sha(f)
            if sha is not None:
                out[str(Path(f).resolve())] = sha
    return out


def save(cache_dir: str, slow: str, fast: str, equal: bool, summary: str) -> Path | None:
    """Keep an ``equal`` outcome for the pair of targets (None: a source was not found), with
    the other files of the user's code it ran with (:func:`own_files`)."""
    k = _key(slow, fast)
    if k is None:
        return None
    proof = Proof(slow, fast, equal, summary, time.strftime("%Y-%m-%d %H:%M"), k[1],
                  own_files([str(Path(f).resolve()) for f in k[1]]))
    path = _path(cache_dir, k[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({**proof.to_json(), "check": CHECK}, indent=1))
    return path


def load(cache_dir: str, slow: str, fast: str) -> Proof | None:
    """The kept outcome for the pair of targets as their sources are now, or None."""
    k = _key(slow, fast)
    if k is None:
        return None
    try:
        raw = json.loads(_path(cache_dir, k[0]).read_text())
        proof = Proof.from_json(raw)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if "depends" not in raw or any(_sha(f) != sha for f, sha in proof.depends.items()):
        return None  # kept before helpers were recorded (a review), or a helper changed: retired
    if raw.get("check") != CHECK:  # made by an earlier check (a review: one that built in
        return None  # float32 called a buffer-keeping rewrite DIFFERENT): retired
    return proof
