"""``GuardSet`` and ``build``: what must hold of an input for a compiled artifact to serve it.

A GuardSet lists the guards dynamo would install for a value (see ``_collect``), compiles
one Python function that checks them all (``.code``), and explains a failure one line per
failed guard, naming the source as dynamo does (``L['x'].a.scale.size()[0]``).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from . import _compat
from ._autodynamic import FrameState
from ._codegen import CodeGen
from ._collect import Collected, collect
from ._kinds import Guard, TensorMatch
from ._sources import ROOT, ArgSource, Source, descends_from

__all__ = ["GuardSet", "build", "KEY_VERSION"]

# Version of the canonical form ``cache_key`` hashes; bump when that form changes.
KEY_VERSION = 1

# Kinds whose failure is most likely; emitted first so a failing check returns early.
_EARLY = ("type", "len", "keys", "names", "value", "ctx", "dtensor_spec")


class GuardSet:
    """The guards for one input (or one call's inputs), checkable in a few microseconds.

    Build one with ``guards.build``. ``check`` runs generated code (``code``); ``explain``
    returns one line per failed guard, empty when ``check`` passes.

    Example:
        >>> import torch, guards
        >>> gs = guards.build(torch.ones(4, 3))
        >>> gs.check(torch.zeros(4, 3)), gs.check(torch.zeros(5, 3))
        (True, False)
        >>> gs.explain(torch.zeros(5, 3))
        ["L['x'].size()[0]: expected 4, got 5"]
    """

    def __init__(self, collected: Collected, *, render: Callable[[Source], str], compile: bool = True):
        self._guards: tuple[Guard, ...] = tuple(collected.guards)
        self._render = render
        self._tensor_matches = tuple(collected.tensor_matches)
        self._fn: Callable[[Any], bool] = _not_compiled
        self._code: str | None = None
        if compile:
            self._compile(collected)

    # -- code generation ---------------------------------------------------------------
    def _compile(self, collected: Collected) -> None:
        cg = CodeGen("check")
        early = [g for g in self._guards if g.kind in _EARLY]
        late = [g for g in self._guards if g.kind not in _EARLY and not isinstance(g, TensorMatch)]
        for g in early:
            g.emit(cg)
        tms = list(self._tensor_matches)
        if tms:
            examples = collected.examples
            fn = None
            if examples is not None:
                fn = _compat.tensor_guards(examples, [list(t.sizes) for t in tms], [list(t.strides) for t in tms])
            if fn is not None:
                args = ", ".join(cg.var(t.source) for t in tms)
                cg.check(f"{cg.const(fn, 'TG')}({args})", "TENSOR_MATCH for every tensor")
            else:
                for t in tms:
                    _emit_tensor_match_py(cg, t)
        for g in late:
            g.emit(cg)
        self._fn, self._code = cg.compile()

    # -- public ------------------------------------------------------------------------
    @property
    def code(self) -> str | None:
        """The generated Python source of ``check`` (None for a set built only for its key)."""
        return self._code

    @property
    def guards(self) -> tuple:
        """The guards, in the order dynamo would install them."""
        return self._guards

    def check(self, value: Any) -> bool:
        """True when every guard holds for ``value``; never raises.

        Example:
            >>> import torch, guards
            >>> guards.build([1, torch.ones(2)]).check([1, torch.ones(2)])
            True
        """
        return self._fn(value)

    def explain(self, value: Any) -> list[str]:
        """One line per failed guard: ``<source>: expected <e>, got <a>``; empty when it passes.

        A structure that differs (another type, length, key set or inner tensors) is one
        line for the container; guards below it are not reported.

        Example:
            >>> import torch, guards
            >>> guards.build((torch.ones(2), 3)).explain((torch.ones(2), 4))
            ["L['x'][1]: expected 3 (int), got 4 (int)"]
        """
        r = self._render
        lines: list[str] = []
        broken: list[Source] = []
        for g in self._guards:
            nodes = g.nodes
            if broken and any(descends_from(n, b) for n in nodes for b in broken):
                continue
            try:
                failed = g.failures(value, r)
            except Exception as e:  # a source could not be read: the structure differs
                lines.append(f"{r(nodes[0])}: could not be read ({type(e).__name__}: {e})")
                broken.extend(nodes)
                continue
            if failed:
                lines.extend(failed)
                if g.structural:
                    broken.append(g.source)  # type: ignore[attr-defined]  # a structural guard has one
        if not lines and not self.check(value):
            # Only torch's C++ TENSOR_MATCH sees some differences (e.g. dispatch keys under
            # another TLS state); say so rather than return an empty explanation.
            lines.append("TENSOR_MATCH: torch's C++ tensor check failed on a property not compared in Python")
        return lines

    def describe(self) -> list[str]:
        """One line per guard, human readable (what ``subclass-kit explain`` prints).

        Example:
            >>> import torch, guards
            >>> guards.build(3).describe()
            ["L['x'] == 3"]
        """
        return [g.describe(self._render) for g in self._guards]

    def canonical(self) -> dict:
        """Process-independent JSON-able form of the guards (what ``cache_key`` hashes)."""
        out = []
        for g in self._guards:
            c = g.canonical(self._render)
            if c is not None:
                out.append(c)
        return {"version": KEY_VERSION, "guards": out}

    def __len__(self) -> int:
        return len(self._guards)

    def __repr__(self) -> str:
        return f"GuardSet({len(self._guards)} guards)"

    def __str__(self) -> str:
        return "\n".join(self.describe())


def _not_compiled(value: Any) -> bool:
    raise TypeError("this GuardSet was built only for its cache key (compile=False); it has no check")


def _emit_tensor_match_py(cg: CodeGen, t: TensorMatch) -> None:
    """Python fallback for TENSOR_MATCH when torch's C++ TensorGuards is unavailable."""
    v = cg.var(t.source)
    cg.check(f"type({v}) is {cg.const(t.cls, 'T')}")
    cg.check(f"{v}.dtype == {cg.const(t.dtype, 'dt')} and {v}.device == {cg.const(t.device, 'dv')}")
    cg.check(f"{v}.requires_grad is {t.requires_grad} and {v}.dim() == {len(t.sizes)}")
    s = cg.sizes(t.source)
    for i, e in enumerate(t.sizes):
        if e is not None:
            cg.check(f"{s}[{i}] == {e}")
    st = cg.strides(t.source)
    for i, e in enumerate(t.strides):
        if e is not None:
            cg.check(f"{st}[{i}] == {e}")


def _renderer(name: str) -> Callable[[Source], str]:
    root = f"L[{name!r}]"
    return lambda s: s.render(root)


def _build(roots, *, name: str, dynamic, state: FrameState | None, compile: bool = True) -> GuardSet:
    render = _renderer(name)
    collected = collect(roots, dynamic=dynamic, state=state, render=render)
    if compile:
        # Example tensors for torch's C++ TENSOR_MATCH; held only while compiling.
        collected.examples = [tm.source(_root_value(roots)) for tm in collected.tensor_matches]
    gs = GuardSet(collected, render=render, compile=compile)
    collected.examples = None
    return gs


def _root_value(roots):
    """What ``check`` receives: the value itself, or the tuple of a call's arguments."""
    if len(roots) == 1 and roots[0][0] is ROOT:
        return roots[0][1]
    return tuple(v for _, v, _ in roots)


def build(value: Any, *, name: str = "x", policy: Any = None, dynamic: bool | None = None) -> GuardSet:
    """The guards dynamo would install for ``value`` passed as argument ``name``.

    Covers tensors, wrapped tensors (recursively through ``__tensor_flatten__``) and
    pytrees (lists, tuples, dicts) of them: type identity, ctx equality, per tensor dtype,
    device, requires_grad, rank, static sizes and strides; for dynamic dims the range and
    dynamo's own rules (0/1 specialization, duck sizing, strides inferred from sizes), and
    ``__inner_shapes__`` relations for classes that declare them. Non-tensor leaves are
    guarded by value (ints, floats, strings, None, dtypes) or by type (other objects).

    Args:
        value: the input.
        name: the parameter name it is rendered under (``L['x']``).
        policy: a ``symbolic.SubclassPolicy`` (or ``{dim: Dim}`` for a plain tensor; for a
            pytree, the same structure with a policy per tensor); None reads the marks the
            tensors carry (``torch._dynamo.mark_dynamic`` / ``symbolic.mark_dynamic``).
        dynamic: as ``torch.compile(dynamic=...)``: True makes unmarked dims duck-sized
            symbols; None and False keep them static (a first compile).

    Returns:
        A compiled ``GuardSet``.

    Raises:
        UnhashableContextError: a wrapper's ctx cannot be deep-copied, as dynamo does to guard on it
            (names the class). A ctx need not be hashable: it is compared with ``==``.
        PolicyViolationError: the input contradicts its marks (dynamo would refuse it).

    Example:
        >>> import torch, guards
        >>> x = torch.ones(8, 3); torch._dynamo.mark_dynamic(x, 0)
        >>> gs = guards.build(x)
        >>> gs.check(torch.ones(100, 3)), gs.check(torch.ones(1, 3))
        (True, False)
        >>> gs.explain(torch.ones(1, 3))
        ["L['x'].size()[0]: expected >= 2, got 1"]
    """
    return _build([(ROOT, value, policy)], name=name, dynamic=dynamic, state=None)


def build_call(args: Sequence[Any], names: Sequence[str], *, policies: Sequence[Any] | None = None,
               dynamic: bool | None = None, state: FrameState | None = None) -> GuardSet:
    """The guards for one call's positional ``args``, bound to parameter ``names``.

    ``check``/``explain`` then take the tuple of arguments. Used by ``GuardedDispatcher``
    and ``explain_recompiles``.

    Example:
        >>> import torch, guards
        >>> gs = guards.build_call((torch.ones(2), torch.ones(3)), ("a", "b"))
        >>> gs.explain((torch.ones(2), torch.ones(4)))
        ["L['b'].size()[0]: expected 3, got 4"]
    """
    policies = list(policies) if policies is not None else [None] * len(args)
    roots = [(ArgSource(i, n), a, p) for i, (a, n, p) in enumerate(zip(args, names, policies))]
    return _build(roots, name="x", dynamic=dynamic, state=state)
