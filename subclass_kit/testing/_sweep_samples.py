"""Where the dynamic sweep's instances of other sizes come from, when they must come from
the class: ``__dynamic_samples__``, or the user's own samples.

The checker builds other sizes itself (``_subject.resized``: inner values cycled, inner
shapes from ``__inner_shapes__``) only for a class whose every inner shape is derived from
the outer size. An inner tensor that ``__inner_shapes__`` leaves out, or a dim it marks
free (``symbolic.FREE``: total tokens of a packed batch), holds data the outer size does
not determine (offsets, lengths), and cycling its values builds instances the class would
never build. Such a class gives valid instances with the classmethod
``__dynamic_samples__(cls, sample)``: an iterable of instances like ``sample`` at other
sizes, varying every dim that may vary, free inner dims included.
"""

from __future__ import annotations

import itertools

import torch

from ._subject import flatten

__all__ = ["HOOK", "free_dims", "sizes_of", "from_hook", "own_samples", "varied", "runs"]

HOOK = "__dynamic_samples__"


def _free_marker():
    import symbolic

    return getattr(symbolic, "FREE", None)


def _is_free(s) -> bool:
    free = _free_marker()
    if free is not None and s is free:
        return True
    try:
        int(s)
    except Exception:
        return True
    return False


def free_dims(x) -> list | None:
    """The inner dims of ``x`` that ``__inner_shapes__`` does not derive from the outer size,
    as ``(name, dim)`` (every dim of an inner tensor it leaves out); None for a class without
    ``__inner_shapes__`` (the sweep's "same dim" reading applies).

    Example:
        >>> from subclass_kit.examples import BlockScaled
        >>> free_dims(BlockScaled.__samples__()[0])
        []
    """
    fn = getattr(type(x), "__inner_shapes__", None)
    if fn is None:
        return None
    names, ctx = flatten(x)
    try:
        shapes = fn(tuple(int(s) for s in x.shape), ctx) or {}
    except Exception:
        return None  # (a jagged outer size has no int value; a raising hook is reported elsewhere)
    out: list = []
    for n in names:
        v = getattr(x, n)
        if not isinstance(v, torch.Tensor):
            continue
        if n not in shapes:
            out.extend((n, d) for d in range(v.dim()))  # a 0-d one has nothing to vary
            continue
        out.extend((n, d) for d, s in enumerate(shapes[n]) if _is_free(s))
    return out


def sizes_of(x) -> tuple:
    """Outer sizes, then every inner tensor's sizes (in flatten order)."""
    out = [int(s) for s in x.shape]
    for n in flatten(x)[0]:
        v = getattr(x, n)
        if isinstance(v, torch.Tensor):
            out.extend(int(s) for s in v.shape)
    return tuple(out)


def _pattern(sizes) -> tuple:
    first: dict[int, int] = {}
    return tuple(first.setdefault(s, i) for i, s in enumerate(sizes)) + tuple(s <= 1 for s in sizes)


def show(x, free) -> str:
    """``3x7x4`` plus the free inner dims' sizes: ``3x7x4 (packed 15x4)``."""
    outer = "x".join(str(int(s)) for s in x.shape)
    names = sorted({n for n, _ in free or []}, key=flatten(x)[0].index)
    inner = ", ".join(f"{n} {'x'.join(str(int(s)) for s in getattr(x, n).shape)}" for n in names)
    return f"{outer} ({inner})" if inner else outer


def varied(xs, free) -> tuple:
    """``(varied, fixed)`` descriptions: outer dims and free inner dims that take more than
    one size across ``xs`` and those that keep one."""
    base = xs[0]
    moved: list = []
    kept: list = []
    for d in range(base.dim()):
        (moved if len({int(x.shape[d]) for x in xs}) > 1 else kept).append(f"dim {d}")
    for n, d in free or []:
        (moved if len({int(getattr(x, n).shape[d]) for x in xs}) > 1 else kept).append(f"{n}.size({d})")
    return moved, kept


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:120]


def runs(fn, x, what: str, tried: list) -> bool:
    """True when ``fn(x)`` runs eagerly; else the reason goes to ``tried`` (a size at which
    eager itself fails is not the class's compile bug)."""
    try:
        fn(x)
    except Exception as e:
        tried.append(f"{what} (eager itself raised {type(e).__name__}: {_first_line(e)})")
        return False
    return True


def from_hook(cls, base, fn, tries: int, tried: list) -> list:
    """Up to 3 instances from ``cls.__dynamic_samples__(base)`` that are instances of the
    class, run eagerly, and share one size pattern (dynamo's duck sizing and 0/1
    specialization recompile for a change of pattern alone); the others go to ``tried``."""
    good = []
    for i, x in enumerate(itertools.islice(getattr(cls, HOOK)(base), tries)):
        if type(x) is not type(base) or x.dim() != base.dim():
            got = f"a {type(x).__name__}" + (f" with {x.dim()} dims" if isinstance(x, torch.Tensor) else "")
            tried.append(f"instance {i} ({got}, expected a {type(base).__name__} with {base.dim()} dims)")
            continue
        if runs(fn, x, f"instance {i}", tried):
            good.append(x)
    return _one_pattern(good, tried)


def _one_pattern(xs, tried) -> list:
    groups: dict = {}
    for x in xs:
        groups.setdefault(_pattern(sizes_of(x)), []).append(x)
    if not groups:
        return []
    best = max(groups.values(), key=len)
    for x in xs:
        if not any(x is b for b in best):
            tried.append(f"{'x'.join(map(str, sizes_of(x)))} (another size pattern than "
                         f"{'x'.join(map(str, sizes_of(best[0])))}: a size equal to another one, or 0/1, where "
                         "the others differ; dynamo recompiles for that alone)")
    seen, out = set(), []
    for x in best:
        if sizes_of(x) not in seen:
            seen.add(sizes_of(x))
            out.append(x)
    return out[:3]


def own_samples(samples, base, tried: list) -> list:
    """Up to 3 of the user's samples like ``base`` (type, dims, ctx) at distinct sizes, outer
    or inner, of one size pattern."""
    ctx = flatten(base)[1]
    seen, out = set(), []
    for x in samples:
        try:
            same = type(x) is type(base) and x.dim() == base.dim() and bool(flatten(x)[1] == ctx)
        except Exception:
            same = False
        if same and sizes_of(x) not in seen:
            seen.add(sizes_of(x))
            out.append(x)
    return _one_pattern(out, tried)
