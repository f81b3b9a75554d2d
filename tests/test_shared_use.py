"""Shared use: a group's run folder, two clones, the notebooks' sources under jupytext."""
import os
import stat
from pathlib import Path

import pytest

from workbook_lib.running.results import atomic_write_text, current_umask, write_results

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def umask():
    old = os.umask(0o022)
    os.umask(old)

    def set_(mask):
        os.umask(mask)
    yield set_
    os.umask(old)


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_writes_get_the_umasks_mode(tmp_path, umask, mask, mode):
    """Results, reports and snapshot caches are written through a temporary file; they get the
    mode a plain open() gives (0666 less the umask), not mkstemp's 0600."""
    from workbook_lib.data.snapshots import load_synthetic
    from workbook_lib.running import params as P

    umask(mask)
    assert current_umask() == mask
    atomic_write_text(tmp_path / "index.html", "<html></html>")
    write_results(tmp_path, "01_graph_inventory", {"x": 1}, P.defaults(), headline="h")
    cache = tmp_path / "cache"
    load_synthetic("string12", 0, 0.0005, cache)
    files = [tmp_path / "index.html", tmp_path / "01_graph_inventory.json",
             *cache.glob("*.pt"), *cache.glob("*.sha256")]
    assert len(files) == 4
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == mode, f
    assert not list(tmp_path.rglob("*.tmp"))
