"""The package's floors: every import goes down (or stays on its floor), and no module imports
itself back through others.

The floors are ``workbook_lib.LAYERS`` (bottom first), the one table of them; the package
docstring's map names the same floors in the same order (checked here). Every module of
``workbook_lib`` is parsed with :mod:`ast` (no import runs): imports inside functions count, and
so do imports under ``if TYPE_CHECKING:`` (a cycle a type checker needs is still a cycle;
``from __future__`` does not), and so do
imports by name (:func:`by_name`: ``importlib.import_module("workbook_lib.x")``, or a
``"workbook_lib.x:Name"`` string that something imports later), which no import statement shows.
A module's
room is its first name below ``workbook_lib`` (``workbook_lib.data.snapshots`` -> ``data``); the
package's own ``__init__`` is on the bottom floor. ``ast`` is used rather than a tool such as
import-linter or grimp because the rule here is this project's table with a short, reasoned
allow-list, and counting climbs and cycles of a parsed module graph is a few lines.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import workbook_lib

PKG = "workbook_lib"
ROOT = Path(workbook_lib.__file__).resolve().parent

# (importing module, imported module) -> why this import may climb. At most 3.
ALLOWED_CLIMBS = {
    ("workbook_lib.running.notebook", "workbook_lib.report.plotting"):
        "a notebook's setup applies the report's figure style before its first cell",
}


def module_files(root: Path, pkg: str = PKG) -> dict[str, Path]:
    """Every module of the package under ``root``: dotted name -> file."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [pkg, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(node: ast.AST, module: str, is_pkg: bool, modules: set[str]) -> list[str]:
    """The package's modules that an import statement names (a name imported from a package
    that is a module of its own counts as that module)."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        if node.module == "__future__":
            return []
        if node.level:
            base = module.split(".") if is_pkg else module.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        names = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin
                 for a in node.names]
    out = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.append(name)
    return out


IMPORTERS = {"import_module", "__import__", "find_spec"}


def by_name(node: ast.AST, module: str, modules: set[str], pkg: str = PKG) -> list[str]:
    """The package's modules a node imports by name: the first argument of
    ``importlib.import_module`` (``__import__``, ``find_spec``) when it is a string of the
    package, or a ``"pkg.module:Name"`` string anywhere (the form a by-name table or set-up hook
    takes). A name built at run time (``f"{__name__}:setup"``, a user's module) is not seen:
    the module that builds it imports what it names itself.

    ``measurement.memory`` runs ``importlib.import_module`` on the set-up its caller names
    (``training.step_memory`` passes its own ``module:function``): the name comes from the
    caller's floor, so it is no edge of ``measurement``; ``pipelines.loading`` imports users'
    modules, outside the package."""
    text = None
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        arg = node.args[0].value
        if called in IMPORTERS and isinstance(arg, str) and \
                (arg == pkg or arg.startswith(pkg + ".")):
            text = arg
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
            re.fullmatch(rf"{pkg}(\.\w+)*:\w+", node.value):
        text = node.value.partition(":")[0]
    if text is None:
        return []
    while text and text not in modules:
        text = text.rpartition(".")[0]
    return [text] if text and text != module else []


def import_graph(root: Path, pkg: str = PKG) -> dict[str, set[str]]:
    """module -> the package's modules it imports (at any depth of its code, ``if TYPE_CHECKING:``
    included), by an import statement or by name (:func:`by_name`)."""
    files = module_files(root, pkg)
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_pkg = path.name == "__init__.py"
        found: set[str] = set()

        def visit(node: ast.AST) -> None:
            for child in ast.iter_child_nodes(node):
                visit_one(child)

        def visit_one(node: ast.AST) -> None:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(_imported(node, module, is_pkg, modules))
            else:
                found.update(by_name(node, module, modules, pkg))
            visit(node)

        visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        graph[module] = found
    return graph


def room(module: str, pkg: str = PKG) -> str:
    return module.split(".")[1] if module != pkg else "__init__"


def floors(layers, modules, pkg: str = PKG) -> dict[str, int]:
    """module -> its floor (0 = bottom). Raises ValueError for a module in no floor."""
    floor_of = {r: i for i, rooms in enumerate(layers) for r in rooms}
    floor_of["__init__"] = 0
    missing = sorted(m for m in modules if room(m, pkg) not in floor_of)
    if missing:
        raise ValueError(f"modules in no floor of LAYERS: {missing}")
    return {m: floor_of[room(m, pkg)] for m in modules}


def climbs(graph: dict[str, set[str]], floor: dict[str, int]) -> list[tuple[str, str]]:
    """Imports from a lower floor to a higher one."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if floor[b] > floor[a])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


