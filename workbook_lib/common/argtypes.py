"""``type=`` helpers for the command line's paths and numbers, one error each.

Each helper takes the option's name and returns the callable argparse applies to the value. A
bad value raises :class:`~workbook_lib.exceptions.ArgumentError`, which ``cli.main`` prints as
one line and exits 2 (argparse's ``ArgumentTypeError`` would come after a usage line). The
output checks create nothing: whether a file can be written is found by writing and removing a
probe file in the nearest folder that exists.
"""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Callable

from ..exceptions import ArgumentError


def why_unwritable(path: Path) -> str | None:
    """Why a file cannot be created at ``path`` (None: it can), creating nothing that stays.

    The probe, ``NAME.probe``, is written beside ``path`` when its folder exists, else in place
    of the first folder missing on the way (which would be created there).
    """
    try:
        probe = path.absolute()
        while not probe.parent.exists():
            probe = probe.parent
        probe = probe.with_name(probe.name + ".probe")
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # never touch a file of that name: a fresh one beside it
            fd, name = tempfile.mkstemp(dir=probe.parent)
            probe = Path(name)
        os.close(fd)
        probe.unlink()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def nonempty_path(option: str) -> Callable[[str], str]:
    """Any path, but not an empty one (``--out: empty path``)."""
    def check(value: str) -> str:
        if not value.strip():
            raise ArgumentError(f"{option}: empty path")
        return value
    check.__name__ = "nonempty_path"
    return check


def writable_file(option: str, *, example: str | None = None,
                  kind: str = "file") -> Callable[[str], Path]:
    """A file this process can create or replace: not empty, not a folder, writable where it
    goes. When a folder is given, ``example`` names a file in it to suggest (``bench.json``),
    and ``kind`` says what the file is (``JSON file``)."""
    def check(value: str) -> Path:
        nonempty_path(option)(value)
        out = Path(value)
        if out.is_dir():
            hint = f"; name the {kind} (e.g. {out / example})" if example else ""
            raise ArgumentError(f"{option} {out}: is a folder{hint}")
        why = why_unwritable(out)
        if why:
            raise ArgumentError(f"{option} {out}: cannot write there ({why})")
        return out
    check.__name__ = "writable_file"
    return check


def existing_file(*, what: str = "file") -> Callable[[str], Path]:
    """A file that exists (``NAME: no such executed notebook``; the name is the argument's)."""
    def check(value: str) -> Path:
        src = Path(value)
        if not src.is_file():
            raise ArgumentError(f"{src}: no such {what}")
        return src
    check.__name__ = "existing_file"
    return check


def positive_int(option: str) -> Callable[[str], int]:
    """An integer of at least 1."""
    return int_at_least(option, 1)


def int_at_least(option: str, least: int) -> Callable[[str], int]:
    """An integer of at least ``least`` (``--runs must be at least 2 (got 1)``; for 1, ``must be
    a positive integer``)."""
    want = "a positive integer" if least == 1 else f"at least {least}"

    def check(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = None
        if n is None or n < least:
            raise ArgumentError(f"{option} must be {want} (got {value})")
        return n
    check.__name__ = "int"
    return check


def positive_float(option: str) -> Callable[[str], float]:
    """A finite number above 0 (NaN and infinity refused)."""
    def check(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and x > 0):
            raise ArgumentError(f"{option} must be a positive number (got {value})")
        return x
    check.__name__ = "float"
    return check
