"""Guard checks: a dynamic-shape sweep compiles once; a meta change recompiles and stays right.

The sweep calls one ``torch.compile(dynamic=True)`` function on instances of three sizes: a
subclass that reads sizes in Python branches, or whose ctx holds a size, recompiles. The
instances come from the class's ``__dynamic_samples__`` when it has one; else, for a class
whose every inner shape is derived from the outer size, they are built from the first
sample at other first-dimension sizes (values cycled; inner shapes from
``__inner_shapes__``, or the "same dim" reading without it); a class with free inner dims
(see ``_sweep_samples``) is swept over its own samples of other sizes, or not at all.
Sizes are chosen so that no two dimensions change from equal to unequal between calls
(dynamo's duck sizing would recompile for that alone) and derived sizes stay above 1.

The meta change calls a compiled function on two samples of the same shape that differ
only in ctx: dynamo must recompile (it guards the ctx by ``==``) and the second result must
carry the second ctx; a ctx whose ``==`` ignores a field reuses the first graph and returns
stale metadata.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from .. import _compat
from ._compare import difference
from ._compiled import composite, compile_and_run, explain_error, guard_cases, usable_cases
from ._check import Check, Fail, Skip
from ._subject import describe, flatten, inner_shapes_for, resized
from . import _sweep_samples as own

__all__ = ["plan", "sweep_sizes"]

_CANDIDATES = 256


def plan(run) -> list:
    b = run.compile_backend()
    # Not gated on protocol.round_trip_symbolic: a class whose unflatten ignores outer_size
    # (torchao's) may still compile once over a sweep; the sweep says what really happens.
    req = ("protocol.flatten",)
    if not run.backends:
        off = _off("no compile backend selected")
        return [Check(f"compile.dynamic_sweep[{b}]", off, ()), Check(f"compile.meta_change[{b}]", off, ())]
    checks = []
    if run.dynamic:
        checks.append(Check(f"compile.dynamic_sweep[{b}]", _sweep, req))
    else:
        checks.append(Check(f"compile.dynamic_sweep[{b}]", _off("dynamic=False"), ()))
    checks.append(Check(f"compile.meta_change[{b}]", _meta_change, ("protocol.flatten",)))
    return checks


def _off(why):
    def check(run):
        raise Skip(f"turned off ({why})")

    return check


def _unfollowed_inners(x) -> list:
    """Inner tensors whose shape the "same dim" reading keeps fixed as dim 0 changes, for a
    class without ``__inner_shapes__`` (empty when it has one)."""
    if getattr(type(x), "__inner_shapes__", None) is not None or x.dim() == 0:
        return []
    try:
        grown = inner_shapes_for(x, (int(x.shape[0]) * 2,) + tuple(int(s) for s in x.shape[1:]))
    except Exception:
        return []
    out = []
    for n in flatten(x)[0]:
        v = getattr(x, n)
        if isinstance(v, torch.Tensor) and v.dim() > 0 and (grown or {}).get(n) == tuple(v.shape):
            out.append(n)
    return out


def _own_sizes(run, base) -> list:
    """The subject's samples like ``base`` (type, ctx, other dims) with distinct dim-0 sizes >= 2."""
    ctx = flatten(base)[1]
    seen, out = set(), []
    for x in run.samples:
        try:
            same = type(x) is type(base) and x.dim() == base.dim() and bool(flatten(x)[1] == ctx)
        except Exception:
            same = False
        if same and tuple(x.shape[1:]) == tuple(base.shape[1:]) and int(x.shape[0]) >= 2 and int(x.shape[0]) not in seen:
            seen.add(int(x.shape[0]))
            out.append(x)
    return out


def _ctx_follows_size(run, base) -> bool:
    """True when a sample differing from ``base`` only in dim 0 carries another ctx."""
    ctx = flatten(base)[1]
    for x in run.samples:
        if type(x) is type(base) and x.dim() == base.dim() and tuple(x.shape[1:]) == tuple(base.shape[1:]) \
                and int(x.shape[0]) != int(base.shape[0]):
            try:
                if not bool(flatten(x)[1] == ctx):
                    return True
            except Exception:
                return False
    return False


