"""Running the workbook on a SLURM cluster: one job per notebook, chained, resumable.

:func:`write_scripts` (``python -m workbook_lib slurm``) writes ``notebook.sbatch`` (one notebook
with ``--resume`` into the run folder; 04 passes the allocation's nodes to torchrun) and
``submit.sh`` (one job per notebook with the resources it needs, chained on the results each
reads, the verdict ``afterok`` 03 and ``afterany`` the rest), or with ``--single-job`` one
``workbook.sbatch``. The run folder is fixed when the scripts are written, so submitting again
resumes it. Device jobs run ``selftest`` first; ``submit.sh`` stops at a refused ``sbatch`` and
refuses a run folder whose earlier jobs still run. The resources are checked against ``sinfo``
before any script is written (:class:`PartitionConfig`). Scripts: jinja2 templates in
``running/templates/``, bash 4.2. The user's guide: docs/cluster.md.
"""
from __future__ import annotations

import functools
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from ..configs.validation import Params
from ..catalog import BY_NAME
from ..common.files import current_umask
from ..configs.loading import read_params_file
from ..exceptions import ParamsError
from ..paths import REPO_ROOT, resolve_path

LAYOUT_FILE = ".layout"
GPU_NOTEBOOKS = ("02", "03", "06")  # measure on the device: one GPU when the cluster has them


def sinfo_partitions() -> dict[str, dict] | None:
    """Each partition as ``sinfo`` reports it: ``{name: {nodes, cpus, time, gpus, mem_mb,
    default}}`` (``cpus``, ``gpus`` and ``mem_mb`` the most on one node, ``time`` its limit as
    sinfo writes it), or None without sinfo."""
    if shutil.which("sinfo") is None:
        return None
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%P|%D|%c|%l|%G|%m"], capture_output=True,
                              text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:  # no controller reachable: nothing to check against
        return None
    out = done.stdout
    parts: dict[str, dict] = {}
    for line in out.splitlines():
        fields = line.strip().split("|")
        if len(fields) not in (5, 6):
            continue
        name, nodes, cpus, limit, gres = fields[:5]
        mem = fields[5].rstrip("+") if len(fields) == 6 else ""
        default = name.endswith("*")
        name = name.rstrip("*")
        p = parts.setdefault(name, {"nodes": 0, "cpus": 0, "time": limit, "gpus": 0,
                                    "mem_mb": None, "default": default})
        if mem.isdigit():
            p["mem_mb"] = max(p["mem_mb"] or 0, int(mem))
        p["nodes"] += int(nodes) if nodes.isdigit() else 0
        c = cpus.rstrip("+")
        p["cpus"] = max(p["cpus"], int(c) if c.isdigit() else 0)
        p["gpus"] = max(p["gpus"], _gres_gpus(gres))
    return parts


def _gres_gpus(gres: str) -> int:
    """GPUs per node in sinfo's GRES column: 'gpu:4', 'gpu:a100:4(S:0-1)', '(null)'."""
    total = 0
    for item in gres.split(","):
        item = item.split("(")[0]
        if item.startswith("gpu"):
            last = item.split(":")[-1]
            total += int(last) if last.isdigit() else 1
    return total


def _partition(parts: dict[str, dict], partition: str | None) -> dict | None:
    if partition:
        return parts.get(partition)
    return next((p for p in parts.values() if p["default"]), None)


def slurm_minutes(value: str) -> float | None:
    """A SLURM time limit in minutes (None for no limit).

    Raises:
        ValueError: not one of SLURM's forms (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, infinite).
    """
    v = value.strip()
    if v.lower() in ("infinite", "unlimited"):
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", v)
    if not m:
        raise ValueError(value)
    days, a, b, c = m.groups()
    if days is not None:  # D-H[:M[:S]]
        return int(days) * 1440 + int(a) * 60 + int(b or 0) + int(c or 0) / 60
    if c is not None:  # H:M:S
        return int(a) * 60 + int(b) + int(c) / 60
    return int(a) + int(b or 0) / 60  # M or M:S


_MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 ** 2}


