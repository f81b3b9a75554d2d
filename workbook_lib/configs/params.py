"""One typed schema for every params file, every ``--set``, every papermill ``-p``/``-f`` and
every notebook's parameters cell.

:func:`validate` checks a mapping before any work starts: an unknown key is an error with a
"did you mean", a wrong type or an impossible value is an error naming the key and the value.
Missing keys take the schema default, and **the schema defaults are the default run** (a laptop
CPU: scale 0.1), so a notebook opened in JupyterLab runs as ``make report`` does.

A string given for a non-string key is read as YAML first, because that is what command lines
pass: ``papermill -p batch_sizes "[1, 2]"`` injects a string, and YAML itself reads ``1e-3`` as a
string. Keys marked ``placement`` say where a run executes (node count, rendezvous endpoint, cache
folder); they are recorded but are not part of what ``run --resume`` compares.

Every YAML this module reads (a params file, a ``--set`` value, a papermill string) goes through
:func:`load_yaml`: PyYAML's safe loader with duplicate keys refused (PyYAML keeps the last one
silently), a size cap, and a cap on how far a value may expand through anchors and aliases or
nest (a "billion laughs" of a few hundred bytes would otherwise expand to gigabytes when an error
message shows it). PyYAML has no option for either, hence this small loader. Every value shown in
an error message is cut to a readable length (:func:`show`).
"""
from __future__ import annotations

import copy
import difflib
import math
import os
import re
import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from ..catalog import STRATEGY_NAMES
from ..exceptions import ParamsError
from ..paths import PARAMS_DIR, SNAPSHOT_DIR, resolve_path

DEVICES = ("cpu", "cuda", "auto")
MAX_FILE_BYTES = 1 << 20  # a params file is a few kB; more is not a params file
MAX_VALUES = 10_000  # values (list entries, mapping entries) one params key may expand to
MAX_DEPTH = 8  # nesting of one value (the schema needs 2: a mapping k -> probability)
MAX_BATCH = 65_536  # samples per batch: even the node-mask shared graph holds B x N x H floats
                    # (110 GB at B = 65,536 for the real spec), the replicated ones B graphs
MAX_SEED = 2**32 - 1  # numpy's legacy seeding and DataLoader workers take 32-bit seeds
MAX_INT = 2**62  # anything larger overflows torch's int64 arithmetic somewhere
MAX_TIMEOUT_S = 1e6  # ~11.6 days; the ranks' process-group timeout is a timedelta (and a C++
                     # duration): far larger values overflow in notebook 04's ranks
MAX_BUCKET_MB = 1 << 20  # 1 TiB; DDP turns the cap into an int64 byte count
AGGRS = ("sum", "mean")
BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class Field:
    """One params key: its kind, default, documentation and checks."""

    name: str
    kind: str  # int, float, bool, str, list_int, list_float, list_str, k, optional_*
    default: Any
    doc: str
    section: str
    check: Callable[[Any], str | None] | None = None  # returns a problem or None
    choices: tuple | None = None
    placement: bool = False  # where the run executes, not what it measures

    @property
    def type_hint(self) -> str:
        return _TYPE_HINTS[self.kind]


def _positive(v):
    return None if v > 0 else "must be positive"


def _positive_at_most(limit, why):
    def check(v):
        if v <= 0:
            return "must be positive"
        return None if v <= limit else f"must be at most {limit:,.0f} ({why})"
    return check


def _batch(v):
    if v <= 0:
        return "must be positive"
    return None if v <= MAX_BATCH else (
        f"must be at most {MAX_BATCH:,} (a batch holds B x genes x hidden floats even in the "
        "node-mask shared graph: larger batches fit no device's memory)")


def _batch_list(v):
    problem = _non_empty_positive_list(v)
    if problem:
        return problem
    return None if max(v) <= MAX_BATCH else (
        f"entries must be at most {MAX_BATCH:,} (a batch holds B x genes x hidden floats even "
        "in the node-mask shared graph: larger batches fit no device's memory)")


def _distinct_at_least(n: int, why: str, check=None):
    def f(v):
        problem = (check or _non_empty_positive_list)(v)
        if problem:
            return problem
        return None if len(set(v)) >= n else f"needs at least {n} distinct values ({why})"
    return f


def _endpoint(v):
    host, sep, port = v.rpartition(":")
    if not sep or not host or len(v) > 255 or not port.isdigit() or not 0 < int(port) < 65536:
        return "must be host:port (port 1..65535)"
    return None


def _seed(v):
    return None if 0 <= v <= MAX_SEED else f"must be in 0..{MAX_SEED} (a 32-bit seed: numpy's " \
        "legacy seeding and DataLoader workers take no more)"


def _at_least(n):
    return lambda v: None if v >= n else f"must be >= {n}"


def _non_empty_positive_list(v):
    if len(v) == 0:
        return "must be a non-empty list"
    if any(x <= 0 for x in v):
        return "every entry must be positive"
    return None


def _strategies(v):
    bad = [s for s in v if s not in STRATEGY_NAMES]
    if bad:
        return f"unknown strategies {bad}; valid: {list(STRATEGY_NAMES)}"
    if len(set(v)) != len(v):
        return "must not repeat a strategy"
    return None


