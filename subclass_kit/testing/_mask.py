"""Don't-care positions: which positions of ``to_plain()`` a comparison may judge.

A class declares them with ``__plain_mask__(self)``: a bool tensor broadcastable to
``to_plain()``'s shape, True where a position means something (a packed variable-length
batch: the real tokens; its zero padding is don't-care). None, or no hook: every position
counts. The rule every comparison of the checker follows:

- a wrapper result is compared at the positions its own mask marks meaningful;
- the dense reference of an op on a masked input is the op on ``to_plain()`` where that
  reference does not depend on the input's don't-care values (found by running it again
  with those positions filled with large positive, then large negative values); a
  reduction or softmax over a masked input (sum, mean, amax, amin, prod, logsumexp,
  softmax, log_softmax, softmin) is compared with ``torch.masked``'s version of it, which
  ignores don't-care positions, at the positions where it reduced at least one meaningful
  value. Positions meaningful in the result whose reference depends on don't-care values
  (and that no masked reduction covers) are not judged, and the row says how many.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .. import _compat

__all__ = ["ShapeDependsError", "plain_mask", "Reference", "reference", "masked_fn", "flat", "result_care", "MASK_HOOK"]

MASK_HOOK = "__plain_mask__"


class ShapeDependsError(ValueError):
    """The dense result's shape changes with the values at don't-care positions."""


def plain_mask(t) -> torch.Tensor | None:
    """The meaningful positions of a wrapped tensor's ``to_plain()`` (bool, of its shape), or
    None when every position counts (no hook, the hook returns None, all True, or a fake/meta
    tensor whose values cannot be read).

    Raises:
        TypeError: the hook returned something other than a bool tensor broadcastable to
            the outer shape.

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> plain_mask(TwoTensor(torch.ones(2), torch.ones(2))) is None
        True
    """
    hook = getattr(type(t), MASK_HOOK, None)
    if hook is None or not isinstance(t, torch.Tensor) or t.device.type == "meta" or _compat.is_fake(t):
        return None
    m = hook(t)
    if m is None:
        return None
    name = type(t).__qualname__
    if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
        got = f"a {m.dtype} tensor" if isinstance(m, torch.Tensor) else type(m).__name__
        raise TypeError(f"{name}.__plain_mask__() returned {got}; return a bool tensor broadcastable to "
                        f"to_plain()'s shape {tuple(t.shape)} (True where a position means something), or None")
    if _compat.is_fake(m) or m.device.type == "meta":
        return None
    try:
        m = m.expand(t.shape)
    except RuntimeError:
        raise TypeError(f"{name}.__plain_mask__() returned a mask of shape {tuple(m.shape)}, which does not "
                        f"broadcast to to_plain()'s shape {tuple(t.shape)}; return one that does") from None
    return None if bool(m.all()) else m


# torch.masked counterparts of reductions and normalizations: how many positional arguments
# after the input they take (dim, keepdim / dim).
_REDUCTIONS = {"sum": 2, "mean": 2, "amax": 2, "amin": 2, "prod": 2, "logsumexp": 2}
_NORMALIZATIONS = {"softmax": 1, "log_softmax": 1, "softmin": 1, "_softmax": 1, "_log_softmax": 1}


def _base_name(op) -> str:
    if isinstance(op, _compat.OpOverload):
        return op._schema.name.split("::")[-1]
    return getattr(op, "__name__", "") or ""


def masked_fn(op, args: tuple, mask: torch.Tensor) -> tuple | None:
    """``(fn, defined, label)`` computing ``op(*args)`` over the meaningful positions of
    ``args[0]`` only (``fn(dense)``; ``defined``: where the result reduced at least one
    meaningful value), or None when ``op`` is no reduction ``torch.masked`` covers."""
    name = _base_name(op)
    rest = list(args[1:])
    if name in _REDUCTIONS:
        if len(rest) > _REDUCTIONS[name] or (name in ("amax", "amin", "logsumexp") and not rest):
            return None
        public = name
        defined = mask.to(torch.int32).sum(*rest) > 0 if rest else mask.any()
    elif name in _NORMALIZATIONS:
        public = name.lstrip("_")
        extra = rest[1:]
        if not rest or any(v not in (None, False) for v in extra):
            return None
        rest = rest[:1]
        defined = mask
    else:
        return None
    fn = getattr(torch.masked, public)

    def call(d):
        return fn(d, *rest, mask=mask)

    return call, defined, f"torch.masked.{public}"


def _fill(d: torch.Tensor, mask: torch.Tensor, sign: float) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(7)
    noise = torch.rand(d.shape, generator=g).to(d.device)
    if d.dtype.is_floating_point:
        far = (sign * (4.0 + noise)).to(d.dtype)
    elif d.dtype == torch.bool:
        far = torch.full_like(d, sign > 0)
    else:
        far = (sign * (4 + (noise * 8).long())).to(d.dtype)
    return torch.where(mask, d, far)


def _same(a, b) -> torch.Tensor | None:
    """Elementwise "equal within tolerance" of two results of one tensor's shape."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape:
        return None
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return torch.isclose(a.detach(), b.detach(), rtol=1e-4, atol=1e-5, equal_nan=True)
    return a.detach() == b.detach()


