"""Protocol checks: ``__tensor_flatten__`` / ``__tensor_unflatten__`` obey the round-trip law.

    names, ctx = t.__tensor_flatten__()
    u = type(t).__tensor_unflatten__({n: getattr(t, n) for n in names}, ctx, size, stride)
    => type(u) is type(t), u.shape == size, u.stride() == stride, inner tensors as given

for real, meta, fake and symbolic inner tensors, and for any outer size and stride torch
passes: dynamo re-creates inputs with symbolic sizes, AOTAutograd re-creates outputs and
tangents with the strides it traced, so a class that re-derives them from its inner
tensors compiles into wrong strides or a recompile per size.
"""

from __future__ import annotations

import torch

from .. import _compat
from ._check import Check, Fail, Skip
from ._subject import describe, flatten

__all__ = ["plan"]

_UNFLATTEN_FIX = (
    "build the wrapper from the outer_size and outer_stride arguments, e.g. "
    "torch.Tensor._make_wrapper_subclass(cls, outer_size, strides=outer_stride, ...), and "
    "use the inner tensors' sizes only when outer_size is None"
)


def plan(run) -> list:
    req = ("protocol.flatten",)
    return [
        Check("protocol.flatten", _flatten),
        Check("protocol.inner_devices", _inner_devices, req),
        Check("protocol.round_trip_real", _round_trip_real, req),
        Check("protocol.round_trip_outer_stride", _round_trip_outer_stride, req),
        Check("protocol.round_trip_meta", _round_trip_meta, req),
        Check("protocol.round_trip_fake", _round_trip_fake, req),
        Check("protocol.round_trip_symbolic", _round_trip_symbolic, req),
        Check("protocol.inner_shapes_dynamic", _inner_shapes_dynamic, req),
        Check("protocol.to_plain", _to_plain, req),
        Check("protocol.optional_hooks", _optional_hooks, ()),
    ]


_OPTIONAL = (
    ("to_plain", "eager and backward results are not compared with a dense computation"),
    ("__inner_shapes__", "the dynamic sweep guesses inner shapes by the same-dim reading"),
    ("_stable_hash_for_caching", "AOTAutograd's cache uses torch's default hash and warns once"),
    ("__coerce_same_metadata_as_tangent__", "a compiled backward fails if a tangent arrives with other metadata"),
    ("__samples__", "`subclass-kit check MODULE:CLASS` cannot make instances"),
)


def _optional_hooks(run):
    lacks = [f"{name} ({why})" for name, why in _OPTIONAL if not hasattr(run.cls, name)]
    if not lacks:
        return "has every optional hook the checker uses"
    return f"{run.name} lacks " + "; ".join(lacks)


def _flatten(run):
    cls = run.cls
    lacks = [m for m in ("__tensor_flatten__", "__tensor_unflatten__", "__torch_dispatch__") if not hasattr(cls, m)]
    if lacks:
        raise Fail(
            f"{run.name} lacks {', '.join(lacks)}, so it is not a traceable wrapper subclass and "
            "torch.compile cannot see inside it",
            "define __tensor_flatten__(self) -> (inner tensor names, ctx) and the static "
            "__tensor_unflatten__(inner_tensors, ctx, outer_size, outer_stride), or derive them "
            "by subclassing subclass_kit.WrapperTensor",
        )
    for i, x in enumerate(run.samples):
        out = x.__tensor_flatten__()
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], (list, tuple))):
            raise Fail(
                f"{run.name}.__tensor_flatten__() returned {type(out).__name__} {out!r:.80} for "
                f"sample {i}; torch expects a pair (list of inner tensor attribute names, ctx)",
                "return `[names...], ctx`",
            )
        names, _ = out
        if not names:
            raise Fail(
                f"{run.name}.__tensor_flatten__() lists no inner tensors for sample {i}",
                "list the attribute names of the tensors the wrapper holds",
            )
        for n in names:
            if not isinstance(n, str):
                raise Fail(f"{run.name}.__tensor_flatten__() lists {n!r}, not an attribute name", "list attribute names as strings")
            if not hasattr(x, n):
                raise Fail(
                    f"{run.name}.__tensor_flatten__() lists {n!r} but sample {i} has no attribute {n!r}",
                    f"store the inner tensor as self.{n}, or list the names it is stored under",
                )
            v = getattr(x, n)
            if not isinstance(v, torch.Tensor) and not _compat.is_opaque(v):
                raise Fail(
                    f"{run.name}.__tensor_flatten__() lists {n!r}, but {n!r} is a {type(v).__name__}, "
                    "not a tensor",
                    f"list only tensor attributes; put a constant like {n!r} into the ctx instead",
                )
    return ""


