"""Reading torch's wrapper-subclass protocol, duck-typed.

``symbolic`` serves any traceable wrapper subclass (torch's ``TwoTensor``, ``DTensor``,
the kit's classes), so it learns a tensor's structure only from ``__tensor_flatten__``
and, when a class has it, ``__inner_shapes__``. Inner tensors are reached by attribute,
as dynamo reaches them (``L['x'].scale``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import torch

from ._compat import is_traceable_wrapper_subclass
from .errors import PolicyError, PolicyTypeError
from .source_types import ROOT, InnerSource, Source

__all__ = ["is_wrapper", "inner_items", "ctx_of", "walk", "path_of", "where", "get_inner", "Node", "tree"]


def is_wrapper(t: Any) -> bool:
    """True for a traceable wrapper subclass instance (it has inner tensors).

    Example:
        >>> import torch
        >>> is_wrapper(torch.ones(2))
        False
    """
    return isinstance(t, torch.Tensor) and is_traceable_wrapper_subclass(t)


def flatten(t: Any) -> tuple[list[str], Any]:
    """``t.__tensor_flatten__()``: the names of its inner tensors and its ctx.

    The protocol method is not declared on ``torch.Tensor``; reading it here keeps the
    duck typing in one place.

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> flatten(TwoTensor(torch.ones(2), torch.ones(2)))
        (['a', 'b'], None)
    """
    return t.__tensor_flatten__()


def inner_items(t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for each present inner tensor, in ``__tensor_flatten__`` order.

    Non-tensor leaves torch allows beside inner tensors (opaque objects) are skipped, as
    dynamo skips them when it allocates symbols.
    """
    if not is_wrapper(t):
        return []
    names, _ = flatten(t)
    out = []
    for n in names:
        v = getattr(t, n)
        if isinstance(v, torch.Tensor):
            out.append((n, v))
    return out


def ctx_of(t: torch.Tensor) -> Any:
    """The flatten context of a wrapper (the second item of ``__tensor_flatten__``)."""
    return flatten(t)[1]


def walk(t: torch.Tensor, base: Source = ROOT) -> Iterator[tuple[Source, torch.Tensor]]:
    """Yield ``(source, tensor)`` for ``t`` and every tensor inside it, pre-order.

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> [s.name_for("x") for s, _ in walk(TwoTensor(torch.ones(2), torch.ones(2)))]
        ["L['x']", "L['x'].a", "L['x'].b"]
    """
    yield base, t
    for name, v in inner_items(t):
        yield from walk(v, InnerSource(name, base))


def path_of(src: Source) -> str:
    """Dotted attribute path of a source relative to its root: ``"a.scale"``; ``""`` for the root."""
    return src.render("")[1:]


def where(src: Source, root: str = "x") -> str:
    """How error messages name a tensor: ``x.scale``."""
    return src.render(root)


@dataclass(frozen=True, eq=False)
class Node:
    """One tensor of a value, read once: where it is, whether it is a wrapper, its flatten
    ctx (wrappers), and its present inner tensors as nodes, in flatten order.

    Built by ``tree``, one ``__tensor_flatten__`` per wrapper; ``describe``, ``plan``,
    ``apply`` and ``mark_dynamic`` read this rather than asking the tensor again.
    """

    source: Source
    tensor: torch.Tensor
    wrapper: bool
    ctx: Any
    children: tuple  # ((name, Node), ...)

    def items(self) -> list[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of the present inner tensors, as ``inner_items``."""
        return [(n, c.tensor) for n, c in self.children]

    def walk(self) -> Iterator["Node"]:
        """This node and every node below it, pre-order (as ``walk``)."""
        yield self
        for _, c in self.children:
            yield from c.walk()

    def child(self, name: Any) -> "Node":
        """The present inner tensor ``name``, or a PolicyError saying why not."""
        return _child(self, name)


def tree(t: torch.Tensor, base: Source = ROOT) -> Node:
    """``t`` and every tensor inside it as ``Node``s (one flatten per wrapper).

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> n = tree(TwoTensor(torch.ones(2), torch.ones(2)))
        >>> n.wrapper, [name for name, _ in n.children], n.child("a").wrapper
        (True, ['a', 'b'], False)
    """
    if not is_wrapper(t):
        return Node(base, t, False, None, ())
    names, ctx = flatten(t)
    children = []
    for n in names:
        v = getattr(t, n)
        if isinstance(v, torch.Tensor):
            children.append((n, tree(v, InnerSource(n, base))))
    return Node(base, t, True, ctx, tuple(children))


def get_inner(t: torch.Tensor, name: Any, src: Source) -> torch.Tensor:
    """The present inner tensor ``name`` of ``t`` (at ``src``), or a PolicyError saying why not."""
    return _child(tree(t, src), name).tensor


def _child(node: Node, name: Any) -> Node:
    here = where(node.source)
    src = node.source
    t = node.tensor
    if not isinstance(name, str):
        raise PolicyTypeError(
            f"{here}: inner tensors are named by strings, got {name!r} ({type(name).__name__})."
        )
    if not node.wrapper:
        raise PolicyError(
            f"{here} is a plain {type(t).__name__} and has no inner tensors, so it has no "
            f"inner {name!r}. Give a policy for its own dims only (a {{dim: Dim}} mapping)."
        )
    present = dict(node.children)
    if name in present:
        return present[name]
    cls = type(t).__name__
    names = list(present)
    if hasattr(t, name) and getattr(t, name) is None:
        raise PolicyError(
            f"{where(InnerSource(name, src))} is None: {cls}.{name} is an optional inner tensor "
            f"that this instance does not have, so it cannot be marked. Drop {name!r} from the "
            f"policy (present inner tensors: {names})."
        )
    raise PolicyError(
        f"{where(InnerSource(name, src))}: {cls} has no inner tensor {name!r}; its inner tensors "
        f"are {names}."
    )
