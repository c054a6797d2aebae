"""The operator sweep: torch's OpInfo database run through a wrapper subclass.

``sweep_ops(from_plain)`` takes every op in torch's OpInfo database (or the ones named),
draws each op's sample inputs (a dense dtype, by default float32), turns the sample's
tensors into the subclass with ``from_plain``, runs the op, and compares the result with
the same op on the dense values the subclass holds (``to_plain`` of the converted
arguments, so a lossy class such as int8 ScaledTensor is judged on what it stores). Ops
whose forward passes are then run backward, and their input gradients compared too.

Each op ends in one :class:`OpResult` outcome:

- ``pass``: every sample (forward, and backward when the op is differentiable) matched;
- ``wrong``: a result or gradient differs from the dense op (a silent wrong answer: the
  dangerous case, a failure);
- ``error``: the subclass raised where the dense op did not (a failure);
- ``timeout``: the op did not finish within ``timeout`` seconds (a failure);
- ``unsupported``: the subclass raised ``NotImplementedError`` (``UnsupportedOpError``):
  a clear refusal, not a failure;
- ``skip``: the op could not be judged (the dtype is not supported, ``from_plain``
  built no sample, the dense op itself raised), with the reason.

The hook: a class offers ``from_plain(dense) -> instance`` as a classmethod (the kit's
exemplars do); a distributed class takes its layout as keyword arguments, bound with
``functools.partial`` (``partial(ShardedTensor.from_plain, mesh=mesh, placements=[Shard(0)])``).
``from_plain`` may raise (``ValueError``, ``NotImplementedError``) for tensors it cannot
hold (a 2-D-only class given a 3-D sample); that sample is then skipped. The reverse,
``to_plain``, defaults to the instance's own ``to_plain()`` method.

The sweep is deterministic (same ops, samples and order on every call), so every rank of a
distributed world runs the same collectives in the same order.
"""

from __future__ import annotations

import difflib
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .. import _compat, pytree
from ._compare import _values
from ._mask import Reference, plain_mask, reference, result_care
from ._deadline import CheckTimeout, deadline

__all__ = ["sweep_ops", "OpResult", "OpSweep", "opinfo_ops", "OUTCOMES", "FAILING"]

PASS, WRONG, ERROR, TIMEOUT, UNSUPPORTED, SKIP = "pass", "wrong", "error", "timeout", "unsupported", "skip"
OUTCOMES = (PASS, WRONG, ERROR, TIMEOUT, UNSUPPORTED, SKIP)
FAILING = (WRONG, ERROR, TIMEOUT)


@dataclass(frozen=True)
class OpResult:
    """One op's outcome in a sweep: ``op`` (OpInfo name, ``name.variant``), ``outcome`` (one
    of :data:`OUTCOMES`), ``message``, the number of ``samples`` judged, ``backward``
    (``"pass"``, ``"wrong"``, ``"error"``, ``"skip"`` or ``""`` when not run) and ``seconds``."""

    op: str
    outcome: str
    message: str = ""
    samples: int = 0
    backward: str = ""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.outcome in FAILING

    def to_json(self) -> dict:
        return {"op": self.op, "outcome": self.outcome, "message": self.message, "samples": self.samples,
                "backward": self.backward, "seconds": round(self.seconds, 4)}