def _inner_devices(run):
    for i, x in enumerate(run.samples):
        for n, v in zip(*_named(x)):
            if isinstance(v, torch.Tensor) and v.device != x.device:
                raise Fail(
                    f"inner {n!r} of sample {i} ({describe(x)}) is on {v.device} but the outer "
                    f"tensor is on {x.device}; compiled graphs and device moves treat every inner "
                    "tensor as living on the outer device",
                    f"create {n!r} on {x.device} (move it with .to(device) before wrapping), and "
                    "reject mixed devices in the constructor",
                )
    return ""


def _named(x):
    names, _ = flatten(x)
    return names, [getattr(x, n) for n in names]


def _inner_dict(x) -> dict:
    names, vals = _named(x)
    return dict(zip(names, vals))


def _outer_mismatch(u, size, stride, what: str):
    got_size, got_stride = tuple(u.shape), tuple(u.stride())
    if [_compat.sym_expr(s) for s in got_size] != [_compat.sym_expr(s) for s in size]:
        return f"{what}: asked for outer_size {tuple(size)}, got {got_size} (outer_size was ignored)"
    if [_compat.sym_expr(s) for s in got_stride] != [_compat.sym_expr(s) for s in stride]:
        return f"{what}: asked for outer_stride {tuple(stride)}, got {got_stride} (outer_stride was ignored)"
    return None


def _unflatten(run, inner, ctx, size, stride, what: str):
    try:
        return run.cls.__tensor_unflatten__(inner, ctx, size, stride)
    except Exception as e:
        raise Fail(
            f"{run.name}.__tensor_unflatten__ raised {type(e).__name__} on {what} "
            f"({str(e).strip().splitlines()[0] if str(e).strip() else ''})",
            "accept any outer_size/outer_stride torch passes (SymInts included) and inner "
            "tensors of any device (meta, fake); check shapes with torch._check, not Python "
            "branches",
        ) from None


def _check_type(run, u, what):
    if type(u) is not run.cls:
        raise Fail(
            f"{run.name}.__tensor_unflatten__ returned a {type(u).__name__} for {what}",
            f"return an instance of {run.name} (use cls, or the class itself, not a parent)",
        )


def _round_trip_real(run):
    for i, x in enumerate(run.samples):
        names, ctx = flatten(x)
        inner = _inner_dict(x)
        what = f"sample {i} ({describe(x)})"
        u = _unflatten(run, inner, ctx, x.shape, x.stride(), what)
        _check_type(run, u, what)
        bad = _outer_mismatch(u, x.shape, x.stride(), what)
        if bad:
            raise Fail(bad, _UNFLATTEN_FIX)
        if u.dtype != x.dtype or u.device != x.device:
            raise Fail(
                f"{what}: round trip changed dtype/device from {x.dtype}/{x.device} to {u.dtype}/{u.device}",
                "keep the outer dtype in the ctx and take the device from the inner tensors",
            )
        for n in names:
            v = getattr(u, n, None)
            given = inner[n]
            if isinstance(given, torch.Tensor) and v is not given and not _compat.same_storage(v, given):
                raise Fail(
                    f"{what}: after the round trip inner {n!r} is a copy, not the tensor that was "
                    "passed in; AOTAutograd writes input mutations back through the inner tensors",
                    f"store inner_tensors[{n!r}] as it is (no clone/contiguous/to)",
                )
    return ""