MAP_LINE = re.compile(r"^(\d+)\s+((?:``[\w/]+``(?:,\s*)?)+)")


def map_floors(doc: str) -> list[tuple[str, ...]]:
    """The floors the package docstring's map names, bottom first: lines that start with a
    floor number, then the rooms in double backquotes (a trailing ``/`` marks a folder)."""
    out = []
    for line in doc.splitlines():
        m = MAP_LINE.match(line)
        if m:
            assert int(m.group(1)) == len(out), \
                f"map floor numbered {m.group(1)}, expected {len(out)}"
            out.append(tuple(r.strip("/") for r in re.findall(r"``([\w/]+)``", m.group(2))))
    return out


# ----------------------------------------------------------------------------------- the package

GRAPH = import_graph(ROOT)


def test_every_module_is_on_a_floor_and_every_room_exists():
    floors(workbook_lib.LAYERS, GRAPH)  # raises for a module in no floor
    rooms = [r for rs in workbook_lib.LAYERS for r in rs]
    assert len(rooms) == len(set(rooms)), "a room on two floors"
    for r in rooms:
        assert (ROOT / r).is_dir() or (ROOT / f"{r}.py").is_file(), f"LAYERS names {r}: none such"


def test_the_docstring_map_names_the_floors_in_order():
    drawn = map_floors(workbook_lib.__doc__)
    assert drawn == [tuple(f) for f in workbook_lib.LAYERS]
    for rooms in drawn:
        for r in rooms:
            assert (ROOT / r).is_dir() or (ROOT / f"{r}.py").is_file(), f"the map names {r}"


def test_imports_go_down_except_the_allowed_few():
    assert len(ALLOWED_CLIMBS) <= 3
    floor = floors(workbook_lib.LAYERS, GRAPH)
    found = climbs(GRAPH, floor)
    unexpected = [f"{a} (floor {floor[a]}) -> {b} (floor {floor[b]})" for a, b in found
                  if (a, b) not in ALLOWED_CLIMBS]
    assert not unexpected, "imports that climb: " + "; ".join(unexpected)
    stale = sorted(set(ALLOWED_CLIMBS) - set(found))
    assert not stale, f"allowed climbs that no longer happen (drop them): {stale}"


def test_no_import_cycle():
    assert cycles(GRAPH) == []


def test_measurement_knows_nothing_of_pipelines_or_params():
    above = {"configs", "data", "strategies", "pipelines", "training", "running", "report"}
    for m, targets in GRAPH.items():
        if room(m) == "measurement":
            assert not {room(t) for t in targets} & above, (m, sorted(targets))


# The whole params stop at the studies, the CLI and the pipeline factories (whose protocol
# hands a user's factory the whole params): below them a function takes the section or the
# values it reads. These few take the whole params, for the reason given.
WHOLE_PARAMS = {
    "training/factory.py:build_run": "turns params into a run: graph, strategy, model, batch",
    "training/step_memory.py:measure_point": "a fresh process builds a pipeline by its factory",
    "report/terminal.py:params_lines": "renders every key",
    "report/html.py:index_page": "renders every key", "report/html.py:write_index": "the same",
}
BELOW_STUDIES = {"common", "data", "strategies", "nodemask", "measurement", "traces", "results",
                 "training", "report", "distributed"}