@dataclass
class OpSweep:
    """All :class:`OpResult` of one sweep, with a coverage summary.

    Example:
        >>> s = OpSweep("Demo", [OpResult("neg", "pass"), OpResult("sin", "unsupported", "no handler")])
        >>> s.summary()
        'Demo: 1 of 2 ops pass (0 wrong, 0 error, 0 timeout, 1 unsupported, 0 skip)'
    """

    subject: str
    results: list = field(default_factory=list)

    def by_outcome(self) -> dict:
        """``{outcome: [op names]}`` for every outcome."""
        out: dict = {o: [] for o in OUTCOMES}
        for r in self.results:
            out[r.outcome].append(r.op)
        return out

    @property
    def ok(self) -> bool:
        """True when no op was wrong, raised unexpectedly or timed out."""
        return not any(r.failed for r in self.results)

    def summary(self) -> str:
        """One line: how many ops pass of how many, and the other outcomes' counts."""
        b = self.by_outcome()
        rest = ", ".join(f"{len(b[o])} {o}" for o in OUTCOMES[1:])
        return f"{self.subject}: {len(b[PASS])} of {len(self.results)} ops pass ({rest})"

    def to_json(self) -> dict:
        b = self.by_outcome()
        return {"subject": self.subject, "ops": len(self.results), "counts": {o: len(v) for o, v in b.items()},
                "by_outcome": b, "results": [r.to_json() for r in self.results]}

    def markdown(self) -> str:
        """A Markdown coverage section: the counts, then the ops per outcome."""
        b = self.by_outcome()
        lines = [f"### OpInfo coverage: {self.subject}", "", f"{len(b[PASS])} of {len(self.results)} ops pass.", "",
                 "| outcome | ops | which |", "|---|---|---|"]
        for o in OUTCOMES:
            lines.append(f"| {o} | {len(b[o])} | {', '.join(b[o]) or '-'} |")
        return "\n".join(lines)


def _full_name(info) -> str:
    return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name


def opinfo_ops(names=None) -> list:
    """OpInfo entries of torch's database, all or those ``names`` lists (``"add"``,
    ``"nn.functional.linear"``; a name without a variant selects all its variants).

    Raises:
        ValueError: a name matches no OpInfo (the message suggests close names).

    Example:
        >>> [_full_name(o) for o in opinfo_ops(["neg", "addmm"])]
        ['addmm', 'addmm.decomposed', 'neg']
    """
    db = _compat.opinfo_db()
    if names is None:
        return db
    if isinstance(names, str):
        names = [n for n in names.split(",") if n.strip()]
    names = [n.strip() for n in names]
    known = {_full_name(o) for o in db} | {o.name for o in db}
    bad = [n for n in names if n not in known]
    if bad:
        hints = []
        for n in bad:
            close = difflib.get_close_matches(n, sorted(known), n=3)
            hints.append(f"{n!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        raise ValueError(f"no OpInfo named {', '.join(hints)}")
    want = set(names)
    return [o for o in db if _full_name(o) in want or o.name in want]


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:200]


class _NoSample(Exception):
    """from_plain could not build this sample."""


def _convert(value, from_plain, dtype, lay_out=None):
    """The sample's tensors of ``dtype`` as subclass instances; returns (converted, count).
    The sample's primary input must convert; other tensors stay dense when they cannot.
    With ``lay_out``, it converts the sample's tensors (all of them, primary input first)."""
    if lay_out is not None:
        return _lay_out(value, lay_out)
    count = [0]

    def one(t, must: bool):
        if type(t) is not torch.Tensor or t.dtype != dtype:
            return t
        try:
            out = from_plain(t.detach().clone())
        except Exception as e:
            if must:
                raise _NoSample(f"from_plain refused a {tuple(t.shape)} {t.dtype} tensor ({type(e).__name__}: {_first_line(e)})") from None
            return t
        count[0] += 1
        return out.requires_grad_() if t.requires_grad else out

    inp, args, kwargs = value
    first = pytree.tree_map_only(torch.Tensor, lambda t: one(t, True), inp)
    rest = pytree.tree_map_only(torch.Tensor, lambda t: one(t, False), (args, kwargs))
    if count[0] == 0:
        raise _NoSample("the sample has no tensor of the sweep's dtype")
    return (first, rest[0], rest[1])


def _lay_out(value, lay_out):
    leaves, spec = pytree.tree_flatten(value)
    where = [i for i, t in enumerate(leaves) if type(t) is torch.Tensor]
    dense = [leaves[i].detach().clone() for i in where]
    try:
        laid = lay_out(dense)
    except Exception as e:
        raise _NoSample(f"lay_out refused the sample ({type(e).__name__}: {_first_line(e)})") from None
    if laid is None:
        raise _NoSample("lay_out does not apply to the sample")
    if len(laid) != len(where):
        raise TypeError(f"lay_out returned {len(laid)} values for {len(where)} tensors; return one per tensor")
    for i, t in zip(where, laid):
        leaves[i] = t.requires_grad_() if leaves[i].requires_grad and t.is_floating_point() else t
    return pytree.tree_unflatten(leaves, spec)


