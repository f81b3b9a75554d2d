"""Running the workbook on a SLURM cluster: one job per notebook, chained, resumable.

``python -m workbook_lib slurm --params FILE ...`` writes, in ``--out-dir``:

* ``notebook.sbatch``: runs one notebook (its number is the argument) with ``--resume`` into
  the run folder; notebook 04 passes the allocation's nodes and a rendezvous endpoint to
  torchrun;
* ``submit.sh``: submits one job per notebook, each with the resources it needs (01 and 05 a
  few CPUs; 02, 03 and 06 one GPU when ``--gpus`` > 0; 04 ``--nodes`` x ``--gpus``), chained:
  04 after 03, 06 after 02 and 04, and the verdict (05) only after 01-04 **succeeded**
  (``afterok``; SLURM cancels it when one of them failed or was cancelled). It prints the run
  folder it uses;
* ``workbook.sbatch`` instead, with ``--single-job``: one job runs every notebook in order.

The run folder is fixed when the scripts are written (``--run-dir``, an absolute path), not
derived from a job id, so running ``submit.sh`` again after a cancel or a failure resumes the
same folder and redoes only what is incomplete (every job runs ``--resume``). ``WORKBOOK_OUT``
overrides it at submission. Logs go to ``<out-dir>/logs`` (absolute, created now, before any
job starts). The scripts use nothing newer than bash 4.2.

Every job that uses the device (02, 03, 04, 06; the single job once) runs ``python -m workbook_lib
selftest`` on its node first and stops, before the long work, when a check fails
(``WORKBOOK_SKIP_SELFTEST=1`` at submission skips it).
"""
from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from ..catalog import BY_NAME, NOTEBOOK_NAMES
from ..exceptions import ParamsError
from ..paths import REPO_ROOT, resolve_path

LAYOUT_FILE = ".layout"
GPU_NOTEBOOKS = ("02", "03", "06")  # measure on the device: one GPU when the cluster has them


def sinfo_cpus(partition: str | None) -> int | None:
    """CPUs per node of the partition as ``sinfo`` reports them (None without sinfo)."""
    if shutil.which("sinfo") is None:
        return None
    cmd = ["sinfo", "-h", "-o", "%c"] + (["-p", partition] if partition else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    vals = [int(v.rstrip("+")) for v in out if v.rstrip("+").isdigit()]
    return max(vals) if vals else None


def _check(nodes: int, gpus: int, cpus: int | None, partition: str | None) -> int:
    if nodes <= 0:
        raise ParamsError(f"--nodes must be a positive integer (got {nodes})", key="nodes")
    if gpus < 0:
        raise ParamsError(f"--gpus must be >= 0 (got {gpus})", key="gpus")
    have = sinfo_cpus(partition)
    if cpus is None:
        cpus = min(8, have) if have else 2
    if cpus <= 0:
        raise ParamsError(f"--cpus-per-task must be a positive integer (got {cpus})")
    if have is not None and cpus > have:
        raise ParamsError(f"--cpus-per-task {cpus}: the partition "
                          f"{partition or '(default)'} has nodes with {have} CPUs, the jobs "
                          f"would pend forever; use --cpus-per-task {have} or fewer",
                          key="cpus_per_task", value=cpus)
    return cpus


def _header(name: str, time: str, partition: str | None, account: str | None,
            log_dir: Path) -> list[str]:
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --time={time}",
             f"#SBATCH --output={log_dir}/%x-%j.out"]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    return lines


def _ddp_lines() -> list[str]:
    """Bash computing notebook 04's torchrun placement from the allocation (EXTRA)."""
    return [
        'EXTRA=""',
        'if [ "$NB" = "04" ] && [ -n "${SLURM_JOB_NODELIST:-}" ] && '
        'command -v scontrol >/dev/null 2>&1; then',
        '  MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "  MASTER_PORT=$((29500 + ${SLURM_JOB_ID:-0} % 1000))",
        '  EXTRA="--set nnodes=${SLURM_NNODES:-1} --set rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT"',
        "fi",
    ]


