"""Validated construction: ``Cls(...)`` binds and checks every argument.

User construction (``BlockScaled(q, s, block=32)``) checks every argument, so a mistake is
reported where it is made, then builds the instance with the class's ``make`` (the one
trusted constructor, see ``_runtime.py``), as dispatch outputs and ``__tensor_unflatten__`` do.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch

from symbolic import FREE

from . import _compat
from .ctx import SubclassCtx
from .errors import ConstructionError, InnerShapeError, InnerShapesKeyError, OuterArgumentError, OuterDtypeWarning
from .fields import MISSING, InnerField
from ._spec import check_meta_rule, check_meta_type, check_meta_value, note_meta_value

__all__ = ["construct", "contiguous_strides", "check_parts"]


def contiguous_strides(size) -> tuple:
    """Row-major strides for ``size`` (works on SymInts)."""
    strides = []
    acc = 1
    for s in reversed(tuple(size)):
        strides.append(acc)
        acc = acc * s
    return tuple(reversed(strides))


def _fmt_shape(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _shape_rule(cls, spec, name: str, exp, size) -> str:
    """How a shape message names the rule that applies: the class's own ``__inner_shapes__``,
    or (without one) "every inner tensor has the outer shape"."""
    if cls.__kit__.inner_shapes_are_outer():
        return (
            f"{spec.qualname} defines no __inner_shapes__, so every inner tensor must have the "
            f"outer shape {_fmt_shape(tuple(size))}"
        )
    return f"{spec.qualname}.__inner_shapes__ expects {_fmt_shape(exp)} for outer size {_fmt_shape(tuple(size))}"


def _shape_fix(cls) -> str:
    if cls.__kit__.inner_shapes_are_outer():
        return (
            "Pass tensors of the outer shape, pass size= for the outer tensor, or define "
            "__inner_shapes__(cls, outer_size, ctx) returning the shapes that follow from the "
            "outer size (leave out an inner tensor whose shape is free)."
        )
    return "Pass matching tensors, pass size= for the outer tensor, or fix __inner_shapes__."


def _check_inner_shapes(cls, spec, inners, size, ctx, size_given: bool = True) -> None:
    try:
        expected = cls.__inner_shapes__(tuple(size), ctx)
    except (ValueError, IndexError, TypeError) as err:
        if size_given:
            raise
        # ``B, L, D = outer_size`` over a default taken from a primary of another rank (a
        # packed (total, D) primary under a padded (B, L, D) outer) is a missing size=.
        raise OuterArgumentError(
            f"{spec.qualname}(...) was called without size=, so the outer size is the primary "
            f"inner tensor {spec.primary!r}'s shape {_fmt_shape(tuple(size))}, and "
            f"{spec.qualname}.__inner_shapes__ cannot take it ({type(err).__name__}: {err}). When "
            f"the outer shape is not the primary's, pass it: {spec.qualname}(..., size=(...)) "
            "(and to from_parts / wrap alike)."
        ) from err
    _check_inner_shapes_keys(spec, size, expected)
    for f, t in zip(spec.inner, inners):
        if t is None or f.name not in expected:
            continue  # left out of __inner_shapes__: a free shape, as any inner tensor in torch
        exp = tuple(expected[f.name])
        got = tuple(t.shape)
        if len(exp) != len(got):
            raise InnerShapeError(
                f"{spec.qualname}.{f.name} has shape {_fmt_shape(got)} but "
                f"{_shape_rule(cls, spec, f.name, exp, size)} (ndim {len(got)} vs {len(exp)}). "
                f"{_shape_fix(cls)}"
            )
        for d, (e, g) in enumerate(zip(exp, got)):
            if e is FREE:
                continue  # declared free: any size is valid
            if isinstance(e, int) and isinstance(g, int):
                if e != g:
                    raise InnerShapeError(
                        f"{spec.qualname}.{f.name} has shape {_fmt_shape(got)} but "
                        f"{_shape_rule(cls, spec, f.name, exp, size)} (dim {d}: expected {e}, "
                        f"got {g}). {_shape_fix(cls)}"
                    )
            else:
                # Symbolic: a Python `!=` would specialize the dimension; torch._check records
                # the relation instead (and fails at trace time if it is provably false).
                _compat.sym_check(
                    g == e,
                    lambda f=f, d=d, e=e, g=g: (
                        f"{spec.qualname}.{f.name}.size({d}) is {g} but __inner_shapes__ "
                        f"expects {e}"
                    ),
                )


def _check_inner_shapes_keys(spec, size, expected) -> None:
    # A wrong key used to pass here unnoticed (the shape check skipped it) and surface much
    # later, inside torch, as "setStorage ... out of bounds". A key left out is a free
    # shape (API.md): only keys that name no inner field are mistakes.
    if type(expected) is dict and all(k in spec.inner_names for k in expected):
        return  # the common case, checked without building anything
    where = f"{spec.qualname}.__inner_shapes__(outer_size={_fmt_shape(tuple(size))}, ctx)"
    if not hasattr(expected, "keys"):
        raise InnerShapesKeyError(
            f"{where} returned a {type(expected).__name__}, not a dict; return "
            f"{{inner_name: shape}} for the inner fields whose shape follows from the outer "
            f"size, e.g. {{{', '.join(repr(n) + ': (...)' for n in spec.inner_names)}}}."
        )
    keys = list(expected.keys())
    unknown = [k for k in keys if k not in spec.inner_names]
    if unknown:
        got = ", ".join(repr(k) for k in keys) or "no keys"
        raise InnerShapesKeyError(
            f"{where} returned keys {got}, but {', '.join(repr(k) for k in unknown)} "
            f"{'is not an inner field' if len(unknown) == 1 else 'are not inner fields'} of "
            f"{spec.qualname} (its inner fields: {', '.join(repr(n) for n in spec.inner_names)}). "
            f"Fix the keys of the dict {spec.qualname}.__inner_shapes__ returns; leave out an "
            "inner field whose shape is free."
        )


def construct(cls, args: tuple, kwargs: dict) -> Any:
    """Validated construction from user arguments; see ``WrapperTensor``."""
    spec = cls.__kit_spec__
    qual = spec.qualname
    if not spec.inner:
        raise ConstructionError(f"{qual} is abstract (declares no inner tensor) and cannot be constructed.")
    size = kwargs.pop("size", None)
    stride = kwargs.pop("stride", None)
    dtype = kwargs.pop("dtype", None)
    device = kwargs.pop("device", None)
    requires_grad = kwargs.pop("requires_grad", None)

    if len(args) > len(spec.fields):
        raise ConstructionError(
            f"{qual} takes at most {len(spec.fields)} positional arguments "
            f"({', '.join(f.name for f in spec.fields)}) but got {len(args)}."
        )
    values = {}
    for f, v in zip(spec.fields, args):
        values[f.name] = v
    kit = cls.__kit__
    for k, v in kwargs.items():
        if k not in kit.field_index:
            raise ConstructionError(
                f"{qual} got an unexpected keyword argument {k!r}. Its fields are "
                f"{[f.name for f in spec.fields]}; the outer tensor takes size=, stride=, "
                "dtype=, device=, requires_grad=."
            )
        if k in values:
            raise ConstructionError(f"{qual} got multiple values for field {k!r}.")
        values[k] = v

    inners: list[torch.Tensor | None] = []
    for f in spec.inner:
        t = values.get(f.name, MISSING)
        if t is MISSING or t is None:
            if f.optional:
                inners.append(None)
                continue
            raise ConstructionError(
                f"{qual} is missing its inner tensor {f.name!r}"
                + (" (None given; declare it inner(optional=True) to allow that)" if t is None else "")
                + "."
            )
        if not isinstance(t, torch.Tensor):
            raise ConstructionError(
                f"{qual}.{f.name} is an inner tensor field but got a {type(t).__name__} "
                f"({t!r:.60}). Pass a torch.Tensor (e.g. torch.as_tensor(...))."
            )
        _check_dtype(qual, f, t)
        inners.append(t)

    primary = inners[0]
    assert primary is not None  # the spec refuses an optional primary at class creation
    for f, t in zip(spec.inner, inners):
        if t is not None and t.device != primary.device:
            raise ConstructionError(
                f"{qual}.{f.name} is on {t.device} but the primary inner tensor "
                f"{spec.primary!r} is on {primary.device}. All inner tensors must share one "
                f"device: move it with .to({str(primary.device)!r})."
            )

    meta_values = []
    ok = kit.checked_meta
    for f, default in zip(spec.meta, spec.meta_defaults):
        v = values.get(f.name, MISSING)
        if v is MISSING:
            if default is MISSING:
                raise ConstructionError(
                    f"{qual} is missing its meta field {f.name!r} (it has no default); pass "
                    f"{f.name}=... ."
                )
            v = default
        else:
            # Validated values are remembered per class: pickling on every construction
            # would cost more than the construction itself.
            key = (f.name, type(v), v)
            try:
                seen = not isinstance(v, torch.Tensor) and key in ok
            except TypeError:  # unhashable: check_meta_value explains
                seen = False
            if not seen:
                # The type first: a list for an int field is a wrong type, not a
                # hashability problem (a tensor keeps its own message: declare it inner()).
                if not isinstance(v, torch.Tensor):
                    check_meta_type(qual, f, v, where="the value passed")
                check_meta_value(qual, f.name, v, where="the value passed")
                check_meta_rule(qual, f, v, where="the value passed")
                ok.add(key)
                note_meta_value(cls, qual, f.name, v)
        meta_values.append(v)

    size_given = size is not None
    if size is None:
        size = primary.shape
        if stride is None:
            stride = primary.stride()
        else:
            _check_stride(qual, stride, size, primary)
        offset = primary.storage_offset()
    else:
        size = _check_size(qual, size)
        size = torch.Size(size) if all(isinstance(s, int) for s in size) else tuple(size)
        if stride is None:
            stride = contiguous_strides(size)
        else:
            _check_stride(qual, stride, size, primary)
        offset = 0
    dtype_given = dtype is not None
    if dtype is None:
        dtype = cls.__default_dtype__ or primary.dtype
    else:
        dtype = _check_dtype_arg(qual, dtype)
    device = primary.device if device is None else _check_device_arg(qual, device, primary)
    requires_grad = primary.requires_grad if requires_grad is None else bool(requires_grad)

    present = tuple(f.name for f, t in zip(spec.inner, inners) if t is not None)
    ctx = SubclassCtx.make(qual, spec.meta_names, tuple(meta_values), dtype, present)
    _check_inner_shapes(cls, spec, inners, size, ctx, size_given)
    if not dtype_given and not (dtype.is_floating_point or dtype.is_complex) and hasattr(cls, "to_plain"):
        _check_outer_dtype(cls, tuple(inners), ctx, size, stride)
    return kit.make(tuple(inners), ctx, size, tuple(stride), offset, requires_grad,
                    device=None if device == primary.device else device)


# class -> {ctx: the floating dtype its to_plain computes in, or None}; weak, so a class
# defined in a test goes away with it.
_DTYPE_PROBES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _check_outer_dtype(cls, inners, ctx, size, stride) -> None:
    """Warn when a left-out ``dtype=`` made the wrapper integer while ``to_plain()`` is floating.

    The wrapper's dtype is what every op and ``F.linear`` computes in; a uint8 outer over an
    NF4 weight truncates its dequantized values silently. ``to_plain()`` is run once per
    class and ctx on fake copies of the inner tensors (no data is touched): floating point
    anywhere in it (a ``to_plain`` usually ends in ``.to(self.dtype)``, which hides it in the
    result) means the tensor stands for floating values. One that cannot run on fakes gives
    no verdict.
    """
    cache = _DTYPE_PROBES.get(cls)
    if cache is None:
        cache = _DTYPE_PROBES[cls] = {}
    if ctx in cache:
        got = cache[ctx]
    else:
        got = None
        if not (_compat.in_fake_or_proxy_mode() or _compat.is_compiling()
                or any(_compat.is_fake(t) or _compat.is_symbolic(s) for t in inners if t is not None for s in t.shape)
                or any(_compat.is_symbolic(s) for s in size)):
            def plain(fakes):
                return cls.to_plain(cls.__kit__.make(fakes, ctx, size, tuple(stride), 0))

            try:
                got = _compat.float_dtype_of(inners, plain)
            except Exception:  # any failure of the author's to_plain on fakes: no verdict
                got = None
        cache[ctx] = got
    if got is not None:
        warnings.warn(
            f"{cls.__kit_spec__.qualname} was built without dtype=, so its outer dtype is the "
            f"primary inner tensor's {ctx.dtype}, but {cls.__kit_spec__.qualname}.to_plain() "
            f"computes in {got}: ops on the wrapper would compute in {ctx.dtype} and truncate. Pass "
            f"dtype={got} (the dtype the tensor stands for), or set __default_dtype__ = {got} "
            "in the class body.",
            OuterDtypeWarning,
            stacklevel=4,
        )


def _check_dtype(qual: str, f: InnerField, t: torch.Tensor) -> None:
    if f.dtype is None:
        return
    allowed = f.dtype if isinstance(f.dtype, tuple) else (f.dtype,)
    if t.dtype not in allowed:
        want = " or ".join(str(d) for d in allowed)
        raise ConstructionError(
            f"{qual}.{f.name} must have dtype {want} but got {t.dtype}; convert it with "
            f".to({allowed[0]})."
        )


# ---- the outer tensor's arguments (size=, stride=, dtype=, device=) ------------------------
# Checked here so a mistake names the class and the argument instead of surfacing as a raw
# _make_wrapper_subclass error, or (for a stride that does not fit) not at all.


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_tuple(v):
    """``v`` as a tuple of ints / SymInts, or None when it is not one."""
    try:
        t = tuple(v)
    except TypeError:
        return None
    return t if all(_is_int(x) or isinstance(x, _compat.SymInt) for x in t) else None


def _check_size(qual: str, size):
    dims = _int_tuple(size)
    if dims is None:
        raise OuterArgumentError(
            f"{qual}: size= must be a sequence of ints (the outer shape) but got {size!r}. "
            "Pass e.g. size=(rows, cols)."
        )
    if any(_is_int(d) and d < 0 for d in dims):
        raise OuterArgumentError(f"{qual}: size= {dims} has a negative dimension; sizes are >= 0.")
    return dims


def _check_stride(qual: str, stride, size, primary) -> None:
    """An explicit ``stride=`` must be a layout of ``size`` that no two elements share.

    Rules (docs/authoring.md, "Mistakes caught for you"): one int >= 0 per dim, and
    non-overlapping (sorted by stride, each dim of size > 1 starts past the extent of the
    smaller ones); gaps are allowed (a wrapper over a slice). When the primary inner
    tensor has the outer shape, it backs the outer layout, so the strides must also be
    the primary's (on dims of size > 1): the kit derives views from the inner tensors, and
    an outer stride that disagrees would make them describe different elements. Symbolic
    strides (dynamo re-creating a wrapper) are only checked for their count.
    """
    st = _int_tuple(stride)
    if st is None:
        raise OuterArgumentError(
            f"{qual}: stride= must be a sequence of ints, one per dimension of the outer size "
            f"{_fmt_shape(tuple(size))}, but got {stride!r}."
        )
    if len(st) != len(size):
        raise OuterArgumentError(
            f"{qual}: stride= {_fmt_shape(st)} has {len(st)} entries but the outer size "
            f"{_fmt_shape(tuple(size))} has {len(size)} dimensions. Pass one stride per "
            f"dimension, e.g. stride={_fmt_shape(contiguous_strides(size))} (row-major), or "
            "leave stride= out."
        )
    if not all(_is_int(s) for s in st) or not all(_is_int(d) for d in size):
        return
    if 0 in size:
        return  # no elements, nothing can overlap
    if any(s < 0 for s in st):
        raise OuterArgumentError(
            f"{qual}: stride= {_fmt_shape(st)} has a negative stride; torch tensors have "
            f"strides >= 0. Use e.g. stride={_fmt_shape(contiguous_strides(size))}."
        )
    extent = 1  # elements spanned by the dims placed so far
    for s, d in sorted((s, d) for s, d in zip(st, size) if d > 1):
        if s < extent:
            raise OuterArgumentError(
                f"{qual}: stride= {_fmt_shape(st)} overlaps for the outer size "
                f"{_fmt_shape(tuple(size))}: two elements would share one storage offset. "
                f"Pass a non-overlapping layout, e.g. stride={_fmt_shape(contiguous_strides(size))} "
                "(row-major), or leave stride= out."
            )
        extent = s * (d - 1) + extent
    if all(_is_int(d) for d in primary.shape) and tuple(primary.shape) == tuple(size):
        pst = primary.stride()
        if any(a != b for a, b, d in zip(st, pst, size) if d > 1):
            raise OuterArgumentError(
                f"{qual}: stride= {_fmt_shape(st)} differs from the strides "
                f"{_fmt_shape(pst)} of the primary inner tensor, which has the outer size "
                f"{_fmt_shape(tuple(size))} and so backs the outer layout. Leave stride= out "
                "(the primary's layout is used), or lay the primary out that way first: "
                "torch.empty_strided(size, stride, dtype=...).copy_(primary)."
            )


def _check_dtype_arg(qual: str, dtype):
    if isinstance(dtype, torch.dtype):
        return dtype
    hint = ""
    if isinstance(dtype, str) and isinstance(getattr(torch, dtype.removeprefix("torch."), None), torch.dtype):
        hint = f" Pass dtype=torch.{dtype.removeprefix('torch.')}."
    raise OuterArgumentError(
        f"{qual}: dtype= must be a torch.dtype (e.g. torch.float32) but got {dtype!r} "
        f"(a {type(dtype).__name__}).{hint or ' Pass a torch.dtype.'}"
    )


def _check_device_arg(qual: str, device, primary):
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise OuterArgumentError(
            f"{qual}: device= must be a torch.device or a device string such as 'cpu' but got "
            f"{device!r} ({e}). Leave it out to use the primary inner tensor's device "
            f"({primary.device})."
        ) from None
    have = primary.device
    if dev.type != have.type or (dev.index is not None and have.index is not None and dev.index != have.index):
        # The wrapper would claim one device while every op runs on its inner tensors'.
        raise OuterArgumentError(
            f"{qual}: device= {str(dev)!r} differs from the device of the inner tensors "
            f"({have}); the outer tensor must be where its inner tensors are. Move them "
            f"first (x.to({str(dev)!r}) on each inner tensor), or leave device= out."
        )
    return have


# ---- saved parts (torch.load) ---------------------------------------------------------------
# A checkpoint is data, not code the author wrote: ``rebuild`` must not trust it any more than
# ``construct`` trusts its arguments. The same rules, applied to the parts a pickle carries.


def check_parts(cls, inners, ctx, size, stride) -> None:
    """Apply construction's checks to the parts of a saved wrapper, or raise the same errors.

    Checked: the ctx is a ``SubclassCtx`` of ``cls`` (its owner, meta names, dtype, present
    inners), the inner tensors are tensors of the declared dtypes on one device, every meta
    value passes its annotation, hashability and ``meta(check=...)``, the outer size and
    stride are valid, and the inner shapes fit ``__inner_shapes__`` for the outer size.
    """
    spec = cls.__kit_spec__
    qual = spec.qualname
    if type(ctx) is not SubclassCtx or len(ctx) != 5:
        raise ConstructionError(
            f"{qual}: the saved ctx is a {type(ctx).__name__}, not a SubclassCtx of {qual}."
        )
    owner, names, values, dtype, present = tuple(ctx)
    if owner != qual:
        raise ConstructionError(
            f"{qual}: the saved ctx belongs to {owner!r}, not to {qual}; a ctx of another class "
            "describes other fields."
        )
    if type(names) is not tuple or names != spec.meta_names or type(values) is not tuple \
            or len(values) != len(names):
        raise ConstructionError(
            f"{qual}: the saved ctx names the meta fields {names!r} with {len(values) if isinstance(values, tuple) else values!r} "
            f"values, but {qual} declares {list(spec.meta_names)}."
        )
    if not isinstance(dtype, torch.dtype):
        raise OuterArgumentError(f"{qual}: the saved outer dtype is {dtype!r}, not a torch.dtype.")
    required = [f.name for f in spec.inner if not f.optional]
    if (type(present) is not tuple or any(n not in spec.inner_names for n in present)
            or any(n not in present for n in required)):
        raise ConstructionError(
            f"{qual}: the saved ctx lists the inner tensors {present!r}, but {qual} has "
            f"{list(spec.inner_names)} (required: {required})."
        )
    if not isinstance(inners, dict) or set(inners) != set(present):
        raise ConstructionError(
            f"{qual}: the saved inner tensors are {sorted(inners) if isinstance(inners, dict) else inners!r} "
            f"but its ctx lists {list(present)}."
        )
    tensors = []
    for f in spec.inner:
        t = inners.get(f.name)
        if t is not None and not isinstance(t, torch.Tensor):
            raise ConstructionError(f"{qual}.{f.name} is saved as a {type(t).__name__}, not a tensor.")
        if t is not None:
            _check_dtype(qual, f, t)
        tensors.append(t)
    primary = tensors[0]
    if primary is None:
        raise ConstructionError(
            f"{qual} has no primary inner tensor {spec.primary!r}; every instance holds one."
        )
    for f, t in zip(spec.inner, tensors):
        if t is not None and t.device != primary.device:
            raise ConstructionError(
                f"{qual}.{f.name} is on {t.device} but the primary inner tensor {spec.primary!r} "
                f"is on {primary.device}."
            )
    for f, v in zip(spec.meta, values):
        if not isinstance(v, torch.Tensor):
            check_meta_type(qual, f, v, where="the saved value")
        check_meta_value(qual, f.name, v, where="the saved value")
        check_meta_rule(qual, f, v, where="the saved value")
    size = _check_size(qual, size)
    _check_stride(qual, stride, size, primary)
    _check_inner_shapes(cls, spec, tensors, size, ctx)
