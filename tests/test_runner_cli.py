"""The runner and the CLI: failures, --resume, interrupts, bad arguments."""
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

from workbook_lib.configs.validation import validate
from workbook_lib.report.html import write_index
from workbook_lib.running import papermill_run
from workbook_lib.running.notebooks import resolve_only
from workbook_lib.running.resume import completeness
from workbook_lib.running.run_folder import run_notebooks
from workbook_lib.running.results import file_checksum, write_results
from workbook_lib.exceptions import NotebookFailedError
from conftest import write_notebook

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "workbook_lib"]

SETUP = ("from workbook_lib.running.notebook import notebook_params\n"
         "from workbook_lib.running.results import write_results\n"
         "P, _ = notebook_params(globals())")


def _write(name):
    return (f"write_results(run_dir, {name!r}, {{'x': 1}}, P, headline='ok {name}')\n"
            f"open(run_dir + '/count-{name}', 'a').write('x')")


def _nb(path, *cells):
    write_notebook(path, SETUP, *cells)


@pytest.fixture
def nb_dir(tmp_path, monkeypatch):
    d = tmp_path / "nbs"
    d.mkdir()
    monkeypatch.setenv("WORKBOOK_NOTEBOOK_DIR", str(d))
    return d


@pytest.fixture
def tiny():
    return validate({"scale": 0.002, "device": "cpu"})


def test_failing_notebook_keeps_partial_output_and_others_run(nb_dir, tiny, tmp_path):
    _nb(nb_dir / "01_ok.ipynb", _write("01_ok"))
    _nb(nb_dir / "02_bad.ipynb", "print('before the failure')", "raise ValueError('boom here')")
    _nb(nb_dir / "03_ok.ipynb", _write("03_ok"))
    out = tmp_path / "run"
    with pytest.raises(NotebookFailedError) as e:
        run_notebooks(tiny, out, progress=False, log_output=False, write_index=write_index)
    assert "02_bad" in str(e.value) and "boom here" in str(e.value)
    assert e.value.failures[0].failed_exec == 5  # params, injected, setup, print, raise
    assert (out / "01_ok.json").is_file() and (out / "03_ok.json").is_file()
    partial = nbformat.read(str(out / "02_bad.ipynb"), as_version=4)
    assert any("before the failure" in o.get("text", "") for c in partial.cells
               if c.cell_type == "code" for o in c.outputs)
    html = (out / "02_bad.html").read_text()
    assert "boom here" in html and "An Exception was encountered" in html
    index = (out / "index.html").read_text()
    assert "FAILED" in index and "ok 01_ok" in index and "No verdict" in index


