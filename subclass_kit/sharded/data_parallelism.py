"""Data parallelism, compile-first: ``data_parallel(model, mesh, mode=...)``.

The design of torchtitan's SimpleFSDP, on ShardedTensor: each parameter is stored as a
ShardedTensor over the data-parallel mesh (``Shard(0)`` for full sharding, ``Replicate()``
for DDP, ``(Replicate(), Shard(0))`` on a 2-D mesh for hybrid sharding), and reading it
(``module.weight``) runs a small parametrization instead::

    param.redistribute(mesh, [Replicate()] * ndim, forward_dtype=param_dtype, backward_dtype=reduce_dtype)
         .to_local(grad_placements=[Partial("avg")] * ndim)

The forward all-gathers the shards (nothing to do for DDP); the gradient of the plain result
is each rank's addend of the batch mean (``Partial('avg')``), and the redistribute's
backward brings it to the parameter's placements: a reduce-scatter (FSDP), an all-reduce
(DDP), both (HSDP). Nothing is hooked: the communication is part of the autograd graph, so
``torch.compile`` of the whole model traces it into its forward and backward graphs, where
the compiler can schedule it.

That is the per-parameter path (a parameter read outside its unit's forward). The forward of
a unit (the root, and each block of a ModuleList/ModuleDict, as FSDP wraps a model) gathers
all its parameters in one collective and its backward reduces their gradients in one
(``_dp_bucket``): a step synchronizes the ranks once per unit, not once per parameter.

With tensor parallelism (``parallelize`` first, over the ``tp`` dim of a 2-D mesh; then
``data_parallel`` over its ``dp`` dim): a parameter that is already a ShardedTensor on the
TP mesh is stored on the 2-D mesh, its dim 0 sharded over dp on top of TP's shard (the
strided layout, ``[_StridedShard(0, split_factor=tp), Shard(0)]`` for a Colwise weight, as
SimpleFSDP stores it; ``full_tensor()`` is the dense parameter). The parametrization
gathers the TP shard over dp and rebuilds the TP parameter (``from_local`` on the TP
mesh), as SimpleFSDP's FSDP + TP does.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .. import _compat
from .convert import distribute, from_local
from .errors import ParallelizeError
from .mesh import MeshLike, MeshRef, mesh_ref
from ._dp_bucket import Bucket, gather_bucket
from ._layout import contiguous_strides
from .placements import Partial, Placement, Replicate, Shard, _StridedShard
from .tensor import ShardedTensor, _from_local

__all__ = ["MixedPrecisionPolicy", "data_parallel", "MODES"]

#: The modes of :func:`data_parallel` and the placements each stores a parameter with.
MODES = {
    "fully_shard": (Shard(0),),
    "replicate": (Replicate(),),
    "hybrid_shard": (Replicate(), Shard(0)),
}


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """The dtypes of data parallelism's communication and compute (SimpleFSDP's policy).

    Args:
        param_dtype: the dtype parameters are gathered in and computed with (e.g. bf16);
            None keeps the stored dtype.
        reduce_dtype: the dtype gradients are reduced in (e.g. fp32); None: the stored
            parameter's dtype. The gradient returns in the stored dtype either way.

    Example:
        >>> import torch
        >>> MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32).param_dtype
        torch.bfloat16
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None


@dataclass(frozen=True)
class _Spec:
    """What the parametrization of one parameter needs (constants while tracing)."""

    mesh: MeshRef
    compute: tuple  # Replicate per dp mesh dim
    grad: tuple  # Partial('avg') per dp mesh dim
    param_dtype: Any
    reduce_dtype: Any
    tp: Any = None  # (mesh, placements, shape, stride) of a TP parameter, else None
    dp: Any = None  # (dp placements, TP-shard shape) of a TP parameter stored on the 2-D mesh


def _replicate_compute(module: nn.Module, name: str):
    p: Any = module._parameters[name]
    s: _Spec = getattr(module, "_kit_dp")[name]
    if s.dp is not None:
        # Stored on the (dp, tp) mesh: this rank's piece is its dp shard of the TP shard.
        p = from_local(p.to_local(), s.mesh, s.dp[0], shape=s.dp[1], stride=contiguous_strides(s.dp[1]))
    full = p.redistribute(s.mesh, s.compute, forward_dtype=s.param_dtype, backward_dtype=s.reduce_dtype)
    local = full.to_local(grad_placements=s.grad)
    if s.tp is None:
        return local
    tp_mesh, tp_placements, shape, stride = s.tp
    return from_local(local, tp_mesh, tp_placements, shape=shape, stride=stride)


