"""The one place where subclass_kit (with its collectives, sharded and testing parts) touches
private torch internals.

Everything here is a thin alias or a few lines; when torch moves a name, only this module
changes. Nothing outside this module should spell ``torch._C``, ``torch._dynamo`` or other
underscore names of torch.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
import pickle
import sys
from typing import Any

import torch
import torch.utils._pytree as python_pytree  # noqa: F401  (re-exported for subclass_kit.pytree)
from torch.utils._python_dispatch import (  # noqa: F401
    TorchDispatchMode,
    get_alias_info,
    is_traceable_wrapper_subclass,
    return_and_correct_aliasing,
)

make_wrapper_subclass = torch.Tensor._make_wrapper_subclass
# Its parameters in order: (cls, size, strides, storage_offset, memory_format, dtype, layout,
# device, ...). Passed positionally they skip keyword parsing (~0.25 us of every op's result).
disabled_torch_function_impl = torch._C._disabled_torch_function_impl
DisableTorchFunctionSubclass = torch._C.DisableTorchFunctionSubclass
functionalize_unsafe_set = torch._functionalize_unsafe_set
sym_check = torch._check
SymInt = torch.SymInt
OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket


def list_backends() -> list:
    """Every torch.compile backend name dynamo knows (debug and experimental ones included)."""
    return list(torch._dynamo.list_backends(exclude_tags=()))


def is_opaque(v) -> bool:
    """True for a non-tensor object torch lets ride along as an "inner" value (DTensor's mesh)."""
    try:
        from torch._opaque_base import OpaqueBase
    except ImportError:  # pragma: no cover - older torch
        return False
    return isinstance(v, OpaqueBase)


def is_compiling() -> bool:
    """True while dynamo traces (torch.compile, strict export) or make_fx traces (non-strict
    export, AOTAutograd)."""
    if torch.compiler.is_compiling():
        return True
    return bool(torch.compiler._is_non_strict_tracing())


def never_compile_frames(fn) -> None:
    """Dynamo never compiles a frame of ``fn`` (or any frame it calls) as a frame of its own.

    ``torch.compile`` catches every Python frame that runs while a compiled function runs
    eagerly after a graph break (e.g. ``loss.backward()`` inside it): the autograd engine
    then calls the class's ``__torch_dispatch__`` from C, and dynamo would try to compile
    the dispatcher and each handler as separate graphs. torch's DTensor wraps its
    ``__torch_dispatch__`` in ``torch._disable_dynamo`` for this; marking the code object
    (dynamo's ``FrameExecStrategy(SKIP, SKIP)``) does the same at no per-call cost. Tracing
    is unaffected: dynamo never inlines ``__torch_dispatch__``; AOTAutograd runs it.
    """
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy

    set_code_exec_strategy(fn.__code__, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))


def fake_mode_from(t):
    from torch._subclasses.fake_tensor import FakeTensor

    return t.fake_mode if isinstance(t, FakeTensor) else None


def add_safe_globals(objs) -> None:
    torch.serialization.add_safe_globals(list(objs))


def get_safe_globals():
    return torch.serialization.get_safe_globals()


def enable_torch_optree_namespace() -> None:
    """Register torch's node types in optree's "torch" namespace with insertion-ordered
    dicts, exactly as torch's own optree-backed pytree does (importing it does both)."""
    import torch.utils._cxx_pytree  # noqa: F401


# ---- recompile log (subclass_kit.recompiles) ----------------------------------------------------
# dynamo logs a recompile from torch._dynamo.guards.get_and_maybe_log_recompilation_reasons
# on the artifact loggers below (TORCH_LOGS=recompiles / recompiles_verbose). A wrapper's
# ctx change shows there only as ``___check_metadata_<id of the checker>_c<compile id>``.

RECOMPILE_LOGGERS = ("torch._dynamo.guards.__recompiles", "torch._dynamo.guards.__recompiles_verbose")


def recompile_being_logged():
    """``(reasons, cache_entries, f_locals, code)`` of the recompile dynamo is logging now, or None.

    Read from the locals of ``get_and_maybe_log_recompilation_reasons`` on the call stack
    (a log filter runs synchronously inside it): dynamo's raw reasons, the cache entries
    that rejected the call, and the arguments of the frame being recompiled.
    """
    import sys

    f = sys._getframe(1)
    while f is not None:
        code = f.f_code
        if code.co_name == "get_and_maybe_log_recompilation_reasons" and code.co_filename.replace("\\", "/").endswith(
            "torch/_dynamo/guards.py"
        ):
            loc = f.f_locals
            frame = loc.get("frame")
            if frame is None:
                return None
            return list(loc.get("reasons") or ()), list(loc.get("cache_entries") or ()), dict(frame.f_locals), frame.f_code
        f = f.f_back
    return None


