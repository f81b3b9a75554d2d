"""The SLURM path (scripts checked, the job chain run under a fake sbatch), the snapshot cache
under concurrent builders, and snapshots checked before any work."""
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workbook_lib.exceptions import ParamsError
from workbook_lib.configs.cells import parameters_cell
from workbook_lib.configs.validation import load_params_file
from workbook_lib.running import slurm

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _no_cluster_here(tmp_path_factory, monkeypatch):
    """Hermetic: a machine's own SLURM commands (or ones that hang without a controller) are
    hidden; each test puts its fakes in front of these."""
    shim = tmp_path_factory.mktemp("no-slurm")
    for name in ("sinfo", "squeue", "scancel"):
        (shim / name).write_text("#!/bin/sh\nexit 1\n")
        (shim / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")


@pytest.fixture
def ci():
    return load_params_file(ROOT / "params" / "ci.yaml")


def _scripts(tmp_path, ci, **kw):
    return slurm.write_scripts(ROOT / "params" / "ci.yaml", ci, tmp_path / "slurm",
                               run_dir=tmp_path / "run", **kw)


def test_chain_scripts_paths_dependencies_resources(tmp_path, ci):
    paths = _scripts(tmp_path, ci, gpus_per_node=4, nodes=2, cpus_per_task=4, partition="gpu")
    for p in (paths["sbatch"], paths["submit"]):
        assert subprocess.run(["bash", "-n", str(p)]).returncode == 0
    nb = paths["sbatch"].read_text()
    assert re.search(r"#SBATCH --output=/\S+/logs/%x-%j.out", nb)  # absolute, made already
    assert paths["logs"].is_dir()
    assert f"cd {ROOT}" in nb and f"{ROOT}/.venv/bin/python" in nb and "--resume" in nb
    assert str(tmp_path / "run") in nb and "--params " + str(ROOT / "params" / "ci.yaml") in nb
    sub = paths["submit"].read_text()
    lines = {n: next(ln for ln in sub.splitlines() if ln.startswith(f"J{n}=")) for n in
             ("01", "02", "03", "04", "05", "06")}
    assert "--nodes=2" in lines["04"] and "--gpus-per-node=4" in lines["04"]
    assert "afterany:${J03}" in lines["04"]
    for n in ("02", "03", "06"):
        assert "--gpus-per-node=1" in lines[n] and "--nodes=1" in lines[n]
    for n in ("01", "05"):
        assert "gpus" not in lines[n] and "--nodes=1" in lines[n]
    assert '"afterok:${J03},afterany:${J01}:${J02}:${J04}"' in lines["05"]
    assert "--kill-on-invalid-dep=yes" in sub
    assert "afterany:${J02}:${J04}" in lines["06"]
    assert 'echo "run folder: $RUN"' in sub
    # the device's notebooks check the node first and stop before the long work on a failure
    assert nb.index("workbook_lib selftest") < nb.index("workbook_lib run")
    assert '[ "$NB" != "01" ] && [ "$NB" != "05" ]' in nb and "exit 1" in nb


def test_scripts_are_bash_4_2_safe(tmp_path, ci):
    for single in (False, True):
        paths = _scripts(tmp_path / str(single), ci, array=not single, gpus_per_node=1)
        text = paths["sbatch"].read_text() + (paths["submit"].read_text() if "submit" in paths
                                              else "")
        for bad in (r"\$\{\w+\[@\]\}", r"declare -A", r"\$\{\w+,,\}", r"\$\{\w+\^\^\}",
                    r"readarray|mapfile", r"&>>"):
            assert not re.search(bad, text), (bad, text)


def test_resources_checked_against_sinfo(tmp_path, ci, monkeypatch):
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sinfo").write_text("#!/bin/sh\necho 'debug*|1|2|1-00:00:00|(null)'\n")
    (shim / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
    with pytest.raises(ParamsError, match="nodes with 2 CPUs"):
        _scripts(tmp_path, ci, cpus_per_task=8)
    paths = _scripts(tmp_path, ci)  # default: what the partition has
    assert "--cpus-per-task=2" in paths["submit"].read_text()


SINFO = ("#!/bin/sh\n"
         "echo 'cpu*|1|4|2-00:00:00|(null)'\n"
         "echo 'gpu|2|16|12:00:00|gpu:a100:4(S:0-1)|512000'\n"
         "echo 'gpu|1|16|12:00:00|gpu:a100:4(S:0-1)|256000+'\n")


@pytest.mark.parametrize("kw,key,words", [
    (dict(partition="nosuch"), "partition", "no such partition"),
    (dict(nodes=2), "nodes", "has 1 node"),
    (dict(partition="gpu", nodes=4), "nodes", "has 3 node"),
    (dict(time="garbage"), "time", "not a SLURM time"),
    (dict(time="3-00:00:00"), "time", "above the time limit"),
    (dict(gpus_per_node=1), "gpus", "no GPUs"),
    (dict(partition="gpu", gpus_per_node=8), "gpus", "4 GPU(s) per node"),
    (dict(partition="gpu", mem="600G"), "mem", "at most 512,000 MB"),
    (dict(mem="lots"), "mem", "not a SLURM memory size"),
])
def test_impossible_resources_refused_before_any_script(tmp_path, ci, monkeypatch, kw, key,
                                                        words):
    """What would pend forever (PartitionConfig) is refused against sinfo, naming the option."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sinfo").write_text(SINFO)
    (shim / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
    with pytest.raises(ParamsError) as e:
        _scripts(tmp_path, ci, **kw)
    assert e.value.key == key and words in str(e.value), str(e.value)
    assert not (tmp_path / "slurm").exists()
    ok = _scripts(tmp_path, ci, partition="gpu", nodes=3, gpus_per_node=4, time="11:00:00",
                  mem="500G")
    assert "--nodes=3" in ok["submit"].read_text() and "--mem=500G" in ok["submit"].read_text()
    assert slurm.slurm_minutes("1-02:03:04") == pytest.approx(1440 + 123 + 4 / 60)
    assert slurm.slurm_minutes("90") == 90 and slurm.slurm_minutes("infinite") is None


FAILING_SBATCH = textwrap.dedent('''\
    #!/bin/sh
    # the third submission is refused, as sbatch refuses a bad partition or time
    n=$(cat "$FAKE_DIR/n" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "$FAKE_DIR/n"
    if [ "$n" = 3 ]; then
      echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2
      exit 1
    fi
    echo "$((100 + n))"
''')


def _shims(tmp_path, **scripts):
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (shim / name).write_text(text)
        (shim / name).chmod(0o755)
    return {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "FAKE_DIR": str(tmp_path)}


def test_a_refused_sbatch_fails_submit_sh(tmp_path, ci):
    env = _shims(tmp_path, sbatch=FAILING_SBATCH,
                 scancel='#!/bin/sh\necho "$@" > "$FAKE_DIR/cancelled"\n')
    env.pop("WORKBOOK_OUT", None)
    paths = _scripts(tmp_path, ci)
    r = subprocess.run(["bash", str(paths["submit"])], env=env, capture_output=True, text=True)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "sbatch refused notebook 03" in r.stderr and "Invalid partition" in r.stderr
    assert (tmp_path / "cancelled").read_text().split() == ["101", "102"]
    assert "jobs:" not in r.stdout


def test_a_second_submission_into_a_folder_in_use_is_refused(tmp_path, ci):
    sbatch = '#!/bin/sh\nn=$(cat "$FAKE_DIR/n" 2>/dev/null || echo 0); n=$((n + 1)); ' \
        'echo $n > "$FAKE_DIR/n"; echo "$((100 + n))"\n'
    squeue = ("#!/bin/sh\n# every job of the first submission is still pending or running\n"
              'for a in "$@"; do case "$a" in 10[1-6]) echo PENDING;; esac; done\n')
    env = _shims(tmp_path, sbatch=sbatch, squeue=squeue)
    env.pop("WORKBOOK_OUT", None)
    paths = _scripts(tmp_path, ci)
    first = subprocess.run(["bash", str(paths["submit"])], env=env, capture_output=True,
                           text=True)
    assert first.returncode == 0 and "01=101" in first.stdout, first.stderr
    second = subprocess.run(["bash", str(paths["submit"])], env=env, capture_output=True,
                            text=True)
    assert second.returncode == 2 and "in use by jobs 101(PENDING)" in second.stderr
    assert (tmp_path / "n").read_text().strip() == "6"  # nothing more submitted
    (tmp_path / "bin" / "squeue").write_text("#!/bin/sh\nexit 0\n")  # they finished
    third = subprocess.run(["bash", str(paths["submit"])], env=env, capture_output=True,
                           text=True)
    assert third.returncode == 0 and "01=107" in third.stdout, third.stderr


def test_single_job_refuses_another_layout(tmp_path, ci):
    _scripts(tmp_path, ci)
    with pytest.raises(ParamsError, match="'chain' layout"):
        _scripts(tmp_path, ci, array=False)
    paths = _scripts(tmp_path, ci, array=False, force=True)
    assert not (tmp_path / "slurm" / "submit.sh").exists() and paths["sbatch"].is_file()
    assert "--nodes=1" in paths["sbatch"].read_text()


FAKE_SBATCH = textwrap.dedent('''\
    #!/usr/bin/env python3
    """A fake sbatch: runs each job at once, in submission order, honouring afterok/afterany.
    CANCEL_AFTER=N: every job after the N-th is cancelled (a user's scancel)."""
    import json, os, subprocess, sys
    state = os.environ["FAKE_SLURM_STATE"]
    jobs = json.load(open(state)) if os.path.exists(state) else {}
    args, dep, kill = sys.argv[1:], "", False
    while args and args[0].startswith("--"):
        a = args.pop(0)
        if a.startswith("--dependency="):
            dep = a.split("=", 1)[1]
        kill = kill or a == "--kill-on-invalid-dep=yes"
    script, rest = args[0], args[1:]
    jid = str(len(jobs) + 1)
    status = "PENDING"
    cancel_after = int(os.environ.get("CANCEL_AFTER", "0"))
    if cancel_after and len(jobs) >= cancel_after:
        status = "CANCELLED"
    elif dep:
        for part in dep.split(","):  # every part must hold, as SLURM's comma does
            kind, *ids = part.split(":")
            states = [jobs[i] for i in ids]
            if kind == "afterok" and any(s != "COMPLETED" for s in states):
                status = "CANCELLED"  # DependencyNeverSatisfied, killed
    if status == "PENDING":  # like SLURM: the job's output goes to a log, not to sbatch's
        env = dict(os.environ, SLURM_JOB_ID=jid)
        with open(state + f".job{jid}.log", "w") as log:
            rc = subprocess.run(["bash", script, *rest], env=env, stdout=log,
                                stderr=subprocess.STDOUT).returncode
        status = "COMPLETED" if rc == 0 else "FAILED"
    jobs[jid] = status
    json.dump(jobs, open(state, "w"))
    print(jid)
''')

FAKE_NB = '''\
from workbook_lib.running.notebook import notebook_params
from workbook_lib.running.results import read_meta, write_results, checksums
P, _ = notebook_params(globals())
NAME = "{name}"
REQUIRES = {requires!r}
READS = {reads!r}
done = lambda n: read_meta(run_dir, n) is not None and read_meta(run_dir, n).complete
missing = [n for n in REQUIRES if not done(n)]
assert not missing, f"missing inputs {{missing}}"
write_results(run_dir, NAME, {{"x": 1}}, P, headline="done " + NAME,
              inputs=checksums(run_dir, REQUIRES + [n for n in READS if done(n)]))
'''


def test_chain_cancelled_then_resubmitted_finishes_in_the_same_folder(tmp_path, ci):
    import nbformat

    from workbook_lib.catalog import NOTEBOOKS

    nbs = tmp_path / "nbs"
    nbs.mkdir()
    for info in NOTEBOOKS:
        nb = nbformat.v4.new_notebook()
        p = nbformat.v4.new_code_cell(parameters_cell())
        p.metadata["tags"] = ["parameters"]
        nb.cells = [p, nbformat.v4.new_code_cell(FAKE_NB.format(name=info.name,
                                                                requires=list(info.requires),
                                                                reads=list(info.reads)))]
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
        nbformat.write(nb, str(nbs / f"{info.name}.ipynb"))
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sbatch").write_text(FAKE_SBATCH)
    (shim / "sbatch").chmod(0o755)
    paths = _scripts(tmp_path, ci, python=sys.executable)
    run = tmp_path / "run"
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "WORKBOOK_SKIP_SELFTEST": "1",
           "WORKBOOK_NOTEBOOK_DIR": str(nbs), "FAKE_SLURM_STATE": str(tmp_path / "jobs.json")}
    env.pop("WORKBOOK_OUT", None)
    # submitted from another directory; the user cancels everything after two jobs
    r = subprocess.run(["bash", str(paths["submit"])], env={**env, "CANCEL_AFTER": "2"},
                       capture_output=True, text=True, cwd=tmp_path / "bin")
    assert r.returncode == 0, r.stderr
    assert f"run folder: {run}" in r.stdout
    jobs = json.loads((tmp_path / "jobs.json").read_text())
    assert list(jobs.values()).count("COMPLETED") == 2 and "05_verdict" not in str(run)
    assert not (run / "05_verdict.json").exists()  # never a verdict from partial inputs
    # the documented resume: the same script again
    (tmp_path / "jobs.json").unlink()
    r = subprocess.run(["bash", str(paths["submit"])], env=env, capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    jobs = json.loads((tmp_path / "jobs.json").read_text())
    assert set(jobs.values()) == {"COMPLETED"}, jobs
    meta = json.loads((run / "05_verdict.json").read_text())["_meta"]
    assert meta["complete"] and set(meta["inputs"]) == {
        "01_graph_inventory", "02_mask_cost_model", "03_data_vs_model_timing", "04_ddp_scaling"}
    index = (run / "index.html").read_text()
    assert "kept from an earlier run" in index or "from an earlier run" in index


BUILD = ("import sys, json; from workbook_lib.data.snapshots import load_synthetic\n"
         "g = load_synthetic('string12', 3, 0.01, cache_dir=sys.argv[1])\n"
         "print(json.dumps(g.checksum))")


def test_concurrent_builders_of_one_snapshot_both_succeed(tmp_path):
    for round_ in range(3):
        cache = tmp_path / f"cache{round_}"
        procs = [subprocess.Popen([sys.executable, "-c", BUILD, str(cache)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(4)]
        outs = [p.communicate(timeout=300) for p in procs]
        assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
        assert len({o[0] for o in outs}) == 1
        assert not list(cache.glob("*.tmp"))


def test_a_corrupt_snapshot_file_is_refused_before_any_work(tmp_path):
    bad = tmp_path / "graph.pt"
    bad.write_bytes(b"not a pickle at all")
    pf = tmp_path / "p.yaml"
    pf.write_text(f"snapshot: {bad}\nexactness_genes: 10\n")
    r = subprocess.run([sys.executable, "-m", "workbook_lib", "run", "--params", str(pf), "--out",
                        str(tmp_path / "o")], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 2 and "could not be loaded" in r.stderr, r.stderr
    assert not list((tmp_path / "o").glob("*.ipynb"))


def test_params_by_name_and_set_overrides_reach_every_job(tmp_path, monkeypatch):
    """``slurm --params ci --set KEY=VALUE``: the jobs run the file the name stands for (an
    absolute path, whatever folder they start in) with the same overrides, quoted."""
    from workbook_lib import cli

    import shutil

    monkeypatch.chdir(tmp_path)  # 'ci' is a name in params/, not a file here
    shutil.copy(ROOT / "examples" / "dango_pyg.py", tmp_path / "mine.py")  # here only
    sets = ["hidden=8", 'pipelines=["mine.py:make_pipeline"]']
    for layout in ([], ["--single-job"]):
        out = tmp_path / f"slurm{len(layout)}"
        assert cli.main(["slurm", "--params", "ci", *[a for s in sets for a in ("--set", s)],
                         "--out-dir", str(out), *layout]) == 0
        script = (out / ("workbook.sbatch" if layout else "notebook.sbatch")).read_text()
        line = next(ln for ln in script.splitlines() if " -m workbook_lib run " in ln)
        argv = shlex.split(line.replace("$EXTRA", "").replace('"$NB"', "NB"))
        assert argv[argv.index("--params") + 1] == str(ROOT / "params" / "ci.yaml")
        assert [argv[i + 1] for i, a in enumerate(argv) if a == "--set"] == [
            "hidden=8", f'pipelines=["mine={tmp_path}/mine.py:make_pipeline"]']


def test_the_jobs_run_the_params_file_that_was_validated(tmp_path, monkeypatch):
    """``--params params/ci.yaml`` names a file here and one in the repository: ``run`` reads
    the one here, so the scripts must name that one too (they named the repository's)."""
    from workbook_lib import cli

    (tmp_path / "params").mkdir()
    mine = tmp_path / "params" / "ci.yaml"
    mine.write_text((ROOT / "params" / "ci.yaml").read_text().replace("hidden: 16",
                                                                     "hidden: 8"))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["slurm", "--params", "params/ci.yaml", "--out-dir",
                     str(tmp_path / "slurm")]) == 0
    script = (tmp_path / "slurm" / "notebook.sbatch").read_text()
    assert f"--params {mine}" in script and str(ROOT / "params") not in script


def test_a_relative_workbook_out_is_the_repositorys_from_any_folder(tmp_path, ci):
    """Found by a user trial: with WORKBOOK_OUT=runs/x, submit.sh run from /tmp made its lock and
    job list under /tmp/runs/x while the jobs (which cd to the repository) wrote to the repo's
    runs/x; a second submission from the repository was accepted on top of the first."""
    sbatch = '#!/bin/sh\nn=$(cat "$FAKE_DIR/n" 2>/dev/null || echo 0); n=$((n + 1)); ' \
        'echo $n > "$FAKE_DIR/n"; echo "$((100 + n))"\n'
    squeue = ('#!/bin/sh\nfor a in "$@"; do case "$a" in 10[1-6]) echo PENDING;; esac; done\n')
    env = _shims(tmp_path, sbatch=sbatch, squeue=squeue)
    rel = f"runs/test-relative-{tmp_path.name}"
    env["WORKBOOK_OUT"] = rel
    paths = _scripts(tmp_path, ci, repo=tmp_path / "repo")
    (tmp_path / "repo").mkdir()
    away = tmp_path / "elsewhere"
    away.mkdir()
    first = subprocess.run(["bash", str(paths["submit"])], env=env, capture_output=True,
                           text=True, cwd=away)
    assert first.returncode == 0, first.stderr
    assert f"run folder: {tmp_path / 'repo' / rel}" in first.stdout
    assert (tmp_path / "repo" / rel / ".slurm-jobs").is_file() and not (away / "runs").exists()
    second = subprocess.run(["bash", str(paths["submit"])], env=env, capture_output=True,
                            text=True, cwd=tmp_path / "repo")
    assert second.returncode == 2 and "in use by jobs 101(PENDING)" in second.stderr
