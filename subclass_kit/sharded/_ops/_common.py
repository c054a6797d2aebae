"""What every op family shares: finding the mesh, the global output metadata, moving
arguments to the placements a rule wants, and wrapping local results.

The global shape, stride and dtype of an op's result come from running the op on fake
tensors of the *global* metadata (as DTensor does); the rule of each family only decides
placements. Both are pure functions of the arguments' metadata, so they are cached per op
and argument signature whenever every size is a plain int (``planned``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ... import _compat
from ...ctx import ctx_of
from ..errors import MeshError, UnsupportedOpError
from ..placements import Placement, Replicate, Shard, render
from .._redistribute import redistribute_local
from ..tensor import ShardedTensor, describe, out_spec, spec, wrap, wrap_out_spec

__all__ = [
    "TensorMeta", "spec_of", "global_meta", "planned", "move", "move_plain", "wrap_out",
    "aligned", "unsupported", "aten", "check_writable", "fast_plan", "on_locals", "plain_values",
    "stays", "runner",
]

aten = torch.ops.aten
_SEQ = (list, tuple)


class TensorMeta(NamedTuple):
    """Global metadata of one op result."""

    shape: tuple
    stride: tuple
    dtype: torch.dtype
    offset: Any


def _sharded_in(args, kwargs):
    for a in args:
        if type(a) is ShardedTensor:
            yield a
        elif type(a) in _SEQ:
            for b in a:
                if type(b) is ShardedTensor:
                    yield b
    for a in kwargs.values():
        if type(a) is ShardedTensor:
            yield a


def spec_of(func, args, kwargs):
    """``(mesh, coord)`` shared by every ShardedTensor argument (MeshError if they differ)."""
    mesh = coord = first = None
    for x in _sharded_in(args, kwargs):
        m, pl, c = spec(x)
        if mesh is None:
            mesh, coord, first = m, c, pl
        elif m != mesh:
            raise MeshError(
                f"ShardedTensor cannot run {func}: its arguments live on different meshes, "
                f"{mesh} with placements {render(first)} and {m} with placements {render(pl)}. "
                "Every operand of an op must be on one mesh: build them on the same DeviceMesh, "
                "or bring one over with distribute(t.full_tensor(), mesh, placements)."
            )
    return mesh, coord


# ---- global metadata and cached plans ---------------------------------------------------
_META_CACHE: dict = {}
_MAX_ENTRIES = 8192  # distinct (op, shapes, placements) seen; cleared when exceeded


def _sig(a, numbers_by_type: bool):
    """A hashable signature of an argument's metadata (hashing it raises TypeError for
    symbolic sizes: those are never cached)."""
    t = type(a)
    if t is ShardedTensor:
        s = a._sig
        return (ctx_of(a), a.shape, a.stride(), a.storage_offset()) if s is None else s
    if isinstance(a, torch.Tensor):
        return (t, a.shape, a.stride(), a.storage_offset(), a.dtype, a.device)
    if t in _SEQ:
        if _all_ints(a):
            return ("ints", *a)  # a size list (view, expand, sum's dims): as it is
        return tuple([_sig(b, numbers_by_type) for b in a])
    if numbers_by_type and (t is float or t is int or t is bool):
        return t
    if _compat.is_symbolic(a):
        raise TypeError("symbolic")
    return (t, a)


# Argument types that enter a key as ``(type, value)`` (what ``_sig`` gives them) and are
# never symbolic: checked inline by ``_key``, which runs on every op of a cached plan.
_VALUES = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                     torch.memory_format})
_NUMBERS = frozenset({int, float, bool})


def _all_ints(a) -> bool:
    # A loop, not all([...]): no list is built (this runs on every op with a size list).
    for b in a:
        if type(b) is not int:
            return False
    return True


def _key(func, args, kwargs, numbers_by_type: bool):
    # The common arguments (a ShardedTensor with its signature number, a number, None, a
    # dtype, a size list) inline, each giving what ``_sig`` would: this is most of the
    # per-op cost of a cached plan. The op enters as its id (an int hashes in C, an
    # OpOverload in a Python __hash__); ``_held`` keeps every op of a stored key alive, so
    # its id is never reused.
    key: list = [id(func)]
    for a in args:
        t = type(a)
        if t is ShardedTensor:
            s = a._sig
            key.append(s if s is not None else _sig(a, numbers_by_type))
        elif t in _VALUES:
            key.append(t if numbers_by_type and t in _NUMBERS else (t, a))
        elif t is list and _all_ints(a):
            key.append(("ints", *a))
        else:
            key.append(_sig(a, numbers_by_type))
    if kwargs:
        key.append(_kw_key(kwargs, numbers_by_type))
        key.append(len(args))  # where the arguments end
    return tuple(key)


def _kw_key(kwargs, numbers_by_type: bool) -> tuple:
    """The keyword arguments' part of ``_key``."""
    kw = []
    for k, v in kwargs.items():
        t = type(v)
        if t in _VALUES:
            kw.append((k, t if numbers_by_type and t in _NUMBERS else (t, v)))
        else:
            kw.append((k, _sig(v, numbers_by_type)))
    return tuple(kw)


