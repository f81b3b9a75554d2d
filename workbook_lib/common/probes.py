"""The mark on hooks the workbook puts on a user's modules only to measure them (``equal``'s
rounding probe): code that refuses a user's own hooks (:mod:`workbook_lib.nodemask`'s
conversion, whose plan does not call every module) passes these by. A review found the first
way round, leaving a converted encoder's modules unhooked, unprobed the user's plain encoder
where the same model also ran it."""
from __future__ import annotations

from typing import Callable

PROBE_MARK = "workbook_probe"


def mark_probe(fn: Callable) -> Callable:
    """``fn``, marked as a measuring hook (:func:`is_probe`)."""
    setattr(fn, PROBE_MARK, True)
    return fn


def is_probe(hook: Callable) -> bool:
    """Whether ``hook`` (a function or a bound method) is marked as a measuring hook."""
    return bool(getattr(hook, PROBE_MARK, False))
