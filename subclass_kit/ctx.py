"""The flatten context: the immutable value ``__tensor_flatten__`` returns beside the names.

Dynamo guards a wrapped input by comparing this value with ``==`` on every call, AOTAutograd
hashes and pickles it into its cache, and ``__tensor_unflatten__`` rebuilds the wrapper from
it. It is therefore a ``tuple`` subclass: equality and hashing run in C, pickling and
deepcopy need no custom code, and nothing in it can change after construction.
"""

from __future__ import annotations

from typing import Any

import torch
from guards._canonical import canonical as _canonical

__all__ = ["SubclassCtx", "canonical_value", "ctx_of", "reader"]

# Layout of the tuple. Private to this module (and the kit's generated constructor, which
# reads the dtype by index): everyone else reads a ctx by name (``ctx.present``,
# ``ctx.<field>``, ``Cls.ctx_reader(...)``).
_OWNER, _NAMES, _VALUES, _DTYPE, _PRESENT = range(5)

#: The instance attribute holding a wrapper's ctx (written only by the kit's ``make``).
CTX_ATTR = "_kit_ctx"

# Attributes of the ctx itself; meta fields may not take these names.
RESERVED = frozenset(
    {"owner", "fields", "values", "dtype", "present", "canonical", "replace", "count", "index"}
)


class SubclassCtx(tuple):
    """Meta fields, outer dtype and present optional inners of one wrapped tensor.

    ``ctx.<field>`` reads a meta field, ``ctx.dtype`` the outer dtype, ``ctx.fields`` the
    ``(name, value)`` pairs. Equal exactly when those are equal.

    Example:
        >>> import torch
        >>> ctx = SubclassCtx.make("BlockScaled", ("block",), (32,), torch.float32, ("qdata", "scale"))
        >>> ctx.block, ctx.dtype
        (32, torch.float32)
        >>> ctx == SubclassCtx.make("BlockScaled", ("block",), (32,), torch.float32, ("qdata", "scale"))
        True
    """

    __slots__ = ()

    @classmethod
    def make(cls, owner: str, names: tuple, values: tuple, dtype: torch.dtype, present: tuple) -> "SubclassCtx":
        return tuple.__new__(cls, (owner, names, values, dtype, present))

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails, i.e. for meta field names.
        names = tuple.__getitem__(self, _NAMES)
        try:
            return tuple.__getitem__(self, _VALUES)[names.index(name)]
        except ValueError:
            raise AttributeError(
                f"the ctx of {self.owner} has no meta field {name!r}; its meta fields are "
                f"{list(names)}"
            ) from None

    # Plain Python properties, not operator.itemgetter: dynamo traces these reads (in
    # unflatten under strict export) and cannot call an itemgetter.
    @property
    def owner(self) -> str:
        """Qualified name of the class this ctx belongs to."""
        return tuple.__getitem__(self, _OWNER)

    @property
    def dtype(self) -> torch.dtype:
        """The outer tensor's dtype."""
        return tuple.__getitem__(self, _DTYPE)

    @property
    def present(self) -> tuple:
        """Names of the inner tensors that are present (optional ones may be absent)."""
        return tuple.__getitem__(self, _PRESENT)

    @property
    def values(self) -> tuple:
        """The meta values in declaration order (for handlers that read every one, on every call).

        Example:
            >>> import torch
            >>> SubclassCtx.make("B", ("block", "axis"), (32, 0), torch.float32, ("q",)).values
            (32, 0)
        """
        return tuple.__getitem__(self, _VALUES)

    @property
    def fields(self) -> tuple:
        """``(name, value)`` pairs of the meta fields, in declaration order."""
        return tuple(zip(tuple.__getitem__(self, _NAMES), tuple.__getitem__(self, _VALUES)))

    def replace(self, *, dtype: torch.dtype | None = None, present: tuple | None = None, **meta: Any) -> "SubclassCtx":
        """A copy with some values changed.

        Example:
            >>> import torch
            >>> ctx = SubclassCtx.make("B", ("block",), (32,), torch.float32, ("q",))
            >>> ctx.replace(block=64).block
            64
        """
        names = tuple.__getitem__(self, _NAMES)
        values = list(tuple.__getitem__(self, _VALUES))
        for k, v in meta.items():
            if k not in names:
                raise AttributeError(f"the ctx of {self.owner} has no meta field {k!r}")
            values[names.index(k)] = v
        return SubclassCtx.make(
            self.owner,
            names,
            tuple(values),
            self.dtype if dtype is None else dtype,
            self.present if present is None else tuple(present),
        )

    def canonical(self) -> dict:
        """A JSON-able structure that is the same in every process (for stable keys)."""
        return {
            "owner": self.owner,
            "fields": [[n, canonical_value(v)] for n, v in self.fields],
            "dtype": str(self.dtype),
            "present": list(self.present),
        }

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={v!r}" for n, v in self.fields)
        sep = ", " if inner else ""
        return f"{self.owner}.ctx({inner}{sep}dtype={self.dtype})"

    def __reduce__(self):
        return (_rebuild_ctx, (tuple(self),))

    def __deepcopy__(self, memo):
        return self

    def __copy__(self):
        return self


