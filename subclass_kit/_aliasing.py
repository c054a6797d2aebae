"""Aliasing fix-ups for wrapper subclasses, with the per-op schema work done once.

torch's ``return_and_correct_aliasing`` is the reference; it re-derives what it needs from
the schema on every call (normalizing arguments for every in-place op). Here each op gets a
small precomputed plan, so the common cases cost a dict lookup: functional ops nothing, view
ops one storage swap, in-place ops returning the mutated argument by position.
"""

from __future__ import annotations

from . import _compat

__all__ = ["correct_aliasing", "returns_input", "written_args"]

_NONE = FUNCTIONAL = 0  # plan of a functional op: nothing to fix
_PLANS: dict = {}


class _Plan:
    __slots__ = ("view_pairs", "write_args", "inplace_view", "multi", "simple_view")

    def __init__(self, func):
        info = _compat.get_alias_info(func)
        self.view_pairs = tuple(info.read_only_alias_match_indexes)
        self.inplace_view = info.is_inplace_view_op
        self.write_args = None
        self.multi = False
        # The common view (view, t, detach, slice ...): one result viewing the first argument.
        self.simple_view = (
            self.view_pairs == ((0, 0),) and not self.inplace_view and info.outs_write_aliases is None
        )
        if info.outs_write_aliases is not None:
            locs = []
            for alias in info.outs_write_aliases:
                idx = [i for i, a in enumerate(info.args) if alias in a.alias_set]
                assert len(idx) == 1, (func, alias)
                locs.append((idx[0], info.args[idx[0]].name))
            self.write_args = tuple(locs)
            self.multi = len(locs) > 1


#: ``id(func)`` of every op planned so far whose plan is a simple view (its ``_PLANS`` entry
#: holds the op, so the id is not reused): the view fast paths test membership with an int.
SIMPLE_VIEW_IDS: set = set()


def _plan(func):
    p = _PLANS.get(func)
    if p is None:
        p = _Plan(func)
        if not p.view_pairs and p.write_args is None and not p.inplace_view:
            p = _NONE
        elif p.simple_view:
            SIMPLE_VIEW_IDS.add(id(func))
        _PLANS[func] = p
    return p


def _arg(args, kwargs, idx, name):
    if idx < len(args):
        return args[idx]
    return kwargs[name]


def correct_aliasing(func, args, kwargs, out, plan=None):
    """Make ``out`` alias its inputs as ``func``'s schema says, and return what to return.

    Equivalent to ``torch.utils._python_dispatch.return_and_correct_aliasing`` for the ops a
    wrapper sees, with the schema analysis cached per op.

    Example:
        >>> import torch
        >>> from subclass_kit.examples import TwoTensor
        >>> x = TwoTensor(torch.ones(2), torch.zeros(2))
        >>> y = x.detach()  # a view: the wrapper's storage is the input's
        >>> y.untyped_storage()._cdata == x.untyped_storage()._cdata
        True
    """
    p = plan
    if p is None:
        p = _PLANS.get(func)
        if p is None:
            p = _plan(func)
    if p is _NONE:
        return out
    if p.inplace_view:
        # Rare (t_, squeeze_, as_strided_...): torch's reference also fixes the wrapper's sizes.
        return _compat.return_and_correct_aliasing(func, args, kwargs, out)
    if p.view_pairs:
        outs = out if isinstance(out, tuple) else (out,)
        for ai, oi in p.view_pairs:
            a, r = args[ai], outs[oi]
            if isinstance(r, list):
                for rr in r:
                    if type(rr) is type(a):
                        _compat.functionalize_unsafe_set(rr, a)
            elif type(r) is type(a):
                _compat.functionalize_unsafe_set(r, a)
    w = p.write_args
    if w is None:
        return out
    if not p.multi:
        idx, name = w[0]
        return _arg(args, kwargs, idx, name)
    return type(out)(_arg(args, kwargs, idx, name) for idx, name in w)


def plan(func):
    """The cached aliasing plan of ``func`` (``FUNCTIONAL`` when there is nothing to fix)."""
    p = _PLANS.get(func)
    if p is None:
        p = _plan(func)
    return p


def is_functional(func) -> bool:
    """True when ``func`` neither views nor writes its arguments (nothing to fix)."""
    p = _PLANS.get(func)
    if p is None:
        p = _plan(func)
    return p is _NONE


def returns_input(func) -> bool:
    """True when ``func`` returns (some of) its arguments: in-place and out= ops."""
    p = _PLANS.get(func)
    if p is None:
        p = _plan(func)
    return p is not _NONE and p.write_args is not None


def written_args(func) -> tuple:
    """``(position, name)`` of every argument ``func`` writes to."""
    p = _PLANS.get(func)
    if p is None:
        p = _plan(func)
    if p is _NONE or p.write_args is None:
        return ()
    return p.write_args