def metadata_guard_expected(token: str):
    """The ctx a ``___check_metadata_<id>_c<cid>`` guard compares against.

    dynamo's ``TENSOR_SUBCLASS_METADATA_MATCH`` closes a ``metadata_checker`` function over
    ``original_metadata`` and names the guard after ``id(metadata_checker)``; the function is
    alive while its cache entry is. Raises LookupError when it cannot be found.
    """
    import gc
    import re

    m = re.match(r"_*check_metadata_(\d+)_c", token)
    if m is None:
        raise LookupError(f"not a metadata guard name: {token!r}")
    wanted = int(m.group(1))
    for obj in gc.get_objects():
        if id(obj) == wanted and getattr(obj, "__name__", None) == "metadata_checker":
            cells = dict(zip(obj.__code__.co_freevars, obj.__closure__ or ()))
            if "original_metadata" in cells:
                return cells["original_metadata"].cell_contents
    raise LookupError(f"the checker of {token} is gone (its cache entry was dropped)")


# ``torch_function_mode_enabled()``: is any torch-function mode on the stack (export's
# tracing installs some)? Bound to the C function itself: the wrapper constructors call it
# once per op, and a Python wrapper around it would triple its cost.
torch_function_mode_enabled = torch._C._is_torch_function_mode_enabled


def pre_dispatch_export_tracer():
    """The tracer of torch.export's pre-dispatch tracing while user-level code runs under it
    (not inside an op's dispatch, where the modes are popped), else None."""
    if not torch._C._is_torch_function_mode_enabled():
        return None
    from torch._export.utils import _maybe_find_pre_dispatch_tf_mode_for_export

    mode = _maybe_find_pre_dispatch_tf_mode_for_export()
    return None if mode is None else mode.tracer


def emit_flat_apply(tracer, name: str, target, args: tuple, out) -> None:
    """Record ``out = target(*args)`` in a pre-dispatch export graph as a ``flat_apply`` node
    (torch's mechanism for subclass constructors, see
    ``torch._export.wrappers.mark_subclass_constructor_exportable_experimental``)."""
    from torch._export.wrappers import _emit_flat_apply_call

    _emit_flat_apply_call(
        tracer=tracer,
        spec_name=f"{name}_args",
        const_target_for_apply=target,
        graphable_args=(args, {}),
        track_value=out,
        call_spec_cache_key=name,
    )


def unwrap_tensor_subclass_parameters(module):
    """torch's parametrization of subclass parameters into plain ones (torchao's
    ``unwrap_tensor_subclass`` does the same); re-exported for tests and docs."""
    from torch._functorch._aot_autograd.subclass_parametrization import (
        unwrap_tensor_subclass_parameters as _unwrap,
    )

    return _unwrap(module)


def aoti_compile_and_package(ep, package_path, inductor_configs=None):
    """torch's AOTInductor compile, leaving ``torch._inductor.config`` as it found it.

    torch 2.13 writes the package's device facts (``AOTI_DEVICE_KEY``, ``AOTI_PLATFORM``,
    ``AOTI_CPU_ISA``, ...) into the dict ``config.aot_inductor.metadata`` *in place*, and
    ``config.patch`` does not undo an in-place change. That dict is part of every later FX
    graph and AOTAutograd cache key in the process, so after one AOTI compile every
    ``torch.compile`` keys differently from a fresh process: a warm cache written by this
    process misses in the next one and vice versa. The dict's contents are restored here."""
    import torch._inductor
    from torch._inductor import config

    metadata = config.aot_inductor.metadata
    saved = dict(metadata)
    try:
        return torch._inductor.aoti_compile_and_package(
            ep, package_path=package_path, inductor_configs=inductor_configs
        )
    finally:
        metadata.clear()
        metadata.update(saved)
        if config.aot_inductor.metadata is not metadata:  # replaced rather than mutated
            config.aot_inductor.metadata = metadata


def aoti_load_package(path):
    import torch._inductor

    return torch._inductor.aoti_load_package(path)


# ---- the checker (subclass_kit.testing) ------------------------------------------------------
# It needs more of torch's machinery than the base class does: fake modes, shape
# environments, dynamo's counters and guard-failure log, AOTAutograd's default subclass hash.

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


