"""Shared use: a group's run folder, two clones, the notebooks' sources under jupytext."""
import os
import stat
from pathlib import Path

import pytest

from workbook_lib.common.files import atomic_write_text, current_umask
from workbook_lib.configs.validation import validate
from workbook_lib.running.results import write_results

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def umask():
    old = os.umask(0o022)
    os.umask(old)

    def set_(mask):
        os.umask(mask)
    yield set_
    os.umask(old)


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_writes_get_the_umasks_mode(tmp_path, umask, mask, mode):
    """Results, reports and snapshot caches are written through a temporary file; they get the
    mode a plain open() gives (0666 less the umask), not mkstemp's 0600."""
    from workbook_lib.data.snapshots import load_synthetic
    from workbook_lib.configs.schema import defaults

    umask(mask)
    assert current_umask() == mask
    atomic_write_text(tmp_path / "index.html", "<html></html>")
    write_results(tmp_path, "01_graph_inventory", {"x": 1}, validate(defaults()), headline="h")
    cache = tmp_path / "cache"
    load_synthetic("string12", 0, 0.0005, cache)
    files = [tmp_path / "index.html", tmp_path / "01_graph_inventory.json",
             *cache.glob("*.pt"), *cache.glob("*.sha256")]
    assert len(files) == 4
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == mode, f
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_jupytext_round_trip_leaves_the_sources_byte_identical(tmp_path):
    """`make notebooks` builds the .ipynb; `jupytext --sync` and JupyterLab's save (jupytext's
    contents manager) write the paired .py back: byte for byte what is tracked."""
    import shutil

    import nbformat
    from jupytext.cli import jupytext as jupytext_cli
    from jupytext import TextFileContentsManager

    from workbook_lib.catalog import NOTEBOOK_NAMES
    from workbook_lib.running import notebooks as nbsrc

    for name in NOTEBOOK_NAMES:
        shutil.copy(ROOT / "notebooks" / f"{name}.py", tmp_path)
    shutil.copy(ROOT / "notebooks" / "jupytext.toml", tmp_path)
    nbsrc.sync(directory=tmp_path)
    first, second = NOTEBOOK_NAMES[0], NOTEBOOK_NAMES[1]
    # a user runs a notebook: outputs and execution metadata land in the .ipynb
    nb = nbformat.read(str(tmp_path / f"{first}.ipynb"), as_version=4)
    nb.metadata["language_info"] = {"name": "python", "version": "3.11.2"}
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", text="ran")]
    code.execution_count = 1
    nbformat.write(nb, str(tmp_path / f"{first}.ipynb"))
    jupytext_cli(["--sync", "--quiet", str(tmp_path / f"{first}.ipynb")])
    cm = TextFileContentsManager(root_dir=str(tmp_path))
    model = cm.get(f"{second}.ipynb")
    cm.save(model, f"{second}.ipynb")  # what JupyterLab's save does
    for name in NOTEBOOK_NAMES:
        assert (tmp_path / f"{name}.py").read_bytes() == \
            (ROOT / "notebooks" / f"{name}.py").read_bytes(), name