def _is_wrapped(t) -> bool:
    return isinstance(t, torch.Tensor) and type(t) is not torch.Tensor and _compat.is_traceable_wrapper_subclass(t)


def _densify(value, to_plain):
    def one(t):
        if not _is_wrapped(t):
            return t
        d = to_plain(t)
        return d

    return pytree.tree_map_only(torch.Tensor, one, value)


def _leaf_dense(value, to_plain):
    """Dense leaves for the reference call (gradient-tracking when the wrapped one is)."""

    def one(t):
        if not _is_wrapped(t):
            return t
        d = to_plain(t).detach().clone()
        return d.requires_grad_() if t.requires_grad and d.is_floating_point() else d

    return pytree.tree_map_only(torch.Tensor, one, value)


def _diff(actual, expected, path: str = "result", values: bool = True, tol=None, care=None):
    """First difference between a densified result and the dense one, or None (``tol``:
    ``{dtype: (rtol, atol)}`` overriding torch's default tolerances; ``care``: a list, one
    entry per tensor leaf, of the positions to compare (None: all), consumed in order)."""
    if isinstance(expected, torch.Tensor):
        c = care.pop(0) if care else None
        if c is not None and isinstance(actual, torch.Tensor) and actual.shape == expected.shape:
            c = c.expand(expected.shape)
            sub = _diff(actual.detach()[c], expected.detach()[c], path, values, tol)
            if sub is None:
                return None
            return _values(actual.detach(), expected.detach(), path, values, c) or sub
        if not isinstance(actual, torch.Tensor):
            return f"{path}: got {type(actual).__name__}, expected a tensor"
        if _is_wrapped(actual):
            return f"{path}: to_plain() returned a {type(actual).__name__}, expected a plain tensor"
        if expected.layout != torch.strided or actual.layout != torch.strided:
            return None
        rt = (tol or {}).get(expected.dtype)
        if rt is not None and values and actual.shape == expected.shape and actual.dtype == expected.dtype:
            try:
                torch.testing.assert_close(actual.detach(), expected.detach(), rtol=rt[0], atol=rt[1], equal_nan=True)
            except AssertionError as err:
                lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
                return f"{path}: values differ ({'; '.join(lines[1:4]) or lines[0]})"
            return None
        return _values(actual.detach(), expected.detach(), path, values)
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return f"{path}: got {type(actual).__name__}, expected {len(expected)} items"
        for i, (a, e) in enumerate(zip(actual, expected)):
            d = _diff(a, e, f"{path}[{i}]", values, tol, care)
            if d:
                return d
        return None
    if not values:
        return None
    try:
        same = bool(actual == expected) or (actual != actual and expected != expected)
    except Exception:
        same = False
    return None if same else f"{path}: {actual!r:.60}, expected {expected!r:.60}"


def _judged(info, conv, dense_args, o):
    """Per tensor leaf of the result, the positions a dense reference can judge when an
    input has don't-care positions (see ``_mask.reference``); None when none has."""
    wrapped = pytree.tree_leaves(conv)
    idx = [i for i, t in enumerate(wrapped) if _is_wrapped(t)]
    masks = [plain_mask(wrapped[i]) for i in idx]
    if all(m is None for m in masks):
        return None
    leaves, spec = pytree.tree_flatten(dense_args)

    def call(*ds):
        ls = [t.detach() if isinstance(t, torch.Tensor) else t for t in leaves]
        for i, d in zip(idx, ds):
            ls[i] = d
        a = pytree.tree_unflatten(ls, spec)
        _seeded(o)
        return info.op(a[0], *a[1], **a[2])

    with torch.no_grad():
        return reference(call, [leaves[i].detach() for i in idx], masks).judged


def _tensors(value) -> list:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _grad_leaves(value) -> list:
    return [t for t in _tensors(value) if t.requires_grad and t.is_leaf]