def float_dtype_of(inners: tuple, fn):
    """The first floating dtype ``fn(fake_inners)`` computes in, or of its result; None if none.

    Runs ``fn`` in a fresh fake mode that lets real constants in (a lookup table a
    ``to_plain`` indexes), recording the dtype of every op's result: metadata of a
    computation without computing it.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    seen: list = []

    class _Dtypes(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            seen.extend(t.dtype for t in tree_leaves(out) if isinstance(t, torch.Tensor))
            return out

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = tuple(None if t is None else mode.from_tensor(t) for t in inners)
    with mode, _Dtypes():
        out = fn(fakes)
    seen.append(out.dtype)
    return next((d for d in seen if d.is_floating_point or d.is_complex), None)


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

    ctx: Any = StatelessSymbolicContext(
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


def size_hint(v) -> int | None:
    """The value a size has on the example input (a SymInt's hint, an int itself); None for
    a size without one (unbacked), read without adding a guard."""
    node = getattr(v, "node", None)
    if node is None:
        return int(v)
    return None if node.hint is None else int(node.hint)


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


def mark_dynamic(t: torch.Tensor, dims) -> None:
    """torch's own ``torch._dynamo.mark_dynamic`` (the bench marks NJT and plain tensors as
    torch's docs say; kit wrappers go through ``symbolic.mark_dynamic``)."""
    torch._dynamo.mark_dynamic(t, dims)


def compile_counter(backend: str):
    """dynamo's counting backend wrapper (``.frame_count`` = number of compiled frames)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    return CompileCounterWithBackend(backend)


def dynamo_reset() -> None:
    torch._dynamo.reset()


def clear_fake_tensor_cache() -> None:
    """Empty FakeTensorMode's op cache, which every trace in the process shares: a compile
    timed after another of the same shapes would reuse the first one's cached fake ops."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    FakeTensorMode.cache_clear()


def guard_failure_reasons() -> list:
    """Every recompile reason dynamo recorded since the last reset, oldest first."""
    out: list[str] = []
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
        # One instance, one hook: the canonical bytes replace torch's pickle of each value.
        pickler._hash_pickled_value_for_cache = lambda v: pickler._hash_bytes_for_cache(  # type: ignore[method-assign, assignment]
            _canonical_pickle(v)
        )
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


# ---- ShardedTensor (subclass_kit.sharded) -------------------------------------------------------

POINTWISE_TAG = torch.Tag.pointwise
allow_in_graph = torch._dynamo.allow_in_graph


def resolve_group_name(name: str):
    """The ProcessGroup registered under ``name`` (raises if there is none)."""
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)  # type: ignore[arg-type]  # GroupName is a str at run time


_FAKE_MODE = None


@contextlib.contextmanager
def meta_mode():
    """A fake mode to compute an op's global output metadata in, never recorded in a graph.

    Reuses the fake mode of the trace in progress (so symbolic sizes stay in its shape env),
    else one module-level mode; proxy tracing is off so nothing lands in the graph.
    """
    global _FAKE_MODE
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    mode = detect_fake_mode()
    if mode is None:
        if _FAKE_MODE is None:
            _FAKE_MODE = FakeTensorMode()
        mode = _FAKE_MODE
    _META_QUIET.depth = getattr(_META_QUIET, "depth", 0) + 1
    try:
        with mode, disable_proxy_modes_tracing():
            yield mode
    finally:
        _META_QUIET.depth -= 1


class _QuietMetaFailures:
    """A filter on torch's fake-tensor logger: inside ``meta_mode`` a meta kernel that
    refuses its arguments (det of a non-square matrix) raises to the caller, which reports
    it as the op's own error; torch would also log it at ERROR with a whole traceback."""

    def filter(self, record) -> bool:
        return not (getattr(_META_QUIET, "depth", 0) and str(record.msg).startswith("failed while attempting to run meta"))


_META_QUIET = threading.local()
logging.getLogger("torch._subclasses.fake_tensor").addFilter(_QuietMetaFailures())


def tracing_symbolically() -> bool:
    """True while a proxy trace (make_fx / AOTAutograd) records the graph."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    return get_proxy_mode() is not None


def is_symbolic(x) -> bool:
    """True for a SymInt/SymFloat/SymBool (a size that is not a plain int)."""
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool))


def known_equal(a, b) -> bool:
    """True when ``a == b`` holds for every value of their symbols (no guard is added)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return statically_known_true(a == b)



def register_compile_constants(members: dict) -> None:
    """Let dynamo treat instances of each class as compile-time constants guarded by value
    (``==``), as torch registers DTensor's placements: reading them from an intermediate
    inside ``torch.compile(fullgraph=True)`` traces without a graph break.

    ``members``: ``{cls: names}``, the attributes and methods dynamo may evaluate on the
    real object at trace time (the result is baked into the graph as a constant). Each
    class needs ``__eq__``, ``__hash__`` and ``__fx_repr__``.
    """
    from torch._library.opaque_object import MemberType, is_opaque_type, register_opaque_type

    for cls, names in members.items():
        if not is_opaque_type(cls):
            register_opaque_type(cls, typ="value", members={n: MemberType.USE_REAL for n in names})


