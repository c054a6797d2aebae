"""One runtime object per ``WrapperTensor`` class (``Cls.__kit__``), and the one function that
builds an instance.

Everything the kit keeps per class lives in one slotted ``KitClass``: the frozen spec, the
names the hot paths read, the op table with its cache, per-class flags, and ``make``, generated
once per class when the class is created. ``make`` is the only code that builds a wrapper
instance: validated construction, ``from_parts``, ``parts_builder``, ``__tensor_unflatten__``,
the rewrap engine, the built-in handlers and the exemplars' handlers all end in it. It is
therefore also the only place that knows the export-tracing rule (a construction made while a
torch-function mode is on is recorded for export's pre-dispatch trace, see
``_pre_dispatch.py``); a change to how a wrapper is built is made here once.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Sequence

import torch

from . import _compat
from ._pre_dispatch import maybe_record
from .ctx import CTX_ATTR, SubclassCtx
from .fields import MISSING

__all__ = ["KitClass", "build_make", "build_parts", "kit_handler", "is_kit_handler"]

_STRIDED = torch.strided
_DTYPE = 3  # SubclassCtx's layout (see ctx.py): read with tuple indexing on the hot path
_make_subclass = _compat.make_wrapper_subclass
_tf_mode_on = _compat.torch_function_mode_enabled


class KitClass:
    """The kit's per-class runtime state (``Cls.__kit__``); one per class, never inherited."""

    __slots__ = (
        "cls",
        "spec",
        "inner_names",
        "field_index",
        "field_names",
        "state_names",
        "state_order",
        "own_ops",
        "own_tf",
        "cache",
        "checked_meta",
        "outer_shaped",
        "default_ctxs",
        "default_inner_shapes",
        "graph_rebuild",
        "graph_wrap",
        "graph_unwrap",
        "make",
        "__weakref__",
    )

    def __init__(self, cls: type, spec: Any, default_inner_shapes: Callable | None) -> None:
        self.cls = cls
        self.spec = spec
        self.inner_names: tuple = spec.inner_names
        self.field_index: dict = {f.name: i for i, f in enumerate(spec.fields)}
        self.field_names: frozenset = frozenset(self.field_index)
        self.state_names: frozenset = frozenset(f.name for f in spec.state)
        self.state_order: tuple = tuple(f.name for f in spec.state)
        #: aten ops (overloads or packets) -> handler, registered on this very class
        self.own_ops: dict = {}
        #: torch-level functions -> handler, registered on this very class
        self.own_tf: dict = {}
        #: resolved handlers by op and by ``id(op)`` (see ``_dispatch.resolve``)
        self.cache: dict = {}
        #: meta values already validated at construction: (name, type, value)
        self.checked_meta: set = set()
        #: (ndim, ctx) -> whether every present inner tensor has the outer shape
        self.outer_shaped: dict = {}
        #: (dtype, present) -> the ctx of the meta defaults (``from_parts`` without ctx=)
        self.default_ctxs: dict = {}
        self.default_inner_shapes = default_inner_shapes
        self.graph_rebuild: Callable | None = None
        #: ``Cls.wrap`` / ``x.unwrap()``'s graph functions (see ``_wrap.py``)
        self.graph_wrap: Callable | None = None
        self.graph_unwrap: Callable | None = None
        self.make: Callable = build_make(cls, self.inner_names, self.state_names)

    def inner_shapes_are_outer(self) -> bool:
        """True when the class keeps the default ``__inner_shapes__`` (every inner is outer-shaped)."""
        shapes: Any = getattr(self.cls, "__inner_shapes__")  # a bound classmethod
        return getattr(shapes, "__func__", None) is self.default_inner_shapes

    def __repr__(self) -> str:
        return f"<KitClass of {self.spec.qualname}>"


_MAKE_ANNOTATIONS: dict = {
    "inners": "tuple[torch.Tensor | None, ...]",
    "ctx": "SubclassCtx",
    "size": "Sequence[int | torch.SymInt]",
    "stride": "Sequence[int | torch.SymInt]",
    "offset": "int | torch.SymInt",
    "requires_grad": "bool",
    "device": "torch.device | None",
    "state": "dict[str, Any] | None",
}