def ctx_of(x: torch.Tensor) -> "SubclassCtx":
    """The ctx of a ``WrapperTensor`` instance (what ``x.__tensor_flatten__()[1]`` returns).

    Read a field of it by name: ``ctx_of(x).block``; for the same reads on every op, make a
    reader once with ``Cls.ctx_reader(...)``.

    Example:
        >>> import torch
        >>> from subclass_kit.examples import BlockScaled
        >>> b = BlockScaled.from_float(torch.ones(64, 2), block=32)
        >>> ctx_of(b).block, ctx_of(b) == b.__tensor_flatten__()[1]
        (32, True)
    """
    try:
        return x._kit_ctx  # type: ignore[attr-defined]  # set by make; an attribute read, which dynamo traces
    except AttributeError:
        raise TypeError(
            f"ctx_of() takes an instance of a WrapperTensor subclass, got {type(x).__name__}."
        ) from None


def reader(owner: str, meta_names: tuple, names: tuple) -> Any:
    """``read(x)``: the meta values ``names`` of a wrapper ``x`` by name (``Cls.ctx_reader``).

    The positions are looked up once, here; a call is two tuple indexings.
    """
    if not names:
        raise TypeError(f"{owner}.ctx_reader() needs at least one meta field name, e.g. ctx_reader({meta_names[:1]!r})")
    unknown = [n for n in names if n not in meta_names]
    if unknown:
        raise AttributeError(
            f"{owner} has no meta field {unknown[0]!r}; its meta fields are {list(meta_names)}."
        )
    idx = [meta_names.index(n) for n in names]
    # Plain attribute reads and tuple indexing (no itemgetter): dynamo traces these readers
    # when a handler or a module hook runs under torch.compile.
    if len(idx) == 1:
        (i,) = idx

        def read(x):
            return tuple.__getitem__(x._kit_ctx, _VALUES)[i]
    elif idx == list(range(len(meta_names))):
        # Every meta field in declaration order: the values tuple itself.
        def read(x):
            return tuple.__getitem__(x._kit_ctx, _VALUES)
    elif len(idx) == 2:
        i, j = idx

        def read(x):
            values = tuple.__getitem__(x._kit_ctx, _VALUES)
            return values[i], values[j]
    else:
        positions = tuple(idx)

        def read(x):
            values = tuple.__getitem__(x._kit_ctx, _VALUES)
            return tuple([values[i] for i in positions])

    read.__name__ = "read_" + "_".join(names)
    read.__qualname__ = f"{owner}.ctx_reader{names!r}"
    read.__doc__ = f"The meta value(s) {', '.join(names)} of a {owner} (see ctx_reader)."
    return read


def _rebuild_ctx(items):
    return tuple.__new__(SubclassCtx, items)


def canonical_value(v: Any) -> Any:
    """Map a meta value to JSON-able data that does not depend on the process.

    The one canonicaliser of the distribution (``guards``' own, which cache keys use), so a
    ctx renders the same here and in ``guards.cache_key``.

    Raises:
        guards.UnstableKeyError (a TypeError): the value has no process-independent form.

    Example:
        >>> canonical_value((1, "a", None))
        ['tuple', [1, 'a', None]]
    """
    return _canonical(v, where="a meta value")
