"""What every notebook does first: read its parameters, validate them, set the run up.

A notebook's ``parameters`` cell holds every schema key plus ``run_dir``; papermill's ``-p`` and
``-f`` (or the CLI) inject values after it. :func:`setup` validates the namespace with the same
schema as a params file and names any injected name that is not a key ("did you mean").
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..configs.validation import Params
from ..common.device import configure_cpu_allocator
from ..data.snapshots import CellGraph, load_snapshot
from ..exceptions import ParamsError
from ..paths import resolve_path
from ..report import plotting
from . import environment
from ..configs.schema import FIELDS, defaults
from ..configs.validation import check_against_graph, check_gap, coerce, suggest, validate

_IPYTHON_NAMES = {"In", "Out", "get_ipython", "exit", "quit", "open", "run_dir", "Dict", "List",
                  "Optional", "Union"}
_DONE = "_workbook_setup_done"


@dataclass
class NotebookContext:
    """A notebook's validated parameters and what was set up from them."""

    params: dict
    run_dir: Path
    device: torch.device
    device_label: str
    graph: CellGraph | None = None
    notes: list[str] = field(default_factory=list)
    threads: str = ""  # the compute threads set up, and why


def _injected_extras(namespace: dict) -> list[str]:
    return sorted(k for k, v in namespace.items()
                  if not k.startswith("_") and k not in FIELDS and k not in _IPYTHON_NAMES
                  and not isinstance(v, (types.ModuleType, type)) and not callable(v))


def _default_gap_not_given(raw: dict) -> None:
    """A parameters cell that reads ``gap_strategies`` holds it at its default, given or not:
    at that default, naming a built-in strategy the run does not compare (``-p strategies '[]'``
    with pipelines), it was not given, and the run's first two pipelines are its gap, as on the
    command line (found by a user trial: papermill refused such a run)."""
    def read(key):  # papermill's -p passes a list as its text, '[]' (a user trial)
        value = raw.get(key, defaults()[key])
        return coerce(FIELDS[key], value) if isinstance(value, str) else value

    gap = read("gap_strategies") if "gap_strategies" in raw else None
    if not isinstance(gap, (list, tuple)) or list(gap) != list(defaults()["gap_strategies"]):
        return
    strategies = read("strategies")
    if isinstance(strategies, (list, tuple)) and any(g not in strategies for g in gap) and \
            read("pipelines"):
        del raw["gap_strategies"]


def notebook_params(namespace: dict) -> tuple[dict, Path]:
    """Validated params and the resolved run folder from a notebook's namespace.

    Raises:
        ParamsError: a value is invalid, or (on a notebook's first setup) a name was injected
            that is no params key.
    """
    if not namespace.get(_DONE):
        extras = _injected_extras(namespace)
        if "params" in extras:
            raise ParamsError("notebook parameters: 'params' is not a key: pass each key with "
                              "papermill -p KEY VALUE, or a file with -f FILE.yaml",
                              key="params", value=namespace["params"])
        if extras:
            raise ParamsError("notebook parameters: unknown name(s) "
                              + ", ".join(f"'{k}'{suggest(k)}" for k in extras)
                              + "; `python -m workbook_lib params` lists every key",
                              key=extras[0], value=namespace[extras[0]])
    raw = {k: namespace[k] for k in FIELDS if k in namespace}
    _default_gap_not_given(raw)
    p = validate(raw, source="notebook parameters")
    run_dir = resolve_path(namespace.get("run_dir") or "runs/interactive")
    return p, run_dir


def load_checked_snapshot(params: Params) -> CellGraph:
    """The snapshot of validated params, loaded (the cache built if needed) and checked against
    the params that need the graph: the one check the CLI and every notebook run before any work.

    Raises:
        ParamsError: the snapshot does not load, its cache cannot be written, or a param does
            not fit the graph (e.g. ``exactness_genes`` above its gene count).
    """
    from ..exceptions import SnapshotError
    from ..configs.filesystem import snapshot_spec_path
    from ..configs.loading import show

    try:
        graph = load_snapshot(params.data)
    except SnapshotError as exc:
        raise ParamsError(f"'snapshot': {exc}", key="snapshot", value=params.snapshot) \
            from None
    except OSError as exc:
        if snapshot_spec_path(params.snapshot) is None:
            raise ParamsError(f"'snapshot' {show(params.snapshot)} cannot be read "
                              f"({exc.strerror or exc})", key="snapshot",
                              value=params.snapshot) from None
        raise ParamsError(f"'cache_dir' {resolve_path(params.cache_dir)}: the snapshot cache "
                          f"cannot be written ({exc.strerror or exc}: {exc.filename or ''})",
                          key="cache_dir", value=params.cache_dir) from None
    check_against_graph(params, graph.num_genes)
    return graph


def setup(namespace: dict, *, load_graph: bool = True, needs_device: bool = True,
          notebook: str | None = None) -> NotebookContext:
    """Validate the notebook's parameters, apply the CPU allocator setting, set the plotting style,
    resolve the device and load the snapshot; raises before any measurement when something is wrong.

    Args:
        needs_device: False for notebooks that measure nothing on the device (01, 05): they run
            on the CPU where ``device: cuda`` names a GPU this node lacks, instead of refusing.
        notebook: the notebook's name, for the checks only some notebooks need.
    """
    from ..common.files import use_run_temp
    from .kernel import check_notebook_clone

    check_notebook_clone()  # a notebook opened with another clone's kernel is refused
    p, run_dir = notebook_params(namespace)
    if notebook is not None:
        check_gap(p, [notebook])
    use_run_temp(run_dir, "kernel")  # temporary files in the run folder, not the system's
    namespace[_DONE] = True
    configure_cpu_allocator(p.cpu_allocator_cache)
    fit = environment.configure_threads(p)  # never more threads than the CPUs it may use
    plotting.setup()
    if not needs_device and p.device == "cuda" and not torch.cuda.is_available():
        device = torch.device("cpu")
    else:
        device = environment.resolve_device(p.device)
    graph = None
    if load_graph:
        graph = load_checked_snapshot(p)
    run_dir.mkdir(parents=True, exist_ok=True)
    return NotebookContext(p, run_dir, device, environment.device_label(device), graph,
                           threads=f"{fit['threads']} ({fit['why']})")