def real_tensors():
    """A context in which real tensors compute (the fake mode of a trace in progress is
    suspended): for metadata held in real tensors, like a DeviceMesh's rank map."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def current_device_mesh():
    """The DeviceMesh of the innermost ``with mesh:`` block, or None (torch keeps the stack
    of entered meshes privately; its ``parallelize_module`` reads it the same way)."""
    from torch.distributed.device_mesh import _mesh_resources

    stack = _mesh_resources.mesh_stack
    return stack[-1] if stack else None


def register_mesh_member(name: str, fn) -> None:
    """Give torch's ``DeviceMesh`` a method ``name`` (``fn(mesh)``) that dynamo evaluates on
    the real mesh at trace time and bakes in as a constant.

    torch registers DeviceMesh with dynamo as an opaque reference type guarded by value
    (its rank map, layout, device type and dim names), listing the members dynamo may read;
    a function of the mesh that dynamo calls as a constant function instead would guard on
    the mesh's identity, so every new but equal mesh would recompile. Adding our member to
    that list keeps torch's value guard.
    """
    from torch._library.opaque_object import _OPAQUE_TYPES, MemberType
    from torch.distributed.device_mesh import DeviceMesh, _register_distributed_opaque_types

    _register_distributed_opaque_types()
    setattr(DeviceMesh, name, fn)
    _OPAQUE_TYPES[DeviceMesh].members[name] = MemberType.USE_REAL


def op_return_types(func) -> tuple | None:
    """The schema's return types of an aten overload as strings (``('Tensor', 'Tensor')``,
    ``('List[Tensor]',)``), or None for something without a schema (a packet, a callable)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return None
    return tuple(str(r.type) for r in schema.returns)


_AUTOGRAD_KEY = torch._C.DispatchKey.AutogradFunctionality


def below_autograd() -> bool:
    """True inside an op's dispatch (``__torch_dispatch__`` and its handlers), where
    autograd has already run and must not record anything: its key is excluded there."""
    return torch._C._dispatch_tls_is_dispatch_key_excluded(_AUTOGRAD_KEY)


# ---- functional collectives (subclass_kit.collectives) ------------------------------------

import torch.distributed.distributed_c10d as _c10d  # noqa: E402

funcol_ops = torch.ops._c10d_functional
# Importing torch's module registers the Meta kernels of the native ops and marks
# wait_tensor side-effectful for FX's dead-code elimination (has_side_effect); the
# in-graph wait of an AsyncCollectiveTensor input relies on the latter.
import torch.distributed._functional_collectives  # noqa: E402,F401

wait_op = funcol_ops.wait_tensor.default

from torch._subclasses.functional_tensor import FunctionalTensor  # noqa: E402

_PROXY = torch._C._TorchDispatchModeKey.PROXY
_FUNCTIONAL = torch._C._TorchDispatchModeKey.FUNCTIONAL
_FAKE = torch._C._TorchDispatchModeKey.FAKE
_get_mode = torch._C._get_dispatch_mode


def tracing_into_graph() -> bool:
    """True while make_fx/AOTAutograd records ops into a graph (a proxy mode is active)."""
    return _get_mode(_PROXY) is not None


def in_fake_or_proxy_mode() -> bool:
    """True under a fake, functional or proxy dispatch mode (any tracing below dynamo)."""
    return _get_mode(_PROXY) is not None or _get_mode(_FAKE) is not None or _get_mode(_FUNCTIONAL) is not None


def find_group_by_ranks(ranks: list) -> "torch.distributed.ProcessGroup | None":
    """The existing group whose ranks are exactly ``ranks`` (any order), or None."""
    return _c10d._find_pg_by_ranks_and_tag("", list(ranks))


def work_registry_size() -> int:
    """How many collectives issued by this process have not been waited on."""
    return torch._C._distributed_c10d._get_work_registry_size()


def raw_op(func):
    """The C++ callable behind an OpOverload (calling it skips OpOverload.__call__)."""
    return getattr(func, "_op", func)


def _tensor_methods() -> dict:
    aten = torch.ops.aten
    T = torch.Tensor
    return {
        aten.detach.default: T.detach,
        aten.view.default: T.view,
        aten.t.default: T.t,
        aten.transpose.int: T.transpose,
        aten.unsqueeze.default: T.unsqueeze,
        aten.squeeze.dim: T.squeeze,
        aten.select.int: T.select,
        aten.permute.default: T.permute,
    }


