"""One pytree facade over optree (default) or torch's Python pytree.

``subclass_kit.pytree.use("python")`` switches every function here to torch's
``torch.utils._pytree``; ``use("optree")`` switches back. Both follow torch's pytree
semantics, so code does not change meaning with the switch: ``None`` is a leaf, dicts keep
insertion order, torch's registered node types (``torch.Size``...) are nodes. (optree runs
in torch's namespace with ``none_is_leaf=True``, as ``torch.utils._cxx_pytree`` does.)
optree is faster; torch's pytree is what dynamo traces natively. Tensors, wrapped or not,
are leaves in both.

Example:
    >>> from subclass_kit import pytree
    >>> pytree.tree_map(lambda v: v * 2, {"a": 1, "b": (2, 3)})
    {'a': 2, 'b': (4, 6)}
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

import contextlib

import optree

from . import _compat

__all__ = ["use", "using", "current", "tree_map", "tree_map_only", "tree_flatten", "tree_unflatten", "tree_leaves"]

_IMPLS = ("optree", "python")
_current = "optree"
_NS = "torch"
_compat.enable_torch_optree_namespace()


def use(impl: str) -> None:
    """Select the implementation: ``"optree"`` (default) or ``"python"``.

    Example:
        >>> from subclass_kit import pytree
        >>> pytree.use("python"); pytree.current()
        'python'
        >>> pytree.use("optree")
    """
    global _current
    if impl not in _IMPLS:
        raise ValueError(f"subclass_kit.pytree.use() takes one of {_IMPLS}, got {impl!r}")
    _current = impl


def current() -> str:
    """The implementation in use."""
    return _current


@contextlib.contextmanager
def using(impl: str) -> Iterator[None]:
    """Context manager form of :func:`use`.

    Example:
        >>> from subclass_kit import pytree
        >>> with pytree.using("python"):
        ...     pytree.tree_leaves([1, (2, None)])
        [1, 2, None]
    """
    prev = _current
    use(impl)
    try:
        yield
    finally:
        use(prev)


def tree_flatten(tree: Any) -> tuple[list[Any], Any]:
    """Leaves and a spec that ``tree_unflatten`` accepts (from the same implementation).

    Example:
        >>> from subclass_kit import pytree
        >>> leaves, spec = pytree.tree_flatten({"a": [1, 2]})
        >>> leaves, pytree.tree_unflatten([3, 4], spec)
        ([1, 2], {'a': [3, 4]})
    """
    if _current == "optree":
        return optree.tree_flatten(tree, none_is_leaf=True, namespace=_NS)
    return _compat.python_pytree.tree_flatten(tree)


def tree_unflatten(leaves: Iterable[Any], spec: Any) -> Any:
    """Rebuild a tree from leaves and a spec of either implementation."""
    if isinstance(spec, optree.PyTreeSpec):
        return optree.tree_unflatten(spec, list(leaves))
    return _compat.python_pytree.tree_unflatten(list(leaves), spec)


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves, left to right (dicts in insertion order; None is a leaf, as in torch).

    Example:
        >>> from subclass_kit import pytree
        >>> pytree.tree_leaves({"b": 1, "a": (2, None)})
        [1, 2, None]
    """
    if _current == "optree":
        return optree.tree_leaves(tree, none_is_leaf=True, namespace=_NS)
    return _compat.python_pytree.tree_leaves(tree)


def tree_map(fn: Callable[..., Any], tree: Any, *rests: Any) -> Any:
    """Apply ``fn`` to every leaf.

    Example:
        >>> from subclass_kit import pytree
        >>> pytree.tree_map(lambda a, b: a + b, [1, 2], [10, 20])
        [11, 22]
    """
    if _current == "optree":
        return optree.tree_map(fn, tree, *rests, none_is_leaf=True, namespace=_NS)
    return _compat.python_pytree.tree_map(fn, tree, *rests)


def tree_map_only(types: type | tuple[type, ...], fn: Callable[..., Any], tree: Any) -> Any:
    """Apply ``fn`` to the leaves that are instances of ``types``; keep the others.

    Example:
        >>> import torch
        >>> from subclass_kit import pytree
        >>> pytree.tree_map_only(torch.Tensor, lambda t: t.sum().item(), [torch.ones(2), "s"])
        [2.0, 's']
    """
    return tree_map(lambda x: fn(x) if isinstance(x, types) else x, tree)