_HELD: dict = {}  # id(op) -> op, for every op a cache has stored a key of (never cleared)


def _held(func) -> None:
    _HELD.setdefault(id(func), func)


def _remember(cache: dict, key, value):
    if len(cache) >= _MAX_ENTRIES:
        cache.clear()
    cache[key] = value
    return value


_NO_PLAN = object()  # a stored None plan


def planned(build, *, numbers_by_type: bool = False):
    """Memoize ``build(func, args, kwargs)`` (a handler's decisions, a pure function of the
    arguments' metadata) per op and argument signature, as DTensor caches sharding
    propagation. ``numbers_by_type``: Python numbers enter the key by type only (right for
    pointwise ops, whose decisions never depend on a scalar's value).

    Each rule has its own table (``plan.plans``, keyed by ``_key``), so two rules that plan
    the same op (``var``'s two-sum rule asks the along-dims rule's decisions) never read
    each other's plans."""
    plans: dict = {}

    def plan(func, args, kwargs):
        # The commonest hit (one or two ShardedTensors with signature numbers, or one and a
        # number or a size list, and any keyword arguments: var's correction=) looks up the
        # key _key builds, without its loop.
        n = len(args)
        if 0 < n <= 2 and type(args[0]) is ShardedTensor:
            key = s = args[0]._sig
            if s is not None:
                if n == 1:
                    key = (id(func), s)
                else:
                    b = args[1]
                    t = type(b)
                    if t is ShardedTensor:
                        key = None if b._sig is None else (id(func), s, b._sig)
                    elif numbers_by_type and (t is float or t is int or t is bool):
                        key = (id(func), s, t)
                    elif t is list and _all_ints(b):
                        key = (id(func), s, ("ints", *b))
                    else:
                        key = None
            if key is not None:
                try:
                    hit = plans.get(key if not kwargs else (*key, _kw_key(kwargs, numbers_by_type), n))
                except TypeError:  # a symbolic or unhashable keyword argument: see below
                    hit = None
                if hit is not None:
                    return None if hit is _NO_PLAN else hit
        try:
            key = _key(func, args, kwargs, numbers_by_type)
            hit = plans.get(key)
        except TypeError:  # symbolic sizes or unhashable arguments
            return build(func, args, kwargs)
        if hit is None:
            _held(func)
            # A None plan (the rule's general path: gather_masked, by positions, computed
            # whole) is a decision too: stored as _NO_PLAN, so it is not rebuilt every call.
            built = build(func, args, kwargs)
            _remember(plans, key, _NO_PLAN if built is None else built)
            return built
        return None if hit is _NO_PLAN else hit

    plan.__name__ = plan.__qualname__ = f"planned({build.__name__})"
    plan.plans = plans  # type: ignore[attr-defined]
    return plan