_TENSOR_METHODS = _tensor_methods()


def _binding_named(func):
    # torch's generated Python function of the op's name (it may pick another overload).
    if not isinstance(func, torch._ops.OpOverload) or func.namespace != "aten":
        return None
    op_name = func._schema.name.split("::", 1)[1]
    for module in (torch._C._VariableFunctions, torch._C._nn):
        binding = getattr(module, op_name, None)
        if binding is not None:
            return binding
    return None


def _python_binding(func):
    """torch's generated Python binding of ``func`` where it can only mean ``func``, or None.

    That is an aten ``default`` overload whose other overloads are all ``out=`` variants
    (``_softmax``, ``native_layer_norm``, ``embedding``, ``mse_loss``): called without
    ``out=``, the binding's argument parser picks ``func``. It parses the arguments in C++,
    where the OpOverload's C++ callable boxes them through pybind (``native_layer_norm``
    ~1.5 us less, ``_softmax`` ~0.7 us).
    """
    if not isinstance(func, torch._ops.OpOverload) or func.namespace != "aten" or func._overloadname != "default":
        return None
    packet = func._overloadpacket
    for name in packet.overloads():
        if name != "default" and not any(a.is_out for a in getattr(packet, name)._schema.arguments):
            return None
    return _binding_named(func)


def fast_op(func):
    """The cheapest callable equivalent to ``func`` on plain tensors, positional arguments.

    A few view ops have a Tensor method that skips the boxed call of the OpOverload's
    C++ callable (``detach`` ~1 us less); an op with one functional overload its Python
    binding (see ``_python_binding``); any other op: ``raw_op(func)``. For handlers (inside
    ``__torch_dispatch__`` torch-function modes are off, so a method call is not
    intercepted by one).
    """
    hit = _FAST_OPS.get(func)
    if hit is None:
        hit = _FAST_OPS[func] = _TENSOR_METHODS.get(func) or _python_binding(func) or raw_op(func)
    return hit


_FAST_OPS: dict = {}


class _FirstOp(Exception):
    """Carries the first op a call dispatched, with its arguments (see ``_StopAtFirstOp``)."""


class _StopAtFirstOp(TorchDispatchMode):
    # Raises before any kernel runs: asking which op a binding dispatches has no effect (no
    # computation, no RNG draw, no write), so it is safe on any arguments.
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        raise _FirstOp(func, args, kwargs or {})


def _same_value(seen, given) -> bool:
    if isinstance(given, torch.Tensor) or isinstance(seen, torch.Tensor):
        return seen is given
    if type(seen) is not type(given):
        return False
    if type(given) in (list, tuple):
        return len(seen) == len(given) and all(_same_value(s, g) for s, g in zip(seen, given))
    return seen == given


def _dispatches_itself(binding, func, args: tuple, kwargs: dict) -> bool:
    """True when ``binding(*args, **kwargs)`` dispatches ``func`` first, with these arguments."""
    try:
        with _StopAtFirstOp():
            binding(*args, **kwargs)
    except _FirstOp as first:
        seen, seen_args, seen_kwargs = first.args
    except Exception:  # the binding refuses these arguments: it is not the op's equivalent
        return False
    else:
        return False  # returned without dispatching anything
    return (seen is func and len(seen_args) == len(args) and seen_kwargs.keys() == kwargs.keys()
            and all(_same_value(s, g) for s, g in zip(seen_args, args))
            and all(_same_value(seen_kwargs[k], v) for k, v in kwargs.items()))


def _type_tree(a):
    t = type(a)
    return (t, tuple([_type_tree(b) for b in a])) if t in (list, tuple) else t


def fast_op_for(func, args: tuple, kwargs: dict):
    """``fast_op(func)``, or the Python binding of ``func``'s name where calls with
    arguments of the types of ``args``/``kwargs`` (plain values: a handler's locals) dispatch
    ``func`` itself.

    ``fast_op`` takes a binding only where the op has one functional overload; here an op
    with several (``var.correction``, ``add.Tensor``, ``sum.dim_IntList``, ``mm``) gets its
    binding too when asking it (once per op and argument types, under a mode that stops at
    the first op, so nothing runs) shows that the binding's argument parser picks ``func``
    with the very arguments given. The parser chooses an overload from the arguments' types
    and keyword names alone, so the answer holds for every call of those types (a cached
    plan's key pins them). The binding parses in C++ where the boxed call goes through
    pybind (``add`` ~0.4 us less, ``var`` with ``correction=`` ~0.9 us). ``fast_op``'s own
    binding is asked the same way, and refused where it dispatches other arguments (a
    binding default that differs from the schema's). Not while tracing: speed does not
    matter there, and the trace sees the op either way.
    """
    op = fast_op(func)
    if func in _TENSOR_METHODS or in_fake_or_proxy_mode():
        return op
    key = (func, _type_tree(args), tuple([(k, _type_tree(v)) for k, v in kwargs.items()]))
    hit = _BINDINGS.get(key)
    if hit is None:
        raw = raw_op(func)
        # fast_op's own binding is asked too: a binding's default may differ from the
        # schema's (torch._C._nn.mse_loss defaults reduction to 'none', the op to 'mean'), and
        # dispatch leaves out arguments at the schema's default.
        binding = op if op is not raw else _binding_named(func) if _one_tensor_out(func) else None
        ok = binding is not None and _dispatches_itself(binding, func, tuple(args), dict(kwargs))
        hit = _BINDINGS[key] = binding if ok else raw
    return hit


