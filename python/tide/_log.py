"""tide's log lines in Python's ``logging``, under the logger ``"tide"``.

On by default from ``import tide`` (``TIDE_PY_LOG=stderr`` in the environment
keeps the C++ library's own stderr lines instead); ``forward_logs(False)`` and
``forward_logs(True)`` switch at run time.  Which lines tide writes is its own
threshold: ``set_log_level("info")`` (or ``TIDE_LOG_LEVEL`` / ``MC_LOG_LEVEL``;
default warn), whatever the ``"tide"`` logger's level is.

How: tide's threads never take the GIL (one of them may hold a tide mutex a
Python thread waits for, and Python ends a thread that takes the GIL during
interpreter shutdown).  The native sink only queues each line; a daemon thread
``tide-log`` waits for lines without the GIL and hands them to ``logging``.
At exit (atexit), the sink is removed first (tide's lines go to stderr again),
then the thread is stopped and joined and what is still queued is logged, all
before the interpreter is finalized.  After ``os.fork()`` the child starts its
own thread.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Optional

from . import _tide

logger = logging.getLogger("tide")

# tide's levels (log.hpp's log_level) as logging's.
_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}
_WAIT_S = 1.0  # the drain thread's wait per call: bounds how long a missed wake-up (after fork) delays lines


class _Forwarder:
    """The one drain thread and its switch.  ``_lock`` makes a take and the
    logging of what it took one step, so flush() returns only once every line
    queued before it is in ``logging`` (whichever thread took it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # take + log; also guards _thread and _on
        self._switch = threading.Lock()  # one forward()/stop at a time
        self._thread: Optional[threading.Thread] = None
        self._stop = False
        self._on = False

    def forward(self, on: bool) -> None:
        with self._switch:
            if on == self._on:
                return
            if on:
                _tide.forward_logs(True)
                self._on = True
                self._start()
            else:
                _tide.forward_logs(False)  # returns once no tide thread is inside the sink
                self._on = False
                self._join()
                self.flush()  # what was queued before the switch

    def _start(self) -> None:
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="tide-log", daemon=True)
        self._thread.start()

    def _join(self) -> None:
        thread, self._thread = self._thread, None
        self._stop = True
        _tide.wake_logs()
        if thread is not None and thread.is_alive() and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while not self._stop:
            if _tide.wait_logs(_WAIT_S):
                self.flush()

    def flush(self) -> None:
        with self._lock:
            for level, message in _tide.take_logs():
                logger.log(_LEVELS.get(level, logging.WARNING), message)

    def at_exit(self) -> None:
        self.forward(False)

    def after_fork_in_child(self) -> None:
        # The parent's drain thread does not exist here; the locks may have
        # been held by it at the fork.
        self._lock = threading.Lock()
        self._switch = threading.Lock()
        if self._on:
            self._start()


_forwarder = _Forwarder()


def forward_logs(enable: bool = True) -> None:
    """True: tide's log lines go to the ``logging`` logger ``"tide"`` (the
    default); False: to stderr, formatted by tide (time, thread id, level)."""
    _forwarder.forward(bool(enable))


def flush_logs() -> None:
    """Hands every line tide has logged so far to ``logging`` now (the drain
    thread does so within moments anyway)."""
    _forwarder.flush()


def set_log_level(level) -> None:
    """tide's threshold for every engine of the process: "error", "warn",
    "info", "debug" or "off", or a ``logging`` level (logging.INFO, ...)."""
    if isinstance(level, int) and not isinstance(level, bool):
        level = ("debug" if level <= logging.DEBUG else "info" if level <= logging.INFO else
                 "warn" if level <= logging.WARNING else "error")
    if not isinstance(level, str):
        raise TypeError(f"level must be a str or a logging level, got {type(level).__name__}")
    _tide.set_log_level(level)


def get_log_level() -> str:
    """tide's threshold in force: one of "off", "error", "warn", "info", "debug"."""
    return _tide.get_log_level()


def _install() -> None:
    atexit.register(_forwarder.at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forwarder.after_fork_in_child)
    if os.environ.get("TIDE_PY_LOG", "logging").strip().lower() != "stderr":
        _forwarder.forward(True)