def flat(v) -> list:
    """The leaves of a result (tensors and other values; lists and tuples are walked)."""
    if isinstance(v, (list, tuple)):
        return [leaf for x in v for leaf in flat(x)]
    return [v]


@dataclass
class Reference:
    """A dense reference for a result and, per leaf of ``flat(expected)``, the positions it
    can judge (``judged``: a list of bool tensors or None, or None: all of them)."""

    expected: Any
    judged: Any = None
    how: str = ""  # "torch.masked.mean over the meaningful positions", or ""

    def unjudged(self, result) -> int:
        """How many positions meaningful in ``result`` the reference cannot judge."""
        return self.counts(result)[1]

    def counts(self, result) -> tuple:
        """``(judged, unjudged)``: meaningful positions of ``result``'s narrowed tensors that
        the reference judges and that it cannot (``(0, 0)`` when nothing is narrowed)."""
        if self.judged is None:
            return 0, 0
        good = bad = 0
        for r, j in zip(flat(result), self.judged):
            if not isinstance(j, torch.Tensor):
                continue
            care = plain_mask(r) if isinstance(r, torch.Tensor) and type(r) is not torch.Tensor else None
            care = torch.ones_like(j) if care is None else care.expand(j.shape)
            good += int((care & j).sum())
            bad += int((care & ~j).sum())
        return good, bad


def result_care(result, judged) -> list | None:
    """Per tensor leaf of ``result`` (walked as ``flat``), the positions to compare: its own
    mask if it is a wrapper with one, narrowed by ``judged``; None when all count.

    Example:
        >>> import torch
        >>> result_care((torch.ones(2), torch.ones(3)), None) is None
        True
    """
    leaves = [v for v in flat(result) if isinstance(v, torch.Tensor)]
    js = list(judged or [None] * len(leaves))
    out = []
    for t, j in zip(leaves, js + [None] * (len(leaves) - len(js))):
        care = plain_mask(t) if type(t) is not torch.Tensor else None
        if j is not None:
            care = j if care is None else care & j
        out.append(care)
    return out if any(c is not None for c in out) else None


def reference(call: Callable, inputs: list, masks: list, *, op=None, args=None) -> Reference:
    """The dense reference ``call(*inputs)`` and the positions it judges, for dense inputs
    of which some have don't-care positions (``masks[i]``, None: all meaningful).

    ``op`` and ``args`` (the dense call's arguments) let a reduction over a masked first
    input use its ``torch.masked`` counterpart.

    Raises:
        ShapeDependsError: the shape of the reference depends on don't-care values.
    """
    expected = call(*inputs)
    if all(m is None for m in masks):
        return Reference(expected)
    if op is not None and args and len(inputs) == 1 and args[0] is inputs[0] and masks[0] is not None:
        found = masked_fn(op, tuple(args), masks[0])
        if found is not None:
            fn, defined, label = found
            return Reference(fn(inputs[0]), [defined], f"{label} over the meaningful positions")
    runs = []
    for sign in (1.0, -1.0):
        filled = [d if m is None or not isinstance(d, torch.Tensor) else _fill(d, m, sign) for d, m in zip(inputs, masks)]
        try:
            runs.append(call(*filled))
        except Exception:
            runs.append(None)  # the op refuses such values (indices out of range): judge nothing
    judged: list = []
    leaves = flat(expected)
    others = [None if r is None else flat(r) for r in runs]
    for i, e in enumerate(leaves):
        if not isinstance(e, torch.Tensor):
            judged.append(None)
            continue
        j = None
        for o in others:
            s: torch.Tensor | None
            if o is None:
                s = torch.zeros(e.shape, dtype=torch.bool, device=e.device)
            else:
                s = _same(e, o[i] if i < len(o) else None)
            if s is None:
                raise ShapeDependsError("the shape of the dense result depends on the input's don't-care values")
            j = s if j is None else (j & s)
        judged.append(None if j is None or bool(j.all()) else j)
    return Reference(expected, judged if any(j is not None for j in judged) else None)
