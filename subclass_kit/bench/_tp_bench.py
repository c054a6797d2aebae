"""The llama flagship (examples/tp_llama.py) on 2 gloo ranks: the kit's ShardedTensor plan
beside torch's DTensor (``torch.distributed.tensor.parallel``, the same plan) in one run.

Per backend (``aot_eager``; ``inductor`` unless quick) two cases: the median time of a
training step after the first (forward, backward with the collectives, AdamW) and the
first step's time (dominated by compiling the blocks). Implementations: the kit; DTensor
with torchtitan's plan as is; DTensor with the embedding's output waited before block 0
(the workaround where the former fails). All run in the same spawned processes, the
inductor graph cache off, dynamo reset between them. Ratios are to the first DTensor
variant that ran; where DTensor fails, its row has no ratio and says why (``error``).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import os
import pathlib
import statistics
import sys
import time

from .. import _compat
from ._spawn import measure_on_ranks

__all__ = ["run", "flagship_rows"]

_TIMEOUT = 1200.0
_EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "tp_llama.py"


def _example():
    spec = importlib.util.spec_from_file_location("tp_llama_example", _EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _dtensor_tp(ex, model, mesh):
    """torchtitan's apply_tp with torch's own styles (DTensor)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, parallelize_module,
    )

    parallelize_module(model, mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    for block in model.layers.values():
        parallelize_module(block, mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        })
    return model


def _wait_output(module, args, out):
    AsyncCollectiveTensor = _compat.torch_funcol().AsyncCollectiveTensor

    # clone() waits (a data use) and, unlike .wait(), stays on the autograd graph.
    return out.clone() if isinstance(out, AsyncCollectiveTensor) else out


def _train(ex, model, impl: str, steps: int, seqlen: int) -> tuple[list, list]:
    import torch

    if impl == "kit":
        from ..sharded import loss_parallel
    else:
        from torch.distributed.tensor.parallel import loss_parallel
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times, losses = [], []
    for inputs, labels in ex.batches(model.args, steps, 2, [seqlen]):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with loss_parallel():
            loss = ex.cross_entropy_loss(model(inputs), labels)
            loss.backward()
        opt.step()
        losses.append(float((loss.full_tensor() if hasattr(loss, "full_tensor") else loss).detach()))
        times.append(time.perf_counter() - t0)
    return losses, times


def _measure(quick: bool) -> list:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    ex = _example()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    args = ex.ModelArgs(dim=64, n_layers=2)
    steps, seqlen = (6, 32) if quick else (12, 64)
    dense = ex.build(args)
    ref, _ = ex.train(dense, ex.batches(args, steps, 2, [seqlen]), parallel_loss=False)
    rows = []
    for backend in ("aot_eager",) if quick else ("aot_eager", "inductor"):
        got, errors = {}, {}
        for impl in ("kit", "dtensor", "dtensor_waited"):
            _compat.dynamo_reset()
            model = copy.deepcopy(ex.build(args))
            try:
                model = ex.apply_tp(model, mesh) if impl == "kit" else _dtensor_tp(ex, model, mesh)
                if impl == "dtensor_waited":
                    # The workaround for DTensor's failure above: wait for the embedding's
                    # reduce-scatter before block 0 instead of handing it the pending tensor.
                    model.tok_embeddings.register_forward_hook(_wait_output)
                ex.apply_compile(model, backend)
                losses, times = _train(ex, model, impl, steps, seqlen)
                diff = max(abs(a - b) for a, b in zip(losses, ref))
                got[impl] = (statistics.median(times[1:]), times[0], diff)
            except Exception as e:  # noqa: BLE001 - the row reports why
                errors[impl] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        rows += _rows(backend, got, errors, dist.get_world_size())
    return rows


_IMPLS = {"kit": "kit", "dtensor": "DTensor", "dtensor_waited": "DTensor, embedding waited"}


def _rows(backend: str, got: dict, errors: dict, world: int) -> list:
    """Two cases per backend (steady step, first step), each impl's row with its ratio to
    the first DTensor variant that ran (the bench's row schema); a failed impl's row
    carries ``error`` and no ratio, so the chart leaves it out and the table says why."""
    reference = next((_IMPLS[k] for k in ("dtensor", "dtensor_waited") if k in got), None)
    rows = []
    for case, idx in (("train step", 0), ("first step (compile)", 1)):
        for impl in _IMPLS:
            row = {"group": f"tp_llama {backend}", "name": case, "impl": _IMPLS[impl],
                   "kind": "kit" if impl == "kit" else "torch", "world_size": world}
            if impl in got:
                t = got[impl][idx]
                row.update(median_us=round(t * 1e6, 1), max_loss_diff_vs_dense=float(f"{got[impl][2]:.2e}"))
                if reference is not None:
                    ref_t = got[next(k for k, v in _IMPLS.items() if v == reference)][idx]
                    row.update(ratio=round(t / ref_t, 3), reference=reference)
            else:
                row.update(median_us=float("nan"), error=errors[impl])
            rows.append(row)
    return rows


def flagship_rows(quick: bool = False, size: int = 2) -> list[dict]:
    """Rows for the flagship, kit vs DTensor, measured on ``size`` freshly spawned ranks.

    Example:
        >>> rows = flagship_rows(quick=True)  # doctest: +SKIP
        >>> {r["impl"] for r in rows}  # doctest: +SKIP
        {'kit', 'dtensor'}
    """
    if not _EXAMPLE.exists():
        return [{"group": "tp_llama", "name": "train step", "impl": "kit", "kind": "kit", "median_us": float("nan"),
                 "error": f"{_EXAMPLE} not found: run the bench from a source checkout"}]
    old = os.environ.get("TORCHINDUCTOR_FX_GRAPH_CACHE")
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"  # first compiles are cold, for both
    try:
        return measure_on_ranks(functools.partial(_measure, quick), size, what=f"tp bench: the {size}-rank world",
                                method="spawn", pg_timeout=120.0, timeout=_TIMEOUT)
    finally:
        if old is None:
            os.environ.pop("TORCHINDUCTOR_FX_GRAPH_CACHE", None)
        else:
            os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = old


def run(quick: bool = False) -> list[dict]:
    """The suite entry point (``subclass_kit.bench.SUITES``): :func:`flagship_rows`."""
    return flagship_rows(quick)


if __name__ == "__main__":
    from . import markdown_table

    print(markdown_table(run(quick="--quick" in sys.argv)))
