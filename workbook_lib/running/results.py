"""Results files: one JSON per notebook in the run folder, with what made it recorded.

``<run_dir>/<notebook>.json`` holds the notebook's typed result (a
:class:`~workbook_lib.records.Record` of :mod:`workbook_lib.results`) and ``_meta``: the
headline, the validated params, the snapshot checksum, the environment, the files written, the
checksums of the results read, ``complete: true``. :func:`load_result` gives the typed result
back. Writes are atomic (:mod:`workbook_lib.common.files`), in the umask's mode.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..configs.validation import Params
from ..common.files import atomic_write_text
from ..records import Record, to_json
from ..results.meta import SCHEMA_VERSION, Meta  # noqa: F401
from ..results.adoption import AdoptionResult
from ..results.ddp import DDPResult
from ..results.inventory import InventoryResult
from ..results.mask_cost import MaskCostResult
from ..results.timing import TimingResult
from ..results.verdict import VerdictResult


# notebook -> the type of its typed result (workbook_lib.results: one module per notebook)
RESULT_TYPES: dict[str, type[Record]] = {
    "01_graph_inventory": InventoryResult,
    "02_mask_cost_model": MaskCostResult,
    "03_data_vs_model_timing": TimingResult,
    "04_ddp_scaling": DDPResult,
    "05_verdict": VerdictResult,
    "06_adopt_fix": AdoptionResult,
}


def results_path(run_dir: str | Path, notebook: str) -> Path:
    return Path(run_dir) / f"{notebook}.json"


def file_checksum(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_results(run_dir: str | Path, notebook: str, result: Record | dict, params: Params, *,
                  headline: str, snapshot_checksum: str | None = None,
                  files: list[str] | None = None, inputs: dict[str, str] | None = None) -> Path:
    """Write ``<run_dir>/<notebook>.json`` (the result's fields plus ``_meta``), atomically."""
    from . import environment

    run_dir = Path(run_dir)
    doc = dict(to_json(result))
    meta = Meta(notebook=notebook, headline=headline, snapshot_checksum=snapshot_checksum,
                params=params, environment=environment.collect(params),
                files=sorted(files or []), inputs=dict(inputs or {}))
    doc["_meta"] = meta.to_json()
    path = results_path(run_dir, notebook)
    atomic_write_text(path, json.dumps(doc, indent=1, allow_nan=False))
    return path


def read_results(run_dir: str | Path, notebook: str) -> dict | None:
    """The raw results document of a notebook, or None if absent or unreadable."""
    path = results_path(run_dir, notebook)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None


def read_meta(run_dir: str | Path, notebook: str) -> Meta | None:
    doc = read_results(run_dir, notebook)
    if not doc or "_meta" not in doc:
        return None
    try:
        return Meta.from_json(doc["_meta"])
    except (TypeError, KeyError, ValueError):
        return None


def result_type(notebook: str) -> type[Record]:
    return RESULT_TYPES[notebook]


def params_differ(made: dict, params: Params) -> list[str]:
    """The result-relevant keys whose values differ between the params a result was made with
    (as its ``_meta`` records them) and ``params``."""
    from ..configs.validation import results_relevant

    made, now = results_relevant(made), to_json(results_relevant(params))
    return sorted(k for k in set(made) | set(now) if made.get(k) != now.get(k))


def load_result(run_dir: str | Path, notebook: str,
                params: Params | None = None) -> Record | None:
    """The typed result of a notebook in a run folder (None if absent, unreadable or written by
    an older schema; with ``params``, also None when it was made with other result-relevant
    params: a notebook never quotes measurements of another configuration as its own, e.g.
    when a run with other params writes that input into the folder while it runs)."""
    doc = read_results(run_dir, notebook)
    if not doc:
        return None
    meta = doc.get("_meta", {})
    if meta.get("schema_version") != SCHEMA_VERSION:
        return None
    if params is not None and params_differ(meta.get("params", {}), params):
        return None
    body = {k: v for k, v in doc.items() if k != "_meta"}
    try:
        return result_type(notebook).from_json(body)
    except (TypeError, KeyError, ValueError):
        return None


def checksums(run_dir: str | Path, notebooks: list[str] | tuple[str, ...]) -> dict[str, str]:
    """The checksums of those notebooks' results files present in ``run_dir`` (what a
    notebook that read them records, so that ``--resume`` reruns it when one changes)."""
    return {nb: file_checksum(results_path(run_dir, nb)) for nb in notebooks
            if results_path(run_dir, nb).is_file()}
