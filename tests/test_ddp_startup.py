"""A real torchrun launch under the shortest stall limit, alone: its own file, so that
``test_ddp.py``'s launches run beside the other workers' tests early in ``make test`` and only
this one waits for the end, where the tests marked ``alone`` run (``tests/conftest.py``)."""
import pytest

from ddp_launches import MODULE, config, tiny_params  # noqa: F401 (a fixture)
from workbook_lib.distributed import launcher


@pytest.mark.alone  # the shortest stall limit on a healthy start: a worker beside it stalled it
def test_short_timeout_does_not_stop_a_healthy_start(tiny_params, tmp_path):
    """ddp_timeout_s=1 once stopped a healthy launch during start-up with a nameless message:
    start-up gets its own allowance (here a start-up stage of rank 1 silent for twice the
    limit), and the healthy launch completes under the shortest limit."""
    slow = launcher.MIN_TIMEOUT_S + 5
    r = launcher.launch(MODULE, config(tiny_params, steps=2, slow_rank=1, slow_start_s=slow),
                        nproc_per_node=2, out_dir=tmp_path, timeout_s=launcher.MIN_TIMEOUT_S,
                        threads_per_rank=1, startup_s=90)
    assert set(r.ranks) == {0, 1}