def _parametrized(name: str) -> property:
    def get(self: nn.Module) -> torch.Tensor:
        live = self._kit_owner.live  # type: ignore[union-attr]
        if live is not None:  # gathered with its unit's other parameters (see _unit_forward)
            return live[self._kit_slots[name]]  # type: ignore[index]
        return _replicate_compute(self, name)

    return property(get)


class _Unit:
    """A group of parameters gathered in one collective when ``module`` runs: the root and
    each block of a ModuleList/ModuleDict (a transformer's layers), as FSDP wraps them.

    ``read``: ``read(unit_module)`` returns each distinct stored parameter (the bucket's
    inputs), read through the unit module's own submodule path (see :func:`_reader`); ``tp``: (bucket index, TP spec) of each parameter
    the forward rebuilds on its TP mesh; ``live``: while ``module``'s forward runs, the
    gathered parameters by bucket index (a member module's ``_kit_slots`` maps its
    parameter names there), else None.

    The forward's bookkeeping is one attribute set and reset, not a write per parameter:
    ``torch.compile`` interprets every bytecode of it (and guards what it reads)."""

    def __init__(self, base_forward, bucket, read, tp: tuple):
        self.base_forward, self.bucket, self.read, self.tp = base_forward, bucket, read, tp
        self.live: tuple | None = None


# One reader per tuple of paths: every block of a ModuleList shares its function (and so
# dynamo's guards on its code).
_READERS: dict = {}


def _reader(paths: tuple):
    """``read(module)``: the parameter at each ``(submodule path, name)`` of ``paths``, as one
    expression of ``_modules[...]`` and ``_parameters[...]`` lookups.

    The unit's forward reads its parameters the way the wrapped forward reaches its
    submodules (``self._modules['w1']``), so torch.compile sees each module and parameter
    under one source: it guards each once, with no identity guard between two paths to
    one module, and traces no loop over the parameters."""
    fn = _READERS.get(paths)
    if fn is None:
        items = ["m" + "".join(f"._modules[{k!r}]" for k in path) + f"._parameters[{name!r}]" for path, name in paths]
        env: dict = {}
        exec(f"def read(m):\n    return ({', '.join(items)},)\n", env)  # noqa: S102 - names are repr()'d
        fn = _READERS[paths] = env["read"]
    return fn


def _unit_forward(self: nn.Module, *args, **kwargs):
    u: _Unit = self._kit_unit  # type: ignore[assignment]
    outs: Any = gather_bucket(u.bucket, u.read(self))
    if u.tp:
        outs = list(outs)
        for i, (tp_mesh, tp_placements, shape, stride) in u.tp:
            # The graph function itself: from_local's argument handling is constant here.
            outs[i] = _from_local(outs[i], tp_mesh, tp_placements, shape, stride, False)
    u.live = outs
    try:
        return u.base_forward(self, *args, **kwargs)
    finally:
        # The gathered parameters live for this call only (FSDP's reshard after forward;
        # autograd keeps what the backward needs).
        u.live = None


# One class per (module class, parameter names, unit or not): every block of a model shares
# it, so a compiled block's code (and dynamo's cache) is shared too.
_CLASSES: dict = {}


def _wrap_class(module: nn.Module, names: tuple, unit: bool) -> None:
    key = (type(module), names, unit)
    cls = _CLASSES.get(key)
    if cls is None:
        props: dict[str, Any] = {n: _parametrized(n) for n in names}
        if unit:
            props["forward"] = _unit_forward
        cls = type(f"DataParallel{type(module).__name__}", (type(module),), props)
        # Importable by name, so a pickled model (or a graph that names the class) resolves it.
        cls.__module__ = __name__
        setattr(sys.modules[__name__], cls.__name__, cls)
        _CLASSES[key] = cls
    module.__class__ = cls


def _spanned(dp_mesh, tp: ShardedTensor, placements: tuple):
    """The 2-D (dp, tp) mesh both 1-D meshes were sliced from and the parameter's placements
    on it (dp's shard of dim 0 on top of TP's: strided when TP shards dim 0 too), or None."""
    if len(placements) != 1 or tp.mesh.ndim != 1:
        return None
    dp_root, tp_root = _compat.root_mesh_dim(dp_mesh), _compat.root_mesh_dim(tp.device_mesh)
    if dp_root is None or tp_root is None or dp_root[0] is not tp_root[0] or dp_root[0].ndim != 2:
        return None
    root, (dp_dim, tp_dim) = dp_root[0], (dp_root[1], tp_root[1])
    tp_pl, dp_pl = tp.placements[0], placements[0]
    if dp_pl.is_shard() and tp_pl.is_shard(dp_pl.dim):
        # torch's order of a dim split by two mesh dims is right to left; the dp dim comes
        # first here, so it splits each TP shard: strided.
        if dp_dim > tp_dim:
            return None
        dp_pl = _StridedShard(dp_pl.dim, split_factor=tp.mesh.size())
    spanned = [None, None]
    spanned[dp_dim], spanned[tp_dim] = dp_pl, tp_pl
    return root, spanned


