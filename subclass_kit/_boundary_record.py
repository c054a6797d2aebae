"""How the compile boundary puts a compiled body's flat outputs back together: the *record*.

While dynamo traces a body (``_boundary_trace.make_body``), a comptime hook hands the fake
result leaves, the pytree spec and the wrappers the body rebuilt from its inputs to
``record_from``: per output wrapper its class, ctx, size and stride (or, in a body with dynamic
sizes, its number among the sizes the body returns), and whether it is an input returned or a
view of one. ``finish_for`` turns a record into the ``finish(flat, inputs)`` that every call
of that body runs (``boundary.py``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from . import _compat
from .base import WrapperTensor
from .ctx import CTX_ATTR

__all__ = ["Record", "record_from", "finish_for"]

_Tensor = torch.Tensor
_pytree = _compat.python_pytree


class Record:
    """How one traced body's flat outputs become the result (see ``record_from``)."""

    __slots__ = ("spec", "descs", "slots", "unsafe", "needs_inputs", "sized", "finish")

    def __init__(self, spec, descs, slots, unsafe, needs_inputs, sized=False) -> None:
        self.spec = spec
        self.descs = descs
        self.slots = slots
        self.unsafe = unsafe
        self.needs_inputs = needs_inputs
        self.sized = sized  # the body returns (flat, sizes): see make_body
        self.finish = finish_for(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and (self.spec, self.descs) == (other.spec, other.descs)

    __hash__ = None  # type: ignore[assignment]


def _plain_storages(v, out: set) -> set:
    if isinstance(v, WrapperTensor):
        for n in v.__dict__[CTX_ATTR].present:
            _plain_storages(v.__dict__[n], out)
    else:
        out.add(_compat.storage_ref(v))
    return out


def record_from(leaves: list, spec: Any, rebuilt: list, sized: bool = False) -> Record:
    """The record of one trace: from the fake (or, untraced, real) leaves, the pytree spec
    (None: the result is one tensor) and the wrappers the body rebuilt from its inputs (in
    ``walk``'s order). ``sized``: the body returns its wrappers' sizes (``_sizes_of``), so a
    symbolic size is read from there (its number in the record) instead of recorded."""
    if spec is None:
        spec = _pytree.tree_structure(0)
    unsafe: list = []
    inputs = [_plain_storages(w, set()) for w in rebuilt]
    needs = [False]
    n_sized = [0]  # wrappers seen, in _sizes_of's order

    def desc(v, where):
        if v is NotImplemented or not isinstance(v, _Tensor):
            return ("c",)
        if not isinstance(v, WrapperTensor) or v.requires_grad:
            return ("t",)
        kit = type(v).__kit__
        d = v.__dict__
        kids = tuple(None if d.get(n) is None else desc(d[n], f"{where}.{n}") for n in kit.inner_names)
        j = n_sized[0]
        n_sized[0] += 1
        for k, w in enumerate(rebuilt):
            if v is w:  # the input itself, returned
                needs[0] = True
                return ("in", k, kids)
        size, stride = tuple(v.shape), tuple(v.stride())
        offset = v.storage_offset()
        if any(type(s) is not int for s in (*size, *stride, offset)):
            if sized:  # the body's j-th (size, stride); the offset by the class's unflatten rule
                size, stride, offset = j, j, None
            else:
                unsafe.append(f"{where} has a symbolic size {size}")
        mine = _plain_storages(v, set())
        alias = [k for k, s in enumerate(inputs) if mine & s]
        first = d[d[CTX_ATTR].present[0]] if d[CTX_ATTR].present else None
        if alias and isinstance(first, _Tensor) and not isinstance(first, WrapperTensor) \
                and not any(_compat.storage_ref(first) in s for s in inputs):
            # New rows that share other inner tensors with an input (a jagged result keeps
            # its input's offsets): a new wrapper, as the eager handler builds it, not a view.
            alias = []
        if alias:
            needs[0] = True
            if len(alias) > 1 or not mine <= inputs[alias[0]]:
                unsafe.append(f"{where} views the inner tensors of more than one input")
        return ("w", kit.cls, d[CTX_ATTR], size, stride, offset, kids, alias[0] if alias else None)

    descs = tuple(desc(v, f"output leaf {i}") for i, v in enumerate(leaves))
    slots = sum(_count(dd) for dd in descs)
    return Record(spec, descs, slots, "; ".join(unsafe) or None, needs[0], sized)


def _count(dd) -> int:
    if dd[0] == "w":
        return sum(_count(k) for k in dd[6] if k is not None)
    if dd[0] == "in":
        return sum(_count(k) for k in dd[2] if k is not None)
    return 1


def _rebuild(dd, flat: tuple, i: int, inputs: list, sizes: tuple = ()) -> tuple[Any, int]:
    kind = dd[0]
    if kind == "t" or kind == "c":
        return flat[i], i + 1
    if kind == "in":
        return inputs[dd[1]], i + _count(dd)
    _, cls, ctx, size, stride, offset, kids, alias = dd
    inners: list = []
    for k in kids:
        if k is None:
            inners.append(None)
        else:
            x, i = _rebuild(k, flat, i, inputs, sizes)
            inners.append(x)
    if type(size) is int:  # read from the body's sizes (a sized record), as AOTAutograd rebuilds
        size, stride = sizes[size]
        out = cls.__tensor_unflatten__(dict(zip(cls.__kit__.inner_names, inners)), ctx, size, stride)
    elif type(size[0] if size else 0) is not int:  # symbolic (recorded as unsafe): torch's own rule
        out = cls.__tensor_unflatten__(dict(zip(cls.__kit__.inner_names, inners)), ctx, None, None)
    else:
        out = cls.__kit__.make(tuple(inners), ctx, size, stride, offset)
    if alias is not None:
        # The input's inner tensors are what this result views: share its wrapper-level
        # storage too, as the kit's view handlers do in eager.
        _compat.functionalize_unsafe_set(out, inputs[alias])
    return out, i


def finish_for(rec: Record) -> Callable[[tuple, list | None], Any]:
    """``finish(flat, inputs)``: the result from the body's flat outputs. The common case (one
    wrapper of plain inner tensors, nothing aliased) is the class's ``parts_builder``."""
    descs, spec = rec.descs, rec.spec
    if rec.sized:
        if spec.is_leaf() and len(descs) == 1 and descs[0][0] in ("t", "c"):
            return lambda out, inputs: out[0][0]

        def finish_sized(out, inputs):
            flat, sizes = out
            res, i = [], 0
            for dd in descs:
                v, i = _rebuild(dd, flat, i, inputs or [], sizes)
                res.append(v)
            return _pytree.tree_unflatten(res, spec)

        return finish_sized
    if spec.is_leaf() and len(descs) == 1:
        dd = descs[0]
        if dd[0] == "w" and dd[7] is None and all(k is not None and k[0] == "t" for k in dd[6]) \
                and all(type(s) is int for s in dd[3]):
            make, ctx, size, stride, offset = dd[1].__kit__.make, dd[2], dd[3], dd[4], dd[5]
            if len(dd[6]) == len(dd[1].__kit__.inner_names):  # no optional inner left out
                return lambda flat, inputs: make(flat, ctx, size, stride, offset)
            build = dd[1].parts_builder(ctx, size=size, stride=stride, offset=offset)
            return lambda flat, inputs: build(*flat)
        if dd[0] in ("t", "c"):
            return lambda flat, inputs: flat[0]

    def finish(flat, inputs):
        out, i = [], 0
        for dd in descs:
            v, i = _rebuild(dd, flat, i, inputs or [])
            out.append(v)
        return _pytree.tree_unflatten(out, spec)

    return finish
