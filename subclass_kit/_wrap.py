"""Differentiable wrapping: ``Cls.wrap(*fields, **kw)`` and its inverse ``t.unwrap()``.

The constructor builds a *leaf*: a wrapper made from inner tensors that carry a graph
(``J(F.linear(x.packed, w, b), x.offsets)`` in a torch-function handler) drops that graph,
and ``w.grad`` stays None. ``wrap`` builds the same wrapper through an
``autograd.Function``, so the result is a non-leaf whose gradient flows into the inner
tensors; ``unwrap`` hands out the inner tensors with their gradients flowing back into the
wrapper. ``ShardedTensor.from_local`` / ``to_local`` are the same pattern for one class.

Under torch.compile both are one graph node each (a per-class function registered with
dynamo's ``allow_in_graph``, as ``from_local`` is): AOTAutograd then traces the function's
forward and backward into the joint graph. All argument checking runs inside (the
constructor's own checks), so eager and compiled calls raise the same errors.

The backward of ``wrap``, for a gradient that is
- a wrapper of the class: its inner tensors, field by field;
- a plain tensor (a loss computed on ``to_plain()``, or an op through
  ``fallbacks.to_plain``): the vector-Jacobian product of the class's own ``to_plain()``
  with respect to the inner tensors (exact: ``to_plain`` *is* the map from inner tensors to
  the value), or ``WrapGradientError`` when the class has no ``to_plain``.
Inner tensors that are not floating (offsets, quantized data) get no gradient.
"""

from __future__ import annotations

from typing import Any

import torch

from .errors import ConstructionError, GradientDroppedError, WrapGradientError

__all__ = ["wrap", "unwrap", "graph_functions", "keeps_graph"]

_OUTER = ("size", "stride", "dtype", "device")


def _below_autograd() -> bool:
    # Inside an aten handler autograd has already run: wrap is the constructor there.
    from . import _compat

    return not torch.compiler.is_compiling() and _compat.below_autograd()


def _differentiable(t) -> bool:
    return t.is_floating_point() or t.is_complex()


def _fmt(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def wrap(cls, args: tuple, kwargs: dict) -> Any:
    """``Cls.wrap(*fields, **kw)``; see ``WrapperTensor.wrap``."""
    from ._construct import construct

    spec = cls.__kit_spec__
    if len(args) > len(spec.fields) or any(f.name in kwargs for f in spec.fields[: len(args)]):
        return construct(cls, args, kwargs)  # raises the constructor's message
    bound = dict(zip([f.name for f in spec.fields], args))
    bound.update(kwargs)
    requires_grad = bound.pop("requires_grad", None)
    names = []
    tensors = []
    for n in spec.inner_names:
        v = bound.get(n)
        if isinstance(v, torch.Tensor):
            names.append(n)
            tensors.append(bound.pop(n))
    if (requires_grad is False or not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors)
            or _below_autograd()):
        # Nothing to differentiate: the constructor's leaf (requires_grad= as it takes it).
        bound.update(zip(names, tensors))
        if requires_grad is not None:
            bound["requires_grad"] = requires_grad
        return construct(cls, (), bound)
    rest = tuple(bound.items())
    return cls.__kit__.graph_wrap(tuple(tensors), tuple(names), rest)


def unwrap(x) -> tuple:
    """``x.unwrap()``; see ``WrapperTensor.unwrap``."""
    cls = type(x)
    kit = getattr(cls, "__kit__", None)
    if kit is None or kit.graph_unwrap is None:
        raise ConstructionError(f"unwrap() needs a WrapperTensor instance, got {type(x).__name__}.")
    if not (x.requires_grad and torch.is_grad_enabled()) or _below_autograd():
        # No gradient to carry: the inner tensors themselves, with no autograd node (the
        # inference path of a handler pays an attribute read).
        d = x.__dict__
        return tuple([d.get(n) for n in kit.inner_names])
    present = x._kit_ctx.present
    got = iter(kit.graph_unwrap(x))
    return tuple([next(got) if n in present else None for n in kit.inner_names])


