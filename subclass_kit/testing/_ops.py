"""The ops a conformance run exercises: a default catalog, the class's own registrations,
and whatever the caller passes as ``ops=``.

An :class:`OpCase` knows how to call one op on a sample (the same call works on the dense
reference), what kind of op it is (view, in-place, functional), and whether the class must
support it (``required``: torch's own machinery calls it, or the class or the caller
claimed it) or may decline it with NotImplementedError (then the row is a skip).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import _compat
from .._opname import op_name

__all__ = ["OpCase", "default_cases", "user_cases", "op_name", "public_name", "unique_labels"]

aten = torch.ops.aten

VIEW, INPLACE, FUNCTIONAL = "view", "inplace", "functional"


@dataclass(frozen=True)
class OpCase:
    """One op call to exercise: ``call(x)`` runs it on a sample or on its dense value."""

    label: str
    op: object
    args: Callable  # x -> tuple of positional args
    kind: str = FUNCTIONAL
    required: bool = False
    why: str = ""  # why it is required (for the message)
    applies: Callable = field(default=lambda x: True)
    twin: object = None  # the out-of-place op of an in-place one
    differentiable: bool = False
    deterministic: bool = True  # False: random or uninitialized results (compare metadata only)

    def call(self, x):
        if self.kind == INPLACE:
            y = x.clone()
            return self.op(*self.args(x, y))
        return self.op(*self.args(x))

    def call_twin(self, x):
        """The out-of-place counterpart of an in-place case (same arguments)."""
        return self.twin(*self.args(x, x))


def _kind(op) -> str:
    if isinstance(op, _compat.OpOverload):
        if op.is_view:
            return VIEW
        if op._schema.is_mutable:
            return INPLACE
    return FUNCTIONAL


def _deterministic(op) -> bool:
    """False for ops whose values are random or uninitialized (rand_like, empty_like)."""
    if not isinstance(op, _compat.OpOverload):
        return True
    if torch.Tag.nondeterministic_seeded in op.tags:
        return False
    return "empty" not in op._schema.name


def _floating(x) -> bool:
    return x.dtype.is_floating_point


def _dims(n):
    return lambda x: x.dim() >= n


def _matrix(x) -> bool:
    return x.dim() == 2 and x.dtype.is_floating_point


def _half_rows(x):
    return max(1, x.size(0) // 2)


_REQ_DETACH = "autograd and torch.compile detach inputs and outputs"
_REQ_CLONE = "copy.deepcopy, torch.compile (mutated inputs) and autograd clone tensors"


def catalog() -> list:
    """The default cases, in the order rows are reported."""
    return [
        OpCase("aten.detach.default(x)", aten.detach.default, lambda x: (x,), VIEW, True, _REQ_DETACH),
        OpCase("aten.clone.default(x)", aten.clone.default, lambda x: (x,), FUNCTIONAL, True, _REQ_CLONE),
        OpCase("aten.t.default(x)", aten.t.default, lambda x: (x,), VIEW, applies=lambda x: x.dim() == 2),
        OpCase("aten.transpose.int(x, 0, 1)", aten.transpose.int, lambda x: (x, 0, 1), VIEW, applies=_dims(2)),
        OpCase(
            "aten.slice.Tensor(x, 0, 0, n//2)",
            aten.slice.Tensor,
            lambda x: (x, 0, 0, _half_rows(x)),
            VIEW,
            applies=lambda x: x.dim() >= 1 and x.size(0) >= 2,
        ),
        OpCase("aten.add.Tensor(x, x)", aten.add.Tensor, lambda x: (x, x), applies=_floating, differentiable=True),
        OpCase("aten.mul.Tensor(x, 2.0)", aten.mul.Tensor, lambda x: (x, 2.0), applies=_floating, differentiable=True),
        OpCase("aten.mul.Tensor(x, x)", aten.mul.Tensor, lambda x: (x, x), applies=_floating, differentiable=True),
        OpCase("aten.neg.default(x)", aten.neg.default, lambda x: (x,), applies=_floating, differentiable=True),
        OpCase("aten.sum.default(x)", aten.sum.default, lambda x: (x,), applies=_floating, differentiable=True),
        OpCase("aten.mm.default(x, x.t())", aten.mm.default, lambda x: (x, x.t()), applies=_matrix, differentiable=True),
        OpCase(
            "aten.add_.Tensor(x.clone(), x)",
            aten.add_.Tensor,
            lambda x, y: (y, x),
            INPLACE,
            applies=_floating,
            twin=aten.add.Tensor,
        ),
        OpCase(
            "aten.mul_.Tensor(x.clone(), 2.0)",
            aten.mul_.Tensor,
            lambda x, y: (y, 2.0),
            INPLACE,
            applies=_floating,
            twin=aten.mul.Tensor,
        ),
    ]


def _registered_ops(cls) -> set:
    """Aten ops a kit class (or a parent) registered with ``implements``."""
    from .._dispatch import registered_ops

    if not hasattr(cls, "__kit__"):
        return set()
    return set(registered_ops(cls))


def _unary_schema(op) -> bool:
    try:
        args = op._schema.arguments
    except AttributeError:
        return False
    required = [a for a in args if not a.has_default_value()]
    # A keyword-only argument without a default (aten.sort.stable's ``stable``) makes
    # ``op(x)`` a TypeError of the call itself, not a verdict on the class.
    return len(required) == 1 and not required[0].kwarg_only and str(required[0].type) == "Tensor"


def default_cases(cls) -> list:
    """The catalog, with ops the class registers marked required, plus its other
    registered single-tensor ops called as ``op(x)``."""
    registered = _registered_ops(cls)
    packets = {getattr(op, "overloadpacket", op) for op in registered}
    cases = []
    for c in catalog():
        claimed = c.op in registered or getattr(c.op, "overloadpacket", None) in packets
        if claimed and not c.required:
            c = OpCase(**{**c.__dict__, "required": True, "why": f"{cls.__qualname__} registers it"})
        cases.append(c)
    known = {c.op for c in cases}
    for op in sorted(registered, key=op_name):
        if isinstance(op, _compat.OpOverloadPacket):
            op = getattr(op, "default", None)
        if op is None or op in known:
            continue
        if not _unary_schema(op):
            case = _with_arguments(cls, op)
            if case is not None:
                known.add(op)
                cases.append(case)
            continue
        known.add(op)
        kind = _kind(op)
        if kind == INPLACE:
            continue  # an in-place op needs its twin to be judged; callers may pass it in ops=
        cases.append(
            OpCase(
                f"{op_name(op)}(x)",
                op,
                lambda x: (x,),
                kind,
                True,
                f"{cls.__qualname__} registers it",
                deterministic=_deterministic(op),
            )
        )
    return unique_labels(cases + torch_function_cases(cls))


def unique_labels(cases: list) -> list:
    """``cases`` with every label made unique (row names must name one row): a repeated
    label gets `` #2``, `` #3``, ... in order.

    Example:
        >>> c = OpCase("f(x)", None, lambda x: (x,))
        >>> [k.label for k in unique_labels([c, c, c])]
        ['f(x)', 'f(x) #2', 'f(x) #3']
    """
    seen: dict = {}
    out = []
    for c in cases:
        n = seen[c.label] = seen.get(c.label, 0) + 1
        out.append(c if n == 1 else OpCase(**{**c.__dict__, "label": f"{c.label} #{n}"}))
    return out


# Arguments the checker can make for registered ops that take more than the tensor, and
# for registered torch-level functions: ``x -> args`` (None when they do not apply to x).
# A class adds or overrides any of them with ``__op_args__(cls, op, x) -> tuple | None``.
def _act(x):
    # A plain activation for x as a weight (out_features, in_features): fixed values, made
    # by ops dynamo traces (a Generator inside the compiled function would break the graph).
    k = x.shape[-1]
    return torch.linspace(-2.0, 2.0, 3 * k, dtype=x.dtype, device=x.device).reshape(3, k).sin()


def _contiguous_2d(x) -> bool:
    return x.dim() == 2 and x.is_contiguous()


_ARGS = {
    "aten.view.default": ("(x, [-1])", lambda x: (x, [-1]), lambda x: x.is_contiguous()),
    "aten.reshape.default": ("(x, [-1])", lambda x: (x, [-1]), lambda x: True),
    "aten._unsafe_view.default": ("(x, [-1])", lambda x: (x, [-1]), lambda x: x.is_contiguous()),
    "aten.as_strided.default": (
        "(x, x.t().shape, x.t().stride())",
        lambda x: (x, [x.shape[1], x.shape[0]], [x.stride(1), x.stride(0)]),
        _contiguous_2d,
    ),
    "aten.permute.default": ("(x, reversed dims)", lambda x: (x, list(range(x.dim() - 1, -1, -1))), lambda x: x.dim() >= 1),
    "aten.unsqueeze.default": ("(x, 0)", lambda x: (x, 0), lambda x: True),
    "aten.select.int": ("(x, 0, 0)", lambda x: (x, 0, 0), lambda x: x.dim() >= 1 and x.shape[0] >= 1),
    "aten.split.Tensor": ("(x, 1)", lambda x: (x, 1), lambda x: x.dim() >= 1),
    "aten.expand.default": ("(x, x.shape)", lambda x: (x, list(x.shape)), lambda x: True),
    "aten.linear.default": ("(act, x)", lambda x: (_act(x), x), _contiguous_2d),
}
_TF_ARGS = {
    "linear": ("(act, x)", lambda x: (_act(x), x), lambda x: x.dim() == 2 and x.dtype.is_floating_point),
    "matmul": ("(act, x.t())", lambda x: (_act(x), x.t()), lambda x: x.dim() == 2 and x.dtype.is_floating_point),
    "mm": ("(act, x.t())", lambda x: (_act(x), x.t()), lambda x: x.dim() == 2 and x.dtype.is_floating_point),
}


def _own_args(cls, op):
    hook = getattr(cls, "__op_args__", None)
    if hook is None:
        return None

    def args(x):
        got = hook(op, x)
        if got is None:
            raise TypeError(f"{cls.__qualname__}.__op_args__ returned None for {op}")
        return tuple(got)

    def applies(x):
        try:
            return hook(op, x) is not None
        except Exception:
            return False

    return args, applies


def _with_arguments(cls, op):
    """A case for a registered op that takes arguments, from the class's ``__op_args__`` or
    the checker's table; None when neither knows its arguments."""
    own = _own_args(cls, op)
    why = f"{cls.__qualname__} registers it"
    if own is not None:
        args, applies = own
        return OpCase(f"{op_name(op)}(*__op_args__)", op, args, _kind(op), True, why, applies=applies,
                      deterministic=_deterministic(op))
    spec = _ARGS.get(op_name(op))
    if spec is None:
        return None
    label, args, applies = spec
    return OpCase(f"{op_name(op)}{label}", op, args, _kind(op), True, why, applies=applies,
                  deterministic=_deterministic(op))


