"""Failure handling end to end: failing notebooks, --resume, interrupts, OOM points."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from workbook_lib.analysis import benchmarks
from workbook_lib.running import runner
from workbook_lib.running import params as params_mod
from workbook_lib.exceptions import NotebookFailedError

ROOT = Path(__file__).resolve().parent.parent

WRITE_RESULTS = ("from workbook_lib import results\n"
                 "results.write_results(run_dir, NAME, {'x': 1}, params, headline='ok ' + NAME)")


def _nb(path, *cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                  "language": "python"}}
    p = nbformat.v4.new_code_cell("params_file = None\nparams = {}\nrun_dir = '.'")
    p.metadata["tags"] = ["parameters"]
    nb.cells = [p] + [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, str(path))


@pytest.fixture
def nb_dir(tmp_path, monkeypatch):
    d = tmp_path / "nbs"
    d.mkdir()
    monkeypatch.setenv("WORKBOOK_NOTEBOOK_DIR", str(d))
    return d


@pytest.fixture
def tiny():
    return params_mod.validate({"scale": 0.002, "device": "cpu"})


def test_failing_notebook_keeps_partial_output_and_others_run(nb_dir, tiny, tmp_path):
    _nb(nb_dir / "01_ok.ipynb", "NAME = '01_ok'", WRITE_RESULTS)
    _nb(nb_dir / "02_bad.ipynb", "print('before the failure')", "raise ValueError('boom here')",
        "print('never')")
    _nb(nb_dir / "03_ok.ipynb", "NAME = '03_ok'", WRITE_RESULTS)
    out = tmp_path / "run"
    with pytest.raises(NotebookFailedError) as e:
        runner.run_notebooks(tiny, out, progress=False, log_output=False)
    assert "02_bad" in str(e.value) and "boom here" in str(e.value)
    assert e.value.failures[0].failed_exec == 4  # params, injected params, print, raise
    assert (out / "01_ok.json").is_file() and (out / "03_ok.json").is_file()
    partial = nbformat.read(str(out / "02_bad.ipynb"), as_version=4)
    assert any("before the failure" in o.get("text", "") for c in partial.cells
               if c.cell_type == "code" for o in c.outputs)
    html = (out / "02_bad.html").read_text()
    assert "boom here" in html and "An Exception was encountered" in html
    index = (out / "index.html").read_text()
    assert "FAILED" in index and "ok 01_ok" in index


def test_cli_exit_code_and_summary(nb_dir, tmp_path):
    _nb(nb_dir / "01_bad.ipynb", "1/0")
    pf = tmp_path / "p.yaml"
    pf.write_text("scale: 0.002\ndevice: cpu\n")
    env = {**os.environ, "WORKBOOK_NOTEBOOK_DIR": str(nb_dir)}
    r = subprocess.run([sys.executable, "-m", "workbook_lib", "run", "--params", str(pf), "--out",
                        str(tmp_path / "o"), "--quiet"], capture_output=True, text=True, env=env,
                       cwd=ROOT)
    assert r.returncode == 1
    assert "01_bad (cell 2, In [3]): ZeroDivisionError" in r.stderr


def test_bad_params_fail_before_any_work(tmp_path):
    pf = tmp_path / "p.yaml"
    pf.write_text("scale: -2\n")
    r = subprocess.run([sys.executable, "-m", "workbook_lib", "run", "--params", str(pf), "--out",
                        str(tmp_path / "o")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "'scale' must be positive" in r.stderr
    assert not (tmp_path / "o").exists()
    r = subprocess.run([sys.executable, "-m", "workbook_lib", "run", "--params", "ci", "--set",
                        "layerz=3"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "layerz" in r.stderr


def test_resume_skips_complete_and_reruns_changed(nb_dir, tiny, tmp_path):
    _nb(nb_dir / "01_a.ipynb", "NAME = '01_a'", WRITE_RESULTS,
        "open(run_dir + '/count', 'a').write('x')")
    out = tmp_path / "run"
    runner.run_notebooks(tiny, out, progress=False, log_output=False)
    res = json.loads((out / "01_a.json").read_text())
    res["_meta"]["snapshot_checksum"] = runner.snapshot_checksum(tiny)
    (out / "01_a.json").write_text(json.dumps(res))
    o = runner.run_notebooks(tiny, out, resume=True, progress=False, log_output=False)
    assert o[0].status == "skipped" and (out / "count").read_text() == "x"
    changed = params_mod.validate({"scale": 0.002, "device": "cpu", "seed": 5})
    o = runner.run_notebooks(changed, out, resume=True, progress=False, log_output=False)
    assert o[0].status == "ok" and (out / "count").read_text() == "xx"


def test_sigterm_stops_kernel_and_children(nb_dir, tmp_path):
    _nb(nb_dir / "01_fast.ipynb", "NAME = '01_fast'", WRITE_RESULTS)
    marker = tmp_path / "child.pid"
    _nb(nb_dir / "02_slow.ipynb",
        "import subprocess, time\n"
        "p = subprocess.Popen(['sleep', '300'], start_new_session=True)  # like torchrun\n"
        f"open({str(marker)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(300)")
    pf = tmp_path / "p.yaml"
    pf.write_text("scale: 0.002\ndevice: cpu\n")
    env = {**os.environ, "WORKBOOK_NOTEBOOK_DIR": str(nb_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "workbook_lib", "run", "--params", str(pf),
                             "--out", str(tmp_path / "o"), "--quiet"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.5)
    assert marker.exists(), "the slow notebook never started"
    time.sleep(1.0)
    kernel_pids = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err
    assert "INTERRUPTED" in err
    child = int(marker.read_text())
    time.sleep(1.0)
    for pid in [child, *kernel_pids]:
        if psutil.pid_exists(pid):
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"{pid} left running"
    assert (tmp_path / "o" / "01_fast.json").is_file()  # what finished is kept


def test_oom_point_recorded_and_sweep_goes_on(monkeypatch):
    import torch

    from conftest import make_graph
    g = make_graph(num_genes=20, types={"a": 40})
    real = benchmarks.build_ctx

    def fake(strategy, pert, indices=None):
        if pert.shape[0] >= 4:
            raise MemoryError("simulated: cannot allocate")
        return real(strategy, pert, indices)
    monkeypatch.setattr(benchmarks, "build_ctx", fake)
    out = benchmarks.layer_time_across_batch(g, ["node_mask_shared"], [1, 2, 4, 8], 4, 2,
                                             torch.device("cpu"), warmup=0, repeats=1,
                                             progress=False)
    by_b = out["node_mask_shared"]
    assert by_b["1"]["median"] > 0 and by_b["2"]["median"] > 0
    assert by_b["4"]["median"] is None and "out of memory" in by_b["4"]["reason"]
    assert by_b["8"]["median"] is None


def test_non_oom_errors_are_not_swallowed(monkeypatch):
    import torch

    from conftest import make_graph
    g = make_graph(num_genes=20, types={"a": 40})
    monkeypatch.setattr(benchmarks, "build_ctx", lambda *a, **k: (_ for _ in ()).throw(
        ValueError("a bug")))
    with pytest.raises(ValueError, match="a bug"):
        benchmarks.layer_time_across_batch(g, ["node_mask_shared"], [1], 4, 2,
                                           torch.device("cpu"), warmup=0, repeats=1,
                                           progress=False)
