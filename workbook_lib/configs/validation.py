"""Validating params: a mapping in, a :class:`Params` out, or one line that says what is wrong,
before any work starts.

An unknown key gets a "did you mean", a wrong type or impossible value names the key and the
value, missing keys take the schema default. Types are the annotations of
:class:`.schema.ParamsSchema`, checked by a strict pydantic ``TypeAdapter`` (a mapping's keys
excepted: JSON writes them as strings). A string for a non-string key is read as YAML first,
as command lines (``papermill -p batch_sizes "[1, 2]"``) pass strings. ``placement`` keys are
recorded but not compared by ``run --resume`` (:func:`results_relevant`).
"""
from __future__ import annotations

import difflib
import functools
import math
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import ConfigDict, Strict, TypeAdapter, ValidationError

from ..exceptions import ParamsError
from .checks import MAX_INT
from .filesystem import (cache_dir_usable, max_scale, path_check, snapshot_exists,
                         snapshot_spec)
from .loading import check_size, load_yaml, read_params_file, show
from .schema import FIELDS, PLACEMENT_KEYS, Field, ParamsSchema, union_members, defaults
from .specs import normalize, parse_specs


def _accepts(tp: Any, plain: type) -> bool:
    """Whether ``tp`` is ``plain`` or a union holding it."""
    return tp is plain or plain in union_members(tp)


def coerce(field: Field, value: Any) -> Any:
    """A string for a non-string key is read as YAML (command lines pass strings); a tuple is
    a list."""
    tp = field.type
    if isinstance(value, str) and not _accepts(tp, str):
        try:
            parsed = load_yaml(value, f"'{field.name}'", key=field.name)
        except ParamsError as exc:
            if "not valid YAML" in str(exc):
                return value
            raise
        if isinstance(parsed, str) and _accepts(tp, float):
            try:
                return float(parsed)
            except ValueError:
                return value
        return parsed
    if _accepts(tp, type(None)) and isinstance(value, str) and value.strip().lower() in (
            "null", "none", "~", ""):
        return None
    return list(value) if isinstance(value, tuple) else value


class Params(ParamsSchema):
    """Validated params (see :mod:`.schema`): built by :func:`validate` (or
    :func:`load_params_file`), which checks every value; ``Params()`` holds the defaults."""

    def replace(self, **changes: Any) -> Params:
        """A copy with ``changes``, validated as a whole by :func:`validate` (not
        ``dataclasses.replace``, which would check nothing and refuse a misspelt key without a
        "did you mean").

        Raises:
            ParamsError: an unknown key (with "did you mean"), or a bad value, in one line.
        """
        return validate({**self, **changes})


@functools.cache
def _adapter(tp: Any) -> TypeAdapter:
    """A strict validator of ``tp``: an int given for a float becomes a float; a mapping's keys
    are read laxly ('2' is 2)."""
    def lax_keys(t):
        if typing.get_origin(t) is dict:
            key, value = typing.get_args(t)
            return dict[Annotated[key, Strict(False)], value]
        members = union_members(t)
        return typing.Union[tuple(lax_keys(m) for m in members)] if members else t
    return TypeAdapter(lax_keys(tp), config=ConfigDict(strict=True))


def _not_finite(value: Any) -> str | None:
    """A NaN or infinite number, or an integer beyond :data:`MAX_INT`, anywhere in a value."""
    items = value if isinstance(value, (list, tuple)) else (
        [*value.keys(), *value.values()] if isinstance(value, dict) else [value])
    for x in items:
        if isinstance(x, float) and not math.isfinite(x):
            return f"must hold finite numbers (got {show(x)})"
        if isinstance(x, int) and not isinstance(x, bool) and abs(x) > MAX_INT:
            return f"holds {show(x)}, beyond what int64 arithmetic takes (at most 2**62)"
    return None


