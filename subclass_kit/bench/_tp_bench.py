"""The llama flagship (examples/tp_llama.py) on 2 gloo ranks: the kit's ShardedTensor plan
beside torch's DTensor (``torch.distributed.tensor.parallel``, the same plan).

Per backend (``aot_eager``; ``inductor`` unless quick) two cases: the median time of a
training step after the first (forward, backward with the collectives, AdamW) and the
first step's time (dominated by compiling the blocks). Implementations: the kit; the kit
with the embedding's output waited before block 0; DTensor with torchtitan's plan as is;
DTensor with the embedding's output waited (the workaround where the former fails).

Each implementation runs in its own freshly spawned 2-rank world that first compiles and
runs one step of the dense model with the same backend, so none of them pays torch's
one-time costs (lazy imports, first-compile set-up) for the others, and no sharding cache
of one warms another (DTensor's as-is run used to warm its own waited run's propagation
cache, and the kit, measured first, paid torch's warm-up). Worlds alternate between the
implementations for ``rounds`` rounds; each row keeps the fastest round. The inductor graph
cache is off. Every row carries ``graphs``: how many graphs dynamo compiled. Ratios are to
the first DTensor variant that ran; where DTensor fails, its row has no ratio and says why
(``error``).

Why the kit compiles two graphs where DTensor (waited) compiles one: all blocks run the
same code, so dynamo compiles it once and the other blocks reuse it -- unless an input's
type differs. The kit hands block 0 the embedding's reduce-scatter pending (its local is an
``AsyncCollectiveTensor``, so the wait opens block 0's graph); the other blocks get plain
tensors. Block 0 therefore has a graph of its own. With the embedding waited, the kit
compiles one graph too (the ``kit, embedding waited`` row).
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

    if impl.startswith("kit"):
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


def _wait_kit_output(module, args, out):
    from ..collectives.act import AsyncCollectiveTensor

    return out.clone() if isinstance(out, AsyncCollectiveTensor) else out


def _sizes(quick: bool) -> tuple:
    return (6, 32) if quick else (12, 64)  # steps, sequence length


def _measure(quick: bool, backend: str, impl: str) -> dict:
    """One implementation's run on this world: ``{"step", "first", "diff", "graphs"}`` (or
    ``{"error"}``), after a dense warm-up compile with the same backend."""
    import torch.distributed as dist

    ex = _example()
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    args = ex.ModelArgs(dim=64, n_layers=2)
    steps, seqlen = _sizes(quick)
    dense = ex.build(args)
    ref, _ = ex.train(dense, ex.batches(args, steps, 2, [seqlen]), parallel_loss=False)
    # Warm-up: torch's one-time costs of a first compile (and backward), paid by no impl.
    warm = ex.apply_compile(copy.deepcopy(ex.build(args)), backend)
    ex.train(warm, ex.batches(args, 1, 2, [seqlen]), parallel_loss=False)
    _compat.dynamo_reset()
    model = copy.deepcopy(ex.build(args))
    counter = _compat.compile_counter(backend)
    try:
        model = ex.apply_tp(model, mesh) if impl.startswith("kit") else _dtensor_tp(ex, model, mesh)
        if impl.endswith("_waited"):
            # The workaround for DTensor's failure: wait for the embedding's reduce-scatter
            # before block 0 instead of handing it the pending tensor.
            model.tok_embeddings.register_forward_hook(_wait_kit_output if impl == "kit_waited" else _wait_output)
        ex.apply_compile(model, counter)
        losses, times = _train(ex, model, impl, steps, seqlen)
    except Exception as e:  # noqa: BLE001 - the row reports why
        return {"error": f"{type(e).__name__}: {e}".splitlines()[0][:200]}
    diff = max(abs(a - b) for a, b in zip(losses, ref))
    return {"step": statistics.median(times[1:]), "first": times[0], "diff": diff, "graphs": counter.frame_count}


_IMPLS = {"kit": "kit", "kit_waited": "kit, embedding waited", "dtensor": "DTensor",
          "dtensor_waited": "DTensor, embedding waited"}


def _rows(backend: str, got: dict, world: int) -> list:
    """Two cases per backend (steady step, first step), each impl's row with its ratio to
    the first DTensor variant that ran (the bench's row schema); a failed impl's row
    carries ``error`` and no ratio, so the chart leaves it out and the table says why."""
    ok = {k: v for k, v in got.items() if "error" not in v}
    reference = next((k for k in ("dtensor", "dtensor_waited") if k in ok), None)
    rows = []
    for case, key in (("train step", "step"), ("first step (compile)", "first")):
        for impl in _IMPLS:
            row = {"group": f"tp_llama {backend}", "name": case, "impl": _IMPLS[impl],
                   "kind": "kit" if impl.startswith("kit") else "torch", "world_size": world}
            if impl in ok:
                t = ok[impl][key]
                row.update(median_us=round(t * 1e6, 1), graphs=ok[impl]["graphs"],
                           max_loss_diff_vs_dense=float(f"{ok[impl]['diff']:.2e}"))
                if reference is not None:
                    row.update(ratio=round(t / ok[reference][key], 3), reference=_IMPLS[reference])
            else:
                row.update(median_us=float("nan"), error=got.get(impl, {}).get("error", "not run"))
            rows.append(row)
    return rows


def _fastest(runs: list) -> dict:
    """Per field, the best of the rounds (one impl's runs; an error if any round failed)."""
    bad = [r for r in runs if "error" in r]
    if bad:
        return bad[0]
    return {"step": min(r["step"] for r in runs), "first": min(r["first"] for r in runs),
            "diff": max(r["diff"] for r in runs), "graphs": max(r["graphs"] for r in runs)}


def flagship_rows(quick: bool = False, size: int = 2, rounds: int | None = None) -> list[dict]:
    """Rows for the flagship, kit vs DTensor, each implementation measured on ``size``
    freshly spawned ranks (one world per implementation and round, alternating).

    Example:
        >>> rows = flagship_rows(quick=True)  # doctest: +SKIP
        >>> sorted({r["impl"] for r in rows})  # doctest: +SKIP
        ['DTensor', 'DTensor, embedding waited', 'kit', 'kit, embedding waited']
    """
    if not _EXAMPLE.exists():
        return [{"group": "tp_llama", "name": "train step", "impl": "kit", "kind": "kit", "median_us": float("nan"),
                 "error": f"{_EXAMPLE} not found: run the bench from a source checkout"}]
    rounds = (1 if quick else 2) if rounds is None else rounds
    old = os.environ.get("TORCHINDUCTOR_FX_GRAPH_CACHE")
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"  # first compiles are cold, for all
    rows = []
    try:
        for backend in ("aot_eager",) if quick else ("aot_eager", "inductor"):
            runs: dict = {impl: [] for impl in _IMPLS}
            for r in range(rounds):
                for impl in _IMPLS:
                    if r and "error" in runs[impl][0]:
                        continue  # a failure is not timed again
                    runs[impl].append(measure_on_ranks(
                        functools.partial(_measure, quick, backend, impl), size, method="spawn",
                        what=f"tp bench ({impl}, {backend}): the {size}-rank world", pg_timeout=120.0,
                        timeout=_TIMEOUT))
            rows += _rows(backend, {k: _fastest(v) for k, v in runs.items()}, size)
    finally:
        if old is None:
            os.environ.pop("TORCHINDUCTOR_FX_GRAPH_CACHE", None)
        else:
            os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = old
    return rows


def run(quick: bool = False) -> list[dict]:
    """The suite entry point (``subclass_kit.bench.SUITES``): :func:`flagship_rows`."""
    return flagship_rows(quick)


if __name__ == "__main__":
    from . import markdown_table

    print(markdown_table(run(quick="--quick" in sys.argv)))