def _fake(a, mode):
    if isinstance(a, torch.Tensor):
        shape, stride, offset = tuple(a.shape), a.stride(), a.storage_offset()
        t = torch.empty_strided(shape, stride, dtype=a.dtype, device=a.device)
        if offset.__class__ is int and offset == 0:
            return t
        # A view's result starts where its base starts: the fake starts there too.
        extent = 1 + sum([(n - 1) * s for n, s in zip(shape, stride)]) if all([n != 0 for n in shape]) else 0
        return torch.empty(offset + extent, dtype=a.dtype, device=a.device).as_strided(shape, stride, offset)
    if type(a) in _SEQ:
        return type(a)(_fake(b, mode) for b in a)
    return a


def _meta(out):
    if isinstance(out, torch.Tensor):
        return TensorMeta(tuple(out.shape), tuple(out.stride()), out.dtype, out.storage_offset())
    if type(out) in _SEQ:
        return type(out)(_meta(o) for o in out)
    return out


def _compute_meta(func, args, kwargs):
    with _compat.meta_mode() as mode:
        out = func(*_fake(args, mode), **{k: _fake(v, mode) for k, v in kwargs.items()})
    meta = _meta(out)
    if _compat.tracing_symbolically():
        meta = _retrack(meta, args, kwargs)
    return meta


def _sym_pool(a, pool: dict) -> None:
    if isinstance(a, torch.Tensor):
        for s in (*a.shape, *a.stride()):
            _sym_pool(s, pool)
    elif type(a) in _SEQ:
        for b in a:
            _sym_pool(b, pool)
    elif _compat.is_symbolic(a):
        pool.setdefault(a.node.expr, a)


def _retrack(meta, args, kwargs):
    """``meta`` with each symbolic size replaced by the argument's SymInt of the same value.

    The meta kernels run with proxy tracing off, so the SymInts they return are unknown to
    the graph being traced; used later (a narrow length, a view size) the tracer rebuilds
    them from their sympy expression, and a later ``0 + s`` registered as the source of a
    bare symbol makes that rebuild recurse forever (RecursionError in AOTAutograd on the
    second, automatic-dynamic compile). The arguments' own SymInts are tracked: hand those on.
    """
    pool: dict = {}
    _sym_pool(args, pool)
    _sym_pool(tuple(kwargs.values()), pool)
    if not pool:
        return meta

    def same(s):
        return pool.get(s.node.expr, s) if _compat.is_symbolic(s) else s

    def fix(m):
        if type(m) is TensorMeta:
            return TensorMeta(tuple([same(s) for s in m.shape]), tuple([same(s) for s in m.stride]), m.dtype, same(m.offset))
        if type(m) in _SEQ:
            return type(m)(fix(x) for x in m)
        return m

    return fix(meta)


def _sym_sig(a, env: list):
    """``_sig`` for symbolic sizes: a SymInt enters the key as its sympy expression (the
    shape env it belongs to is collected in ``env``)."""
    if _compat.is_symbolic(a):
        env.append(a.node.shape_env)
        return ("sym", a.node.expr)
    t = type(a)
    if t is ShardedTensor:
        return (ctx_of(a), _sym_sig(tuple(a.shape), env), _sym_sig(a.stride(), env),
                _sym_sig(a.storage_offset(), env))
    if isinstance(a, torch.Tensor):
        return (t, _sym_sig(tuple(a.shape), env), _sym_sig(a.stride(), env),
                _sym_sig(a.storage_offset(), env), a.dtype, a.device)
    if t in _SEQ:
        return tuple([_sym_sig(b, env) for b in a])
    return (t, a)


def _sym_key(func, args, kwargs):
    env: list = []
    key = (func, _sym_sig(args, env), _sym_sig(tuple(kwargs.items()), env))
    envs = {id(e): e for e in env}
    if len(envs) != 1:
        raise TypeError("not one shape env")
    # The shape env itself (held by the key, so its id is never reused): sizes are only
    # the same expressions within one trace's shape env.
    return key + (next(iter(envs.values())),)


