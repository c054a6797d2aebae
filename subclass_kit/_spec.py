"""The frozen per-class spec that ``WrapperTensor.__init_subclass__`` builds and validates.

Every derived piece of the protocol (flatten, unflatten, construction, repr, hashing) reads
this one spec, so no list of field names is ever written twice.
"""

from __future__ import annotations

import copy
import numbers
import pickle
import sys
import types
import typing
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from .ctx import RESERVED
from .errors import FieldDeclarationError, MetaTypeError, MetaValueError
from .fields import MISSING, InnerField, MetaField, StateField

__all__ = ["ClassSpec", "build_spec", "check_meta_value", "check_meta_type", "check_meta_rule", "meta_type_test"]

# Keyword arguments of the constructor that describe the outer tensor.
OUTER_KWARGS = ("size", "stride", "dtype", "device", "requires_grad")


@dataclass(frozen=True)
class ClassSpec:
    """Fields of one WrapperTensor subclass, in declaration order."""

    qualname: str
    fields: tuple  # InnerField | MetaField, declaration order
    inner: tuple  # InnerField
    meta: tuple  # MetaField
    inner_names: tuple
    meta_names: tuple
    meta_defaults: tuple  # MISSING where none
    state: tuple = ()  # StateField: per-instance state, not fields (no ctx, no constructor argument)

    @property
    def primary(self) -> str:
        return self.inner_names[0]

    def __repr__(self) -> str:
        parts = [f"{f.name}: inner{'(optional)' if f.optional else ''}" for f in self.inner]
        parts += [
            f"{f.name}: meta" + ("" if f.default is MISSING else f"(default={f.default!r})")
            for f in self.meta
        ]
        return f"<spec of {self.qualname}: {', '.join(parts)}>"


def _is_classvar(annotation: Any) -> bool:
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return "ClassVar" in text


def check_meta_value(owner: str, name: str, value: Any, *, where: str) -> None:
    """Raise if a meta value could not serve as part of a guarded, cached, pickled ctx."""
    if isinstance(value, torch.Tensor):
        raise FieldDeclarationError(
            f"{owner}.{name} is a meta field but {where} is a tensor "
            f"({type(value).__name__} of shape {tuple(value.shape)}). Tensors in the ctx break "
            f"fake-tensor tracing and caching; declare it with `{name}: torch.Tensor = inner()` "
            "instead, or pass a Python value."
        )
    try:
        hash(value)
    except TypeError:
        raise FieldDeclarationError(
            f"{owner}.{name} is a meta field but {where} ({value!r}, a "
            f"{type(value).__name__}) is not hashable. Dynamo guards meta values by == and "
            "AOTAutograd hashes them: use a tuple instead of a list, a frozenset instead of a "
            "set, or a frozen dataclass."
        ) from None
    try:
        pickle.dumps(value)
    except Exception as e:  # pickling raises many types
        raise FieldDeclarationError(
            f"{owner}.{name} is a meta field but {where} ({value!r}) cannot be pickled "
            f"({type(e).__name__}: {e}). The compile caches pickle the ctx: use a value "
            "defined at module level (not a lambda or a local class)."
        ) from None


