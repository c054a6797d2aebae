"""What every op family shares: finding the mesh, the global output metadata, moving
arguments to the placements a rule wants, and wrapping local results.

The global shape, stride and dtype of an op's result come from running the op on fake
tensors of the *global* metadata (as DTensor does), cached per (op, argument metadata) when
every size is a plain int. The rule of each family then only decides placements.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ...dispatch import raise_unsupported
from .. import _compat
from ..errors import MeshError
from ..placements import Partial, Replicate, Shard, render
from ..redistribute import redistribute_local
from ..tensor import ShardedTensor, describe, wrap

__all__ = ["TensorMeta", "spec_of", "global_meta", "move", "move_plain", "wrap_out", "unsupported", "aten"]

aten = torch.ops.aten
_SEQ = (list, tuple)


class TensorMeta(NamedTuple):
    shape: tuple
    stride: tuple
    dtype: torch.dtype
    offset: Any


def _sharded_in(args, kwargs):
    for a in args:
        if type(a) is ShardedTensor:
            yield a
        elif type(a) in _SEQ:
            for b in a:
                if type(b) is ShardedTensor:
                    yield b
    for a in kwargs.values():
        if type(a) is ShardedTensor:
            yield a


def spec_of(func, args, kwargs):
    """``(mesh, coord)`` shared by every ShardedTensor argument (MeshError if they differ)."""
    mesh = coord = None
    for x in _sharded_in(args, kwargs):
        c = x._kit_ctx
        if mesh is None:
            mesh, coord = c.mesh, c.coord
        elif c.mesh != mesh:
            raise MeshError(
                f"{func}: ShardedTensor arguments live on different meshes ({mesh} and {c.mesh}); "
                "redistribute them onto one mesh first."
            )
    return mesh, coord


# ---- global metadata -------------------------------------------------------------------
_META_CACHE: dict = {}
_NO_KEY = object()


def _key_of(a):
    if isinstance(a, torch.Tensor):
        shape, stride = tuple(a.shape), a.stride()
        if all(type(s) is int for s in shape) and all(type(s) is int for s in stride):
            return ("T", shape, stride, a.dtype, str(a.device))
        return _NO_KEY
    if type(a) in _SEQ:
        ks = tuple(_key_of(b) for b in a)
        return _NO_KEY if any(k is _NO_KEY for k in ks) else (type(a).__name__, ks)
    if _compat.is_symbolic(a):
        return _NO_KEY
    try:
        hash(a)
    except TypeError:
        return _NO_KEY
    return (type(a), a)


def _fake(a, mode):
    if isinstance(a, torch.Tensor):
        return torch.empty_strided(tuple(a.shape), a.stride(), dtype=a.dtype, device=a.device)
    if type(a) in _SEQ:
        return type(a)(_fake(b, mode) for b in a)
    return a


def _meta(out):
    if isinstance(out, torch.Tensor):
        return TensorMeta(tuple(out.shape), tuple(out.stride()), out.dtype, out.storage_offset())
    if type(out) in _SEQ:
        return type(out)(_meta(o) for o in out)
    return out


def global_meta(func, args, kwargs):
    """The metadata of ``func``'s result on the global tensors (a TensorMeta or a tuple)."""
    ak = _key_of(args)
    kk = tuple((k, _key_of(v)) for k, v in kwargs.items())
    cacheable = ak is not _NO_KEY and all(v is not _NO_KEY for _, v in kk)
    key = (func, ak, kk)
    if cacheable:
        hit = _META_CACHE.get(key)
        if hit is not None:
            return hit
    with _compat.meta_mode() as mode:
        out = func(*_fake(args, mode), **{k: _fake(v, mode) for k, v in kwargs.items()})
    m = _meta(out)
    if cacheable:
        _META_CACHE[key] = m
    return m


# ---- moving arguments ---------------------------------------------------------------------
def move(x: ShardedTensor, target: tuple) -> torch.Tensor:
    """``x``'s local under ``target`` placements (collectives as needed)."""
    c = x._kit_ctx
    if c.placements == target:
        return x.local
    return redistribute_local(x.local, c.mesh, c.coord, c.placements, target, x.shape)


def move_plain(t: torch.Tensor, mesh, coord, target: tuple) -> torch.Tensor:
    """A plain tensor taken as Replicate on every mesh dim, under ``target`` (no communication)."""
    if all(type(p) is Replicate for p in target):
        return t
    return redistribute_local(t, mesh, coord, (Replicate(),) * len(target), target, t.shape)


def wrap_out(local, meta: TensorMeta, mesh, placements, coord) -> ShardedTensor:
    """Wrap a local result with its global metadata."""
    return wrap(local, mesh, placements, coord, meta.shape, meta.stride, meta.dtype, meta.offset)


def aligned(x_shape, out_shape, out_pl: tuple) -> tuple:
    """The placements an operand of shape ``x_shape`` needs for a broadcasting op whose
    output (``out_shape``) has ``out_pl``: Shard on the matching dim unless it broadcasts."""
    lead = len(out_shape) - len(x_shape)
    res = []
    for p in out_pl:
        if type(p) is Shard:
            d = p.dim - lead
            if d < 0 or (x_shape[d] == 1 and out_shape[p.dim] != 1):
                res.append(Replicate())
            else:
                res.append(Shard(d))
        else:
            res.append(p)
    return tuple(res)


def unsupported(func, args, kwargs, why: str):
    """Raise the kit's UnsupportedOpError with a reason specific to sharding."""
    shown = ", ".join(describe(a) for a in _sharded_in(args, kwargs))
    from ..errors import UnsupportedOpError

    raise UnsupportedOpError(
        f"ShardedTensor cannot run {func} on {shown}: {why} Redistribute the operands first "
        f"(.redistribute(mesh, [Replicate()])), or register a rule with "
        f"@ShardedTensor.implements({func})."
    )


def fallback(func, types, args, kwargs):
    """``ShardedTensor.__fallback__``: pointwise-tagged ops get the pointwise rule, others raise."""
    from . import pointwise

    h = pointwise.rule_for(func)
    if h is None:
        return raise_unsupported(func, types, args, kwargs)
    ShardedTensor._kit_cache[func] = h
    return h(func, types, args, kwargs)


__all__ += ["aligned", "fallback", "render", "Partial"]