# ``pipelines`` entries as plain strings: ``"TARGET"`` or ``"NAME=TARGET"``, TARGET being
# ``package.module:factory`` or ``path/to/file.py:factory``. Parsed and checked here, with the
# schema; importing and building them is ``pipelines.loading``'s.
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class PipelineSpec:
    """One entry of the ``pipelines`` key."""

    name: str
    target: str  # module:factory or file.py:factory

    @property
    def module(self) -> str:
        return self.target.rsplit(":", 1)[0]

    @property
    def factory(self) -> str:
        return self.target.rsplit(":", 1)[1]

    @property
    def is_file(self) -> bool:
        return self.module.endswith(".py") or "/" in self.module


def spec_problem(entry: str) -> str | None:
    """Why ``entry`` is not a pipeline spec (syntax, a file that does not exist), or None."""
    target = entry.split("=", 1)[1] if "=" in entry else entry
    if "=" in entry and not NAME_RE.match(entry.split("=", 1)[0].strip()):
        return (f"{entry!r}: the name before '=' must be an identifier (letters, digits, _ . -)")
    if target.count(":") != 1 or not all(target.split(":")):
        return (f"{entry!r} is not 'package.module:factory' or 'path/to/file.py:factory'")
    module, factory = target.split(":")
    if not factory.isidentifier():
        return f"{entry!r}: '{factory}' is not a Python name"
    if module.endswith(".py") or "/" in module:
        if spec_file(module) is None:
            return f"{entry!r}: the file {module} does not exist"
    elif not all(part.isidentifier() for part in module.split(".")):
        return f"{entry!r}: '{module}' is not a module name"
    return None


def normalize(entry: str) -> str:
    """``entry`` with a file found only relative to the current folder made absolute, so that a
    kernel or a rank started elsewhere finds the same file (the name is unchanged)."""
    name, sep, target = entry.rpartition("=") if "=" in entry else ("", "", entry)
    module, _, factory = target.partition(":")
    if (module.endswith(".py") or "/" in module) and not resolve_path(module).is_file():
        here = Path(module).expanduser().resolve()
        if here.is_file():
            return f"{name.strip() or Path(module).stem}={here}:{factory}"
    return entry


def spec_file(module: str) -> Path | None:
    """The file a pipeline spec names (from the repository root, then the current folder)."""
    for p in (resolve_path(module), Path(module).expanduser().resolve()):
        if p.is_file():
            return p
    return None


def parse_specs(entries: list[str]) -> list[PipelineSpec]:
    """The entries as specs with their names (syntax assumed checked by :func:`spec_problem`).

    ``NAME=TARGET`` names it; otherwise the module's (file's) name, and where several entries
    come from one module (``family.py:slow``, ``family.py:fast``), each is named by its factory
    (``slow``, ``fast``), or ``module.factory`` where that is taken too."""
    parsed = []
    for e in entries:
        if "=" in e:
            name, target = (s.strip() for s in e.split("=", 1))
            parsed.append((name, target, True))
        else:
            target = e.strip()
            module = target.split(":")[0]
            name = Path(module).stem if module.endswith(".py") else module.rsplit(".", 1)[-1]
            parsed.append((name, target, False))
    defaults = [n for n, _t, explicit in parsed if not explicit]
    taken = {n for n, _t, explicit in parsed if explicit}
    out = []
    for name, target, explicit in parsed:
        if not explicit and defaults.count(name) > 1:
            factory = target.rsplit(":", 1)[-1]
            others = [t.rsplit(":", 1)[-1] for n, t, x in parsed if not x and n == name]
            unique = others.count(factory) == 1 and factory not in taken | set(STRATEGY_NAMES) \
                and factory not in defaults
            name = factory if unique else f"{name}.{factory}"
        out.append(PipelineSpec(name, target))
    return out


def _pipeline_specs(v):
    for entry in v:
        problem = spec_problem(entry)
        if problem:
            return problem
    names = [s.name for s in parse_specs(v)]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        return (f"names {dup} twice: name them apart with NAME=TARGET")
    clash = sorted(set(names) & set(STRATEGY_NAMES))
    if clash:
        return f"names {clash} are built-in strategies: name them apart with NAME=TARGET"
    return None


def _fraction_open(v):
    return None if 0.0 < v < 1.0 else "must be in (0, 1)"


def _p_list(v):
    if not v:
        return "must be a non-empty list"
    return None if all(0.0 <= x < 1.0 for x in v) else "entries must be in [0, 1)"


S_SNAP, S_MODEL, S_MEAS = "snapshot and samples", "model", "measurement"
S_02, S_03, S_04, S_05, S_06 = ("02 cost model, benchmark, memory", "03 training loop",
                                "04 DDP", "05 verdict", "06 adopting the fix")

