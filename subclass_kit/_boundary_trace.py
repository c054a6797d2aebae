"""What the compile boundary (``boundary.py``) hands to dynamo and takes back.

A call's arguments are walked once: every kit wrapper contributes its class and ctx to the
call's *signature*, its outer tensor to the layout check, and its inner tensors (recursively,
for nested wrappers) to the flat list of plain tensors the compiled *body* takes. The body,
traced by dynamo, rebuilds the wrappers from those plain tensors with the class's
``graph_rebuild`` and ctx parts held as constants, so dynamo guards plain tensors only. It
returns the result's leaves with every wrapper taken apart again; while dynamo traces it, a
comptime hook records how to put the result back together (the pytree spec, and the class,
ctx, size and stride of each wrapper, from the fake values): that record is the *finish*
(``_boundary_record.py``). Nothing runs twice: the structure comes from the trace, never from an eager run.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from . import _compat
from ._boundary_dynamic import Carried
from .base import WrapperTensor
from .ctx import CTX_ATTR

__all__ = ["PLAIN", "Unservable", "collect", "identity_check", "walk", "make_body", "param_getters"]

_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter
PLAIN = _PLAIN = "plain"  # the signature element of a plain tensor
_pytree = _compat.python_pytree


class Unservable(Exception):
    """The boundary cannot serve this call; ``reason`` says why (it goes to torch.compile)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def walk(v: Any, sig: list, checked: list, flat: list, names: list | None, where: str,
         inner: bool = False) -> Any:
    """Add ``v`` to a call's signature, layout check and flat inputs; with ``names`` (a list),
    also name each signature element and checked tensor and return ``v``'s rebuild recipe.

    ``inner``: ``v`` is a wrapper's inner tensor (kept out of the signature: the wrapper's
    ctx already says which inner tensors are present)."""
    t = type(v)
    if t is _Tensor or t is _Parameter:
        if not inner:
            sig.append(_PLAIN)
        checked.append(v)
        flat.append(v)
        if names is not None:
            names.append(("inner" if inner else "tensor", where))
            return ("t", len(flat) - 1)
        return None
    if isinstance(v, _Tensor):
        kit = t.__dict__.get("__kit__")
        if kit is None:
            raise Unservable(
                f"{where} is a {t.__qualname__}, neither a plain tensor nor a kit wrapper "
                "(torch.compile takes it as it is)"
            )
        if kit.state_order:
            raise Unservable(f"{where} is a {t.__qualname__}, which declares state() the boundary does not carry")
        d = v.__dict__
        ctx = d[CTX_ATTR]
        sig.append(t)
        sig.append(ctx)
        checked.append(v)
        if names is not None:
            names.append(("class", where))
            names.append(("ctx", where))
            names.append(("wrapper", where))
        kids: list = []
        for n in kit.inner_names:
            x = d.get(n)
            if x is None:
                kids.append(None)
            else:
                kids.append(walk(x, sig, checked, flat, names, f"{where}.{n}", True))
        if names is None:
            return None
        return ("w", kit.graph_rebuild, tuple(kids), ctx.owner, ctx.fields, ctx.dtype, ctx.present,
                tuple(v.shape), tuple(v.stride()))
    if t is list or t is tuple:
        sig.append((t, len(v)))
        if names is not None:
            names.append(("value", where))
        kids = [walk(x, sig, checked, flat, names, f"{where}[{i}]") for i, x in enumerate(v)]
        return None if names is None else (t.__name__, tuple(kids))
    if t is dict:
        keys = tuple(v)
        sig.append((dict, keys))
        if names is not None:
            names.append(("value", where))
        kids = [walk(v[k], sig, checked, flat, names, f"{where}[{k!r}]") for k in keys]
        return None if names is None else ("dict", keys, tuple(kids))
    # Any other value is a constant of the trace, so part of the key (by type: 1 == True).
    sig.append((t, v))
    if names is not None:
        names.append(("value", where))
        return ("v", v)
    return None


