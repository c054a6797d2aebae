"""The rewrap engine: per-inner results wrapped like an input, aliased per the op's schema.

torch's ``return_and_correct_aliasing`` is the reference for the aliasing; it re-derives what
it needs from the schema on every call (normalizing arguments for every in-place op). Here
each op gets a small precomputed plan (``OpAliasing``), so the common cases cost a dict
lookup: functional ops nothing, view ops one storage swap, in-place ops returning the mutated
argument by position. ``wrap_like`` and ``rewrap`` build the results through the class's
``make`` (``_runtime.py``); ``fallbacks.map_inner``, the built-in handlers and
``WrapperTensor.rewrap`` all wrap here.
"""

from __future__ import annotations

import torch

from typing import Any

from . import _compat
from . import _instance_state
from .ctx import _DTYPE, CTX_ATTR
from .errors import HandlerResultError

__all__ = ["OpAliasing", "FUNCTIONAL", "plan", "correct_aliasing", "returns_input", "written_args", "wrap_like", "rewrap", "wrap_aliased"]

_PLANS: dict = {}
#: op -> its plan, for hot paths that look a planned op up inline (``PLANS.get(func)``).
PLANS = _PLANS


class OpAliasing:
    """How an aten op aliases its arguments, read from its schema once (``WrapperTensor.op_aliasing``).

    Attributes:
        functional: the op neither views nor writes an argument (nothing to fix).
        simple_view: one result viewing the first argument (``view``, ``t``, ``slice``, ...).
        views: ``(argument index, output index)`` pairs whose output views the argument.
        writes: ``(position, name)`` of every argument the op writes (in-place, ``out=``);
            the op returns those arguments.
        inplace_view: the op changes its argument's metadata in place (``t_``, ``squeeze_``).
    """

    __slots__ = ("view_pairs", "write_args", "inplace_view", "multi", "simple_view", "functional")

    def __init__(self, func=None):
        self.functional = func is None
        if func is None:
            self.view_pairs, self.inplace_view, self.write_args = (), False, None
            self.multi = self.simple_view = False
            return
        info = _compat.get_alias_info(func)
        self.view_pairs = tuple(info.read_only_alias_match_indexes)
        self.inplace_view = info.is_inplace_view_op
        self.write_args = None
        self.multi = False
        # The common view (view, t, detach, slice ...): one result viewing the first argument.
        # Not view.dtype: whether its result is aliased depends on the element sizes (see
        # _resizes_elements), which correct_aliasing checks and the fast paths would skip.
        self.simple_view = (
            self.view_pairs == ((0, 0),) and not self.inplace_view and info.outs_write_aliases is None
            and func is not torch.ops.aten.view.dtype
        )
        if info.outs_write_aliases is not None:
            locs = []
            for alias in info.outs_write_aliases:
                idx = [i for i, a in enumerate(info.args) if alias in a.alias_set]
                assert len(idx) == 1, (func, alias)
                locs.append((idx[0], info.args[idx[0]].name))
            self.write_args = tuple(locs)
            self.multi = len(locs) > 1

    @property
    def views(self) -> tuple:
        return self.view_pairs

    @property
    def writes(self) -> tuple:
        return self.write_args or ()

    def __repr__(self) -> str:
        if self.functional:
            return "OpAliasing(functional)"
        return (f"OpAliasing(views={self.view_pairs}, writes={self.writes}, "
                f"simple_view={self.simple_view}, inplace_view={self.inplace_view})")


#: The plan of every functional op (one shared object: ``plan(f) is FUNCTIONAL``).
FUNCTIONAL = _NONE = OpAliasing()


#: ``id(func)`` of every op planned so far whose plan is a simple view (its ``_PLANS`` entry
#: holds the op, so the id is not reused): the view fast paths test membership with an int.
SIMPLE_VIEW_IDS: set = set()


def _plan(func):
    p = _PLANS.get(func)
    if p is None:
        p = OpAliasing(func)
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


def correct_aliasing(
    func: _compat.OpOverload, args: tuple, kwargs: dict[str, Any], out: Any, plan: OpAliasing | None = None
) -> Any:
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
        x = args[0]
        if out is not x and type(out) is type(x):
            _adopt_view(func, x, out)
            out = x
        return _compat.return_and_correct_aliasing(func, args, kwargs, out)
    if p.view_pairs:
        if func is _VIEW_DTYPE and _resizes_elements(args[0], out):
            return out
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


_VIEW_DTYPE = torch.ops.aten.view.dtype


def _resizes_elements(x, out) -> bool:
    """``x.view(dtype)`` to another element size, traced: its result is left unaliased.

    AOTAutograd rebuilds a compiled output that views an input of a wrapper subclass as
    ``input.as_strided(out.size(), out.stride(), out.storage_offset()).view(out.dtype)``:
    the geometry counts elements of the output's dtype but is applied in the input's, so
    an element-size change names the wrong elements (an error on a small enough input, a
    wrong shape or wrong values otherwise). Not aliased, the output is the graph's own
    result (whose inner tensors still view the input's); eager keeps the alias.
    """
    return (
        type(out) is type(x)
        and out.dtype.itemsize != x.dtype.itemsize
        and _compat.in_fake_or_proxy_mode()
    )