def global_meta(func, args, kwargs):
    """The metadata of ``func``'s result on the global tensors (a TensorMeta or a tuple).

    Cached per op and argument signature; under dynamic shapes the signature holds the
    sizes' sympy expressions, so the passes torch.compile makes over one graph (dynamo's,
    AOTAutograd's metadata and joint traces) and repeated layers compute each op's
    metadata once instead of re-running its meta kernel on fresh symbolic fake tensors.
    """
    try:
        key = _key(func, args, kwargs, False)
        hit = _META_CACHE.get(key)
    except TypeError:
        try:
            key = _sym_key(func, args, kwargs)
            hit = _META_CACHE.get(key)
        except TypeError:
            return _compute_meta(func, args, kwargs)
        if hit is None:
            hit = _remember(_META_CACHE, key, _compute_meta(func, args, kwargs))
        elif _compat.tracing_symbolically():
            hit = _retrack(hit, args, kwargs)
        return hit
    if hit is None:
        _held(func)
        hit = _remember(_META_CACHE, key, _compute_meta(func, args, kwargs))
    return hit


# ---- moving arguments ---------------------------------------------------------------------
def move(x: ShardedTensor, target: tuple) -> torch.Tensor:
    """``x``'s local under ``target`` placements (collectives as needed)."""
    mesh, pl, coord = spec(x)
    if pl == target:
        return x.local
    return redistribute_local(x.local, mesh, coord, pl, target, x.shape)


def move_plain(t: torch.Tensor, mesh, coord, target: tuple) -> torch.Tensor:
    """A plain tensor taken as Replicate on every mesh dim, under ``target`` (no communication)."""
    if all(p.is_replicate() for p in target):
        return t
    return redistribute_local(t, mesh, coord, (Replicate(),) * len(target), target, t.shape)


def move_args(args, moves, mesh, coord) -> list:
    """``args`` with each ``(position, target)`` of ``moves`` moved: a ShardedTensor's local
    redistributed, a plain tensor taken as Replicate and cut to ``target``."""
    new = list(args)
    for i, target in moves:
        a = args[i]
        if type(a) is ShardedTensor:
            new[i] = move(a, target)
        elif isinstance(a, torch.Tensor):
            new[i] = move_plain(a, mesh, coord, target)
    return new


def wrap_out(local, meta: TensorMeta, mesh, placements, coord) -> ShardedTensor:
    """Wrap a local result with its global metadata.

    A rule's general path (operands moved first, results of several views) passes the
    ``meta`` and ``placements`` objects its cached plan holds, call after call: the builder
    ``fast_plan`` would make for them is kept per their identity, so such a result costs
    one lookup and the wrapper, not the ctx and signature lookups of ``wrap``.
    """
    key = (id(meta), id(placements))
    hit = _WRAPS.get(key)
    if hit is not None and hit[0] is meta and hit[1] is placements and hit[2] is mesh and hit[3] is coord:
        make = hit[4]
        if make:
            return make(local)
        if make is None:
            # Seen a second time: a plan's objects (a rule that builds its placements per
            # call only ever misses, and pays no builder for it).
            o = out_spec(mesh, placements, coord, meta.shape, meta.stride, meta.dtype, meta.offset)
            if o.sig is None:  # symbolic sizes: never built this way
                _WRAPS[key] = (meta, placements, mesh, coord, False)
                return wrap_out_spec(local, o)
            built: Any = ShardedTensor.parts_builder(o.ctx, size=o.shape, stride=o.stride, offset=o.offset, **o.state)
            _WRAPS[key] = (meta, placements, mesh, coord, built)
            return built(local)
    elif type(meta) is TensorMeta:
        if len(_WRAPS) >= 4096:
            _WRAPS.clear()
        # The entry holds the objects, so their ids are not reused while it exists.
        _WRAPS[key] = (meta, placements, mesh, coord, None)
    return wrap(local, mesh, placements, coord, meta.shape, meta.stride, meta.dtype, meta.offset)


_WRAPS: dict = {}


