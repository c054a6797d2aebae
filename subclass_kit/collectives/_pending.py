"""``Pending``: one collective's outstanding wait, shared by its result and all views of it.

A cell is waited at most once: by the first data use of any wrapper holding it, by its
finalizer when the last such wrapper is collected unwaited, or at interpreter exit. So no
collective's work is leaked, and torch's "unwaited collective calls" warning never fires for
results the kit returned.
"""

from __future__ import annotations

import atexit
import weakref

from . import _compat
from .errors import CollectiveError

__all__ = ["Pending"]

_wait_op = _compat.wait_op


class Pending:
    """One collective's outstanding wait (``tensor``: its output buffer; ``what``: for errors).

    ``__del__`` is the finalizer: when the last wrapper referring to it is collected
    unwaited, the work is waited then, so it neither leaks nor trips torch's "unwaited
    collective calls" warning at exit.
    """

    __slots__ = ("tensor", "done", "what", "error", "__weakref__")
    # Kept on the class: at interpreter exit module globals may already be cleared when the
    # last wrappers die, but a live instance still reaches its class.
    _wait = staticmethod(_wait_op)

    def __init__(self, tensor, what):
        self.tensor = tensor
        self.done = False
        self.what = what
        self.error = None
        _LIVE.add(self)

    def wait(self) -> None:
        """Wait for the collective (the first call only); re-raise its failure on every call.

        A failed collective's buffer holds garbage, so every later use of any view of it
        must fail too, not read it.
        """
        if self.done:
            if self.error is not None:
                raise self.error
            return
        self.done = True
        try:
            self._wait(self.tensor)
        except RuntimeError as e:
            self.error = CollectiveError(_failure_message(self.what, e))
            self.error.__cause__ = e
            raise self.error from e
        finally:
            # Views keep their own buffer reference; a finished cell holds nothing.
            self.tensor = None

    def __del__(self):
        if not self.done:
            self.done = True
            try:
                self._wait(self.tensor)
            except Exception:  # noqa: BLE001 - a finalizer must not raise; the wait was best effort
                pass


# Every cell not yet collected. A result that is still referenced at exit (a global, or a
# wrapper kept alive from C++ by an autograd view of it) is never collected before c10d
# tears down and reports "unwaited collective calls"; this hook waits those first.
_LIVE: "weakref.WeakSet[Pending]" = weakref.WeakSet()


@atexit.register
def _wait_all_at_exit() -> None:
    for cell in list(_LIVE):
        if not cell.done:
            cell.done = True
            try:
                cell._wait(cell.tensor)
            except Exception:  # noqa: BLE001 - best effort while the interpreter exits
                pass


def _failure_message(what, e) -> str:
    if what is None:
        head = "A collective"
    else:
        op, group = what
        head = f"subclass_kit.collectives.{op} on group {group.name!r} ({group.size} ranks)"
    return (
        f"{head} did not complete: {e}. Another rank may have exited or may not have "
        "issued the same collective; the wait is bounded by the process group's timeout "
        "(init_process_group(timeout=...))."
    )
