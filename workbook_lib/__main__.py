"""``python -m workbook_lib``: the command line (:mod:`workbook_lib.cli`) in a process of its own.

Before anything is imported, this process only marks the optional ``rfc3987-syntax`` package
absent: jsonschema (loaded by nbformat, papermill and nbconvert) would otherwise import it to
check ``iri`` formats no notebook schema uses, and its import is slow (docs/figures.md). A
kernel, and a user's own process that imports the library, are left as they are.
"""
import sys

sys.modules.setdefault("rfc3987_syntax", None)

from .cli import main  # noqa: E402

sys.exit(main())
