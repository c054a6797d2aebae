"""The one place where subclass_kit touches private torch internals.

Everything here is a thin alias or a few lines; when torch moves a name, only this module
changes. Nothing outside this module should spell ``torch._C``, ``torch._dynamo`` or other
underscore names of torch.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as python_pytree  # noqa: F401  (re-exported for subclass_kit.pytree)
from torch.utils._python_dispatch import (  # noqa: F401
    get_alias_info,
    is_traceable_wrapper_subclass,
    return_and_correct_aliasing,
)

make_wrapper_subclass = torch.Tensor._make_wrapper_subclass
disabled_torch_function_impl = torch._C._disabled_torch_function_impl
DisableTorchFunctionSubclass = torch._C.DisableTorchFunctionSubclass
functionalize_unsafe_set = torch._functionalize_unsafe_set
sym_check = torch._check
SymInt = torch.SymInt


def is_compiling() -> bool:
    """True while dynamo traces (torch.compile, strict export) or make_fx traces (non-strict
    export, AOTAutograd)."""
    if torch.compiler.is_compiling():
        return True
    return bool(torch.compiler._is_non_strict_tracing())


def is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import is_fake as _is_fake

    return _is_fake(t)


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
