"""The checks of single params values, and the limits they enforce.

Each check takes a value already of its field's type and returns a problem (the rest of a
sentence that starts with the key: "must be positive") or None. :mod:`.schema` names one per
field; :func:`.validation.validate` runs it and adds the key, the source and the value.
"""
from __future__ import annotations

from typing import Any, Callable

from ..catalog import STRATEGY_NAMES
from .specs import parse_specs, spec_problem

Check = Callable[[Any], "str | None"]

MAX_BATCH = 65_536  # samples per batch: even the node-mask shared graph holds B x N x H floats
                    # (110 GB at B = 65,536 for the real spec), the replicated ones B graphs
MAX_SEED = 2**32 - 1  # numpy's legacy seeding and DataLoader workers take 32-bit seeds
MAX_INT = 2**62  # anything larger overflows torch's int64 arithmetic somewhere
MAX_TIMEOUT_S = 1e6  # ~11.6 days; the ranks' process-group timeout is a timedelta (and a C++
                     # duration): far larger values overflow in notebook 04's ranks
MIN_TIMEOUT_S = 5.0  # a rank's progress reaches the launcher with its heartbeat, once a second
                     # (later on a loaded machine): a shorter stall limit stops healthy launches
                     # (a minimum, not a safe value: the limit must also exceed the longest step)
MIN_TIMEOUT_WHY = "ranks report progress once a second: a shorter limit stops healthy launches"
MAX_BUCKET_MB = 1 << 20  # 1 TiB; DDP turns the cap into an int64 byte count


def _num(x: float) -> str:
    """A bound as a reader reads it: '1,000,000', '0.5'."""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:g}"


def positive(v) -> str | None:
    return None if v > 0 else "must be positive"


def positive_at_most(limit: float, why: str) -> Check:
    """``0 < v <= limit``, the limit with its reason (NaN named as such, as :func:`between`
    does).

    Args:
        limit: the largest value allowed.
        why: the limit's reason, said with it.
    """
    def check(v):
        if v != v:
            return "must be a positive number (got NaN)"
        if v <= 0:
            return "must be positive"
        return None if v <= limit else f"must be at most {limit:,.0f} ({why})"
    return check


def between(low: float, high: float, why_low: str, why_high: str) -> Check:
    """``low <= v <= high``, each bound with its reason (NaN is neither: it is named as such,
    not told that it is too large). Params files refuse NaN before any check
    (:mod:`.validation`); a check called directly says it too.

    Args:
        low: the smallest value allowed; why_low: its reason.
        high: the largest value allowed; why_high: its reason.
    """
    def check(v):
        if v != v:
            return f"must be a number from {_num(low)} to {_num(high)} (got NaN)"
        if v < low:
            return f"must be at least {low:g} ({why_low})"
        return None if v <= high else f"must be at most {high:,.0f} ({why_high})"
    return check


def at_least(n: int) -> Check:
    return lambda v: None if v >= n else f"must be >= {n}"


def batch(v) -> str | None:
    if v <= 0:
        return "must be positive"
    return None if v <= MAX_BATCH else (
        f"must be at most {MAX_BATCH:,} (a batch holds B x genes x hidden floats even in the "
        "node-mask shared graph: larger batches fit no device's memory)")


def non_empty_positive_list(v) -> str | None:
    if len(v) == 0:
        return "must be a non-empty list"
    if any(x <= 0 for x in v):
        return "every entry must be positive"
    return None


def batch_list(v) -> str | None:
    problem = non_empty_positive_list(v)
    if problem:
        return problem
    return None if max(v) <= MAX_BATCH else (
        f"entries must be at most {MAX_BATCH:,} (a batch holds B x genes x hidden floats even "
        "in the node-mask shared graph: larger batches fit no device's memory)")


def distinct_at_least(n: int, why: str, check: Check | None = None) -> Check:
    def f(v):
        problem = (check or non_empty_positive_list)(v)
        if problem:
            return problem
        return None if len(set(v)) >= n else f"needs at least {n} distinct values ({why})"
    return f


def endpoint(v) -> str | None:
    host, sep, port = v.rpartition(":")
    if not sep or not host or len(v) > 255 or not port.isdigit() or not 0 < int(port) < 65536:
        return "must be host:port (port 1..65535)"
    return None


def seed(v) -> str | None:
    return None if 0 <= v <= MAX_SEED else f"must be in 0..{MAX_SEED} (a 32-bit seed: numpy's " \
        "legacy seeding and DataLoader workers take no more)"


def fraction_open(v) -> str | None:
    return None if 0.0 < v < 1.0 else "must be in (0, 1)"


def p_list(v) -> str | None:
    if not v:
        return "must be a non-empty list"
    return None if all(0.0 <= x < 1.0 for x in v) else "entries must be in [0, 1)"


def strategies(v) -> str | None:
    bad = [s for s in v if s not in STRATEGY_NAMES]
    if bad:
        return f"unknown strategies {bad}; valid: {list(STRATEGY_NAMES)}"
    if len(set(v)) != len(v):
        return "must not repeat a strategy"
    return None


def pipeline_specs(v) -> str | None:
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


def k_distribution(value) -> str | None:
    """``perturbation_k``: an int >= 0, or a mapping k -> probability summing to 1."""
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
