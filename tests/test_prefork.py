"""The fork server behind the memory probes: each call a fresh process with the caller's
environment, its output and exit code as subprocess.run gives them, a time limit that kills,
and no re-run of the caller's script (the reason it is not multiprocessing's forkserver)."""
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from workbook_lib.common import prefork

TARGETS = textwrap.dedent("""
    import os, sys, time

    def report(word):
        print(word, os.getpid(), os.getcwd(), os.environ.get("PROBE_WORD"))
        print("to stderr", file=sys.stderr)
        return 3

    def boom():
        raise RuntimeError("the target raised")

    def sleep(s):
        print(os.getpid(), flush=True)
        time.sleep(s)
        return 0
""")


@pytest.fixture
def targets(tmp_path, monkeypatch):
    (tmp_path / "pf_targets.py").write_text(TARGETS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def test_a_call_gets_its_own_process_with_the_callers_environment_and_folder(targets,
                                                                             monkeypatch):
    first = prefork.run_forked("pf_targets:report", ["hello"], preload=[], timeout_s=60)
    assert first.returncode == 3 and first.stderr.strip() == "to stderr"
    word, pid, cwd, env = first.stdout.split()
    assert word == "hello" and int(pid) != os.getpid() and env == "None"
    # set after the server started: the next call still sees them
    monkeypatch.setenv("PROBE_WORD", "later")
    monkeypatch.chdir(targets)
    second = prefork.run_forked("pf_targets:report", ["again"], preload=[], timeout_s=60)
    _, pid2, cwd2, env2 = second.stdout.split()
    assert pid2 != pid and cwd2 == str(targets) and env2 == "later"


def test_a_raising_target_exits_1_with_its_traceback(targets):
    r = prefork.run_forked("pf_targets:boom", [], preload=["pf_targets"], timeout_s=60)
    assert r.returncode == 1 and "RuntimeError: the target raised" in r.stderr
    missing = prefork.run_forked("no_such_module_here:f", [], preload=["no_such_module_here"],
                                 timeout_s=60)  # a preload that fails does not stop the server
    assert missing.returncode == 1 and "ModuleNotFoundError" in missing.stderr


def test_a_call_past_its_time_limit_is_killed(targets):
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        prefork.run_forked("pf_targets:sleep", [60], preload=["pf_targets"], timeout_s=2)
    assert time.monotonic() - t0 < 30
    assert not prefork._SERVERS and not _live_children()  # a call of its own leaves nothing


def test_a_session_shares_one_server_and_ends_it(targets):
    with prefork.session():
        pids = {prefork.run_forked("pf_targets:report", [w], preload=["pf_targets"],
                                   timeout_s=60).stdout.split()[1] for w in "ab"}
        servers = [p.pid for p, _ in prefork._SERVERS.values()]
        assert len(pids) == 2 and len(servers) == 1 and servers[0] in _live_children()
    assert not prefork._SERVERS and not _live_children()


def _live_children() -> list[int]:
    return [c.pid for c in psutil.Process().children(recursive=True)
            if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_a_script_without_a_main_guard_is_not_run_again_and_its_server_ends_with_it(targets):
    script = targets / "user_script.py"
    script.write_text(textwrap.dedent("""
        from workbook_lib.common import prefork
        print("script started", flush=True)
        held = prefork.session()
        held.__enter__()  # never left: the script just ends
        for word in ("a", "b"):
            r = prefork.run_forked("pf_targets:report", [word], preload=[], timeout_s=60)
            print(r.returncode, r.stdout.split()[0], flush=True)
        print("server", [p.pid for p, _ in prefork._SERVERS.values()][0], flush=True)
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(targets)})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[:3] == ["script started", "3 a", "3 b"]
    server = int(lines[3].split()[1])
    end = time.monotonic() + 10  # its stdin closed when the script ended
    while not _gone(server) and time.monotonic() < end:
        time.sleep(0.05)
    assert _gone(server)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