def _weights(outs, how, seed):
    if how == "ones":
        return [torch.ones_like(t) for t in outs]
    g = torch.Generator().manual_seed(seed or 0)
    return [torch.randn(t.shape, generator=g, dtype=t.dtype) for t in outs]


def _seeded(o):
    if o.seed is not None:
        _compat.seed_device(o.seed, o.device)


def _backward(conv, ref_args, ref, out, dense_out, to_plain, o):
    """None when the input gradients of the forward just judged (``out`` of ``conv``, ``ref``
    of ``ref_args``) match the dense ones; else ``(outcome, message)``. With don't-care
    positions (``__plain_mask__``), outputs' don't-care positions carry no gradient and
    inputs' are not compared."""
    ins, ref_ins = _grad_leaves(conv), _grad_leaves(ref_args)
    if not ins or len(ins) != len(ref_ins):
        return None
    try:
        ref_outs = [t for t in _tensors(ref) if t.requires_grad and (o.cotangent == "ones" or t.is_floating_point())]
        if not ref_outs:
            return None
        out_masks = [plain_mask(t) if _is_wrapped(t) else None for t in _tensors(out)
                     if t.requires_grad and (o.cotangent == "ones" or t.is_floating_point())]
        weights = [w if m is None or m.shape != w.shape else w * m.to(w.dtype)
                   for w, m in zip(_weights(ref_outs, o.cotangent, o.seed), out_masks + [None] * len(ref_outs))]
        ref_grads = torch.autograd.grad(ref_outs, ref_ins, weights, allow_unused=True)
    except Exception:
        return None  # the dense backward itself fails: nothing to judge
    try:
        # dense_out: the forward's densified result, reused so a gathering to_plain runs once.
        pairs = [(t, d) for t, d in zip(_tensors(out), _tensors(dense_out))
                 if t.requires_grad and (o.cotangent == "ones" or t.is_floating_point())]
        outs = [t for t, _ in pairs]
        if len(outs) != len(ref_outs):
            return WRONG, f"backward: {len(outs)} differentiable outputs, the dense op has {len(ref_outs)}"
        if o.cotangent == "ones":
            grads = torch.autograd.grad(outs, ins, [torch.ones_like(t) for t in outs], allow_unused=True)
        else:
            # The weighted sum of the densified outputs: to_plain's own backward is part of it.
            loss = sum((d * w).sum() for (_, d), w in zip(pairs, weights))
            grads = torch.autograd.grad(loss, ins, allow_unused=True)
    except NotImplementedError as e:
        return UNSUPPORTED, f"backward: {type(e).__name__}: {_first_line(e)}"
    except Exception as e:
        return ERROR, f"backward raised {type(e).__name__}: {_first_line(e)}"
    for i, (g, rg) in enumerate(zip(grads, ref_grads)):
        if rg is None or g is None:
            if (rg is None) != (g is None):
                return WRONG, f"backward: grad of input {i} is {'None' if g is None else 'set'}, dense is {'None' if rg is None else 'set'}"
            continue
        m = plain_mask(ins[i]) if _is_wrapped(ins[i]) else None
        d = _diff(_densify(g, to_plain), rg, f"grad[{i}]", tol=o.tolerances, care=[m] if m is not None else None)
        if d:
            return WRONG, f"backward: {d}"
    return None


@dataclass(frozen=True)
class _Options:
    lay_out: Any = None
    seed: int | None = None
    cotangent: str = "ones"
    tolerances: Any = None
    samples: Any = None
    on_sample: Any = None
    device: str = "cpu"


def _samples(info, device, dtype, requires_grad, o):
    it = _compat.opinfo_samples(info, device, dtype, requires_grad)
    return it if o.samples is None else o.samples(info, it)