def build_spec(cls: type, parent: ClassSpec | None, *, abstract: bool) -> ClassSpec:
    """Collect and validate the fields declared on ``cls`` (plus those inherited)."""
    qual = cls.__qualname__
    own = dict(cls.__dict__)
    annotations = own.get("__annotations__", {})
    fields = list(parent.fields) if parent is not None else []
    taken = {f.name for f in fields}

    declared = []
    for name, value in own.items():
        if isinstance(value, (InnerField, MetaField, StateField)):
            declared.append(name)
    for name in annotations:
        if name.startswith("__") or _is_classvar(annotations[name]):
            continue
        value = own.get(name, MISSING)
        if not isinstance(value, (InnerField, MetaField, StateField)):
            if value is MISSING:
                hint = f"`{name}: ... = inner()` for a tensor or `{name}: ... = meta()` for constant metadata"
            else:
                hint = (
                    f"`{name}: ... = meta(default={value!r})` for constant metadata, or "
                    f"`{name}: ClassVar[...] = {value!r}` for a class attribute"
                )
            raise FieldDeclarationError(
                f"{qual}.{name} is annotated but is neither an inner() nor a meta() field "
                f"(got {type(value).__name__ if value is not MISSING else 'no value'}). Declare it as {hint}."
            )
    for name in declared:
        if name not in annotations:
            raise FieldDeclarationError(
                f"{qual}.{name} is declared with {type(own[name]).__name__} but has no annotation; "
                f"write `{name}: torch.Tensor = inner()` (or `{name}: int = meta(...)`) so the "
                "declaration order is explicit."
            )
    for name in annotations:
        spec = own.get(name)
        if not isinstance(spec, (InnerField, MetaField)):
            continue
        if name in taken:
            raise FieldDeclarationError(
                f"{qual}.{name} redeclares a field inherited from a parent class; rename it."
            )
        if name.startswith("_"):
            raise FieldDeclarationError(
                f"{qual}.{name}: field names may not start with '_' (they are keyword "
                "arguments of the constructor); rename it."
            )
        if name in OUTER_KWARGS:
            raise FieldDeclarationError(
                f"{qual}.{name}: '{name}' is a constructor keyword for the outer tensor "
                f"({', '.join(OUTER_KWARGS)}); rename the field."
            )
        if hasattr(torch.Tensor, name):
            raise FieldDeclarationError(
                f"{qual}.{name}: the name shadows torch.Tensor.{name}, which torch itself "
                "relies on; rename the field."
            )
        if isinstance(spec, MetaField):
            if name in RESERVED:
                raise FieldDeclarationError(
                    f"{qual}.{name}: '{name}' is reserved on the ctx object "
                    f"({', '.join(sorted(RESERVED))}); rename the meta field."
                )
            if spec.default is not MISSING:
                if not isinstance(spec.default, torch.Tensor):
                    check_meta_type(qual, MetaField(name=name, annotation=annotations[name], home=cls.__module__),
                                    spec.default, error=FieldDeclarationError, where="its default")
                check_meta_value(qual, name, spec.default, where="its default")
                # deepcopy must give an equal value or dynamo's saved guard never matches.
                if copy.deepcopy(spec.default) != spec.default:
                    raise FieldDeclarationError(
                        f"{qual}.{name}: the default {spec.default!r} is not equal to its own "
                        "deepcopy; dynamo deep-copies the ctx for its guard. Give the type a "
                        "value-based __eq__."
                    )
            spec = MetaField(
                default=spec.default, doc=spec.doc, name=name, annotation=annotations[name],
                home=cls.__module__, check=spec.check,
            )
            if spec.default is not MISSING:
                check_meta_rule(qual, spec, spec.default, error=FieldDeclarationError, where="its default")
        else:
            spec = InnerField(optional=spec.optional, dtype=spec.dtype, doc=spec.doc, name=name)
        fields.append(spec)
        taken.add(name)

    inner = tuple(f for f in fields if isinstance(f, InnerField))
    meta = tuple(f for f in fields if isinstance(f, MetaField))
    if not inner and not abstract:
        raise FieldDeclarationError(
            f"{qual} declares no inner tensor. A wrapper subclass holds at least one tensor: "
            f"add e.g. `payload: torch.Tensor = inner()` (the first one is the primary), or "
            f"declare an intermediate base with `class {cls.__name__}(WrapperTensor, abstract=True)`."
        )
    if inner and inner[0].optional:
        raise FieldDeclarationError(
            f"{qual}.{inner[0].name}: the first inner field is the primary tensor (it gives the "
            "default outer size, device and dtype) and cannot be optional; reorder the fields."
        )
    return ClassSpec(
        qualname=qual,
        fields=tuple(fields),
        inner=inner,
        meta=meta,
        inner_names=tuple(f.name for f in inner),
        meta_names=tuple(f.name for f in meta),
        meta_defaults=tuple(f.default for f in meta),
        state=_build_state(qual, parent, own, annotations, taken),
    )


def _build_state(qual: str, parent: ClassSpec | None, own: dict, annotations: dict, taken: set) -> tuple:
    """The declared ``state()`` attributes of a class, its parents' first."""
    out = list(parent.state) if parent is not None else []
    names = {f.name for f in out}
    for name in annotations:
        spec = own.get(name)
        if not isinstance(spec, StateField):
            continue
        if name in names or name in taken:
            raise FieldDeclarationError(
                f"{qual}.{name} is declared with state() but the name is already a field or "
                "state of this class or a parent; rename it."
            )
        if hasattr(torch.Tensor, name):
            raise FieldDeclarationError(
                f"{qual}.{name}: the name shadows torch.Tensor.{name}, which torch itself "
                "relies on; rename the state."
            )
        out.append(StateField(default=spec.default, doc=spec.doc, name=name))
        names.add(name)
    return tuple(out)


# ---- meta values against their annotation ---------------------------------------------------
# The annotation only *checks* a value; it never decides a field's kind (the specifier does).
# What cannot be resolved or understood (a name imported under TYPE_CHECKING, a TypeVar, a
# Protocol) is not checked rather than guessed at.

# PEP 484's numeric tower, by ABC so numpy scalars pass too: an int is a fine float.
_NUMERIC = {int: numbers.Integral, float: numbers.Real, complex: numbers.Complex}


def _resolve(annotation: Any, home: str) -> Any:
    if not isinstance(annotation, str):
        return annotation
    module = sys.modules.get(home)
    try:
        return eval(annotation, dict(vars(module)) if module is not None else {}, {})  # noqa: S307
    except (NameError, AttributeError, SyntaxError, TypeError):
        return None