def slurm_mb(mem: str) -> float:
    """``--mem`` as SLURM reads it (a number, megabytes unless K, M, G or T follows), in MB.

    Raises:
        ValueError: not a SLURM memory size.
    """
    m = re.fullmatch(r"(\d+)([KMGT])?B?", mem.strip().upper())
    if m is None:
        raise ValueError(f"not a SLURM memory size: {mem!r}")
    return int(m.group(1)) * _MEM_UNITS[m.group(2) or "M"]


def _check(nodes: int, gpus: int, cpus: int | None, partition: str | None,
           time: str = "04:00:00", mem: str | None = None) -> int:
    if nodes <= 0:
        raise ParamsError(f"--nodes must be a positive integer (got {nodes})", key="nodes")
    if gpus < 0:
        raise ParamsError(f"--gpus must be >= 0 (got {gpus})", key="gpus")
    try:
        minutes = slurm_minutes(time)
    except ValueError:
        raise ParamsError(f"--time {time!r} is not a SLURM time (MM, HH:MM:SS, D-HH:MM:SS, ...)",
                          key="time", value=time) from None
    if minutes is not None and minutes <= 0:
        raise ParamsError(f"--time must be positive (got {time!r})", key="time", value=time)
    try:
        mem_mb = slurm_mb(mem) if mem is not None else None
    except ValueError:
        raise ParamsError(f"--mem {mem!r} is not a SLURM memory size (e.g. 64G, 8000M)",
                          key="mem", value=mem) from None
    parts = sinfo_partitions()
    part = None
    where = f"partition {partition or '(default)'}"
    if parts:
        part = _partition(parts, partition)
        if part is None:
            raise ParamsError(f"--partition {partition or '(default)'}: sinfo knows no such "
                              f"partition (it lists: {', '.join(sorted(parts))})",
                              key="partition", value=partition)
        if nodes > part["nodes"]:
            raise ParamsError(f"--nodes {nodes}: {where} has {part['nodes']} node(s); notebook "
                              "04 would pend forever", key="nodes", value=nodes)
        try:
            limit = slurm_minutes(part["time"])
        except ValueError:
            limit = None
        if limit is not None and minutes is not None and minutes > limit:
            raise ParamsError(f"--time {time}: above the time limit of {where} ({part['time']})"
                              "; the jobs would pend forever", key="time", value=time)
        if gpus > part["gpus"]:
            have = f"{part['gpus']} GPU(s) per node" if part["gpus"] else "no GPUs"
            raise ParamsError(f"--gpus {gpus}: the nodes of {where} have {have} (sinfo's GRES)"
                              "; the jobs would pend forever", key="gpus", value=gpus)
        if mem_mb and part.get("mem_mb") and mem_mb > part["mem_mb"]:  # --mem 0: all of it
            raise ParamsError(f"--mem {mem}: the nodes of {where} have at most "
                              f"{part['mem_mb']:,} MB; sbatch would refuse every job",
                              key="mem", value=mem)
    have = part["cpus"] if part and part["cpus"] else None
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


TEMPLATES = Path(__file__).resolve().parent / "templates"


@functools.cache
def _templates():
    import jinja2  # comes with nbconvert

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, keep_trailing_newline=True)
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env


def notebook_script(*, params_file: Path, run_dir: Path, log_dir: Path, python: str,
                    repo: Path, time: str, partition: str | None,
                    account: str | None, sets: list[str] | None = None) -> str:
    """``notebook.sbatch NB``: run notebook NB (a number) with --resume into the run folder."""
    return _templates().get_template("slurm_job.sh.j2").render(
        single=False, params_file=params_file, run_dir=run_dir, log_dir=log_dir, python=python,
        repo=repo, time=time, partition=partition, account=account, sets=sets or [])


def single_script(*, params_file: Path, run_dir: Path, log_dir: Path, python: str, repo: Path,
                  time: str, partition: str | None, account: str | None, nodes: int,
                  gpus: int, cpus: int, mem: str | None, sets: list[str] | None = None) -> str:
    """``workbook.sbatch``: every notebook in order in one job."""
    return _templates().get_template("slurm_job.sh.j2").render(
        single=True, params_file=params_file, run_dir=run_dir, log_dir=log_dir, python=python,
        repo=repo, time=time, partition=partition, account=account, sets=sets or [],
        nodes=nodes, gpus=gpus, cpus=cpus, mem=mem)