def _sweep_one(info, from_plain, to_plain, dtype, device, max_samples, backward, o=_Options()):
    name = _full_name(info)
    if callable(dtype):
        dtype = dtype(info)
        if dtype is None:
            return OpResult(name, SKIP, "the dtype hook chose no dtype for the op")
    try:
        dtypes = info.supported_dtypes(torch.device(device).type)
    except Exception:
        dtypes = ()
    if dtype not in dtypes:
        return OpResult(name, SKIP, f"the op does not support {dtype} on {device}")
    judged, reasons, notes = 0, [], []
    try:
        # Drawn tracking gradients when they will run backward: the forward judged is the
        # one differentiated, so each sample runs through the subject once.
        samples = _samples(info, device, dtype, backward and info.supports_autograd and dtype.is_floating_point, o)
    except Exception as e:
        return OpResult(name, SKIP, f"OpInfo could not make samples ({type(e).__name__}: {_first_line(e)})")
    grad_mode = backward and info.supports_autograd and dtype.is_floating_point
    bwd = PASS if grad_mode else ""
    for sample in samples:
        if judged >= max_samples:
            break
        try:
            conv = _convert((sample.input, sample.args, sample.kwargs), from_plain, dtype, o.lay_out)
        except _NoSample as e:
            reasons.append(str(e))
            continue
        dense_args = _leaf_dense(conv, to_plain)
        try:
            _seeded(o)
            ref = info.op(dense_args[0], *dense_args[1], **dense_args[2])
            _seeded(o)
            again = info.op(dense_args[0], *dense_args[1], **dense_args[2])
        except Exception as e:
            reasons.append(f"the dense op raised {type(e).__name__}: {_first_line(e)}")
            continue
        # OpInfo's own flag first: two runs of an op returning uninitialized memory
        # (new_empty_strided) can return the same stale bytes, and the values then "differ"
        # from the wrapper's at random.
        deterministic = not getattr(info, "has_nondeterministic_output", False) and _diff(again, ref) is None
        try:
            _seeded(o)
            out = info.op(conv[0], *conv[1], **conv[2])
        except NotImplementedError as e:
            return OpResult(name, UNSUPPORTED, f"{type(e).__name__}: {_first_line(e)}", judged)
        except Exception as e:
            return OpResult(name, ERROR, f"raised {type(e).__name__} where the dense op did not: {_first_line(e)}", judged)
        try:
            # Inputs with don't-care positions (__plain_mask__): which result positions a
            # dense reference can judge.
            can_judge = _judged(info, conv, dense_args, o) if deterministic else None
        except Exception as e:
            return OpResult(name, SKIP, f"not judged: with the input's don't-care positions filled, the dense op "
                            f"gives {type(e).__name__}: {_first_line(e)}", judged)
        try:
            dense_out = _densify(out, to_plain)
            d = _diff(dense_out, ref, values=deterministic, tol=o.tolerances, care=result_care(out, can_judge))
        except Exception as e:
            return OpResult(name, ERROR, f"to_plain() of the result raised {type(e).__name__}: {_first_line(e)}", judged)
        if d:
            return OpResult(name, WRONG, f"sample {judged} ({_describe_sample(sample)}): {d}", judged)
        judged += 1
        if o.on_sample is not None:
            o.on_sample(conv)
        if not deterministic:
            if RANDOM_NOTE not in notes:
                notes.append(RANDOM_NOTE)
            bwd = ""  # random results have no dense gradient to compare with
            grad_mode = False
        if grad_mode and bwd == PASS and can_judge is not None and Reference(ref, can_judge).unjudged(out):
            bwd, grad_mode = SKIP, False
            notes.append(PARTLY_NOTE)
        if grad_mode and bwd == PASS:
            bad = _backward(conv, dense_args, ref, out, dense_out, to_plain, o)
            if bad is not None:
                outcome, msg = bad
                if outcome != UNSUPPORTED:
                    return OpResult(name, outcome, msg, judged, outcome)
                bwd = UNSUPPORTED
                notes.append(msg)
    if judged == 0:
        why = reasons[0] if reasons else "OpInfo gave no sample"
        return OpResult(name, SKIP, f"no sample could be judged: {why}")
    return OpResult(name, PASS, "; ".join(notes), judged, bwd)


RANDOM_NOTE = "random results: shapes and dtypes compared"
PARTLY_NOTE = ("some meaningful result positions depend on the input's don't-care positions: those were not "
               "compared, and the backward not judged")