def fast_plan(func, meta, mesh, placements, coord, args=None, kwargs=None):
    """``(op, make)`` for a plan's fast path, or None (several results, symbolic sizes).

    The fast path of a handler is then ``make(op(*locals))``: ``op`` is ``func``'s cheapest
    callable, ``make`` builds the result from its local with the ctx, size, stride, offset
    and signature computed once per cached plan (``ShardedTensor.parts_builder``: one
    generated frame), so a hit costs the key's dict lookup, the op and one wrapper
    construction. ``args``/``kwargs``: the call the plan is for, when the fast path calls
    ``op`` with arguments of the same types (its locals for its ShardedTensors): ``op`` may
    then be the Python binding that parses them in C++ (see ``_compat.fast_op_for``).
    """
    if type(meta) is TensorMeta:
        o = out_spec(mesh, placements, coord, meta.shape, meta.stride, meta.dtype, meta.offset)
        if o.sig is not None:
            make = ShardedTensor.parts_builder(o.ctx, size=o.shape, stride=o.stride, offset=o.offset, **o.state)
            return _op_for(func, args, kwargs), make
    return None


def _locals(a):
    if type(a) is ShardedTensor:
        return a.local
    if type(a) in _SEQ:
        return type(a)([_locals(b) for b in a])
    return a


def _op_for(func, args, kwargs):
    """``func``'s cheapest callable for a fast path that calls it with ``args``' locals."""
    if args is None:
        return _compat.fast_op(func)
    return _compat.fast_op_for(func, _locals(tuple(args)), {k: _locals(v) for k, v in (kwargs or {}).items()})


def on_locals(op, make, args, kwargs=None):
    """``run(args)``: ``make(op(*args))`` with every ShardedTensor replaced by its local.

    Specialized once per plan for where ``args`` holds ShardedTensors: a plan's key pins
    that (a ShardedTensor enters it as its signature, anything else as a type or a tuple).
    For a plan made for a call with keyword arguments (plain values), ``run(args, kwargs)``
    (see ``_on_locals_kw``).
    """
    if kwargs:
        return _on_locals_kw(op, make, args)
    where = tuple([type(a) is ShardedTensor for a in args])
    if where == (True,):
        def run(args):
            return make(op(args[0].local))
    elif where == (True, True):
        def run(args):
            a, b = args
            return make(op(a.local, b.local))
    elif where == (True, False):
        def run(args):
            a, b = args
            return make(op(a.local, b))
    elif where == (False, True):
        def run(args):
            a, b = args
            return make(op(a, b.local))
    elif _leading(where) == 1:  # softmax's (x, dim, half_to_float)
        def run(args):
            return make(op(args[0].local, *args[1:]))
    else:
        def run(args):
            return make(op(*[a.local if type(a) is ShardedTensor else a for a in args]))
    return run


def _on_locals_kw(op, make, args):
    """``run(args, kwargs)``: ``on_locals``'s ``run`` for a plan made for a call with keyword
    arguments (plain values: a dtype, ``rounding_mode=``, ``keepdim=``), passed on as given.
    A plan's key pins their names (and the values that decide anything), so such a plan is
    only ever hit by calls that pass them."""
    where = tuple([type(a) is ShardedTensor for a in args])
    lead = _leading(where)
    if lead == 1:
        def run(args, kwargs):
            return make(op(args[0].local, *args[1:], **kwargs))
    elif lead == 2:
        def run(args, kwargs):
            return make(op(args[0].local, args[1].local, *args[2:], **kwargs))
    else:
        def run(args, kwargs):
            return make(op(*[a.local if type(a) is ShardedTensor else a for a in args], **kwargs))
    return run


def plain_values(kwargs) -> bool:
    """True when no keyword argument is a tensor (or holds one): a fast path may pass them on."""
    for v in kwargs.values():
        if isinstance(v, torch.Tensor) or (type(v) in _SEQ and any(isinstance(b, torch.Tensor) for b in v)):
            return False
    return True


def _leading(where: tuple) -> int:
    """How many leading arguments are ShardedTensors when no later one is (else -1)."""
    n = 0
    while n < len(where) and where[n]:
        n += 1
    return -1 if any(where[n:]) else n


def _on_locals_call(op, args):
    """``call(args)``: ``op(*args)`` with every ShardedTensor replaced by its local (the
    op's result as it is), specialized as ``on_locals`` for where ``args`` holds them."""
    lead = _leading(tuple([type(a) is ShardedTensor for a in args]))
    if lead == 1:  # layer_norm's (x, normalized_shape, weight, bias, eps)
        return lambda args: op(args[0].local, *args[1:])
    if lead == 2:  # nll_loss's (input, target, weight, reduction, ignore_index)
        return lambda args: op(args[0].local, args[1].local, *args[2:])
    return lambda args: op(*[a.local if type(a) is ShardedTensor else a for a in args])


