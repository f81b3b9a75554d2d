"""One typed schema for every params file and every papermill-injected parameter set.

A params file (YAML) and the ``params`` dict papermill injects into a notebook go through the
same :func:`validate`: unknown keys are an error listing the valid keys, a wrong type or an
impossible value is an error naming the key and the value. Missing keys take the schema default.
Validation never touches the graph; :func:`check_against_graph` does the checks that need it
(``perturbation_k`` larger than the gene count) right after the snapshot is loaded.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from ..exceptions import ParamsError

from ..paths import PARAMS_DIR, REPO_ROOT

DEVICES = ("cpu", "cuda", "auto")
AGGRS = ("sum", "mean")
BACKENDS = ("auto", "gloo", "nccl")
from ..catalog import STRATEGY_NAMES  # noqa: E402


@dataclass(frozen=True)
class Field:
    """One params key: its type check, default and documentation."""

    name: str
    kind: str  # int, float, bool, str, list_int, list_str, k, optional_str, optional_float
    default: Any
    doc: str
    check: Callable[[Any], str | None] | None = None  # returns a problem description or None
    choices: tuple | None = None


def _positive(v):
    return None if v > 0 else "must be positive"


def _non_negative(v):
    return None if v >= 0 else "must be >= 0"


def _non_empty_positive_list(v):
    if len(v) == 0:
        return "must be a non-empty list"
    if any(x <= 0 for x in v):
        return "every entry must be positive"
    return None


def _strategies(v):
    if len(v) == 0:
        return "must be a non-empty list"
    bad = [s for s in v if s not in STRATEGY_NAMES]
    if bad:
        return f"unknown strategies {bad}; valid: {list(STRATEGY_NAMES)}"
    return None


def _fraction(v):
    return None if 0.0 < v <= 1.0 else "must be in (0, 1]"


SCHEMA: tuple[Field, ...] = (
    # --- snapshot and sampling (issue: foundation) ---
    Field("snapshot", "str", "string12",
          "spec name in data_snapshots/ (e.g. 'string12') or path to a torch.save'd HeteroData"),
    Field("scale", "float", 0.1, "edge-count multiplier, 1.0 = real size", _positive),
    Field("seed", "int", 0, "seed of graph generation and perturbation sampling", _non_negative),
    Field("device", "str", "auto", "cpu, cuda or auto (cuda if available)", choices=DEVICES),
    Field("batch_sizes", "list_int", [1, 8, 28, 64], "batch sizes for per-batch figures",
          _non_empty_positive_list),
    Field("perturbation_k", "k", 3,
          "genes deleted per sample: an int, or a mapping k -> probability"),
    Field("num_samples", "int", 332313, "dataset size for storage and epoch projections",
          _positive),
    Field("num_perturbations", "int", 200,
          "perturbations sampled for removed-edge and hop statistics", _positive),
    Field("cache_dir", "str", "data_snapshots/cache",
          "where generated graphs are cached (relative to the repository root)"),
    # --- model and measurement (strategy issue onward) ---
    Field("hidden", "int", 64, "hidden size H", _positive),
    Field("layers", "int", 3, "message-passing layers", _positive),
    Field("aggr", "str", "sum", "aggregation: sum or mean", choices=AGGRS),
    Field("cpu_allocator_cache", "bool", True,
          "on Linux/glibc CPUs keep freed memory in the heap (mallopt) instead of returning "
          "every large tensor to the OS, as PyTorch's CUDA caching allocator does on GPUs; "
          "without it large-batch CPU timings are dominated by page faults"),
    Field("warmup", "int", 2, "untimed warm-up repetitions before each measurement",
          _non_negative),
    Field("repeats", "int", 5, "timed repetitions per measurement (median and IQR reported)",
          _positive),
    Field("strategies", "list_str", list(STRATEGY_NAMES), "strategies to compare", _strategies),
    Field("sweep_edges", "list_int", [20000, 50000, 100000, 200000],
          "edge counts E of the cost-model sweeps", _non_empty_positive_list),
    Field("sweep_hidden", "list_int", [16, 32, 64], "hidden sizes H of the cost-model sweeps",
          _non_empty_positive_list),
    Field("sweep_p", "list_float", [0.001, 0.01, 0.1, 0.3, 0.6],
          "removed-edge fractions p of the cost-model sweeps"),
    Field("layer_batch_sizes", "list_int", [1, 2, 4, 8],
          "batch sizes of the per-layer strategy comparison", _non_empty_positive_list),
    Field("full_size_benchmark", "bool", False,
          "run notebook 02's benchmark at the real spec (scale 1.0) instead of `scale`"),
    Field("full_size_batch", "int", 28, "batch size of the full-size benchmark", _positive),
    Field("replicated_max_batch", "int", 4,
          "cap on strategy 2's batch in the full-size benchmark (its cost is linear in B, so "
          "it is compared per sample)", _positive),
    Field("exactness_genes", "int", 400,
          "genes of the induced subgraph on which notebook 02 re-checks exactness", _positive),
    Field("memory_batch_sizes", "list_int", [1, 2, 4],
          "batch sizes of notebook 02's peak-memory sweep", _non_empty_positive_list),
    Field("memory_full_size", "bool", True,
          "also measure the replicated strategy's memory at the real size with the brief's "
          "model (H=64, 3 layers) to project the largest batch in memory_budget_gb"),
    Field("memory_budget_gb", "float", 80.0,
          "device memory budget for the largest-batch-that-fits projection", _positive),
    # --- training loop (notebook 03) ---
    Field("batch_size_lazy", "int", 28, "batch size of Lazy-style (replicated) runs", _positive),
    Field("batch_size_dango", "int", 64, "batch size of DANGO-style runs", _positive),
    Field("loop_steps", "int", 6, "timed training steps per strategy and mode", _positive),
    Field("num_workers", "int", 0, "DataLoader worker processes", _non_negative),
    Field("pin_memory", "bool", False, "DataLoader pin_memory (only meaningful with CUDA)"),
    Field("persistent_workers", "bool", False, "DataLoader persistent_workers"),
    Field("dual_forward", "bool", True, "Lazy model: wildtype + perturbed pass"),
    Field("profile_wait", "int", 1, "torch.profiler schedule: wait steps", _non_negative),
    Field("profile_warmup", "int", 1, "torch.profiler schedule: warm-up steps", _non_negative),
    Field("profile_active", "int", 3, "torch.profiler schedule: active steps", _positive),
    # --- DDP (notebook 04) ---
    Field("world_sizes", "list_int", [1, 2], "DDP world sizes to launch with torchrun",
          _non_empty_positive_list),
    Field("backend", "str", "auto", "torch.distributed backend: auto (gloo/nccl), gloo, nccl",
          choices=BACKENDS),
    Field("nnodes", "int", 1, "torchrun --nnodes", _positive),
    Field("rdzv_endpoint", "optional_str", None,
          "torchrun rendezvous host:port for multi-node runs (None: a free local port)"),
    Field("ddp_strategy", "str", "node_mask_shared", "strategy trained under DDP",
          choices=STRATEGY_NAMES),
    Field("ddp_batch_size", "int", 8, "per-rank batch of the DDP scaling strategy", _positive),
    Field("ddp_steps", "int", 6, "timed DDP steps per run", _positive),
    Field("grad_accum_steps", "int", 2, "accumulation steps of the no_sync() comparison",
          _positive),
    Field("bucket_cap_mb", "float", 25.0, "DDP gradient bucket size in MB", _positive),
    Field("use_ddp_gather", "bool", False, "loss-side all-gather of predictions (brief's loss)"),
    Field("ddp_timeout_s", "float", 300.0, "a rank silent this long ends the run", _positive),
    Field("link_bandwidth_gbps", "optional_float", None,
          "all-reduce bandwidth in GB/s for predictions (None: measured here)"),
    Field("link_latency_us", "optional_float", None,
          "all-reduce latency in microseconds for predictions (None: measured here)"),
    # --- verdict (notebook 05) ---
    Field("verdict_tie_tolerance", "float", 0.15,
          "exact strategies within this fraction of the fastest count as tied; ties are "
          "broken by measured memory per sample", _positive),
    Field("gap_strategies", "list_str", ["replicated_mask_cpu", "dango_wildtype"],
          "the two strategies whose gap the verdict decomposes", _strategies),
)

FIELDS = {f.name: f for f in SCHEMA}


def _type_ok(field: Field, value: Any) -> tuple[bool, Any]:
    """Check (and lightly normalise) one value; returns (ok, normalised)."""
    k = field.kind
    if k == "int":
        return (isinstance(value, int) and not isinstance(value, bool)), value
    if k == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False, value
        return True, float(value)
    if k == "optional_float":
        if value is None:
            return True, None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False, value
        return True, float(value)
    if k == "bool":
        return isinstance(value, bool), value
    if k == "str":
        return isinstance(value, str), value
    if k == "optional_str":
        return (value is None or isinstance(value, str)), value
    if k == "list_int":
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(x, int) and not isinstance(x, bool) for x in value)
        return ok, list(value) if ok else value
    if k == "list_float":
        ok = isinstance(value, (list, tuple)) and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)
        return ok, [float(x) for x in value] if ok else value
    if k == "list_str":
        ok = isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value)
        return ok, list(value) if ok else value
    if k == "k":
        if isinstance(value, int) and not isinstance(value, bool):
            return True, value
        if isinstance(value, dict):
            try:
                norm = {int(kk): float(p) for kk, p in value.items()}
            except (TypeError, ValueError):
                return False, value
            return True, norm
        return False, value
    raise AssertionError(f"unknown field kind {k}")


_KIND_NAMES = {
    "int": "an integer", "float": "a number", "optional_float": "a number or null",
    "bool": "true or false", "str": "a string", "optional_str": "a string or null",
    "list_int": "a list of integers", "list_float": "a list of numbers",
    "list_str": "a list of strings", "k": "an integer or a mapping k -> probability",
}


def _check_k(value) -> str | None:
    if isinstance(value, int):
        return None if value >= 0 else "must be >= 0"
    if not value:
        return "mapping must not be empty"
    if any(k < 0 for k in value):
        return "every k must be >= 0"
    if any(p < 0 for p in value.values()):
        return "probabilities must be >= 0"
    total = sum(value.values())
    if abs(total - 1.0) > 1e-6:
        return f"probabilities must sum to 1 (they sum to {total:g})"
    return None


def defaults() -> dict:
    """The schema defaults (what an empty params file means)."""
    return {f.name: copy.deepcopy(f.default) for f in SCHEMA}


def validate(raw: dict | None, *, source: str = "params") -> dict:
    """Validate a params mapping and return a complete, normalised copy.

    Args:
        raw: the mapping read from a params file or injected by papermill (``None`` = empty).
        source: where it came from, used in error messages.

    Raises:
        ParamsError: on an unknown key (listing the valid keys), a wrong type or an impossible
            value (naming key and value). Nothing else has been done at that point.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: expected a mapping of params, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise ParamsError(
            f"{source}: unknown params key(s) {unknown}. Valid keys: {sorted(FIELDS)}")
    out = defaults()
    for key, value in raw.items():
        field = FIELDS[key]
        ok, norm = _type_ok(field, value)
        if not ok:
            raise ParamsError(
                f"{source}: '{key}' must be {_KIND_NAMES[field.kind]} (got {value!r})")
        if field.choices is not None and norm not in field.choices:
            raise ParamsError(
                f"{source}: '{key}' must be one of {list(field.choices)} (got {norm!r})")
        problem = _check_k(norm) if field.kind == "k" else (
            field.check(norm) if field.check is not None and norm is not None else None)
        if problem:
            raise ParamsError(f"{source}: '{key}' {problem} (got {value!r})")
        out[key] = norm
    p = out["sweep_p"]
    if not p or any(not (0.0 <= x < 1.0) for x in p):
        raise ParamsError(f"{source}: 'sweep_p' entries must be in [0, 1) (got {p!r})")
    if out["gap_strategies"] and len(out["gap_strategies"]) != 2:
        raise ParamsError(
            f"{source}: 'gap_strategies' must name exactly 2 strategies "
            f"(got {out['gap_strategies']!r})")
    _check_snapshot_exists(out, source)
    kmax = max_k(out["perturbation_k"])
    spec_genes = _spec_num_genes(out["snapshot"])
    if spec_genes is not None and kmax > spec_genes:
        raise ParamsError(
            f"{source}: 'perturbation_k' must not exceed the gene count of snapshot "
            f"'{out['snapshot']}' ({spec_genes}) (got {out['perturbation_k']!r})")
    return out


