"""ctx checks: the second value of ``__tensor_flatten__`` must be a constant.

Dynamo guards a wrapped input by comparing its ctx with ``==`` on every call and keeps a
reference to the one it compiled for; AOTAutograd hashes and pickles it into cache keys
and rebuilds outputs from it. So the ctx must be hashable, immutable (a mutation after
compiling would silently change what the guard compares against), free of tensors (a
tensor there is compared elementwise and cannot be faked), picklable, and equal to itself
after a flatten/unflatten round trip and a pickle round trip.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import pickle

import torch

from .runner import Check, Fail
from .subject import describe, flatten

__all__ = ["plan", "walk"]

_ATOMS = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size)

_FIX_IMMUTABLE = (
    "return a tuple (or a frozen dataclass / NamedTuple) of Python constants, e.g. "
    "`return ['a', 'b'], (self.block, self.dtype)`; subclass_kit.WrapperTensor builds such a "
    "ctx from meta() fields"
)


def plan(run) -> list:
    req = ("protocol.flatten",)
    return [
        Check("ctx.hashable", _hashable, req),
        Check("ctx.immutable", _immutable, req),
        Check("ctx.tensor_free", _tensor_free, req),
        Check("ctx.picklable", _picklable, req),
        Check("ctx.round_trip_equal", _round_trip_equal, ("protocol.flatten", "protocol.round_trip_real")),
    ]


def walk(v, path: str = "ctx", depth: int = 0):
    """Yield ``(path, value)`` for ``v`` and everything inside it (containers, dataclass
    fields, instance attributes), paths rendered like ``ctx[1].scale``.

    Example:
        >>> [p for p, _ in walk((1, {"k": [2]}))]
        ['ctx', 'ctx[0]', 'ctx[1]', "ctx[1]['k']", "ctx[1]['k'][0]"]
    """
    yield path, v
    if depth > 8 or isinstance(v, _ATOMS) or isinstance(v, (torch.Tensor, type, enum.Enum)) or callable(v):
        return
    if isinstance(v, dict):
        for k, x in v.items():
            yield from walk(x, f"{path}[{k!r}]", depth + 1)
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            yield from walk(x, f"{path}[{i}]", depth + 1)
    elif isinstance(v, (set, frozenset)):
        for x in v:
            yield from walk(x, f"{path}{{...}}", depth + 1)
    elif dataclasses.is_dataclass(v):
        for f in dataclasses.fields(v):
            yield from walk(getattr(v, f.name, None), f"{path}.{f.name}", depth + 1)
    else:
        for k, x in getattr(v, "__dict__", {}).items():
            yield from walk(x, f"{path}.{k}", depth + 1)


def _ctxs(run):
    for i, x in enumerate(run.samples):
        yield i, x, flatten(x)[1]


def _hashable(run):
    for i, x, ctx in _ctxs(run):
        try:
            hash(ctx)
        except TypeError as e:
            where = ""
            for path, v in walk(ctx):
                try:
                    hash(v)
                except TypeError:
                    where = f" ({path} is a {type(v).__name__})"
            raise Fail(
                f"the ctx of sample {i} ({describe(x)}) is unhashable: {e}{where}. Dynamo "
                "guards on it and AOTAutograd keys its cache by it",
                _FIX_IMMUTABLE,
            ) from None
    return ""


def _mutable_reason(path: str, v) -> str | None:
    if isinstance(v, (list, dict, set, bytearray)):
        return f"{path} is a {type(v).__name__}"
    if isinstance(v, _ATOMS) or isinstance(v, (tuple, frozenset, torch.Tensor, type, enum.Enum)) or callable(v):
        return None
    if dataclasses.is_dataclass(v):
        if not v.__dataclass_params__.frozen:
            return f"{path} is a non-frozen dataclass {type(v).__qualname__}"
        return None
    attrs = getattr(v, "__dict__", None)
    if attrs:
        probe = copy.copy(v)
        name = next(iter(attrs))
        try:
            setattr(probe, name, attrs[name])
        except (AttributeError, TypeError, dataclasses.FrozenInstanceError):
            return None
        return f"{path} is a {type(v).__qualname__} whose attribute {name!r} can be reassigned"
    return None


def _immutable(run):
    for i, x, ctx in _ctxs(run):
        for path, v in walk(ctx):
            reason = _mutable_reason(path, v)
            if reason:
                raise Fail(
                    f"the ctx of sample {i} ({describe(x)}) is mutable: {reason}. Dynamo keeps "
                    "the ctx it compiled for and compares later inputs against it, so a "
                    "mutation silently changes what the guard checks (or makes it crash)",
                    _FIX_IMMUTABLE,
                )
    return ""


def _tensor_free(run):
    for i, x, ctx in _ctxs(run):
        for path, v in walk(ctx):
            if isinstance(v, torch.Tensor):
                raise Fail(
                    f"the ctx of sample {i} ({describe(x)}) holds a tensor at {path} "
                    f"({type(v).__name__} of shape {tuple(v.shape)}). The ctx is compared with == "
                    "by guards, baked into graphs as a constant and never faked, so the tensor "
                    "is specialized on (or breaks tracing)",
                    "make it an inner tensor: list its attribute name in __tensor_flatten__ "
                    "(with subclass_kit: declare it with inner())",
                )
    return ""


def _eq(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def _picklable(run):
    for i, x, ctx in _ctxs(run):
        try:
            back = pickle.loads(pickle.dumps(ctx))
        except Exception as e:
            raise Fail(
                f"the ctx of sample {i} ({describe(x)}) cannot be pickled ({type(e).__name__}: "
                f"{str(e).strip()[:120]}); AOTAutograd's and inductor's caches pickle it",
                "use values defined at module level (no lambdas, local classes or open handles)",
            ) from None
        if not _eq(back, ctx):
            raise Fail(
                f"the ctx of sample {i} ({describe(x)}) is not equal to itself after a pickle "
                f"round trip ({back!r:.80} != {ctx!r:.80}), so a cached graph would never match it",
                "give the ctx type value equality (__eq__ comparing fields, or use a tuple / "
                "frozen dataclass)",
            )
        try:
            if hash(back) != hash(ctx):
                raise Fail(
                    f"the ctx of sample {i} ({describe(x)}) equals its pickled copy but hashes "
                    "differently, so dict/set lookups keyed by it miss",
                    "define __hash__ from the same fields as __eq__ (a frozen dataclass does this)",
                )
        except TypeError:
            pass  # reported by ctx.hashable
        dup = copy.deepcopy(ctx)
        if not _eq(dup, ctx):
            raise Fail(
                f"the ctx of sample {i} ({describe(x)}) is not equal to its deepcopy",
                "give the ctx type value equality (a tuple or frozen dataclass)",
            )
    return ""


def _round_trip_equal(run):
    for i, x, ctx in _ctxs(run):
        names = flatten(x)[0]
        u = run.cls.__tensor_unflatten__({n: getattr(x, n) for n in names}, ctx, x.shape, x.stride())
        names2, ctx2 = flatten(u)
        if list(names2) != list(names):
            raise Fail(
                f"sample {i} ({describe(x)}) flattens to {names} but its round-trip copy to {names2}",
                "derive the names from the ctx so that unflatten restores the same set",
            )
        if not _eq(ctx2, ctx):
            raise Fail(
                f"the ctx of sample {i} ({describe(x)}) changes in a flatten/unflatten round "
                f"trip: {ctx!r:.80} became {ctx2!r:.80}; dynamo would recompile on every call",
                "store every ctx value on the instance in __tensor_unflatten__ and return the "
                "same values from __tensor_flatten__",
            )
    return ""