def build_make(cls: type, names: tuple, state_names: frozenset) -> Callable:
    """Generate ``cls``'s ``make``: the one function that builds an instance of ``cls``.

    ``make(inners, ctx, size, stride, offset=0, requires_grad=False, *, device=None,
    state=None)``: trusted (nothing is checked but the state names); ``inners`` is a tuple in
    declaration order (None for an absent optional inner); the outer dtype is the ctx's, the
    device the primary's unless given. Specialised by the number of inner tensors, and the
    common case passes ``_make_wrapper_subclass`` its arguments by position (keyword parsing
    there is a measurable part of every op's cost).
    """
    n = len(names)
    qual = cls.__qualname__

    def new(inners, ctx, size, stride, offset, requires_grad, device):
        if device is None:
            device = inners[0].device
        if requires_grad or offset.__class__ is not int or offset:
            return _make_subclass(
                cls, size, strides=stride, storage_offset=offset, dtype=ctx[_DTYPE], device=device,
                layout=_STRIDED, requires_grad=requires_grad,
            )
        return _make_subclass(cls, size, stride, None, None, ctx[_DTYPE], _STRIDED, device)

    def bad_state(state):
        unknown = sorted(state.keys() - state_names)
        return TypeError(
            f"{qual} has no state named {unknown} (declared state: "
            f"{sorted(state_names) or 'none'}). Declare it in the class body, e.g. "
            "`_name: object = state()`."
        )

    # The three variants differ only in how the inner tensors are stored; each is one frame
    # (no helper calls on the common path): this runs for every op's result.
    if n == 1:
        (n0,) = names

        def make(inners, ctx, size, stride, offset=0, requires_grad=False, *, device=None, state=None):
            if requires_grad or offset.__class__ is not int or offset or device is not None:
                r = new(inners, ctx, size, stride, offset, requires_grad, device)
            else:
                r = _make_subclass(cls, size, stride, None, None, ctx[_DTYPE], _STRIDED, inners[0].device)
            d = r.__dict__
            d[n0] = inners[0]
            d[CTX_ATTR] = ctx
            if state:
                if not state.keys() <= state_names:
                    raise bad_state(state)
                d.update(state)
            if _tf_mode_on():
                # User-level code under a torch-function mode, perhaps export's pre-dispatch
                # tracing, which must see this construction (see _pre_dispatch.py).
                maybe_record(r, inners, size, stride, offset)
            return r

    elif n == 2:
        n0, n1 = names

        def make(inners, ctx, size, stride, offset=0, requires_grad=False, *, device=None, state=None):
            if requires_grad or offset.__class__ is not int or offset or device is not None:
                r = new(inners, ctx, size, stride, offset, requires_grad, device)
            else:
                r = _make_subclass(cls, size, stride, None, None, ctx[_DTYPE], _STRIDED, inners[0].device)
            d = r.__dict__
            d[n0] = inners[0]
            d[n1] = inners[1]
            d[CTX_ATTR] = ctx
            if state:
                if not state.keys() <= state_names:
                    raise bad_state(state)
                d.update(state)
            if _tf_mode_on():
                maybe_record(r, inners, size, stride, offset)  # see the one-inner variant
            return r

    else:

        def make(inners, ctx, size, stride, offset=0, requires_grad=False, *, device=None, state=None):
            r = new(inners, ctx, size, stride, offset, requires_grad, device)
            d = r.__dict__
            d.update(zip(names, inners))
            d[CTX_ATTR] = ctx
            if state:
                if not state.keys() <= state_names:
                    raise bad_state(state)
                d.update(state)
            if _tf_mode_on():
                maybe_record(r, inners, size, stride, offset)  # see the one-inner variant
            return r

    make.__name__ = "make"
    make.__qualname__ = f"{qual}.make"
    make.__doc__ = build_make.__doc__
    # Generated per class, so its signature's types are set here rather than written on it.
    make.__annotations__ = {**_MAKE_ANNOTATIONS, "return": cls}
    return make


def build_parts(kit: KitClass, ctx: SubclassCtx, size: tuple, stride: tuple, offset: Any,
                state: dict | None) -> Callable:
    """``build(*inners)``: ``kit.make(inners, ctx, size, stride, offset, state=state)`` with
    everything but the inner tensors fixed now (``WrapperTensor.parts_builder``, whose
    caller has checked ``state``).

    A cached plan builds every result of its op this way, so the common case (one inner
    tensor, storage offset 0) is generated as one frame that does only what ``make`` does
    for it: the wrapper from positional arguments, the instance dict, the export-tracing
    rule. Any other case calls ``make``.
    """
    make = kit.make
    if len(kit.inner_names) != 1 or offset.__class__ is not int or offset:

        def build(*inners):
            return make(inners, ctx, size, stride, offset, state=state)

        return build
    cls, (n0,), dtype = kit.cls, kit.inner_names, ctx[_DTYPE]

    def build_one(inner):
        r = _make_subclass(cls, size, stride, None, None, dtype, _STRIDED, inner.device)
        d = r.__dict__
        d[n0] = inner
        d[CTX_ATTR] = ctx
        if state:
            d.update(state)
        if _tf_mode_on():
            maybe_record(r, (inner,), size, stride, offset)  # see build_make
        return r

    return build_one


# ---- trust: whose handlers' results are not checked against the op's schema -------------------
# The kit's own built-in handlers and ready-made fallbacks return what the op returns by
# construction; they are registered here where they are defined (not recognised by the file
# they live in). A class vouches for its own handlers with ``__check_handlers__ = False``.
_KIT_HANDLERS: "weakref.WeakSet[Callable]" = weakref.WeakSet()


def kit_handler(fn: Callable) -> Callable:
    """Register ``fn`` as one of the kit's own handlers (its results are never checked)."""
    _KIT_HANDLERS.add(fn)
    return fn


def is_kit_handler(h: Callable) -> bool:
    """True for the kit's own handlers (a partial is judged by its function)."""
    try:
        return h in _KIT_HANDLERS or getattr(h, "func", None) in _KIT_HANDLERS
    except TypeError:  # not weak-referenceable: not one of ours
        return False


def default_ctx(kit: KitClass, dtype: torch.dtype, inners: tuple) -> SubclassCtx:
    """The ctx of the meta defaults for ``inners`` (``from_parts`` without ``ctx=``)."""
    present = tuple([n for n, t in zip(kit.inner_names, inners) if t is not None])
    c = kit.default_ctxs.get((dtype, present))
    if c is None:
        spec = kit.spec
        if MISSING in spec.meta_defaults:
            raise TypeError(
                f"{spec.qualname}.from_parts needs ctx=: the meta fields "
                f"{[n for n, d in zip(spec.meta_names, spec.meta_defaults) if d is MISSING]} "
                "have no defaults. Pass another instance's ctx, or build the instance with "
                f"{spec.qualname}(...)."
            )
        c = kit.default_ctxs[(dtype, present)] = SubclassCtx.make(
            spec.qualname, spec.meta_names, spec.meta_defaults, dtype, present
        )
    return c
