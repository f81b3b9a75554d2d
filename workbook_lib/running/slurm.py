"""Writing sbatch scripts: one job-array task per notebook, or one job for all of them."""
from __future__ import annotations

import shlex
from pathlib import Path

from ..paths import REPO_ROOT
from ..running.params import load_params_file
from ..running.runner import available_notebooks


def sbatch_script(params_file: str | Path, *, notebooks: list[str] | None = None,
                  partition: str | None = None, gpus_per_node: int = 0, nodes: int = 1,
                  time: str = "04:00:00", cpus_per_task: int = 8, mem: str | None = None,
                  account: str | None = None, array: bool = True, job_name: str = "gnn-workbook",
                  python: str = ".venv/bin/python", repo: str | Path | None = None) -> str:
    """The text of an sbatch script running the workbook with ``params_file``.

    ``array=True``: one array task per notebook but the verdict (05), which runs in a second
    job started after the array (see :func:`submit_script`). ``array=False``: one job runs all.
    Notebook 04 gets ``nnodes`` and ``rdzv_endpoint`` from the allocation, so its torchrun
    launch spans the allocated nodes (through ``srun`` when ``nodes > 1``).
    """
    load_params_file(params_file)  # refuse a bad params file now, not on the cluster
    if nodes <= 0 or gpus_per_node < 0 or cpus_per_task <= 0:
        raise ValueError(f"'nodes', 'cpus_per_task' must be positive and 'gpus_per_node' >= 0 "
                         f"(got {nodes}, {cpus_per_task}, {gpus_per_node})")
    names = notebooks or available_notebooks()
    batch = [n for n in names if not n.startswith("05_")] if array else names
    repo = Path(repo or REPO_ROOT)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}", f"#SBATCH --time={time}",
             f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --cpus-per-task={cpus_per_task}"]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    if gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    if mem:
        lines.append(f"#SBATCH --mem={mem}")
    if array:
        lines.append(f"#SBATCH --array=0-{len(batch) - 1}")
        lines.append("#SBATCH --output=runs/slurm/%x-%A_%a.out")
    else:
        lines.append("#SBATCH --output=runs/slurm/%x-%j.out")
    q = shlex.quote
    lines += [
        "set -euo pipefail",
        f"cd {q(str(repo))}",
        f"PY={q(python)}",
        f"PARAMS={q(str(params_file))}",
        'RUN_ID="${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}"',
        'OUT="${WORKBOOK_OUT:-runs/slurm-$RUN_ID}"',
        'mkdir -p "$OUT" runs/slurm',
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "MASTER_PORT=$((29500 + RUN_ID % 1000))",
        "# notebook 04: torchrun over the allocated nodes (world sizes = nodes x GPUs per node)",
        'DDP_SET=(--set "nnodes=$SLURM_NNODES" --set "rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT")',
        "NOTEBOOKS=(" + " ".join(q(n) for n in batch) + ")",
    ]
    if array:
        lines += [
            'NB="${NOTEBOOKS[$SLURM_ARRAY_TASK_ID]}"',
            'EXTRA=()',
            'if [[ "$NB" == 04_* ]]; then EXTRA=("${DDP_SET[@]}"); fi',
            '"$PY" -m workbook_lib run --params "$PARAMS" --out "$OUT" --only "$NB" --resume '
            '--quiet "${EXTRA[@]}"',
        ]
    else:
        lines += [
            '"$PY" -m workbook_lib run --params "$PARAMS" --out "$OUT" --only "${NOTEBOOKS[@]}" '
            '--resume --quiet "${DDP_SET[@]}"',
        ]
    return "\n".join(lines) + "\n"


def verdict_script(params_file: str | Path, *, partition: str | None = None,
                   time: str = "00:30:00", account: str | None = None,
                   job_name: str = "gnn-workbook-verdict", python: str = ".venv/bin/python",
                   repo: str | Path | None = None) -> str:
    """The job that runs notebook 05 in the array's run folder (after the array ends)."""
    q = shlex.quote
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}", f"#SBATCH --time={time}",
             "#SBATCH --nodes=1", "#SBATCH --output=runs/slurm/%x-%j.out"]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    lines += ["set -euo pipefail", f"cd {q(str(Path(repo or REPO_ROOT)))}",
              ': "${WORKBOOK_OUT:?set WORKBOOK_OUT to the array run folder}"',
              f'{q(python)} -m workbook_lib run --params {q(str(params_file))} --out "$WORKBOOK_OUT" '
              "--only 05_verdict --quiet"]
    return "\n".join(lines) + "\n"


def submit_script(array_path: Path, verdict_path: Path) -> str:
    """Submits the array, then the verdict with ``--dependency=afterany`` on it."""
    q = shlex.quote
    return "\n".join([
        "#!/bin/bash", "set -euo pipefail",
        f"JID=$(sbatch --parsable {q(str(array_path))})",
        'OUT="runs/slurm-${JID%%;*}"',
        f'sbatch --dependency=afterany:"$JID" --export=ALL,WORKBOOK_OUT="$OUT" {q(str(verdict_path))}',
        'echo "array job $JID -> $OUT (verdict queued after it)"']) + "\n"


def write_scripts(params_file: str | Path, out_dir: str | Path = "runs/slurm", **kw) -> dict:
    """Write the sbatch script(s) (and, for arrays, the verdict job and a submit helper)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    main = out / "workbook.sbatch"
    main.write_text(sbatch_script(params_file, **kw))
    paths["sbatch"] = main
    if kw.get("array", True):
        v = out / "verdict.sbatch"
        v.write_text(verdict_script(params_file, partition=kw.get("partition"),
                                    account=kw.get("account"), python=kw.get("python", ".venv/bin/python"),
                                    repo=kw.get("repo")))
        s = out / "submit.sh"
        s.write_text(submit_script(main, v))
        s.chmod(0o755)
        paths.update(verdict=v, submit=s)
    return paths
