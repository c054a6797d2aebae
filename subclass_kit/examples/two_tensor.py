"""``TwoTensor``: two tensors of the outer shape, every op run on both."""

from __future__ import annotations

import torch

from .. import fallbacks
from ..base import WrapperTensor
from ..fields import inner

__all__ = ["TwoTensor"]


class TwoTensor(WrapperTensor):
    """Two same-shaped tensors; every op runs on both (torch's test TwoTensor, on the kit).

    Exercises: the map_inner fallback, views and in-place ops without registration,
    aliasing, autograd with wrapped gradients, nesting (inner tensors may be wrappers).

    Example:
        >>> import torch
        >>> x = TwoTensor(torch.ones(2, 2), torch.zeros(2, 2))
        >>> y = (x + 1).t()
        >>> y.a.tolist(), y.b.tolist()
        ([[2.0, 2.0], [2.0, 2.0]], [[1.0, 1.0], [1.0, 1.0]])
    """

    a: torch.Tensor = inner(doc="first tensor (the primary: to_plain() returns it)")
    b: torch.Tensor = inner(doc="second tensor, same shape")

    __fallback__ = fallbacks.map_inner

    @classmethod
    def from_plain(cls, t: torch.Tensor) -> "TwoTensor":
        """``TwoTensor(t, t.clone())``: the hook the checker's OpInfo sweep builds instances with."""
        return cls(t, t.clone())

    def to_plain(self) -> torch.Tensor:
        """The first tensor: every op keeps ``a`` equal to the dense computation on ``a``."""
        return self.a

    @classmethod
    def __samples__(cls):
        g = torch.Generator().manual_seed(0)
        a = torch.randn(8, 4, generator=g)
        return [cls(a, a * 2), cls(torch.randn(6, 6, generator=g), torch.randn(6, 6, generator=g))]
