"""The compile boundary's entries: what a call no entry serves builds, and what is kept.

On a miss (``miss``) the call is walked again with names; ``_boundary_explain`` says whether
it can be served (autograd, dims marked dynamic), and if so its body is generated
(``_boundary_trace.make_body``) and handed to ``torch.compile``. The new ``Entry`` joins the
boundary's table (``add``), which evicts the least recently used entry past its limit. The
body's trace hands its output to ``_on_record`` (``_boundary_record``).
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import torch

from guards.errors import DispatcherLimitWarning

from . import _compat
from ._boundary_dynamic import carried_recipes, marked
from ._boundary_explain import autograd_reason, dynamic_reason, qual, wrapped_requiring_grad
from ._boundary_record import Record, record_from
from ._boundary_trace import make_body, walk
from .base import WrapperTensor

__all__ = ["Entry", "miss", "add"]

_grad_on = _compat.is_grad_mode_on


class Entry:
    """One signature and layout: its compiled body (or the reason it falls back)."""

    __slots__ = ("sig", "full_sig", "layout", "check", "grad", "compiled", "direct", "record", "reason", "hits",
                 "used", "free", "carry")

    def __init__(self, sig, full_sig, full_checked, checked, grad, compiled, reason, free=0, carry=()) -> None:
        self.sig = sig  # the table's key (a module's parameters by their plan's number)
        self.full_sig = full_sig  # every part, for explain
        self.layout = [(t.shape, t.stride(), t.dtype, t.device, t.requires_grad) for t in full_checked]
        #: the first ``free`` checked tensors (the arguments') have dynamic sizes: dynamo's guards check them
        self.free = free
        self.check = _compat.tensor_guard(checked, free).check
        #: the checked wrappers whose carriers follow the flat inputs (_boundary_dynamic)
        self.carry = carry
        #: None: serves in either grad mode; True/False: only in that one
        self.grad = grad
        self.compiled = compiled
        #: dynamo's artifacts of ``compiled``, run without its frame entry (_boundary_direct)
        self.direct: Any = None
        self.record: Record | None = None
        self.reason = reason
        self.hits = 0
        self.used = 0


def miss(boundary: Any, key: tuple, checked: list, flat: list, args: tuple, kwargs: dict) -> Any:
    """Serve a call no entry of ``boundary`` (a ``Boundary``) serves: build its entry (compiled or falling back)."""
    if boundary._params and boundary._param_reason is None and boundary._params_relaid():
        boundary._plan_params()  # a parameter's layout changed in place: its twin is rebuilt
        return boundary(*args, **kwargs)
    names: list = []
    sig2: list = []
    checked2: list = []
    flat2: list = []
    arg_recipes = tuple(walk(a, sig2, checked2, flat2, names, f"args[{i}]") for i, a in enumerate(args))
    kw_recipes = []
    for k, v in kwargs.items():
        sig2.append(k)
        names.append(("value", f"kwargs[{k!r}]"))
        kw_recipes.append((k, walk(v, sig2, checked2, flat2, names, f"kwargs[{k!r}]")))
    n_args = len(checked2)
    boundary._walk_params(sig2, checked2, flat2, names)
    reason = autograd_reason(checked2, names) if _grad_on() else None
    if reason is None:
        reason = dynamic_reason(checked2, names, n_args)
    free = 0
    carry: tuple = ()
    if reason is None and marked(checked2[:n_args]):
        # Dims marked dynamic: one body for every size (see _boundary_dynamic).
        free = n_args
        carry = tuple(i for i, t in enumerate(checked2[:n_args]) if isinstance(t, WrapperTensor))
        every, _ = carried_recipes((*arg_recipes, *(r for _, r in kw_recipes)), len(flat))
        arg_recipes, kw_recipes = every[:len(arg_recipes)], [(k, r) for (k, _), r in
                                                             zip(kw_recipes, every[len(arg_recipes):])]
    grad = None
    if reason is None and wrapped_requiring_grad(checked2, names) is not None:
        grad = False  # wrappers requiring grad, served under no_grad only
    elif reason is not None:
        grad = True
    compiled = None
    if reason is None:
        boundary._n += 1
        tag = hashlib.sha1(repr((qual(boundary.fn), key,
                                 [tuple(t.shape) for t in checked])).encode()).hexdigest()[:10]
        entry_box: list = []
        body = make_body(boundary._twin, arg_recipes, tuple(kw_recipes), lambda *a: _on_record(entry_box[0], *a),
                         f"boundary_{tag}", sized=free > 0)
        compiled = torch.compile(body, **boundary._opts)
    e = Entry(key, tuple(sig2), checked2, checked, grad, compiled, reason, free, carry)
    if compiled is not None:
        entry_box.append(e)
    add(boundary, e)
    e.hits, e.used = 0, next(boundary._clock)
    return boundary._serve(e, flat, checked, args, kwargs)


def add(boundary: Any, e: Entry) -> None:
    """Keep ``e`` in ``boundary``'s table, evicting the least recently used entry at its limit."""
    if len(boundary) >= boundary.limit:
        if not boundary._warned:
            boundary._warned = True
            warnings.warn(
                f"subclass_kit.compile({qual(boundary.fn)}) reached its limit of {boundary.limit} artifacts; "
                "evicting the least recently used for each new one. The calls keep changing a "
                "class, ctx or layout (see Boundary.explain); keep those to a few or pass limit=.",
                DispatcherLimitWarning, stacklevel=4,
            )
        old = min((x for b in boundary._table.values() for x in b), key=lambda x: x.used)
        bucket = boundary._table[old.sig]
        bucket.remove(old)
        if not bucket:
            del boundary._table[old.sig]
        boundary.evictions += 1
    boundary._table.setdefault(e.sig, []).append(e)


def _on_record(e: Entry, leaves: list, spec: Any, rebuilt: list) -> None:
    rec = record_from(leaves, spec, rebuilt, sized=e.free > 0)
    if e.record is not None and e.record != rec:
        # dynamo traced this body again (something outside the arguments changed) and the
        # output differs: an older trace could be served with the wrong record from now on.
        rec.unsafe = rec.unsafe or "dynamo recompiled the body with another output structure"
    e.record = rec
