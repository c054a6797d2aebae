"""An OpInfo (``op_db``) sweep over ShardedTensor -- and, for comparison, torch's DTensor --
on every rank of a gloo world: each op on up to ``max_samples`` samples, with its tensor
operands laid out as

- ``R``: every operand ``Replicate()``;
- ``S``: every operand sharded on its first dim of even size (Replicate if it has none);
- ``P``: the first floating operand ``Partial('sum')`` (its value on rank 0, zeros
  elsewhere), the rest Replicate;

the forward result compared with the dense op on the same values, then the gradient of a
fixed weighted sum of the (gathered) outputs with the dense one. Random ops run under the
same seed as their dense reference.

Each (op, layout) gets a status: ``pass``, ``wrong`` (a value, shape or gradient differs
from dense), ``unsupported`` (``NotImplementedError``, which the kit's
``UnsupportedOpError`` is), or ``error`` (any other exception); ``skip`` when the dense
op itself fails on the sample or the layout does not apply. For the kit, the path each op
took is recorded: ``gathered``, the aten overloads that went through the generic gathering
fallback (no rule), and ``whole``, those a rule computed whole for placements it cannot keep
(both empty: sharding rules only).

The driver is written against three small functions per implementation (``distribute``,
``from_local``, ``full``), so the checker's shared sweep engine can take it over.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["op_names", "sweep"]

_RTOL, _ATOL = 1.3e-5, 1e-5
_LOOSE = {torch.float32: (2e-4, 2e-5), torch.float64: (1e-7, 1e-7)}


def _ops():
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


def op_key(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def op_names() -> list:
    """Every op_db entry's key (``name`` or ``name.variant``), in op_db order."""
    seen: list = []
    for op in _ops():
        k = op_key(op)
        if k not in seen:
            seen.append(k)
    return seen


def _dtype(op):
    d = op.supported_dtypes("cpu")
    for t in (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.complex64):
        if t in d:
            return t
    return next(iter(d), None)


# ---- the implementations under test ---------------------------------------------------------
class _Kit:
    name = "kit"

    def __init__(self, mesh):
        from subclass_kit.sharded import Partial, Replicate, Shard, ShardedTensor, distribute
        from subclass_kit.sharded._ops.generic import gathered_ops, whole_ops

        self.mesh, self.cls = mesh, ShardedTensor
        self.Shard, self.Replicate, self.Partial = Shard, Replicate, Partial
        self._distribute, self.gathered, self.whole = distribute, gathered_ops, whole_ops

    def distribute(self, t, pl):
        return self._distribute(t, self.mesh, [pl])

    def from_local(self, t, pl, shape):
        return self.cls.from_local(t, self.mesh, [pl], shape=shape)

    def full(self, x):
        return x.full_tensor()


class _DTensor(_Kit):
    name = "dtensor"

    def __init__(self, mesh):
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

        self.mesh, self.cls = mesh, DTensor
        self.Shard, self.Replicate, self.Partial = Shard, Replicate, Partial
        self._distribute, self.gathered, self.whole = distribute_tensor, None, None

    def distribute(self, t, pl):
        return self._distribute(t, self.mesh, [pl])

    def from_local(self, t, pl, shape):
        return self.cls.from_local(t, self.mesh, [pl], shape=shape, stride=torch.empty(shape, device="meta").stride())


# ---- one sample ---------------------------------------------------------------------------------
def _leaf(t, dense):
    return t.requires_grad_(True) if dense.requires_grad else t


def _lay_out(impl, sample, layout, rank):
    """The sample's (input, args, kwargs) as sharded tensors under ``layout``, or None."""
    state = {"partial": False, "sharded": False}
    world = dist.get_world_size()

    def one(t):
        if not isinstance(t, torch.Tensor):
            return t
        # Locals cut from the sample every rank generated alike (seeded): no communication
        # while laying out, so a failing op cannot leave a collective half-issued.
        d = t.detach().clone()
        shape = tuple(d.shape)
        if layout == "S":
            dim = next((i for i, n in enumerate(d.shape) if n >= 2 and n % 2 == 0), None)
            if dim is not None:
                state["sharded"] = True
                local = d.chunk(world, dim)[rank].clone()
                return _leaf(impl.from_local(local, impl.Shard(dim), shape), t)
        if layout == "P" and not state["partial"] and d.is_floating_point():
            state["partial"] = True
            local = d if rank == 0 else torch.zeros_like(d)
            return _leaf(impl.from_local(local, impl.Partial("sum"), shape), t)
        return _leaf(impl.from_local(d, impl.Replicate(), shape), t)

    laid = tree_map(one, (sample.input, sample.args, sample.kwargs))
    if (layout == "S" and not state["sharded"]) or (layout == "P" and not state["partial"]):
        return None
    return laid


