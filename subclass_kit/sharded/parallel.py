"""Tensor parallelism for ``nn.Linear`` layers: ``parallelize``, ``ColwiseParallel``,
``RowwiseParallel`` (torch's ``parallelize_module`` styles, on ShardedTensor).

A Colwise layer holds the rows of its weight (output features) and bias; fed a replicated
input it produces its slice of the output features. A Rowwise layer holds the columns of
its weight (input features); fed that slice it produces a Partial sum, reduced to the
replicated output. Colwise then Rowwise is the Megatron MLP: one all-reduce forward, one in
backward, and plain tensors in and out (``use_local_output=True``).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch
from torch import nn

from .convert import distribute, from_local, redistribute, to_local
from .errors import ParallelizeError
from .mesh import mesh_ref
from .placements import Placement, Replicate, Shard
from .tensor import ShardedTensor

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel", "parallelize"]


class ParallelStyle:
    """Base of the styles: ``apply(module, mesh)`` shards the parameters and installs hooks."""

    weight: Placement
    bias: Placement
    default_input: Placement
    default_output: Placement

    def apply(self, module: nn.Module, mesh, name: str = "module") -> nn.Module:
        kind = type(self).__name__
        if not isinstance(module, nn.Linear):
            raise ParallelizeError(
                f"{kind} applies to nn.Linear, but {name!r} is a {type(module).__name__}. Map "
                "only the Linear submodules in the plan."
            )
        ref = mesh_ref(mesh)
        if ref.ndim != 1:
            raise ParallelizeError(
                f"{kind} shards over a 1-D mesh, got a {ref.ndim}-D mesh {ref}; pass one mesh "
                "dimension (e.g. mesh['tp'])."
            )
        for pname, place in (("weight", self.weight), ("bias", self.bias)):
            p = getattr(module, pname)
            if p is None:
                continue
            sharded = distribute(p.detach(), mesh, [place])
            module.register_parameter(pname, nn.Parameter(sharded, requires_grad=p.requires_grad))
        in_layout = self.input_layouts or self.default_input
        out_layout = self.output_layouts or self.default_output
        want_in = self.default_input
        use_local = self.use_local_output

        def pre_hook(mod, args):
            if not args:
                raise ParallelizeError(
                    f"{kind} on {name!r}: pass the input positionally (the hook converts args[0])."
                )
            x = args[0]
            if isinstance(x, ShardedTensor):
                x = redistribute(x, ref, [want_in])
            else:
                # An input sharded on its features has the layer's in_features globally; say so,
                # so uneven shards (features not divisible by the ranks) are read right.
                shape = None
                if type(in_layout) is Shard and in_layout.dim in (-1, x.dim() - 1):
                    shape = (*x.shape[:-1], mod.in_features)
                x = from_local(x, ref, [in_layout], shape=shape)
                if in_layout != want_in:
                    x = redistribute(x, ref, [want_in])
            return (x, *args[1:])

        def post_hook(mod, args, out):
            out = redistribute(out, ref, [out_layout])
            return to_local(out) if use_local else out

        module.register_forward_pre_hook(pre_hook)
        module.register_forward_hook(post_hook)
        return module


@dataclass(frozen=True, kw_only=True)
class ColwiseParallel(ParallelStyle):
    """Shard an ``nn.Linear`` by output features: weight ``Shard(0)``, bias ``Shard(0)``.

    Args:
        input_layouts: how the input arrives (default ``Replicate()``).
        output_layouts: the output's placement (default ``Shard(-1)``: this rank's features).
        use_local_output: return the local tensor (default) instead of a ShardedTensor.

    Example:
        >>> from subclass_kit.sharded import ColwiseParallel
        >>> ColwiseParallel()
        ColwiseParallel(input_layouts=None, output_layouts=None, use_local_output=True)
    """

    input_layouts: Placement | None = None
    output_layouts: Placement | None = None
    use_local_output: bool = True

    weight = Shard(0)
    bias = Shard(0)
    default_input = Replicate()
    default_output = Shard(-1)


@dataclass(frozen=True, kw_only=True)
class RowwiseParallel(ParallelStyle):
    """Shard an ``nn.Linear`` by input features: weight ``Shard(1)``, bias ``Replicate()``.

    Args:
        input_layouts: how the input arrives (default ``Shard(-1)``: a Colwise output).
        output_layouts: the output's placement (default ``Replicate()``: one all-reduce).
        use_local_output: return the local tensor (default) instead of a ShardedTensor.

    Example:
        >>> from subclass_kit.sharded import RowwiseParallel
        >>> RowwiseParallel(use_local_output=False).use_local_output
        False
    """

    input_layouts: Placement | None = None
    output_layouts: Placement | None = None
    use_local_output: bool = True

    weight = Shard(1)
    bias = Replicate()
    default_input = Shard(-1)
    default_output = Replicate()


def _matches(pattern: str, name: str) -> bool:
    # Atom by atom, as torch's parallelize_module does: "layers.*.fc1" matches "layers.0.fc1".
    p, n = pattern.split("."), name.split(".")
    return len(p) == len(n) and all(fnmatch.fnmatchcase(b, a) for a, b in zip(p, n))


def parallelize(module: nn.Module, mesh, plan) -> nn.Module:
    """Apply tensor-parallel styles to submodules of ``module`` in place; return it.

    Args:
        module: the model (same on every rank).
        mesh: a 1-D torch ``DeviceMesh`` (or ``MeshRef``).
        plan: ``{submodule name or pattern: style}`` (``fnmatch`` patterns per dotted atom,
            as torch's ``parallelize_module``), or one style for ``module`` itself.

    Raises:
        ParallelizeError: a name matches no submodule, or a style does not fit a module.

    Example:
        >>> from torch import nn
        >>> from subclass_kit.sharded import parallelize, ColwiseParallel, RowwiseParallel, MeshRef
        >>> mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
        >>> mlp = parallelize(mlp, MeshRef.local(), {"0": ColwiseParallel(), "2": RowwiseParallel()})
        >>> type(mlp[0].weight).__name__, mlp[0].weight.placements
        ('ShardedTensor', (Shard(0),))
    """
    if isinstance(plan, ParallelStyle):
        return plan.apply(module, mesh, type(module).__name__)
    if not isinstance(plan, dict):
        raise ParallelizeError(
            f"parallelize: plan must map submodule names to styles (or be one style), got {type(plan).__name__}."
        )
    named = [(n, m) for n, m in module.named_modules() if n]
    for pattern, style in plan.items():
        if not isinstance(style, ParallelStyle):
            raise ParallelizeError(
                f"parallelize: plan[{pattern!r}] is {style!r}; use ColwiseParallel() or RowwiseParallel()."
            )
        hits = [(n, m) for n, m in named if _matches(pattern, n)]
        if not hits:
            names = [n for n, _ in named][:12]
            raise ParallelizeError(
                f"parallelize: no submodule of {type(module).__name__} matches {pattern!r}; its "
                f"submodules are {names}{' ...' if len(named) > 12 else ''}."
            )
        for n, m in hits:
            style.apply(m, mesh, n)
    return module


del torch
