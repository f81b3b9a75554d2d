"""The contended rule's thresholds and its words (:mod:`.cpu`'s records read them; the meter,
:mod:`workbook_lib.measurement.cpu`, re-exports them)."""
from __future__ import annotations

CONTENDED_BELOW = 0.8  # a figure whose threads got less than this share of their asked CPU
OTHERS_SEEN = 0.1  # CPUs: other jobs that used at least this much on average were seen
RESOLUTION = 0.025  # CPUs: the coarsest tick resolution other jobs' use is told with
KERNEL_HIGH = 0.25  # a figure with at least this share of its CPU time in the kernel
FAULTS_HIGH = 20_000  # and at least this many page faults per CPU second is kernel-bound
KEEP_PAGES = ("the C allocator hands large freed blocks back to the operating system and each "
              "call faults them in again; keeping freed memory in the process removes that part "
              "(glibc: MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000 in the environment, "
              "or LD_PRELOAD a caching allocator such as jemalloc)")
KEPT_PAGES = ("freed memory was already kept in the process (mallopt), so these faults are "
              "the heap growing into new pages: glibc's aligned allocations (PyTorch's) do not "
              "reuse a freed block of the same size, and its high-water mark climbs; a caching "
              "allocator (LD_PRELOAD jemalloc or tcmalloc) reuses them, and huge pages for the "
              "heap (GLIBC_TUNABLES=glibc.malloc.hugetlb=1, with transparent huge pages not set "
              "to never) fault up to 512 times fewer, a 2 MB page for 4 kB ones (measured here: "
              "the TorchCell-shaped step's faults fell from up to 35,000 a step to under 100; "
              "its time with them was not measured on a quiet machine)")
OTHER_JOBS, OWN_PROCESSES, NOT_TOLD = "other jobs", "own processes", "not told apart"
SPIN = ("where PyTorch processes share cores, their OpenMP threads spin while they wait for "
        "each other: OMP_WAIT_POLICY=passive, or fewer threads per process, lets them share")
OWN_THREADS_WORDS = ("not where the wait was among its own threads alone (no other job seen, "
                     "its configuration fitting its CPUs, the rest of its process tree under "
                     f"{OTHERS_SEEN:g} CPU): a library's thread pool beside PyTorch's, part of "
                     "what the code costs")
ERROR_WORDS = ("by more than that share's error (the kernel adds up a running thread's CPU "
               "time once per tick, so the run times can lag by tick x sqrt(intervals x "
               "threads), about 2.5 standard deviations)")
RULE = (f"contended: its compute threads got less than {CONTENDED_BELOW:.0%} of the CPU time "
        "they asked for (run / (run + run-queue wait), per-thread schedstat)")
RULE_FALLBACK = (f"contended: CPU time below {CONTENDED_BELOW:.0%} of wall x threads (no "
                 "per-thread schedstat here)")
SHARE_ERROR_SHOWN = 0.05  # a share's error shown beside it from this many points
