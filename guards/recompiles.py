"""``explain_recompiles``: what dynamo recompiled and why, beside what the guards predicted.

It compiles ``fn`` with dynamo (through a guard-failure hook), calls it on each input,
and records per call whether dynamo added a cache entry and the reasons dynamo gave for
rejecting each existing one. Independently it replays the same calls against the kit's
own guard sets (with a model of automatic dynamic shapes for ``dynamic=None``) and records
whether they predicted a new compile. ``agrees`` is True when the two match on every call.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from . import _compat
from ._autodynamic import FrameState
from ._translate import snapshot, translate
from .errors import PolicyViolationError
from .guardset import GuardSet, build_call

__all__ = ["CallRecord", "RecompileReport", "explain_recompiles"]


@dataclass
class CallRecord:
    """One call: dynamo's outcome beside the prediction."""

    index: int
    compiled: bool
    predicted: bool
    reasons: list = field(default_factory=list)
    raw_reasons: list = field(default_factory=list)
    predicted_reasons: list = field(default_factory=list)
    error: str | None = None
    predicted_error: str | None = None
    output: Any = None

    @property
    def agrees(self) -> bool:
        """Same compile decision, and an error exactly when one was predicted."""
        return self.compiled == self.predicted and (self.error is None) == (self.predicted_error is None)


@dataclass
class RecompileReport:
    """Per-call records of ``explain_recompiles``; ``agrees`` when prediction matched dynamo."""

    calls: list
    backend: str
    dynamic: bool | None
    frame_count: int = 0
    guard_sets: list = field(default_factory=list)  # the kit's predicted entries, oldest first

    @property
    def agrees(self) -> bool:
        return all(c.agrees for c in self.calls)

    @property
    def compiles(self) -> int:
        """Cache entries dynamo created."""
        return sum(c.compiled for c in self.calls)

    @property
    def predicted_compiles(self) -> int:
        return sum(c.predicted for c in self.calls)

    def mismatches(self) -> list:
        return [c for c in self.calls if not c.agrees]

    def lines(self) -> list[str]:
        """Human-readable report, one block per call."""
        out = [f"{self.compiles} compiles (predicted {self.predicted_compiles}); "
               f"{'agrees' if self.agrees else 'DISAGREES'} (backend={self.backend}, dynamic={self.dynamic})"]
        for c in self.calls:
            mark = "" if c.agrees else "  <-- mismatch"
            what = "compiled" if c.compiled else "reused"
            pred = "compile" if c.predicted else "reuse"
            out.append(f"call {c.index}: {what} (predicted {pred}){mark}")
            if c.error:
                out.append(f"    dynamo error: {c.error}")
            if c.predicted_error:
                out.append(f"    predicted error: {c.predicted_error}")
            out += [f"    dynamo: {r}" for r in c.reasons]
            out += [f"    kit:    {r}" for r in c.predicted_reasons]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _param_names(fn: Callable, n: int) -> tuple:
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params][:n]
    return tuple(names) + tuple(f"arg{i}" for i in range(len(names), n))


class _Predictor:
    """The kit's side: guard sets per predicted cache entry, plus automatic dynamic state."""

    def __init__(self, dynamic):
        self.dynamic = dynamic
        # dynamic=False turns automatic dynamic off; None and True keep it on.
        self.state = None if dynamic is False else FrameState()
        self.entries: list[GuardSet] = []
        self.limit = _compat.recompile_limit()

    def step(self, args, names) -> tuple[bool, list[str], str | None]:
        for gs in self.entries:
            if gs.check(args):
                return False, [], None
        reasons = []
        for k in range(len(self.entries) - 1, -1, -1):
            lines = self.entries[k].explain(args)
            reasons.append(f"entry {k}: {lines[0] if lines else '?'}")
        if len(self.entries) >= self.limit:
            return False, reasons + ["recompile limit reached: dynamo runs the function eagerly"], None
        try:
            self.entries.append(build_call(args, names, dynamic=self.dynamic, state=self.state))
        except PolicyViolationError as e:
            return True, reasons, str(e)
        return True, reasons, None


def explain_recompiles(fn: Callable, inputs_sequence: Iterable, *, backend: str = "eager",
                       dynamic: bool | None = None) -> RecompileReport:
    """Run ``torch.compile(fn, backend=..., dynamic=...)`` over the inputs and explain recompiles.

    Each element of ``inputs_sequence`` is the tuple of positional arguments for one call.
    Resets dynamo first (as ``torch._dynamo.explain`` does), so earlier compiles of ``fn``
    do not interfere. Dynamo's reasons are kept verbatim except the opaque ones
    (``___check_metadata_<id>``, ``__dtensor_spec_<id>``), which are translated into the
    field that changed with its old and new value.

    Args:
        fn: the function to compile; should compile to one graph (graph breaks create
            further frames this report does not model).
        inputs_sequence: tuples of positional arguments.
        backend: a dynamo backend name ("eager" keeps it fast).
        dynamic: as ``torch.compile(dynamic=...)``.

    Returns:
        A ``RecompileReport``.

    Example:
        >>> import torch, guards
        >>> r = guards.explain_recompiles(lambda x: x * 2, [(torch.ones(3),), (torch.ones(3),), (torch.ones(4),)],
        ...                               dynamic=False)
        >>> [c.compiled for c in r.calls], r.agrees
        ([True, False, True], True)
        >>> r.calls[2].reasons
        ["0/0: tensor 'x' size mismatch at index 0. expected 3, actual 4"]
    """
    calls = [tuple(a) if isinstance(a, (tuple, list)) else (a,) for a in inputs_sequence]
    _compat.reset_dynamo()
    counter = _compat.compile_counter(backend)
    raw: list[str] = []
    compiled_fn = _compat.optimize(counter, dynamic=dynamic, guard_fail_fn=lambda g: raw.append(g.reason))(fn)
    predictor = _Predictor(dynamic)
    render = lambda s: s.name_for("x")  # noqa: E731 - ArgSources render their own names
    snapshots: dict[str, dict] = {}
    seen: set[str] = set()
    records = []
    with _compat.no_local_pgo():
        for i, args in enumerate(calls):
            names = _param_names(fn, len(args))
            predicted, pred_reasons, pred_err = predictor.step(args, names)
            raw.clear()
            err, out = None, None
            try:
                out = compiled_fn(*args)
            except Exception as e:  # dynamo refusing an input is an outcome, not a crash
                err = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            entries = _compat.cache_entries(fn)
            new_ids = [_compat.compile_id_str(e) for e in entries if _compat.compile_id_str(e) not in seen]
            for cid in new_ids:
                seen.add(cid)
                snapshots[cid] = snapshot(args, names, render)
            reasons = [translate(r, entries, snapshots, args, names, render) for r in raw]
            records.append(CallRecord(
                index=i,
                compiled=bool(new_ids) or (err is not None and bool(raw or i == 0 or not entries)),
                predicted=predicted,
                reasons=reasons,
                raw_reasons=[r.split("\n", 1)[0] for r in raw],
                predicted_reasons=pred_reasons,
                error=err,
                predicted_error=pred_err,
                output=out,
            ))
    return RecompileReport(records, backend, dynamic, frame_count=int(counter.frame_count),
                           guard_sets=list(predictor.entries))
