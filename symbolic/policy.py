"""``SubclassPolicy``: which dims of a wrapped tensor, and of each tensor inside it, are dynamic.

The public face of torch's ``SubclassSymbolicContext``: an outer ``{dim: Dim}`` plus, per
inner tensor, a ``{dim: Dim}`` (plain inner) or another ``SubclassPolicy`` (nested wrapper).
A policy is plain data, validated for shape only when applied to a tensor.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Union

from .dims import Dim
from .errors import PolicyError, PolicyTypeError
from .protocol import where
from .source_types import Source

__all__ = ["SubclassPolicy", "DimsSpec", "normalize_dims", "resolve_dims"]

DimsSpec = Union[int, Sequence[int], Mapping[int, Dim]]


def _dim_index(d: Any, where: str) -> int:
    if isinstance(d, bool):
        raise PolicyTypeError(f"{where}: a dim must be an int, got {d!r}.")
    try:
        return operator.index(d)
    except TypeError:
        raise PolicyTypeError(
            f"{where}: a dim must be an int, got {d!r} ({type(d).__name__})."
        ) from None


def normalize_dims(spec: Any, where: str, *, default: Dim | None = None) -> dict[int, Dim]:
    """Turn ``0``, ``[0, 1]`` or ``{0: Dim.auto()}`` into ``{dim: Dim}``.

    Bare ints mean ``default`` (``Dim.dynamic()`` unless given). Dims are not checked
    against any tensor here; negative dims are kept and resolved when applied.

    Example:
        >>> normalize_dims([0, 1], "x")
        {0: Dim.dynamic(), 1: Dim.dynamic()}
    """
    default = Dim.dynamic() if default is None else default
    if isinstance(spec, Mapping):
        out = {}
        for d, dim in spec.items():
            i = _dim_index(d, where)
            if not isinstance(dim, Dim):
                raise PolicyTypeError(
                    f"{where}: the policy for dim {i} must be a Dim (Dim.dynamic(), "
                    f"Dim.static(), Dim.auto()), got {dim!r} ({type(dim).__name__})."
                )
            out[i] = dim
        return out
    if isinstance(spec, (str, bytes)) or not (isinstance(spec, Sequence) or hasattr(spec, "__index__")):
        raise PolicyTypeError(
            f"{where}: dims must be an int, a sequence of ints or a {{dim: Dim}} mapping, "
            f"got {spec!r} ({type(spec).__name__})."
        )
    if isinstance(spec, Sequence):
        return {_dim_index(d, where): default for d in spec}
    return {_dim_index(spec, where): default}


def _freeze_inner(inner: Mapping, where: str) -> dict:
    out = {}
    for name, v in inner.items():
        if not isinstance(name, str):
            raise PolicyTypeError(
                f"{where}: inner tensors are named by strings, got {name!r} ({type(name).__name__})."
            )
        out[name] = v if isinstance(v, SubclassPolicy) else MappingProxyType(normalize_dims(v, f"{where}.{name}"))
    return out


class SubclassPolicy:
    """The dimension policy for one wrapped tensor, recursive for nested subclasses.

    ``outer`` maps the wrapper's own dims to ``Dim``s. ``inner`` maps an inner tensor's
    name to a ``{dim: Dim}`` (bare ints and lists of ints mean ``Dim.dynamic()``) or, for an
    inner that is itself a wrapper, to a ``SubclassPolicy``. Dims a policy does not mention
    are left as torch leaves them (static at first compile, automatic dynamic after).

    Example:
        >>> p = SubclassPolicy(outer={0: Dim.dynamic()}, inner={"qdata": [0], "scale": {0: Dim.dynamic(), 1: Dim.static()}})
        >>> p.inner["scale"][1]
        Dim.static()
        >>> p
        SubclassPolicy(outer={0: Dim.dynamic()}, inner={'qdata': {0: Dim.dynamic()}, 'scale': {0: Dim.dynamic(), 1: Dim.static()}})
    """

    __slots__ = ("_outer", "_inner")

    def __init__(self, outer: DimsSpec | None = None, inner: Mapping[str, Any] | None = None):
        outer = {} if outer is None else outer
        inner = {} if inner is None else inner
        if not isinstance(inner, Mapping):
            raise PolicyTypeError(
                f"SubclassPolicy(inner=...) must map inner names to dims or policies, got "
                f"{inner!r} ({type(inner).__name__})."
            )
        self._outer = MappingProxyType(normalize_dims(outer, "SubclassPolicy(outer=...)"))
        self._inner = MappingProxyType(_freeze_inner(inner, "SubclassPolicy(inner=...)"))

    @property
    def outer(self) -> Mapping[int, Dim]:
        """``{dim: Dim}`` for the wrapper's own dims."""
        return self._outer

    @property
    def inner(self) -> Mapping[str, "Mapping[int, Dim] | SubclassPolicy"]:
        """Per inner tensor: ``{dim: Dim}`` or a nested ``SubclassPolicy``."""
        return self._inner

    def __setattr__(self, name, value):
        if hasattr(self, "_inner"):
            raise AttributeError("SubclassPolicy is immutable; build a new one.")
        object.__setattr__(self, name, value)

    def _key(self):
        return (
            tuple(sorted(self._outer.items())),
            tuple(sorted((k, v if isinstance(v, SubclassPolicy) else tuple(sorted(v.items())))
                         for k, v in self._inner.items())),
        )

    def __eq__(self, other):
        if not isinstance(other, SubclassPolicy):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def canonical(self) -> dict:
        """JSON-able form for stable keys (sorted, no object identities).

        Example:
            >>> SubclassPolicy(outer={0: Dim.auto()}).canonical()
            {'outer': [[0, ['auto', None, None]]], 'inner': []}
        """
        inner = []
        for k in sorted(self._inner):
            v = self._inner[k]
            if isinstance(v, SubclassPolicy):
                inner.append([k, {"policy": v.canonical()}])
            else:
                inner.append([k, {"dims": [[d, dim.canonical()] for d, dim in sorted(v.items())]}])
        return {"outer": [[d, dim.canonical()] for d, dim in sorted(self._outer.items())], "inner": inner}

    def __repr__(self) -> str:
        def dims(m):
            return "{" + ", ".join(f"{d}: {v!r}" for d, v in m.items()) + "}"

        inner = ", ".join(
            f"{k!r}: {v!r}" if isinstance(v, SubclassPolicy) else f"{k!r}: {dims(v)}"
            for k, v in self._inner.items()
        )
        return f"SubclassPolicy(outer={dims(self._outer)}, inner={{{inner}}})"


def resolve_dims(t: Any, dims: Mapping[int, Dim], src: Source) -> dict[int, Dim]:
    """Check ``dims`` against ``t`` and make them non-negative, or raise a PolicyError naming ``src``."""
    out: dict[int, Dim] = {}
    n = t.dim()
    for d, dim in dims.items():
        i = d + n if d < 0 else d
        if not 0 <= i < n:
            valid = f"{-n}..{n - 1}" if n else "none, it is 0-d"
            raise PolicyError(
                f"{where(src)}: dim {d} is out of range for a {n}-d tensor of shape "
                f"{tuple(t.shape)} (valid dims: {valid})."
            )
        if i in out and out[i] != dim:
            raise PolicyError(f"{where(src)}: dim {d} is given twice, as {out[i]!r} and {dim!r}.")
        out[i] = dim
    return out