def _adopt_view(func, x, view):
    """An in-place view op's handler gave the out-of-place view ``view`` of ``x`` (its meta
    values may differ, e.g. a shard dim shifted by ``squeeze_``): ``x`` becomes it in place,
    keeping its identity. Each inner tensor takes its counterpart's geometry in place, so it
    must be a view of the same storage (an op that moved data is no in-place view)."""
    xd, vd = x.__dict__, view.__dict__
    for n in type(x).__kit__.inner_names:
        a, b = xd.get(n), vd.get(n)
        if a is None or a is b:
            continue
        if b is None or a.untyped_storage()._cdata != b.untyped_storage()._cdata:
            raise HandlerResultError(
                f"{type(x).__name__}: the handler of {func} returned a result whose inner tensor {n!r} "
                "is not a view of the input's: an in-place view op can only re-describe the same "
                "data. Return a view of each inner tensor, or raise UnsupportedOpError."
            )
        a.as_strided_(b.size(), b.stride(), b.storage_offset())
    xd[CTX_ATTR] = vd[CTX_ATTR]


def plan(func: Any) -> OpAliasing:
    """The cached aliasing plan of ``func`` (``FUNCTIONAL`` when there is nothing to fix).

    Example:
        >>> import torch
        >>> plan(torch.ops.aten.add_.Tensor).writes, plan(torch.ops.aten.t.default).simple_view
        (((0, 'self'),), True)
        >>> plan(torch.ops.aten.add.Tensor) is FUNCTIONAL
        True
    """
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


# ---- wrapping per-inner results ---------------------------------------------------------------
_Tensor = torch.Tensor
_unsafe_set = _compat.functionalize_unsafe_set


def wrap_like(tmpl, results, state=None):
    """Wrap per-inner results (declaration order) into ``type(tmpl)`` instances.

    ``state``: declared state values the new instances share (a view's, from its base)."""
    r0 = results[0]
    if type(r0) is _Tensor or isinstance(r0, _Tensor):
        kit = type(tmpl).__kit__
        d = tmpl.__dict__
        ctx = d[CTX_ATTR]
        dtype = ctx[_DTYPE]
        # An outer dtype that tracks the primary's (TwoTensor) follows it through the op
        # (eq gives bool); one that differs (int8 data, float outer) is the class's own.
        if r0.dtype is not dtype and dtype is d[kit.inner_names[0]].dtype:
            ctx = ctx.replace(dtype=r0.dtype)
        return kit.make(tuple(results), ctx, r0.shape, r0.stride(), r0.storage_offset(), state=state)
    if isinstance(r0, (list, tuple)):
        return type(r0)(wrap_like(tmpl, list(parts), state) for parts in zip(*results))
    return r0


def wrap_aliased(tmpl, func, args, kwargs, results, p):
    """``wrap_like`` for an op that views or writes (plan ``p``), with the aliasing fixed."""
    # A view shares its base's declared state (e.g. a pending wait) and its storage.
    state = _instance_state.of(tmpl) if p.view_pairs and type(tmpl).__kit__.state_order else None
    out = wrap_like(tmpl, results, state)
    if p.simple_view and args and args[0] is tmpl and type(out) is type(tmpl):
        # The common view (view, t, detach, slice ...): the result aliases its input directly.
        _unsafe_set(out, tmpl)
        return out
    return correct_aliasing(func, args, kwargs, out, p)


def rewrap(tmpl: torch.Tensor, func: _compat.OpOverload, args: tuple, kwargs: dict[str, Any], *results: Any) -> Any:
    """``x.rewrap(func, args, kwargs, *results)``: wrap per-inner results like ``x``, aliased per the schema.

    ``results`` holds one result per inner tensor of ``x`` (declaration order; a tensor, or a
    list/tuple of them for ops like ``split``). Each becomes an instance of ``type(x)`` with
    ``x``'s meta values (the outer dtype follows the result when it tracks the primary's) and
    the primary result's size and stride. When ``func`` is a view the results share ``x``'s
    wrapper-level storage and its declared state; an in-place op returns the argument it
    wrote. The view hook for handlers of view ops (``WrapperTensor.rewrap``).

    Example:
        >>> import torch
        >>> from subclass_kit.examples import TwoTensor
        >>> x = TwoTensor(torch.ones(2, 3), torch.zeros(2, 3))
        >>> t = torch.ops.aten.t.default
        >>> y = x.rewrap(t, (x,), {}, x.a.t(), x.b.t())
        >>> tuple(y.shape), y.untyped_storage()._cdata == x.untyped_storage()._cdata
        ((3, 2), True)
    """
    r0 = results[0]
    if id(func) in SIMPLE_VIEW_IDS and type(r0) is _Tensor and len(results) == 1 and args[0] is tmpl:
        # The common view of a one-inner wrapper (it runs on every view op): the result keeps
        # the ctx (a view keeps the dtype), shares the state and the storage.
        if r0.dtype is tmpl.dtype:  # the outer dtype, the ctx's
            kit = type(tmpl).__kit__
            d = tmpl.__dict__
            out = kit.make(results, d[CTX_ATTR], r0.shape, r0.stride(), r0.storage_offset())
            if kit.state_order:  # _instance_state.share, inline
                od = out.__dict__
                for n in kit.state_order:
                    if n in d:
                        od[n] = d[n]
            _unsafe_set(out, tmpl)
            return out
    p = plan(func)
    if p is FUNCTIONAL:
        return wrap_like(tmpl, results)
    return wrap_aliased(tmpl, func, args, kwargs, results, p)
