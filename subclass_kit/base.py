"""``WrapperTensor``: declare the fields, get the whole PT2 subclass protocol.

A subclass declares inner tensors with ``inner()`` and constant metadata with ``meta()``;
``__init_subclass__`` builds one frozen spec, validates it, and wires the derived protocol
(see ``_flatten.py`` for the round-trip law), the op table (``_dispatch.py``), the
built-in handlers (``_defaults.py``) and the class's runtime object ``Cls.__kit__``
(``_runtime.py``), whose generated ``make`` builds every instance.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Callable, ClassVar

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:  # torch itself depends on typing_extensions
    from typing_extensions import dataclass_transform

import torch

from . import _aliasing, _compat, _dispatch, _flatten, _instance_state, _pre_dispatch, _wrap
from ._construct import construct, contiguous_strides
from ._runtime import KitClass, build_parts, default_ctx
from .ctx import SubclassCtx, reader
from .errors import FrozenFieldError, LocalClassWarning
from .fields import MISSING, inner, meta, state
from ._spec import ClassSpec, build_spec

__all__ = ["WrapperTensor"]

_EMPTY: dict = {}  # shared empty kwargs; handlers must not mutate kwargs


def _meta_property(name: str, annotation: Any):
    def fget(self):
        return self._kit_ctx.__getattr__(name)

    fget.__name__ = name
    # The field's declared type (maybe a string, as written) is the getter's return type.
    fget.__annotations__ = {"return": Any if annotation is None else annotation}
    return property(fget, doc=f"meta field {name!r} (read-only; part of the ctx)")


def _torch_replaces_inner(cls, name: str) -> bool:
    # AOTAutograd itself replaces the inner tensors of a tangent in place
    # (``setattr(x, attr, new_elem)`` when it coerces a tangent's memory format or metadata),
    # so an inner field assigned directly from torch's own code is let through. Torch's call
    # carries no other mark than where it comes from, hence the frame inspection. It is never
    # on a per-op path: only an assignment to a declared inner field's name reaches it (the
    # kit's own constructor, ``make``, fills the instance dict without ``__setattr__``), and
    # that is either torch's coercion (once per tangent) or a mistake about to raise.
    if name not in cls.__kit__.inner_names:
        return False
    caller = sys._getframe(2).f_globals.get("__name__", "")
    return caller == "torch" or caller.startswith("torch.")


def _frozen_field_message(self, name: str, what: str) -> str:
    cls = type(self)
    spec = cls.__kit_spec__
    kind = "inner tensor" if name in spec.inner_names else "meta"
    args = ", ".join(
        f"{f.name}=<new value>" if f.name == name else f"{f.name}=x.{f.name}" for f in spec.fields
    )
    return (
        f"{spec.qualname}.{name} is a declared {kind} field and is read-only after "
        f"construction (it was {what}). Compiled code guards and rebuilds a wrapper from its "
        f"fields, so changing one in place would go unnoticed. Build a new instance "
        f"instead: {cls.__name__}({args}, dtype=x.dtype)."
    )


@dataclass_transform(field_specifiers=(inner, meta, state), kw_only_default=False)
class WrapperTensor(torch.Tensor):
    """Base class for wrapper tensor subclasses with declared fields.

    Fields are class annotations with ``inner()`` (a tensor held inside; the first is the
    primary) or ``meta()`` (constant, hashable, picklable metadata). Construction takes the
    fields positionally in declaration order or by keyword, plus ``size=``, ``stride=``,
    ``dtype=``, ``device=``, ``requires_grad=`` for the outer tensor (by default those of the
    primary inner tensor).

    Declared fields are read-only after construction (``FrozenFieldError``); build a new
    instance to change one. An optional ``to_plain()`` (the dense tensor) is differentiable:
    on a wrapper that requires grad, the dense gradient goes to the wrapper as it is.

    Example:
        >>> import torch
        >>> from subclass_kit import WrapperTensor, inner, meta, fallbacks
        >>> class Pair(WrapperTensor):
        ...     a: torch.Tensor = inner()
        ...     b: torch.Tensor = inner()
        ...     tag: str = meta(default="pair")
        ...     __fallback__ = fallbacks.map_inner
        >>> p = Pair(torch.ones(2, 3), torch.zeros(2, 3))
        >>> p.shape, p.tag, p.__tensor_flatten__()[0]
        (torch.Size([2, 3]), 'pair', ['a', 'b'])
    """

    __kit_spec__: ClassVar[ClassSpec]
    #: The class's runtime object (spec, op table and cache, flags, ``make``); one per class.
    __kit__: ClassVar[KitClass]

    #: False: the class vouches for every handler it registers (``implements``,
    #: ``__op_handler__``, ``__fallback__``), so their results are not checked against the
    #: op's schema (see ``HandlerResultError``) and the per-op path pays nothing for it.
    __check_handlers__: ClassVar[bool] = True

    # Subclass tensors do not take part in torch-function overrides unless they register
    # torch-level handlers (implements_torch_function installs one then).
    __torch_function__ = _compat.disabled_torch_function_impl  # type: ignore[assignment]  # torch's C impl, typed loosely

    __fallback__ = staticmethod(_dispatch.raise_unsupported)

    #: The outer dtype when ``dtype=`` is left out (None: the primary inner tensor's). Set it
    #: on a quantized class whose primary is integer: ``__default_dtype__ = torch.bfloat16``.
    __default_dtype__: ClassVar[torch.dtype | None] = None

    def __init_subclass__(cls, abstract: bool = False, **kwargs):
        super().__init_subclass__(**kwargs)
        parent = next(
            (b.__dict__["__kit_spec__"] for b in cls.__mro__[1:] if "__kit_spec__" in b.__dict__),
            None,
        )
        spec = build_spec(cls, parent, abstract=abstract)
        _install_runtime(cls, spec)
        for f in spec.inner:
            if f.name in cls.__dict__:
                delattr(cls, f.name)
        for f in spec.meta:
            if f.name in cls.__dict__ and not isinstance(cls.__dict__[f.name], property):
                setattr(cls, f.name, _meta_property(f.name, f.annotation))
        if "to_plain" in cls.__dict__:
            setattr(cls, "to_plain", _pre_dispatch.exportable_to_plain(cls.__dict__["to_plain"]))
        fb = cls.__dict__.get("__fallback__")
        if fb is not None and not isinstance(fb, staticmethod):
            # A plain function in the class body would become a method; keep it plain.
            cls.__fallback__ = staticmethod(fb)
        if "<locals>" in cls.__qualname__ and not abstract:
            warnings.warn(
                f"{cls.__qualname__} is defined inside a function, so it is not importable by "
                "its qualified name: AOTAutograd's cache will be bypassed for graphs that take "
                "it (and pickling it fails). Define it at module level.",
                LocalClassWarning,
                stacklevel=2,
            )

    def __new__(cls, *args: Any, **kwargs: Any):
        return construct(cls, args, dict(kwargs))

    @classmethod
    def wrap(cls, *args: Any, **kwargs: Any) -> Any:
        """The constructor, differentiable: same arguments, and the gradient flows into the
        inner tensors given (a ``Cls`` gradient field by field; a plain one split by the
        vector-Jacobian product of ``to_plain()``). See docs/authoring.md, "Handlers and autograd".

        Example:
            >>> import torch
            >>> from subclass_kit.examples import TwoTensor
            >>> a = torch.ones(2, requires_grad=True)
            >>> t = TwoTensor.wrap(a * 2, torch.zeros(2))
            >>> t.unwrap()[0].sum().backward()
            >>> t.is_leaf, a.grad
            (False, tensor([2., 2.]))
        """
        return _wrap.wrap(cls, args, kwargs)

    def unwrap(self) -> tuple:
        """The inner tensors (one per inner field, declaration order, None if absent), with
        their gradients flowing back into this wrapper as an instance of its class.

        Example:
            >>> import torch
            >>> from subclass_kit.examples import TwoTensor
            >>> t = TwoTensor(torch.ones(2), torch.zeros(2)).requires_grad_()
            >>> (t.unwrap()[0] * 3).sum().backward()
            >>> type(t.grad).__name__, t.grad.a.tolist(), t.grad.b.tolist()
            ('TwoTensor', [3.0, 3.0], [0.0, 0.0])
        """
        return _wrap.unwrap(self)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Runs after validated construction only (see __post_init__ below).
        post = self.__post_init__
        if post is not None:
            post()

    # ---- declared fields are read-only after construction -----------------------------
    # The kit's one writer (the class's ``make``, behind from_parts, unflatten, pickling,
    # deepcopy and every handler's result) fills ``__dict__`` directly, which does not pass
    # through here, so the per-op path pays nothing. Only declared names are guarded: any
    # other attribute stays settable.
    def __setattr__(self, name: str, value: Any) -> None:
        cls = type(self)
        if name in cls.__kit__.field_names and not _torch_replaces_inner(cls, name):
            raise FrozenFieldError(_frozen_field_message(self, name, f"assigned a value of type {type(value).__name__}"))
        torch.Tensor.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name in type(self).__kit__.field_names:
            raise FrozenFieldError(_frozen_field_message(self, name, "deleted"))
        torch.Tensor.__delattr__(self, name)

    # ---- the derived protocol (see flatten.py) --------------------------------------
    __tensor_flatten__ = _flatten.tensor_flatten
    __tensor_unflatten__ = classmethod(_flatten.tensor_unflatten)
    _stable_hash_for_caching = _flatten.stable_hash
    __reduce_ex__ = _flatten.reduce_ex
    __deepcopy__ = _flatten.deepcopy
    __repr__ = _flatten.wrapper_repr  # type: ignore[assignment]  # Tensor's takes tensor_contents=, unused here

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # Inlined (not a call into _dispatch.py): this runs for every op on every instance.
        try:
            h = cls.__kit__.cache[id(func)]  # see _dispatch.resolve
        except KeyError:
            h = _dispatch.resolve(cls, func)
        return h(func, types, args, _EMPTY if kwargs is None else kwargs)

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx) -> dict:
        """Expected shape of each inner tensor for an outer size; override for derived shapes.

        The default gives every inner tensor the outer shape. Write plain arithmetic (with
        ``symbolic.ceil_div`` etc.): it runs on ints, SymInts and sympy symbols.
        """
        return {n: tuple(outer_size) for n in cls.__kit__.inner_names}

    @classmethod
    def __default_ctx__(cls):
        """The ctx built from the meta defaults (for ``symbolic.relations(cls)``)."""
        spec = cls.__kit_spec__
        missing = [n for n, d in zip(spec.meta_names, spec.meta_defaults) if d is MISSING]
        if missing:
            raise TypeError(
                f"{spec.qualname} has meta fields without defaults ({missing}); pass an "
                "instance instead of the class."
            )
        return SubclassCtx.make(
            spec.qualname, spec.meta_names, spec.meta_defaults, torch.get_default_dtype(), spec.inner_names
        )

    def __coerce_tangent_metadata__(self):
        """The tangent AOTAutograd should trace with for this forward output (identity).

        Override when some metadata can never arrive in a gradient (DTensor's Partial):
        return an instance of the same class with metadata a gradient can have.
        """
        return self

    def __coerce_same_metadata_as_tangent__(self, expected_metadata, expected_type=None):
        """Turn a runtime tangent into the metadata AOTAutograd traced with, or None.

        The default handles the cases that are right for any wrapper: same ctx (itself)
        and a plain tensor expected (``to_plain()`` when the class has it).
        """
        if expected_type is None or expected_type is type(self):
            return self if expected_metadata == self._kit_ctx else None
        if expected_type is torch.Tensor and hasattr(self, "to_plain"):
            return self.to_plain()
        return None

    # ---- op tables ---------------------------------------------------------------------
    @classmethod
    def implements(cls, *ops: Any) -> Callable[[Callable], Callable]:
        """Register a handler ``fn(func, types, args, kwargs)`` for aten ops on this class.

        Accepts OpOverloads (``aten.mm.default``) and OpOverloadPackets (``aten.mm``, every
        overload). A subclass's table extends its parent's.

        Example:
            >>> import torch
            >>> from subclass_kit import WrapperTensor, inner, meta
            >>> class Signed(WrapperTensor):
            ...     magnitude: torch.Tensor = inner()
            ...     flipped: bool = meta(default=False)
            ...     def to_plain(self):
            ...         return -self.magnitude if self.flipped else self.magnitude
            >>> @Signed.implements(torch.ops.aten.neg.default)
            ... def _neg(func, types, args, kwargs):
            ...     x = args[0]
            ...     return Signed(x.magnitude, flipped=not x.flipped)
            >>> torch.neg(Signed(torch.tensor([1.0, 2.0]))).to_plain()
            tensor([-1., -2.])
        """
        return _dispatch.register_ops(cls, ops)

    @classmethod
    def implements_torch_function(cls, *fns: Callable) -> Callable[[Callable], Callable]:
        """Register a handler for torch-level functions (``torch.nn.functional.linear``).

        Example:
            >>> import torch
            >>> from subclass_kit import WrapperTensor, inner, fallbacks
            >>> class Logged(WrapperTensor):
            ...     payload: torch.Tensor = inner()
            ...     __fallback__ = fallbacks.map_inner
            >>> @Logged.implements_torch_function(torch.nn.functional.relu)
            ... def _relu(func, types, args, kwargs):
            ...     return Logged(args[0].payload.clamp_min(0))
            >>> torch.nn.functional.relu(Logged(torch.tensor([-1.0, 2.0]))).payload
            tensor([0., 2.])
        """
        return _dispatch.register_torch_functions(cls, fns)

    # ---- extension surface: what subclasses with more than fields build on ---------------
    # Documented in docs/authoring.md ("Beyond fields"). AsyncCollectiveTensor is built on it.

    #: ``def __post_init__(self)``: runs after validated construction (``Cls(...)``), e.g.
    #: to set declared ``state()``; trusted rebuilds (``from_parts``, unflatten, handlers'
    #: results) never run it. None: nothing to run.
    __post_init__ = None

    @classmethod
    def __op_handler__(cls, func):
        """The handler for an aten op this class registered none for, or None (the default).

        Consulted once per (class, op), after the registered handlers and before the
        built-in ones and ``__fallback__``; the answer is cached. Override it to classify
        ops by their schema (every view one way, everything else another) instead of
        registering them one by one.

        Example:
            >>> import torch
            >>> from subclass_kit import WrapperTensor, inner
            >>> class Frozen(WrapperTensor):
            ...     payload: torch.Tensor = inner()
            ...     @classmethod
            ...     def __op_handler__(cls, func):
            ...         def plain(func, types, args, kwargs):  # compute on the payload, return plain
            ...             return func(*[a.payload if type(a) is Frozen else a for a in args], **kwargs)
            ...         return plain
            >>> torch.add(Frozen(torch.ones(2)), 1)
            tensor([2., 2.])
        """
        return None

    @classmethod
    def from_parts(cls, inners: Any, /, ctx: SubclassCtx | None = None, *, size: Any = None, stride: Any = None,
                   offset: Any = None, requires_grad: bool = False, **state: Any) -> "WrapperTensor":
        """Trusted construction from parts already known to fit: no validation, no ``__post_init__``.

        Args:
            inners: the inner tensors, a tuple in declaration order (None for an absent
                optional one) or a dict by name.
            ctx: the ctx (e.g. another instance's, from ``__tensor_flatten__``); None: the
                meta defaults with the primary inner tensor's dtype.
            size: the outer size; by default the primary's shape (and then its stride and
                storage offset too).
            stride: the outer stride; with ``size=`` given and ``stride=`` left out, the
                row-major strides of ``size`` (a (B, L, D) outer over a 2-d primary gets
                (L*D, D, 1), never the primary's).
            offset: the outer storage offset; by default the primary's when it has the
                outer's dimensionality, else 0.
            requires_grad: for the outer tensor.
            **state: values for declared ``state()`` attributes.

        Example:
            >>> import torch
            >>> from subclass_kit.examples import TwoTensor
            >>> t = TwoTensor.from_parts((torch.ones(2, 3), torch.zeros(2, 3)), size=(3, 2))
            >>> type(t).__name__, tuple(t.shape), t.stride()
            ('TwoTensor', (3, 2), (2, 1))
        """
        kit = cls.__kit__
        if type(inners) is dict:
            inners = tuple([inners.get(n) for n in kit.inner_names])
        elif type(inners) is not tuple:
            inners = tuple(inners)
        primary = inners[0]
        if ctx is None:
            ctx = default_ctx(kit, primary.dtype, inners)
        if size is None:
            size = primary.shape
            stride = primary.stride() if stride is None else stride
        elif stride is None:
            stride = contiguous_strides(size)
        if offset is None:
            offset = primary.storage_offset() if primary.dim() == len(size) else 0
        return kit.make(inners, ctx, size, tuple(stride), offset, requires_grad, state=state)

    @classmethod
    def parts_builder(cls, ctx: SubclassCtx, /, *, size: Any, stride: Any, offset: Any = 0,
                      **state: Any) -> Callable[..., "WrapperTensor"]:
        """``make(*inners)``: ``from_parts(inners, ctx, size=, stride=, offset=, **state)`` with
        everything but the inner tensors fixed now.

        For a handler that caches its result's metadata (a plan per argument signature):
        each call then only builds the instance, with no argument parsing or checks. The
        device is the primary inner tensor's, as in ``from_parts``.

        Example:
            >>> import torch
            >>> from subclass_kit.examples import TwoTensor
            >>> x = TwoTensor(torch.ones(2, 3), torch.zeros(2, 3))
            >>> make = TwoTensor.parts_builder(x.__tensor_flatten__()[1], size=(3, 2), stride=(2, 1))
            >>> y = make(torch.ones(3, 2), torch.ones(3, 2))
            >>> type(y).__name__, tuple(y.shape), y.b.sum().item()
            ('TwoTensor', (3, 2), 6.0)
        """
        if state:
            _instance_state.check(cls, state)
        return build_parts(cls.__kit__, ctx, tuple(size), tuple(stride), offset, state or None)

    @classmethod
    def make_ctx(cls, *, dtype: torch.dtype, present: tuple | None = None, **meta_values: Any) -> SubclassCtx:
        """A ctx of this class from meta values by name (defaults fill the rest); no validation.

        For handlers that build results with other meta values than their inputs' (a new
        placement, a new block size) and cache the ctx: pair it with ``Cls.make``.
        ``present`` names the inner tensors that are present (default: every inner field).

        Example:
            >>> import torch
            >>> from subclass_kit.examples import BlockScaled
            >>> BlockScaled.make_ctx(dtype=torch.float32, block=16)
            BlockScaled.ctx(block=16, dtype=torch.float32)
        """
        spec = cls.__kit__.spec
        unknown = [k for k in meta_values if k not in spec.meta_names]
        if unknown:
            raise TypeError(
                f"{spec.qualname}.make_ctx() got {unknown[0]!r}, which is not a meta field; its "
                f"meta fields are {list(spec.meta_names)}."
            )
        values = []
        for name, default in zip(spec.meta_names, spec.meta_defaults):
            v = meta_values.get(name, default)
            if v is MISSING:
                raise TypeError(f"{spec.qualname}.make_ctx() needs {name}= (the meta field has no default).")
            values.append(v)
        present = spec.inner_names if present is None else tuple(present)
        return SubclassCtx.make(spec.qualname, spec.meta_names, tuple(values), dtype, present)

    @classmethod
    def ctx_reader(cls, *names: str) -> Callable[[Any], Any]:
        """``read(x)``: meta values of an instance by name, with the lookup done once, here.

        One name: ``read(x)`` is that value; several: a tuple in the order given. For
        handlers that read the same fields on every op (cheaper than ``ctx_of(x).<name>``).

        Example:
            >>> import torch
            >>> from subclass_kit.examples import BlockScaled
            >>> block_of = BlockScaled.ctx_reader("block")
            >>> block_of(BlockScaled.from_float(torch.ones(64, 2), block=16))
            16
        """
        spec = cls.__kit__.spec
        return reader(spec.qualname, spec.meta_names, names)

    #: ``Cls.make(inners, ctx, size, stride, offset=0, requires_grad=False, *, device=None,
    #: state=None)``: the one trusted constructor, generated for each class (see
    #: ``_runtime.build_make``); no validation, no ``__post_init__``. ``inners`` is a tuple
    #: in declaration order (None for an absent optional inner), ``ctx`` the result's ctx
    #: (an input's, or ``Cls.make_ctx(...)``), ``state`` a dict of declared ``state()``
    #: values. The device is the primary inner tensor's unless ``device=`` is given.
    make: ClassVar[Callable[..., Any]]

    #: ``correct_aliasing(func, args, kwargs, out)``: what a handler of ``func`` returns for
    #: ``out`` so that aliasing follows the op's schema (a view shares its input's wrapper-level
    #: storage; an in-place or ``out=`` op returns the argument it wrote). See ``aliasing.py``.
    correct_aliasing = staticmethod(_aliasing.correct_aliasing)

    #: ``op_aliasing(func)``: how ``func`` aliases its arguments, read once from its schema
    #: (an ``OpAliasing``: ``.functional``, ``.simple_view``, ``.views``, ``.writes``,
    #: ``.inplace_view``), for handlers that take a fast path per kind of op.
    op_aliasing = staticmethod(_aliasing.plan)

    #: ``x.rewrap(func, args, kwargs, *results)``: the view hook for handlers of view ops
    #: (see ``_aliasing.rewrap``; bound here without a wrapper: it runs on every view op).
    rewrap = _aliasing.rewrap


def _authors_make(cls: type) -> Any:
    """The nearest ``make`` up ``cls``'s MRO that an author wrote, or None if the nearest is generated."""
    for base in cls.__mro__:
        found = base.__dict__.get("make")
        if found is None:
            continue
        kit = base.__dict__.get("__kit__")
        generated = isinstance(found, staticmethod) and kit is not None and found.__func__ is kit.make
        return None if generated else found
    return None


def _install_runtime(cls, spec) -> None:
    """Give ``cls`` its spec, its runtime object and its generated ``make``."""
    cls.__kit_spec__ = spec
    kit = cls.__kit__ = KitClass(cls, spec, _DEFAULT_INNER_SHAPES)
    if _authors_make(cls) is None:
        # A class (or a parent) that defines a ``make`` of its own keeps it; the kit's is
        # then reached as ``Cls.__kit__.make``.
        cls.make = staticmethod(kit.make)
    _instance_state.install(cls, spec)
    kit.graph_rebuild = _flatten.graph_rebuild(cls)
    kit.graph_wrap, kit.graph_unwrap = _wrap.graph_functions(cls)
    _dispatch.init_class(cls)


_DEFAULT_INNER_SHAPES = WrapperTensor.__dict__["__inner_shapes__"].__func__
_install_runtime(WrapperTensor, ClassSpec("WrapperTensor", (), (), (), (), (), ()))
# The dispatcher runs ops; it is never a graph of its own (see _compat.never_compile_frames).
_compat.never_compile_frames(WrapperTensor.__dict__["__torch_dispatch__"].__func__)