class _Source:
    """Python source for the body: literal constants inline, anything else as a global of
    the body's own namespace (dynamo guards a literal in the code not at all, a global once)."""

    def __init__(self, record: bool = True) -> None:
        self.lines: list = []
        self.ns: dict = {}
        self.names: dict = {}  # id(value) -> its global (the values live in ns meanwhile)
        self.held_from = 1 << 62
        self.holder: Any = None
        self.n_wrappers = 0
        self.record = record  # rebuilt wrappers go to ``rebuilt`` (the body's inputs)

    def const(self, v: Any) -> str:
        if _is_literal(v):
            return repr(v)
        name = self.names.get(id(v))
        if name is None:
            name = self.names[id(v)] = f"_k{len(self.ns)}"
            self.ns[name] = v
        return name

    def expr(self, r: Any) -> str:
        """An expression for recipe ``r`` (see ``walk``); a wrapper becomes a local first."""
        kind = r[0]
        if kind == "t":
            if r[1] >= self.held_from:  # a parameter's inner tensor, held by the holder module
                return f"{self.const(self.holder)}.t{r[1] - self.held_from}"
            return f"flat[{r[1]}]"
        if kind == "w":
            _, rebuild, kids, owner, fields, dtype, present, size, stride = r
            inners = ", ".join("None" if k is None else self.expr(k) for k in kids)
            name = f"w{self.n_wrappers}"
            self.n_wrappers += 1
            args = ", ".join(self.const(c) for c in (owner, fields, dtype, present))
            if type(size) is Carried:  # read from a carrier input: dynamic sizes (_boundary_dynamic)
                args += f", tuple(flat[{size.i}].shape), flat[{size.i}].stride()"
            else:
                args += f", {self.const(size)}, {self.const(stride)}"
            self.lines.append(f"    {name} = {self.const(rebuild)}(({inners},), {args})")
            if self.record:
                self.lines.append(f"    rebuilt.append({name})")
            return name
        if kind == "list":
            return "[" + ", ".join(self.expr(k) for k in r[1]) + "]"
        if kind == "tuple":
            return "(" + "".join(self.expr(k) + ", " for k in r[1]) + ")"
        if kind == "dict":
            return "{" + ", ".join(f"{self.const(k)}: {self.expr(x)}" for k, x in zip(r[1], r[2])) + "}"
        return self.const(r[1])


def _is_literal(v: Any) -> bool:
    t = type(v)
    if t is float:
        return v == v and v not in (float("inf"), float("-inf"))
    if t in (int, str, bool, type(None)):
        return True
    return t is tuple and all(_is_literal(x) for x in v)


@_compat.allow_in_graph
def _inner_tensors(t):
    # One graph node taking a wrapper apart: dynamo cannot call __tensor_flatten__ itself.
    d = t.__dict__
    return tuple([d[n] for n in t._kit_ctx.present])


def _flatten_leaf(leaf: Any, out: list) -> None:
    """Traced by dynamo: a wrapper that does not require grad goes out as its inner tensors."""
    if isinstance(leaf, WrapperTensor) and not leaf.requires_grad:
        for x in _inner_tensors(leaf):
            _flatten_leaf(x, out)
    else:
        out.append(leaf)


def _sizes_of(leaves: list) -> tuple:
    """Traced by dynamo in a body with dynamic sizes: ``(size, stride)`` of every wrapper that
    ``_flatten_leaf`` takes apart, inner ones first (``record_from``'s order): symbolic sizes
    leave the graph as values, for ``finish`` to rebuild the outputs with."""
    out: list = []
    for leaf in leaves:
        _size_of(leaf, out)
    return tuple(out)


def _size_of(v: Any, out: list) -> None:
    if isinstance(v, WrapperTensor) and not v.requires_grad:
        for x in _inner_tensors(v):
            _size_of(x, out)
        out.append((tuple(v.shape), tuple(v.stride())))


def param_getters(recipes: list, holder: Any) -> list:
    """``get(self)`` per recipe: a wrapper parameter rebuilt (inside the trace) from
    ``holder``'s buffers ``t0, t1, ...`` by its ``walk`` recipe, ctx parts, size and stride as
    literals. They share one namespace: dynamo guards its globals once, not per parameter."""
    src = _Source(record=False)
    src.holder, src.held_from = holder, 0
    out = []
    for i, r in enumerate(recipes):
        src.lines = []
        ret = src.expr(r)
        name = f"param_{i}"
        text = "\n".join([f"def {name}(self):", *src.lines, f"    return {ret}"])
        exec(compile(text, f"<subclass_kit.compile {name}>", "exec"), src.ns)
        out.append(src.ns.pop(name))
    return out


