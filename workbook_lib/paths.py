"""Where things are: the repository root and how relative paths in params resolve.

Every relative path a user gives (a snapshot file, the cache folder, a run folder) resolves
against the repository root, whatever the current directory is, so a notebook run from
JupyterLab, papermill or the CLI writes to the same place. ``WORKBOOK_ROOT`` overrides the root
(for an installed copy of the library used outside its checkout).
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def repo_root() -> Path:
    """The repository root: ``WORKBOOK_ROOT`` if set, else the folder holding the package."""
    env = os.environ.get("WORKBOOK_ROOT")
    return Path(env).expanduser().resolve() if env else PACKAGE_DIR.parent


REPO_ROOT = repo_root()
PARAMS_DIR = REPO_ROOT / "params"
SNAPSHOT_DIR = REPO_ROOT / "data_snapshots"
NOTEBOOK_DIR = REPO_ROOT / "notebooks"


def resolve_path(path: str | Path) -> Path:
    """Absolute paths as they are; relative ones against the repository root."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else (REPO_ROOT / p)