def _describe_sample(sample) -> str:
    def d(v):
        if isinstance(v, torch.Tensor):
            return f"{tuple(v.shape)}"
        if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            return "[" + ", ".join(d(x) for x in v) + "]"
        return repr(v)[:20]

    parts = [d(sample.input)] + [d(a) for a in sample.args] + [f"{k}={d(v)}" for k, v in sample.kwargs.items()]
    return ", ".join(parts)


def sweep_op(info: Any, from_plain: Callable[[torch.Tensor], Any] | None = None, *,
             to_plain: Callable[[Any], torch.Tensor] | None = None,
             dtype: torch.dtype | Callable[[Any], torch.dtype | None] = torch.float32, device: str = "cpu",
             max_samples: int = 3, backward: bool = True, timeout: float | None = 30.0,
             lay_out: Callable[[list], list | None] | None = None, seed: int | None = None,
             cotangent: str = "ones", tolerances: dict | None = None,
             samples: Callable[[Any, Any], Any] | None = None,
             on_sample: Callable[[tuple], Any] | None = None) -> OpResult:
    """Run one OpInfo entry through the subclass (see :func:`sweep_ops` for the arguments);
    never raises for the op's behaviour: every outcome is an :class:`OpResult`.

    Example:
        >>> from subclass_kit.examples import TwoTensor
        >>> sweep_op(opinfo_ops(["neg"])[0], TwoTensor.from_plain, max_samples=1).outcome
        'pass'
    """
    if cotangent not in ("ones", "random"):
        raise ValueError(f"sweep_op: cotangent must be 'ones' or 'random', got {cotangent!r}")
    if from_plain is None and lay_out is None:
        raise TypeError("sweep_op needs from_plain (dense -> instance) or lay_out (a sample's tensors -> instances)")
    opts = _Options(lay_out, seed, cotangent, tolerances, samples, on_sample, device)
    to_plain = to_plain or _default_to_plain
    name = _full_name(info)
    t0 = time.perf_counter()
    try:
        # torch's own deprecation notices from the ops under test are not the subject's.
        with deadline(timeout, f"op {name}"), torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _compat.seed_device(0, device)
            res = _sweep_one(info, from_plain, to_plain, dtype, device, max_samples, backward, opts)
    except CheckTimeout as e:
        res = OpResult(name, TIMEOUT, str(e))
    except Exception as e:  # the sweep's own machinery met something unexpected: say so
        res = OpResult(name, ERROR, f"raised {type(e).__name__}: {_first_line(e)}")
    return OpResult(res.op, res.outcome, res.message, res.samples, res.backward, time.perf_counter() - t0)


def _default_to_plain(t):
    fn = getattr(t, "to_plain", None)
    if fn is None:
        raise TypeError(f"{type(t).__qualname__} has no to_plain(); pass to_plain= to sweep_ops")
    return fn()


def _resolve_from_plain(from_plain):
    if isinstance(from_plain, type):
        hook = getattr(from_plain, "from_plain", None)
        if hook is None:
            raise TypeError(
                f"{from_plain.__qualname__} has no from_plain(dense) classmethod, so the OpInfo sweep cannot "
                "build instances of it; add `@classmethod def from_plain(cls, t): ...` returning an instance "
                "that holds t, or pass a callable"
            )
        return hook, from_plain.__qualname__
    if not callable(from_plain):
        raise TypeError(f"sweep_ops takes a class with from_plain() or a callable dense -> instance; got {from_plain!r}")
    owner = getattr(getattr(from_plain, "func", from_plain), "__self__", None)
    name = owner.__qualname__ if isinstance(owner, type) else getattr(from_plain, "__qualname__", "subject")
    return from_plain, name