SCHEMA: tuple[Field, ...] = (
    Field("snapshot", "str", "string12",
          "spec name in data_snapshots/ (e.g. 'string12') or path to a torch.save'd HeteroData",
          S_SNAP),
    Field("scale", "float", 0.1, "edge-count multiplier, 1.0 = the real graph", S_SNAP,
          _positive),
    Field("seed", "int", 0, "seed of graph generation and perturbation sampling", S_SNAP,
          _seed),
    Field("device", "str", "auto", "cpu, cuda or auto (cuda when available)", S_SNAP,
          choices=DEVICES),
    Field("batch_sizes", "list_int", [1, 8, 28, 64], "batch sizes of per-batch size figures",
          S_SNAP, _batch_list),
    Field("perturbation_k", "k", 3,
          "genes deleted per sample: an int, or a mapping k -> probability", S_SNAP),
    Field("num_samples", "int", 332313, "dataset size for storage and epoch projections",
          S_SNAP, _positive),
    Field("num_perturbations", "int", 200,
          "perturbations sampled for removed-edge and hop statistics", S_SNAP, _positive),
    Field("cache_dir", "str", "data_snapshots/cache",
          "where generated graphs are cached (relative to the repository root)", S_SNAP,
          placement=True),
    Field("hidden", "int", 32, "hidden size H (the real model: 64)", S_MODEL, _positive),
    Field("layers", "int", 2, "message-passing layers (the real model: 3)", S_MODEL, _positive),
    Field("aggr", "str", "sum", "neighbour aggregation: sum or mean", S_MODEL, choices=AGGRS),
    Field("dual_forward", "bool", True,
          "the Lazy model's dual forward (wildtype pass + perturbed pass)", S_MODEL),
    Field("strategies", "list_str", list(STRATEGY_NAMES),
          "built-in strategies to compare (may be empty when 'pipelines' names two or more)",
          S_MODEL, _strategies),
    Field("pipelines", "list_str", [],
          "your own training pipelines: 'package.module:factory' or 'path/to/file.py:factory', "
          "optionally 'NAME=...'; the factory(params, graph, device) returns a pipeline "
          "(README: Diagnose your own pipeline)", S_MODEL, _pipeline_specs),
    Field("cpu_allocator_cache", "bool", True,
          "keep freed memory in the glibc heap during CPU timings (as PyTorch's CUDA caching "
          "allocator does on GPUs); without it large-batch CPU steps measure page faults",
          S_MEAS),
    Field("warmup", "int", 1, "untimed warm-up calls or steps before anything is timed", S_MEAS,
          _at_least(0)),
    Field("min_repeats", "int", 5, "fewest timed repeats of a figure", S_MEAS, _positive),
    Field("precision_target", "float", 0.10,
          "repeat a figure until IQR/median is at most this (or its time budget is spent)",
          S_MEAS, _fraction_open),
    Field("time_budget_s", "float", 2.0,
          "seconds one benchmark figure may spend on repeats beyond min_repeats", S_MEAS,
          _positive),
    Field("stall_timeout_s", "float", 300.0,
          "a stage of a pipeline's step (data item, collate, forward...) running this long has "
          "stalled: that pipeline is stopped and recorded, the others go on (once it has run a "
          "step, also 20x its slowest step, at least 30 s)", S_MEAS, _positive),
    Field("sweep_edges", "list_int", [20000, 50000, 100000, 200000],
          "edge counts E of the cost-model sweeps; the largest is held out of every fit", S_02,
          _distinct_at_least(3, "the largest is held out and the fits in E need 2 more")),
    Field("sweep_hidden", "list_int", [16, 32, 64], "hidden sizes H of the cost-model sweeps",
          S_02, _distinct_at_least(2, "the fit separates E x H from E")),
    Field("sweep_p", "list_float", [0.001, 0.01, 0.1, 0.3, 0.6],
          "removed-edge fractions p of the filter sweeps", S_02, _p_list),
    Field("layer_batch_sizes", "list_int", [1, 2, 4, 8],
          "batch sizes of the one-layer strategy comparison", S_02, _batch_list),
    Field("exactness_genes", "int", 400,
          "genes of the induced subgraph on which 02 re-checks exactness", S_02, _at_least(2)),
    Field("bench_full_size", "bool", False,
          "run 02's strategy benchmark at the real spec (scale 1, H=64, 3 layers) instead of "
          "this run's sizes", S_02),
    Field("bench_min_layers", "int", 3,
          "fewest layers of 02's strategy benchmark: it runs at max(layers, this), so that the "
          "shared graph's delta form (it needs a middle layer, L >= 3) is measured; 1: the "
          "run's layers", S_02, _positive),
    Field("bench_replicated_max_batch", "int", 64,
          "largest batch at which the benchmark times the replicated forms (they also need the "
          "memory estimate to fit): at the shared form's batch when allowed, else projected "
          "from B = 1, 2 and labelled so", S_02, _positive),
    Field("memory_batch_sizes", "list_int", [1, 2, 4],
          "batch sizes of the peak-memory sweep (at least 3 for a fit)", S_02,
          _distinct_at_least(3, "the memory fit and its residuals need 3", _batch_list)),
    Field("memory_full_size", "bool", False,
          "also measure peak memory at the real spec (scale 1, H=64, 3 layers)", S_02),
    Field("memory_budget_gb", "optional_float", None,
          "memory for the largest-batch projection (null: what the run measures on - for CPU "
          "runs the tightest of host RAM, an rlimit, a cgroup and SLURM --mem; GPU memory for "
          "CUDA runs); when set, also the benchmark's budget for the replicated forms' batch",
          S_02, _positive),
    Field("batch_size_lazy", "int", 7,
          "batch of the perturbed-graph strategies (the investigation's Lazy model: 28)", S_03,
          _batch),
    Field("batch_size_dango", "int", 16, "batch of the DANGO-style strategy (the investigation: 64)",
          S_03, _batch),
    Field("loop_steps", "int", 10, "fewest timed training steps per strategy and mode", S_03,
          _positive),
    Field("loop_max_steps", "int", 20, "most timed training steps per strategy and mode",
          S_03, _positive),
    Field("loop_budget_s", "float", 110.0,
          "seconds of timed loop steps before arms stop at loop_steps", S_03, _positive),
    Field("num_workers", "int", 0, "DataLoader worker processes (0: load in the main process)",
          S_03, _at_least(0)),
    Field("pin_memory", "bool", False, "DataLoader pin_memory (CUDA runs)", S_03),
    Field("persistent_workers", "bool", False, "DataLoader persistent_workers", S_03),
    Field("profile_wait", "int", 1, "torch.profiler schedule: wait steps (>= 1)", S_03,
          _at_least(1)),
    Field("profile_warmup", "int", 1, "torch.profiler schedule: warm-up steps (>= 1)", S_03,
          _at_least(1)),
    Field("profile_active", "int", 2, "torch.profiler schedule: recorded steps", S_03,
          _positive),
    Field("world_sizes", "list_int", [1, 2], "DDP world sizes launched with torchrun", S_04,
          _non_empty_positive_list),
    Field("backend", "str", "auto", "torch.distributed backend: auto (gloo/nccl), gloo, nccl",
          S_04, choices=BACKENDS),
    Field("nnodes", "int", 1, "nodes of the torchrun launch (set by the SLURM scripts)", S_04,
          _positive, placement=True),
    Field("rdzv_endpoint", "optional_str", None,
          "torchrun rendezvous host:port for several nodes (null: a free local port)", S_04,
          _endpoint, placement=True),
    Field("ddp_strategy", "optional_str", None,
          "strategy or pipeline of the DDP scaling runs (null: node_mask_shared when it is among "
          "the strategies, else the slow pipeline of gap_strategies)", S_04),
    Field("ddp_batch_size", "int", 8,
          "per-rank batch of weak scaling; strong scaling keeps ddp_batch_size x the largest "
          "world size as the global batch", S_04, _batch),
    Field("ddp_steps", "int", 20, "fewest timed DDP steps per variant", S_04, _positive),
    Field("ddp_budget_s", "float", 60.0, "seconds of timed DDP steps per world size (split over its alternated launches)", S_04,
          _positive),
    Field("grad_accum_steps", "int", 2, "micro-batches of the accumulation comparison", S_04,
          _positive),
    Field("bucket_cap_mb", "float", 25.0, "DDP gradient bucket size in MB", S_04,
          _positive_at_most(MAX_BUCKET_MB, "DDP takes the cap as a 64-bit byte count")),
    Field("use_ddp_gather", "bool", False,
          "the investigation's loss-side all-gather of predictions (the other setting is measured too)",
          S_04),
    Field("ddp_timeout_s", "float", 300.0, "a launch silent this long is stopped", S_04,
          _positive_at_most(MAX_TIMEOUT_S, "the ranks' process-group timeout overflows beyond it")),
    Field("link_bandwidth_gbps", "optional_float", None,
          "all-reduce bus bandwidth in GB/s for predictions (null: fitted here)", S_04,
          _positive),
    Field("link_latency_us", "optional_float", None,
          "all-reduce latency in microseconds for predictions (null: fitted here)", S_04,
          _at_least(0)),
    Field("verdict_tie_tolerance", "float", 0.15,
          "exact strategies within this fraction of the fastest count as tied (ties go to the "
          "one with the least measured memory per sample)", S_05, _positive),
    Field("gap_strategies", "list_str", ["replicated_mask_cpu", "dango_wildtype"],
          "the two strategies or pipelines whose gap the verdict explains (slow, fast); when "
          "not given and 'pipelines' names two or more, the first two pipelines", S_05),
    Field("adopt_steps", "int", 200, "training steps of each pipeline in notebook 06", S_06,
          _positive),
    Field("adopt_optimizer", "str", "sgd",
          "optimizer of notebook 06's training: sgd (rounding stays rounding) or adamw (its "
          "normalised first steps turn rounding-level gradients into full-size updates)", S_06,
          choices=("sgd", "adamw")),
    Field("adopt_lr", "float", 0.05, "learning rate of notebook 06's training", S_06,
          _positive),
)

