"""Backward checks: gradients through the subclass match the dense computation, eagerly and
compiled.

One differentiable op that passed its eager check is applied to a leaf sample; the
backward is seeded with ``ones_like`` of the output (a tangent of the output's own type
and metadata, as a downstream op would produce). Compiled, AOTAutograd traces the backward
with the tangent metadata it predicts from ``__coerce_tangent_metadata__``; when the
runtime tangent differs, the class needs ``__coerce_same_metadata_as_tangent__``.
"""

from __future__ import annotations

import torch

from .. import _compat
from ._compare import dense_difference, difference
from ._compiled import explain_error, usable_cases
from ._backward_ops import backward_ops
from ._check import Check, Fail, Skip
from ._mask import masked_fn, plain_mask, reference
from ._subject import dense, describe, flatten

__all__ = ["plan"]

_PREFERRED = ("aten.mul.Tensor(x, 2.0)", "aten.add.Tensor(x, x)", "aten.neg.default(x)")


def plan(run) -> list:
    if not run.backward:
        return [Check("backward.eager", _off, ()), Check(f"backward.compiled[{run.compile_backend()}]", _off, ())]
    if not run.backends:
        return [
            Check("backward.eager", _eager, ("protocol.flatten",)),
            Check("backward.compiled[none]", _no_backend, ()),
        ]
    return [
        Check("backward.eager", _eager, ("protocol.flatten",)),
        Check(f"backward.compiled[{run.compile_backend()}]", _compiled, ("protocol.flatten", "backward.eager")),
    ]


def _off(run):
    raise Skip("turned off (backward=False)")


def _no_backend(run):
    raise Skip("no compile backend selected")


def _pick(run, compiled: bool = False):
    cases = usable_cases(run, run.compile_backend()) if compiled else run.compile_cases()
    diff = [c for c in cases if c.differentiable]
    if not diff:
        what = "of the ops passed in ops=" if any(c.why == "passed in ops=" for c in run.cases) else \
            "(add, mul, neg, sum, mm)"
        raise Skip(f"no differentiable op {what} passed its eager check")
    diff.sort(key=lambda c: _PREFERRED.index(c.label) if c.label in _PREFERRED else len(_PREFERRED))
    for c in diff:
        for x in run.samples:
            if x.dtype.is_floating_point and c.applies(x):
                return c, x
    raise Skip("no floating-point sample to differentiate")


def _leaf(x):
    try:
        leaf = x.detach().requires_grad_(True)
    except Exception as e:
        raise Fail(
            f"x.detach().requires_grad_(True) on {describe(x)} raised {type(e).__name__}: {str(e)[:160]}",
            "support aten.detach.default and create the wrapper with the outer dtype (a floating one) so it can require grad",
        ) from None
    return leaf


def _tangent(out):
    if not isinstance(out, torch.Tensor):
        raise Skip(f"the op returned {type(out).__name__}, not a tensor")
    if not _compat.is_traceable_wrapper_subclass(out):
        return torch.ones_like(out)
    try:
        g = torch.ones_like(out)
    except NotImplementedError:
        raise Skip(f"torch.ones_like is not supported on {type(out).__name__}, so no tangent of its type can be made") from None
    return g


def _backward(fn, x, case_label, user: bool = False):
    leaf = _leaf(x)
    try:
        out = fn(leaf)
    except AssertionError as e:
        if not user:
            raise
        raise Skip(f"{case_label} (from ops=) on a leaf that requires grad was refused by an assertion in "
                   f"{type(x).__name__}'s code (AssertionError: {str(e).strip()[:120]}); not judged") from None
    if not getattr(out, "requires_grad", False):
        if user:  # an op from ops= need not be differentiable in its sample
            raise Skip(f"{case_label} (from ops=) is not differentiable with respect to {describe(x)}: "
                       "its result does not require grad")
        raise Fail(
            f"{case_label} on a leaf {describe(x)} that requires grad returned a result that does not require grad",
            "keep requires_grad on the outer tensor: create outputs with _make_wrapper_subclass and let autograd set it",
        )
    g = _tangent(out)
    try:
        out.backward(g)
    except AssertionError as e:
        if not user:
            raise
        raise Skip(f"backward through {case_label} (from ops=) was refused by an assertion in "
                   f"{type(x).__name__}'s code (AssertionError: {str(e).strip()[:120]}); not judged") from None
    if leaf.grad is None:
        if user:  # e.g. torchao's NF4 linear: a frozen base weight gets no gradient by design
            raise Skip(f"{case_label} (from ops=) gives {describe(x)} no gradient (its backward returns "
                       "None for it)")
        raise Fail(f"backward through {case_label} left no gradient on {describe(x)}", "return the op's results from __torch_dispatch__ so autograd connects them")
    return leaf.grad, g


def _missing_ops(run, case, x, e: BaseException, compiled: str = "") -> tuple:
    """``(what, fix)`` for a backward that hit an op the class does not handle, listing the
    aten ops that backward runs on the class and those it lacks."""
    ops, missing = backward_ops(case.call, x)
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    first = first.split(". ")[0][:200]  # the op; the fix is ours, below
    need = f"; the backward of {case.label} runs these aten ops on {run.name}: {', '.join(ops)}" if ops else ""
    lack = f"; {run.name} lacks: {', '.join(missing)}" if missing else ""
    register = (f"register handlers for {', '.join(missing)} with @{run.name}.implements(...)" if missing and run.subject.is_kit
                else f"handle {', '.join(missing) or 'the op named above'} in {run.name}.__torch_dispatch__")
    return (f"{compiled}backward through {case.label} on {describe(x)} raised {type(e).__name__}: {first}{need}{lack}",
            register)