class _Wrap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, cls, names, rest, *tensors):
        from ._construct import construct

        kw = dict(rest)
        # Detached: the wrapper's inner tensors carry no graph of their own (the wrapper does),
        # and they still share the caller's storage, as from_local's local does.
        kw.update(zip(names, [t.detach() for t in tensors]))
        kw["requires_grad"] = False
        out = construct(cls, (), kw)
        ctx.cls = cls
        ctx.names = names
        ctx.parts = (out._kit_ctx, tuple(out.shape), tuple(out.stride()), out.storage_offset())
        ctx.shapes = tuple(tuple(t.shape) for t in tensors)
        if hasattr(cls, "to_plain"):
            ctx.save_for_backward(*tensors)
        return out

    @staticmethod
    def backward(ctx, grad):
        needs = ctx.needs_input_grad[3:]
        head = (None, None, None)
        if grad is None or not any(needs):
            return head + (None,) * len(needs)
        cls = ctx.cls
        if isinstance(grad, cls):
            grads = []
            for n, need, shape in zip(ctx.names, needs, ctx.shapes):
                g = grad.__dict__.get(n) if need else None
                if g is not None and _static(g.shape) and _static(shape) and tuple(g.shape) != shape:
                    raise WrapGradientError(
                        f"{cls.__qualname__}.wrap: the gradient arrived as a {cls.__qualname__} whose "
                        f"{n} has shape {_fmt(g.shape)}, but the {n} given to wrap() has shape "
                        f"{_fmt(shape)}. A handler built the gradient with another layout: return a "
                        f"{cls.__qualname__} laid out as its input (same inner shapes)."
                    )
                grads.append(g)
            return head + tuple(grads)
        if hasattr(type(grad), "__kit__"):
            if not hasattr(type(grad), "to_plain"):
                raise WrapGradientError(
                    f"{cls.__qualname__}.wrap: the gradient arrived as a {type(grad).__qualname__}, "
                    f"which is neither a {cls.__qualname__} nor has to_plain(). Return gradients "
                    f"as {cls.__qualname__} instances."
                )
            grad = grad.to_plain()
        return head + _plain_vjp(ctx, cls, needs, grad)


def _static(shape) -> bool:
    return all(type(s) is int for s in shape)


def _plain_vjp(ctx, cls, needs, grad) -> tuple:
    """The inner gradients of a dense gradient: the VJP of ``cls.to_plain`` at the forward's inner tensors."""
    fn = getattr(cls, "to_plain", None)
    if fn is None:
        raise WrapGradientError(
            f"{cls.__qualname__}.wrap: the gradient arrived as a plain tensor (shape "
            f"{_fmt(grad.shape)}), and {cls.__qualname__} has no to_plain() to split it into "
            f"gradients of its inner tensors. Define to_plain(self) (written with differentiable "
            f"torch ops on the inner tensors: its vector-Jacobian product is the split), or make "
            f"the ops after wrap() return {cls.__qualname__} gradients (handlers that build "
            f"their results with {cls.__qualname__}.wrap)."
        )
    fn = getattr(fn, "__wrapped__", fn)
    kctx, size, stride, offset = ctx.parts
    saved = ctx.saved_tensors
    kit = cls.__kit__
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(bool(need)) for t, need in zip(saved, needs)]
        full: list = [None] * len(kit.inner_names)
        for n, t in zip(ctx.names, leaves):
            full[kit.inner_names.index(n)] = t
        dense = fn(kit.make(tuple(full), kctx, size, stride, offset))
        want = [t for t in leaves if t.requires_grad]
        if not isinstance(dense, torch.Tensor) or not dense.requires_grad:
            raise WrapGradientError(
                f"{cls.__qualname__}.wrap: the gradient arrived as a plain tensor, and "
                f"{cls.__qualname__}.to_plain() is not differentiable in the inner tensors "
                f"{[n for n, need in zip(ctx.names, needs) if need]} (its result has no graph: "
                "it goes through .tolist(), .item(), numpy or a no_grad block), so it cannot split "
                "the gradient. Write to_plain() with differentiable torch ops, or make the ops "
                f"after wrap() return {cls.__qualname__} gradients."
            )
        got = iter(torch.autograd.grad(dense, want, grad, allow_unused=True))
    return tuple(next(got) if t.requires_grad else None for t in leaves)


class _Unwrap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        kctx = x._kit_ctx
        d = x.__dict__
        present = kctx.present
        inners = [d[n] for n in present]
        # New tensor objects (views), never the wrapper's own inner tensors: autograd gives
        # each output a grad_fn, which must not be set on the wrapper's fields.
        outs = tuple(t.view_as(t) for t in inners)
        fixed = [o for o in outs if not _differentiable(o)]
        if fixed:
            ctx.mark_non_differentiable(*fixed)
        ctx.save_for_backward(*[t for t in inners if not _differentiable(t)])
        ctx.parts = (type(x), kctx, tuple(x.shape), tuple(x.stride()), present,
                     tuple((tuple(t.shape), t.dtype, t.device) for t in inners))
        return outs

    @staticmethod
    def backward(ctx, *grads):
        cls, kctx, size, stride, present, metas = ctx.parts
        fixed = iter(ctx.saved_tensors)
        by_name = {}
        for n, g, (shape, dtype, device) in zip(present, grads, metas):
            if not (dtype.is_floating_point or dtype.is_complex):
                by_name[n] = next(fixed)  # offsets and the like: the forward's own
            elif g is None:
                by_name[n] = torch.zeros(shape, dtype=dtype, device=device)
            else:
                by_name[n] = g
        kit = cls.__kit__
        inners = tuple([by_name.get(n) for n in kit.inner_names])
        primary = inners[0]
        if primary.dim() == len(size) and tuple(primary.shape) == size:
            stride = primary.stride()  # the primary backs the outer layout (the kit's rule)
        return cls.from_parts(inners, kctx, size=size, stride=stride)


