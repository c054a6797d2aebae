"""``GuardedDispatcher``: keep several compiled artifacts, run the one whose guards accept.

An artifact can be anything callable on the inputs: a ``torch.compile(fn, dynamic=False)``
function, an ``torch.export`` program's ``.module()``, an AOT-compiled package. The
dispatcher builds a ``GuardSet`` for the inputs that produced each artifact and reuses the
first artifact that accepts a new call; ``explain`` says why each one refused.

Finding the artifact. Each guard set's exact-match guards on types, ctxs and non-tensor
values are read off as a key (``_index_key``); entries whose keys read the same places share
a *schema*, and within a schema they sit in a dict by key. A call reads its key once per
schema and checks only the entries filed under it (with their full guards, so an entry is
never served on its key alone); sizes, strides and ranges are what those few checks scan.
Serving the newest of 200 entries that differ in a meta value then costs about what serving
one does. A guard that cannot be keyed exactly (a class's own ``__metadata_guard__``, an
unhashable ctx, a NaN leaf) is left to the check.

The entry limit. Like dynamo (``torch._dynamo.config.recompile_limit``, the default), a
dispatcher keeps at most ``limit`` artifacts. Reaching it warns once
(``DispatcherLimitWarning``); then each new guard set either evicts the least recently
used artifact (default), or, with ``fallback=``, is served by ``fallback(*inputs)`` without
compiling, as dynamo falls back to eager.
"""

from __future__ import annotations

import itertools
import logging
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence

from . import _compat
from ._kinds import CtxMatch, TypeMatch, ValueMatch
from ._sources import FlattenSource, Source
from .errors import DispatcherLimitWarning
from .guardset import GuardSet, build_call

__all__ = ["GuardedDispatcher", "Entry"]

_log = logging.getLogger(__name__)

_TYPE, _VALUE = "type", "value"
_SCAN_UP_TO = 2  # entries checked one by one before the index pays off


@dataclass(eq=False)
class Entry:
    """One stored artifact, the guards it was built under, and how often it was reused."""

    guards: GuardSet
    artifact: Callable[..., Any]
    hits: int = 0
    # Order of creation (the "first" accepting entry is the oldest) and of last use (for
    # eviction); the dispatcher's own bookkeeping.
    seq: int = field(default=0, repr=False)
    used: int = field(default=0, repr=False)


# (how to read, where): ``type`` reads ``type(src(inputs))``, ``value`` reads ``src(inputs)``.
_Schema = tuple[tuple[str, Source], ...]


def _index_key(gs: GuardSet) -> tuple[_Schema, tuple[Hashable, ...]]:
    """The places an entry's exact-match guards read, and the values they demand there.

    Only guards whose pass implies equal, equally hashed values qualify, so an input that
    an entry accepts always reads the entry's key (the index never hides an accepting
    entry); the entry's full check still runs on whatever the key finds.
    """
    schema: list[tuple[str, Source]] = []
    key: list[Hashable] = []
    for g in gs.guards:
        if isinstance(g, TypeMatch):
            schema.append((_TYPE, g.source))
            key.append(g.cls)
        elif isinstance(g, CtxMatch) and g.custom is None and _keyable(g.ctx):
            schema.append((_VALUE, FlattenSource(g.source, 1)))
            key.append(g.ctx)
        elif isinstance(g, ValueMatch) and _keyable(g.value):
            schema.append((_VALUE, g.source))
            key.append(g.value)
    return tuple(schema), tuple(key)


def _keyable(v: Any) -> bool:
    if isinstance(v, float) and math.isnan(v):
        return False  # NaN is guarded with v != v; as a dict key it matches only itself
    try:
        hash(v)
        return bool(v == v)
    except Exception:
        return False


def _read(schema: _Schema, inputs: tuple) -> tuple | None:
    out = []
    try:
        for how, src in schema:
            v = src(inputs)
            out.append(type(v) if how is _TYPE else v)
        key = tuple(out)
        hash(key)
    except Exception:  # the structure differs: no entry of this schema can accept
        return None
    return key