def make_body(fn: Callable, arg_recipes: tuple, kw_recipes: tuple, on_record: Callable, name: str,
              sized: bool = False) -> Callable:
    """The function ``torch.compile`` sees for one signature: plain tensors in, plain tensors out.

    Generated as source with the ctx parts, sizes and strides as literals, so dynamo guards
    the plain tensors and little else; named ``name``, so dynamo keeps its cache, its
    automatic-dynamic state and its recompiles per signature, as the boundary does. ``fn``
    is the function, or a module's twin (``_boundary_twins``: its wrapper parameters are
    rebuilt from the boundary's holder of plain tensors by properties). ``sized``: the body
    has dynamic sizes and returns ``(flat outputs, _sizes_of(leaves))``.
    """
    src = _Source()
    args = "(" + "".join(src.expr(r) + ", " for r in arg_recipes) + ")"
    kwargs = "{" + ", ".join(f"{k!r}: {src.expr(r)}" for k, r in kw_recipes) + "}"
    call = f"{src.const(fn)}(*{args}, **{kwargs})"

    def hook(c):  # runs while dynamo traces the body; made here, outside it, as comptime needs
        on_record(_compat.comptime_items(c, "leaves"), _compat.comptime_constant(c, "spec"),
                  _compat.comptime_items(c, "rebuilt"))

    ns = src.ns
    ns.update(_Tensor=_Tensor, _tree_flatten=_pytree.tree_flatten, _flatten_leaf=_flatten_leaf, _comptime=_compat.comptime(),
              _hook=hook, _on_record=on_record, _is_compiling=torch.compiler.is_compiling, _sizes_of=_sizes_of)
    text = "\n".join([
        f"def {name}(*flat):",
        "    rebuilt = []",
        *src.lines,
        f"    out = {call}",
        "    if isinstance(out, _Tensor):  # the common result: no pytree traced (its guards cost per call)",
        "        leaves, spec = [out], None",
        "    else:",
        "        leaves, spec = _tree_flatten(out)",
        "    result = []",
        "    for leaf in leaves:",
        "        _flatten_leaf(leaf, result)",
        "    if _is_compiling():",
        "        _comptime(_hook)",
        "    else:  # dynamo ran this frame eagerly (a fallback of its own): record from the values",
        "        _on_record(list(leaves), spec, list(rebuilt))",
        "    return (tuple(result), _sizes_of(leaves))" if sized else "    return tuple(result)",
    ])
    exec(compile(text, f"<subclass_kit.compile {name}>", "exec"), ns)
    return ns[name]


def identity_check(plan: list, edges: list = ()) -> Callable[[], bool]:  # type: ignore[assignment]
    """``valid()``: every holder still holds its wrapper, with the same ctx and inner tensors
    (nested ones too), and every ``(modules dict, name, child)`` edge its child, checked by
    identity in one generated expression."""
    ns: dict = {}
    terms: list = []

    def name(v: Any) -> str:
        ns[f"v{len(ns)}"] = v
        return f"v{len(ns) - 1}"

    def visit(t: Any) -> None:
        d = name(t.__dict__)
        terms.append(f"{d}[{CTX_ATTR!r}] is {name(t.__dict__[CTX_ATTR])}")
        for n in t.__dict__[CTX_ATTR].present:
            x = t.__dict__[n]
            terms.append(f"{d}[{n!r}] is {name(x)}")
            if isinstance(x, WrapperTensor):
                visit(x)

    for holder, attr, t, *_ in plan:
        terms.append(f"{name(holder)}.get({attr!r}) is {name(t)}")
        visit(t)
    for modules, key, child in edges:
        terms.append(f"{name(modules)}.get({key!r}) is {name(child)}")
    text = "def valid():\n    try:\n        return " + " and ".join(terms or ["True"]) + \
        "\n    except KeyError:\n        return False\n"
    exec(compile(text, "<subclass_kit.compile parameters>", "exec"), ns)
    return ns["valid"]


def collect(v: Any, out: list) -> None:
    t = type(v)
    if t is _Tensor or t is _Parameter:
        return
    if isinstance(v, WrapperTensor):
        d = v.__dict__
        for n in type(v).__kit__.inner_names:
            if d.get(n) is not None:
                collect(d[n], out)
        out.append(v)
    elif t is list or t is tuple:
        for x in v:
            collect(x, out)
    elif t is dict:
        for x in v.values():
            collect(x, out)
