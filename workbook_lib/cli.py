"""Command line: ``python -m workbook_lib {list,run,params,...}``."""
from __future__ import annotations

import argparse
import logging
import sys

from . import params as params_mod
from .exceptions import NotebookFailedError, WorkbookError
from .runner import TITLES, available_notebooks, run_notebooks


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


def _cmd_run(args) -> int:
    p = params_mod.load_params_file(args.params)  # every check before any work
    try:
        outcomes = run_notebooks(p, args.out, only=args.only, hide_code=args.hide_code,
                                 resume=args.resume, progress=not args.quiet,
                                 log_output=not args.quiet)
    except NotebookFailedError as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        print(f"Partial notebooks and HTML (failing cell marked) are in {args.out}",
              file=sys.stderr)
        return 1
    for o in outcomes:
        print(f"{o.status:8s} {o.name:28s} {o.seconds:7.1f} s")
    print(f"Reports: {args.out}/index.html")
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
    rp.set_defaults(fn=_cmd_run)
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