_BINDINGS: dict = {}


def _one_tensor_out(func) -> bool:
    # A binding of an op with several results may return a named tuple (torch.return_types)
    # where the op returns a tuple: only single-tensor results are taken as the same.
    schema = getattr(func, "_schema", None)
    returns: list = schema.returns if schema is not None else []
    return len(returns) == 1 and isinstance(returns[0].type, torch.TensorType)


def is_pure_view(func) -> bool:
    """True for an aten view op that always returns a view of its first argument.

    CompositeImplicitAutograd "views" (reshape, flatten, ...) may copy instead; a copy of a
    pending collective buffer would read it before the wait (pytorch#133421), so those do
    not count. They reach a __torch_dispatch__ only under unusual dispatch anyway.
    """
    if not isinstance(func, torch._ops.OpOverload) or not func.is_view:
        return False
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), torch._C.DispatchKey.CompositeImplicitAutograd):
        return False
    args = func._schema.arguments
    return bool(args) and args[0].alias_info is not None and not args[0].alias_info.is_write


def writes_an_argument(func) -> bool:
    """True for in-place and out= ops (an argument is written)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return False
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)

from torch.utils.weak import WeakTensorKeyDictionary  # noqa: E402  (identity-keyed, weak)



def is_composite_implicit(func) -> bool:
    """True when ``func`` has a CompositeImplicitAutograd kernel (it decomposes itself)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


def decomposition(func):
    """torch's Python decomposition of an aten overload (``torch._decomp``), or None."""
    from torch._decomp import decomposition_table

    return decomposition_table.get(func)

def chunk_cat(tensors: list, dim: int, num_chunks: int) -> torch.Tensor:
    """aten's ``_chunk_cat`` (FSDP2's copy-in): each tensor padded along ``dim`` to a multiple of
    ``num_chunks``, cut into ``num_chunks`` chunks, and chunk ``i`` of every tensor flattened
    into row ``i`` of the result (shape ``(num_chunks, total)`` for ``dim=0``): one op in a
    traced graph, where a pad, a reshape and a cat per tensor would be several. Every tensor
    must be non-empty and of one dtype."""
    return torch._chunk_cat(tensors, dim, num_chunks)


def chunked_linear_cross_entropy():
    """torch's chunked ``F.linear_cross_entropy`` op with a scalar reduction (a custom op,
    ``torch_nn::_linear_cross_entropy_batch_chunked``, registered when its module is
    imported), or None where torch has none."""
    try:
        import torch.nn.modules.linear_cross_entropy  # noqa: F401  (registers the op)
    except ImportError:
        return None
    packet = getattr(getattr(torch.ops, "torch_nn", None), "_linear_cross_entropy_batch_chunked", None)
    return None if packet is None else packet.default


# ---- torch's own counterparts, for the benchmarks (subclass_kit.bench) -------------------------


def torch_two_tensor() -> type:
    """torch's reference wrapper subclass (``torch.testing._internal.two_tensor.TwoTensor``)."""
    from torch.testing._internal.two_tensor import TwoTensor

    return TwoTensor


def torch_funcol():
    """torch's functional collectives module (its AsyncCollectiveTensor and collectives)."""
    import torch.distributed._functional_collectives as funcol

    return funcol


# ---- torch's OpInfo database, for the checker's operator sweep (subclass_kit.testing) ----------


def opinfo_db() -> list:
    """torch's OpInfo list (``common_methods_invocations.op_db``); imported on first use
    because the import takes seconds."""
    from torch.testing._internal.common_methods_invocations import op_db

    return list(op_db)