FIELDS = {f.name: f for f in SCHEMA}
PLACEMENT_KEYS = frozenset(f.name for f in SCHEMA if f.placement)

_KIND_NAMES = {
    "int": "an integer", "float": "a number", "optional_float": "a number or null",
    "bool": "true or false", "str": "a string", "optional_str": "a string or null",
    "list_int": "a list of integers", "list_float": "a list of numbers",
    "list_str": "a list of strings", "k": "an integer or a mapping k -> probability",
}
# written as papermill's parameter inspection reads them (it accepts no ``|`` in annotations)
_TYPE_HINTS = {
    "int": "int", "float": "float", "optional_float": "Optional[float]", "bool": "bool",
    "str": "str", "optional_str": "Optional[str]", "list_int": "List[int]",
    "list_float": "List[float]", "list_str": "List[str]", "k": "Union[int, Dict[int, float]]",
}


_SHOW = reprlib.Repr()
_SHOW.maxstring, _SHOW.maxother, _SHOW.maxlist, _SHOW.maxdict, _SHOW.maxlevel = 60, 60, 8, 6, 3
MAX_MESSAGE = 300  # characters of one error line


def show(value: Any) -> str:
    """``repr`` of a value cut to a readable length (a value can be gigabytes long)."""
    try:
        text = _SHOW.repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails is still reported
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:77] + "..."


