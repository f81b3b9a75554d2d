"""The command line's argparse types (``workbook_lib.common.argtypes``): one line, exit 2, and
the output checks create nothing."""
from __future__ import annotations

import os

import pytest

from workbook_lib import cli
from workbook_lib.common.argtypes import (int_at_least, positive_float, positive_int,
                                          why_unwritable, writable_file)
from workbook_lib.exceptions import ArgumentError


@pytest.mark.parametrize("make,value,words", [
    (lambda: positive_int("--top"), "0", "--top must be a positive integer (got 0)"),
    (lambda: positive_int("--top"), "ten", "--top must be a positive integer (got ten)"),
    (lambda: int_at_least("--runs", 2), "1", "--runs must be at least 2 (got 1)"),
    (lambda: positive_float("--tolerance"), "nan", "must be a positive number (got nan)"),
    (lambda: positive_float("--tolerance"), "inf", "must be a positive number (got inf)"),
    (lambda: positive_float("--tolerance"), "-0.1", "must be a positive number (got -0.1)"),
])
def test_numbers_refused_with_the_option_named(make, value, words):
    with pytest.raises(ArgumentError, match=words.replace("(", r"\(").replace(")", r"\)")):
        make()(value)


def test_numbers_accepted():
    assert positive_int("--top")("3") == 3 and int_at_least("--runs", 2)("2") == 2
    assert positive_float("--tolerance")("0.5") == 0.5


def test_the_error_is_not_a_value_error():
    """argparse turns a type's ValueError into its own two-line message; this one must reach
    cli.main."""
    assert not issubclass(ArgumentError, ValueError)


def test_a_writable_file_in_missing_folders_creates_nothing(tmp_path):
    target = tmp_path / "a" / "b" / "out.json"
    assert writable_file("--out")(str(target)) == target
    assert list(tmp_path.iterdir()) == []  # no folder, no probe left behind


def test_a_folder_or_an_unwritable_place_is_refused(tmp_path):
    with pytest.raises(ArgumentError, match="is a folder; name the JSON file"):
        writable_file("--out", example="bench.json", kind="JSON file")(str(tmp_path))
    assert why_unwritable(tmp_path / ("x" * 300) / "f.json")  # a name too long
    (tmp_path / "f").write_text("")
    assert why_unwritable(tmp_path / "f" / "g.json")  # under a file
    if os.geteuid() != 0:  # root writes into read-only folders
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        assert "Permission denied" in why_unwritable(ro / "new" / "out.json")


def test_a_probe_never_touches_a_file_of_its_name(tmp_path):
    (tmp_path / "out.json.probe").write_text("mine")
    assert why_unwritable(tmp_path / "out.json") is None
    assert (tmp_path / "out.json.probe").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json.probe"]


@pytest.mark.parametrize("argv,words", [
    (["trace", "x.json", "--top", "0"], "error: --top must be a positive integer (got 0)"),
    (["equal", "lazy", "nodemask", "--batch-size", "-1"],
     "error: --batch-size must be a positive integer (got -1)"),
    (["stability", "--runs", "x"], "error: --runs must be at least 2 (got x)"),
])
def test_the_cli_prints_one_line_and_exits_2(capsys, argv, words):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == words


def test_bench_with_bad_params_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "new" / "bench.json"
    assert cli.main(["bench", "--set", "scale=-1", "--out", str(out)]) == 2
    assert "scale" in capsys.readouterr().err and not (tmp_path / "new").exists()
