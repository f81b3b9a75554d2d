"""The memory probes' fresh processes (multiprocessing's fork server): each point its own
process, forked from a server that imported PyTorch once, with the caller's folder and thread
count; a probe that raises, crashes, is killed or runs past its limit is that point's failure,
beside points that stand; a probe ends with its caller; probes run side by side; their output
does not touch the result."""
import importlib
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from workbook_lib.measurement import memory

TARGETS = textwrap.dedent("""
    import json, multiprocessing, os, signal, sys, time
    import torch
    from workbook_lib.measurement.memory import StepToMeasure

    def report(cfg):
        t0 = time.time()
        time.sleep(cfg.get("sleep", 0))
        with open(cfg["out"], "w") as fh:
            json.dump({"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
                       "threads": torch.get_num_threads(),
                       "omp": os.environ.get("OMP_NUM_THREADS"),
                       "start": multiprocessing.get_start_method(), "t0": t0, "t1": time.time()},
                      fh)
        print(json.dumps({"step_bytes": 1}))  # noise that looks like a result
        print("noise on stderr", file=sys.stderr)
        return StepToMeasure(lambda: torch.ones(10_000_000).add_(1), torch.device("cpu"))

    def boom(cfg):
        raise RuntimeError("the set-up raised")

    def killed(cfg):
        os.kill(os.getpid(), signal.SIGKILL)

    def allocation_failed(cfg):  # a real failed allocation, wrapped as a pipeline's failure is
        try:
            torch.empty(1 << 62, dtype=torch.uint8)
        except RuntimeError as exc:
            raise ValueError("'mine' failed in forward") from exc

    def says_out_of_memory(cfg):  # a message that only quotes the words
        raise ValueError("leave 1 out of memory_batch_sizes")

    def crashed(cfg):
        print("last words", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)

    def sleep(cfg):
        with open(cfg["out"], "w") as fh:
            fh.write(str(os.getpid()))
        time.sleep(60)
""")

POINT = dict(strategy="mine", form="-", batch_size=1, scale=1.0, hidden=1, layers=1)