def whole_params_takers(root: Path, rooms: set[str]) -> list[str]:
    """``file:function`` of every function in ``rooms`` with a parameter named ``params`` (or
    ``P``) or annotated ``Params``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] not in rooms:
            continue
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
            if any(a.arg in ("params", "P") or (a.annotation is not None and "Params" in
                                                 ast.unparse(a.annotation)) for a in args):
                out.append(f"{rel.as_posix()}:{fn.name}")
    return out


def test_below_the_studies_functions_take_a_section_or_values_not_the_params():
    takers = whole_params_takers(ROOT, BELOW_STUDIES)
    assert sorted(set(takers) - set(WHOLE_PARAMS)) == []
    assert set(WHOLE_PARAMS) <= set(takers)  # the list names what is there


def test_the_params_rule_sees_a_name_and_an_annotation(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "m.py").write_text(
        "def a(params): pass\ndef b(x: Params): pass\ndef c(data: DataSection): pass\n")
    assert whole_params_takers(tmp_path, {"data"}) == ["data/m.py:a", "data/m.py:b"]


# ------------------------------------------------------------------------------ the tool itself

def _write(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


def test_the_tool_sees_climbs_lazy_imports_and_cycles(tmp_path):
    pkg = _write(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from ..high import b\n",  # a lazy import: a climb
        "low/c.py": "from __future__ import annotations\nfrom . import a\n",
        "high/__init__.py": "",
        "high/b.py": "import pkg.low.c\nfrom pkg.low import a as x\n",
        "high/d.py": "from .b import *\n",
    })
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.low.a"] == {"pkg.high.b"}
    assert graph["pkg.low.c"] == {"pkg.low.a"}
    assert graph["pkg.high.b"] == {"pkg.low.c", "pkg.low.a"}
    floor = floors([("low",), ("high",)], graph, "pkg")
    assert climbs(graph, floor) == [("pkg.low.a", "pkg.high.b")]
    assert cycles(graph) == [["pkg.high.b", "pkg.low.a", "pkg.low.c"]]
    with pytest.raises(ValueError, match="pkg.high.b"):
        floors([("low",)], graph, "pkg")


def test_the_tool_sees_imports_by_name(tmp_path):
    """A by-name import that climbs fails like an import statement would; a name in prose, a
    non-package module or a name built at run time is no edge."""
    pkg = _write(tmp_path, {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": ("import importlib\n"
                     "def f():\n    return importlib.import_module('pkg.high.b')\n"),
        "low/c.py": "TYPES = {'x': 'pkg.high.b:Thing'}\n",
        "low/d.py": ("import importlib\nfrom importlib import import_module\n"
                     "NOTE = 'see pkg.high.b for the Thing'\n"
                     "def g(name):\n    importlib.import_module(name)\n"
                     "    import_module('json')\n    return import_module(f'{__name__}:x')\n"),
        "high/__init__.py": "",
        "high/b.py": "Thing = 1\n",
    })
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.low.a"] == {"pkg.high.b"}
    assert graph["pkg.low.c"] == {"pkg.high.b"}
    assert graph["pkg.low.d"] == set()
    floor = floors([("low",), ("high",)], graph, "pkg")
    assert climbs(graph, floor) == [("pkg.low.a", "pkg.high.b"), ("pkg.low.c", "pkg.high.b")]


def test_the_package_imports_nothing_of_its_own_by_name():
    """Today no module imports one of the package's modules by name (``running.results`` imports
    the notebooks' result types from ``results/``): a new one is an edge the floors check, and
    this test says where it is."""
    seen = {}
    for module, path in module_files(ROOT).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in by_name(node, module, set(GRAPH)):
                seen.setdefault(module, set()).add(target)
    assert seen == {}


def test_the_tool_counts_type_checking_imports(tmp_path):
    pkg = _write(tmp_path, {
        "__init__.py": "",
        "low.py": ("from typing import TYPE_CHECKING\nimport typing\nif TYPE_CHECKING:\n"
                   "    from .high import B\nif typing.TYPE_CHECKING:\n    from . import other\n"),
        "high.py": "from .low import *\n",
        "other.py": "",
    })
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.low"] == {"pkg.high", "pkg.other"}
    floor = floors([("low", "other"), ("high",)], graph, "pkg")
    assert climbs(graph, floor) == [("pkg.low", "pkg.high")]
    assert cycles(graph) == [["pkg.high", "pkg.low"]]


def test_the_map_parser_reads_floor_lines_only():
    doc = ("Intro ``configs/`` in prose.\n\n0  ``paths``, ``common/``: the bottom\n"
           "    ``files``  a sub-entry\n1  ``configs/``   ``params``: the schema\n")
    assert map_floors(doc) == [("paths", "common"), ("configs",)]
    with pytest.raises(AssertionError, match="numbered 2"):
        map_floors("0  ``a``\n2  ``b``\n")


PICTURE_LINE = re.compile(r"^(\d+)\s+((?:[\w/]+, )*[\w/]+)(?:\s{2,}(.*))?$")


def picture_floors(page: str) -> list[tuple[int, tuple[str, ...], str]]:
    """The map drawn at the top of docs/development.md (its first ``text`` block), top floor
    first: (floor, its rooms as written, ``/`` marking a folder, and its description with
    the lines that continue it)."""
    block = page.split("```text\n", 1)[1].split("```", 1)[0]
    out: list[tuple[int, tuple[str, ...], str]] = []
    for line in block.splitlines()[1:]:  # the first line is the header
        m = PICTURE_LINE.match(line)
        if m:
            out.append((int(m.group(1)), tuple(m.group(2).split(", ")), m.group(3) or ""))
        elif out and line.strip():
            n, rooms, text = out[-1]
            out[-1] = (n, rooms, f"{text} {line.strip()}")
    return out


def test_the_development_page_opens_with_the_map_of_every_folder():
    """docs/development.md opens with the picture of the floors (top floor first, imports going
    down): it names the rooms of ``LAYERS`` floor by floor in their order, a folder with a
    ``/``, and every sub-package on its room's floor, so it cannot go stale without this
    failing."""
    page = (ROOT.parent / "docs" / "development.md").read_text(encoding="utf-8")
    first = re.search(r"^## (.*)$", page, flags=re.M).group(1)
    assert first == "The map of `workbook_lib`", "the map opens the page"
    assert page.index("```text") < page.index("\n## ", page.index("## The map")), "its picture"
    drawn = picture_floors(page)
    top = len(workbook_lib.LAYERS) - 1
    assert [n for n, _, _ in drawn] == list(range(top, -1, -1)), "floors, top first, each once"
    for n, rooms, text in drawn:
        assert tuple(r.rstrip("/") for r in rooms) == tuple(workbook_lib.LAYERS[n]), (n, rooms)
        for r in rooms:
            name = r.rstrip("/")
            is_dir = (ROOT / name).is_dir()
            assert is_dir == r.endswith("/"), f"floor {n}: {r} (a folder ends with '/')"
            if is_dir:
                for sub in sorted((ROOT / name).iterdir()):
                    if (sub / "__init__.py").is_file():
                        assert f"{sub.name}/" in text, f"floor {n}: {name}/{sub.name}/ not drawn"
    folders = {d.name for d in ROOT.iterdir() if (d / "__init__.py").is_file()}
    assert folders <= {r.rstrip("/") for _, rooms, _ in drawn for r in rooms if r.endswith("/")}


def test_no_module_over_500_lines_outside_nodemask():
    """Every module outside ``nodemask/`` (the fix's API, its kernels kept whole) is at most
    500 lines: a longer one is split into modules named for what they hold."""
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
            if "nodemask" not in p.relative_to(ROOT).parts
            and (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert long == {}


def _fresh(code: str) -> str:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip()


def test_the_records_load_without_pytorch():
    """Reading a results file (compare, stability, the verdict's inputs) never imports PyTorch:
    every module of ``results`` in a fresh interpreter."""
    out = _fresh("import importlib, pkgutil, sys\n"
                 "import workbook_lib.results as R\n"
                 "for m in pkgutil.iter_modules(R.__path__):\n"
                 "    importlib.import_module('workbook_lib.results.' + m.name)\n"
                 "print('torch' in sys.modules)")
    assert out == "False"


def test_views_import_no_experiment():
    """A view renders records: importing every view module (in a fresh interpreter) imports no
    study, training or measurement module."""
    out = _fresh("import importlib, pkgutil, sys\n"
                 "import workbook_lib.report as R\n"
                 "for m in pkgutil.iter_modules(R.__path__):\n"
                 "    importlib.import_module('workbook_lib.report.' + m.name)\n"
                 "print(sorted(m for m in sys.modules if m.split('.')[:2][-1] in "
                 "('studies', 'training', 'measurement')))")
    assert out == "[]", out


def test_every_record_type_lives_in_results():
    """A class that derives from ``Record`` is defined in ``results/`` (or on the bottom floor:
    the failure record of ``failures``)."""
    outside = []
    for mod, path in module_files(ROOT).items():
        if mod.startswith(f"{PKG}.results") or mod in (f"{PKG}.records", f"{PKG}.failures"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    getattr(b, "id", getattr(b, "attr", "")) == "Record" for b in node.bases):
                outside.append(f"{mod}.{node.name}")
    assert outside == [], outside