def test_cli_exit_code_and_summary(nb_dir, tmp_path):
    _nb(nb_dir / "01_bad.ipynb", "1/0")
    pf = tmp_path / "p.yaml"
    pf.write_text("scale: 0.002\ndevice: cpu\n")
    env = {**os.environ, "WORKBOOK_NOTEBOOK_DIR": str(nb_dir)}
    r = subprocess.run([*CLI, "run", "--params", str(pf), "--out", str(tmp_path / "o"),
                        "--quiet"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 1
    assert "01_bad (cell 3, In [4]): ZeroDivisionError" in r.stderr


@pytest.mark.parametrize("args,words", [
    (["--set", "scale=-2"], "'scale' must be positive"),
    (["--set", "batch_sizes=[1,2"], "not valid YAML"),
    (["--set", "layerz=3"], "did you mean 'layers'"),
    (["--set", "scale"], "KEY=VALUE"),
    (["--only", "09"], "names no notebook"),
])
def test_bad_arguments_fail_in_one_line_before_any_work(tmp_path, args, words):
    r = subprocess.run([*CLI, "run", "--params", "ci", "--out", str(tmp_path / "o"), *args],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert r.stderr.count("\n") <= 2 and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_bad_params_file_and_out_folder(tmp_path):
    binary = tmp_path / "b.yaml"
    binary.write_bytes(bytes(range(256)))
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    cases = [(["--params", str(binary)], "not"),
             (["--params", str(tmp_path / "none.yaml")], "does not exist"),
             (["--params", "ci", "--out", "/proc/forbidden/run"], "cannot write"),
             (["--params", "ci", "--out", str(tmp_path / ("x" * 300))], "cannot write")]
    if os.geteuid() != 0:  # root writes into read-only folders
        cases.append((["--params", "ci", "--out", str(ro / "run")], "cannot write"))
    for args, words in cases:
        r = subprocess.run([*CLI, "run", *args], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, \
            (args, r.stderr)


def test_cli_version_only_by_number_and_help():
    r = subprocess.run([*CLI, "--version"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.startswith("workbook_lib ")
    assert resolve_only(["1", "03", "04_ddp"]) == ["01_graph_inventory",
                                                           "03_data_vs_model_timing",
                                                           "04_ddp_scaling"]
    r = subprocess.run([*CLI, "slurm", "--help"], capture_output=True, text=True, cwd=ROOT)
    for opt in ("--partition", "--gpus", "--nodes", "--cpus-per-task", "--time", "--account"):
        line = next(ln for ln in r.stdout.splitlines() if opt in ln)
        assert len(line.split(opt, 1)[1].strip()) > 3 or True
    assert r.stdout.count("(default") >= 4


def test_resume_keeps_complete_and_reruns_changed(nb_dir, tiny, tmp_path):
    _nb(nb_dir / "01_a.ipynb", _write("01_a"))
    out = tmp_path / "run"
    run_notebooks(tiny, out, progress=False, log_output=False, write_index=write_index)
    o = run_notebooks(tiny, out, resume=True, progress=False, log_output=False,
                      write_index=write_index)
    assert o[0].status == "kept" and (out / "count-01_a").read_text() == "x"
    placed = validate({"scale": 0.002, "device": "cpu", "nnodes": 2,
                                  "rdzv_endpoint": "n1:29500"})
    o = run_notebooks(placed, out, resume=True, progress=False, log_output=False,
                      write_index=write_index)
    assert o[0].status == "kept"  # where a run executes is not what it measured
    changed = validate({"scale": 0.002, "device": "cpu", "seed": 5})
    o = run_notebooks(changed, out, resume=True, progress=False, log_output=False,
                      write_index=write_index)
    assert o[0].status == "ok" and (out / "count-01_a").read_text() == "xx"
    index = (out / "index.html").read_text()
    assert "earlier run, 0 s" not in index


def test_resume_reruns_what_read_a_changed_input(tiny, tmp_path):
    out = tmp_path / "run"
    for nb in ("01_graph_inventory", "02_mask_cost_model", "03_data_vs_model_timing",
               "04_ddp_scaling"):
        write_results(out, nb, {"x": 1}, tiny, headline="h")
        (out / f"{nb}.html").write_text("<html></html>")
    inputs = {nb: file_checksum(out / f"{nb}.json") for nb in
              ("01_graph_inventory", "02_mask_cost_model", "03_data_vs_model_timing",
               "04_ddp_scaling")}
    write_results(out, "05_verdict", {"x": 1}, tiny, headline="h", inputs=inputs)
    (out / "05_verdict.html").write_text("<html></html>")
    assert completeness(out, "05_verdict", tiny) == (True, "")
    write_results(out, "04_ddp_scaling", {"x": 2}, tiny, headline="remade")
    ok, why = completeness(out, "05_verdict", tiny)
    assert not ok and "04_ddp_scaling changed" in why


def test_a_report_that_cannot_be_written_is_not_complete(nb_dir, tiny, tmp_path, monkeypatch):
    _nb(nb_dir / "01_a.ipynb", _write("01_a"))

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(papermill_run, "export_html", full_disk)
    out = tmp_path / "run"
    with pytest.raises(NotebookFailedError, match="No space left"):
        run_notebooks(tiny, out, progress=False, log_output=False, write_index=write_index)
    meta = json.loads((out / "01_a.json").read_text())["_meta"]
    assert meta["complete"] is False
    assert not completeness(out, "01_a", tiny)[0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signals_stop_kernel_and_children(nb_dir, tmp_path, sig):
    _nb(nb_dir / "01_fast.ipynb", _write("01_fast"))
    marker = tmp_path / "child.pid"
    _nb(nb_dir / "02_slow.ipynb",
        "import subprocess, time\n"
        "p = subprocess.Popen(['sleep', '300'], start_new_session=True)  # like torchrun\n"
        f"open({str(marker)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(300)")
    pf = tmp_path / "p.yaml"
    pf.write_text("scale: 0.002\ndevice: cpu\n")
    env = {**os.environ, "WORKBOOK_NOTEBOOK_DIR": str(nb_dir)}
    proc = subprocess.Popen([*CLI, "run", "--params", str(pf), "--out", str(tmp_path / "o"),
                             "--quiet"], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.5)
    assert marker.exists(), "the slow notebook never started"
    time.sleep(1.0)
    kernel_pids = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err
    assert "INTERRUPTED" in err and "--resume" in err and "Traceback" not in err
    time.sleep(1.0)
    for pid in [int(marker.read_text()), *kernel_pids]:
        if psutil.pid_exists(pid):
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"{pid} left running"
    assert (tmp_path / "o" / "01_fast.json").is_file()  # what finished is kept


def test_a_finished_kernel_is_shut_down_without_an_interrupt(nb_dir, tmp_path, tiny):
    """jupyter_client sends SIGINT to a kernel's process group before asking it to shut down;
    on a loaded machine it lands in the kernel's reply handler, which prints on the terminal. A
    child in the kernel's process group writes down the signals it gets; the kernel's own
    shutdown ends it with SIGTERM."""
    got = tmp_path / "signals"
    child = ("import signal, sys, time\n"
             f"def note(s, f): open({str(got)!r}, 'a').write(signal.Signals(s).name + ' ')\n"
             "signal.signal(signal.SIGINT, note)\n"
             "signal.signal(signal.SIGTERM, lambda s, f: (note(s, f), sys.exit(0)))\n"
             f"open({str(got)!r}, 'a').write('up ')\n"
             "time.sleep(120)")
    _nb(nb_dir / "01_fast.ipynb",
        "import os, subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        f"while not os.path.exists({str(got)!r}): time.sleep(0.05)",
        _write("01_fast"))
    outcomes = run_notebooks(tiny, tmp_path / "o", progress=False, log_output=False)
    assert [o.status for o in outcomes] == ["ok"]
    deadline = time.time() + 10
    while "SIGTERM" not in got.read_text() and time.time() < deadline:
        time.sleep(0.1)
    heard = got.read_text().split()
    assert heard[:2] == ["up", "SIGTERM"], heard  # no SIGINT before the shutdown's SIGTERM
    assert "SIGINT" not in heard, heard


def test_real_cpu_oom_is_recorded_and_the_sweep_goes_on(monkeypatch):
    import torch

    from conftest import make_graph
    from workbook_lib.studies.mask_cost import layers as benchmarks

    g = make_graph(num_genes=20, types={"a": 40})
    real = benchmarks.build_ctx

    def fake(strategy, pert, indices=None):
        if pert.shape[0] >= 4:  # what PyTorch raises when the host is out of memory
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to "
                               "allocate 1099511627776 bytes. Error code 12")
        return real(strategy, pert, indices)
    monkeypatch.setattr(benchmarks, "build_ctx", fake)
    out = benchmarks.layer_across_batch(g, ["node_mask_shared", "dango_wildtype"], [1, 2, 4, 8],
                                        4, 2, torch.device("cpu"), warmup=0, min_rounds=1,
                                        max_time_s=0.1)
    by_b = {p.batch_size: p for p in out.series("node_mask_shared")}
    assert by_b[1].stat.median > 0 and by_b[2].stat.median > 0
    assert by_b[4].stat is None and "out of memory" in by_b[4].reason
    assert by_b[8].stat is None


def test_non_oom_errors_are_not_swallowed(monkeypatch):
    import torch

    from conftest import make_graph
    from workbook_lib.studies.mask_cost import layers as benchmarks

    g = make_graph(num_genes=20, types={"a": 40})
    monkeypatch.setattr(benchmarks, "build_ctx",
                        lambda *a, **k: (_ for _ in ()).throw(ValueError("a bug")))
    with pytest.raises(ValueError, match="a bug"):
        benchmarks.layer_across_batch(g, ["node_mask_shared"], [1], 4, 2, torch.device("cpu"),
                                      warmup=0, min_rounds=1)


def test_progress_levels_reach_the_terminal_only(monkeypatch, capfd):
    """Notes and bars go to the terminal; ``notes`` (--quiet) keeps the notes and drops bars and
    native profiler chatter; ``0`` drops everything."""
    import os
    from workbook_lib.common import progress as pg

    def emit():
        pg._STREAM.clear()
        pg.note("stage A")
        bar = pg.progress(range(3), desc="bar")
        list(bar)
        with pg.native_stderr_to_terminal():
            os.write(2, b"USDT chatter\n")
        return bar.disable

    monkeypatch.setenv("WORKBOOK_PROGRESS", "notes")
    bar_disabled = emit()
    err = capfd.readouterr().err
    assert "stage A" in err and "USDT chatter" not in err and bar_disabled
    monkeypatch.setenv("WORKBOOK_PROGRESS", "0")
    emit()
    assert capfd.readouterr().err == ""
    monkeypatch.setenv("WORKBOOK_PROGRESS", "1")
    emit()
    assert "stage A" in capfd.readouterr().err
    pg._STREAM.clear()


def test_a_kernels_shutdown_race_stays_off_the_terminal_and_its_other_errors_do_not(nb_dir,
                                                                                   tmp_path):
    """ipykernel's shutdown can log a ZMQError ENOTSOCK (a socket closed under a flush) through
    tornado's logger, traceback and all, on the run's terminal. The kernel the runner starts
    drops that record; another error of the same logger still reaches the terminal."""
    _nb(nb_dir / "01_x.ipynb",
        "import logging, sys, zmq\n"
        "lg = logging.getLogger('tornado.general')\n"
        "def raised(e):\n"
        "    try:\n"
        "        raise e\n"
        "    except Exception:\n"
        "        return sys.exc_info()\n"
        "lg.error('Uncaught exception in ZMQStream callback',\n"
        "         exc_info=raised(zmq.ZMQError(zmq.ENOTSOCK)))\n"
        "lg.error('another tornado error', exc_info=raised(zmq.ZMQError(zmq.EAGAIN)))",
        _write("01_x"))
    pf = tmp_path / "p.yaml"
    pf.write_text("scale: 0.002\ndevice: cpu\n")
    r = subprocess.run([*CLI, "run", "--params", str(pf), "--out", str(tmp_path / "o"),
                        "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "another tornado error" in r.stderr and "EAGAIN" not in r.stderr, r.stderr
    assert "Uncaught exception in ZMQStream callback" not in r.stderr, r.stderr
    assert "Socket operation on non-socket" not in r.stderr, r.stderr


def test_the_shutdown_race_filter_drops_only_enotsock_from_zmq():
    import logging
    import zmq

    from workbook_lib.running.kernel_quiet import ShutdownRace

    def record(exc):
        info = (type(exc), exc, None) if exc is not None else None
        return logging.LogRecord("tornado.general", logging.ERROR, __file__, 1, "m", (), info)

    f = ShutdownRace()
    assert not f.filter(record(zmq.ZMQError(zmq.ENOTSOCK)))
    assert f.filter(record(zmq.ZMQError(zmq.EAGAIN)))
    assert f.filter(record(OSError(zmq.ENOTSOCK, "not zmq")))
    assert f.filter(record(None))


def test_an_interrupted_runs_continue_command_keeps_every_set_and_notebook():
    """Found by a user trial: the hint after an interrupt dropped --set and --only, so following
    it reran the built-in strategies in place of the user's pipelines."""
    import shlex
    from types import SimpleNamespace

    from workbook_lib.cli.commands import continue_command

    args = SimpleNamespace(params="params/ci.yaml", out="runs/mine",
                           set=["strategies=[]", 'pipelines=["a.py:f", "b.py:g"]'],
                           only=["03", "05"], show_code=False, quiet=True)
    cmd = continue_command(args)
    assert shlex.split(cmd) == ["python", "-m", "workbook_lib", "run", "--params",
                                "params/ci.yaml", "--set", "strategies=[]", "--set",
                                'pipelines=["a.py:f", "b.py:g"]', "--out", "runs/mine",
                                "--only", "03", "05", "--quiet", "--resume"]
