"""Timeouts: ``timeout=`` checked before anything starts, and a call stopped through the
``terminate`` flag of its own run options once it runs past it (or once the caller's run
options, which fastseq copied for the call, ask for a stop)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import onnxruntime as ort

from fastseq.errors import InputError

#: How often a call on a copy of the caller's run options looks at theirs for a stop.
POLL = 0.01


def check_timeout(timeout: Any) -> None:
    """``timeout=`` is None or a positive, finite number of seconds (an InputError
    otherwise): anything else would fail in the timer's thread, or never fire, and the call
    would run with no timeout at all."""
    import threading

    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise InputError(f"timeout must be a positive, finite number of seconds or None, got {timeout!r}")
    if timeout > threading.TIMEOUT_MAX:
        raise InputError(
            f"timeout must be at most {threading.TIMEOUT_MAX:g} s (what a timer can wait), got {timeout!r}"
        )


def with_timeout(
    timeout: float | None, options: ort.RunOptions, call: Callable[[], Any], watched: ort.RunOptions | None = None
) -> Any:
    """Runs ``call`` and sets ``options.terminate`` (fastseq's own options for this call) if
    it takes more than ``timeout`` s (checked first, by :func:`check_timeout`, before any
    thread starts; None: no limit), or as soon as ``watched`` (the caller's run options,
    which ``options`` copies) has its ``terminate`` set."""
    import threading
    import time

    from fastseq.errors import RunTimeoutError

    check_timeout(timeout)
    if timeout is None and watched is None:
        return call()
    fired, finished = threading.Event(), threading.Event()
    deadline = time.monotonic() + (timeout if timeout is not None else math.inf)

    def watch() -> None:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                fired.set()
                options.terminate = True
                return
            if watched is not None and watched.terminate:
                options.terminate = True
                return
            if finished.wait(min(left, threading.TIMEOUT_MAX) if watched is None else min(left, POLL)):
                return

    watcher = threading.Thread(target=watch, name="fastseq-timeout", daemon=True)
    watcher.start()
    try:
        return call()
    except Exception as e:
        if fired.is_set():
            raise RunTimeoutError(f"the call ran past its timeout of {timeout:g} s and was stopped") from e
        raise
    finally:
        finished.set()