def _selftest_lines(python: str, cond: str | None = None) -> list[str]:
    """Bash running the self-test on this job's node first; a failure stops the job before the
    long work (its table is in the job's log)."""
    q = shlex.quote
    ranks = '$([ "${NB:-}" = "04" ] && echo "" || echo "--ranks 1")'
    run = (f'{q(python)} -m workbook_lib selftest --device auto {ranks} || '
           '{ echo "self-test failed on $(hostname): not starting the notebooks (see the table '
           'above)" >&2; exit 1; }')
    skip = '[ "${WORKBOOK_SKIP_SELFTEST:-0}" != "1" ]'
    return [f"if {skip}{' && ' + cond if cond else ''}; then", f"  {run}", "fi"]


def notebook_script(*, params_file: Path, run_dir: Path, log_dir: Path, python: str,
                    repo: Path, time: str, partition: str | None,
                    account: str | None) -> str:
    """``notebook.sbatch NB``: run notebook NB (a number) with --resume into the run folder."""
    q = shlex.quote
    lines = _header("gnn-workbook", time, partition, account, log_dir) + [
        "set -eu",
        'NB="${1:?usage: sbatch notebook.sbatch NOTEBOOK_NUMBER}"',
        f"cd {q(str(repo))}",
        f'RUN="${{WORKBOOK_OUT:-{run_dir}}}"',
        *_ddp_lines(),
        "# the notebooks that use the device check this node first (04 with its GPUs' ranks)",
        *_selftest_lines(python, '[ "$NB" != "01" ] && [ "$NB" != "05" ]'),
        "# EXTRA is unquoted on purpose: it is empty or words without spaces",
        f'{q(python)} -m workbook_lib run --params {q(str(params_file))} --out "$RUN" '
        '--only "$NB" --resume --quiet $EXTRA',
    ]
    return "\n".join(lines) + "\n"


def single_script(*, params_file: Path, run_dir: Path, log_dir: Path, python: str, repo: Path,
                  time: str, partition: str | None, account: str | None, nodes: int,
                  gpus: int, cpus: int, mem: str | None) -> str:
    q = shlex.quote
    lines = _header("gnn-workbook", time, partition, account, log_dir)
    lines += [f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1",
              f"#SBATCH --cpus-per-task={cpus}"]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={gpus}")
    if mem:
        lines.append(f"#SBATCH --mem={mem}")
    lines += ["set -eu", f"cd {q(str(repo))}", f'RUN="${{WORKBOOK_OUT:-{run_dir}}}"',
              'NB="04"', *_ddp_lines(),
              f'echo "run folder: $RUN"', *_selftest_lines(python),
              f'{q(python)} -m workbook_lib run --params {q(str(params_file))} --out "$RUN" '
              "--resume --quiet $EXTRA"]
    return "\n".join(lines) + "\n"


