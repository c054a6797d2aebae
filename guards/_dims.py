"""How dynamo will treat each dimension of one tensor: the marks it reads, or a policy.

dynamo decides per dim (``_automatic_dynamic`` in torch/_dynamo/variables/builder.py), in
this precedence: an unbacked mark; ``mark_dynamic`` (strict: specializing it is an error);
``maybe_mark_dynamic`` or automatic dynamic (a symbol, specialization allowed);
``mark_static`` or static-by-default; otherwise (``dynamic=True``) a duck-sized symbol.
This module turns marks (or a ``symbolic.SubclassPolicy``) into that per-dim decision, and
records which mark attributes the tensor carries, because dynamo guards on those too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from . import _compat

__all__ = ["DimKind", "Directive", "Marks", "read_marks", "policy_marks", "split_policy"]


class DimKind:
    """The symbolic kind of one dim, as torch's ``DimDynamic`` names it."""

    STATIC = "static"
    DUCK = "duck"        # dynamic=True, unmarked: equal sizes share one symbol
    DYNAMIC = "dynamic"  # marked or automatic dynamic: a symbol of its own
    UNBACKED = "unbacked"


@dataclass(frozen=True)
class Directive:
    """What the user asked for one dim: ``strict`` is mark_dynamic (vs maybe_mark_dynamic)."""

    kind: str  # "dynamic" | "auto" | "static" | "unbacked"
    min: int | None = None
    max: int | None = None

    @property
    def strict(self) -> bool:
        return self.kind == "dynamic"


@dataclass(frozen=True)
class Marks:
    """Per-dim directives for one tensor, and the mark attributes it carries.

    ``attrs`` maps each of ``_compat.MARK_ATTRS`` the tensor has to its set of dims;
    dynamo's marking guard requires later inputs to carry a subset (or none), and to not
    carry an attribute this tensor lacked.
    """

    dims: Mapping[int, Directive] = field(default_factory=dict)
    attrs: Mapping[str, frozenset] = field(default_factory=dict)

    def canonical(self) -> list:
        return [[d, [v.kind, v.min, v.max]] for d, v in sorted(self.dims.items())]


_NO_MARKS = Marks()


def read_marks(t: torch.Tensor) -> Marks:
    """The marks torch's marking functions left on ``t`` itself (not its inner tensors)."""
    d = getattr(t, "__dict__", None)
    if not d:
        return _NO_MARKS
    attrs = {a: frozenset(d[a]) for a in _compat.MARK_ATTRS if a in d}
    propagated = d.get(_compat.PROPAGATED_ATTR, ())
    if not attrs and not propagated:
        return _NO_MARKS
    dims: dict[int, Directive] = {}
    for i in propagated:  # read like maybe_mark_dynamic, but not guarded (not in attrs)
        dims[i] = Directive("auto")
    for i in attrs.get("_dynamo_static_indices", ()):
        dims[i] = Directive("static")
    for i in attrs.get("_dynamo_weak_dynamic_indices", ()):
        dims[i] = Directive("auto")
    ranges = {r.dim: r for r in d.get("_dynamo_dynamic_range", ())}
    for i in attrs.get("_dynamo_dynamic_indices", ()):
        r = ranges.get(i)
        dims[i] = Directive("dynamic", getattr(r, "min", None), getattr(r, "max", None))
    for a in ("_dynamo_unbacked_indices", "_dynamo_strict_unbacked_indices"):
        for i in attrs.get(a, ()):
            dims[i] = Directive("unbacked")
    return Marks(dims, attrs)


_ATTR_OF_KIND = {
    "dynamic": "_dynamo_dynamic_indices",
    "auto": "_dynamo_weak_dynamic_indices",
    "static": "_dynamo_static_indices",
}


def policy_marks(dims: Mapping[int, Any], ndim: int, *, nested: bool) -> Marks:
    """The marks ``symbolic.apply`` leaves for a ``{dim: Dim}`` on a tensor of rank ``ndim``.

    ``nested`` is True for a wrapper inside a wrapper: ``symbolic.apply`` marks its own
    dynamic dims ``maybe_mark_dynamic`` (a strict mark there always fails in dynamo).
    """
    out: dict[int, Directive] = {}
    attrs: dict[str, set] = {}
    for d, dim in dims.items():
        kind = getattr(dim, "kind", None)
        if kind not in _ATTR_OF_KIND:
            raise TypeError(
                f"a policy dim must be a symbolic.Dim (kind dynamic/static/auto), got {dim!r}"
            )
        i = d + ndim if d < 0 else d
        lo, hi = getattr(dim, "min", None), getattr(dim, "max", None)
        if nested and kind == "dynamic":
            kind, lo, hi = "auto", None, None
        out[i] = Directive(kind, lo, hi)
        attrs.setdefault(_ATTR_OF_KIND[kind], set()).add(i)
    return Marks(out, {a: frozenset(s) for a, s in attrs.items()})


def split_policy(policy: Any) -> tuple[Mapping[int, Any], Mapping[str, Any]]:
    """``(outer_dims, inner_map)`` of a SubclassPolicy, or of a bare ``{dim: Dim}``."""
    if policy is None:
        return {}, {}
    if hasattr(policy, "outer") and hasattr(policy, "inner"):
        return policy.outer, policy.inner
    if isinstance(policy, Mapping):
        return policy, {}
    raise TypeError(
        f"policy must be a symbolic.SubclassPolicy or a {{dim: Dim}} mapping, got "
        f"{type(policy).__name__}"
    )