def one_line(message: str, limit: int = MAX_MESSAGE) -> str:
    """An error message as one line of at most ``limit`` characters (a long one keeps its
    start, which names the key, and its end, which says what is wrong)."""
    text = " ".join(str(message).split())
    if len(text) <= limit:
        return text
    head = (limit - 5) // 2
    return text[:head] + " ... " + text[len(text) - (limit - 5 - head):]


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader refusing a key given twice in one mapping, and a document nesting
    deeper than a params file can (PyYAML composes recursively: 50,000 nested brackets end in a
    RecursionError), naming the top-level key concerned."""

    def compose_node(self, parent, index):
        depth = getattr(self, "_depth", 0) + 1
        if depth == 2 and isinstance(index, yaml.ScalarNode):
            self._top_key = index.value
        if depth > MAX_DEPTH + 1:
            key = getattr(self, "_top_key", None) or getattr(self, "_key", None)
            raise yaml.composer.ComposerError(
                None, None, (f"'{key}' " if key else "a value ") + f"nests deeper than "
                f"{MAX_DEPTH} levels", None)
        self._depth = depth
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth = depth - 1

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue  # the base class reports an unhashable key
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"key {show(key)} is given twice (line {seen[key] + 1}"
                    + (f" and line {key_node.start_mark.line + 1})"
                       if key_node.start_mark.line != seen[key] else ")"), None)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str, source: str, *, key: str | None = None) -> Any:
    """Parse YAML text as this module reads every params value (see the module docstring).

    Raises:
        ParamsError: not YAML, a duplicate key, more than :data:`MAX_FILE_BYTES`, a value that
            nests deeper than :data:`MAX_DEPTH` or expands to more than :data:`MAX_VALUES`.
    """
    if len(text) > MAX_FILE_BYTES:
        raise ParamsError(f"{source}: {len(text):,} characters; a params file is at most "
                          f"{MAX_FILE_BYTES:,}", key=key)
    loader = _UniqueKeyLoader(text)
    loader._key = key
    try:
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except RecursionError:
        raise ParamsError(f"{source}: nested too deeply (a params value nests at most "
                          f"{MAX_DEPTH} levels)", key=key) from None
    except yaml.YAMLError as exc:
        problem = one_line(_yaml_problem(exc), 200)
        if "given twice" in problem or "nests deeper" in problem:
            named = re.search(r"'([^']*)'", problem)
            if key and f"'{key}'" not in problem:
                problem = f"'{key}': {problem}"
            raise ParamsError(f"{source}: {problem}",
                              key=key or (named.group(1) if named else None)) from None
        raise ParamsError(f"{source}: not valid YAML: {problem}", key=key) from None
    if isinstance(data, dict):
        for k, v in data.items():
            check_size(v, f"{source}: {show(k)}", key=str(k))
    else:
        check_size(data, f"{source}: '{key}'" if key else source, key=key)
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem:
        return problem + (f" (line {mark.line + 1}, column {mark.column + 1})" if mark else "")
    return str(exc).splitlines()[0]


def check_size(value: Any, where: str, *, key: str | None = None) -> None:
    """Refuse a value nesting deeper than :data:`MAX_DEPTH` or holding more than
    :data:`MAX_VALUES` values once aliases are expanded (it stops counting at the limit)."""
    count = 0
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (list, tuple, dict)):
            if depth >= MAX_DEPTH:
                raise ParamsError(f"{where} nests deeper than {MAX_DEPTH} levels", key=key)
            items = list(v.items()) if isinstance(v, dict) else v
            count += len(items)
            if count > MAX_VALUES:
                raise ParamsError(f"{where} expands to more than {MAX_VALUES:,} values (through "
                                  "YAML anchors and aliases, or a long list); a params value "
                                  "holds far fewer", key=key)
            for item in items:
                if isinstance(item, tuple) and isinstance(v, dict):
                    stack.extend((x, depth + 1) for x in item)
                else:
                    stack.append((item, depth + 1))


def _coerce(field: Field, value: Any) -> Any:
    """A string for a non-string key is read as YAML (command lines pass strings)."""
    if isinstance(value, str) and field.kind not in ("str", "optional_str"):
        try:
            parsed = load_yaml(value, f"'{field.name}'", key=field.name)
        except ParamsError as exc:
            if "not valid YAML" in str(exc):
                return value
            raise
        if isinstance(parsed, str) and field.kind in ("float", "optional_float"):
            try:
                return float(parsed)
            except ValueError:
                return value
        return parsed
    if field.kind == "optional_str" and isinstance(value, str) and value.strip().lower() in (
            "null", "none", "~", ""):
        return None
    return value


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _not_finite(field: Field, value: Any) -> str | None:
    """A NaN or infinite number, or an integer beyond :data:`MAX_INT`, anywhere in a value."""
    items = value if isinstance(value, (list, tuple)) else (
        [*value.keys(), *value.values()] if isinstance(value, dict) else [value])
    for x in items:
        if isinstance(x, float) and not math.isfinite(x):
            return f"must hold finite numbers (got {show(x)})"
        if _is_int(x) and abs(x) > MAX_INT:
            return f"holds {show(x)}, beyond what int64 arithmetic takes (at most 2**62)"
    return None


def _type_ok(field: Field, value: Any) -> tuple[bool, Any]:
    """Check (and lightly normalise) one value; returns (ok, normalised)."""
    k = field.kind
    if k == "int":
        return _is_int(value), value
    if k in ("float", "optional_float"):
        if value is None and k == "optional_float":
            return True, None
        if not _is_number(value):
            return False, value
        try:
            return True, float(value)
        except OverflowError:  # an int too large for a float: reported as not finite
            return True, math.inf
    if k == "bool":
        return isinstance(value, bool), value
    if k == "str":
        return isinstance(value, str), value
    if k == "optional_str":
        return (value is None or isinstance(value, str)), value
    if k in ("list_int", "list_float", "list_str"):
        if not isinstance(value, (list, tuple)):
            return False, value
        if k == "list_int":
            ok = all(isinstance(x, int) and not isinstance(x, bool) for x in value)
            return ok, list(value)
        if k == "list_float":
            ok = all(_is_number(x) for x in value)
            if not ok:
                return False, value
            try:
                return True, [float(x) for x in value]
            except OverflowError:
                return True, [math.inf]
        return all(isinstance(x, str) for x in value), list(value)
    if k == "k":
        if isinstance(value, int) and not isinstance(value, bool):
            return True, value
        if isinstance(value, dict):
            try:
                if not all(_is_number(p) for p in value.values()):
                    return False, value
                return True, {int(kk): float(p) for kk, p in value.items()}
            except (TypeError, ValueError, OverflowError):
                return False, value
        return False, value
    raise AssertionError(f"unknown field kind {k}")


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
    """The schema defaults: the default run."""
    return {f.name: copy.deepcopy(f.default) for f in SCHEMA}


def suggest(key: str) -> str:
    """' (did you mean 'x'?)' for a misspelt key, else ''."""
    close = difflib.get_close_matches(key, list(FIELDS), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def unknown_key_error(keys: list[str], source: str) -> ParamsError:
    parts = [f"'{k}'{suggest(k)}" for k in keys]
    return ParamsError(f"{source}: unknown params key(s) {', '.join(parts)}; "
                       "`python -m workbook_lib params` lists every key",
                       key=keys[0], value=None)


def validate(raw: dict | None, *, source: str = "params") -> dict:
    """Validate a params mapping and return a complete, normalised copy.

    Args:
        raw: a mapping read from a params file, given by ``--set`` or injected by papermill
            (``None`` means empty).
        source: where it came from, named in error messages.

    Raises:
        ParamsError: on an unknown key (with "did you mean"), a wrong type or an impossible
            value (naming key and value). Nothing else has been done at that point.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{source}: expected a mapping of params, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in set(raw) - set(FIELDS))
    if unknown:
        raise unknown_key_error(unknown, source)
    out = defaults()
    for key, value in raw.items():
        field = FIELDS[key]
        check_size(value, f"{source}: '{key}'", key=key)
        ok, norm = _type_ok(field, _coerce(field, value))
        if not ok:
            raise ParamsError(f"{source}: '{key}' must be {_KIND_NAMES[field.kind]} "
                              f"(got {show(value)})", key=key, value=value)
        problem = _not_finite(field, norm) if norm is not None else None
        if problem:
            raise ParamsError(f"{source}: '{key}' {problem}", key=key, value=value)
        try:
            if field.choices is not None and norm not in field.choices:
                raise ParamsError(f"{source}: '{key}' must be one of {list(field.choices)} "
                                  f"(got {show(norm)})", key=key, value=value)
        except TypeError:  # an unhashable value
            raise ParamsError(f"{source}: '{key}' must be one of {list(field.choices)} "
                              f"(got {show(norm)})", key=key, value=value) from None
        problem = _check_k(norm) if field.kind == "k" else (
            field.check(norm) if field.check is not None and norm is not None else None)
        if problem:
            raise ParamsError(f"{source}: '{key}' {problem} (got {show(value)})", key=key,
                              value=value)
        out[key] = norm
    if out["pipelines"]:
        out["pipelines"] = [normalize(e) for e in out["pipelines"]]
    if "gap_strategies" not in raw and len(out["pipelines"]) >= 2:
        out["gap_strategies"] = [s.name for s in parse_specs(out["pipelines"])[:2]]
    elif "gap_strategies" not in raw and not out["strategies"] and len(out["pipelines"]) == 1:
        out["gap_strategies"] = []  # one pipeline alone: no gap (notebooks 01-03 only)
    _cross_checks(out, source)
    return out


