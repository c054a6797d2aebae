"""ctx checks: what torch requires of the second value of ``__tensor_flatten__``.

Dynamo guards a wrapped input with TENSOR_SUBCLASS_METADATA_MATCH: it deep-copies the ctx
at compile time and compares later ctxs with ``==`` (or the class's ``__metadata_guard__``);
it never hashes it, and the deepcopy makes later mutation of the original harmless.
AOTAutograd's and inductor's caches pickle it. So torch requires: no tensors (compared
elementwise, never faked), picklable, equal to its deepcopy and to its pickled copy, and
equal to itself after a flatten/unflatten round trip. Hashable and immutable are good
style (``guards`` and the kit's meta() fields do not need them either): those rows pass
and say so in their note rather than fail a class torch accepts (torchao uses dicts).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import pickle

import torch

from ._check import Check, Fail
from ._subject import describe, flatten

__all__ = ["plan", "walk"]

_ATOMS = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format, torch.Size)

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
    notes = []
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
            notes.append(
                f"sample {i}: unhashable ({e}{where}); fine for torch, which compares a ctx with "
                "== and never hashes it"
            )
    return notes[0] if notes else ""


def _mutable_reason(path: str, v) -> str | None:
    if isinstance(v, (list, dict, set, bytearray)):
        return f"{path} is a {type(v).__name__}"
    if isinstance(v, _ATOMS) or isinstance(v, (tuple, frozenset, torch.Tensor, type, enum.Enum)) or callable(v):
        return None
    if dataclasses.is_dataclass(v):
        if not v.__dataclass_params__.frozen:  # type: ignore[union-attr]  # an instance (classes returned above)
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
                return (
                    f"sample {i}: mutable ({reason}); fine for torch, which guards on a deepcopy "
                    "of the ctx taken at compile time"
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
            same_hash = hash(back) == hash(ctx)
        except TypeError:
            same_hash = True  # unhashable: torch never hashes it (see ctx.hashable)
        if not same_hash:
            raise Fail(
                f"the ctx of sample {i} ({describe(x)}) equals its pickled copy but hashes "
                "differently, so dict/set lookups keyed by it miss",
                "define __hash__ from the same fields as __eq__ (a frozen dataclass does this)",
            )
        try:
            dup = copy.deepcopy(ctx)
        except Exception as e:
            raise Fail(
                f"the ctx of sample {i} ({describe(x)}) cannot be deep-copied ({type(e).__name__}: "
                f"{str(e).strip()[:120]}); dynamo deep-copies it to guard on it",
                "use plain values (tuples, dicts, dataclasses of constants)",
            ) from None
        if not _eq(dup, ctx):
            raise Fail(
                f"the ctx of sample {i} ({describe(x)}) is not equal to its deepcopy; dynamo "
                "compares later inputs against a deepcopy, so it would recompile on every call",
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
