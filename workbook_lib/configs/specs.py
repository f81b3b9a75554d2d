"""``pipelines`` entries as plain strings: ``"TARGET"`` or ``"NAME=TARGET"``, TARGET being
``package.module:factory`` or ``path/to/file.py:factory``.

Parsed and checked here, with the schema (a bad entry is refused before any work); importing and
building them is ``pipelines.loading``'s. ``equal``'s ``--map OLD=NEW`` renames are parsed here
too: the command line checks its arguments before PyTorch loads.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..catalog import STRATEGY_NAMES
from ..paths import resolve_path

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


def parse_renames(entries: list[str] | None) -> dict[str, str]:
    """``["OLD=NEW", ...]`` as a dict; OLD is a slow-model parameter name or module prefix.

    Args:
        entries: the ``--map`` values.

    Raises:
        ValueError: an entry without ``=``, an empty side, or OLD given twice.
    """
    out: dict[str, str] = {}
    for e in entries or []:
        old, sep, new = (s.strip() for s in e.partition("="))
        if not sep or not old or not new:
            raise ValueError(f"--map expects SLOW_NAME=FAST_NAME (got {e!r})")
        if old in out:
            raise ValueError(f"--map names {old!r} twice")
        out[old] = new
    return out