def submit_script(*, nb_script: Path, run_dir: Path, nodes: int, gpus: int, cpus: int,
                  mem: str | None, notebooks: list[str]) -> str:
    """``submit.sh``: one job per notebook with its own resources, chained by dependencies."""
    q = shlex.quote
    mem_flag = f" --mem={mem}" if mem else ""
    cpu = f"--nodes=1 --ntasks=1 --cpus-per-task={cpus}{mem_flag}"
    gpu1 = cpu + (" --gpus-per-node=1" if gpus else "")
    ddp = (f"--nodes={nodes} --ntasks-per-node=1 --cpus-per-task={cpus}{mem_flag}"
           + (f" --gpus-per-node={gpus}" if gpus else ""))
    nums = [n[:2] for n in notebooks]
    lines = ["#!/bin/bash",
             "# Submits one job per notebook into one run folder. Run it again after a cancel",
             "# or a failure: every job runs --resume and redoes only what is incomplete.",
             "set -eu",
             f'RUN="${{WORKBOOK_OUT:-{run_dir}}}"',
             'export WORKBOOK_OUT="$RUN"',
             f"S={q(str(nb_script))}",
             'mkdir -p "$RUN"',
             "submit() {  # NAME DEPENDENCY RESOURCES...: prints the job id",
             '  local name="$1" dep="$2"; shift 2',
             '  local out',
             '  if [ -n "$dep" ]; then',
             '    out=$(sbatch --parsable --export=ALL --job-name="gnn-$name" '
             '--dependency="$dep" --kill-on-invalid-dep=yes "$@" "$S" "$name")',
             "  else",
             '    out=$(sbatch --parsable --export=ALL --job-name="gnn-$name" "$@" "$S" "$name")',
             "  fi",
             '  echo "${out%%;*}"',
             "}"]
    ids = {}
    order = [n for n in ("01", "02", "03", "04", "06", "05") if n in nums]
    for n in order:
        res = ddp if n == "04" else (gpu1 if n in GPU_NOTEBOOKS else cpu)
        deps = []
        if n == "04" and "03" in ids:
            deps = [("afterany", ids["03"])]
        if n == "06":
            deps = [("afterany", ids[d]) for d in ("02", "04") if d in ids]
        if n == "05":
            deps = [("afterok", ids[d]) for d in ("01", "02", "03", "04") if d in ids]
        dep = ""
        if deps:
            kind = deps[0][0]
            dep = kind + ":" + ":".join(f"${v}" for _, v in deps)
        var = f"J{n}"
        lines.append(f'{var}=$(submit {n} "{dep}" {res})')
        ids[n] = "{" + var + "}"
    lines += ['echo "run folder: $RUN"',
              "echo \"jobs: " + " ".join(f"{n}=${{J{n}}}" for n in order) + "\"",
              'echo "the verdict (05) runs only if 01-04 succeed; after a cancel or a failure '
              'run this script again: it resumes $RUN"']
    return "\n".join(lines) + "\n"


def write_scripts(params_file: str | Path, params: dict, out_dir: str | Path = "runs/slurm",
                  *, run_dir: str | Path | None = None, partition: str | None = None,
                  gpus_per_node: int = 0, nodes: int = 1, time: str = "04:00:00",
                  cpus_per_task: int | None = None, mem: str | None = None,
                  account: str | None = None, array: bool = True, force: bool = False,
                  python: str | None = None, repo: str | Path | None = None) -> dict:
    """Write the scripts (see the module docstring); returns ``{kind: path}``.

    Raises:
        ParamsError: impossible resources (checked against ``sinfo`` when it exists), or an
            ``out_dir`` holding scripts of the other layout (unless ``force``).
    """
    cpus = _check(nodes, gpus_per_node, cpus_per_task, partition)
    out = resolve_path(out_dir).resolve()
    layout = "chain" if array else "single"
    marker = out / LAYOUT_FILE
    if marker.is_file() and marker.read_text().strip() != layout:
        if not force:
            raise ParamsError(f"{out} holds scripts of the '{marker.read_text().strip()}' layout; "
                              "use another --out-dir, or --force to replace them")
        for f in ("notebook.sbatch", "submit.sh", "workbook.sbatch"):
            (out / f).unlink(missing_ok=True)
    log_dir = out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text(layout + "\n")
    repo = Path(repo or REPO_ROOT).resolve()
    python = python or str((repo / ".venv" / "bin" / "python"))
    params_path = resolve_path(params_file).resolve()
    run = resolve_path(run_dir or "runs/slurm-run").resolve()
    common = dict(params_file=params_path, run_dir=run, log_dir=log_dir, python=python,
                  repo=repo, time=time, partition=partition, account=account)
    paths = {}
    if array:
        nb = out / "notebook.sbatch"
        nb.write_text(notebook_script(**common))
        s = out / "submit.sh"
        s.write_text(submit_script(nb_script=nb, run_dir=run, nodes=nodes, gpus=gpus_per_node,
                                   cpus=cpus, mem=mem, notebooks=list(NOTEBOOK_NAMES)))
        s.chmod(0o755)
        paths.update(sbatch=nb, submit=s)
    else:
        w = out / "workbook.sbatch"
        w.write_text(single_script(**common, nodes=nodes, gpus=gpus_per_node, cpus=cpus,
                                   mem=mem))
        paths["sbatch"] = w
    paths["run_dir"] = run
    paths["logs"] = log_dir
    return paths


__all__ = ["write_scripts", "notebook_script", "submit_script", "single_script", "BY_NAME"]