def _col_major(size) -> tuple:
    """Strides of a tensor laid out with the first dim fastest (a transposed layout)."""
    strides, acc = [], 1
    for s in size:
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(strides)


def _round_trip_outer_stride(run):
    if any(_compat.has_nested_int(x) for x in run.samples):
        raise Skip("a jagged tensor's outer strides follow its values (torch fixes them); there is "
                   "no other stride order to ask for")
    xs = [x for x in run.samples if x.dim() >= 2 and x.size(0) > 1 and x.size(1) > 1]
    if not xs:
        raise Skip("no sample has two dims of size > 1, so there is no other stride order to ask for")
    x = xs[0]
    _, ctx = flatten(x)
    stride = _col_major(x.shape)
    if stride == tuple(x.stride()):
        stride = tuple(reversed(_col_major(tuple(reversed(x.shape)))))
    what = f"{describe(x)} with a non-contiguous outer stride"
    u = _unflatten(run, _inner_dict(x), ctx, x.shape, stride, what)
    _check_type(run, u, what)
    bad = _outer_mismatch(u, x.shape, stride, what)
    if bad:
        raise Fail(bad + "; compiled outputs (e.g. of a transpose) then get the wrong strides", _UNFLATTEN_FIX)
    return ""


def _to_meta(v):
    if not isinstance(v, torch.Tensor):
        return v
    if _compat.is_traceable_wrapper_subclass(v):
        inner = {n: _to_meta(t) for n, t in _inner_dict(v).items()}
        _, ctx = flatten(v)
        return type(v).__tensor_unflatten__(inner, ctx, v.shape, v.stride())
    return v.detach().to("meta")


def _round_trip_meta(run):
    for i, x in enumerate(run.samples):
        _, ctx = flatten(x)
        inner = {n: _to_meta(v) for n, v in _inner_dict(x).items()}
        what = f"sample {i} ({describe(x)}) with inner tensors on the meta device"
        u = _unflatten(run, inner, ctx, x.shape, x.stride(), what)
        _check_type(run, u, what)
        if u.device.type != "meta":
            raise Fail(
                f"{what}: the result is on {u.device}, expected meta",
                "take the outer device from the inner tensors (device=inner.device), not from the ctx or a constant",
            )
        bad = _outer_mismatch(u, x.shape, x.stride(), what)
        if bad:
            raise Fail(bad, _UNFLATTEN_FIX)
    return ""