def _registered_torch_functions(cls) -> list:
    out = []
    for klass in reversed(cls.__mro__):
        kit = klass.__dict__.get("__kit__")
        for fn in (getattr(kit, "own_tf", None) or {}):
            if fn not in out:
                out.append(fn)
    return out


def public_name(fn) -> str:
    """How a row names a torch-level function: its public module and name, ``Tensor.name``
    for a Tensor method (``torch.Tensor.mean`` and ``torch.mean`` are two functions).

    Example:
        >>> import torch
        >>> public_name(torch.Tensor.mean), public_name(torch.mean), public_name(torch.nn.functional.linear)
        ('Tensor.mean', 'torch.mean', 'torch.nn.functional.linear')
    """
    name = getattr(fn, "__name__", repr(fn))
    if getattr(fn, "__objclass__", None) is not None or str(getattr(fn, "__qualname__", "")).startswith("TensorBase."):
        return f"Tensor.{name}"
    module = getattr(fn, "__module__", None) or "torch"
    return f"{'torch.nn.functional' if module == 'torch._C._nn' else module}.{name}"


def torch_function_cases(cls) -> list:
    """Cases for the torch-level functions a kit class registers (``F.linear`` called with a
    plain activation, as a linear layer calls it); a class's ``__op_args__(cls, fn, x)`` gives
    the arguments of others."""
    cases = []
    for fn in _registered_torch_functions(cls):
        name = getattr(fn, "__name__", repr(fn))
        public = public_name(fn)
        why = f"{cls.__qualname__} registers a torch-function handler for it"
        own = _own_args(cls, fn)
        if own is not None:
            args, applies = own
            cases.append(OpCase(f"{public}(*__op_args__)", fn, args, FUNCTIONAL, True, why, applies=applies,
                                differentiable=True))
            continue
        spec = _TF_ARGS.get(name)
        if spec is None:
            continue  # arguments unknown: __op_args__ can give them
        label, args, applies = spec
        cases.append(OpCase(f"{public}{label}", fn, args, FUNCTIONAL, True, why, applies=applies))
    return cases