def _dense_copy(sample):
    def one(t):
        if not isinstance(t, torch.Tensor):
            return t
        return t.detach().clone().requires_grad_(t.requires_grad)

    return tree_map(one, (sample.input, sample.args, sample.kwargs))


def _outputs(out):
    return [o for o in tree_flatten(out)[0]]


# Ops whose values are uninitialized memory: only their metadata can be compared.
_NO_VALUES = ("empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted")


def _close(a, b, what: str, values: bool = True) -> None:
    if isinstance(b, torch.Tensor):
        if not isinstance(a, torch.Tensor):
            raise AssertionError(f"{what}: got {type(a).__name__}, dense gives a tensor")
        if a.shape != b.shape:
            raise AssertionError(f"{what}: shape {tuple(a.shape)} vs dense {tuple(b.shape)}")
        if a.dtype != b.dtype:
            raise AssertionError(f"{what}: dtype {a.dtype} vs dense {b.dtype}")
        if not values:
            return
        rtol, atol = _LOOSE.get(b.dtype, (None, None))
        if b.is_complex() or b.dtype in _LOOSE:
            torch.testing.assert_close(a.detach(), b.detach(), rtol=rtol, atol=atol, equal_nan=True, msg=what)
        else:
            torch.testing.assert_close(a.detach(), b.detach(), equal_nan=True, msg=what)
    elif isinstance(b, float) and isinstance(a, float):
        torch.testing.assert_close(a, b, equal_nan=True, msg=what)
    elif a != b:
        raise AssertionError(f"{what}: {a!r} vs dense {b!r}")


def _loss(outs, weights, full):
    total = None
    for o, w in zip(outs, weights):
        if w is None:
            continue
        term = (full(o) if full is not None else o).mul(w).sum()
        total = term if total is None else total + term
    return total


def _grads(leaves, full):
    out = []
    for t in leaves:
        g = getattr(t, "grad", None) if isinstance(t, torch.Tensor) else None
        out.append(None if g is None else (full(g) if full is not None and isinstance(g, torch.Tensor) and type(g) is not torch.Tensor else g))
    return out


