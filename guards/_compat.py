"""Every torch-private name the guards package touches, in one place.

torch 2.13 is the version we test. When a private name moves, this is the only module that
should need a change; everything else imports from here. Each helper says what it stands
for in torch and degrades to a documented fallback where one exists.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable

import torch

__all__ = [
    "is_traceable_wrapper_subclass",
    "is_fake",
    "is_dtensor",
    "view_base",
    "dtensor_spec",
    "dtensor_local",
    "dtensor_spec_matches",
    "tensor_guards",
    "dispatch_keys",
    "sym_value",
    "use_duck_shape",
    "recompile_limit",
    "optimize",
    "cache_entries",
    "walk_guard_tree",
    "reset_dynamo",
    "compile_counter",
]

from torch.utils._python_dispatch import (  # noqa: E402  (public-ish, but underscored)
    is_traceable_wrapper_subclass as is_traceable_wrapper_subclass,
)


@functools.cache
def _fake_cls() -> type:
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor


@functools.cache
def _njt_cls() -> type:
    from torch.nested._internal.nested_tensor import NestedTensor

    return NestedTensor


@functools.cache
def _dtensor_cls() -> type | None:
    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch built without distributed
        return None
    return DTensor


# The predicates below run several times per tensor in ``guards.build``; each resolves its
# torch class once (``functools.cache``) rather than importing on every call.
def is_fake(t: Any) -> bool:
    """True for a FakeTensor (the inner tensors of a wrapper seen during tracing)."""
    return isinstance(t, _fake_cls())


def is_nested_int(x: Any) -> bool:
    """True for a jagged NestedTensor's ragged size (a nested int such as ``j1``)."""
    from torch.fx.experimental.symbolic_shapes import is_nested_int as _is

    return isinstance(x, torch.SymInt) and bool(_is(x))


def nested_int_coeff(x: torch.SymInt) -> int:
    """The coefficient of a nested int (``3*j1`` -> 3), from its ``NestedIntNode``; 1 for a
    ShapeEnv symbol standing for one (a ``SymNode``, which does not carry it)."""
    coeff = getattr(x.node, "nested_int_coeff", None)
    return 1 if coeff is None else int(coeff())


def is_njt(t: Any) -> bool:
    """True for torch's jagged-layout NestedTensor (dynamo does not track its outer sizes)."""
    return isinstance(t, _njt_cls())


def snapshot_ctx(ctx: Any) -> Any:
    """What dynamo's TENSOR_SUBCLASS_METADATA_MATCH stores: a deepcopy of the ctx with every
    SymInt replaced by a value equal to anything (it cannot deepcopy fake sizes)."""
    import copy

    from torch.utils import _pytree as pytree

    return copy.deepcopy(pytree.tree_map_only(torch.SymInt, lambda _: _AnyCompare(), ctx))


class _AnyCompare:
    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "<any SymInt>"


def is_dtensor(t: Any) -> bool:
    """True for torch's DTensor (guarded by dynamo through its spec, not TENSOR_MATCH)."""
    cls = _dtensor_cls()
    return cls is not None and isinstance(t, cls)


def view_base(t: torch.Tensor):
    """The base of a view (``t._base``) or None; dynamo fakeifies it and guards its symbols."""
    return t._base if t._is_view() else None


def dtensor_spec(t):
    """A DTensor's spec (``t._spec``): placements, mesh, shard order, tensor meta."""
    return t._spec


def dtensor_local(t) -> torch.Tensor:
    """A DTensor's local shard (``t._local_tensor``), the tensor dynamo TENSOR_MATCHes."""
    return t._local_tensor


def dtensor_spec_matches(got, expected) -> bool:
    """dynamo's DTENSOR_SPEC_MATCH: ``_check_equals(expected, skip_shapes=True)``."""
    return bool(got._check_equals(expected, skip_shapes=True))


def tensor_guards(tensors, sizes, strides) -> Callable[..., bool] | None:
    """dynamo's C++ TENSOR_MATCH check over ``tensors`` (type, dispatch keys, dtype,
    device, requires_grad, static sizes and strides; ``None`` entries are dynamic).

    Returns the bound ``check(*tensors)`` or None when torch lacks it (the caller then
    emits the same checks in Python).
    """
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:  # pragma: no cover
        return None
    try:
        tg = TensorGuards(*tensors, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides)
    except Exception:  # pragma: no cover - e.g. a tensor kind the C++ check refuses
        return None
    return tg.check


def dispatch_keys(t: torch.Tensor):
    """The tensor's dispatch key set (what TENSOR_MATCH compares besides the metadata)."""
    return torch._C._dispatch_keys(t)


def sym_value(x):
    """``(int_value, None)`` for a concrete size, ``(None, sympy_expr)`` for a symbolic one.

    Never evaluates a SymInt (that would install a guard while tracing).
    """
    if isinstance(x, torch.SymInt):
        if is_nested_int(x):
            return None, NESTED
        node = x.node
        v = node.maybe_as_int()
        if v is not None:
            return int(v), None
        return None, node.expr
    return int(x), None


# The expression ``sym_value`` gives a nested int (no sympy form; dynamo treats it as dynamic).
NESTED = "nested_int"


def use_duck_shape() -> bool:
    """torch.fx.experimental._config.use_duck_shape (duck sizing on/off)."""
    from torch.fx.experimental import _config

    return bool(_config.use_duck_shape)


def recompile_limit() -> int:
    """torch._dynamo.config.recompile_limit: entries per code object before dynamo gives up."""
    return int(torch._dynamo.config.recompile_limit)


def optimize(backend, *, dynamic, guard_fail_fn):
    """``torch._dynamo.optimize`` with a guard-failure hook (torch.compile has no hook)."""
    return torch._dynamo.optimize(backend, dynamic=dynamic, guard_fail_fn=guard_fail_fn)


def cache_entries(fn) -> list:
    """dynamo's cache entries for ``fn``'s code object, most recent first."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    return list(_debug_get_cache_entry_list(code))


def compile_id_str(entry) -> str:
    """``"0/1"``-style id of a cache entry, as recompile reasons print it."""
    return str(entry.compile_id)


def walk_guard_tree(entry):
    """Yield ``(source_name, verbose_code_parts)`` for every leaf guard of a cache entry."""
    root = entry.guard_manager.root

    def visit(mgr, source):
        try:
            src = mgr.get_source()
        except Exception:
            src = source
        for leaf in mgr.get_leaf_guards():
            try:
                parts = list(leaf.verbose_code_parts())
            except Exception:
                parts = []
            yield src, parts
        for child in mgr.get_child_managers():
            yield from visit(child, src)

    yield from visit(root, "")


def reset_dynamo() -> None:
    """torch._dynamo.reset(): forget every compiled frame and automatic-dynamic state."""
    torch._dynamo.reset()


def compile_counter(backend: str):
    """torch._dynamo.testing.CompileCounterWithBackend (counts backend compiles)."""
    from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

    if backend == "eager":
        # Plain CompileCounter runs the graph as is, which is what backend="eager" does.
        return CompileCounter()
    return CompileCounterWithBackend(backend)


@contextlib.contextmanager
def no_local_pgo():
    """Switch off profile-guided automatic dynamic read from disk (keeps runs reproducible)."""
    cfg = torch._dynamo.config
    if not hasattr(cfg, "automatic_dynamic_local_pgo"):
        yield
        return
    with cfg.patch(automatic_dynamic_local_pgo=False):
        yield
