"""``FREE``: the marker for an inner dim that is no function of the outer size.

A class's ``__inner_shapes__(outer_size, ctx)`` gives, per inner tensor, its shape as
arithmetic of the outer size. Some inner dims have no such rule: a packed
variable-length batch of outer size ``(B, max_len, D)`` keeps its tokens in
``packed`` of shape ``(total_tokens, D)``, and ``total_tokens`` is not a function of
``(B, max_len, D)``. ``FREE`` says so for that dim alone, while the others stay
derived::

    {"packed": (FREE, D), "seq_offsets": (B + 1,)}

so ``packed``'s ``D`` is still tied to the outer ``D`` (for ``relations``, ``plan``,
``guards`` and the construction checks), and its dim 0 is a size of its own, as every
dim of an inner tensor left out of ``__inner_shapes__`` is.

The marking rule for free dims (``docs/symbolic.md``): when any outer dim of the wrapper
is marked dynamic (by ``symbolic.mark_dynamic``, by torch's ``mark_dynamic`` /
``maybe_mark_dynamic`` on the wrapper), its FREE dims are marked ``Dim.auto()``, so that
one graph serves every size they take.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FREE", "is_free"]


class _Free:
    """The type of ``FREE`` (one instance; compare with ``is``)."""

    __slots__ = ()
    _instance: "_Free | None" = None

    def __new__(cls) -> "_Free":
        if cls._instance is None:
            cls._instance = object.__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "FREE"

    def __reduce__(self) -> str:
        return "FREE"  # pickles as the module attribute: the one instance survives a round trip

    def __copy__(self) -> "_Free":
        return self

    def __deepcopy__(self, memo: Any) -> "_Free":
        return self


#: In a shape tuple of ``__inner_shapes__``: this dim is free (not derived from the outer size).
FREE = _Free()


def is_free(e: Any) -> bool:
    """True for the ``FREE`` marker.

    Example:
        >>> is_free(FREE), is_free(3)
        (True, False)
    """
    return e is FREE
