"""``mark_dynamic``, ``apply`` and ``marks``: policies in and out of torch's own marks.

Everything is done with torch's marking functions (``mark_dynamic``, ``mark_static``,
``maybe_mark_dynamic``), so dynamo allocates the symbols itself and guards on the marks as
it always does. Marks are additive, as torch's are.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any

import torch

from . import _compat
from .dims import Dim, DimKind
from .errors import CtxPinsShapeWarning, PolicyError, PolicyTypeError, SymbolicError
from .description import ShapeDescription, describe
from .planning import _outer_dims, divisors, plan, plan_described
from .policy import SubclassPolicy, resolve_dims
from .protocol import Node, inner_items, is_wrapper, tree, where
from .shape_relations import size_symbol
from .source_types import ROOT, InnerSource

_log = logging.getLogger(__name__)

__all__ = ["mark_dynamic", "apply", "marks"]


# Marks are read when dynamo fakeifies an input; inside a compiled region they are too late,
# so tracing through these is an error, as it is for torch's own mark_dynamic.
@_compat.forbid_in_graph
def mark_dynamic(t: torch.Tensor, dims: Any, *, min: int | None = None, max: int | None = None,
                 inner: Any = "derived") -> SubclassPolicy:
    """Mark outer dims of ``t`` dynamic and decide, per inner tensor, what that implies.

    ``inner="derived"`` (default) makes an inner dim dynamic exactly when ``__inner_shapes__``
    (or, without it, equal sizes at the same index) ties it to a dynamic outer dim, carrying
    ``min``/``max`` through the relation; other inner dims stay static. ``"same_dim"`` is
    torch's ``torch._dynamo.mark_dynamic`` (same marks on every inner of the same rank),
    ``"none"`` marks the outer tensor only, and ``{name: dims | SubclassPolicy}`` overrides
    named inners (the rest derived).

    Args:
        t: a plain or wrapped tensor.
        dims: an int, a sequence of ints (negative allowed), or ``{dim: Dim}``.
        min, max: the range of bare dims, as in torch.
        inner: see above.

    Returns:
        The ``SubclassPolicy`` applied (see ``plan``).

    Raises:
        PolicyError: a dim out of range, an unknown or None inner, ``min > max``.
        PolicyTypeError: a malformed argument, a ``SubclassPolicy`` for a plain inner.
        RelationError: ``__inner_shapes__`` is not plain arithmetic, or contradicts ``t``.

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> x = TwoTensor(torch.ones(4, 2), torch.ones(4, 2))
        >>> dict(mark_dynamic(x, 0, max=64).inner["a"])
        {0: Dim.dynamic(max=64)}
        >>> x.a._dynamo_dynamic_indices
        {0}
    """
    if inner == "same_dim" and isinstance(t, torch.Tensor):
        # Literally torch's function and torch's mirroring rule, so that "same_dim" stays
        # whatever torch does (torch's function alone now derives, see _mirror below).
        outer = _outer_dims(t, dims, min, max, ROOT)
        with _compat.torch_rule():
            for d, dim in outer.items():
                _compat.torch_mark(t, dim.kind, d, min=dim.min, max=dim.max)
        return plan(t, outer, inner="same_dim")
    if not isinstance(t, torch.Tensor):
        raise PolicyTypeError(f"mark_dynamic/plan expect a tensor, got {type(t).__name__}.")
    # One read of t: planning, the ctx check and the marks all work from this description.
    desc = describe(t)
    policy = plan_described(desc, dims, min=min, max=max, inner=inner)
    _log.debug("mark_dynamic(%s, %r, inner=%r): applying %r", type(t).__name__, dims, inner, policy)
    _warn_ctx_pins(desc, policy.outer)
    _apply(desc.node(), policy)
    return policy


def _shapes_in(v, path: str, out: list, depth: int = 0) -> None:
    """``(path, value)`` of every torch.Size (or ``*shape*``-named int tuple) inside a ctx."""
    if depth > 6:
        return
    if isinstance(v, torch.Size):
        out.append((path, tuple(v)))
        return
    if isinstance(v, dict):
        items = [(f"{path}[{k!r}]", k, x) for k, x in v.items()]
    elif isinstance(v, tuple) and hasattr(v, "_fields"):
        items = [(f"{path}.{f}", f, x) for f, x in zip(v._fields, v)]
    elif dataclasses.is_dataclass(v) and not isinstance(v, type):
        items = [(f"{path}.{f.name}", f.name, getattr(v, f.name)) for f in dataclasses.fields(v)]
    elif isinstance(v, (tuple, list)):
        items = [(f"{path}[{i}]", i, x) for i, x in enumerate(v)]
    else:
        return
    for p, k, x in items:
        if (isinstance(k, str) and "shape" in k.lower() and isinstance(x, (tuple, list))
                and x and all(type(e) is int for e in x)):
            out.append((p, tuple(x)))
        else:
            _shapes_in(x, p, out, depth + 1)


def _warn_ctx_pins(desc: ShapeDescription, outer, stacklevel: int = 3) -> None:
    node = desc.node()
    t = node.tensor
    # A class with __metadata_guard__ (or DTensor, whose spec is compared with shapes
    # skipped) decides itself what in its ctx must match: nothing to judge here.
    if not node.wrapper or hasattr(type(t), "__metadata_guard__") or _compat.is_dtensor(t):
        return
    asked = sorted(d for d, dim in outer.items() if dim.kind in (DimKind.DYNAMIC, DimKind.AUTO))
    if not asked:
        return
    ctx = node.ctx
    strict = any(outer[d].kind is DimKind.DYNAMIC for d in asked)
    fix = ("mark it Dim.auto() (maybe_mark_dynamic) to get one graph per size without an error, "
           if strict else "expect one graph per size; ")
    found: list = []
    _shapes_in(ctx, "ctx", found)
    shape = tuple(t.shape)
    pins = [(p, v) for p, v in found if v == shape]
    if pins:
        path, v = pins[0]
        what = f"stores its shape in its flatten ctx ({path} = {v})"
        keep = ("keep sizes out of the ctx (read them from the inner tensors or the outer_size "
                "that __tensor_unflatten__ receives)")
    else:
        pinned = _meta_pins(desc, ctx, asked)
        if pinned is None:
            return
        what = (f"takes every inner size from its meta ({pinned}), not from the outer size: "
                f"{type(t).__name__}.__inner_shapes__ ties no inner dim to dim(s) {asked}")
        keep = ("compute the inner shapes from outer_size in __inner_shapes__ and drop the size "
                "from the meta (symbolic.floor_div / ceil_div on outer_size)")
    warnings.warn(
        f"{type(t).__name__} {what}, so dim(s) {asked} cannot be dynamic: dynamo compares the "
        f"ctx with == on every call and recompiles for each new size"
        f"{' (and when the code ties the outer size to the inner sizes, the strict mark raises ConstraintViolationError)' if strict else ''}. "
        f"Fix: {fix}or {keep}.",
        CtxPinsShapeWarning,
        stacklevel=stacklevel,
    )


def _meta_pins(desc: ShapeDescription, ctx: Any, asked: list) -> str | None:
    """``"ctx.n_blocks = 512"`` when a class's ``__inner_shapes__`` makes every inner size a
    constant of the ctx (none follows the marked outer dims), naming the meta fields it
    reads; None when some inner size follows the outer size, or is free.

    A field is named when changing it changes the inner shapes; that needs a ctx that can
    be copied with one value replaced (``ctx.replace(**{name: value})`` over
    ``ctx.fields``, as the kit's ctx offers). Other ctxs get the warning without a name.
    """
    t = desc.node().tensor
    if not callable(getattr(type(t), "__inner_shapes__", None)):
        return None
    try:
        infos = desc.shapes
    except SymbolicError:
        return None
    roots = {size_symbol("", d) for d in asked}
    children = [i for i in infos[1:]
                if isinstance(i.source, InnerSource) and i.source.base == ROOT and not desc[i.source].wrapper]
    if not children:
        return None
    for info in children:
        for j in range(info.tensor.dim()):
            if not info.related(j) or info.exprs[j].free_symbols & roots:
                return None
    names = []
    fields = getattr(ctx, "fields", None)
    replace = getattr(ctx, "replace", None)
    if isinstance(fields, tuple) and callable(replace):
        cls: Any = type(t)
        size = tuple(t.shape)
        try:
            base = dict(cls.__inner_shapes__(size, ctx))
        except Exception:
            base = None
        for name, value in fields:
            if base is None or isinstance(value, bool) or not isinstance(value, int):
                continue
            try:
                moved = dict(cls.__inner_shapes__(size, replace(**{name: value * 2 + 1})))
            except Exception:
                continue
            if moved != base:
                names.append(f"ctx.{name} = {value}")
    return ", ".join(names) if names else "a value in the ctx"


@_compat.forbid_in_graph
def apply(t: torch.Tensor, policy: SubclassPolicy) -> None:
    """Apply a ``SubclassPolicy`` to ``t`` and the tensors inside it, through torch's marks.

    Applied literally: dims the policy does not mention are not touched, and nothing is
    derived (``mark_dynamic`` derives, then calls this). The whole policy is checked before
    any mark is set. A nested wrapper's own dims given ``Dim.dynamic`` are marked
    ``maybe_mark_dynamic``: torch fakeifies a nested wrapper from its concrete outer size, so
    a strict mark there always fails; the inner tensors below it carry the strict marks.

    Raises:
        PolicyError / PolicyTypeError: as ``mark_dynamic``, naming the tensor path.

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> x = TwoTensor(torch.ones(4, 2), torch.ones(4, 2))
        >>> apply(x, SubclassPolicy(outer={0: Dim.dynamic()}, inner={"a": {0: Dim.dynamic()}}))
        >>> marks(x)
        SubclassPolicy(outer={0: Dim.dynamic()}, inner={'a': {0: Dim.dynamic()}})
    """
    if not isinstance(t, torch.Tensor):
        raise PolicyTypeError(f"apply() expects a tensor, got {type(t).__name__}.")
    if not isinstance(policy, SubclassPolicy):
        raise PolicyTypeError(
            f"apply() expects a SubclassPolicy, got {type(policy).__name__}; for bare dims use "
            "symbolic.mark_dynamic."
        )
    _apply(tree(t), policy)


def _apply(node: Node, policy: SubclassPolicy) -> None:
    steps: list[tuple[torch.Tensor, dict[int, Dim], bool]] = []
    _collect(node, policy, steps)
    for tensor, dims, nested in steps:
        for d, dim in dims.items():
            kind = dim.kind
            if nested and kind is DimKind.DYNAMIC:
                kind = DimKind.AUTO
            _compat.mark_self(tensor, kind, d, min=dim.min, max=dim.max)


def _collect(node: Node, policy, steps) -> None:
    if isinstance(policy, SubclassPolicy):
        outer, inner = policy.outer, policy.inner
    else:
        outer, inner = policy, {}
    steps.append((node.tensor, resolve_dims(node.tensor, outer, node.source),
                  node.wrapper and node.source != ROOT))
    for name, spec in inner.items():
        child = node.child(name)
        if isinstance(spec, SubclassPolicy) and not child.wrapper:
            raise PolicyTypeError(
                f"{where(child.source)} is a plain {type(child.tensor).__name__}; a SubclassPolicy "
                "only fits a wrapped tensor. Give its dims instead: {0: Dim.dynamic()}."
            )
        _collect(child, spec, steps)


def marks(t: torch.Tensor) -> SubclassPolicy:
    """The marks ``t`` and the tensors inside it carry, read back as a ``SubclassPolicy``.

    Reads torch's own mark attributes, whether ``symbolic`` or ``torch._dynamo`` set them;
    dynamo's precedence applies (dynamic over auto over static). Tensors without marks
    are omitted.

    Example:
        >>> import torch
        >>> x = torch.ones(3, 4)
        >>> torch._dynamo.mark_dynamic(x, 0, min=2)
        >>> marks(x)
        SubclassPolicy(outer={0: Dim.dynamic(min=2)}, inner={})
    """
    if not isinstance(t, torch.Tensor):
        raise PolicyTypeError(f"marks() expects a tensor, got {type(t).__name__}.")
    # Unbacked marks have no Dim (no public policy asks for them); describe() reports them.
    own = {
        d: Dim(kind, lo, hi)
        for d, (kind, lo, hi) in sorted(_compat.read_marks(t, propagated=False).items())
        if kind is not DimKind.UNBACKED
    }
    inner: dict[str, Any] = {}
    for name, v in inner_items(t):
        if is_wrapper(v):
            p = marks(v)
            if p.outer or p.inner:
                inner[name] = p
        else:
            m = marks(v).outer
            if m:
                inner[name] = dict(m)
    return SubclassPolicy(own, inner)


def _mirror(kind: DimKind, t: torch.Tensor, index: Any, min: int | None, max: int | None) -> bool:
    """What ``torch._dynamo.mark_dynamic(t, index)`` (or ``maybe_mark_dynamic``,
    ``mark_static``) does to the inner tensors of a class with ``__inner_shapes__``: the
    derived policy, as ``symbolic.mark_dynamic`` applies it. torch sets the outer marks
    itself right after. A policy that cannot compile raises ``PolicyError`` here, before
    anything is marked."""
    if not is_wrapper(t) or not callable(getattr(type(t), "__inner_shapes__", None)):
        return False
    kind = DimKind(kind)
    dims = list(index) if isinstance(index, (list, tuple)) else [index]
    if not dims:
        return True
    try:
        default = Dim(kind, min, max) if kind is DimKind.DYNAMIC else Dim(kind)
    except (PolicyError, PolicyTypeError) as e:
        raise type(e)(f"x: {e}") from None
    desc = describe(t)
    policy = plan_described(desc, {d: default for d in dims})
    asked = resolve_dims(t, {d: default for d in dims}, ROOT)
    moved = {d: m for d, m in divisors(desc.shapes, asked).items() if policy.outer.get(d) != asked[d]}
    if moved:
        # torch sets the outer range itself after this hook, and dynamo then reports its own
        # divisibility guard as a violation of that range; only the kit can carry the range
        # on the inner sizes instead.
        d, m = next(iter(moved.items()))
        raise PolicyError(
            f"torch._dynamo.mark_dynamic(x, {d}, min={min}, max={max}) on {type(t).__name__}: its "
            f"inner sizes hold whole blocks, so every size of dim {d} is a multiple of {m} and "
            f"dynamo adds the guard size % {m} == 0, which it reports as a violation of the range "
            f"(ConstraintViolationError). Use symbolic.mark_dynamic(x, {d}, min={min}, max={max}), "
            f"which carries the range on the inner sizes (one graph for the multiples of {m} in "
            f"range), or torch._dynamo.mark_dynamic(x, {d}) without a range."
        )
    _log.debug("torch.%s on %s: inner marks derived: %r", kind, type(t).__name__, policy)
    _warn_ctx_pins(desc, policy.outer, stacklevel=5)
    _apply(desc.node(), SubclassPolicy({}, policy.inner))
    return True


_compat.install_mirror_hook(_mirror)
