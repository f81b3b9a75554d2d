"""A run folder shared and reused: a second writer refused, inputs checked, a full disk, an
early signal."""
import json
import os
import signal
import time

import pytest

from workbook_lib.exceptions import NotebookFailedError, ParamsError
from workbook_lib import cli
from workbook_lib.running import papermill_run, run_folder
from workbook_lib.running.resume import check_inputs_match, completeness
from workbook_lib.running import runlock
from workbook_lib.configs.validation import load_params_file, validate
from workbook_lib.running.results import file_checksum, write_results
from conftest import write_notebook

NBS = ("01_graph_inventory", "02_mask_cost_model", "03_data_vs_model_timing", "04_ddp_scaling")


@pytest.fixture
def tiny():
    return validate({"scale": 0.002, "device": "cpu"})


def _complete(out, nb, params, inputs=None):
    write_results(out, nb, {"x": 1}, params, headline="h", inputs=inputs)
    (out / f"{nb}.html").write_text("<html></html>")


def test_a_second_writer_is_refused_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    with runlock.hold(out, ["04_ddp_scaling"]):
        holder = json.loads((out / ".lock-04_ddp_scaling").read_text())
        assert holder["pid"] == os.getpid()
        rc = cli.main(["run", "--params", "ci", "--out", str(out), "--quiet"])
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        assert "in use" in err and "04_ddp_scaling" in err and f"pid {os.getpid()}" in err
        with pytest.raises(runlock.RunFolderInUseError):  # a job of notebook 04 alone, too
            run_folder.run_notebooks(load_params_file("ci"), out, only=["04"],
                                 progress=False)
        with runlock.hold(out, ["01_graph_inventory"]):  # other notebooks: side by side
            pass
    with runlock.hold(out, ["04_ddp_scaling"]):  # released when the holder is done
        pass
    assert not [p for p in out.iterdir() if not p.name.startswith(".lock-")]


def test_a_notebook_run_alone_refuses_inputs_made_with_other_params(tmp_path, tiny):
    out = tmp_path / "run"
    for nb in NBS:
        _complete(out, nb, tiny)
    other = validate({"scale": 0.002, "device": "cpu", "hidden": 8})
    with pytest.raises(ParamsError) as e:
        run_folder.run_notebooks(other, out, only=["05"], progress=False)
    assert e.value.key == "hidden" and "hidden=32 there, 8 now" in str(e.value)
    assert "05_verdict reads 03_data_vs_model_timing" in str(e.value)  # its one required input
    assert not (out / "05_verdict.json").exists()
    check_inputs_match(out, ["05_verdict"], tiny)  # the same params: accepted


def test_a_notebook_never_reads_an_input_made_with_other_params(tmp_path, tiny, monkeypatch):
    """What the runner's check cannot see (a run with other params writing the input into the
    folder while this one runs, a notebook run from JupyterLab): the notebook itself treats an
    input made with other params as absent, and the verdict refuses it, naming the keys."""
    from workbook_lib.studies import verdict
    from workbook_lib.exceptions import IncompleteInputsError
    from workbook_lib.running import results
    from workbook_lib.running.results import load_result

    class Body:
        from_json = staticmethod(dict)

    monkeypatch.setattr(results, "result_type", lambda nb: Body)
    out = tmp_path / "run"
    write_results(out, "01_graph_inventory", {"x": 1}, tiny, headline="h")
    other = validate({"scale": 0.002, "device": "cpu", "hidden": 8})
    assert load_result(out, "01_graph_inventory") == {"x": 1}
    assert load_result(out, "01_graph_inventory", tiny) == {"x": 1}  # its own params
    assert load_result(out, "01_graph_inventory", other) is None
    for nb in NBS[1:]:
        _complete(out, nb, tiny)
    with pytest.raises(IncompleteInputsError, match=r"notebook 03.*other params \(hidden\)") as e:
        verdict.load_inputs(out, other)  # 03, the one it needs, was made with other params
    # the command it gives runs 03 with these params, not the defaults (a user trial)
    assert "python -m workbook_lib run --only 03 --out" in str(e.value)
    assert "--set hidden=8" in str(e.value) and "--set scale=0.002" in str(e.value)
    write_results(out, "03_data_vs_model_timing", {"x": 3}, other, headline="h")
    found, _sums, why_not = verdict.load_inputs(out, other)  # the others: not used, and why
    assert set(found) == {"03_data_vs_model_timing"}
    assert why_not["01_graph_inventory"] == "made with other params (hidden)"
    assert why_not["02_mask_cost_model"] == "made with other params (hidden)"


def test_a_result_made_without_an_input_that_exists_now_is_not_complete(tmp_path, tiny):
    out = tmp_path / "run"
    _complete(out, "04_ddp_scaling", tiny)  # 03 was cancelled: 04 ran without it
    assert completeness(out, "04_ddp_scaling", tiny) == (True, "")
    _complete(out, "03_data_vs_model_timing", tiny)  # the resubmission made 03
    ok, why = completeness(out, "04_ddp_scaling", tiny)
    assert not ok and "03_data_vs_model_timing" in why
    _complete(out, "04_ddp_scaling", tiny,
              inputs={"03_data_vs_model_timing": file_checksum(
                  out / "03_data_vs_model_timing.json")})
    assert completeness(out, "04_ddp_scaling", tiny)[0]