# Alive for the process: dynamo's allow_in_graph recognises a function by its id.
_GRAPH_FUNCTIONS: list = []


def graph_functions(cls):
    """``(graph_wrap, graph_unwrap)`` for ``cls``: one dynamo graph node each.

    A class cannot be a graph argument, hence one pair of functions per class, made when
    the class is (as ``_flatten.graph_rebuild``).
    """
    from . import _compat

    def graph_wrap(tensors, names, rest):
        return _Wrap.apply(cls, names, rest, *tensors)

    def graph_unwrap(x):
        if type(x) is not cls:
            raise ConstructionError(
                f"{cls.__qualname__}.unwrap() got a {type(x).__qualname__}; call unwrap() on the "
                "instance itself (x.unwrap())."
            )
        return _Unwrap.apply(x)

    for fn, name in ((graph_wrap, "graph_wrap"), (graph_unwrap, "graph_unwrap")):
        fn.__name__ = name
        fn.__qualname__ = f"{cls.__qualname__}.{name}"
    _GRAPH_FUNCTIONS.append((graph_wrap, graph_unwrap))
    return _compat.allow_in_graph(graph_wrap), _compat.allow_in_graph(graph_unwrap)


# ---- a torch-function handler that drops the graph ------------------------------------------
# A handler that builds its result with the constructor from inner results makes a leaf: the
# gradient stops at the result and never reaches the inputs (a weight's .grad stays None,
# silently). Checked after each author's torch-function handler in eager mode (under
# torch.compile the same handler was already run eagerly, or the compiled graph follows the
# inner tensors; the check needs grad_fn, which dynamo does not trace). Functions whose
# result has no gradient by definition (``*_like``, ``new_*``, ``detach``) are not checked.

_Tensor = torch.Tensor
_NO_GRAPH_NAMES = ("detach", "detach_", "requires_grad_", "clone_detached")


def _wrappers(out):
    if hasattr(type(out), "__kit__"):
        return (out,)
    if type(out) in (tuple, list):
        return tuple(o for o in out if hasattr(type(o), "__kit__"))
    return ()


def _inputs(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, _Tensor):
            yield a
        elif type(a) in (tuple, list):
            yield from (b for b in a if isinstance(b, _Tensor))


def keeps_graph(cls, func, h, name: str):
    """``h`` (an author's torch-function handler) followed by the check that a wrapper it
    returns did not drop the autograd graph of its inputs (``GradientDroppedError``)."""
    fname = getattr(func, "__name__", "")
    if fname in _NO_GRAPH_NAMES or fname.endswith("_like") or fname.startswith("new_"):
        return h

    def checked(func, types, args, kwargs):
        out = h(func, types, args, kwargs)
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            for w in _wrappers(out):
                if w.grad_fn is None and (w.is_floating_point() or w.is_complex()):
                    _check_dropped(cls, name, h, w, args, kwargs)
        return out

    checked.__wrapped__ = h  # type: ignore[attr-defined]  # read by _dispatch's result check
    return checked


def _check_dropped(cls, name, h, out, args, kwargs) -> None:
    if any(out is a for a in _inputs(args, kwargs)):
        return  # an input handed back as it is keeps its own graph
    needing = [a for a in _inputs(args, kwargs) if a.requires_grad]
    graphed = [n for n, v in out.__dict__.items() if isinstance(v, _Tensor) and v.requires_grad]
    if not needing and not graphed:
        return
    kind = type(out).__qualname__
    where = f"{getattr(h, '__module__', '?')}.{getattr(h, '__qualname__', h)}"
    why = (f"{len(needing)} of its tensor inputs require grad" if needing
           else f"its inner tensors {graphed} carry a graph")
    raise GradientDroppedError(
        f"{cls.__qualname__}'s torch-function handler for {name} ({where}) returned a {kind} "
        f"that is a leaf of autograd (requires_grad={out.requires_grad}, no grad_fn) although "
        f"{why}: a wrapper built with the constructor ({kind}(...)) cuts the graph, so no "
        f"gradient reaches the inputs (a weight's .grad stays None). Build the result with "
        f"{kind}.wrap(...) (the constructor's arguments), and read a wrapper input's inner "
        "tensors with x.unwrap() so its gradient flows too (docs/authoring.md, \"Handlers and "
        "autograd\")."
    )
