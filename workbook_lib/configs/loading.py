"""Reading params YAML safely: a params file, a ``--set`` value, a papermill string.

:func:`load_yaml` is PyYAML's safe loader with duplicate keys refused, a size cap, and caps on
nesting and on expansion through anchors and aliases (a "billion laughs"); PyYAML has no option
for either, hence this small loader. :func:`show` cuts a value shown in an error to a readable
length; :func:`read_params_file` finds and reads a ``--params`` file without validating it.
"""
from __future__ import annotations

import re
import reprlib
from pathlib import Path
from typing import Any

import yaml

from ..common.text import one_line
from ..exceptions import ParamsError
from ..paths import PARAMS_DIR, resolve_path

MAX_FILE_BYTES = 1 << 20  # a params file is a few kB; more is not a params file
MAX_VALUES = 10_000  # values (list entries, mapping entries) one params key may expand to
MAX_DEPTH = 8  # nesting of one value (the schema needs 2: a mapping k -> probability)

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
        problem = one_line(_yaml_problem(exc), 200, keep_end=True)
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