def _dp_param(p: torch.Tensor, dp_mesh, ref: MeshRef, placements: tuple, what: str):
    """The stored parameter, its TP spec (None for a plain parameter) and its dp spec (None
    unless stored on the 2-D mesh)."""
    if not isinstance(p, ShardedTensor):
        return distribute(p.detach(), ref, placements), None, None
    if p.mesh == ref:
        raise ParallelizeError(
            f"data_parallel: parameter {what!r} is already a ShardedTensor on the data-parallel mesh {ref}; "
            "tensor parallelism and data parallelism need different mesh dims (mesh['tp'], mesh['dp'])."
        )
    if any(type(q) is Partial for q in p.placements):
        raise ParallelizeError(f"data_parallel: parameter {what!r} is {p.placements}; a parameter cannot be Partial.")
    tp = (p.mesh, p.placements, tuple(p.shape), tuple(p.stride()))
    local = p.to_local().detach()
    mine = distribute(local, ref, placements)
    spanned = _spanned(dp_mesh, p, placements) if not isinstance(dp_mesh, MeshRef) else None
    if spanned is None:
        return mine, tp, None
    root, pls = spanned
    stored = from_local(mine.to_local(), root, pls, shape=tp[2], stride=tp[3])
    return stored, tp, (placements, tuple(local.shape))


#: The mesh dim that shards dim 0 in each mode (None: replicated).
_SHARD_DIM = {"fully_shard": 0, "replicate": None, "hybrid_shard": 1}


def _unit_owners(model: nn.Module) -> dict:
    """id(module) -> the unit that gathers its parameters: the innermost of the root and the
    elements of a ModuleList/ModuleDict (the blocks) above it."""
    owners: dict = {}

    def walk(mod: nn.Module, unit: nn.Module) -> None:
        if id(mod) in owners:  # a shared module: its first place decides
            return
        owners[id(mod)] = unit
        stack = isinstance(mod, (nn.ModuleList, nn.ModuleDict))
        for child in mod.children():
            walk(child, child if stack else unit)

    walk(model, model)
    return owners


def _make_unit(unit_mod: nn.Module, ref: MeshRef, shard_dim, mp: MixedPrecisionPolicy, got: list) -> _Unit:
    paths = {id(m): tuple(p.split(".")) if p else () for p, m in unit_mod.named_modules()}
    sources: list = []  # (module, name) per distinct parameter
    index: dict = {}  # id(parameter) -> its place in sources
    shapes: list = []
    tp: list = []
    for mod, names in got:
        for n in names:
            p, s = mod._parameters[n], mod._kit_dp[n]
            if id(p) not in index:
                index[id(p)] = len(sources)
                sources.append((mod, n))
                # The data-parallel layout's global shape: the TP shard when stored on (dp, tp).
                shapes.append(tuple(s.dp[1]) if s.dp is not None else tuple(p.shape))
                if s.tp is not None:
                    tp.append((index[id(p)], s.tp))
    bucket = Bucket(ref, tuple(shapes), shard_dim, mp.param_dtype, mp.reduce_dtype)
    read = _reader(tuple((paths[id(m)], n) for m, n in sources))
    unit = _Unit(type(unit_mod).forward, bucket, read, tuple(tp))
    for mod, names in got:
        mod._kit_owner = unit
        mod._kit_slots = {n: index[id(mod._parameters[n])] for n in names}
    return unit


