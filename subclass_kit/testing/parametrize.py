"""pytest decorators that run a test over the axes that matter for subclasses.

``@parametrize_backends`` gives the test a ``backend`` argument (``eager``, ``aot_eager``,
and ``inductor`` marked ``slow``); ``@parametrize_pytree_impls`` runs it once with optree
and once with torch's Python pytree active in ``subclass_kit.pytree``, and gives it a
``pytree_impl`` argument if it asks for one.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import functools
import inspect

__all__ = ["parametrize_backends", "parametrize_pytree_impls", "BACKENDS", "PYTREE_IMPLS"]

BACKENDS = ("eager", "aot_eager", "inductor")
PYTREE_IMPLS = ("optree", "python")
_SLOW = {"inductor"}


def parametrize_backends(fn: Callable[..., Any] | None = None, *, backends: Sequence[str] = BACKENDS,
                         argname: str = "backend") -> Any:
    """Parametrize a test over torch.compile backends; ``inductor`` is marked ``slow``.

    Usable bare or with arguments.

    Example:
        >>> import torch
        >>> from subclass_kit.testing import parametrize_backends
        >>> @parametrize_backends(backends=("eager", "aot_eager"))
        ... def test_neg(backend):
        ...     f = torch.compile(torch.neg, backend=backend)
        ...     assert torch.equal(f(torch.ones(2)), -torch.ones(2))
        >>> [m.args[1] for m in test_neg.pytestmark][0][0].values
        ('eager',)
    """
    import pytest

    params = [
        pytest.param(b, id=b, marks=[pytest.mark.slow] if b in _SLOW else [])
        for b in backends
    ]
    deco = pytest.mark.parametrize(argname, params)
    return deco if fn is None else deco(fn)


def parametrize_pytree_impls(fn: Callable[..., Any] | None = None, *, impls: Sequence[str] = PYTREE_IMPLS,
                             argname: str = "pytree_impl") -> Any:
    """Run a test once per ``subclass_kit.pytree`` implementation, that one active.

    The test may take a ``pytree_impl`` argument to know which; the previous
    implementation is restored afterwards.

    Example:
        >>> from subclass_kit import pytree
        >>> from subclass_kit.testing import parametrize_pytree_impls
        >>> @parametrize_pytree_impls
        ... def test_leaves(pytree_impl):
        ...     assert pytree.current() == pytree_impl
        ...     assert pytree.tree_leaves([1, (2, 3)]) == [1, 2, 3]
        >>> test_leaves(pytree_impl="python"); pytree.current()
        'optree'
    """
    if fn is None:
        return functools.partial(parametrize_pytree_impls, impls=impls, argname=argname)
    import pytest

    from .. import pytree

    sig = inspect.signature(fn)
    wants = argname in sig.parameters

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        impl = kwargs[argname] if wants else kwargs.pop(argname)
        with pytree.using(impl):
            return fn(*args, **kwargs)

    if not wants:
        params = list(sig.parameters.values())
        params.append(inspect.Parameter(argname, inspect.Parameter.KEYWORD_ONLY))
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]  # read by pytest
    return pytest.mark.parametrize(argname, [pytest.param(i, id=i) for i in impls])(wrapper)