def test_the_kernel_is_registered_in_the_environment_and_removed_by_clean(tmp_path,
                                                                         monkeypatch):
    """make venv registers gnn-workbook inside the clone's environment (running its Python),
    removes a per-user one this clone left, and make clean removes what it registered."""
    import json
    import subprocess
    import sys

    from workbook_lib.running import kernel

    user = tmp_path / "user"
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(user))
    mine, other = user / "kernels" / "gnn-workbook", user / "kernels" / "other"
    for d, py in ((mine, sys.executable), (other, "/another/clone/.venv/bin/python")):
        d.mkdir(parents=True)
        (d / "kernel.json").write_text(json.dumps({"argv": [py, "-m", "ipykernel_launcher"]}))
    path = kernel.install(prefix=tmp_path / "venv")
    assert path == tmp_path / "venv" / "share" / "jupyter" / "kernels" / "gnn-workbook"
    spec = json.loads((path / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable and spec["display_name"] == kernel.KERNEL_DISPLAY
    assert not mine.exists() and other.exists()  # only this clone's per-user leftover
    assert kernel.remove(prefix=tmp_path / "venv") == [path] and not path.exists()
    make = subprocess.run(["make", "-n", "venv", "clean", "-B"], cwd=ROOT, capture_output=True,
                          text=True).stdout
    assert "workbook_lib kernel" in make and "workbook_lib kernel --remove" in make
    assert "--user" not in make


def test_a_notebook_opened_with_another_clones_kernel_is_refused(tmp_path, monkeypatch):
    from workbook_lib.exceptions import WorkbookError
    from workbook_lib.running.kernel import check_notebook_clone

    monkeypatch.delenv("WORKBOOK_ROOT", raising=False)
    clone = tmp_path / "clone-b"
    (clone / "workbook_lib").mkdir(parents=True)
    (clone / "workbook_lib" / "__init__.py").write_text("")
    (clone / "notebooks").mkdir()
    with pytest.raises(WorkbookError, match="another clone's kernel"):
        check_notebook_clone(clone / "notebooks")
    check_notebook_clone(ROOT / "notebooks")  # its own clone
    check_notebook_clone(tmp_path)  # papermill's outputs elsewhere, the runner's temp folders


# pip name -> conda-forge name where they differ
CONDA_NAMES = {"torch": "pytorch", "torch_geometric": "pytorch_geometric"}


def test_environment_yml_matches_pyproject():
    """Conda users get the packages (and lower bounds) pip users get, from conda-forge only."""
    import re

    import yaml
    from packaging.specifiers import SpecifierSet

    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {}
    extras = project["optional-dependencies"]
    for req in project["dependencies"] + extras["test"] + extras["lightning"]:
        name, spec = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", req).groups()
        wanted[CONDA_NAMES.get(name, name)] = spec.replace(" ", "")
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]
    have, python = {}, None
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            assert dep == {"pip": ["--no-deps -e ."]}  # the library itself, nothing else
            continue
        name, spec = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", dep).groups()
        if name == "python":
            python = spec.lstrip("=")
        elif name != "pip":
            have[name] = spec.replace(" ", "")
    assert have == wanted
    assert python in SpecifierSet(project["requires-python"])


def test_the_profilers_usdt_lines_stay_off_the_terminal(monkeypatch, capfd):
    from workbook_lib.common import progress as pg

    monkeypatch.setenv("WORKBOOK_PROGRESS", "1")
    with pg.native_stderr_to_terminal():
        os.write(2, b"USDT: probe profiler_start\nnative warning kept\n  USDT: indented\n")
    err = capfd.readouterr().err
    assert "native warning kept" in err and "USDT" not in err


def test_params_set_without_a_file_applies_the_set(capsys):
    from workbook_lib import cli

    assert cli.main(["params", "--set", "hidden=12"]) == 0
    out = capsys.readouterr().out
    assert "hidden: 12" in out.splitlines()
    assert cli.main(["params", "--set", "hidden=0"]) == 2


def test_help_notebook_keeps_the_meaning_of_equals():
    from papermill.translators import PythonTranslator

    from workbook_lib.configs.cells import parameters_cell
    from workbook_lib.configs.schema import FIELDS

    found = {p.name: p for p in PythonTranslator.inspect({"source": parameters_cell()})}
    assert "1.0 is the real graph" in found["scale"].help
    assert set(found) == set(FIELDS) | {"run_dir"}


def test_run_level_environment_says_what_each_notebook_was_asked_to_apply():
    from workbook_lib.running import environment
    from workbook_lib.configs.schema import defaults

    rec = environment.collect(validate(defaults()), run_level=True)["cpu_allocator_cache"]
    assert rec["requested"] is True and "each notebook's kernel" in rec["detail"]
    off = environment.collect(validate({**defaults(), "cpu_allocator_cache": False}),
                              run_level=True)
    assert off["cpu_allocator_cache"]["requested"] is False


def test_html_turns_a_papermill_output_into_the_report(tmp_path, capsys):
    import nbformat

    from workbook_lib import cli

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Title here"),
                nbformat.v4.new_code_cell("secret_code = 1")]
    nbformat.write(nb, str(tmp_path / "out.ipynb"))
    assert cli.main(["html", str(tmp_path / "out.ipynb")]) == 0
    html = (tmp_path / "out.html").read_text()
    assert "Title here" in html and "secret_code" not in html  # code hidden, as run does
    assert "replaced" not in capsys.readouterr().out
    assert cli.main(["html", str(tmp_path / "out.ipynb")]) == 0  # e.g. over nbconvert's export
    assert "it replaced the file that was there" in capsys.readouterr().out
    assert cli.main(["html", str(tmp_path / "none.ipynb")]) == 2