def suggest(key: str) -> str:
    """' (did you mean 'x'?)' for a misspelt key, else ''."""
    close = difflib.get_close_matches(key, list(FIELDS), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def unknown_key_error(keys: list[str], source: str) -> ParamsError:
    parts = [f"'{k}'{suggest(k)}" for k in keys]
    return ParamsError(f"{source}: unknown params key(s) {', '.join(parts)}; "
                       "`python -m workbook_lib params` lists every key",
                       key=keys[0], value=None)


def validate(raw: Mapping | None, *, source: str = "params") -> Params:
    """Validate a params mapping and return it complete and normalised, as a read-only
    :class:`Params`.

    Args:
        raw: a mapping from a params file, ``--set`` or papermill (``None``: empty); a
            :class:`Params`, or a dict copy of one, is checked again.
        source: where it came from, named in error messages.

    Raises:
        ParamsError: an unknown key, a wrong type or an impossible value, before any work.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ParamsError(f"{source}: expected a mapping of params, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in set(raw) - set(FIELDS))
    if unknown:
        raise unknown_key_error(unknown, source)
    out = defaults()
    for key, value in raw.items():
        field = FIELDS[key]
        check_size(value, f"{source}: '{key}'", key=key)
        try:
            norm = _adapter(field.type).validate_python(coerce(field, value))
        except ValidationError:
            raise ParamsError(f"{source}: '{key}' must be {field.type_name} "
                              f"(got {show(value)})", key=key, value=value) from None
        problem = _not_finite(norm) if norm is not None else None
        if problem:
            raise ParamsError(f"{source}: '{key}' {problem}", key=key, value=value)
        try:
            if field.choices is not None and norm not in field.choices:
                raise ParamsError(f"{source}: '{key}' must be one of {list(field.choices)} "
                                  f"(got {show(norm)})", key=key, value=value)
        except TypeError:  # an unhashable value
            raise ParamsError(f"{source}: '{key}' must be one of {list(field.choices)} "
                              f"(got {show(norm)})", key=key, value=value) from None
        problem = field.check(norm) if field.check is not None and norm is not None else None
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
    return Params(**out)


def ddp_strategy(params: Params) -> str:
    """The pipeline notebook 04's scaling runs train: ``ddp_strategy`` when set, else the
    node-mask shared graph when it is among the strategies, else the slow pipeline of
    ``gap_strategies`` (the user's own, on a run without built-in strategies)."""
    if params.ddp_strategy is not None:
        return params.ddp_strategy
    if "node_mask_shared" in params.strategies:
        return "node_mask_shared"
    compared = list(params.strategies) + [s.name for s in parse_specs(params.pipelines)]
    return (list(params.gap_strategies) or compared)[0]


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
    path_check(out, source, "snapshot", snapshot_exists)
    spec = snapshot_spec(out["snapshot"])
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
        path_check(out, source, "cache_dir", cache_dir_usable)
    if out["exactness_genes"] <= kmax:
        fail("exactness_genes", f"must exceed the largest perturbation_k ({kmax})")
    gbatch = out["ddp_batch_size"] * max(out["world_sizes"])
    bad = [w for w in out["world_sizes"] if gbatch % w]
    if bad:
        fail("world_sizes", f"must each divide the strong-scaling global batch "
                            f"ddp_batch_size x max(world_sizes) = {gbatch} ({bad} do not)")


def check_gap(params: Params, notebooks: list[str]) -> None:
    """Refuse, in one line and before any work, notebooks that compare two pipelines (04, 05,
    06) when the params compare one.

    Raises:
        ParamsError: ``gap_strategies`` is empty and a notebook named needs it.
    """
    from ..catalog import BY_NAME

    need = [n for n in notebooks if n in BY_NAME and BY_NAME[n].needs_gap]
    if need and not params.gap_strategies:
        one = list(params.strategies) + [s.name for s in parse_specs(params.pipelines)]
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


def load_params_file(path: str | Path) -> Params:
    """Read and validate a params YAML file (see :func:`.loading.find_params_file`)."""
    p, raw = read_params_file(path)
    return validate(raw, source=str(p))


PARAMS_FILE = "params.yaml"  # a run folder's copy of the params its last run used


def params_file_name(params: Params) -> str:
    """``params-<8 hex>.yaml``: a run folder's copy of ``params`` named by its content, so the
    name always means these values (05's command names it; :data:`PARAMS_FILE` is rewritten
    by the folder's next run, with other params maybe: a review)."""
    import hashlib

    return f"params-{hashlib.sha256(params_yaml(params).encode()).hexdigest()[:8]}.yaml"


def params_yaml(params: Params) -> str:
    """``params``, every key, as a params file that :func:`load_params_file` reads back to the
    same values: a run folder's :data:`PARAMS_FILE`, which ``--params`` takes to check or rerun
    exactly what the run measured."""
    import yaml

    from ..records import to_json

    return ("# the params this run used, every key: --params THIS_FILE runs with the same "
            "values\n" + yaml.safe_dump(to_json(params), sort_keys=False))


def same_params(path: str | Path, params: Params) -> bool:
    """Whether the params file at ``path`` holds ``params``' values (False where it is missing
    or does not validate)."""
    from ..records import to_json

    try:
        return to_json(load_params_file(path)) == to_json(params)
    except (OSError, ParamsError, ValueError):
        return False


def results_relevant(params: dict) -> dict:
    """The params a run's results depend on (without the ``placement`` keys)."""
    return {k: v for k, v in params.items() if k not in PLACEMENT_KEYS}


def check_against_graph(params: Params, num_genes: int) -> None:
    """Checks that need the loaded graph (e.g. a user-supplied HeteroData)."""
    kmax = max_k(params.perturbation_k)
    if kmax > num_genes:
        raise ParamsError(
            f"'perturbation_k' must not exceed the gene count of the snapshot ({num_genes}) "
            f"(got {params['perturbation_k']!r})", key="perturbation_k",
            value=params.perturbation_k)
    if params.exactness_genes > num_genes:
        raise ParamsError(f"'exactness_genes' must not exceed the gene count of the snapshot "
                          f"({num_genes}) (got {params['exactness_genes']})",
                          key="exactness_genes", value=params.exactness_genes)