def ddp_strategy(params: dict) -> str:
    """The pipeline notebook 04's scaling runs train: ``ddp_strategy`` when set, else the
    node-mask shared graph when it is among the strategies, else the slow pipeline of
    ``gap_strategies`` (the user's own, on a run without built-in strategies)."""
    if params["ddp_strategy"] is not None:
        return params["ddp_strategy"]
    if "node_mask_shared" in params["strategies"]:
        return "node_mask_shared"
    compared = list(params["strategies"]) + [s.name for s in parse_specs(params["pipelines"])]
    return (list(params["gap_strategies"]) or compared)[0]


def _cross_checks(out: dict, source: str) -> None:
    def fail(key, msg):
        raise ParamsError(f"{source}: '{key}' {msg} (got {show(out[key])})", key=key,
                          value=out[key])

    users = [s.name for s in parse_specs(out["pipelines"])]
    compared = list(out["strategies"]) + users
    if not compared:
        fail("strategies", "must not be empty unless 'pipelines' names one or more")
    if len(compared) == 1 and not out["gap_strategies"]:
        pass  # one pipeline alone: notebooks 01-03 (check_gap refuses the others)
    elif len(out["gap_strategies"]) != 2 or out["gap_strategies"][0] == out["gap_strategies"][1]:
        fail("gap_strategies", "must name 2 different strategies or pipelines (slow, fast)")
    bad = [g for g in out["gap_strategies"] if g not in compared]
    if bad:
        fail("gap_strategies", f"names {bad}, which the run does not compare (its strategies and "
                               f"pipelines: {compared})")
    if out["nnodes"] > 1 and out["rdzv_endpoint"] is None:
        fail("rdzv_endpoint", f"is needed (host:port) for nnodes={out['nnodes']}")
    if out["loop_max_steps"] < out["loop_steps"]:
        fail("loop_max_steps", f"must be >= loop_steps={out['loop_steps']}")
    if out["ddp_strategy"] is not None and out["ddp_strategy"] not in compared:
        fail("ddp_strategy", f"must name a strategy or pipeline the run compares (one of "
                             f"{compared})")
    kmax = max_k(out["perturbation_k"])
    _path_check(out, source, "snapshot", _snapshot_exists)
    spec = _spec(out["snapshot"])
    if spec is not None:
        spec_genes = int(spec["num_genes"])
        if kmax > spec_genes:
            fail("perturbation_k", f"must not exceed the gene count of snapshot "
                                   f"'{out['snapshot']}' ({spec_genes})")
        if out["exactness_genes"] > spec_genes:
            fail("exactness_genes", f"must not exceed the gene count of snapshot "
                                    f"'{out['snapshot']}' ({spec_genes})")
        top = max_scale(spec)
        if out["scale"] > top:
            fail("scale", f"must be at most {top:.4g} for snapshot '{out['snapshot']}': beyond "
                          "it an edge type holds more edges than its genes have pairs")
        _path_check(out, source, "cache_dir", _cache_dir_usable)
    if out["exactness_genes"] <= kmax:
        fail("exactness_genes", f"must exceed the largest perturbation_k ({kmax})")
    gbatch = out["ddp_batch_size"] * max(out["world_sizes"])
    bad = [w for w in out["world_sizes"] if gbatch % w]
    if bad:
        fail("world_sizes", f"must each divide the strong-scaling global batch "
                            f"ddp_batch_size x max(world_sizes) = {gbatch} ({bad} do not)")


