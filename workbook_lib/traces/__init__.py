"""Breaking a ``torch.profiler`` Chrome trace into exclusive times that add up.

Each event's *self* time (its duration minus its direct children's) is attributed once: to its
operator, its kind (the trace's ``cat``) and its *range*, the path of ``record_function`` ranges
enclosing it (``my:forward > my:inner``). Every CPU thread, process and GPU stream is its own
row, never summed with another. Wall time is the union of the ``ProfilerStep#N`` spans on the
steps' thread, of the top-level events on other threads, and of the kernels on a GPU stream.
Reads complete and begin/end events from a ``.json`` or ``.json.gz`` trace (object or array
form; Lightning's ``PyTorchProfiler`` writes the same); other events are counted as ignored.
The details: docs/trace.md and docs/development.md, "traces/".

Written here rather than taken from a library: ``torch.profiler``'s ``key_averages`` needs the
live profiler, not a trace file, and gives per-operator self times only; HTA is not a
dependency and does not give the per-range partition either.
"""

# the trace's API, read here by the ``trace`` command, its page and the profiles
from .reading import (GPU_CATS, GPU_RANGE_CATS, HARNESS_SYNC, IGNORED_CATS, OUTSIDE,  # noqa: F401
                      PH_NAMES, RANGE_CATS, STAGE_PREFIX, STEP_OPERATOR, STEP_PREFIX, SYNC_CALLS,
                      UNTRACKED, Event, Trace, build_tree, exclusive_breakdown, load_trace,
                      main_thread, naive_breakdown, range_path, read_trace, self_time, stage_of,
                      sync_wait_by_stage, union_seconds)
from .breakdown import (WALL_DEFINITION, WALL_GPU, WALL_STEPS, WALL_TOP, OpTime,  # noqa: F401
                        RowBreakdown, TraceBreakdown, breakdown)
from .diff import DiffRow, TraceDiff, diff  # noqa: F401
