"""``is_compiling()``: one answer for dynamo, AOTAutograd and both kinds of export."""

from __future__ import annotations

from . import _compat

__all__ = ["is_compiling"]


def is_compiling() -> bool:
    """True under torch.compile and torch.export (strict and non-strict), else False.

    Example:
        >>> import torch
        >>> from subclass_kit import is_compiling
        >>> is_compiling()
        False
        >>> torch.compile(lambda x: x + int(is_compiling()), backend="eager")(torch.zeros(1))
        tensor([1.])
    """
    return _compat.is_compiling()