def sweep_ops(from_plain: Callable[[torch.Tensor], Any] | None = None, *, ops: Sequence[Any] | str | None = None,
              to_plain: Callable[[Any], torch.Tensor] | None = None,
              dtype: torch.dtype | Callable[[Any], torch.dtype | None] = torch.float32,
              device: str = "cpu", max_samples: int = 3, backward: bool = True, timeout: float | None = 30.0,
              on_result: Callable[[OpResult], Any] | None = None, subject: Any = None,
              lay_out: Callable[[list], list | None] | None = None, seed: int | None = None,
              cotangent: str = "ones", tolerances: dict | None = None,
              samples: Callable[[Any, Any], Any] | None = None,
              on_sample: Callable[[tuple], Any] | None = None) -> OpSweep:
    """Run torch's OpInfo database through a wrapper subclass; say per op whether it is right.

    Args:
        from_plain: a class with a ``from_plain(dense)`` classmethod, or any callable that
            turns a dense tensor into an instance (``functools.partial`` binds a layout:
            ``partial(ShardedTensor.from_plain, mesh=mesh, placements=[Shard(0)])``).
        ops: OpInfo names to run (a list or a comma-separated string), or OpInfo entries
            themselves (a list of them: run exactly those, in that order); default: all.
        to_plain: instance -> dense tensor; default: the instance's ``to_plain()``. It may
            communicate (a distributed class gathers); every rank calls it alike.
        dtype, device: the samples' dtype and device (default float32 on CPU); ``dtype`` may
            be a callable ``OpInfo -> dtype`` (None: skip the op) to pick one per op.
        lay_out: instead of ``from_plain``, a per-sample hook: given every tensor of a
            sample (primary input first, any dtype), it returns their replacements (one per
            tensor: an instance, or the tensor to keep it dense), or None when the layout
            does not apply to the sample (it is skipped). A distributed class uses it to
            choose placements per operand (shard one operand, make one ``Partial``, ...).
        seed: seed torch's RNG with it before the dense call and before the subject's, so
            random ops are compared by value (default None: random results are compared by
            shape and dtype only, and not run backward).
        cotangent: ``"ones"`` (default) backpropagates ones from every differentiable
            output; ``"random"`` backpropagates a fixed random weighting (seeded with
            ``seed``) of the floating outputs through ``to_plain``, which catches gradients
            that are right in sum but misplaced.
        tolerances: ``{dtype: (rtol, atol)}`` replacing torch's default tolerances for those
            result dtypes (a distributed reduction sums in another order).
        samples: ``(OpInfo, sample iterator) -> iterable`` choosing which of an op's samples
            are tried (``lambda info, it: itertools.islice(it, 1)``: only the first, judged
            or skipped); ``max_samples`` still caps the judged ones.
        on_sample: called with each judged sample's converted arguments ``(input, args,
            kwargs)`` as soon as its forward matched the dense op (before its backward), so
            a caller can re-run the op on them (a timing pass).
        max_samples: samples judged per op (the first ones OpInfo yields).
        backward: also compare input gradients for ops whose forward passed.
        timeout: seconds per op (None or 0: no limit); a hang becomes a ``timeout`` outcome.
        on_result: called with each :class:`OpResult` as soon as it is known (read a
            per-op record there, such as which path the op took, and reset it).
        subject: the name in the summary (default: the class's).

    Returns:
        An :class:`OpSweep`: ``.results``, ``.by_outcome()``, ``.summary()``, ``.ok``,
        ``.to_json()``, ``.markdown()``.

    Example:
        >>> from subclass_kit.examples import TwoTensor
        >>> sweep = sweep_ops(TwoTensor, ops="neg,mul", max_samples=1)
        >>> [(r.op, r.outcome) for r in sweep.results]
        [('mul', 'pass'), ('neg', 'pass')]
    """
    if from_plain is None and lay_out is not None:
        make, name = None, getattr(lay_out, "__qualname__", "subject")
    else:
        make, name = _resolve_from_plain(from_plain)
    sweep = OpSweep(subject or name)
    infos = list(ops) if isinstance(ops, (list, tuple)) and ops and not isinstance(ops[0], str) else opinfo_ops(ops)
    for info in infos:
        res = sweep_op(info, make, to_plain=to_plain, dtype=dtype, device=device, max_samples=max_samples,
                       backward=backward, timeout=timeout, lay_out=lay_out, seed=seed, cotangent=cotangent,
                       tolerances=tolerances, samples=samples, on_sample=on_sample)
        sweep.results.append(res)
        if on_result is not None:
            on_result(res)
    return sweep
