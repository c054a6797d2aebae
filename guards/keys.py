"""``cache_key``: a stable name for "the compiled artifact that may serve this input".

The key hashes the canonical form of the input's guard set: types, ctx values, dtypes,
devices, requires_grad, static sizes and strides, and for dynamic dims only their symbolic
structure (which symbols are shared, strides in terms of sizes, ranges). So it changes
with a meta value, a dtype or a static size, and stays the same when only a dynamic size
changes, exactly as the guards would accept or reject. Canonical JSON with a version field,
then sha256: the same in every process and on every machine.

A class with ``__metadata_guard__`` decides itself which ctxs are equal, so the key cannot
know it: by default the whole ctx is keyed, and the key is *conservative* -- equal keys
mean equal ctxs (always safe to share an artifact), while two ctxs the class's guard
accepts as equal may get different keys (a cache miss, never a wrong artifact). For exact
keys the class adds ``__metadata_key__(ctx)`` (a classmethod or staticmethod) returning the
part of the ctx its guard compares; it must return equal values exactly when
``__metadata_guard__`` accepts. The hook is read only together with ``__metadata_guard__``
(with ``==`` the whole ctx is what dynamo compares).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ._sources import ROOT
from .guardset import KEY_VERSION as VERSION
from .guardset import _build

__all__ = ["VERSION", "cache_key", "cache_key_payload"]


def cache_key_payload(value: Any, *, policy: Any = None, dynamic: bool | None = None) -> str:
    """The canonical JSON text ``cache_key`` hashes (for debugging a key mismatch).

    Example:
        >>> import json, torch
        >>> payload = json.loads(cache_key_payload(torch.ones(2, dtype=torch.float16)))
        >>> payload["version"], payload["guards"][0]
        (1, ['tensor', "L['x']", 'torch.Tensor', 'torch.float16', 'cpu', False, [2], [1]])
    """
    gs = _build([(ROOT, value, policy)], name="x", dynamic=dynamic, state=None, compile=False)
    return json.dumps(gs.canonical(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def cache_key(value: Any, *, policy: Any = None, dynamic: bool | None = None) -> str:
    """A sha256 hex key, equal exactly when the same compiled artifact may serve ``value``.

    Works on real tensors (reading their dimension marks, or ``policy``) and on the fake
    tensors torch traces with (symbolic sizes count as dynamic), so a wrapper's
    ``_stable_hash_for_caching`` can return it. For a class with ``__metadata_guard__`` the
    key is conservative unless the class also defines ``__metadata_key__(ctx)`` (see the
    module docstring): unequal keys may then still share an artifact, equal keys always can.

    Args:
        value: a tensor, wrapped tensor or pytree of them.
        policy, dynamic: as for ``guards.build``.

    Raises:
        UnstableKeyError: a ctx holds a value with no process-independent form.
        UnhashableContextError: a ctx cannot be deep-copied (dynamo copies it to guard on it).

    Example:
        >>> import torch
        >>> a, b = torch.ones(8, 3), torch.ones(9, 3)
        >>> cache_key(a) == cache_key(b)
        False
        >>> torch._dynamo.mark_dynamic(a, 0); torch._dynamo.mark_dynamic(b, 0)
        >>> cache_key(a) == cache_key(b)
        True
    """
    payload = cache_key_payload(value, policy=policy, dynamic=dynamic)
    return hashlib.sha256(payload.encode("ascii")).hexdigest()
