"""Run a function in a fresh process without paying for the imports again: a fork server.

:func:`run_forked` calls ``module:function(*args)`` in a new process and returns its exit code,
stdout and stderr as :func:`subprocess.run` would. The process is forked from a server
(``python -m workbook_lib.common.prefork MODULE...``, one per calling process and preload list,
started on first use) that has imported the preload modules and done nothing else: each call
gets a process that has allocated nothing of its own, with PyTorch already imported (about 2 s
of a 3 s memory probe at the ci scale is that import).

Why not ``multiprocessing``'s ``forkserver``: it re-runs the caller's ``__main__`` script in
every child, so a user's script without an ``if __name__ == "__main__"`` guard would start its
work again in each probe. This server takes only what a call names (the function, its
JSON-serializable arguments, the caller's environment, working directory and thread count).

The server is single-threaded (a thread beside ``fork`` could leave a lock held in the child):
it reads requests on stdin, forks, and reaps its children between reads. It reports through
files in the call's own temporary folder (``pid`` when forked, ``status`` when done), so calls
from several threads never share a reply channel. It exits when its stdin closes, killing any
child still running: at the end of the :func:`session` it was started in (a call outside any
session starts a server for itself alone), or when its caller ends, however it ends. Where
``os.fork`` does not exist, the call runs in a new interpreter instead.
"""
from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager

_SERVERS: dict[tuple, tuple[subprocess.Popen, object]] = {}
_LOCK = threading.Lock()
_DEPTH = [0]  # sessions open in this process


@contextmanager
def session():
    """Calls inside share one server per preload list, which ends with the outermost session
    (a study's probes: one import of PyTorch for all of them, no process left after)."""
    with _LOCK:
        _DEPTH[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH[0] -= 1
            done = _DEPTH[0] == 0
        if done:
            close()


def close() -> None:
    """Ends every server this process started (their stdin closed; each kills any child
    still running) and waits for them."""
    with _LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for proc, errors in servers:
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        errors.close()


def run_forked(target: str, args: list, *, preload: list[str], timeout_s: float,
               threads: int | None = None) -> subprocess.CompletedProcess:
    """``target(*args)`` (``module:function``, returning an exit code) in a fresh process.

    Args:
        target: ``module:function`` run in the child; its return value is the exit code.
        args: JSON-serializable positional arguments.
        preload: modules the server imports once (e.g. ``torch`` and ``target``'s module).
        timeout_s: the child is killed after this long and
            :class:`subprocess.TimeoutExpired` raised.
        threads: the child's PyTorch intra-op threads (``torch.set_num_threads``) and
            ``OMP_NUM_THREADS``; None keeps the caller's environment.

    Raises:
        RuntimeError: the server could not start (its last line of stderr is in the message).
    """
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if not hasattr(os, "fork"):
        mod, _, fn = target.partition(":")
        code = f"import sys, json; from {mod} import {fn}; sys.exit({fn}(*json.loads(sys.argv[1])))"
        return subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True,
                              text=True, timeout=timeout_s, env=env)
    server, errors = _server(tuple(preload))
    with tempfile.TemporaryDirectory(prefix="workbook-fork-") as tmp:
        req = {"target": target, "args": args, "dir": tmp, "env": env, "cwd": os.getcwd(),
               "threads": threads}
        with _LOCK:
            server.stdin.write((json.dumps(req) + "\n").encode())
            server.stdin.flush()
        try:
            code = _wait(server, errors, tmp, timeout_s)
        finally:
            if not _DEPTH[0]:
                close()  # a call of its own: no server left behind
        out, err = (_read(os.path.join(tmp, name)) for name in ("stdout", "stderr"))
    return subprocess.CompletedProcess(target, code, out, err)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except FileNotFoundError:
        return ""


def _wait(server: subprocess.Popen, errors, tmp: str, timeout_s: float) -> int:
    """The child's exit code (negative for a signal), from the server's ``status`` file."""
    deadline = time.monotonic() + timeout_s
    status, pid_file = os.path.join(tmp, "status"), os.path.join(tmp, "pid")
    pid = None
    while not os.path.exists(status):
        if server.poll() is not None:
            raise RuntimeError(f"the fork server ({sys.executable} -m {__name__}) exited with "
                               f"code {server.returncode}: {_last_line(errors)}")
        if pid is None and os.path.exists(pid_file):
            pid = int(_read(pid_file))
        if time.monotonic() > deadline:
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                end = time.monotonic() + 10
                while not os.path.exists(status) and time.monotonic() < end:
                    time.sleep(0.01)
            raise subprocess.TimeoutExpired("forked call", timeout_s)
        time.sleep(0.01)
    return int(_read(status))


def _last_line(errors) -> str:
    errors.seek(0)
    lines = errors.read().decode(errors="replace").strip().splitlines()
    return lines[-1] if lines else "no message"


def _server(preload: tuple) -> tuple[subprocess.Popen, object]:
    """This process's server for ``preload``, started on first use (or again if it died)."""
    key = (sys.executable, preload)
    with _LOCK:
        got = _SERVERS.get(key)
        if got is None or got[0].poll() is not None:
            errors = tempfile.TemporaryFile()
            proc = subprocess.Popen([sys.executable, "-m", __name__, *preload],
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=errors)
            got = _SERVERS[key] = (proc, errors)
        return got


def _write(path: str, text: str) -> None:
    """Written whole, then renamed into place: a reader never sees half of it."""
    with open(path + ".part", "w") as fh:
        fh.write(text)
    os.replace(path + ".part", path)


def _child(req: dict) -> None:
    """In the forked child: the caller's environment, folder and threads, output to the call's
    files, then the target; never returns."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        sys.path[0] = req["cwd"]  # as `python -m` run from the caller's folder, with its
        extra = [d for d in req["env"].get("PYTHONPATH", "").split(os.pathsep)  # PYTHONPATH
                 if d and d not in sys.path]
        sys.path[1:1] = extra
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for fd, name in ((1, "stdout"), (2, "stderr")):
            f = os.open(os.path.join(req["dir"], name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                        0o600)
            os.dup2(f, fd)
            os.close(f)
        if req["threads"] is not None and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(req["threads"]))
        mod, _, fn = req["target"].partition(":")
        code = getattr(importlib.import_module(mod), fn)(*req["args"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported on the child's stderr
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 0)


def serve(preload: list[str]) -> None:
    """The server's loop (see module docs)."""
    for mod in preload:
        try:
            importlib.import_module(mod)
        except Exception:  # noqa: BLE001 - the child imports it again and reports why
            pass
    children: dict[int, str] = {}
    buf = b""
    stdin = sys.stdin.fileno()
    try:
        while True:
            ready, _, _ = select.select([stdin], [], [], 0.01 if children else None)
            if ready:
                chunk = os.read(stdin, 1 << 16)
                if not chunk:
                    return  # the caller is gone
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    req = json.loads(line)
                    pid = os.fork()
                    if pid == 0:
                        _child(req)
                    children[pid] = req["dir"]
                    _write(os.path.join(req["dir"], "pid"), str(pid))
            while children:
                pid, st = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                _write(os.path.join(children.pop(pid), "status"),
                       str(os.waitstatus_to_exitcode(st)))
    finally:
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    serve(sys.argv[1:])