def _running_test_fn():
    """What torch's ``common_utils.extract_test_fn`` returns -- the function of the unittest
    test method running up the stack, else None -- by a walk over the frames: torch's takes
    ``inspect.stack()``, which reads the source file of every frame."""
    import unittest

    try:
        frame = sys._getframe(1)
        while frame is not None:
            self_val = frame.f_locals.get("self")
            if isinstance(self_val, unittest.TestCase):
                *_, cls_name, test_name = self_val.id().rsplit(".", 2)
                if cls_name == type(self_val).__name__ and test_name.startswith("test"):
                    return getattr(self_val, test_name).__func__
            frame = frame.f_back
    except Exception:
        pass
    return None


def opinfo_samples(info, device, dtype, requires_grad: bool):
    """``info.sample_inputs(device, dtype, requires_grad=...)``: the same samples, without
    torch's stack crawl. OpInfo looks for the running unittest test twice per call (for a
    per-test seed and sample skips) through ``inspect.stack()``, which reads the source of
    every frame on the stack -- about a fifth of an op sweep's time on two ranks, more under
    pytest's deep stacks; here the same lookup (``_running_test_fn``) walks the frames."""
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    saved = {m: getattr(m, "extract_test_fn") for m in (common_utils, core) if hasattr(m, "extract_test_fn")}
    for m in saved:
        setattr(m, "extract_test_fn", _running_test_fn)
    try:
        return info.sample_inputs(device, dtype, requires_grad=requires_grad)
    finally:
        for m, fn in saved.items():
            setattr(m, "extract_test_fn", fn)


def seed_device(seed: int, device) -> None:
    """``torch.manual_seed(seed)`` for the RNG that ops on ``device`` draw from. On the CPU,
    the CPU generator alone: ``torch.manual_seed`` also queues a lazy seeding of every other
    device type, each with a formatted stack (up to a millisecond a call under a deep stack, on
    a CPU-only build)."""
    if torch.device(device).type == "cpu":
        torch.random.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


# Conversions whose result has a layout a wrapper of strided inner tensors cannot hold, by
# the op packet's name (torch._mkldnn is private).
_NOT_STRIDED = {
    "_to_sparse": torch.sparse_coo, "_to_sparse_csr": torch.sparse_csr, "_to_sparse_csc": torch.sparse_csc,
    "_to_sparse_bsr": torch.sparse_bsr, "_to_sparse_bsc": torch.sparse_bsc,
    "to_mkldnn": getattr(torch, "_mkldnn"),  # (not in torch's stubs)
}


def non_strided_result(func):
    """The layout of ``func``'s result when ``func`` converts to a non-strided layout (sparse,
    mkldnn), else None."""
    packet = getattr(func, "overloadpacket", None)
    return None if packet is None else _NOT_STRIDED.get(packet.__name__)


# ---- sizes a handler turns into constants (see _specialize.py) ------------------------------
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode as DataDependentError  # noqa: E402


def active_shape_env():
    """The ShapeEnv of the fake mode that is tracing now (AOTAutograd running a handler on
    fake inner tensors), or None (eager, or static shapes)."""
    mode = _get_mode(_FAKE)
    return None if mode is None else mode.shape_env


def fixed_symbols(env) -> dict:
    """``{symbol: constant}`` for every size symbol ``env`` has specialized to a number."""
    return {k: v for k, v in env.replacements.items() if v.is_number}


def symbol_sources(env, sym) -> list:
    """The names (``L['x'].size()[0]``) dynamo gave the inputs' sizes bound to ``sym``."""
    return [s.name for s in env.var_to_sources.get(sym, ())]


def recompile_limit() -> int:
    """How many graphs dynamo compiles for one frame before it falls back to eager (also the
    compile boundary's default limit of kept artifacts)."""
    return int(torch._dynamo.config.recompile_limit)


# ---- the compile boundary (boundary.py, _boundary_entries.py, _boundary_trace.py, _boundary_record.py) ----


def tensor_guard(tensors: list, free: int = 0):
    """dynamo's C++ TENSOR_MATCH over ``tensors``, every size and stride static: an object
    whose ``check(*tensors)`` is True when each has the recorded type, dispatch keys, dtype,
    device, requires_grad, sizes and strides. The first ``free`` tensors' sizes and strides
    are not checked (their rank is)."""
    from torch._C._dynamo.guards import TensorGuards

    # per tensor, per dim (torch's stub says flat); None: any value
    sizes: Any = [[None] * t.dim() if i < free else list(t.shape) for i, t in enumerate(tensors)]
    strides: Any = [[None] * t.dim() if i < free else list(t.stride()) for i, t in enumerate(tensors)]
    return TensorGuards(*tensors, dynamic_dims_sizes=sizes, dynamic_dims_strides=strides)


def comptime():
    """dynamo's ``comptime``: ``comptime(cb)`` in traced code runs ``cb(ctx)`` while dynamo
    traces that frame (``cb`` must be made outside the traced code); a no-op in eager."""
    from torch._dynamo.comptime import comptime as _comptime

    return _comptime


