"""Tensor parallelism with torch's ``torch.distributed.tensor.parallel`` names and semantics:
``parallelize`` (``parallelize_module``), ``ColwiseParallel``, ``RowwiseParallel``,
``SequenceParallel``, ``PrepareModuleInput``, ``PrepareModuleOutput``,
``PrepareModuleInputOutput``.

- ``ColwiseParallel`` on ``nn.Linear`` holds the rows of its weight (output features) and
  bias; fed a replicated input it produces its slice of the output features. On
  ``nn.Embedding`` it holds a slice of the embedding dim (weight ``Shard(1)``).
- ``RowwiseParallel`` on ``nn.Linear`` holds the columns of its weight (input features); fed
  that slice it produces a Partial sum, reduced to ``output_layouts`` (``Replicate()``: one
  all-reduce; ``Shard(d)``: one reduce-scatter). On ``nn.Embedding`` it is the
  vocab-parallel embedding: weight ``Shard(0)``, each rank looks up the tokens of its vocab
  range (zeros elsewhere), a Partial sum reduced the same way.
- ``SequenceParallel`` replicates a module's parameters (norm layers) and runs it on an input
  sharded on the sequence dim.
- ``PrepareModuleInput``/``PrepareModuleOutput``/``PrepareModuleInputOutput`` (in
  ``prepare.py``) only convert layouts at a module's boundary (e.g. all-gather the sequence
  before attention).

Placements may be given as one placement or a one-element sequence (the mesh is 1-D), and
torch's own ``Shard``/``Replicate`` are accepted. Colwise then Rowwise is the Megatron MLP:
one all-reduce forward, one in backward, and plain tensors in and out
(``use_local_output=True``).
"""

from __future__ import annotations

import fnmatch
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

from ..compiling import is_compiling
from .convert import distribute, redistribute, to_local
from .tensor import from_local_shape
from .errors import MeshError, ParallelizeError
from ._layout import chunk_size, chunk_start
from .mesh import MeshLike, current_mesh, mesh_ref
from .placements import Partial, Placement, Replicate, Shard, _from_torch, render
from .tensor import ShardedTensor

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel", "parallelize"]


