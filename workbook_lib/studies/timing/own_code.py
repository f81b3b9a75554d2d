"""Which files of a profiled step are the pipeline's own code, and what its functions are called.

The pipeline's code is every file of a trace's frames outside the installed libraries and the
workbook's package (for a built-in strategy, the workbook's strategy and fix modules). For a
user's pipeline the fix's API it calls (``workbook_lib.nodemask``) is a library under its code;
the rest of the workbook is the harness that runs the steps. A frame is named by its qualified
name read from the source (``MyGather.backward``).
"""
from __future__ import annotations

import ast
import functools
import re
import sys
import sysconfig
from pathlib import Path

import workbook_lib

PACKAGE = Path(workbook_lib.__file__).resolve().parent
BUILTIN_CODE = ("strategies", "nodemask", "data")  # a built-in strategy's own code
USER_API = ("nodemask",)  # what a user's pipeline imports and calls: a library under its code
# modules a library writes at run time: PyG's propagate and edge updater of each
# MessagePassing class (torch_geometric.template: a temporary file, module name + "_" + 8)
GENERATED = re.compile(r"_(propagate|edge_updater)_\w{8}\.py$")


def _library_roots() -> list[Path]:
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    roots = {Path(p).resolve() for k in keys if (p := sysconfig.get_paths().get(k))}
    return sorted(roots)


class OwnCode:
    """``own(file)``: whose a trace's file is (the pipeline's, the harness's, a library's);
    ``own.name(frame)``: the frame's qualified name. ``builtin``: the pipeline is a built-in
    strategy.
    """

    def __init__(self, builtin: bool = False):
        self.builtin = builtin
        self.libraries = _library_roots()

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one object per profile, a few files
    def resolve(self, file: str) -> Path | None:
        """The file a trace's name stands for (tried against ``sys.path``), or None."""
        if file.startswith("<"):
            return None
        p = Path(file)
        for base in ([p] if p.is_absolute() else [Path(b or ".") / p for b in sys.path]):
            if base.is_file():
                return base.resolve()
        return None

    def __call__(self, file: str) -> str:
        """"own" (the pipeline's code), "harness" (the workbook's code that runs the steps) or
        "library" (anything else: the standard library, site-packages, generated modules, and
        for a user's pipeline the fix's API, ``workbook_lib.nodemask``)."""
        path = self.resolve(file)
        if path is None or GENERATED.search(path.name):
            return "library"
        if path.is_relative_to(PACKAGE):
            rel = path.relative_to(PACKAGE).parts
            if self.builtin and rel[0] in BUILTIN_CODE:
                return "own"
            # the fix's API called from a user's code (convert, SharedGraph) is a library
            # under that code, not the harness that runs the steps
            return "library" if rel[0] in USER_API else "harness"
        return "library" if any(path.is_relative_to(r) for r in self.libraries) else "own"

    def display(self, file: str) -> str:
        """The file as a trace names it: relative to the folder on ``sys.path`` it was imported
        from (an absolute path, as cProfile gives, is shortened the same way)."""
        p = Path(file)
        if not p.is_absolute():
            return file
        best = None
        for b in sys.path:
            base = Path(b or ".").resolve()
            if p.is_relative_to(base) and (best is None or len(base.parts) > len(best.parts)):
                best = base
        return str(p.relative_to(best)) if best is not None else p.name

    def name(self, frame) -> str:
        """``Class.method`` for a frame (by its file and first line), else its bare name; a
        comprehension or lambda (``<listcomp>``) within the function that holds its line."""
        path = self.resolve(frame.file)
        if path is None:
            return frame.function
        if frame.function.startswith("<"):
            inside = self._holding(path, frame.line)
            return f"{inside[1]}.{frame.function}" if inside else frame.function
        return _functions(str(path))[0].get(frame.line) or frame.function

    def enclosing(self, frame):
        """A comprehension's or lambda's frame (``<genexpr>``): the frame of the function whose
        body holds it (its ``def`` line), as one of its callers means that function; any other
        frame, or one whose source cannot be read, as it is."""
        if not frame.function.startswith("<"):
            return frame
        inside = self._holding(self.resolve(frame.file), frame.line)
        if inside is None:
            return frame
        lo, q = inside
        return type(frame)(frame.file, lo, q.rsplit(".", 1)[-1])

    def def_line(self, file: str, first: int) -> int:
        """The ``def`` line of the function whose code starts at line ``first`` of ``file`` (a
        decorated one's first decorator names it), or, for a comprehension's or lambda's code,
        of the function that holds it; ``first`` where the source cannot be read."""
        path = self.resolve(file)
        if path is None:
            return first
        starts, _, defs = _functions(str(path))
        if first in starts:
            return defs.get(first, first)
        inside = self._holding(path, first)
        return inside[0] if inside else first

    @staticmethod
    def _holding(path: Path | None, line: int) -> tuple[int, str] | None:
        """The innermost function of the source file ``path`` whose body holds ``line``: its
        ``def`` line and qualified name; None where none does or the file cannot be read."""
        if path is None:
            return None
        inside = [(lo, q) for lo, hi, q in _functions(str(path))[1] if lo <= line <= hi]
        return inside[-1] if inside else None

    def line(self, frame) -> int:
        """The frame's ``def`` line: a decorated function's code starts at its first decorator
        (found by a user trial: a custom backward named at its ``@staticmethod`` line)."""
        path = self.resolve(frame.file)
        return frame.line if path is None else _functions(str(path))[2].get(frame.line,
                                                                            frame.line)


@functools.lru_cache(maxsize=256)
def _functions(path: str) -> tuple[dict[int, str], list[tuple[int, int, str]], dict[int, int]]:
    """For every function of a source file, from one parse: first line (its ``def`` line and
    each decorator's) -> qualified name; (first line, last line, qualified name), outer first;
    and a decorated function's first decorator's line -> its ``def`` line."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return {}, [], {}
    starts: dict[int, str] = {}
    spans: list[tuple[int, int, str]] = []
    defs: dict[int, int] = {}

    def walk(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                q = prefix + child.name
                for line in [child.lineno, *(d.lineno for d in child.decorator_list)]:
                    starts.setdefault(line, q)
                if child.decorator_list:
                    defs[min(d.lineno for d in child.decorator_list)] = child.lineno
                spans.append((child.lineno, child.end_lineno or child.lineno, q))
                walk(child, q + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)
    walk(tree, "")
    return starts, spans, defs
