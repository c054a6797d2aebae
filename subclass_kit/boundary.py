"""``subclass_kit.compile``: a compile boundary where dynamo sees plain tensors only.

``torch.compile`` on a function of kit wrappers pays per call for dynamo's guards on each
wrapper (a metadata check that flattens it, a tensor check per inner tensor), AOTAutograd's
subclass wrapping, and building the output wrappers. The boundary does the guarding itself
(class, ctx and outer layout, the kit's own key), hands a compiled *body* the plain inner
tensors, and rebuilds the outputs with the class's ``make`` (see ``_boundary_trace.py`` and
``_boundary_record.py``). A call no kept entry serves builds one (``_boundary_entries.py``).

Calls it cannot serve go to plain ``torch.compile(fn)``, transparently: inputs that take part
in autograd, tensor subclasses that are not the kit's, ``explain`` says which. Arguments with
dims marked dynamic are served by one body for every size (``_boundary_dynamic.py``).
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import torch

from . import _compat
from ._boundary_direct import through_dynamo
from ._boundary_dynamic import carrier as _carrier
from ._boundary_entries import Entry, miss
from ._boundary_explain import explain_call, qual
from ._boundary_trace import PLAIN as _PLAIN, Unservable, collect, identity_check, param_getters, walk
from ._boundary_twins import twin_of
from .base import WrapperTensor
from .ctx import _PRESENT, CTX_ATTR as _CTX

__all__ = ["compile", "Boundary"]

_Tensor = torch.Tensor
_grad_on = _compat.is_grad_mode_on
_idle = _compat.dynamo_idle()
_LIVE = _compat.dynamo_live_codes()
#: kit classes without declared state: their instances are walked inline by ``__call__``
_FLAT_CLASSES: set = set()


def compile(fn_or_module: Callable | torch.nn.Module, /, *, backend: Any = "inductor", limit: int | None = None,
            fullgraph: bool = False, mode: str | None = None, options: dict | None = None) -> "Boundary":
    """Compile ``fn_or_module`` behind a boundary where dynamo sees plain tensors only.

    Kit wrappers among the arguments (positional or keyword, in lists, tuples and dicts) and
    among a module's parameters and buffers are taken apart by their class; the compiled
    function takes their plain inner tensors and rebuilds the wrappers inside the traced code,
    and wrapper outputs are rebuilt with the class's ``make``. Each call checks class, ctx and
    outer layout itself; a new combination compiles anew (at most ``limit`` artifacts, least
    recently used evicted). Calls it cannot serve (grad mode with wrapper inputs that require
    grad, foreign tensor subclasses, unhashable values) run ``torch.compile(fn_or_module)``;
    ``Boundary.explain`` says why.

    Args:
        fn_or_module: a function or an ``nn.Module``.
        backend, fullgraph, mode, options: as ``torch.compile`` (``dynamic=`` is not taken:
            unmarked arguments compile each layout with static shapes; arguments with dims
            marked dynamic share one body for every size, see ``_boundary_dynamic``).
        limit: at most this many artifacts (default ``torch._dynamo.config.recompile_limit``).

    Returns:
        A ``Boundary``, callable as ``fn_or_module``.

    Raises:
        TypeError: ``fn_or_module`` is not callable, or ``limit`` is not a positive int.

    Example:
        >>> import torch, subclass_kit
        >>> from subclass_kit.examples import TwoTensor
        >>> f = subclass_kit.compile(lambda x, y: x * y + x, backend="aot_eager")
        >>> x = TwoTensor(torch.ones(4), torch.zeros(4))
        >>> out = f(x, x)
        >>> type(out).__name__, out.a.tolist(), out.b.tolist()
        ('TwoTensor', [2.0, 2.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0])
    """
    return Boundary(fn_or_module, backend=backend, limit=limit, fullgraph=fullgraph, mode=mode, options=options)


class Boundary:
    """The callable ``subclass_kit.compile`` returns (see there); ``explain`` says what a call
    would get, ``entries`` how many artifacts it keeps."""

    def __init__(self, fn: Callable, *, backend: Any, limit: int | None, fullgraph: bool, mode: str | None,
                 options: dict | None) -> None:
        if not callable(fn):
            raise TypeError(f"subclass_kit.compile() takes a function or an nn.Module, got {type(fn).__name__}.")
        if limit is None:
            limit = _compat.recompile_limit()
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise TypeError(f"subclass_kit.compile(): limit must be a positive int, got {limit!r}.")
        self.fn = fn
        self.module = fn if isinstance(fn, torch.nn.Module) else None
        self.limit = limit
        self.evictions = 0
        self.fallback_calls = 0
        # Never dynamic=: in torch 2.13 it re-applies a config patch on every call (23-35 µs).
        self._opts: dict = {"backend": backend, "fullgraph": fullgraph}
        if mode is not None:
            self._opts["mode"] = mode
        if options is not None:
            self._opts["options"] = options
        self._fallback: Callable | None = None
        self._table: dict = {}
        self._n = 0
        self._clock = itertools.count(1)
        self._warned = False
        self._params: list = []  # (holder dict, attr, tensor, qualified name, owner) of wrapper params/buffers
        self._param_keys: dict = {}  # the parameters' signature -> its number in the table's keys
        self._param_key = 0
        self._param_outer: list = []
        self._param_recipes: list = []
        self._param_flat: list = []
        self._holder: torch.nn.Module | None = None  # the parameters' inner tensors as buffers
        self._twins: dict = {}  # (parameter recipes, owners) -> the module's twin the bodies call
        self._twin: Any = fn
        self._param_valid: Callable[[], bool] = lambda: True
        self._param_reason: str | None = None  # a parameter the boundary cannot take apart
        if self.module is not None:
            self._plan_params()

    # ---- the module's wrapper parameters and buffers ------------------------------------
    def _plan_params(self) -> None:
        plan = []
        assert self.module is not None
        for prefix, sub in self.module.named_modules(remove_duplicate=False):
            for holder in (sub._parameters, sub._buffers):
                for attr, t in holder.items():
                    if isinstance(t, WrapperTensor):
                        plan.append((holder, attr, t, f"{prefix}.{attr}" if prefix else attr, sub))
        self._params = plan
        # The parameters' part of every call, walked once: while each holder still holds the
        # same wrapper with the same ctx and inner tensors (``_param_valid``, one generated
        # frame), a call reuses it; only the outer layouts are checked again, with the rest.
        sig: list = []
        outer: list = []
        flat: list = []
        recipes: list = []
        self._param_reason = None
        for _, _, t, qual, _ in plan:
            try:
                recipes.append(walk(t, sig, [], flat, [], f"self.{qual}"))
            except Unservable as u:
                self._param_reason = u.reason
            outer.append(t)
        self._param_outer, self._param_flat, self._param_recipes = outer, flat, recipes
        # One holder for the boundary's life (compiled bodies read it): refilled in place.
        if self._holder is None:
            self._holder = torch.nn.Module()
        self._holder._buffers.clear()
        for i, t in enumerate(flat):
            self._holder.register_buffer(f"t{i}", t, persistent=False)
        edges: list = []
        if self._param_reason is None:
            # The bodies call a twin of the module (see _boundary_twins), one per parameter
            # layout and module tree; the twin is part of the key, so a body compiled for
            # one is never served for another.
            tkey = (tuple(recipes), tuple(m for _, m in self.module.named_modules(remove_duplicate=False)))
            got = self._twins.get(tkey)
            if got is None:
                getters = {(p[4], p[1]): g for p, g in zip(plan, param_getters(recipes, self._holder))}
                got = self._twins[tkey] = twin_of(self.module, getters)
            self._twin, edges = got
        self._param_key = self._param_keys.setdefault((tuple(sig), self._twin), len(self._param_keys))
        self._param_valid = identity_check(plan, edges)

    def _params_relaid(self) -> bool:
        """A wrapper parameter's layout changed in place since the plan (same objects: the
        identity check passes, the twin's getters would rebuild it with the old layout)."""
        flat: list = []
        return [walk(t, [], [], flat, [], "") for t in self._param_outer] != self._param_recipes

    def _walk_params(self, sig: list, checked: list, flat: list, names: list | None) -> list:
        if not self._param_valid():  # reassigned since: plan again
            self._plan_params()
        recipes = []
        for holder, attr, t, qual, _ in self._params:
            r = walk(t, sig, checked, flat, names, f"self.{qual}")
            if names is not None:
                recipes.append((qual, r))
        return recipes

    # ---- the call path ------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        sig: list = []
        checked: list = []
        flat: list = []
        sig_add, check_add, flat_add = sig.append, checked.append, flat.append
        try:
            # Inlined ``walk`` for the common arguments (a plain tensor, a wrapper of plain
            # tensors): this runs on every call, and a frame per tensor is a measurable part.
            for a in args:
                t = type(a)
                if t is _Tensor:
                    sig_add(_PLAIN)
                    check_add(a)
                    flat_add(a)
                elif t in _FLAT_CLASSES:
                    d = a.__dict__
                    ctx = d[_CTX]
                    sig_add(t)
                    sig_add(ctx)
                    check_add(a)
                    for n in ctx[_PRESENT]:
                        v = d[n]
                        if type(v) is _Tensor:
                            check_add(v)
                            flat_add(v)
                        else:
                            walk(v, sig, checked, flat, None, "", True)
                else:
                    if isinstance(a, WrapperTensor) and not t.__kit__.state_order:
                        _FLAT_CLASSES.add(t)
                    walk(a, sig, checked, flat, None, "")
            if kwargs:
                for k, v in kwargs.items():
                    sig.append(k)
                    walk(v, sig, checked, flat, None, "")
            if self._params:
                if not self._param_valid():
                    self._plan_params()
                if self._param_reason is not None:
                    raise Unservable(self._param_reason)
                sig.append(self._param_key)
                checked += self._param_outer
            key = tuple(sig)
            bucket = self._table.get(key)
        except Unservable:
            return self._run_fallback(args, kwargs)
        except TypeError:  # an unhashable value
            return self._run_fallback(args, kwargs)
        if bucket is not None:
            for e in bucket:
                if e.check(*checked) and (e.grad is None or e.grad is _grad_on()):
                    e.hits += 1
                    e.used = next(self._clock)
                    if e.compiled is None:
                        return self._run_fallback(args, kwargs)
                    if e.carry:
                        flat += [_carrier(checked[i]) for i in e.carry]
                    d = e.direct
                    if d is not None and d.runs and _idle() and d.codes[0] in _LIVE:
                        ft = tuple(flat)
                        loc = {"flat": ft}
                        for check, run in d.runs:
                            if check(loc):
                                out = run(*ft)
                                break
                        else:
                            out = through_dynamo(e, flat)
                    else:
                        out = through_dynamo(e, flat)
                    rec = e.record
                    if rec is not None and rec.unsafe is None and not rec.needs_inputs:
                        return rec.finish(out, None)
                    return self._finish(e, out, args, kwargs)
        return miss(self, key, checked, flat, args, kwargs)

    def _serve(self, e: Entry, flat: list, checked: list, args: tuple, kwargs: dict) -> Any:
        if e.compiled is None:
            return self._run_fallback(args, kwargs)
        return self._finish(e, through_dynamo(e, flat + [_carrier(checked[i]) for i in e.carry]), args, kwargs)


    def _finish(self, e: Entry, out: tuple, args: tuple, kwargs: dict) -> Any:
        rec = e.record
        if rec is None:  # pragma: no cover - dynamo traced the body without reaching the hook
            raise RuntimeError("subclass_kit.compile: the compiled body returned before its output was recorded.")
        if rec.unsafe is not None:
            # This call's output is rebuilt as recorded; later calls of this signature go to
            # torch.compile, which keeps what the record could not describe.
            e.compiled, e.reason = None, f"its output cannot be rebuilt outside the graph: {rec.unsafe}"
        return rec.finish(out, self._inputs(args, kwargs) if rec.needs_inputs else None)

    def _inputs(self, args: tuple, kwargs: dict) -> list:
        """The wrappers of a call in the order the body rebuilds them (children first)."""
        out: list = []
        for v in (*args, *kwargs.values()):  # a module's parameters are rebuilt by its twin, not recorded
            collect(v, out)
        return out

    def _body_for(self, *args: Any, **kwargs: Any) -> tuple:
        """(the compiled body that serves these arguments, its flat inputs): the bench's floor."""
        sig: list = []
        checked: list = []
        flat: list = []
        for a in args:
            walk(a, sig, checked, flat, None, "")
        for k, v in kwargs.items():
            sig.append(k)
            walk(v, sig, checked, flat, None, "")
        if self._params:
            sig.append(self._param_key)
            checked += self._param_outer
        for e in self._table.get(tuple(sig), ()):
            if e.compiled is not None and e.check(*checked):
                return e.compiled, flat + [_carrier(checked[i]) for i in e.carry]
        raise LookupError("no compiled body serves these arguments yet: call the boundary with them first")

    def _run_fallback(self, args: tuple, kwargs: dict) -> Any:
        self.fallback_calls += 1
        if self._fallback is None:
            self._fallback = torch.compile(self.fn, **self._opts)
        return self._fallback(*args, **kwargs)

    # ---- introspection ----------------------------------------------------------------
    @property
    def entries(self) -> int:
        """How many artifacts (compiled bodies and remembered fallbacks) are kept."""
        return len(self)

    def __len__(self) -> int:
        return sum(len(b) for b in self._table.values())

    def explain(self, *args: Any, **kwargs: Any) -> list[str]:
        """What a call with these arguments would get, one line per kept artifact.

        ``artifact i: accepts`` (or ``accepts, falls back to torch.compile: <why>``), or the
        first field that differs: ``artifact 0: args[0]: ctx.block: expected 32, got 16``,
        ``artifact 0: args[0].size(): expected (16, 16), got (8, 16)``. A call the boundary
        cannot take apart at all gives one ``falls back to torch.compile: <why>`` line.

        Example:
            >>> import torch, subclass_kit
            >>> from subclass_kit.examples import BlockScaled
            >>> f = subclass_kit.compile(lambda w: w * 2, backend="aot_eager")
            >>> _ = f(BlockScaled.from_float(torch.ones(64, 2), block=32))
            >>> f.explain(BlockScaled.from_float(torch.ones(64, 2), block=16))
            ['artifact 0: args[0]: ctx.block: expected 32, got 16']
        """
        return explain_call(self, args, kwargs)

    def __repr__(self) -> str:
        return f"<subclass_kit.compile of {qual(self.fn)}: {len(self)} artifacts, limit {self.limit}>"
