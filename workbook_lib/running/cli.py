"""Command line: ``python -m workbook_lib {list,run,params,...}``."""
from __future__ import annotations

import argparse
import logging
import sys

from ..running import params as params_mod
from ..exceptions import NotebookFailedError, WorkbookError
from ..running.runner import TITLES, available_notebooks, run_notebooks


def _cmd_list(args) -> int:
    for name in available_notebooks():
        print(f"{name:28s} {TITLES.get(name, '')}")
    return 0


def _cmd_params(args) -> int:
    if args.file:
        p = params_mod.load_params_file(args.file)
        for k, v in p.items():
            print(f"{k}: {v!r}")
    else:
        print(params_mod.describe())
    return 0


def _apply_sets(p: dict, sets: list[str] | None, source: str) -> dict:
    """``--set key=value`` overrides (value parsed as YAML), validated with the same schema."""
    import yaml

    if not sets:
        return p
    extra = {}
    for item in sets:
        if "=" not in item:
            raise params_mod.ParamsError(f"--set expects KEY=VALUE (got {item!r})")
        k, v = item.split("=", 1)
        extra[k.strip()] = yaml.safe_load(v)
    return params_mod.validate({**p, **extra}, source=f"{source} with --set")


def _cmd_run(args) -> int:
    p = params_mod.load_params_file(args.params)  # every check before any work
    p = _apply_sets(p, args.set, str(args.params))
    try:
        outcomes = run_notebooks(p, args.out, only=args.only, hide_code=args.hide_code,
                                 resume=args.resume, progress=not args.quiet,
                                 log_output=not args.quiet)
    except KeyboardInterrupt:
        print(f"\nINTERRUPTED: kernel and child processes stopped; finished notebooks are kept "
              f"in {args.out} (rerun with --resume to continue)", file=sys.stderr)
        return 130
    except NotebookFailedError as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        print(f"Partial notebooks and HTML (failing cell marked) are in {args.out}",
              file=sys.stderr)
        return 1
    for o in outcomes:
        print(f"{o.status:8s} {o.name:28s} {o.seconds:7.1f} s")
    print(f"Reports: {args.out}/index.html")
    return 0


def _cmd_compare(args) -> int:
    from ..analysis.compare import compare_runs

    path = compare_runs(args.run_a, args.run_b, args.out, force=args.force)
    print(f"Comparison: {path}")
    return 0


def _cmd_slurm(args) -> int:
    from ..running.slurm import write_scripts

    paths = write_scripts(args.params, args.out_dir, partition=args.partition,
                          gpus_per_node=args.gpus, nodes=args.nodes, time=args.time,
                          cpus_per_task=args.cpus_per_task, mem=args.mem, account=args.account,
                          array=not args.single_job)
    for kind, path in paths.items():
        print(f"{kind:8s} {path}")
    if "submit" in paths:
        print(f"Submit with: bash {paths['submit']}")
    else:
        print(f"Submit with: sbatch {paths['sbatch']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m workbook_lib",
                                 description="Perturbed-graph GNN performance workbook")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="show the notebooks in execution order").set_defaults(
        fn=_cmd_list)
    pp = sub.add_parser("params", help="describe the params schema, or validate a file")
    pp.add_argument("file", nargs="?", help="params file to validate and print")
    pp.set_defaults(fn=_cmd_params)
    rp = sub.add_parser("run", help="execute the notebooks with papermill")
    rp.add_argument("--params", required=True, help="params YAML (a path, or a name in params/)")
    rp.add_argument("--out", default="runs/default", help="run folder (default runs/default)")
    rp.add_argument("--only", nargs="+", metavar="NAME", help="run only these notebooks")
    rp.add_argument("--hide-code", action="store_true", help="HTML reports without code cells")
    rp.add_argument("--resume", action="store_true",
                    help="skip notebooks whose results are complete with the same params")
    rp.add_argument("--quiet", action="store_true", help="no progress bars or kernel output")
    rp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override one param (YAML value), validated like the file")
    rp.set_defaults(fn=_cmd_run)
    cp = sub.add_parser("compare", help="HTML page comparing two run folders")
    cp.add_argument("run_a")
    cp.add_argument("run_b")
    cp.add_argument("--out", help="output HTML (default: RUN_B/compare_A_vs_B.html)")
    cp.add_argument("--force", action="store_true", help="compare runs of different snapshots")
    cp.set_defaults(fn=_cmd_compare)
    sp = sub.add_parser("slurm", help="write sbatch scripts for a cluster")
    sp.add_argument("--params", required=True)
    sp.add_argument("--partition")
    sp.add_argument("--gpus", type=int, default=0, help="GPUs per node (default 0)")
    sp.add_argument("--nodes", type=int, default=1)
    sp.add_argument("--time", default="04:00:00")
    sp.add_argument("--cpus-per-task", type=int, default=8)
    sp.add_argument("--mem")
    sp.add_argument("--account")
    sp.add_argument("--single-job", action="store_true",
                    help="one job runs every notebook (default: one array task per notebook)")
    sp.add_argument("--out-dir", default="runs/slurm")
    sp.set_defaults(fn=_cmd_slurm)
    return ap


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        datefmt="%H:%M:%S")
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except WorkbookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