class GuardedDispatcher:
    """Callable cache of compiled artifacts keyed by guard sets.

    On each call it runs the first stored artifact whose ``GuardSet`` accepts the inputs,
    or calls ``compile_fn(*inputs)`` for a new artifact and stores it. Entries are found by
    a key on their types, ctxs and values (see the module docstring), then checked in full.

    Args:
        compile_fn: ``compile_fn(*inputs) -> callable``, called once per distinct guard set.
        names: parameter names used to render sources (default ``x`` for one input, else
            ``x0, x1, ...``).
        dynamic: as ``guards.build`` (True: unmarked dims are duck-sized symbols).
        limit: at most this many artifacts (default ``torch._dynamo.config.recompile_limit``,
            8 in torch 2.13); reaching it warns once with ``DispatcherLimitWarning``.
        fallback: at the limit, serve inputs no artifact accepts with ``fallback(*inputs)``
            (for example the uncompiled function) instead of compiling; without it the least
            recently used artifact is evicted to make room.

    Example:
        >>> import torch, guards
        >>> d = guards.GuardedDispatcher(lambda x: (lambda x: x + 1))
        >>> _ = d(torch.ones(2)); _ = d(torch.ones(2)); _ = d(torch.ones(3))
        >>> len(d), [e.hits for e in d.entries], d.limit
        (2, [1, 0], 8)
        >>> d.explain(torch.ones(4))
        ["artifact 0: L['x'].size()[0]: expected 2, got 4", "artifact 1: L['x'].size()[0]: expected 3, got 4"]
    """

    def __init__(self, compile_fn: Callable[..., Callable[..., Any]], *,
                 names: Sequence[str] | None = None, dynamic: bool | None = None,
                 limit: int | None = None, fallback: Callable[..., Any] | None = None) -> None:
        if limit is None:
            limit = _compat.recompile_limit()
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"GuardedDispatcher: limit must be a positive int, got {limit!r}.")
        if fallback is not None and not callable(fallback):
            raise TypeError(f"GuardedDispatcher: fallback must be callable, got {fallback!r}.")
        self.compile_fn = compile_fn
        self.names = tuple(names) if names is not None else None
        self.dynamic = dynamic
        self.limit = limit
        self.fallback = fallback
        self.evictions = 0
        self.fallback_calls = 0
        self._entries: list[Entry] = []
        # schema -> {key -> entries, oldest first}
        self._index: dict[_Schema, dict[tuple, list[Entry]]] = {}
        self._where: dict[int, tuple[_Schema, tuple]] = {}  # id(entry) -> its schema and key
        self._clock = itertools.count(1)
        self._warned = False

    def _names(self, n: int) -> tuple[str, ...]:
        if self.names is not None:
            if len(self.names) != n:
                raise TypeError(f"GuardedDispatcher was given names {self.names} but called with {n} inputs")
            return self.names
        return ("x",) if n == 1 else tuple(f"x{i}" for i in range(n))

    @property
    def entries(self) -> list[Entry]:
        """The stored artifacts, oldest first."""
        return list(self._entries)

    def lookup(self, *inputs: Any) -> Entry | None:
        """The entry that would serve ``inputs`` (the oldest that accepts), or None."""
        if len(self._entries) <= _SCAN_UP_TO:
            # Reading a key costs about one check; with this few entries checking them is cheaper.
            for e in self._entries:
                if e.guards.check(inputs):
                    return e
            return None
        best: Entry | None = None
        for schema, table in self._index.items():
            key = _read(schema, inputs)
            if key is None:
                continue
            for e in table.get(key, ()):
                if best is not None and e.seq > best.seq:
                    break  # filed oldest first: nothing later in this bucket is older
                if e.guards.check(inputs):
                    best = e
                    break
        return best

    def __call__(self, *inputs: Any) -> Any:
        e = self.lookup(*inputs)
        if e is not None:
            e.hits += 1
            e.used = next(self._clock)
            return e.artifact(*inputs)
        if len(self._entries) >= self.limit:
            self._at_limit(inputs)
            if self.fallback is not None:
                self.fallback_calls += 1
                return self.fallback(*inputs)
            self._evict()
        if self._entries and _log.isEnabledFor(logging.INFO):
            _log.info("GuardedDispatcher: compiling artifact %d; %s", len(self._entries),
                      "; ".join(self.explain(*inputs)))
        gs = build_call(inputs, self._names(len(inputs)), dynamic=self.dynamic)
        artifact = self.compile_fn(*inputs)
        self._add(Entry(gs, artifact))
        return artifact(*inputs)

    def _add(self, e: Entry) -> None:
        e.seq = e.used = next(self._clock)
        self._entries.append(e)
        schema, key = _index_key(e.guards)
        self._index.setdefault(schema, {}).setdefault(key, []).append(e)
        self._where[id(e)] = (schema, key)

    def _evict(self) -> None:
        old = min(self._entries, key=lambda e: e.used)
        self._entries.remove(old)
        schema, key = self._where.pop(id(old))
        bucket = self._index[schema][key]
        bucket.remove(old)
        if not bucket:
            del self._index[schema][key]
            if not self._index[schema]:
                del self._index[schema]
        self.evictions += 1
        _log.info("GuardedDispatcher: evicted the least recently used artifact (%d hits) at the limit of %d",
                  old.hits, self.limit)

    def _at_limit(self, inputs: tuple) -> None:
        if self._warned:
            return
        self._warned = True
        what = ("serving new inputs with the fallback, uncompiled" if self.fallback is not None
                else "evicting the least recently used artifact for each new one")
        warnings.warn(
            f"GuardedDispatcher({getattr(self.compile_fn, '__qualname__', self.compile_fn)!r}) reached its "
            f"limit of {self.limit} artifacts; {what}. The inputs keep changing what the guards "
            f"check (this call: {'; '.join(self.explain(*inputs)[:2])}). Mark the changing dims "
            "dynamic, keep meta values to a few, or pass limit= (the default is "
            "torch._dynamo.config.recompile_limit).",
            DispatcherLimitWarning,
            stacklevel=3,
        )

    def explain(self, *inputs: Any) -> list[str]:
        """Why each stored artifact refuses ``inputs`` (``artifact i: <line>``); an
        accepting artifact is reported as ``artifact i: accepts``."""
        out: list[str] = []
        for i, e in enumerate(self._entries):
            lines = e.guards.explain(inputs)
            if lines:
                out.extend(f"artifact {i}: {ln}" for ln in lines)
            else:
                out.append(f"artifact {i}: accepts")
        return out

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"GuardedDispatcher({len(self._entries)} artifacts, limit {self.limit})"
