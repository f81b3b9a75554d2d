"""The Jupyter kernel of this clone: registered inside its own environment, never per user.

``make venv`` registers ``gnn-workbook`` in the virtual environment (ipykernel's
``--sys-prefix``), running that environment's Python and so this clone's ``workbook_lib``;
jupyter_core prefers it over a per-user kernel of the same name, so two clones each run their
own code. :func:`install` removes a per-user kernel this clone left, :func:`check` says where the
name resolves, ``make clean`` calls :func:`remove`, and :func:`check_notebook_clone` refuses a
notebook opened with another clone's kernel.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from ..exceptions import WorkbookError
from ..paths import REPO_ROOT

KERNEL_NAME = "gnn-workbook"
KERNEL_DISPLAY = "GNN perturbation workbook"


def _same_python(argv0: str, python: str) -> bool:
    try:
        return Path(argv0).resolve() == Path(python).resolve() or \
            os.path.samefile(argv0, python)
    except OSError:
        return False


def user_kernel_dir(name: str = KERNEL_NAME) -> Path:
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "kernels" / name


def _legacy_user_kernel(python: str, name: str) -> Path | None:
    """The per-user kernel of this name when it runs ``python`` (left by an older Makefile)."""
    d = user_kernel_dir(name)
    try:
        argv = json.loads((d / "kernel.json").read_text())["argv"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return d if argv and _same_python(argv[0], python) else None


def install(prefix: str | Path | None = None, name: str = KERNEL_NAME) -> Path:
    """Register the kernel in ``prefix`` (default: this environment), running this Python;
    remove a per-user kernel of the same name that runs this Python. Returns its folder."""
    from ipykernel.kernelspec import install as ipy_install

    prefix = str(prefix or sys.prefix)
    path = Path(ipy_install(kernel_name=name, display_name=KERNEL_DISPLAY, prefix=prefix))
    legacy = _legacy_user_kernel(sys.executable, name)
    if legacy is not None:
        shutil.rmtree(legacy, ignore_errors=True)
    return path


def remove(prefix: str | Path | None = None, name: str = KERNEL_NAME) -> list[Path]:
    """Remove what :func:`install` registered (and a per-user one running this Python)."""
    removed = []
    d = Path(prefix or sys.prefix) / "share" / "jupyter" / "kernels" / name
    if d.is_dir():
        shutil.rmtree(d)
        removed.append(d)
    legacy = _legacy_user_kernel(sys.executable, name)
    if legacy is not None:
        shutil.rmtree(legacy, ignore_errors=True)
        removed.append(legacy)
    return removed


def check(name: str = KERNEL_NAME) -> tuple[bool, str]:
    """(runs this clone's code, where the kernel name resolves) for Jupyter started here."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        return False, f"no kernel named {name} (run `make kernel`)"
    argv0 = spec.argv[0] if spec.argv else ""
    ok = _same_python(argv0, sys.executable)
    return ok, f"{name} runs {argv0} ({spec.resource_dir})"


def check_notebook_clone(cwd: str | Path | None = None) -> None:
    """Refuse to run a clone's notebook with another clone's library: the kernel started in the
    ``notebooks`` folder of a clone other than the one this ``workbook_lib`` comes from.

    Raises:
        WorkbookError: naming both clones and the fix.
    """
    here = Path(cwd or os.getcwd()).resolve()
    if here.name != "notebooks" or not (here.parent / "workbook_lib" / "__init__.py").is_file():
        return
    if here.parent == REPO_ROOT.resolve() or os.environ.get("WORKBOOK_ROOT"):
        return
    raise WorkbookError(
        f"this notebook belongs to the clone in {here.parent}, but its kernel runs the "
        f"workbook_lib of {REPO_ROOT} (another clone's kernel): start JupyterLab from this "
        f"clone ({here.parent}/.venv/bin/jupyter lab) after `make venv`, which registers its own "
        f"'{KERNEL_NAME}' kernel")