def check_gap(params: dict, notebooks: list[str]) -> None:
    """Refuse, in one line and before any work, notebooks that compare two pipelines (04, 05,
    06) when the params compare one.

    Raises:
        ParamsError: ``gap_strategies`` is empty and a notebook named needs it.
    """
    from ..catalog import BY_NAME

    need = [n for n in notebooks if n in BY_NAME and BY_NAME[n].needs_gap]
    if need and not params["gap_strategies"]:
        one = list(params["strategies"]) + [s.name for s in parse_specs(params["pipelines"])]
        raise ParamsError(
            f"{', '.join(need)} compare two pipelines (gap_strategies: slow, fast) and this run "
            f"has one ({', '.join(one)}): there is no gap to explain. Add a second pipeline or a "
            "built-in strategy, or run --only 01 02 03", key="gap_strategies", value=[])


def max_k(k: int | dict) -> int:
    """Largest number of genes a sample may delete."""
    return k if isinstance(k, int) else max(k)


def mean_k(k: int | dict) -> float:
    """Expected number of genes deleted per sample."""
    return float(k) if isinstance(k, int) else sum(kk * p for kk, p in k.items())


def snapshot_spec_path(name: str) -> Path | None:
    """Path of the spec for a snapshot *name*, or None when ``snapshot`` is a file path."""
    if "/" in name or name.endswith((".pt", ".pth")):
        return None
    return SNAPSHOT_DIR / f"{name}.yaml"


def _path_check(params: dict, source: str, key: str, check) -> None:
    """Run ``check(params, source)`` on the path under ``key``; an ``OSError`` from the file
    system (e.g. a name too long for it) becomes a one-line ParamsError naming the key."""
    try:
        check(params, source)
    except OSError as exc:
        raise ParamsError(f"{source}: '{key}' {show(params[key])} is not a usable path "
                          f"({exc.strerror or exc})", key=key, value=params[key]) from None


def _snapshot_exists(params: dict, source: str) -> None:
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


def _spec(name: str) -> dict | None:
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


def _cache_dir_usable(params: dict, source: str) -> None:
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


def find_params_file(path: str | Path) -> Path:
    """Where a ``--params`` value points: the path as given (from the current folder), else the
    same relative path from the repository root, else a name in ``params/``; the path as given
    when none is a file (:func:`read_params_file` says what is wrong with it)."""
    p = Path(path)
    if p.is_file():
        return p
    if not p.is_absolute() and resolve_path(p).is_file():
        return resolve_path(p)
    if not p.suffix and (PARAMS_DIR / f"{p}.yaml").is_file():
        return PARAMS_DIR / f"{p}.yaml"
    return p