@pytest.fixture
def targets(tmp_path, monkeypatch):
    (tmp_path / "pf_targets.py").write_text(TARGETS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return importlib.import_module("pf_targets")


def _probe(setup, **cfg):
    return memory.measure_in_fresh_process(setup, cfg, POINT, timeout_s=cfg.pop("limit", 120))


def test_each_point_gets_a_fresh_process_forked_from_a_server_with_pytorch(targets, tmp_path,
                                                                          monkeypatch):
    first = _probe(targets.report, out=str(tmp_path / "a.json"))
    assert first.status == memory.STATUS_OK and first.step_bytes == pytest.approx(40e6, rel=0.25)
    a = json.loads((tmp_path / "a.json").read_text())
    assert a["pid"] != os.getpid() and a["ppid"] != os.getpid()  # forked by the server
    assert a["threads"] == 1 and a["omp"] == "1"  # the caller's thread count
    assert a["start"] == multiprocessing.get_start_method()  # its DataLoaders start as ours
    with open(f"/proc/{a['ppid']}/maps") as fh:
        assert "libtorch" in fh.read()  # the server imported PyTorch once
    sub = tmp_path / "later"
    sub.mkdir()
    monkeypatch.chdir(sub)  # after the server started: the next probe still runs there
    second = _probe(targets.report, out=str(tmp_path / "b.json"))
    b = json.loads((tmp_path / "b.json").read_text())
    assert second.status == memory.STATUS_OK and b["pid"] != a["pid"] and b["cwd"] == str(sub)
    assert _gone(a["pid"])


def test_a_failing_probe_is_its_points_failure_beside_points_that_stand(targets, tmp_path):
    jobs = [(targets.boom, {}), (targets.killed, {}), (targets.crashed, {}),
            (targets.report, {"out": str(tmp_path / "ok.json")})]
    with ThreadPoolExecutor(len(jobs)) as pool:
        boom, killed, crashed, ok = pool.map(lambda j: _probe(j[0], **j[1]), jobs)
    assert boom.status == memory.STATUS_FAILED and boom.reason == \
        "RuntimeError: the set-up raised"
    assert "pf_targets.py" in boom.traceback
    assert killed.status == memory.STATUS_OOM and "OOM killer" in killed.reason
    assert crashed.status == memory.STATUS_FAILED and crashed.reason == "exit -11: last words"
    assert ok.status == memory.STATUS_OK


def test_out_of_memory_is_the_probes_exception_not_words_in_its_message(targets):
    real, words = _probe(targets.allocation_failed), _probe(targets.says_out_of_memory)
    assert real.status == memory.STATUS_OOM, real
    assert words.status == memory.STATUS_FAILED, words
    assert words.reason == "ValueError: leave 1 out of memory_batch_sizes"


def test_a_probe_past_its_time_limit_is_killed(targets, tmp_path):
    t0 = time.monotonic()
    pt = _probe(targets.sleep, out=str(tmp_path / "pid"), limit=2)
    assert pt.status == memory.STATUS_TIMEOUT and "longer than 2 s" in pt.reason
    assert time.monotonic() - t0 < 30
    assert _gone(int((tmp_path / "pid").read_text()))


def test_a_probe_ends_with_its_caller(targets, tmp_path):
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, threading, time
        sys.path.insert(0, {str(tmp_path)!r})
        import pf_targets
        from workbook_lib.measurement import memory

        if __name__ == "__main__":
            point = dict(strategy="s", form="-", batch_size=1, scale=1.0, hidden=1, layers=1)
            threading.Thread(target=memory.measure_in_fresh_process, daemon=True,
                             args=(pf_targets.sleep, {{"out": {str(tmp_path / "pid")!r}}},
                                   point)).start()
            while not os.path.exists({str(tmp_path / "pid")!r}):
                time.sleep(0.05)
            os._exit(0)  # as if killed: nothing cleans up
    """))
    subprocess.run([sys.executable, str(script)], timeout=120, check=True)
    pid = int((tmp_path / "pid").read_text())
    end = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < end:
        time.sleep(0.05)
    assert _gone(pid)


def test_probes_run_side_by_side(targets, tmp_path):
    outs = [str(tmp_path / f"{i}.json") for i in range(2)]
    with ThreadPoolExecutor(2) as pool:
        pts = list(pool.map(lambda o: _probe(targets.report, out=o, sleep=3), outs))
    assert all(p.status == memory.STATUS_OK for p in pts)
    spans = [json.loads(open(o).read()) for o in outs]
    assert max(s["t0"] for s in spans) < min(s["t1"] for s in spans)  # they overlapped


def test_a_set_up_that_cannot_be_sent_is_refused_before_any_process(targets):
    with pytest.raises(ValueError, match="module-level function"):
        _probe(lambda cfg: None)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_probe_starts_from_a_run_whose_temp_folder_is_deep(targets, tmp_path):
    """A run sends its temporary files into its own folder (TMPDIR); the fork server's socket,
    made in the temp folder, must still fit AF_UNIX's 107 bytes."""
    deep = tmp_path / ("run-folder-" + "x" * 60) / "tmp" / ("03-" + "1" * 40)
    deep.mkdir(parents=True)
    script = tmp_path / "deep.py"
    script.write_text(textwrap.dedent(f"""
        import sys, tempfile
        sys.path.insert(0, {str(tmp_path)!r})
        import pf_targets
        from workbook_lib.measurement import memory

        if __name__ == "__main__":
            assert len(tempfile.gettempdir()) > 110
            point = dict(strategy="s", form="-", batch_size=1, scale=1.0, hidden=1, layers=1)
            got = memory.measure_in_fresh_process(pf_targets.report,
                                                  {{"out": {str(tmp_path / "d.json")!r}}}, point)
            assert got.status == memory.STATUS_OK, got
            assert tempfile.gettempdir() == {str(deep)!r}  # the run's own, after the start
    """))
    subprocess.run([sys.executable, str(script)], timeout=120, check=True,
                   env={**os.environ, "TMPDIR": str(deep)})


def test_a_probe_starts_after_a_temporary_folder_came_and_went(targets, tmp_path):
    """The CLI's preflight sends temporary files to a folder it removes at its end; a memory
    probe started later in the same process must not look for multiprocessing's files there."""
    script = tmp_path / "after.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import pf_targets
        from workbook_lib.common.files import temp_for_a_while
        from workbook_lib.measurement import memory

        if __name__ == "__main__":
            point = dict(strategy="s", form="-", batch_size=1, scale=1.0, hidden=1, layers=1)
            with temp_for_a_while("workbook-preflight-"):  # the fork server starts in there
                got = memory.measure_in_fresh_process(
                    pf_targets.report, {{"out": {str(tmp_path / "a.json")!r}}}, point)
            assert got.status == memory.STATUS_OK, got
            got = memory.measure_in_fresh_process(pf_targets.report,
                                                  {{"out": {str(tmp_path / "b.json")!r}}}, point)
            assert got.status == memory.STATUS_OK, got
    """))
    subprocess.run([sys.executable, str(script)], timeout=120, check=True)
