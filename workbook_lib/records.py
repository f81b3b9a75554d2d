"""Typed results: dataclasses that go to JSON and come back as the same types.

Every experiment returns a dataclass (a :class:`Record`); notebooks write it with
``running.results.write_results`` and later readers (the verdict, ``compare``, ``stability``) get
it back with ``from_json`` and read it by attribute. The codec follows the dataclass type hints:
nested records, ``list[T]``, ``dict[K, V]`` (int keys survive JSON's string keys), ``tuple``,
``X | None`` and plain values. Non-finite floats are written as ``null`` (JSON has no NaN) and
read back as NaN where the field is a ``float``.

Written here rather than with pydantic's ``TypeAdapter`` (which the params use): this codec also
writes the NumPy and PyTorch scalars and arrays records meet without importing either library,
and non-finite floats as ``null`` read back as NaN, which pydantic needs a custom serializer and
validator per type for; it is 80 lines with nothing to configure.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T", bound="Record")


def to_json(obj: Any) -> Any:
    """Plain JSON data of ``obj`` (records, containers, numpy/torch values, paths)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_json(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):  # numpy arrays and scalars, torch tensors
        return to_json(obj.tolist())
    if hasattr(obj, "item"):
        return to_json(obj.item())
    return obj


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def from_json(tp: Any, data: Any) -> Any:
    """Rebuild a value of type ``tp`` from JSON data written by :func:`to_json`."""
    if tp is Any or tp is object:
        return data
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return from_json(arg, data)
            except (TypeError, ValueError, KeyError):
                continue
        return data
    if data is None:
        return math.nan if tp is float else None
    if dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise TypeError(f"{tp.__name__} expects an object (got {type(data).__name__})")
        hints = _hints(tp)
        kwargs = {f.name: from_json(hints[f.name], data[f.name])
                  for f in dataclasses.fields(tp) if f.init and f.name in data}
        return tp(**kwargs)
    if origin in (list, set, frozenset) or tp in (list,):
        inner = args[0] if args else Any
        return [from_json(inner, v) for v in data]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_json(args[0], v) for v in data)
        return tuple(from_json(a, v) for a, v in zip(args, data)) if args else tuple(data)
    if origin is dict or tp is dict:
        kt, vt = args if args else (Any, Any)
        return {_key(kt, k): from_json(vt, v) for k, v in data.items()}
    if tp is float:
        return float(data)
    if tp is int and isinstance(data, float) and data.is_integer():
        return int(data)
    return data


def _key(kt: Any, k: str) -> Any:
    if kt is int:
        return int(k)
    if kt is float:
        return float(k)
    return k


class Record:
    """Mixin for result dataclasses: ``to_json()`` and ``from_json(doc)``."""

    def to_json(self) -> dict:
        return to_json(self)

    @classmethod
    def from_json(cls: type[T], doc: dict) -> T:
        return from_json(cls, doc)