def read_params_file(path: str | Path) -> tuple[Path, dict]:
    """Read a params YAML file (see :func:`find_params_file`) without validating it."""
    if str(path).strip() == "":
        raise ParamsError("--params: empty path", key="params")
    p = find_params_file(path)
    if p.is_dir():
        raise ParamsError(f"params file {p} is a directory, not a YAML file", key="params")
    if not p.is_file():
        raise ParamsError(f"params file {p} does not exist", key="params")
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise ParamsError(f"{p}: {p.stat().st_size:,} bytes; a params file is at most "
                              f"{MAX_FILE_BYTES:,}", key="params")
        raw = load_yaml(p.read_text(encoding="utf-8"), str(p))
    except UnicodeDecodeError:
        raise ParamsError(f"{p}: not a text file (a params file is YAML)", key="params") \
            from None
    except OSError as exc:
        raise ParamsError(f"params file {p} cannot be read ({exc.strerror or exc})",
                          key="params") from None
    if raw is not None and not isinstance(raw, dict):
        raise ParamsError(f"{p}: expected a mapping of params, got {type(raw).__name__}")
    return p, raw or {}


def load_params_file(path: str | Path) -> dict:
    """Read and validate a params YAML file (see :func:`find_params_file`)."""
    p, raw = read_params_file(path)
    return validate(raw, source=str(p))


def results_relevant(params: dict) -> dict:
    """The params a run's results depend on (without the ``placement`` keys)."""
    return {k: v for k, v in params.items() if k not in PLACEMENT_KEYS}


def check_against_graph(params: dict, num_genes: int) -> None:
    """Checks that need the loaded graph (e.g. a user-supplied HeteroData)."""
    kmax = max_k(params["perturbation_k"])
    if kmax > num_genes:
        raise ParamsError(
            f"'perturbation_k' must not exceed the gene count of the snapshot ({num_genes}) "
            f"(got {params['perturbation_k']!r})", key="perturbation_k",
            value=params["perturbation_k"])
    if params["exactness_genes"] > num_genes:
        raise ParamsError(f"'exactness_genes' must not exceed the gene count of the snapshot "
                          f"({num_genes}) (got {params['exactness_genes']})",
                          key="exactness_genes", value=params["exactness_genes"])


def describe() -> str:
    """Every key by section, with its type, default and meaning."""
    lines, section = [], None
    for f in SCHEMA:
        if f.section != section:
            section = f.section
            lines.append(f"\n# {section}")
        choices = f" (one of {', '.join(map(str, f.choices))})" if f.choices else ""
        where = " [placement: not compared by --resume]" if f.placement else ""
        lines.append(f"{f.name}: {f.type_hint} = {f.default!r}{choices}{where}\n"
                     f"    {f.doc}")
    return "\n".join(lines).lstrip()


def _cell_comment(doc: str) -> str:
    # papermill skips a parameter line holding more than one "=" (it reads it as code)
    return doc.replace(">=", "at least").replace("<=", "at most").replace(" = ", " is ") \
        .replace("=", " ")


# What each notebook reads: the schema's sections (every notebook reads the first three) plus
# single keys of other sections. A notebook's parameters cell lists these; papermill still injects
# any key, and the schema validates every one.
_COMMON = (S_SNAP, S_MODEL, S_MEAS)
NOTEBOOK_READS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "01_graph_inventory": (_COMMON, ("batch_size_lazy",)),
    "02_mask_cost_model": (_COMMON + (S_02,), ("batch_size_lazy", "batch_size_dango")),
    "03_data_vs_model_timing": (_COMMON + (S_03,), ("gap_strategies",)),
    "04_ddp_scaling": (_COMMON + (S_04,), ("batch_size_lazy", "batch_size_dango", "num_workers",
                                          "pin_memory", "persistent_workers",
                                          "gap_strategies")),
    "05_verdict": (_COMMON + (S_05,), ("batch_size_lazy", "batch_size_dango")),
    "06_adopt_fix": (_COMMON + (S_06,), ("batch_size_lazy", "gap_strategies")),
}


def keys_read(notebook: str | None = None) -> list[str]:
    """The params keys ``notebook`` reads, in schema order (every key for None or a notebook
    outside the catalog)."""
    if notebook not in NOTEBOOK_READS:
        return [f.name for f in SCHEMA]
    sections, extra = NOTEBOOK_READS[notebook]
    return [f.name for f in SCHEMA if f.section in sections or f.name in extra]


def parameters_cell(notebook: str | None = None) -> str:
    """The source of a notebook's papermill ``parameters`` cell: one typed, commented line per
    key the notebook reads (:func:`keys_read`), as ``papermill --help-notebook`` reads them."""
    lines = ["# The params keys this notebook reads (every key: python -m workbook_lib params); "
             "papermill sets them with -p KEY VALUE or -f FILE.yaml, and also takes any other key",
             "from typing import Dict, List, Optional, Union  # for the annotations below"]
    for name in keys_read(notebook):
        f = FIELDS[name]
        lines.append(f"{f.name}: {f.type_hint} = {f.default!r}  # {_cell_comment(f.doc)}")
    lines.append('run_dir: str = "runs/interactive"  # where results go (a relative path is '
                 "taken from the repository root)")
    return "\n".join(lines)
