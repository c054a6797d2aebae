"""Time limits for checks: a hang becomes a failure that says where it was stuck.

``deadline(seconds, what)`` arms ``SIGALRM`` (the main thread of a POSIX process): when
the time is up, :class:`CheckTimeout` is raised inside the code that is running, naming the
file and line it was interrupted at. The alarm re-fires every second until the block exits,
so code that swallows the first interruption (a broad ``except BaseException``) cannot
keep the run hanging. Nested deadlines restore the outer one's remaining time. Where no
signal can be used (a worker thread, Windows), the block runs without a limit.

A hang inside a C++ call that never returns to Python (a deadlock in a kernel) cannot be
interrupted this way; collectives have their own process-group timeouts for that.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from .errors import CheckTimeout

__all__ = ["deadline", "CheckTimeout", "where"]


def where(frame) -> str:
    """``file:line in fn`` of the innermost frame outside the checker (the code that hung)."""
    f = frame
    while f is not None:
        path = f.f_code.co_filename.replace("\\", "/")
        if "/subclass_kit/testing/" not in path and "/contextlib.py" not in path:
            return f"{os.path.basename(path)}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return ""


def _usable() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def deadline(seconds, what: str):
    """Raise :class:`CheckTimeout` in the block if it runs longer than ``seconds``.

    ``seconds`` None or <= 0: no limit.

    Example:
        >>> import time
        >>> try:
        ...     with deadline(0.2, "a sleeping op"):
        ...         time.sleep(5)
        ... except CheckTimeout as e:
        ...     print(str(e).split(" (")[0])
        a sleeping op did not finish within 0.2s
    """
    if not seconds or seconds <= 0 or not _usable():
        yield
        return
    fired = []

    def on_alarm(signum, frame):
        fired.append(1)
        raise CheckTimeout(f"{what} did not finish within {seconds:g}s (interrupted at {where(frame)})", where(frame))

    t0 = time.monotonic()
    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    outer_left, _ = signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if outer_left > 0:
            # The enclosing deadline keeps its own clock: re-arm it with what is left.
            left = outer_left - (time.monotonic() - t0)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), 1.0)
