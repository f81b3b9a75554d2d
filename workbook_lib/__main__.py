"""``python -m workbook_lib``: the command line (:mod:`workbook_lib.cli`) in a process of its own.

One thing is done here, for this process only, before anything is imported: jsonschema (which
nbformat, papermill and nbconvert load) checks the ``iri`` formats with the optional
``rfc3987-syntax`` package when it is installed (jupyter-events asks for it), and that package
builds 38 lark parsers when imported: 3 s of every ``run``, before any notebook starts. No
notebook schema uses those formats, so the command line goes without the package (marked
absent, which jsonschema's optional import expects). A kernel, and a user's own process that
imports the library, are left as they are.
"""
import sys

sys.modules.setdefault("rfc3987_syntax", None)

from .cli import main  # noqa: E402

sys.exit(main())