def meta_type_test(annotation: Any, home: str = "") -> tuple | None:
    """``(predicate, text)`` checking a value against a meta field's annotation, or None.

    Understood: classes (``int`` also takes any integral number, ``float`` any real),
    ``None``, ``Optional``/``Union``/``X | Y``, ``Literal[...]``, ``Annotated[T, ...]``,
    and generic aliases by their origin (``tuple[int, ...]`` checks ``tuple``). ``Any``,
    ``object`` and anything else are not checked (None).

    Example:
        >>> test, text = meta_type_test("int | None")
        >>> text, test(3), test("3"), test(None)
        ('int | None', True, False, True)
    """
    tp = _resolve(annotation, home)
    if tp is None and annotation is not None and annotation != "None":
        return None  # unresolvable
    if tp is typing.Any or tp is object:
        return None
    if tp is None or tp is type(None):
        return (lambda v: v is None), "None"
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        maybe = [meta_type_test(a) for a in typing.get_args(tp)]
        parts = [p for p in maybe if p is not None]
        if len(parts) < len(maybe):
            return None  # one unchecked member admits anything
        return (lambda v: any(p(v) for p, _ in parts)), " | ".join(t for _, t in parts)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        return (lambda v: any(type(v) is type(a) and v == a for a in allowed)), f"one of {allowed!r}"
    if origin is typing.Annotated:
        return meta_type_test(typing.get_args(tp)[0])
    if isinstance(origin, type):
        return (lambda v: isinstance(v, origin)), getattr(tp, "__name__", None) or repr(tp)
    if tp is int:
        # bool is an Integral, but True for a count or a block size is a mistake.
        return (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool)), "int"
    if isinstance(tp, type):
        want = _NUMERIC.get(tp, tp)
        return (lambda v: isinstance(v, want)), tp.__qualname__
    return None


def check_meta_type(owner: str, f: MetaField, value: Any, *, where: str, error: type = MetaTypeError) -> None:
    """Raise ``error`` if ``value`` contradicts the annotation of meta field ``f``."""
    test = meta_type_test(f.annotation, f.home)
    if test is None or test[0](value):
        return
    text = test[1]
    hint = f"Pass a value of type {text}"
    convert = {"int": int, "float": float}.get(text)
    if isinstance(value, str) and convert is not None:
        try:
            hint = f"Pass {f.name}={convert(value)!r}"
        except ValueError:
            pass
    raise error(
        f"{owner}.{f.name} is a meta field annotated {text} but {where} is {value!r} (a "
        f"{type(value).__name__}). {hint}, or change the annotation if the field is meant to "
        f"hold a {type(value).__name__}."
    )


def check_meta_rule(owner: str, f: MetaField, value: Any, *, where: str, error: type | None = None) -> None:
    """Raise ``MetaValueError`` (or ``error``) if ``value`` breaks the field's ``meta(check=...)`` rule.

    ``check(value)`` returns None for a valid value, else the rule in words ("a positive int").
    """
    if f.check is None:
        return
    rule = f.check(value)
    if rule is None:
        return
    tn = type(value).__name__
    shown = f"{value!r} ({'an' if tn[:1] in 'aeiou' else 'a'} {tn})"
    raise (error or MetaValueError)(
        f"{owner}.{f.name} must be {rule} but {where} is {shown}. Pass a valid {f.name}="
        + (f" (the default is {f.default!r})." if f.default is not MISSING else ".")
    )


# ---- meta values that vary like data ----------------------------------------------------------
# Dynamo guards a meta value by ==, so every new value is a new graph. A field that takes more
# distinct values than dynamo's recompile limit (offsets passed as a tuple, a per-batch
# max_len) recompiles every batch and then stops compiling, with no word from torch beyond
# its recompile log. Counted at validated construction (new values only: validated ones are
# remembered per class), warned once per field.
_DISTINCT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def note_meta_value(cls, qual: str, name: str, value: Any) -> None:
    """Count a new distinct value of meta field ``name``; warn once past the recompile limit."""
    from . import _compat
    from .errors import MetaRecompileWarning

    # Only a sequence of ints is data-shaped (offsets, lengths): a scalar meta field with many
    # values (a tag, a block size swept in a benchmark) is a legitimate per-graph constant.
    if not (isinstance(value, (tuple, list)) and value and all(isinstance(v, int) for v in value)):
        return
    seen = _DISTINCT.setdefault(cls, {})
    n = seen.get(name, 0) + 1
    seen[name] = n
    limit = _compat.recompile_limit()
    if n != limit + 1 or _compat.is_compiling():
        return
    kind = type(value).__name__
    fix = (
        f"declare {name} an inner() tensor instead (an int64 tensor of the {len(value)} values; "
        "a varying length then is a dynamic size, not a new graph)"
    )
    warnings.warn(
        f"{qual}.{name} is a meta field and has taken {n} different values ({kind}, e.g. "
        f"{value!r:.60}): dynamo guards meta values by ==, so torch.compile compiles a new graph "
        f"for each new value, and after its recompile limit ({limit}) stops compiling the "
        f"function. A value that varies per batch is data: {fix}.",
        MetaRecompileWarning,
        stacklevel=4,
    )
