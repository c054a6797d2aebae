"""The op_db sweep over ShardedTensor -- and, for comparison, torch's DTensor -- on every rank
of a gloo world, run by the checker's engine (``subclass_kit.testing.sweep_ops``). This
module is only the ShardedTensor glue: the mesh, the layouts and the record of which path
each op took. Each op runs on up to ``max_samples`` samples, with its tensor operands laid
out as

- ``R``: every operand ``Replicate()``;
- ``S``: every operand sharded on its first dim of even size (Replicate if it has none);
- ``P``: the first floating operand ``Partial('sum')`` (its value on rank 0, zeros
  elsewhere), the rest Replicate;

the forward result compared with the dense op on the same values, then the gradient of a
fixed random weighting of the (gathered) outputs with the dense one. Random ops run under
the same seed as their dense reference, so they are compared by value.

Each (op, layout) gets a status: the engine's outcome (``pass``, ``wrong``, ``error``,
``timeout``, ``unsupported``, ``skip``), with a backward ``NotImplementedError`` counted as
``unsupported``. For the kit, the path each op took is recorded: ``gathered``, the aten
overloads that went through the generic gathering fallback (no rule), and ``whole``, those a
rule computed whole for placements it cannot keep (both empty: sharding rules only).
"""

from __future__ import annotations

import itertools
import traceback
from typing import Any

import torch
import torch.distributed as dist

from subclass_kit.testing.opinfo import opinfo_ops, sweep_ops

__all__ = ["op_names", "sweep"]

# A distributed reduction sums in another order than the dense op.
_TOLERANCES = {torch.float32: (2e-4, 2e-5), torch.float64: (1e-7, 1e-7)}
_SEED = 1000


def _key(op) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def _first_per_key() -> dict:
    out: dict = {}
    for op in opinfo_ops():
        out.setdefault(_key(op), op)
    return out


def op_names() -> list:
    """Every op_db entry's key (``name`` or ``name.variant``), in op_db order."""
    return list(_first_per_key())


def _dtype(op):
    d = op.supported_dtypes("cpu")
    for t in (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.complex64):
        if t in d:
            return t
    return next(iter(d), None)


def _classes(impl_name: str):
    if impl_name == "kit":
        from subclass_kit.sharded import Partial, Replicate, Shard, ShardedTensor

        return ShardedTensor, Shard, Replicate, Partial, {}
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard  # type: ignore[assignment]

    return DTensor, Shard, Replicate, Partial, {"stride": None}


# Each laid-out operand's dense value, taken once by to_plain for the engine's reference
# inputs (no gather: the values are what the locals were cut from); results gather.
_HELD: dict = {}


def _to_plain(t):
    held = _HELD.pop(id(t), None)
    return held[1] if held is not None and held[0] is t else t.full_tensor()


def _lay_out_fn(impl_name: str, mesh, layout: str):
    cls, Shard, Replicate, Partial, extra = _classes(impl_name)
    rank, world = dist.get_rank(), dist.get_world_size()

    def local(t, pl, d):
        kw = {"stride": torch.empty(t.shape, device="meta").stride()} if "stride" in extra else {}
        x = cls.from_local(d, mesh, [pl], shape=tuple(t.shape), **kw)
        _HELD[id(x)] = (x, t.clone())
        return x

    def lay_out(tensors: list):
        # Locals cut from the sample every rank generated alike (seeded): no communication
        # while laying out, so a failing op cannot leave a collective half-issued.
        out, applies = [], layout == "R"
        for t in tensors:
            if layout == "S":
                dim = next((i for i, n in enumerate(t.shape) if n >= 2 and n % 2 == 0), None)
                if dim is not None:
                    applies = True
                    out.append(local(t, Shard(dim), t.chunk(world, dim)[rank].clone()))
                    continue
            if layout == "P" and not applies and t.is_floating_point():
                applies = True
                out.append(local(t, Partial("sum"), t if rank == 0 else torch.zeros_like(t)))
                continue
            out.append(local(t, Replicate(), t))
        return out if applies else None

    return lay_out


def _has_rule(func) -> bool:
    from subclass_kit._dispatch import find_registered
    from subclass_kit.sharded import ShardedTensor
    from subclass_kit.sharded._ops.generic import TAG_RULES

    return find_registered(ShardedTensor, func) is not None or any(rule(func) is not None for rule in TAG_RULES)


_ORDER = {"pass": 0, "skip": 0, "unsupported": 1, "error": 2, "timeout": 2, "wrong": 3}


def sweep(names, impl_name: str = "kit", layouts=("R", "S", "P"), max_samples: int = 2, backward: bool = True) -> dict:
    """Rank task: ``{op key: {"status": worst status, layout: (status, message), "gathered": [...],
    "gathered_with_rule": [...], "whole": [...], "seconds": s}}`` for the op_db entries named
    in ``names``."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    if impl_name == "kit":
        from subclass_kit.sharded._ops.generic import gathered_ops, whole_ops
    wanted = set(names)
    infos = [op for k, op in _first_per_key().items() if k in wanted]
    out: dict[str, Any] = {_key(op): {"status": "skip", "gathered": set(), "gathered_with_rule": set(),
                                      "whole": set(), "seconds": 0.0} for op in infos}

    def record(layout):
        def on_result(res):
            rec = out[res.op]
            status = "unsupported" if res.outcome == "pass" and res.backward == "unsupported" else res.outcome
            rec[layout] = (status, res.message)
            if status != "skip" and (rec["status"] == "skip" or _ORDER[status] > _ORDER[rec["status"]]):
                rec["status"] = status
            rec["seconds"] += res.seconds
            if impl_name == "kit":
                rec["gathered"] |= {str(f) for f in gathered_ops()}
                # The fallback must never run for an op that has a rule (registered or from tags).
                rec["gathered_with_rule"] |= {str(f) for f in gathered_ops() if _has_rule(f)}
                rec["whole"] |= {str(f) for f in whole_ops()}
                gathered_ops().clear()
                whole_ops().clear()
        return on_result

    if impl_name == "kit":
        gathered_ops().clear()
        whole_ops().clear()
    for layout in layouts:
        # timeout=None: an alarm on one rank mid-collective would desynchronise the ranks;
        # the world's own timeout bounds a hang.
        sweep_ops(lay_out=_lay_out_fn(impl_name, mesh, layout), ops=infos, dtype=_dtype, max_samples=max_samples,
                  backward=backward, timeout=None, seed=_SEED, cotangent="random", tolerances=_TOLERANCES,
                  to_plain=_to_plain, on_result=record(layout),
                  samples=lambda info, it: itertools.islice(it, max_samples))
    _HELD.clear()
    for rec in out.values():
        for k in ("gathered", "gathered_with_rule", "whole"):
            rec[k] = sorted(rec[k])
    return out


def debug(name: str, impl_name: str = "kit") -> str:
    """Rank task: the record of one op, or the traceback (for investigating)."""
    try:
        return repr(sweep([name], impl_name)[name])
    except Exception:
        return traceback.format_exc()