def _refusal(e: BaseException):
    """The NotImplementedError in an exception's chain (dynamo wraps what the backend raised)."""
    c: BaseException | None = e
    for _ in range(8):
        if c is None or isinstance(c, NotImplementedError):
            return c
        c = c.__cause__ or c.__context__
    return None


def _eager(run):
    case, x = _pick(run)
    try:
        grad, g = _backward(case.call, x, case.label, case.why == "passed in ops=")
    except NotImplementedError as e:
        raise Fail(*_missing_ops(run, case, x, e)) from None
    if tuple(grad.shape) != tuple(x.shape):
        raise Fail(f"the gradient of {describe(x)} has shape {tuple(grad.shape)}", "return outputs of the outer shape from backward ops")
    if not run.subject.has_to_plain:
        return f"{case.label}: gradient computed; {run.name} has no to_plain(), so it was not compared with a dense one"
    mask = plain_mask(x)
    xd = dense(x).detach().requires_grad_(True)
    ref_fn, how = case.call, ""
    if mask is not None:
        # The dense backward must be the backward of what the class computes: an op over
        # don't-care positions that the result depends on is not judged, a reduction over
        # them is differentiated through its torch.masked version.
        ref = reference(case.call, [dense(x).detach()], [mask], op=case.op, args=case.args(dense(x)))
        out = case.call(x.detach())
        if ref.unjudged(out):
            raise Skip(f"{case.label}: its dense result at meaningful positions depends on don't-care "
                       "positions of the input, so no dense gradient can judge it")
        found = masked_fn(case.op, case.args(xd), mask)
        if found is not None:
            ref_fn, how = (lambda d: found[0](d)), f" (dense reference: {found[2]})"
    outd = ref_fn(xd)
    cot = dense(g)
    out_mask = plain_mask(g) if isinstance(g, torch.Tensor) and type(g) is not torch.Tensor else None
    if out_mask is not None:
        cot = torch.where(out_mask, cot, torch.zeros_like(cot))  # don't-care outputs carry no gradient
    outd.backward(cot)
    d = dense_difference(grad, xd.grad, "grad", judged=[mask] if mask is not None else None)
    if d:
        ops = backward_ops(case.call, x)[0]
        which = ", ".join(ops) if ops else "e.g. mul, expand, ones_like"
        raise Fail(
            f"backward through {case.label} on {describe(x)} disagrees with the dense backward{how}: {d}",
            f"check the handlers of the ops this backward runs on {run.name} ({which}) against to_plain()"
            + ("; only positions __plain_mask__ marks meaningful were compared" if mask is not None else ""),
        )
    return case.label + (" (meaningful positions)" if mask is not None else "")
    

def _tangent_mismatch(run, case, x) -> tuple:
    out = case.call(x)
    tangent = torch.ones_like(out)
    pred = out.__coerce_tangent_metadata__() if hasattr(out, "__coerce_tangent_metadata__") else out
    want = f"a {type(pred).__name__} with ctx {flatten(pred)[1]!r:.70}"
    if not _compat.is_traceable_wrapper_subclass(tangent):
        return (
            f"compiled backward of {case.label} on {describe(x)} failed: the forward output is a "
            f"{type(out).__name__}, so AOTAutograd traced the backward for {want}, but the tangent "
            f"torch.ones_like(output) is a plain Tensor, which torch cannot convert (a plain tensor "
            "has no __coerce_same_metadata_as_tangent__); `out.sum().backward()` fails the same way",
            f"make the ops that create gradients for a {type(out).__name__} (ones_like, zeros_like, "
            f"expand, mul) return a {type(out).__name__} with the output's ctx, or let the forward op "
            "return a plain tensor when its gradients are dense",
        )
    got = f"a {type(tangent).__name__} with ctx {flatten(tangent)[1]!r:.70}"
    return (
        f"compiled backward of {case.label} on {describe(x)} failed: AOTAutograd traced the backward "
        f"for {want} (the forward output's metadata after __coerce_tangent_metadata__), but the "
        f"tangent torch.ones_like(output) is {got}, and {type(tangent).__name__} cannot convert it",
        "keep the forward output's ctx in ones_like/zeros_like and backward handlers, and implement "
        "__coerce_same_metadata_as_tangent__(self, expected_ctx, expected_type=None) returning a copy "
        "with the expected ctx (or None when impossible)",
    )


def _compiled(run):
    case, x = _pick(run, compiled=True)
    backend = run.compile_backend()
    eager_grad, _ = _backward(case.call, x, case.label)
    _compat.dynamo_reset()
    cnt = _compat.compile_counter(backend)
    cfn = torch.compile(case.call, backend=cnt, fullgraph=True)
    try:
        grad, g = _backward(cfn, x, case.label)
    except (Fail, Skip):
        raise
    except Exception as e:
        refused = _refusal(e)
        if refused is not None:
            raise Fail(*_missing_ops(run, case, x, refused, compiled=f"compiled ({backend}) ")) from None
        text = " ".join(str(e).split())
        if "guessed its metadata incorrectly" in text or "__coerce_same_metadata_as_tangent__" in text:
            raise Fail(*_tangent_mismatch(run, case, x)) from None
        what, fix = explain_error(e, backend=backend, where=f"the backward of {case.label}")
        raise Fail(what, fix) from None
    d = difference(grad, eager_grad, "grad") if type(grad) is type(eager_grad) else dense_difference(grad, dense(eager_grad), "grad")
    if d:
        raise Fail(
            f"compiled backward of {case.label} on {describe(x)} disagrees with eager: {d}",
            "make backward handlers traceable and keep the ctx of tangents equal to the forward output's",
        )
    return case.label