def _round_trip_fake(run):
    mode = _compat.fake_mode()
    jagged = any(_compat.has_nested_int(x) for x in run.samples)
    if jagged:
        # nested ints need a ShapeEnv and a source, as dynamo gives them; its sizes are then
        # symbols, so the static shape comparison below does not apply
        mode = _compat.fake_mode(_compat.shape_env())
    for i, x in enumerate(run.samples):
        what = f"sample {i} ({describe(x)})"
        try:
            f = _compat.fake_with_source(mode, x, f"sample{i}") if jagged else mode.from_tensor(x)
        except Exception as e:
            raise Fail(
                f"making a fake copy of {what}, as dynamo does for every input, raised "
                f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
                "make __tensor_unflatten__ and the constructor work on FakeTensors: no .item(), "
                "no .tolist(), no data_ptr(), no numpy",
            ) from None
        _check_type(run, f, f"fake {what}")
        if jagged:
            if f.dim() != x.dim() or f.dtype != x.dtype:
                raise Fail(f"the fake copy of {what} has {f.dim()} dims of {f.dtype}, expected {x.dim()} of "
                           f"{x.dtype}", _UNFLATTEN_FIX)
        elif tuple(f.shape) != tuple(x.shape) or tuple(f.stride()) != tuple(x.stride()) or f.dtype != x.dtype:
            raise Fail(
                f"the fake copy of {what} has shape {tuple(f.shape)} stride {tuple(f.stride())} "
                f"dtype {f.dtype}, expected {tuple(x.shape)} {tuple(x.stride())} {x.dtype}",
                _UNFLATTEN_FIX,
            )
        _, fctx = flatten(f)
        _, ctx = flatten(x)
        if not _eq(fctx, ctx):
            raise Fail(
                f"the fake copy of {what} has ctx {fctx!r}, expected {ctx!r}",
                "keep only Python constants in the ctx, so that a fake copy has the same one",
            )
        with mode:
            u = _unflatten(run, _inner_dict(f), fctx, f.shape, f.stride(), f"fake {what}")
        _check_type(run, u, f"fake {what}")
        for n, v in _inner_dict(u).items():
            if isinstance(v, torch.Tensor) and not _compat.is_traceable_wrapper_subclass(v) and not _compat.is_fake(v):
                raise Fail(
                    f"unflattening fake inner tensors of {what} gave a real inner {n!r}",
                    "store the inner tensors you are given; do not create new real tensors in __tensor_unflatten__",
                )
    return ""