def data_parallel(model: nn.Module, mesh: MeshLike, *, mode: str = "fully_shard",
                  mp_policy: MixedPrecisionPolicy | None = None) -> nn.Module:
    """Make ``model`` data parallel over ``mesh``, in place (SimpleFSDP's design).

    Every parameter becomes a ShardedTensor over ``mesh`` laid out per ``mode``:
    ``"fully_shard"`` (FSDP: ``Shard(0)``; the forward all-gathers, the backward
    reduce-scatters), ``"replicate"`` (DDP: ``Replicate()``; the backward all-reduces) or
    ``"hybrid_shard"`` (HSDP on a 2-D mesh: replicated over dim 0, sharded over dim 1).
    Gradients are averaged over the ranks (each rank feeds its part of the batch and a mean
    loss). The values of the rank at coordinate 0 are used (a broadcast), as torch's
    ``distribute_tensor``. Compile the model (or each block) afterwards: the communication
    is in the autograd graph, so it lands in the compiled forward and backward. Each unit
    (the root and each block of an ``nn.ModuleList``/``nn.ModuleDict``) gathers its
    parameters in one collective when its ``forward`` runs, and reduces their gradients in
    one (an unused parameter of a unit gets a zero gradient).

    Parameters already sharded by :func:`parallelize` over another mesh (the ``tp`` dim of a
    2-D mesh whose ``dp`` dim is ``mesh``) are held as their TP shard sharded over ``mesh``
    (FSDP + TP); the forward rebuilds the TP parameter.

    Args:
        model: the module (its parameters are replaced, tied parameters stay tied).
        mesh: the data-parallel DeviceMesh (1-D; 2-D for ``hybrid_shard``).
        mode: ``"fully_shard"``, ``"replicate"`` or ``"hybrid_shard"``.
        mp_policy: a :class:`MixedPrecisionPolicy` (gather in ``param_dtype``, reduce
            gradients in ``reduce_dtype``); None: the parameters' own dtype.

    Returns:
        ``model``.

    Raises:
        ParallelizeError: an unknown mode, a mesh of the wrong dimension, a module already
            made data parallel.

    Example:
        >>> import torch
        >>> from subclass_kit.sharded import MeshRef, data_parallel
        >>> lin = data_parallel(torch.nn.Linear(4, 2), MeshRef.local(), mode="fully_shard")
        >>> lin._parameters["weight"].placements, lin.weight.shape, type(lin.weight).__name__
        ((Shard(0),), torch.Size([2, 4]), 'Tensor')
    """
    if mode not in MODES:
        raise ParallelizeError(
            f"data_parallel: mode={mode!r} is not one of {', '.join(map(repr, MODES))}."
        )
    ref = mesh_ref(mesh)
    placements: tuple[Placement, ...] = MODES[mode]
    if ref.ndim != len(placements):
        raise ParallelizeError(
            f"data_parallel(mode={mode!r}) needs a {len(placements)}-D mesh, got a {ref.ndim}-D one "
            f"{ref.shape}. " + ("Pass a 2-D (replicate, shard) mesh, e.g. init_device_mesh('cpu', (2, 2))."
                               if len(placements) == 2 else "Pass the dp dim of a 2-D mesh, e.g. mesh['dp'].")
        )
    mp = mp_policy or MixedPrecisionPolicy()
    compute = (Replicate(),) * ref.ndim
    grad = (Partial("avg"),) * ref.ndim
    done: dict = {}  # id(original parameter) -> the new one (tied parameters stay tied)
    owners = _unit_owners(model)
    members: dict = {}  # id(unit) -> [(module, names)]
    for mod_name, mod in list(model.named_modules()):
        if type(mod) in _CLASSES.values():
            raise ParallelizeError(
                f"data_parallel: module {mod_name or type(mod).__name__!r} is already data parallel; "
                "apply data_parallel once per model."
            )
        names = tuple(n for n, p in mod._parameters.items() if p is not None and p.numel() > 0)
        if not names:
            continue
        specs = {}
        for n in names:
            p = mod._parameters[n]
            what = f"{mod_name}.{n}" if mod_name else n
            if id(p) not in done:
                stored, tp, dp = _dp_param(p, mesh, ref, placements, what)
                done[id(p)] = (nn.Parameter(stored, requires_grad=p.requires_grad), tp, dp)
            new, tp, dp = done[id(p)]
            mod._parameters[n] = new
            specs[n] = _Spec(ref, compute, grad, mp.param_dtype, mp.reduce_dtype, tp, dp)
        mod._kit_dp = specs
        members.setdefault(id(owners[id(mod)]), []).append((mod, names))
    shard_dim = _SHARD_DIM[mode]
    units = set()
    for unit_mod in {id(u): u for u in owners.values()}.values():
        got = members.get(id(unit_mod))
        if got:
            unit_mod._kit_unit = _make_unit(unit_mod, ref, shard_dim, mp, got)
            units.add(id(unit_mod))
    for mod in model.modules():
        names = tuple(getattr(mod, "_kit_dp", ()))
        if (names or id(mod) in units) and type(mod) not in _CLASSES.values():
            _wrap_class(mod, names, id(mod) in units)
    return model
