"""Results files: one JSON per notebook, beside its HTML, with the environment recorded."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..running import environment

SCHEMA_VERSION = 1


def to_jsonable(obj: Any) -> Any:
    """Plain-JSON copy of ``obj``: numpy/torch scalars and arrays, paths, NaN/inf -> null."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        return to_jsonable(obj.item())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def results_path(run_dir: str | Path, notebook: str) -> Path:
    return Path(run_dir) / f"{notebook}.json"


def write_results(run_dir: str | Path, notebook: str, results: dict, params: dict, *,
                  headline: str, snapshot_checksum: str | None = None) -> Path:
    """Write ``<run_dir>/<notebook>.json``: the named results at top level plus ``_meta``.

    ``_meta`` holds the headline (shown in index.html), the params as validated, the snapshot
    checksum and the environment, and ``complete: true`` (what ``run --resume`` looks for).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    doc = dict(to_jsonable(results))
    doc["_meta"] = to_jsonable({
        "schema_version": SCHEMA_VERSION,
        "notebook": notebook,
        "headline": headline,
        "complete": True,
        "snapshot_checksum": snapshot_checksum,
        "params": params,
        "environment": environment.collect(params),
    })
    path = results_path(run_dir, notebook)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, allow_nan=False))
    tmp.replace(path)
    return path


def read_results(run_dir: str | Path, notebook: str) -> dict | None:
    """The results of one notebook in a run folder, or None if absent or unreadable."""
    path = results_path(run_dir, notebook)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
