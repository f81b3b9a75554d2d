"""Loaded into every kernel the runner starts (an IPython extension, named in the kernel's
arguments): ipykernel's shutdown can race its own output thread.

When a notebook ends, the runner asks its kernel to shut down. ipykernel (7.4) answers the
request, stops its output thread, then flushes ``sys.stderr``; on a busy machine the flush can
reach the output thread's socket after it closed, and tornado logs the resulting
``ZMQError: Socket operation on non-socket`` (ENOTSOCK) as an uncaught error with its traceback
on the run's terminal. Nothing is lost: the kernel was already going away. ipykernel drops the
same error at debug level on another of its send paths; this filter does so for the rest, and
only for that error. Every other record of the logger still reaches the terminal.
"""
from __future__ import annotations

import logging

LOGGER = "tornado.general"  # tornado's logger for a ZMQStream callback's uncaught error


def is_shutdown_race(record: logging.LogRecord) -> bool:
    """Whether ``record`` carries a ZMQError with errno ENOTSOCK (a socket closed under a send)."""
    exc = record.exc_info[1] if record.exc_info else None
    if exc is None:
        return False
    try:
        import zmq
    except ImportError:
        return False
    return isinstance(exc, zmq.ZMQError) and exc.errno == zmq.ENOTSOCK


class ShutdownRace(logging.Filter):
    """Drops :func:`is_shutdown_race` records; passes every other one."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not is_shutdown_race(record)


def install() -> logging.Filter:
    """Attach the filter to tornado's logger once; returns the attached filter."""
    logger = logging.getLogger(LOGGER)
    for f in logger.filters:
        if isinstance(f, ShutdownRace):
            return f
    f = ShutdownRace()
    logger.addFilter(f)
    return f


def load_ipython_extension(ipython) -> None:  # noqa: ARG001 - IPython's extension hook
    install()
