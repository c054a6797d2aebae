"""The one place where ``subclass_kit.testing`` touches private torch internals.

The checker needs more of torch's machinery than the base class does (fake modes, shape
environments, dynamo's counters and guard-failure log, AOTAutograd's default subclass
hash); each piece is a thin alias here, so that a torch upgrade changes one file.
"""

from __future__ import annotations

import contextlib
import io
import pickle

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass  # noqa: F401

__all__ = [
    "is_traceable_wrapper_subclass",
    "fake_mode",
    "shape_env",
    "fresh_symint",
    "symbolic_fake",
    "sym_expr",
    "same_storage",
    "compile_counter",
    "dynamo_reset",
    "guard_failure_reasons",
    "graph_break_reasons",
    "GRAPH_BREAK_ERRORS",
    "DATA_DEPENDENT_ERRORS",
    "default_stable_hash",
    "export",
    "export_round_trip",
    "is_fake",
]


@contextlib.contextmanager
def quiet_torch_logs():
    """Raise every ``torch.*`` logger to ERROR for the duration (restored after).

    The checker provokes graph breaks and failed traces on purpose; torch logs those as
    warnings (with whole graphs), which would bury the report. ``SUBCLASS_KIT_CHECK_LOGS=1``
    keeps them.
    """
    import logging
    import os

    if os.environ.get("SUBCLASS_KIT_CHECK_LOGS") == "1":
        yield
        return
    saved = []
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if (name == "torch" or name.startswith("torch.")) and isinstance(logger, logging.Logger):
            saved.append((logger, logger.level))
            logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)


def fake_mode(shape_env=None):
    """A FakeTensorMode (static shapes unless a ShapeEnv is given)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=False)


def shape_env():
    """A ShapeEnv without duck sizing: equal sizes get distinct symbols, so a class that
    reads the size of an inner tensor where it should read ``outer_size`` is told apart."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return ShapeEnv(duck_shape=False)


def fresh_symint(env, value: int, name: str):
    """A new backed SymInt with hint ``value`` in ``env``."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic

    src = ConstantSource(name)
    sym = env.create_symbol(value, src, dynamic_dim=DimDynamic.DYNAMIC)
    return env.create_symintnode(sym, hint=value, source=src)


def fake_with_source(mode, t, name: str):
    """A fake copy of ``t`` made with a source (what a jagged NestedTensor needs)."""
    from torch._dynamo.source import ConstantSource

    return mode.from_tensor(t, source=ConstantSource(name))


def symbolic_fake(mode, t, name: str):
    """A fake copy of plain tensor ``t`` whose every dimension is a fresh symbol."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    ctx = StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC] * t.dim(), constraint_sizes=[None] * t.dim()
    )
    return mode.from_tensor(t, symbolic_context=ctx, source=ConstantSource(name))


def is_nested_int(v) -> bool:
    """True for a jagged NestedTensor's ragged size (``j1``)."""
    from torch.fx.experimental.symbolic_shapes import is_nested_int as _is

    return isinstance(v, torch.SymInt) and bool(_is(v))


def has_nested_int(t) -> bool:
    """True when a tensor's shape holds a nested int (torch's jagged NestedTensor)."""
    return any(is_nested_int(s) for s in t.shape)


def sym_expr(v):
    """The sympy expression behind a SymInt, or the int itself; a nested int (whose identity
    depends on how its offsets were made) is ``("nested_int", coeff)``."""
    if is_nested_int(v):
        coeff = getattr(v.node, "nested_int_coeff", None)
        return ("nested_int", coeff() if callable(coeff) else 1)
    node = getattr(v, "node", None)
    return node.expr if node is not None else v


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when two tensors share a storage (also for wrapper subclasses' outer storage)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    try:
        return StorageWeakRef(a.untyped_storage()) == StorageWeakRef(b.untyped_storage())
    except (RuntimeError, NotImplementedError):
        return False


def is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import is_fake as _is_fake

    return bool(_is_fake(t))


def compile_counter(backend: str):
    """dynamo's counting backend wrapper (``.frame_count`` = number of compiled frames)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    return CompileCounterWithBackend(backend)


def dynamo_reset() -> None:
    torch._dynamo.reset()


def guard_failure_reasons() -> list:
    """Every recompile reason dynamo recorded since the last reset, oldest first."""
    out = []
    for reasons in torch._dynamo.guard_failures.values():
        out.extend(str(r) for r in reasons)
    return out


def graph_break_reasons(fn, *args) -> list:
    """Run ``torch._dynamo.explain`` on ``fn(*args)``; the graph-break reasons, one line each."""
    torch._dynamo.reset()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            ex = torch._dynamo.explain(fn)(*args)
    finally:
        torch._dynamo.reset()
    return [str(b.reason).strip().splitlines()[0] for b in ex.break_reasons]


def _errors():
    import torch._dynamo.exc as exc
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return (
        (exc.Unsupported, exc.UserError),
        (GuardOnDataDependentSymNode, DataDependentOutputException, DynamicOutputShapeException),
    )


GRAPH_BREAK_ERRORS, DATA_DEPENDENT_ERRORS = _errors()


def default_stable_hash(t, *, canonical: bool = False) -> str:
    """The hash AOTAutograd's cache uses for a wrapped tensor without ``_stable_hash_for_caching``.

    torch pickles its payload with plain ``pickle.dumps``. Objects that pickle as a bare
    global name without a ``__module__`` (``torch.contiguous_format``, ``torch.strided``,
    dtypes) are written under the name of the FIRST module in ``sys.modules`` that holds
    them -- ``torch._utils`` in a fresh interpreter, but any module that imported torch
    before torch finished importing (a test module, a library) in another program. So
    torch's hash depends on the import order of the program computing it. ``canonical=True``
    computes the same payload with those objects written by their repr instead: the hash
    torch's would be if that lookup were stable.
    """
    import warnings

    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCachePickler

    gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    pickler = AOTAutogradCachePickler(gm)
    if canonical:
        pickler._hash_pickled_value_for_cache = lambda v: pickler._hash_bytes_for_cache(_canonical_pickle(v))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pickler._default_stable_hash_for_caching(t)


_BY_NAME_TYPES = (torch.dtype, torch.memory_format, torch.layout, torch.qscheme)


class _CanonicalPickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, _BY_NAME_TYPES):
            return (str, (repr(obj),))
        return NotImplemented


def _canonical_pickle(value) -> bytes:
    buf = io.BytesIO()
    _CanonicalPickler(buf, protocol=pickle.DEFAULT_PROTOCOL).dump(value)
    return buf.getvalue()


def export(module, args, *, strict: bool = False):
    return torch.export.export(module, args, strict=strict)


def export_round_trip(ep, allowed=()):
    """``torch.export.save`` then ``torch.export.load`` through memory, with ``allowed``
    globals permitted for the weights-only load of the example inputs."""
    import logging

    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    # torch logs (and, in 2.13, mis-formats) a warning when it falls back to a full unpickle
    # of example inputs; the result is what we check, so keep stderr quiet.
    log = logging.getLogger("torch._export.serde.serialize")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with torch.serialization.safe_globals(list(allowed)):
            return torch.export.load(buf)
    finally:
        log.setLevel(level)