# ---- helpers ----------------------------------------------------------------------------
def _one(value, kind: str, field: str, name: str):
    """A single placement from ``value`` (a placement or a one-element sequence), or None."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise ParallelizeError(
                f"{kind}({field}={render(list(value))}) on {name!r}: {len(value)} placements for a "
                f"1-D mesh; tensor parallelism shards over one mesh dimension, so pass exactly one "
                f"placement, e.g. {field}=Shard(1)."
            )
        value = value[0]
    if not isinstance(value, Placement):
        got, value = value, _from_torch(value)
        if value is None:
            raise ParallelizeError(
                f"{kind}({field}=...) on {name!r}: {got!r} is not a placement; use Shard(dim), "
                "Replicate() or Partial() (subclass_kit.sharded or torch.distributed.tensor)."
            )
    return value


def _dim(p: Placement, ndim: int) -> Placement:
    """``p`` with a negative Shard dim resolved against a tensor of ``ndim`` dims."""
    return Shard(p.dim % ndim) if type(p) is Shard and p.dim < 0 else p


def _check_mesh(mesh, kind: str, name: str):
    try:
        ref = mesh_ref(mesh)
    except MeshError as e:
        raise ParallelizeError(f"{kind} on {name!r}: {e}") from None
    if ref.ndim != 1:
        raise ParallelizeError(
            f"{kind} on {name!r} shards over a 1-D mesh, got a {ref.ndim}-D mesh {ref}; pass one "
            "mesh dimension (e.g. mesh['tp'])."
        )
    return ref


def _to_sharded(x, ref, layout: Placement, desired: Placement, kind: str, name: str, what: str, global_shape=None):
    """``x`` (plain: this rank's part under ``layout``; or a ShardedTensor) as a ShardedTensor
    laid out ``desired``."""
    if isinstance(x, ShardedTensor):
        # Checked eagerly; under torch.compile the metadata is not read here (redistribute
        # itself refuses another mesh).
        if not is_compiling() and x.mesh != ref:
            raise ParallelizeError(
                f"{kind} on {name!r}: {what} lives on {x.mesh} but the module was "
                f"parallelized over {ref}; parallelize every module of the model over one mesh, "
                "or redistribute the input onto it first."
            )
        want = (_dim(desired, x.dim()),)
        # Already laid out so (and on this mesh): nothing to trace, as DTensor's styles skip
        # the redistribute (under torch.compile both are constants, read with no guard).
        return x if x.placements == want and x.mesh == ref else redistribute(x, ref, want)
    if not isinstance(x, torch.Tensor):
        raise ParallelizeError(
            f"{kind} on {name!r}: {what} is a {type(x).__name__}, not a tensor, but a layout "
            f"{layout!r} was given for it; put None at that position of the layouts."
        )
    layout = _dim(layout, x.dim())
    if type(layout) is Shard and layout.dim >= x.dim():
        raise ParallelizeError(
            f"{kind} on {name!r}: {what} has {x.dim()} dims (shape {tuple(x.shape)}) but its layout "
            f"is {layout!r}; give the dim the input is sharded on."
        )
    s = from_local_shape(x, ref, [layout], global_shape)
    return redistribute(s, ref, [_dim(desired, x.dim())]) if layout != _dim(desired, x.dim()) else s


def _finish(out, ref, layout: Placement, use_local: bool, kind: str, name: str):
    if not isinstance(out, ShardedTensor):
        raise ParallelizeError(
            f"{kind} on {name!r}: the module returned a {type(out).__name__}, not a ShardedTensor, "
            "so its output layout cannot be set; apply the style to the module whose output is "
            "computed from the sharded parameters."
        )
    layout = _dim(layout, out.dim())
    # A local output is handed out waited, never a pending AsyncCollectiveTensor (as
    # DTensor's async redistribute leaves it): the next module is usually a compiled block
    # that waits for it first thing anyway, and a pending input is another input type to
    # dynamo -- torchtitan's llama plan compiled block 0 (fed by the embedding's pending
    # reduce-scatter) as a graph of its own, apart from the blocks fed plain tensors.
    if out.placements != (layout,):
        out = redistribute(out, ref, [layout])
    return to_local(out) if use_local else out


def _local_lookup(module, ids, ref, p, coord):
    """Embedding forward on this rank's shard of the weight (placed ``p`` on mesh ``ref`` at
    ``coord``, constants from parallelize time); the ShardedTensor result."""
    w = module.weight
    local_w = to_local(w)
    if type(p) is Shard and p.dim == 0:
        # Vocab-parallel: this rank holds rows [start, start + n); other tokens give zeros,
        # and the sum over ranks (a Partial) is the full lookup.
        n_vocab = w.shape[0]
        start = chunk_start(n_vocab, ref.size(), coord[0])
        n = chunk_size(n_vocab, ref.size(), coord[0])
        shifted = ids - start
        outside = (shifted < 0) | (shifted >= n)
        pad = module.padding_idx
        pad = pad - start if pad is not None and 0 <= pad - start < n else None
        out = torch.nn.functional.embedding(
            shifted.masked_fill(outside, 0), local_w, pad, module.max_norm, module.norm_type,
            module.scale_grad_by_freq, module.sparse,
        )
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return from_local_shape(out, ref, [Partial()], (*ids.shape, w.shape[1]))
    out = torch.nn.functional.embedding(
        ids, local_w, module.padding_idx, module.max_norm, module.norm_type, module.scale_grad_by_freq, module.sparse
    )
    return from_local_shape(out, ref, [Shard(out.dim() - 1)], (*ids.shape, w.shape[1]))


def _embedding_forward(self, ids):
    ref, placement, coord, kind, name = self._kit_tp
    if isinstance(ids, ShardedTensor):
        if not is_compiling() and ids.mesh != ref:
            raise ParallelizeError(
                f"{kind} on {name!r}: the token ids live on {ids.mesh} but the module was "
                f"parallelized over {ref}; use one mesh."
            )
        ids = to_local(redistribute(ids, ref, [Replicate()]))
    return _local_lookup(self, ids, ref, placement, coord)


class ShardedEmbedding(nn.Embedding):
    """An ``nn.Embedding`` parallelized by ``ColwiseParallel``/``RowwiseParallel``: its forward
    looks up this rank's shard of the weight (the style swaps the module's class)."""

    forward = _embedding_forward


_EMBEDDING_CLASSES: dict = {nn.Embedding: ShardedEmbedding}


def _sharded_embedding_class(cls):
    if cls not in _EMBEDDING_CLASSES:
        _EMBEDDING_CLASSES[cls] = type(f"Sharded{cls.__name__}", (cls,), {"forward": _embedding_forward})
    return _EMBEDDING_CLASSES[cls]


# ---- styles -----------------------------------------------------------------------------
class ParallelStyle:
    """Base of the styles: ``apply(module, mesh, name, src_data_rank=)`` shards parameters
    and installs hooks. ``src_data_rank``: whose parameter values are distributed (the rank
    at that coordinate of the mesh; None: each rank's own, without communication), as
    torch's ``parallelize_module(src_data_rank=)``."""

    def apply(self, module: nn.Module, mesh: MeshLike, name: str = "module", *, src_data_rank: int | None = 0) -> nn.Module:  # pragma: no cover
        raise NotImplementedError


class _LinearOrEmbedding(ParallelStyle):
    # Filled by the subclasses: placements of weight/bias per module kind, default layouts.
    _linear: tuple
    _embedding: Placement
    _default_in: dict
    _default_out: Placement
    input_layouts: Any
    output_layouts: Any
    use_local_output: bool

    def apply(self, module: nn.Module, mesh: MeshLike, name: str = "module", *, src_data_rank: int | None = 0) -> nn.Module:
        kind = type(self).__name__
        if isinstance(module, nn.Linear):
            what = "linear"
            weight, bias = self._linear
        elif isinstance(module, nn.Embedding):
            what = "embedding"
            weight, bias = self._embedding, None
        else:
            raise ParallelizeError(
                f"{kind} applies to nn.Linear and nn.Embedding, but {name!r} is a "
                f"{type(module).__name__}. Map only the Linear/Embedding submodules in the plan "
                "(e.g. 'attention.wq', not 'attention'); use PrepareModuleInput/PrepareModuleOutput "
                "or SequenceParallel for other modules."
            )
        ref = _check_mesh(mesh, kind, name)
        in_layout = _one(self.input_layouts, kind, "input_layouts", name) or self._default_in[what]
        out_layout = _one(self.output_layouts, kind, "output_layouts", name) or self._default_out
        desired_in = self._default_in[what]
        if what == "embedding" and type(in_layout) is not Replicate:
            raise ParallelizeError(
                f"{kind} on embedding {name!r}: input_layouts={in_layout!r}, but an embedding takes "
                "token ids replicated on every rank; use input_layouts=Replicate() (the default)."
            )
        for pname, place in (("weight", weight), ("bias", bias)):
            p = getattr(module, pname, None)
            if p is None or place is None:
                continue
            if isinstance(p, ShardedTensor):
                raise ParallelizeError(
                    f"{kind} on {name!r}: its {pname} is already a ShardedTensor "
                    f"{render(p.placements)}; each module takes one style. Remove the duplicate "
                    "plan entry."
                )
            sharded = distribute(p.detach(), ref, [place], src_data_rank=src_data_rank)
            module.register_parameter(pname, nn.Parameter(sharded, requires_grad=p.requires_grad))
        use_local = self.use_local_output
        coord = ref.coordinate()

        if what == "linear":
            in_features = module.in_features

            def pre_hook(mod, args):
                if not args:
                    raise ParallelizeError(f"{kind} on {name!r}: pass the input positionally (the hook converts args[0]).")
                x = args[0]
                shape = None
                if not isinstance(x, ShardedTensor) and type(in_layout) is Shard and in_layout.dim in (-1, x.dim() - 1):
                    # An input sharded on its features has in_features globally; say so, so
                    # uneven shards (features not divisible by the ranks) are read right.
                    shape = (*x.shape[:-1], in_features)
                return (_to_sharded(x, ref, in_layout, desired_in, kind, name, "the input", shape), *args[1:])

            module.register_forward_pre_hook(pre_hook)
        else:
            setattr(module, "_kit_tp", (ref, weight, coord, kind, name))  # read by the embedding class's forward
            module.__class__ = _sharded_embedding_class(type(module))

        def post_hook(mod, args, out):
            return _finish(out, ref, out_layout, use_local, kind, name)

        module.register_forward_hook(post_hook)
        return module


@dataclass(frozen=True, kw_only=True)
class ColwiseParallel(_LinearOrEmbedding):
    """Shard ``nn.Linear`` by output features (weight and bias ``Shard(0)``), or
    ``nn.Embedding`` by the embedding dim (weight ``Shard(1)``).

    Args:
        input_layouts: how the input arrives (default ``Replicate()``); e.g. ``Shard(1)`` for a
            sequence-sharded activation, gathered before the matmul.
        output_layouts: the output's placement (default ``Shard(-1)``: this rank's features).
        use_local_output: return the local tensor (default) instead of a ShardedTensor.

    Example:
        >>> from subclass_kit.sharded import ColwiseParallel
        >>> ColwiseParallel()
        ColwiseParallel(input_layouts=None, output_layouts=None, use_local_output=True)
    """

    input_layouts: Any = None
    output_layouts: Any = None
    use_local_output: bool = True

    _linear = (Shard(0), Shard(0))
    _embedding = Shard(1)
    _default_in = {"linear": Replicate(), "embedding": Replicate()}
    _default_out = Shard(-1)


@dataclass(frozen=True, kw_only=True)
class RowwiseParallel(_LinearOrEmbedding):
    """Shard ``nn.Linear`` by input features (weight ``Shard(1)``, bias ``Replicate()``), or
    ``nn.Embedding`` by vocabulary (weight ``Shard(0)``: the vocab-parallel embedding).

    The output is a Partial sum, reduced to ``output_layouts``.

    Args:
        input_layouts: how the input arrives (default ``Shard(-1)`` for Linear: a Colwise
            output; ``Replicate()`` for Embedding: the token ids).
        output_layouts: the output's placement (default ``Replicate()``: one all-reduce;
            ``Shard(1)``: one reduce-scatter onto the sequence dim).
        use_local_output: return the local tensor (default) instead of a ShardedTensor.

    Example:
        >>> from subclass_kit.sharded import RowwiseParallel
        >>> RowwiseParallel(use_local_output=False).use_local_output
        False
    """

    input_layouts: Any = None
    output_layouts: Any = None
    use_local_output: bool = True

    _linear = (Shard(1), Replicate())
    _embedding = Shard(0)
    _default_in = {"linear": Shard(-1), "embedding": Replicate()}
    _default_out = Replicate()


@dataclass(frozen=True, kw_only=True)
class SequenceParallel(ParallelStyle):
    """Run a module (a norm layer) on an activation sharded on the sequence dim, with its
    parameters replicated.

    Args:
        sequence_dim: the sharded dim of the input, and of the output when it is handed out local
            (a ShardedTensor output keeps the layout the module gave it, as DTensor's).
        use_local_output: return the local tensor instead of a ShardedTensor (default False).

    A plain input is taken as this rank's part of the sequence; a ShardedTensor input is
    redistributed to ``Shard(sequence_dim)``. The parameters' gradients arrive
    ``Partial('sum')`` (each rank's part of the sequence contributes); ``full_tensor()`` or
    an optimizer step reduces them.

    Example:
        >>> from subclass_kit.sharded import SequenceParallel
        >>> SequenceParallel().sequence_dim
        1
    """

    sequence_dim: int = 1
    use_local_output: bool = False

    def apply(self, module: nn.Module, mesh: MeshLike, name: str = "module", *, src_data_rank: int | None = 0) -> nn.Module:
        kind = type(self).__name__
        ref = _check_mesh(mesh, kind, name)
        for pname, p in list(module.named_parameters(recurse=False)):
            if isinstance(p, ShardedTensor):
                raise ParallelizeError(
                    f"{kind} on {name!r}: its parameter {pname} is already a ShardedTensor "
                    f"{render(p.placements)}; each module takes one style. Remove the duplicate plan entry."
                )
            replicated = distribute(p.detach(), ref, [Replicate()], src_data_rank=src_data_rank)
            module.register_parameter(pname, nn.Parameter(replicated, requires_grad=p.requires_grad))
        seq = Shard(self.sequence_dim)
        use_local = self.use_local_output

        def pre_hook(mod, args):
            if not args:
                raise ParallelizeError(f"{kind} on {name!r}: pass the input positionally (the hook converts args[0]).")
            x = args[0]
            if isinstance(x, torch.Tensor) and not -x.dim() <= self.sequence_dim < x.dim():
                raise ParallelizeError(
                    f"{kind}(sequence_dim={self.sequence_dim}) on {name!r}: the input has shape "
                    f"{tuple(x.shape)}, with no dim {self.sequence_dim}; set sequence_dim to the dim "
                    "the sequence is on."
                )
            return (_to_sharded(x, ref, seq, seq, kind, name, "the input"), *args[1:])

        def post_hook(mod, args, out):
            if not use_local and isinstance(out, ShardedTensor):
                # As DTensor's: the output keeps the layout the module's ops gave it. A norm over
                # the sharded sequence dim returns Replicate; chunking that back to the sequence
                # would only have the next module (say, ColwiseParallel) gather it again.
                return out
            return _finish(out, ref, seq, use_local, kind, name)

        module.register_forward_pre_hook(pre_hook)
        module.register_forward_hook(post_hook)
        return module


# ---- parallelize ------------------------------------------------------------------------
def _matches(pattern: str, name: str) -> bool:
    # Atom by atom, as torch's parallelize_module does: "layers.*.fc1" matches "layers.0.fc1";
    # "" is the module itself (and only it).
    if not pattern or not name:
        return pattern == name
    p, n = pattern.split("."), name.split(".")
    return len(p) == len(n) and all(fnmatch.fnmatchcase(b, a) for a, b in zip(p, n))


def parallelize(
    module: nn.Module, mesh: MeshLike | None = None, plan: Mapping[str, ParallelStyle] | ParallelStyle | None = None, *,
    src_data_rank: int | None = 0,
) -> nn.Module:
    """Apply tensor-parallel styles to submodules of ``module`` in place; return it.

    Args:
        module: the model (same on every rank).
        mesh: a 1-D torch ``DeviceMesh`` (or ``MeshRef``); None: the mesh of the enclosing
            ``with mesh:`` block.
        plan: ``{submodule name or pattern: style}`` (``fnmatch`` patterns per dotted atom,
            as torch's ``parallelize_module``; ``""`` is ``module`` itself), or one style for
            ``module`` itself. An empty plan, or a key that matches no submodule, warns and
            is skipped (as torch does).
        src_data_rank: the rank whose parameter values are distributed (default 0, as
            torch); None: each rank's own values, without communication.

    Raises:
        ParallelizeError: no mesh, or a style that does not fit a module.

    Example:
        >>> from torch import nn
        >>> from subclass_kit.sharded import parallelize, ColwiseParallel, RowwiseParallel, MeshRef
        >>> mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
        >>> mlp = parallelize(mlp, MeshRef.local(), {"0": ColwiseParallel(), "2": RowwiseParallel()})
        >>> type(mlp[0].weight).__name__, mlp[0].weight.placements
        ('ShardedTensor', (Shard(0),))
    """
    if mesh is None:
        mesh = current_mesh()
        if mesh is None:
            raise ParallelizeError(
                f"parallelize({type(module).__name__}): no mesh given and no `with mesh:` block is "
                "active; pass the mesh (e.g. init_device_mesh('cpu', (world,))) or call inside `with mesh:`."
            )
    if isinstance(plan, ParallelStyle):
        return plan.apply(module, mesh, type(module).__name__, src_data_rank=src_data_rank)
    if not plan:
        if plan is not None and not isinstance(plan, dict):
            raise ParallelizeError(
                f"parallelize: plan must map submodule names to styles (or be one style), got {type(plan).__name__}."
            )
        warnings.warn(
            f"parallelize({type(module).__name__}): the plan is empty, so nothing is parallelized; "
            "pass {submodule name: style} or one style for the whole module.",
            UserWarning, stacklevel=2,
        )
        return module
    if not isinstance(plan, dict):
        raise ParallelizeError(
            f"parallelize: plan must map submodule names to styles (or be one style), got {type(plan).__name__}."
        )
    named = list(module.named_modules())
    for pattern, style in plan.items():
        if not isinstance(style, ParallelStyle):
            raise ParallelizeError(
                f"parallelize: plan[{pattern!r}] is {style!r}; use a style: ColwiseParallel(), "
                "RowwiseParallel(), SequenceParallel(), PrepareModuleInput(...), PrepareModuleOutput(...) "
                "or PrepareModuleInputOutput(...)."
            )
        hits = [(n or type(module).__name__, m) for n, m in named if _matches(pattern, n)]
        if not hits:
            names = [n for n, _ in named if n][:12]
            warnings.warn(
                f"parallelize: plan key {pattern!r} matches no submodule of {type(module).__name__}, "
                f"skipping it; its submodules are {names}{' ...' if len(named) > 13 else ''}.",
                UserWarning, stacklevel=2,
            )
            continue
        for n, m in hits:
            style.apply(m, mesh, n, src_data_rank=src_data_rank)
    return module