def submit_script(*, nb_script: Path, run_dir: Path, nodes: int, gpus: int, cpus: int,
                  mem: str | None, notebooks: list[str], repo: Path = REPO_ROOT) -> str:
    """``submit.sh``: one job per notebook with its own resources, chained by dependencies; a
    relative ``WORKBOOK_OUT`` is taken from ``repo``, as the jobs take it."""
    mem_flag = f" --mem={mem}" if mem else ""
    cpu = f"--nodes=1 --ntasks=1 --cpus-per-task={cpus}{mem_flag}"
    gpu1 = cpu + (" --gpus-per-node=1" if gpus else "")
    ddp = (f"--nodes={nodes} --ntasks-per-node=1 --cpus-per-task={cpus}{mem_flag}"
           + (f" --gpus-per-node={gpus}" if gpus else ""))
    nums = [n[:2] for n in notebooks]
    ids, jobs = {}, []
    for n in [n for n in ("01", "02", "03", "04", "06", "05") if n in nums]:
        res = ddp if n == "04" else (gpu1 if n in GPU_NOTEBOOKS else cpu)
        deps = []
        if n == "02" and "01" in ids:  # 02 reads 01's results: never an older run's
            deps = [("afterany", ids["01"])]
        if n == "04" and "03" in ids:
            deps = [("afterany", ids["03"])]
        if n == "06":
            deps = [("afterany", ids[d]) for d in ("02", "04") if d in ids]
        if n == "05":  # needs 03's timings; reads 01, 02 and 04 when they completed
            deps = [("afterok", ids["03"])] if "03" in ids else []
            deps += [("afterany", ids[d]) for d in ("01", "02", "04") if d in ids]
        dep = ",".join(kind + ":" + ":".join(f"${v}" for k, v in deps if k == kind)
                       for kind in dict.fromkeys(k for k, _ in deps))
        jobs.append((n, dep, res))
        ids[n] = "{J" + n + "}"
    return _templates().get_template("slurm_submit.sh.j2").render(
        run_dir=run_dir, nb_script=nb_script, jobs=jobs, repo=repo)


def write_scripts(params_file: str | Path, params: Params, out_dir: str | Path = "runs/slurm",
                  *, run_dir: str | Path | None = None, partition: str | None = None,
                  gpus_per_node: int = 0, nodes: int = 1, time: str = "04:00:00",
                  cpus_per_task: int | None = None, mem: str | None = None,
                  account: str | None = None, array: bool = True, force: bool = False,
                  python: str | None = None, repo: str | Path | None = None,
                  sets: list[str] | None = None) -> dict:
    """Write the scripts (see the module docstring); returns ``{kind: path}``.

    ``params_file`` is a path or a name in ``params/`` (as ``--params`` takes it), written into
    the scripts as an absolute path; ``sets`` (``KEY=VALUE``, already validated with it) are
    passed on to every job's ``run``.

    Raises:
        ParamsError: impossible resources (checked against ``sinfo`` when it exists), or an
            ``out_dir`` holding scripts of the other layout (unless ``force``).
    """
    from ..catalog import NOTEBOOK_NAMES
    from ..configs.validation import check_gap

    check_gap(params, list(NOTEBOOK_NAMES))  # the scripts run every notebook
    cpus = _check(nodes, gpus_per_node, cpus_per_task, partition, time, mem)
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
    params_path = read_params_file(params_file)[0].resolve()  # as --params finds it
    run = resolve_path(run_dir or "runs/slurm-run").resolve()
    common = dict(params_file=params_path, run_dir=run, log_dir=log_dir, python=python,
                  repo=repo, time=time, partition=partition, account=account, sets=sets)
    paths = {}
    if array:
        nb = out / "notebook.sbatch"
        nb.write_text(notebook_script(**common))
        s = out / "submit.sh"
        s.write_text(submit_script(nb_script=nb, run_dir=run, nodes=nodes, gpus=gpus_per_node,
                                   cpus=cpus, mem=mem, notebooks=list(NOTEBOOK_NAMES),
                                   repo=repo))
        s.chmod(0o777 & ~current_umask())  # executable, readable as the umask allows
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