def _run_sample(op, impl, sample, layout, rank, backward: bool, seed: int):
    """``(status, message)`` of one sample under one layout."""
    dense_in = _dense_copy(sample)
    try:
        torch.manual_seed(seed)
        expected = op(dense_in[0], *dense_in[1], **dense_in[2])
    except Exception:
        return "skip", "dense fails"
    try:
        laid = _lay_out(impl, sample, layout, rank)
    except Exception as e:
        return "skip", f"cannot lay out: {type(e).__name__}: {str(e)[:200]}"
    if laid is None:
        return "skip", "layout does not apply"
    try:
        torch.manual_seed(seed)
        got = op(laid[0], *laid[1], **laid[2])
    except NotImplementedError as e:
        return "unsupported", f"{type(e).__name__}: {str(e)[:300]}"
    except Exception as e:
        return "error", f"{type(e).__name__}: {str(e)[:300]}"
    exp_outs, got_outs = _outputs(expected), _outputs(got)
    try:
        if len(exp_outs) != len(got_outs):
            raise AssertionError(f"{len(got_outs)} outputs, dense {len(exp_outs)}")
        gathered = [impl.full(o) if isinstance(o, impl.cls) else o for o in got_outs]
        for i, (a, b) in enumerate(zip(gathered, exp_outs)):
            _close(a, b, f"output {i}", op.name not in _NO_VALUES)
    except Exception as e:
        return "wrong", f"forward: {type(e).__name__}: {str(e)[:300]}"
    if not backward:
        return "pass", ""
    g = torch.Generator().manual_seed(seed)
    weights = [
        torch.randn(o.shape, generator=g, dtype=o.dtype) if isinstance(o, torch.Tensor) and o.requires_grad
        and o.is_floating_point() else None
        for o in exp_outs
    ]
    if all(w is None for w in weights):
        return "pass", ""
    leaves_d = [t for t in tree_flatten(dense_in)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    leaves_s = [t for t in tree_flatten(laid)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    try:
        _loss(exp_outs, weights, None).backward()
    except Exception:
        return "pass", "dense backward fails"
    try:
        loss = _loss(got_outs, weights, lambda o: impl.full(o) if isinstance(o, impl.cls) else o)
        if loss is None:
            raise AssertionError("no differentiable output")
        loss.backward()
        grads = _grads(leaves_s, impl.full)
    except NotImplementedError as e:
        return "unsupported", f"backward: {type(e).__name__}: {str(e)[:300]}"
    except Exception as e:
        return "error", f"backward: {type(e).__name__}: {str(e)[:300]}"
    try:
        for i, (a, t) in enumerate(zip(grads, leaves_d)):
            b = t.grad
            if a is None and b is None:
                continue
            a = torch.zeros_like(b) if a is None else a
            b = torch.zeros_like(a) if b is None else b
            _close(a, b, f"grad {i}")
    except Exception as e:
        return "wrong", f"backward: {type(e).__name__}: {str(e)[:300]}"
    return "pass", ""


_ORDER = {"pass": 0, "skip": 0, "unsupported": 1, "error": 2, "wrong": 3}


def sweep(names, impl_name: str = "kit", layouts=("R", "S", "P"), max_samples: int = 2, backward: bool = True) -> dict:
    """Rank task: ``{op key: {"status": worst status, layout: (status, message), "gathered": [...],
    "seconds": s}}`` for the op_db entries named in ``names``."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    impl = (_Kit if impl_name == "kit" else _DTensor)(mesh)
    rank = dist.get_rank()
    wanted = set(names)
    out: dict[str, Any] = {}
    for op in _ops():
        key = op_key(op)
        if key not in wanted or key in out:
            continue
        t0 = time.perf_counter()
        dtype = _dtype(op)
        rec: dict[str, Any] = {}
        if impl.gathered is not None:
            impl.gathered().clear()
            impl.whole().clear()
        torch.manual_seed(0)  # every rank generates the same samples
        try:
            samples = list(_take(op.sample_inputs("cpu", dtype, requires_grad=op.supports_autograd and dtype.is_floating_point), max_samples))
        except Exception as e:
            samples = []
            rec["samples"] = f"{type(e).__name__}: {e}"[:200]
        worst = "skip"
        for layout in layouts:
            status, msg = "skip", "no sample"
            for i, s in enumerate(samples):
                st, m = _run_sample(op, impl, s, layout, rank, backward and op.supports_autograd, 1000 + i)
                if st == "skip":
                    continue
                if status == "skip" or _ORDER[st] > _ORDER[status]:
                    status, msg = st, m
                if st != "pass":
                    break
            rec[layout] = (status, msg)
            if status != "skip" and (worst == "skip" or _ORDER[status] > _ORDER[worst]):
                worst = status
        rec["status"] = worst
        rec["gathered"] = sorted(str(f) for f in impl.gathered()) if impl.gathered is not None else []
        # The fallback must never run for an op that has a rule (registered or found from tags).
        rec["gathered_with_rule"] = sorted(str(f) for f in impl.gathered() if _has_rule(f)) if impl.gathered is not None else []
        rec["whole"] = sorted(str(f) for f in impl.whole()) if impl.whole is not None else []
        rec["seconds"] = time.perf_counter() - t0
        out[key] = rec
    return out


def _has_rule(func) -> bool:
    from subclass_kit._dispatch import find_registered
    from subclass_kit.sharded import ShardedTensor
    from subclass_kit.sharded._ops.generic import TAG_RULES

    return find_registered(ShardedTensor, func) is not None or any(rule(func) is not None for rule in TAG_RULES)


def _take(it, n):
    for i, x in enumerate(it):
        if i >= n:
            return
        yield x


def debug(name: str, impl_name: str = "kit") -> str:
    """Rank task: the traceback of the first failing sample of one op (for investigating)."""
    try:
        return repr(sweep([name], impl_name)[name])
    except Exception:
        return traceback.format_exc()