def max_k(k: int | dict) -> int:
    """Largest number of genes a sample may delete."""
    return k if isinstance(k, int) else max(k)


def mean_k(k: int | dict) -> float:
    """Expected number of genes deleted per sample."""
    return float(k) if isinstance(k, int) else sum(kk * p for kk, p in k.items())


def resolve_path(path: str) -> Path:
    """Resolve a path param: absolute as is, relative against the repository root."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else (REPO_ROOT / p)


def snapshot_spec_path(name: str) -> Path | None:
    """Path of the spec for a snapshot *name*, or None when ``snapshot`` is a file path."""
    if "/" in name or name.endswith((".pt", ".pth")):
        return None
    return REPO_ROOT / "data_snapshots" / f"{name}.yaml"


def _check_snapshot_exists(params: dict, source: str) -> None:
    name = params["snapshot"]
    spec = snapshot_spec_path(name)
    if spec is not None:
        if not spec.is_file():
            known = sorted(p.stem for p in (REPO_ROOT / "data_snapshots").glob("*.yaml"))
            raise ParamsError(
                f"{source}: 'snapshot' names no spec: {spec} does not exist "
                f"(known specs: {known}; or give a path to a saved HeteroData) (got {name!r})")
    else:
        path = resolve_path(name)
        if not path.is_file():
            raise ParamsError(f"{source}: 'snapshot' file {path} does not exist (got {name!r})")


def _spec_num_genes(name: str) -> int | None:
    spec = snapshot_spec_path(name)
    if spec is None or not spec.is_file():
        return None
    with open(spec) as fh:
        return int(yaml.safe_load(fh)["num_genes"])


def load_params_file(path: str | Path) -> dict:
    """Read and validate a params YAML file. ``path`` may be a name in ``params/``."""
    p = Path(path)
    if not p.is_file() and not p.suffix and (PARAMS_DIR / f"{p}.yaml").is_file():
        p = PARAMS_DIR / f"{p}.yaml"
    if not p.is_file():
        raise ParamsError(f"params file {p} does not exist")
    try:
        with open(p) as fh:
            raw = yaml.safe_load(fh)
    except yaml.YAMLError as exc:
        raise ParamsError(f"{p}: not valid YAML: {exc}") from exc
    return validate(raw, source=str(p))


def notebook_params(params_file: str | None, params: dict | None) -> dict:
    """What a notebook calls in its first cell after the ``parameters`` cell.

    ``params`` (injected by ``workbook_lib run``, or typed by a user) is validated with the
    same schema as a file; keys it sets override ``params_file`` (when one is given).
    """
    base: dict = {}
    if params_file:
        p = Path(params_file)
        if not p.is_file() and not p.suffix:
            p = PARAMS_DIR / f"{params_file}.yaml"
        if not p.is_file():
            raise ParamsError(f"params file {p} does not exist")
        with open(p) as fh:
            base = yaml.safe_load(fh) or {}
        validate(base, source=str(p))
    merged = {**base, **(params or {})}
    return validate(merged, source="notebook parameters")


def check_against_graph(params: dict, num_genes: int) -> None:
    """Checks that need the loaded graph (e.g. for a user-supplied HeteroData)."""
    kmax = max_k(params["perturbation_k"])
    if kmax > num_genes:
        raise ParamsError(
            f"'perturbation_k' must not exceed the gene count of the snapshot ({num_genes}) "
            f"(got {params['perturbation_k']!r})")


def describe() -> str:
    """Human-readable table of every key, its type, default and meaning."""
    lines = []
    for f in SCHEMA:
        choices = f" one of {list(f.choices)}" if f.choices else ""
        lines.append(f"{f.name:22s} {_KIND_NAMES[f.kind]}{choices}; default {f.default!r}\n"
                     f"{'':22s} {f.doc}")
    return "\n".join(lines)