def _all_sizes(x, m) -> tuple:
    """Outer sizes then every inner size, for first-dim size ``m``."""
    new = (m,) + tuple(int(s) for s in x.shape[1:])
    shapes = inner_shapes_for(x, new)
    out = list(new)
    for n in flatten(x)[0]:
        out.extend((shapes or {}).get(n, ()))
    return tuple(out)


def _pattern(sizes) -> tuple:
    first: dict[int, int] = {}
    return tuple(first.setdefault(s, i) for i, s in enumerate(sizes)) + tuple(s <= 1 for s in sizes)


def sweep_sizes(x, count: int = 3) -> list:
    """``count`` first-dim sizes >= 2 for which every dimension of ``x`` keeps the same
    equality pattern and 0/1-ness, preferring the pattern with fewest size-1 dims.

    Example:
        >>> import torch
        >>> from torch.testing._internal.two_tensor import TwoTensor
        >>> sweep_sizes(TwoTensor(torch.ones(4, 6), torch.ones(4, 6)))
        [4, 132, 259]
    """
    start = max(2, int(x.shape[0]))
    groups: dict = {}
    for m in range(start, start + _CANDIDATES):
        try:
            key = _pattern(_all_sizes(x, m))
        except Exception:
            continue
        groups.setdefault(key, []).append(m)
    ok = [(sum(k[len(k) // 2 :]), ms[0], ms) for k, ms in groups.items() if len(ms) >= count]
    if not ok:
        return []
    _, _, ms = min(ok)
    picks = [ms[0], ms[len(ms) // 2], ms[-1]] if count == 3 else ms[:count]
    return sorted(set(picks))


_TRIES = 12  # sizes tried (built and run eagerly) before the sweep gives up


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:120]


def _buildable(base, fn, wanted, tried) -> tuple:
    """The first 3 of ``wanted`` outer sizes the class can build and run eagerly; the others
    go to ``tried`` with the reason (a size the class cannot have is not the author's bug)."""
    xs, sizes = [], []
    for size in wanted[:_TRIES]:
        try:
            x = resized(base, size)
        except Exception as e:
            tried.append(f"{'x'.join(map(str, size))} (cannot build: {type(e).__name__}: {_first_line(e)})")
            continue
        if not own.runs(fn, x, "x".join(map(str, size)), tried):
            continue
        xs.append(x)
        sizes.append(size)
        if len(xs) == 3:
            break
    return xs, sizes


def sweep_candidates(x) -> list:
    """First-dim sizes to try for the sweep, best first: :func:`sweep_sizes`' three, the rest
    of their size pattern spread out, then multiples of the sample's own size that keep it
    (a class whose numel must be a multiple of a block can hold those)."""
    start = max(2, int(x.shape[0]))
    groups: dict = {}
    for m in list(range(start, start + _CANDIDATES)) + [start * k for k in (2, 3, 4, 5, 6, 8)]:
        try:
            groups.setdefault(_pattern(_all_sizes(x, m)), []).append(m)
        except Exception:
            continue
    ok = [(sum(k[len(k) // 2 :]), ms[0], ms) for k, ms in groups.items() if len(ms) >= 3]
    if not ok:
        return []
    _, _, ms = min(ok)
    first = sweep_sizes(x)
    multiples = [m for m in ms if m > start and m % start == 0]
    spread = ms[:: max(1, len(ms) // 8)]
    out = []
    for m in first + multiples + spread:
        if m not in out:
            out.append(m)
    return out


def _sweep(run):
    cases = usable_cases(run, run.compile_backend())
    if not cases:
        raise Skip("no op passed its eager check, so there is nothing to compile")
    base = next((x for x in run.samples if x.dim() >= 1), None)
    if base is None:
        raise Skip("every sample is 0-dimensional; there is no size to sweep")
    fn = composite(guard_cases(cases))
    fixed = _unfollowed_inners(base)
    hook = getattr(run.cls, "__valid_sizes__", None)
    free = own.free_dims(base)
    tried: list = []
    if getattr(run.cls, own.HOOK, None) is not None:
        # The class builds valid instances itself, free inner dims (total tokens) varied too.
        xs = own.from_hook(run.cls, base, fn, _TRIES, tried)
        if len(xs) < 2:
            skipped = f"; skipped {'; '.join(tried)}" if tried else ""
            raise Skip(f"{run.name}.{own.HOOK} gave {len(xs)} usable instance(s), 2 or more needed{skipped}")
        return _run_sweep(run, fn, xs, [own.show(x, free) for x in xs], own.HOOK, tried, free)
    if free:
        # Inner data the outer size does not determine (offsets): resizing would cycle it
        # into instances the class never builds. Only the user's own samples are valid.
        xs = own.own_samples(run.samples, base, tried)
        if len(xs) < 2:
            what = ", ".join(f"{n}.size({d})" for n, d in free[:4])
            raise Skip(
                f"{run.name} has inner dims that __inner_shapes__ does not derive from the outer size ({what}), "
                "so the checker cannot build valid instances of other sizes (cycling inner values would build "
                f"invalid ones), and its samples hold {len(xs)} size(s) of one ctx. Fix: give {run.name} a "
                f"`{own.HOOK}(cls, sample)` classmethod yielding valid instances like sample at other sizes "
                "(varying every dim that may vary, free inner dims too)"
            )
        return _run_sweep(run, fn, xs, [own.show(x, free) for x in xs], "samples", tried, free)
    if hook is not None:
        # The class says which sizes it can hold (NF4: numel a multiple of 64 * 256).
        wanted = [tuple(int(v) for v in size) for size in itertools.islice(hook(base), _TRIES)]
        xs, sizes = _buildable(base, fn, wanted, tried)
        source = "__valid_sizes__"
    elif fixed:
        # Without __inner_shapes__ the checker cannot know how these inners grow with dim 0
        # (torchao's OptimState8bit keeps a flat scale of rows*cols/256): resizing would make
        # instances the class never builds. Sweep over the user's own samples instead.
        xs = _own_sizes(run, base)
        if len(xs) < 2 and _ctx_follows_size(run, base):
            raise Skip(
                f"{run.name}'s ctx changes with dim 0 (samples of other sizes carry another ctx: "
                "the class stores its shape there), and dynamo compares the ctx with ==, so every "
                "new size recompiles: dim 0 cannot be dynamic for this class"
            )
        if len(xs) < 2:
            raise Skip(
                f"inner {fixed[0]!r} of {describe(base)} does not follow dim 0 and {run.name} has no "
                "__inner_shapes__, so the checker cannot build other sizes; pass samples of two or "
                "more dim-0 sizes with the same ctx (or define __inner_shapes__)"
            )
        # (str for a jagged dim: a nested int has no int value)
        sizes = [tuple(str(v) if _compat.is_nested_int(v) else int(v) for v in x.shape) for x in xs]
        source = "samples"
    else:
        rest = tuple(base.shape[1:])  # as they are (a jagged dim's nested int has no int value)
        wanted = [(m,) + rest for m in sweep_candidates(base)]
        if len(wanted) < 3:
            raise Skip(f"could not find 3 sizes for dim 0 of {describe(base)} that keep its size pattern")
        xs, sizes = _buildable(base, fn, wanted, tried)
        source = "dim 0"
    skipped = f"; skipped {'; '.join(tried)}" if tried else ""
    if len(xs) < 3 and source != "samples":
        raise Skip(
            f"found {len(xs)} size(s) {sizes} that {run.name} can build and run eagerly, 3 needed{skipped}. "
            f"Give {run.name} a `__valid_sizes__(cls, like)` classmethod yielding outer sizes it can hold"
        )
    return _run_sweep(run, fn, xs, ["x".join(str(v) for v in s) for s in sizes], source, tried, free)


def _run_sweep(run, fn, xs, shown, source, tried, free) -> str:
    """Compile ``fn`` once with dynamic shapes and call it on every instance of ``xs``."""
    sizes = "[" + ", ".join(shown) + "]"
    skipped = f"; skipped {'; '.join(tried)}" if tried else ""
    backend = run.compile_backend()
    _compat.dynamo_reset()
    cnt: Any = None
    cfn: Any = None
    for x in xs:
        expected = fn(x)
        try:
            if cfn is None:
                got, cnt, cfn = compile_and_run(fn, (x,), backend=backend, dynamic=True)
            else:
                got = cfn(x)
        except Exception as e:
            what, fix = explain_error(e, backend=backend, where=f"{describe(x)} with dynamic shapes (sizes {sizes})")
            raise Fail(what, fix) from None
        d = difference(got, expected)
        if d:
            raise Fail(
                f"with dynamic shapes, the compiled result for {describe(x)} differs from eager: {d}",
                "derive inner shapes from outer_size with plain arithmetic (symbolic.ceil_div), "
                "and check them with torch._check, never with Python branches",
            )
    if cnt.frame_count != 1:
        reasons = _compat.guard_failure_reasons()
        raise Fail(
            f"a dynamic-shape sweep over sizes {sizes} (from {source}) compiled {cnt.frame_count} frames "
            f"instead of 1" + (f"; dynamo's reason: {reasons[-1].strip()[:240]}" if reasons else ""),
            "do not branch in Python on sizes in handlers or the constructor (use torch._check), "
            "and keep sizes out of the ctx (it is guarded by ==)",
        )
    what = ""
    if source in (own.HOOK, "samples") and free is not None:
        moved, kept = own.varied(xs, free)
        what = f"; varied {', '.join(moved) or 'nothing'}" + (f", not varied {', '.join(kept)}" if kept else "")
    return f"sizes {sizes} (from {source}): 1 frame{what}{skipped}"


def _differs(a, b) -> bool:
    try:
        if not bool(a == b):
            return True
    except Exception:
        return True
    return repr(a) != repr(b)


def _meta_change(run):
    cases = usable_cases(run, run.compile_backend())
    if not cases:
        raise Skip("no op passed its eager check, so there is nothing to compile")
    x0 = run.first
    ctx0 = flatten(x0)[1]
    if ctx0 is None:
        raise Skip(f"{run.name} has no meta (its ctx is None), so there is nothing to change")
    x1 = next(
        (
            x
            for x in run.samples[1:]
            if tuple(x.shape) == tuple(x0.shape) and x.dtype == x0.dtype and _differs(flatten(x)[1], ctx0)
        ),
        None,
    )
    if x1 is None:
        raise Skip(
            f"no two samples of the same shape differ in ctx; add one to {run.name}.__samples__ "
            "(the same data with another meta value) to exercise the ctx guard"
        )
    ctx1 = flatten(x1)[1]
    backend = run.compile_backend()
    fn = composite(guard_cases(cases))
    _compat.dynamo_reset()
    try:
        got0, cnt, cfn = compile_and_run(fn, (x0,), backend=backend)
        got1 = cfn(x1)
    except Exception as e:
        what, fix = explain_error(e, backend=backend, where=f"{describe(x0)} then {describe(x1)}")
        raise Fail(what, fix) from None
    d = difference(got1, fn(x1))
    frames = cnt.frame_count
    if frames < 2 or d:
        how = "did not recompile" if frames < 2 else "recompiled"
        raise Fail(
            f"after the ctx changed from {ctx0!r:.70} to {ctx1!r:.70}, dynamo {how}"
            + (f" and the compiled result is wrong: {d}" if d else "")
            + (f"; ctx == reports them {'equal' if not _differs_eq(ctx0, ctx1) else 'different'}" if frames < 2 else ""),
            "make the ctx's == compare every meta value (a tuple or frozen dataclass of them), "
            "since dynamo guards wrapped inputs by ctx equality",
        )
    return f"ctx change recompiled ({frames} frames) and matched eager"


def _differs_eq(a, b) -> bool:
    try:
        return not bool(a == b)
    except Exception:
        return True
