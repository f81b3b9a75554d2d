"""The params schema: one frozen, typed dataclass, :class:`ParamsSchema`, one field per key.

Each field has its type, default, a line of documentation, its section (the notebook that reads
it) and its check (:mod:`.checks`). **The defaults are the default run** (scale 0.1 on a laptop
CPU), so a notebook opened in JupyterLab runs as ``make report`` does.
:func:`.validation.validate` turns any source of params into a checked, read-only
:class:`.validation.Params` (attributes, mapping reads, ``replace``; it pickles and equals a dict
of its values). Each section is also a typed, frozen record (``params.loop``, ``params.ddp``,
:data:`SECTIONS`), for a function that reads one section only. :data:`FIELDS` (name ->
:class:`Field`, schema order) feeds the help text and the notebooks' parameters cells
(:mod:`.cells`).
"""
from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..catalog import STRATEGY_NAMES
from . import checks
from .checks import MAX_BUCKET_MB, MAX_TIMEOUT_S, MIN_TIMEOUT_S, MIN_TIMEOUT_WHY, Check

DEVICES = ("cpu", "cuda", "auto")
AGGRS = ("sum", "mean")
BACKENDS = ("auto", "gloo", "nccl")

S_SNAP, S_MODEL, S_MEAS = "snapshot and samples", "model", "measurement"
S_02, S_03, S_04, S_05, S_06 = ("02 cost model, benchmark, memory", "03 training loop",
                                "04 DDP", "05 verdict", "06 adopting the fix")


