"""Command line: ``python -m workbook_lib {run,list,params,bench,compare,equal,stability,slurm,...}``.

Every bad argument (a params file that is not YAML, a ``--set`` that does not parse, an ``--out``
that cannot be written) gets a one-line error and exit status 2 before any work; a failed
notebook exits 1 with a summary; an interrupt exits 130.
"""
from __future__ import annotations

import logging
import sys

from ..configs.loading import MAX_MESSAGE
from ..common.text import one_line
from ..exceptions import WorkbookError
from .parser import build_parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("papermill").setLevel(logging.WARNING)
    try:
        args = build_parser().parse_args(argv)  # a bad path or number: ArgumentError, below
        return args.fn(args)
    except WorkbookError as exc:
        print(f"error: {one_line(exc, MAX_MESSAGE, keep_end=True)}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        print(f"error: {one_line(f'{exc.strerror or exc}{where}', MAX_MESSAGE, keep_end=True)}",
              file=sys.stderr)
        return 2