def _eq(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def _sym_strides(size) -> list:
    out, acc = [], 1
    for s in reversed(size):
        out.append(acc)
        acc = acc * s
    return list(reversed(out))


def _sym_col_major(size) -> list:
    out, acc = [], 1
    for s in size:
        out.append(acc)
        acc = acc * s
    return out


def _round_trip_symbolic(run):
    if any(_compat.has_nested_int(x) for x in run.samples):
        raise Skip("dynamo does not track a jagged NestedTensor's outer size (it follows from the "
                   "inner tensors), so no symbolic outer_size is ever passed to unflatten")
    for i, x in enumerate(run.samples):
        env = _compat.shape_env()
        mode = _compat.fake_mode(env)
        what = f"sample {i} ({describe(x)}) with symbolic sizes"
        inner = {}
        for n, v in _inner_dict(x).items():
            if not isinstance(v, torch.Tensor):
                inner[n] = v
            elif _compat.is_traceable_wrapper_subclass(v):
                inner[n] = mode.from_tensor(v)
            else:
                inner[n] = _compat.symbolic_fake(mode, v, f"{run.name}.{n}")
        size = tuple(
            _compat.fresh_symint(env, int(s), f"outer_size[{d}]") if int(s) > 1 else int(s) for d, s in enumerate(x.shape)
        )
        _, ctx = flatten(x)
        strides = [tuple(_sym_strides(size))]
        if len(size) >= 2:
            strides.append(tuple(_sym_col_major(size)))  # a transposed layout, symbolically
        for stride in strides:
            with mode:
                u = _unflatten(run, inner, ctx, size, stride, what)
            _check_type(run, u, what)
            bad = _outer_mismatch(u, size, stride, what)
            if bad:
                raise Fail(
                    bad + "; under torch.compile the outer size then comes from the inner tensors' "
                    "symbols, which is wrong for derived shapes and for views",
                    _UNFLATTEN_FIX,
                )
    return ""


def _to_plain(run):
    """``to_plain()`` is the dense value of the wrapper: a plain tensor of its shape, dtype and
    device. Every dense comparison (eager, backward, OpInfo) trusts it."""
    if not run.subject.has_to_plain:
        raise Skip(f"{run.name} has no to_plain()")
    for i, x in enumerate(run.samples):
        d = x.to_plain()
        what = f"{run.name}.to_plain() on sample {i} ({describe(x)})"
        if not isinstance(d, torch.Tensor) or _compat.is_traceable_wrapper_subclass(d):
            raise Fail(f"{what} returned a {type(d).__name__}, not a plain tensor",
                       "return the dense torch.Tensor the wrapper stands for")
        bad = []
        if tuple(d.shape) != tuple(x.shape):
            bad.append(f"shape {tuple(d.shape)}, expected {tuple(x.shape)}")
        if d.dtype != x.dtype:
            bad.append(f"dtype {d.dtype}, expected {x.dtype}")
        if d.device != x.device:
            bad.append(f"device {d.device}, expected {x.device}")
        if bad:
            raise Fail(
                f"{what} has {'; '.join(bad)}: every op compared with to_plain() would compare two wrong "
                "values and pass",
                "return the dense tensor in the wrapper's shape, dtype and device (e.g. "
                "values.reshape(self.shape).to(self.dtype); for views, .as_strided(self.shape, self.stride()))",
            )
    return ""


# Sizes that went through a float (true division, then math.ceil / int()): torch keeps them
# as these sympy functions, on which dynamo guards or specializes the dim.
_FLOAT_ROUTE = ("IntTrueDiv", "FloatTrueDiv", "CeilToInt", "FloorToInt", "TruncToInt", "RoundToInt", "ToFloat")


def _inner_shapes_dynamic(run):
    """Each outer dim marked dynamic in turn: ``__inner_shapes__`` must compute the inner
    shapes without specializing it (``int()``), branching on it (``if``) or going through a
    float (``math.ceil(n / k)``)."""
    fn = getattr(run.cls, "__inner_shapes__", None)
    if fn is None:
        raise Skip(f"{run.name} has no __inner_shapes__")
    x = next((s for s in run.samples if s.dim() >= 1), None)
    if x is None or any(_compat.has_nested_int(s) for s in run.samples):
        raise Skip("no sample has a dim that dynamo would make dynamic")
    _, ctx = flatten(x)
    dims = []
    for d in range(x.dim()):
        if int(x.shape[d]) <= 1:
            continue  # dynamo specializes sizes 0 and 1 anyway
        env = _compat.shape_env()
        size = tuple(_compat.fresh_symint(env, int(v), f"outer_size[{d}]") if j == d else int(v)
                     for j, v in enumerate(x.shape))
        what = f"{run.name}.__inner_shapes__ with dim {d} of {describe(x)} dynamic"
        fix = ("compute inner sizes with symbolic.ceil_div / floor_div (and // or *), never math.ceil, int() "
               "or / on a size, and no Python `if` on a size (torch._check states a requirement)")
        try:
            shapes = fn(size, ctx)
        except Exception as e:
            raise Fail(f"{what} raised {type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}", fix) from None
        guards = [str(g.expr) for g in env.guards]
        if dict(env.replacements):
            raise Fail(f"{what} specialized it: dim {d} became the constant {int(x.shape[d])} "
                       f"(guard {guards[0] if guards else 'Eq(s, n)'}; int() of a size, or a size used as a Python int), "
                       f"so every new size of dim {d} recompiles", fix)
        if guards:
            raise Fail(f"{what} branched on it: dynamo guards {guards[0]} (a Python `if` or comparison on a size), "
                       f"so sizes of dim {d} on the other side recompile", fix)
        floaty = sorted({f for v in (shapes or {}).values() for s in v for f in _FLOAT_ROUTE
                         if _compat.is_symbolic(s) and f in str(_compat.sym_expr(s))})
        if floaty:
            sample = next(f"{n}: {tuple(str(_compat.sym_expr(s)) if _compat.is_symbolic(s) else s for s in v)}"
                          for n, v in shapes.items() if any(_compat.is_symbolic(s) and any(f in str(_compat.sym_expr(s)) for f in floaty) for s in v))
            raise Fail(f"{what} computes a size through a float ({sample}; math.ceil or int() of a true division): "
                       f"symbolic.relations and symbolic.mark_dynamic(x, {d}) cannot express it (they raise), and "
                       "dynamo can only guard on it", fix)
        dims.append(d)
    return f"dims {dims} stay symbolic" if dims else "no dim above 1"
