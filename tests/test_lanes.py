"""The lane runner of the alone files (tests/lanes.py): jobs in lanes are pinned to one CPU
each and whole-machine jobs are not; a job's exception reaches the caller naming the job; a
whole-machine name that is not a job is refused."""
import operator
import os

import pytest

import lanes
from conftest import ROOT


@pytest.fixture(scope="module")
def ctx():
    with lanes.fork_server(["lanes"], [str(ROOT / "tests")]) as c:
        yield c


def test_lanes_pin_their_jobs_and_whole_jobs_keep_every_cpu(ctx):
    jobs = {k: (0,) for k in ("whole", "a", "b", "c")}
    got = lanes.run(ctx, os.sched_getaffinity, jobs, whole=("whole",))
    assert got["whole"] == os.sched_getaffinity(0)
    cpus = lanes.lane_cpus()
    for k in ("a", "b", "c"):  # one lane's CPU each; on one core, one unpinned lane
        if cpus:
            assert len(got[k]) == 1 and got[k] <= set(cpus), got
        else:
            assert got[k] == os.sched_getaffinity(0), got


def test_a_jobs_exception_names_the_job_and_a_stray_whole_name_is_refused(ctx):
    with pytest.raises(ZeroDivisionError) as e:
        lanes.run(ctx, operator.truediv, {"fine": (1, 2), "zero": (1, 0)})
    assert any("'zero'" in n for n in e.value.__notes__)
    with pytest.raises(ZeroDivisionError) as e:  # a whole-machine job's: no lane starts
        lanes.run(ctx, operator.truediv, {"zero": (1, 0), "fine": (1, 2)}, whole=("zero",))
    assert any("'zero'" in n for n in e.value.__notes__)
    with pytest.raises(ValueError, match="not among the jobs"):
        lanes.run(ctx, operator.truediv, {"fine": (1, 2)}, whole=("renamed",))
