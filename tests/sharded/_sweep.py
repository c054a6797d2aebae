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

``time_ops`` is the speed pass over the same samples and layouts: the kit's eager forward
time over DTensor's, op by op, where both pass forward (see its docstring).
"""

from __future__ import annotations

import functools
import itertools
import time
import traceback
import warnings
from typing import Any

import torch
import torch.distributed as dist

from subclass_kit import pytree
from subclass_kit.testing.opinfo import opinfo_ops, sweep_op, sweep_ops
from sharded._meshes import strides as _strides

__all__ = ["op_names", "sweep", "time_ops"]

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
    cls, Shard, Replicate, Partial, _ = _classes(impl_name)
    rank, world = dist.get_rank(), dist.get_world_size()

    def local(t, pl, d):
        x = cls.from_local(d, mesh, [pl], shape=tuple(t.shape), stride=_strides(tuple(t.shape)))
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


def _judged(info, impl_name: str, mesh, layout: str, max_samples: int):
    """The forward verdict on the op's first judged sample (of its first ``max_samples``, as
    the sweep draws them) and that sample's laid-out arguments (None unless it passed)."""
    got: list = []
    res = sweep_op(info, lay_out=_lay_out_fn(impl_name, mesh, layout), dtype=_dtype, max_samples=1, backward=False,
                   timeout=None, seed=_SEED, tolerances=_TOLERANCES, to_plain=_to_plain, on_sample=got.append,
                   samples=lambda info, it: itertools.islice(it, max_samples))
    return res.outcome, (got[0] if got and res.outcome == "pass" else None)


def _call(op, args):
    return op(args[0], *args[1], **args[2])


def _shapes(args) -> list:
    return [tuple(t.shape) for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)]


def _agree(failed: bool) -> bool:
    """True when no rank failed (every rank learns the same answer, so all skip alike)."""
    flag = torch.tensor([1.0 if failed else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() == 0.0


def _time_one(info, mesh, layout: str, max_samples: int, rounds: int, budget: float) -> dict:
    from subclass_kit.bench import interleaved
    from subclass_kit.sharded._ops.generic import gathered_ops

    from sharded._tp_upstream_tasks import Comms

    gathered_ops().clear()
    kit, kit_args = _judged(info, "kit", mesh, layout, max_samples)
    gathered = sorted(str(f) for f in gathered_ops())
    dt, dt_args = _judged(info, "dtensor", mesh, layout, max_samples)
    _HELD.clear()
    if kit_args is None or dt_args is None:
        skip = f"forward: kit {kit}, DTensor {dt}"
    elif _shapes(kit_args) != _shapes(dt_args):
        skip = f"different samples: kit {_shapes(kit_args)}, DTensor {_shapes(dt_args)}"
    else:
        skip = None
    # A verdict can differ between ranks (a Partial operand's local values differ); every
    # rank must then skip, or one would time while the other moves on to the next op.
    if not _agree(skip is not None):
        return {"skip": skip or "forward failed on another rank", "kit": kit, "dtensor": dt}
    fns = {"kit": functools.partial(_call, info.op, kit_args), "DTensor": functools.partial(_call, info.op, dt_args)}
    failed, comms = None, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            # Warm-up: the first calls fill both implementations' caches (sharding
            # propagation, the kit's per-signature plans) and count the collectives each
            # issues (a ratio compares like with like only where they match); the last
            # calls estimate the cost.
            for impl, fn in fns.items():
                with Comms() as c:
                    fn()
                comms[impl] = dict(sorted(c.counts.items()))
            t0 = time.perf_counter()
            for fn in fns.values():
                fn()
            pair = time.perf_counter() - t0
        except Exception as e:  # an op that cannot run twice on the same arguments
            failed, pair = f"a repeated call raised {type(e).__name__}: {str(e)[:120]}", 0.0
        if not _agree(failed is not None):
            return {"skip": failed or "a repeated call raised on another rank"}
        # One call count for every rank (the slowest rank's estimate), so collectives pair up.
        est = torch.tensor([pair])
        dist.all_reduce(est, op=dist.ReduceOp.MAX)
        number = max(1, min(2000, round(budget / max(est.item(), 1e-9))))
        merged, ratio = interleaved(fns, rounds=rounds, reference="DTensor", number=number)
    return {"ratio": round(ratio["kit"], 4), "kit_us": round(merged["kit"].median * 1e6, 2),
            "dtensor_us": round(merged["DTensor"].median * 1e6, 2), "number": number, "gathered": gathered,
            "kit_comms": comms["kit"], "dtensor_comms": comms["DTensor"]}


def time_ops(names, layouts=("R", "S", "P"), max_samples: int = 2, rounds: int = 9, budget: float = 0.04) -> dict:
    """Rank task: the kit's eager forward time over DTensor's, per op and layout, on the ops
    both implementations pass forward.

    Per op of ``names`` and layout, kit and DTensor are judged forward (against dense, as the
    sweep judges) on the same sample -- the first one judged of the op's first
    ``max_samples`` -- without gradients; where both pass, that call is warmed up and then
    timed on both in ``rounds`` interleaved rounds (the order alternating, a fixed call count
    per round sized to about ``budget`` seconds for the pair, the same on every rank so the
    ranks' collectives pair up). Every rank times; rank 0's figures are the ones reported.

    Returns ``{op key: {layout: {"ratio": median over rounds of kit / DTensor, "kit_us",
    "dtensor_us": median microseconds per call, "number": calls per timing, "gathered": the
    aten overloads the kit sent through its gathering fallback, "kit_comms",
    "dtensor_comms": the collectives one call issued, by name}}}``, or ``{layout: {"skip":
    why}}`` where the pair was not timed.
    """
    from torch.distributed.device_mesh import init_device_mesh

    # One kernel thread per rank: the ranks share the machine's cores, and on two threads a
    # busy machine slows the kernels 10-100x on both sides, swamping the ratio with noise.
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    wanted = set(names)
    return {_key(op): {layout: _time_one(op, mesh, layout, max_samples, rounds, budget) for layout in layouts}
            for k, op in _first_per_key().items() if k in wanted}


def debug(name: str, impl_name: str = "kit") -> str:
    """Rank task: the record of one op, or the traceback (for investigating)."""
    try:
        return repr(sweep([name], impl_name)[name])
    except Exception:
        return traceback.format_exc()