def param(default: Any, doc: str, section: str, check: Check | None = None, *,
          choices: tuple | None = None, placement: bool = False) -> Any:
    """One field of :class:`ParamsSchema`: its default, documentation, section and checks.

    Args:
        default: the default run's value (a list or mapping is copied for every object).
        doc: one line (or two) on what the key does, shown by ``params`` and in parameters cells.
        section: the schema section, which says which notebooks read the key.
        check: returns a problem with a value of the right type, or None (:mod:`.checks`).
        choices: the only values allowed.
        placement: the key says where the run executes, not what it measures (recorded, not
            compared by ``run --resume``).
    """
    meta = {"default": default, "doc": doc, "section": section, "check": check,
            "choices": choices, "placement": placement}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class _Section:
    """``params.<name>``: the section :data:`SECTIONS` names, cut from the params' values."""

    def __init__(self, name: str):
        self.name = name

    def __get__(self, params, owner=None):
        if params is None:
            return self
        cls = SECTIONS[self.name]
        return cls(**{f.name: getattr(params, f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True, eq=False)
class ParamsSchema(Mapping):
    """Every key of the schema, typed and read-only (see the module docstring); what a run
    gets is :class:`.validation.Params`, this with its values checked."""

    snapshot: str = param("string12",
        "spec name in data_snapshots/ (e.g. 'string12') or path to a torch.save'd HeteroData",
        S_SNAP)
    scale: float = param(0.1,
        "edge-count multiplier, 1.0 = the real graph", S_SNAP, checks.positive)
    seed: int = param(0, "seed of graph generation and perturbation sampling", S_SNAP, checks.seed)
    device: str = param("auto", "cpu, cuda or auto (cuda when available)", S_SNAP, choices=DEVICES)
    batch_sizes: list[int] = param([1, 8, 28, 64],
        "batch sizes of per-batch size figures", S_SNAP, checks.batch_list)
    perturbation_k: int | dict[int, float] = param(3,
        "genes deleted per sample: an int, or a mapping k -> probability",
        S_SNAP, checks.k_distribution)
    num_samples: int = param(332313,
        "dataset size for storage and epoch projections", S_SNAP, checks.positive)
    num_perturbations: int = param(200,
        "perturbations sampled for removed-edge and hop statistics", S_SNAP, checks.positive)
    cache_dir: str = param("data_snapshots/cache",
        "where generated graphs are cached (relative to the repository root)",
        S_SNAP, placement=True)
    hidden: int = param(32, "hidden size H (the real model: 64)", S_MODEL, checks.positive)
    layers: int = param(2, "message-passing layers (the real model: 3)", S_MODEL, checks.positive)
    aggr: str = param("sum", "neighbour aggregation: sum or mean", S_MODEL, choices=AGGRS)
    dual_forward: bool = param(True,
        "the Lazy model's dual forward (wildtype pass + perturbed pass)", S_MODEL)
    strategies: list[str] = param(list(STRATEGY_NAMES),
        "built-in strategies to compare (may be empty when 'pipelines' names two or more)",
        S_MODEL, checks.strategies)
    pipelines: list[str] = param([],
        "your own training pipelines: 'package.module:factory' or 'path/to/file.py:factory', "
        "optionally 'NAME=...'; the factory(params, graph, device) returns a pipeline "
        "(README: Diagnose your own pipeline)", S_MODEL, checks.pipeline_specs)
    cpu_allocator_cache: bool = param(True,
        "keep freed memory in the glibc heap during CPU timings (as PyTorch's CUDA caching "
        "allocator does on GPUs); without it large-batch CPU steps measure page faults", S_MEAS)
    warmup: int = param(1,
        "untimed warm-up calls or steps before anything is timed", S_MEAS, checks.at_least(0))
    min_repeats: int = param(5, "fewest timed repeats of a figure", S_MEAS, checks.positive)
    precision_target: float = param(0.10,
        "repeat a figure until its median is known to within this fraction (its 95% "
        "interval's half-width; or its time budget is spent)",
        S_MEAS, checks.fraction_open)
    time_budget_s: float = param(2.0,
        "seconds one benchmark figure may spend on repeats beyond min_repeats",
        S_MEAS, checks.positive)
    stall_timeout_s: float = param(300.0,
        "a stage of a pipeline's step (data item, collate, forward...) running this long has "
        "stalled: that pipeline is stopped and recorded, the others go on (once it has run a "
        "step, also 20x its slowest step, at least 30 s)", S_MEAS, checks.positive)
    sweep_edges: list[int] = param([20000, 50000, 100000, 200000],
        "edge counts E of the cost-model sweeps; the largest is held out of every fit",
        S_02, checks.distinct_at_least(3, "the largest is held out and the fits in E need 2 more"))
    sweep_hidden: list[int] = param([16, 32, 64],
        "hidden sizes H of the cost-model sweeps",
        S_02, checks.distinct_at_least(2, "the fit separates E x H from E"))
    sweep_p: list[float] = param([0.001, 0.01, 0.1, 0.3, 0.6],
        "removed-edge fractions p of the filter sweeps", S_02, checks.p_list)
    layer_batch_sizes: list[int] = param([1, 2, 4, 8],
        "batch sizes of the one-layer strategy comparison", S_02, checks.batch_list)
    exactness_genes: int = param(400,
        "genes of the induced subgraph on which 02 re-checks exactness", S_02, checks.at_least(2))
    bench_full_size: bool = param(False,
        "run 02's strategy benchmark at the real spec (scale 1, H=64, 3 layers) instead of "
        "this run's sizes", S_02)
    bench_min_layers: int = param(3,
        "fewest layers of 02's strategy benchmark: it runs at max(layers, this), so that the "
        "shared graph's delta form (it needs a middle layer, L >= 3) is measured; 1: the "
        "run's layers", S_02, checks.positive)
    bench_replicated_max_batch: int = param(64,
        "largest batch at which the benchmark times the replicated forms (they also need the "
        "memory estimate to fit): at the shared form's batch when allowed, else projected "
        "from B = 1, 2 and labelled so", S_02, checks.positive)
    memory_batch_sizes: list[int] = param([1, 2, 4],
        "batch sizes of the peak-memory sweep (at least 3 for a fit)",
        S_02, checks.distinct_at_least(3, "the memory fit and its residuals need 3",
                                       checks.batch_list))
    memory_full_size: bool = param(False,
        "also measure peak memory at the real spec (scale 1, H=64, 3 layers)", S_02)
    memory_budget_gb: float | None = param(None,
        "memory for the largest-batch projection (null: what the run measures on - for CPU "
        "runs the tightest of host RAM, an rlimit, a cgroup and SLURM --mem; GPU memory for "
        "CUDA runs); when set, also the benchmark's budget for the replicated forms' batch",
        S_02, checks.positive)
    batch_size_lazy: int = param(7,
        "batch of the perturbed-graph strategies (the investigation's Lazy model: 28)",
        S_03, checks.batch)
    batch_size_dango: int = param(16,
        "batch of the DANGO-style strategy (the investigation: 64)", S_03, checks.batch)
    loop_steps: int = param(10,
        "fewest timed training steps per strategy and mode", S_03, checks.positive)
    loop_max_steps: int = param(20,
        "most timed training steps per strategy and mode", S_03, checks.positive)
    loop_budget_s: float = param(110.0,
        "seconds of timed loop steps before arms stop at loop_steps", S_03, checks.positive)
    num_workers: int = param(0,
        "DataLoader worker processes (0: load in the main process)", S_03, checks.at_least(0))
    pin_memory: bool = param(False, "DataLoader pin_memory (CUDA runs)", S_03)
    persistent_workers: bool = param(False, "DataLoader persistent_workers", S_03)
    profile_wait: int = param(1,
        "torch.profiler schedule: wait steps (>= 1)", S_03, checks.at_least(1))
    profile_warmup: int = param(1,
        "torch.profiler schedule: warm-up steps (>= 1)", S_03, checks.at_least(1))
    profile_active: int = param(2, "torch.profiler schedule: recorded steps", S_03,
                                checks.positive)
    world_sizes: list[int] = param([1, 2],
        "DDP world sizes launched with torchrun", S_04, checks.non_empty_positive_list)
    backend: str = param("auto",
        "torch.distributed backend: auto (gloo/nccl), gloo, nccl", S_04, choices=BACKENDS)
    nnodes: int = param(1,
        "nodes of the torchrun launch (set by the SLURM scripts)",
        S_04, checks.positive, placement=True)
    rdzv_endpoint: str | None = param(None,
        "torchrun rendezvous host:port for several nodes (null: a free local port)",
        S_04, checks.endpoint, placement=True)
    ddp_strategy: str | None = param(None,
        "strategy or pipeline of the DDP scaling runs (null: node_mask_shared when it is among "
        "the strategies, else the slow pipeline of gap_strategies)", S_04)
    ddp_batch_size: int = param(8,
        "per-rank batch of weak scaling; strong scaling keeps ddp_batch_size x the largest "
        "world size as the global batch", S_04, checks.batch)
    ddp_steps: int = param(20, "fewest timed DDP steps per variant", S_04, checks.positive)
    ddp_budget_s: float = param(60.0,
        "seconds of timed DDP steps per world size (split over its alternated launches)",
        S_04, checks.positive)
    grad_accum_steps: int = param(2,
        "micro-batches of the accumulation comparison", S_04, checks.positive)
    bucket_cap_mb: float = param(25.0,
        "DDP gradient bucket size in MB",
        S_04, checks.positive_at_most(MAX_BUCKET_MB, "DDP takes the cap as a 64-bit byte count"))
    use_ddp_gather: bool = param(False,
        "the investigation's loss-side all-gather of predictions (the other setting is measured "
        "too)",
        S_04)
    ddp_timeout_s: float = param(300.0,
        "a launch silent this long is stopped (longer than the longest training step)",
        S_04, checks.between(MIN_TIMEOUT_S, MAX_TIMEOUT_S, MIN_TIMEOUT_WHY,
                             "the ranks' process-group timeout overflows beyond it"))
    link_bandwidth_gbps: float | None = param(None,
        "all-reduce bus bandwidth in GB/s for predictions (null: fitted here)",
        S_04, checks.positive)
    link_latency_us: float | None = param(None,
        "all-reduce latency in microseconds for predictions (null: fitted here)",
        S_04, checks.at_least(0))
    verdict_tie_tolerance: float = param(0.15,
        "exact strategies within this fraction of the fastest count as tied (ties go to the "
        "one with the least measured memory per sample)", S_05, checks.positive)
    verdict_check_equal: bool = param(False,
        "05 runs python -m workbook_lib equal on the pair when no kept outcome matches their "
        "sources (a pipeline that does not declare itself exact is then the fix only if proven "
        "equal)", S_05)
    gap_strategies: list[str] = param(["replicated_mask_cpu", "dango_wildtype"],
        "the two strategies or pipelines whose gap the verdict explains (slow, fast); when "
        "not given and 'pipelines' names two or more, the first two pipelines", S_05)
    adopt_steps: int = param(200,
        "training steps of each pipeline in notebook 06", S_06, checks.positive)
    adopt_optimizer: str = param("sgd",
        "optimizer of notebook 06's training: sgd (rounding stays rounding) or adamw (its "
        "normalised first steps turn rounding-level gradients into full-size updates)",
        S_06, choices=("sgd", "adamw"))
    adopt_lr: float = param(0.05, "learning rate of notebook 06's training", S_06, checks.positive)

    # The sections (:data:`SECTIONS`): typed, frozen records of one section's keys, handed to a
    # function that reads that section only
    data = _Section("data")  # snapshot and samples: snapshot, scale, seed, perturbation_k...
    model = _Section("model")  # hidden, layers, aggr, dual_forward, strategies, pipelines
    measure = _Section("measure")  # warmup, min_repeats, precision_target, time_budget_s...
    bench = _Section("bench")  # notebook 02: sweeps, benchmark, memory
    loop = _Section("loop")  # notebook 03: batch sizes, loop steps, DataLoader, profiler
    ddp = _Section("ddp")  # notebook 04: world sizes, backend, DDP steps and budget...
    verdict = _Section("verdict")  # notebook 05: tie tolerance, equal check, gap_strategies
    adopt = _Section("adopt")  # notebook 06: steps, optimizer, learning rate

    # The Mapping protocol: params["key"], get, in, iteration, len, ==, dict(params), {**params}.
    def __getitem__(self, key: str) -> Any:
        if key not in FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(FIELDS)

    def __len__(self) -> int:
        return len(FIELDS)

    def __setitem__(self, key: str, value: Any) -> None:
        raise TypeError(f"params are read-only (params[{key!r}] = ...): make a changed copy with "
                        f"params.replace({key}=value)")

    def __delitem__(self, key: str) -> None:
        raise TypeError(f"params are read-only (del params[{key!r}])")


@dataclass(frozen=True)
class Field:
    """One params key: its type, default, documentation and checks."""

    name: str
    type: Any  # the annotation: int, float, bool, str, list[int], float | None, ...
    default: Any
    doc: str
    section: str
    check: Check | None = None  # returns a problem or None
    choices: tuple | None = None
    placement: bool = False  # where the run executes, not what it measures

    @property
    def type_hint(self) -> str:
        """The type as papermill's parameter inspection reads it (it takes no ``|``)."""
        return type_hint(self.type)

    @property
    def type_name(self) -> str:
        """The type in words, for error messages ("a list of integers")."""
        return type_name(self.type)


def union_members(tp: Any) -> tuple:
    """The members of a union type (``int | None`` -> (int, NoneType)), else ()."""
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) \
        else ()


def type_hint(tp: Any) -> str:
    """``list[int]`` -> ``List[int]``, ``float | None`` -> ``Optional[float]``, ``int | dict[int,
    float]`` -> ``Union[int, Dict[int, float]]``."""
    members = union_members(tp)
    if members:
        rest = [m for m in members if m is not type(None)]
        if len(rest) == 1 and len(members) == 2:
            return f"Optional[{type_hint(rest[0])}]"
        return f"Union[{', '.join(type_hint(m) for m in members)}]"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        return f"List[{type_hint(args[0])}]"
    if origin is dict:
        return f"Dict[{type_hint(args[0])}, {type_hint(args[1])}]"
    return tp.__name__


_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
          type(None): "null", dict[int, float]: "a mapping k -> probability"}
