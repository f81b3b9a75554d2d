"""What validating params checks on disk: the snapshot a key names exists (a spec in
``data_snapshots/`` or a saved file), what its spec allows (``scale``, gene count), and that the
cache folder can be written, each checked without creating anything.
"""
from __future__ import annotations

import os
from pathlib import Path

import yaml

from ..exceptions import ParamsError
from ..paths import SNAPSHOT_DIR, resolve_path
from .loading import show


def snapshot_spec_path(name: str) -> Path | None:
    """Path of the spec for a snapshot *name*, or None when ``snapshot`` is a file path."""
    if "/" in name or name.endswith((".pt", ".pth")):
        return None
    return SNAPSHOT_DIR / f"{name}.yaml"


def path_check(params: dict, source: str, key: str, check) -> None:
    """Run ``check(params, source)`` on the path under ``key``; an ``OSError`` from the file
    system (e.g. a name too long for it) becomes a one-line ParamsError naming the key."""
    try:
        check(params, source)
    except OSError as exc:
        raise ParamsError(f"{source}: '{key}' {show(params[key])} is not a usable path "
                          f"({exc.strerror or exc})", key=key, value=params[key]) from None


def snapshot_exists(params: dict, source: str) -> None:
    """``snapshot`` names a spec that exists, or a file that exists."""
    name = params["snapshot"]
    spec = snapshot_spec_path(name)
    if spec is not None:
        if not spec.is_file():
            known = sorted(p.stem for p in SNAPSHOT_DIR.glob("*.yaml"))
            raise ParamsError(
                f"{source}: 'snapshot' names no spec: {spec} does not exist (known specs: "
                f"{known}; or give a path to a saved HeteroData) (got {show(name)})",
                key="snapshot", value=name)
    else:
        path = resolve_path(name)
        if not path.is_file():
            raise ParamsError(f"{source}: 'snapshot' file {show(str(path))} does not exist",
                              key="snapshot", value=name)


def snapshot_spec(name: str) -> dict | None:
    """The spec of a snapshot name (None for a file path, or a name with no spec)."""
    spec = snapshot_spec_path(name)
    if spec is None or not spec.is_file():
        return None
    with open(spec, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def max_scale(spec: dict) -> float:
    """The largest ``scale`` at which every edge type of a spec still fits its genes (a
    directed simple graph on n genes holds at most n(n-1) edges)."""
    n = int(spec["num_genes"])
    return min(n * (n - 1) / int(info["edges"]) for info in spec["edge_types"].values())


def cache_dir_usable(params: dict, source: str) -> None:
    """``cache_dir`` must be a folder, or creatable, and writable (checked without creating
    anything)."""
    path = resolve_path(params["cache_dir"])
    if path.exists() and not path.is_dir():
        raise ParamsError(f"{source}: 'cache_dir' {path} is a file, not a folder",
                          key="cache_dir", value=params["cache_dir"])
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ParamsError(f"{source}: 'cache_dir' {path} cannot be written ({probe} is not a "
                          "writable folder)", key="cache_dir", value=params["cache_dir"])