def comptime_items(ctx, name: str) -> list:
    """The values of the traced local ``name`` (a list or tuple) as dynamo sees them: a fake
    tensor for each tensor (a fake wrapper for a wrapper), the constant otherwise, or
    ``NotImplemented`` for a value that is neither (a SymInt, an opaque object)."""
    from torch._dynamo.comptime import ComptimeVar

    seq = ctx.get_local(name)._i_will_not_complain_if_bc_breaks_VariableTracker()
    out = []
    for vt in seq.items:
        v = ComptimeVar(vt)
        try:
            if issubclass(v.python_type(), torch.Tensor):
                out.append(v.as_fake())
            elif v.is_python_constant():
                out.append(v.as_python_constant())
            else:
                out.append(NotImplemented)
        except Exception:  # a value comptime cannot describe: never rebuilt by the boundary
            out.append(NotImplemented)
    return out


def comptime_constant(ctx, name: str):
    """The traced local ``name`` as a Python constant (e.g. a pytree spec)."""
    return ctx.get_local(name).as_python_constant()


def storage_ref(t: torch.Tensor):
    """A value equal for two tensors (real or fake) exactly when they share a storage."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(t.untyped_storage())


def is_grad_mode_on() -> bool:
    return torch.is_grad_enabled()


def has_dynamic_marks(t: torch.Tensor) -> bool:
    """True when ``torch._dynamo.mark_dynamic`` (or a weak/unbacked mark) was applied to ``t``."""
    return any(hasattr(t, a) for a in ("_dynamo_dynamic_indices", "_dynamo_weak_dynamic_indices",
                                       "_dynamo_unbacked_indices"))


def root_mesh_dim(mesh):
    """``(root mesh, dim)`` of a 1-D DeviceMesh sliced out of a larger one by dim name
    (``mesh2d["dp"]``), or None (torch keeps the parent privately)."""
    root = getattr(mesh, "_get_root_mesh", lambda: None)()
    if root is None or root is mesh or mesh.ndim != 1:
        return None
    dim = mesh._get_root_mesh_dim()
    return None if dim is None else (root, dim)


# ---- the compile boundary's direct call (_boundary_direct.py) ---------------------------------


def dynamo_artifacts(compiled) -> list:
    """What dynamo keeps for the frame of ``compiled`` (a ``torch.compile``'d function): one
    ``(guard_check, code, globals)`` per cache entry, most recently used first.
    ``guard_check({"<arg>": value, ...})`` is dynamo's own C++ guard tree over the frame's
    locals (everything dynamo would check before running ``code``: tensors, aliasing, global
    state, whatever the traced code read); ``code`` is the bytecode dynamo runs when it passes.
    """
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.eval_frame import innermost_fn

    fn = innermost_fn(compiled)
    return [(ce.guard_manager.root.check, ce.code, fn.__globals__)
            for ce in _debug_get_cache_entry_list(fn.__code__)]


def dynamo_live_codes() -> set:
    """The ids of the code objects dynamo produced and still holds (``torch._dynamo.reset()``
    empties it, in place): an id missing from it is an artifact dynamo has dropped."""
    from torch._dynamo import convert_frame

    return convert_frame.output_codes.seen_ids


def dynamo_idle():
    """A zero-argument function, True while no dynamo callback is active (not inside a
    compiled region's eager parts, nor tracing), ``torch.compiler.set_stance`` is at its
    default and no guard-complete hook is set (``torch.compiler.set_enable_guard_collectives``:
    every rank must take part in each guard evaluation): then running dynamo's code for a
    frame after its guards pass is what dynamo itself would do."""
    from torch._C._dynamo.eval_frame import get_eval_frame_callback, set_guard_complete_hook
    from torch._dynamo import eval_frame

    def idle() -> bool:
        s = eval_frame._stance
        if not (get_eval_frame_callback() is None and s.stance == "default" and not s.skip_guard_eval_unsafe
                and s.backend is None):
            return False
        # torch has no getter for the hook: take it out and put it back (None stays None).
        hook = set_guard_complete_hook(None)
        if hook is None:
            return True
        set_guard_complete_hook(hook)
        return False

    return idle


def dynamo_disabled_inner(fn):
    """The function a ``torch._dynamo.disable`` wrapper calls (or None if ``fn`` is not one):
    with no dynamo callback active the wrapper only switches it off and on again."""
    if getattr(fn, "_torchdynamo_disable", False) and not torch.compiler.is_exporting():
        return getattr(fn, "_torchdynamo_orig_callable", None)
    return None