_PLURALS = {int: "integers", float: "numbers", str: "strings"}


def type_name(tp: Any) -> str:
    """The type in words: ``float | None`` -> "a number or null"."""
    members = union_members(tp)
    if members:
        return " or ".join(type_name(m) for m in members)
    if typing.get_origin(tp) is list:
        return f"a list of {_PLURALS[typing.get_args(tp)[0]]}"
    return _NAMES[tp]


def _fields() -> dict[str, Field]:
    hints = typing.get_type_hints(ParamsSchema)
    return {f.name: Field(f.name, hints[f.name], **f.metadata)
            for f in dataclasses.fields(ParamsSchema)}


FIELDS: dict[str, Field] = _fields()
SCHEMA: tuple[Field, ...] = tuple(FIELDS.values())
PLACEMENT_KEYS = frozenset(f.name for f in SCHEMA if f.placement)


def _section(name: str, section: str) -> type:
    """A frozen dataclass of ``section``'s keys, with the schema's types."""
    cls = dataclasses.make_dataclass(
        name, [(f.name, f.type) for f in SCHEMA if f.section == section], frozen=True,
        namespace={"__doc__": f"The params of section '{section}', read by attribute.",
                   "SECTION": section})
    cls.__module__ = __name__
    return cls


# section class -> the schema section it holds; every key is in exactly one
DataSection = _section("DataSection", S_SNAP)
ModelSection = _section("ModelSection", S_MODEL)
MeasureSection = _section("MeasureSection", S_MEAS)
BenchSection = _section("BenchSection", S_02)
LoopSection = _section("LoopSection", S_03)
DdpSection = _section("DdpSection", S_04)
VerdictSection = _section("VerdictSection", S_05)
AdoptSection = _section("AdoptSection", S_06)
SECTIONS = {"data": DataSection, "model": ModelSection, "measure": MeasureSection,
            "bench": BenchSection, "loop": LoopSection, "ddp": DdpSection,
            "verdict": VerdictSection, "adopt": AdoptSection}


def defaults() -> dict:
    """The schema defaults: the default run, as a plain dict."""
    return {f.name: copy.deepcopy(f.default) for f in SCHEMA}
