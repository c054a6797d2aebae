"""``GuardedDispatcher``: keep several compiled artifacts, run the one whose guards accept.

An artifact can be anything callable on the inputs: a ``torch.compile(fn, dynamic=False)``
function, an ``torch.export`` program's ``.module()``, an AOT-compiled package. The
dispatcher builds a ``GuardSet`` for the inputs that produced each artifact and reuses the
first artifact that accepts a new call; ``explain`` says why each one refused.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .guardset import GuardSet, build_call

__all__ = ["GuardedDispatcher", "Entry"]

_log = logging.getLogger(__name__)


@dataclass
class Entry:
    """One stored artifact, the guards it was built under, and how often it was reused."""

    guards: GuardSet
    artifact: Callable[..., Any]
    hits: int = 0


class GuardedDispatcher:
    """Callable cache of compiled artifacts keyed by guard sets.

    On each call it runs the first stored artifact whose ``GuardSet`` accepts the inputs,
    or calls ``compile_fn(*inputs)`` for a new artifact and stores it.

    Args:
        compile_fn: ``compile_fn(*inputs) -> callable``, called once per distinct guard set.
        names: parameter names used to render sources (default ``x`` for one input, else
            ``x0, x1, ...``).
        dynamic: as ``guards.build`` (True: unmarked dims are duck-sized symbols).

    Example:
        >>> import torch, guards
        >>> d = guards.GuardedDispatcher(lambda x: (lambda x: x + 1))
        >>> _ = d(torch.ones(2)); _ = d(torch.ones(2)); _ = d(torch.ones(3))
        >>> len(d), [e.hits for e in d.entries]
        (2, [1, 0])
        >>> d.explain(torch.ones(4))
        ["artifact 0: L['x'].size()[0]: expected 2, got 4", "artifact 1: L['x'].size()[0]: expected 3, got 4"]
    """

    def __init__(self, compile_fn: Callable[..., Callable[..., Any]], *,
                 names: Sequence[str] | None = None, dynamic: bool | None = None):
        self.compile_fn = compile_fn
        self.names = tuple(names) if names is not None else None
        self.dynamic = dynamic
        self._entries: list[Entry] = []

    def _names(self, n: int) -> tuple:
        if self.names is not None:
            if len(self.names) != n:
                raise TypeError(f"GuardedDispatcher was given names {self.names} but called with {n} inputs")
            return self.names
        return ("x",) if n == 1 else tuple(f"x{i}" for i in range(n))

    @property
    def entries(self) -> list[Entry]:
        """The stored artifacts, oldest first."""
        return list(self._entries)

    def lookup(self, *inputs) -> Entry | None:
        """The entry that would serve ``inputs``, or None (nothing is compiled)."""
        for e in self._entries:
            if e.guards.check(inputs):
                return e
        return None

    def __call__(self, *inputs):
        e = self.lookup(*inputs)
        if e is not None:
            e.hits += 1
            return e.artifact(*inputs)
        if self._entries and _log.isEnabledFor(logging.INFO):
            _log.info("GuardedDispatcher: compiling artifact %d; %s", len(self._entries),
                      "; ".join(self.explain(*inputs)))
        gs = build_call(inputs, self._names(len(inputs)), dynamic=self.dynamic)
        artifact = self.compile_fn(*inputs)
        self._entries.append(Entry(gs, artifact))
        return artifact(*inputs)

    def explain(self, *inputs) -> list[str]:
        """Why each stored artifact refuses ``inputs`` (``artifact i: <line>``); an
        accepting artifact is reported as ``artifact i: accepts``."""
        out = []
        for i, e in enumerate(self._entries):
            lines = e.guards.explain(inputs)
            out.extend(f"artifact {i}: {ln}" for ln in lines) if lines else out.append(f"artifact {i}: accepts")
        return out

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"GuardedDispatcher({len(self._entries)} artifacts)"