def test_the_memory_budget_is_the_tightest_limit(tmp_path):
    """Host RAM, unless a cgroup (v1 or v2, the process's group or an ancestor) or SLURM's
    request is lower."""
    import psutil

    from workbook_lib.common.device import memory_limit

    ram = float(psutil.virtual_memory().total)
    nothing = tmp_path / "none"
    base, label = memory_limit(proc_cgroup=nothing, cgroup_root=tmp_path, environ={})
    assert base <= ram
    v2 = tmp_path / "v2"
    (v2 / "job" / "step").mkdir(parents=True)
    (v2 / "job" / "memory.max").write_text(str(int(base // 4)) + "\n")
    (v2 / "job" / "step" / "memory.max").write_text("max\n")
    pc = tmp_path / "cgroup2"
    pc.write_text("0::/job/step\n")
    assert memory_limit(proc_cgroup=pc, cgroup_root=v2, environ={}) == \
        (float(int(base // 4)), "cgroup memory.max")
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(int(base // 2)))
    pc1 = tmp_path / "cgroup1"
    pc1.write_text("4:memory:/host/path/not/mounted\n1:cpu:/\n")
    assert memory_limit(proc_cgroup=pc1, cgroup_root=v1, environ={})[1] == \
        "cgroup memory.limit_in_bytes"
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712")  # no limit
    assert memory_limit(proc_cgroup=pc1, cgroup_root=v1, environ={}) == (base, label)
    slurm = memory_limit(proc_cgroup=nothing, cgroup_root=tmp_path,
                         environ={"SLURM_MEM_PER_NODE": "1024"})
    assert slurm == (1024.0 * 2**20, "SLURM --mem")
    per_cpu = memory_limit(proc_cgroup=nothing, cgroup_root=tmp_path,
                           environ={"SLURM_MEM_PER_CPU": "512", "SLURM_CPUS_ON_NODE": "3"})
    assert per_cpu == (3 * 512.0 * 2**20, "SLURM --mem-per-cpu x CPUs")


def test_the_memory_budget_follows_an_rlimit():
    """ulimit -v, in a child process (an rlimit cannot be raised back)."""
    import subprocess
    import sys

    code = ("import resource, psutil; lim = int(psutil.virtual_memory().total * 0.9) // 4096 * "
            "4096; resource.setrlimit(resource.RLIMIT_AS, (lim, lim)); "
            "from workbook_lib.measurement.memory import device_budget; "
            "print(device_budget('cpu') == (float(lim), 'address-space rlimit (ulimit -v)'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "True", (out.stdout, out.stderr[-500:])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")
def test_gpu_lock_file_is_shared_by_a_second_user():
    """The per-GPU probe lock lives in a sticky, world-writable folder (/tmp): one user creates
    it under a private umask, another user must still open and lock it."""
    import pwd
    import shutil
    import tempfile

    from workbook_lib.common.locks import locked

    def take(path) -> None:
        with locked(path, shared_by_all=True):
            pass

    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user")

    def as_nobody(fn) -> int:
        """Run ``fn`` in a forked child as user nobody; its exit status (0: it returned)."""
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.setgroups([])
                os.setgid(nobody.pw_gid)
                os.setuid(nobody.pw_uid)
                fn()
                os._exit(0)
            except BaseException:  # noqa: BLE001
                os._exit(1)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    shared = Path(tempfile.mkdtemp(prefix="wb-sticky-", dir="/tmp"))  # others can reach it
    shared.chmod(0o1777)
    lock = shared / "workbook-gpu-x.lock"
    try:
        old = os.umask(0o077)
        try:
            take(lock)
        finally:
            os.umask(old)
        assert lock.stat().st_mode & 0o777 == 0o644
        assert as_nobody(lambda: take(lock)) == 0
        # the old way (open for append) is what a second user could not do
        assert as_nobody(lambda: open(lock, "a")) == 1
    finally:
        shutil.rmtree(shared, ignore_errors=True)