def test_a_verdict_older_than_bench_json_is_not_complete(tmp_path, tiny):
    out = tmp_path / "run"
    for nb in NBS:
        _complete(out, nb, tiny)
    sums = {nb: file_checksum(out / f"{nb}.json") for nb in NBS}
    _complete(out, "05_verdict", tiny, inputs=sums)
    assert completeness(out, "05_verdict", tiny)[0]
    (out / "bench.json").write_text("{}")  # python -m workbook_lib bench --out RUN/bench.json
    ok, why = completeness(out, "05_verdict", tiny)
    assert not ok and "bench.json" in why
    _complete(out, "05_verdict", tiny, inputs={**sums, "bench": file_checksum(out / "bench.json")})
    assert completeness(out, "05_verdict", tiny)[0]
    (out / "bench.json").unlink()
    assert "gone" in completeness(out, "05_verdict", tiny)[1]


def test_a_full_disk_is_recorded_per_notebook_and_the_run_goes_on(tmp_path, tiny, monkeypatch):
    d = tmp_path / "nbs"
    d.mkdir()
    monkeypatch.setenv("WORKBOOK_NOTEBOOK_DIR", str(d))
    write_notebook(d / "01_a.ipynb", "raise OSError(28, 'No space left on device', run_dir + '/t.pt')")
    write_notebook(d / "02_b.ipynb", "x = 1")
    out = tmp_path / "run"

    def full(path, *a, **k):
        raise OSError(28, "No space left on device", str(path))
    monkeypatch.setattr(papermill_run, "export_html", lambda nb, html, **k: full(html))
    with pytest.raises(NotebookFailedError) as e:
        run_folder.run_notebooks(tiny, out, progress=False, log_output=False,
                                 write_index=lambda out, *a: full(out / "index.html"))
    by = {o.name: o for o in e.value.failures}
    assert set(by) == {"01_a", "02_b"}  # the second was attempted
    assert "t.pt" in by["01_a"].error and "No space left" in by["01_a"].error  # its own cause
    assert "02_b.html" in by["02_b"].error  # the file that could not be written


@pytest.fixture
def small_disk(tmp_path):
    """A 256 kB tmpfs (root only): a disk that fills up."""
    import subprocess

    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs",
                                            str(mnt)], capture_output=True).returncode:
        pytest.skip("a small disk needs a tmpfs mount (root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_disk_that_fills_up_leaves_every_file_whole_or_absent(tmp_path, tiny, monkeypatch,
                                                                small_disk):
    """A real full disk: papermill's notebook, the report and the results are each written
    whole or not at all, and the run says the disk is full once (not a derived "Notebook does
    not appear to be JSON")."""
    d = tmp_path / "nbs"
    d.mkdir()
    monkeypatch.setenv("WORKBOOK_NOTEBOOK_DIR", str(d))
    write_notebook(d / "01_a.ipynb", "for i in range(40):\n    print('x' * 20_000)")
    out = small_disk / "run"
    with pytest.raises(NotebookFailedError) as e:
        run_folder.run_notebooks(tiny, out, progress=False, log_output=False)
    (failed,) = e.value.failures
    assert "the disk is full" in failed.error and failed.error.count("No space left") == 1
    assert "does not appear to be JSON" not in failed.error
    for f in out.rglob("*"):
        if f.suffix in (".ipynb", ".json"):
            json.loads(f.read_text())  # whole
        elif f.suffix == ".html":
            assert f.read_text().rstrip().endswith("</html>")
    assert not list(out.glob(".*.tmp"))  # no temporary file left behind


def _sigterm_during(monkeypatch, capsys, module, attr, argv) -> str:
    """``run`` with ``module.attr`` replaced by a step that receives a SIGTERM; asserts the
    interrupt (130, the message, no run folder, the handler restored) and returns stderr."""
    def slow_step(params, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        raise AssertionError(f"the signal did not stop {attr}")
    monkeypatch.setattr(module, attr, slow_step)
    before = signal.getsignal(signal.SIGTERM)
    out = argv[argv.index("--out") + 1]
    rc = cli.main(["run", "--params", "ci", *argv, "--quiet"])
    err = capsys.readouterr().err
    assert rc == 130 and "INTERRUPTED" in err
    assert not os.path.exists(out)
    assert signal.getsignal(signal.SIGTERM) is before
    return err


def test_sigterm_while_the_snapshot_builds_is_an_interrupt(tmp_path, monkeypatch, capsys):
    err = _sigterm_during(monkeypatch, capsys, run_folder, "snapshot_checksum",
                          ["--out", str(tmp_path / "run")])
    assert "--resume" in err
    assert "nothing was written yet" in err and "kept in" not in err


def test_sigterm_while_a_user_pipeline_is_checked_is_an_interrupt(tmp_path, monkeypatch, capsys):
    """A user's pipeline is built and run on one batch before the runner starts: a SIGTERM
    there exits 130 with a message, like one while the snapshot builds (not 143, silent)."""
    from workbook_lib import pipelines

    err = _sigterm_during(monkeypatch, capsys, pipelines, "preflight",
                          ["--out", str(tmp_path / "run"), "--set",
                           'pipelines=["examples/dango_pyg.py:make_pipeline"]'])
    assert "pipelines" in err
