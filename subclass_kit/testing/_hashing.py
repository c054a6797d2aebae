"""Shared by the stable-hash check and its child process: how to send samples to another
process and what hash AOTAutograd's cache would take from them."""

from __future__ import annotations

import importlib

import torch

from .. import _compat
from ._subject import flatten

__all__ = ["stable_hash", "encode", "decode", "import_qualified"]


def stable_hash(t, *, canonical: bool = False) -> str:
    """``t._stable_hash_for_caching()`` if the class defines it, else torch's default
    (``canonical=True``: torch's payload without its import-order-dependent pickling of
    dtypes / memory formats / layouts; see ``_compat.default_stable_hash``)."""
    fn = getattr(t, "_stable_hash_for_caching", None)
    if fn is not None:
        return str(fn())
    return _compat.default_stable_hash(t, canonical=canonical)


def import_qualified(module: str, qualname: str):
    """The object at ``module:qualname`` (dotted qualname walked with getattr)."""
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class Unsendable(Exception):
    """A sample holds something that cannot go to another process."""


def encode(t) -> dict:
    """The flatten tree of ``t`` with plain tensors detached (picklable when the ctx is)."""
    names, ctx = flatten(t)
    inner = {}
    for n in names:
        v = getattr(t, n)
        if _compat.is_traceable_wrapper_subclass(v):
            inner[n] = ("wrapped", encode(v))
        elif isinstance(v, torch.Tensor):
            inner[n] = ("tensor", _sendable(v.detach()))
        else:
            raise Unsendable(f"inner {n!r} is a {type(v).__name__}, which cannot be sent to another process")
    cls = type(t)
    return {
        "cls": (cls.__module__, cls.__qualname__),
        "ctx": ctx,
        "inner": inner,
        # a nested int (NestedTensor's ragged dim) travels as -1: unflatten rebuilds it
        "size": tuple(_plain_int(s) for s in t.shape),
        "stride": tuple(_plain_int(s) for s in t.stride()),
        "requires_grad": bool(t.requires_grad),
    }


# torch 2.13 cannot unpickle float8 storages ("UntypedStorage has no attribute dtype"):
# such tensors travel as bytes of the same shape and are viewed back on arrival.
_FLOAT8 = tuple(getattr(torch, n) for n in dir(torch) if n.startswith("float8_") and isinstance(getattr(torch, n), torch.dtype))


def _sendable(v: torch.Tensor):
    if v.dtype in _FLOAT8:
        return ("bytes_as", str(v.dtype).removeprefix("torch."), v.view(torch.uint8))
    return v


def _received(v):
    if isinstance(v, tuple) and len(v) == 3 and v[0] == "bytes_as":
        return v[2].view(getattr(torch, v[1]))
    return v


def _plain_int(x) -> int:
    try:
        return int(x)
    except (TypeError, RuntimeError, ValueError, AttributeError):
        return -1


def decode(d: dict):
    cls = import_qualified(*d["cls"])
    inner = {n: (decode(v) if kind == "wrapped" else _received(v)) for n, (kind, v) in d["inner"].items()}
    out = cls.__tensor_unflatten__(inner, d["ctx"], torch.Size(d["size"]), d["stride"])
    if d["requires_grad"] and not out.requires_grad:
        out.requires_grad_(True)
    return out
