"""Readable recompile reasons in torch's own recompile log.

With ``TORCH_LOGS=recompiles`` (or ``recompiles_verbose``) dynamo logs why it recompiles a
function. When a wrapper subclass's ctx (its meta fields) changed, dynamo can only say
``___check_metadata_<id>_c0/0``: the name of a closure. While that line is logged, a filter
installed here on torch's recompile loggers finds the cache entries that failed and the
new arguments, translates each such reason with the guards package's translator (the one
``guards.explain_recompiles`` uses) into the field, its old and its new value, and appends
the result to dynamo's message::

    Recompiling function f in prog.py:10
        triggered by the following guard failure(s):
        - 0/0: ___check_metadata_1405..._c0/0   # return x * 2 ...
        subclass_kit: 0/0: L['x'].__tensor_flatten__()[1].tag: expected 'a', got 'b' [dynamo: ___check_metadata_..._c0/0]

Each line also goes to the ``subclass_kit.recompiles`` logger at INFO (shown with
``TORCH_LOGS="recompiles,subclass_kit"`` or a handler of your own). The filter is installed
when ``subclass_kit`` is imported and costs nothing unless torch logs a recompile.
"""

from __future__ import annotations

import logging

from . import _compat

__all__ = ["install", "readable_reasons"]

_log = logging.getLogger(__name__)
_MARK = "___check_metadata_"


def readable_reasons() -> list[str]:
    """The kit's readable form of every ctx-change reason of the recompile being logged.

    Meant to run inside torch's recompile log call (the filter does); elsewhere, or when
    no reason involves a wrapper's ctx, it returns ``[]``.

    Example:
        >>> readable_reasons()
        []
    """
    found = _compat.recompile_being_logged()
    if found is None:
        return []
    reasons, entries, f_locals, code = found
    if not any(_MARK in r for r in reasons):
        return []
    from guards._translate import snapshot, split_reason, translate

    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    args = [f_locals.get(n) for n in names]
    render = lambda s: s.name_for("x")  # noqa: E731 - argument sources render their own names
    now = snapshot(args, names, render)
    out = []
    for raw in reasons:
        for line in raw.splitlines():
            if _MARK not in line:
                continue
            cid, guard = split_reason(line.strip().lstrip("- "))
            token = guard[guard.index(_MARK):].split()[0].split("(")[0]
            try:
                before = _compat.metadata_guard_expected(token)
            except LookupError as e:
                out.append(f"{cid}: a wrapper's ctx changed; old value unknown ({e})")
                continue
            # The translator compares the ctx recorded at compile time with the new one;
            # here the recorded one is what dynamo's guard holds, for whichever wrapper the
            # failing guard belongs to (the translator finds it from the guard tree).
            then = {key: (kind, src, before) for key, (kind, src, _) in now.items() if kind == "ctx"}
            out.append(translate(line.strip().lstrip("- "), entries, {cid: then}, args, names, render))
    return out


class _ReadableReasons(logging.Filter):
    """Appends the kit's readable reasons to dynamo's recompile message (never drops it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "subclass_kit_done", False):
            return True
        record.subclass_kit_done = True
        try:
            if _MARK not in record.getMessage():
                return True
            lines = readable_reasons()
        except Exception as e:  # noqa: BLE001 - a log filter must never break torch's logging
            _log.debug("could not translate a recompile reason: %s: %s", type(e).__name__, e)
            return True
        if lines:
            record.msg = record.getMessage() + "".join(f"\n    subclass_kit: {line}" for line in lines)
            record.args = ()
            for line in lines:
                _log.info("recompile: %s", line)
        return True


_FILTER = _ReadableReasons()


def install() -> None:
    """Put the filter on torch's recompile loggers (idempotent; done on ``import subclass_kit``).

    Example:
        >>> import logging
        >>> install(); install()
        >>> sum(f is _FILTER for f in logging.getLogger(_compat.RECOMPILE_LOGGERS[0]).filters)
        1
    """
    for name in _compat.RECOMPILE_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