def stays(a, target) -> bool:
    """True when ``a`` needs no move to ``target``: a ShardedTensor already under it, a
    plain tensor where ``target`` is all Replicate, or not a tensor."""
    if type(a) is ShardedTensor:
        return spec(a)[1] == target
    return not isinstance(a, torch.Tensor) or all(p.is_replicate() for p in target)


def runner(func, metas, mesh, outs, coord, args, kwargs=None):
    """``run(args)`` for an op with several results when no argument moves: the op on the
    locals, each tensor result built from what the plan knows (``fast_plan`` per result;
    None for a result that is None or not a tensor). None when a result cannot be built
    that way (symbolic sizes). ``args``: the call the plan is for (see ``fast_plan``).
    ``kwargs``: the call's keyword arguments, plain values (``var_mean``'s ``correction=``):
    then ``run(args, kwargs)`` passes them on (see ``_on_locals_kw``)."""
    makes = []
    for m, pl in zip(metas, outs):
        if type(m) is TensorMeta:
            fp = fast_plan(func, m, mesh, pl, coord)
            if fp is None:
                return None
            makes.append(fp[1])
        else:
            makes.append(None)
    op, makes = _op_for(func, args, kwargs), tuple(makes)
    if kwargs:
        def run_kw(args, kwargs):
            res = op(*[a.local if type(a) is ShardedTensor else a for a in args], **kwargs)
            return tuple([None if r is None or mk is None else mk(r) for r, mk in zip(res, makes)])

        return run_kw
    call = _on_locals_call(op, args)
    if len(makes) == 2 and None not in makes:  # nll_loss's (loss, total_weight)
        m0, m1 = makes

        def run(args):
            r0, r1 = call(args)
            return m0(r0), m1(r1)
    elif len(makes) == 3 and None not in makes:  # layer_norm's (out, mean, rstd)
        m0, m1, m2 = makes

        def run(args):
            r0, r1, r2 = call(args)
            return m0(r0), m1(r1), m2(r2)
    else:
        def run(args):
            return tuple([None if r is None or mk is None else mk(r) for r, mk in zip(call(args), makes)])

    return run


def aligned(x_shape, out_shape, out_pl: tuple) -> tuple:
    """The placements an operand of shape ``x_shape`` needs for a broadcasting op whose
    output (``out_shape``) has ``out_pl``: Shard on the matching dim unless it broadcasts."""
    lead = len(out_shape) - len(x_shape)
    res: list[Placement] = []
    for p in out_pl:
        sd = p.shard_dim()
        if sd is not None:
            d = sd - lead
            if d < 0 or (x_shape[d] == 1 and out_shape[sd] != 1):
                res.append(Replicate())
            else:
                res.append(Shard(d))
        else:
            res.append(p)
    return tuple(res)


def check_writable(func, args, kwargs, x) -> None:
    """Raise for an in-place write into a view that gathered its shard (not a real view):
    its local is a copy (``x._gathered_view`` names the view op), so the write would
    silently not reach the base."""
    view = x._gathered_view
    if view is not None:
        unsupported(
            func, args, kwargs,
            f"the tensor written in place came from {view} along a sharded dim, which gathered "
            "the shard into a copy, so the write would not reach the base tensor;",
        )


def unsupported(func, args, kwargs, why: str, *, fix: str | None = None):
    """Raise the kit's UnsupportedOpError with a reason specific to sharding (and ``fix``,
    by default: redistribute first or register a rule)."""
    shown = ", ".join(describe(a) for a in _sharded_in(args, kwargs))
    if fix is None:
        fix = ("Redistribute the operands first (.redistribute(mesh, [Replicate()])), or register a rule "
               f"with @ShardedTensor.implements({func}).")
    raise UnsupportedOpError(f"ShardedTensor cannot run {func} on {shown}: {why} {fix}")
