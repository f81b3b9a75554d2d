"""Breaking a ``torch.profiler`` Chrome trace into exclusive times that add up.

Profiler events nest: a ``wb:forward`` range contains ``aten::linear``, which contains
``aten::addmm``... Summing every event's duration counts a parent and all its children, so
categories add up to several times the wall time (that is how a whole training step once showed
up as "optimizer 24%"). Here each event's *self* (exclusive) time - its duration minus its
direct children's - is attributed once: to its operator (the event's name), to its kind (the
trace's ``cat``: ``cpu_op``, ``user_annotation``, ``cuda_runtime``, ``kernel``...) and to its
*range*, the path of ``record_function`` ranges that enclose it (``my:forward > my:inner``).
Every thread and every GPU stream is broken down on its own, so nothing is counted twice across
threads either.

**Wall time**, per row of the trace (one CPU thread, or one GPU stream):

* a CPU thread holding ``ProfilerStep#N`` ranges (the thread that called ``prof.step()``):
  the union of those step spans; only the part of each event's self time inside the steps is
  kept (events outside every step, the profiler's own start and stop bookkeeping, and the time
  of enclosing Python frames outside the steps in a ``with_stack=True`` trace are left out and
  reported apart). The first recorded step's span also holds the end of the profiler's own
  switch to recording (a millisecond or a few); the later steps' spans match the steps' wall
  time measured outside the profiler.
* any other CPU thread (autograd's device threads, a prefetch thread, another process such as
  a DataLoader worker whose trace was merged in): the union of its top-level events;
* a GPU stream: its busy time, the union of its kernels, copies and sets. The GPU-side
  ``gpu_user_annotation`` ranges only name the kernels inside them (their own "self" time is
  the stream idling, not work).

On a CPU thread the exclusive times of the kept events add up to its wall time (every instant of
the thread's wall time belongs to exactly one innermost event); the report shows the sum and its
ratio to the wall time, so a trace where they do not (events that overlap without nesting) shows.

**What is read**: complete events (``ph: X``) and begin/end pairs (``B``/``E``, matched per
thread, innermost first), from a ``.json`` or a gzipped ``.json.gz`` file (as
``torch.profiler.tensorboard_trace_handler`` writes), in the object form
(``{"traceEvents": [...]}``) or the bare array form of the Chrome trace format. Metadata (``M``:
process and thread names, used for the labels), flow events (``s``/``t``/``f``: CPU-to-GPU
correlation and forward-backward links), instant, counter and async events are not timed work
and are counted as ignored. The profiler's own span (``cat: Trace``, ``PyTorch Profiler (0)``)
is ignored too.

**PyTorch Lightning**: ``PyTorchProfiler`` runs ``torch.profiler`` and writes the same Chrome
trace (its ``[pl][profile]...`` and ``[pl][module]...`` ranges are ``record_function`` ranges,
so they appear as ranges here); nothing Lightning-specific is needed to read it.

**DataLoader workers**: ``torch.profiler`` records the process that runs it; worker processes
appear in a trace only when it was merged from several processes (each process id is then its
own section, never summed with the main thread).

Written here rather than taken from a library: ``torch.profiler``'s own tables
(``key_averages``) need the live profiler object, not a trace file, and its ``self`` times are
per operator only; HTA (Holistic Trace Analysis) is not a dependency of this project and does not
give the per-range partition either.
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