def user_cases(ops) -> list:
    """Cases for ``ops=[...]``: aten overloads or callables, each called as ``op(x)``."""
    cases = []
    for op in ops:
        if isinstance(op, _compat.OpOverloadPacket):
            op = op.default
        if not callable(op):
            raise TypeError(f"ops= takes aten overloads or callables; got {op!r}")
        kind = _kind(op)
        if kind == INPLACE:
            twin = _functional_twin(op)
            cases.append(
                OpCase(f"{op_name(op)}(x.clone())", op, lambda x, y: (y,), INPLACE, True, "passed in ops=", twin=twin)
            )
        else:
            cases.append(
                OpCase(f"{_label_name(op)}(x)", op, lambda x: (x,), kind, True, "passed in ops=",
                       deterministic=_deterministic(op), differentiable=kind == FUNCTIONAL)
            )
    return unique_labels(cases)


def _label_name(op) -> str:
    if isinstance(op, (_compat.OpOverload, _compat.OpOverloadPacket)):
        return op_name(op)
    if getattr(op, "__objclass__", None) is not None or getattr(op, "__module__", None) in ("torch", "torch._C._nn"):
        return public_name(op)
    return op_name(op)


def _functional_twin(op):
    name = op._schema.name.split("::")[1]
    base = name[:-1] if name.endswith("_") else name
    packet = getattr(aten, base, None)
    return getattr(packet, op._overloadname, None) if packet is not None else None
