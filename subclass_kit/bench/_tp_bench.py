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

The kit hands block 0 the embedding's output waited (a plain tensor, as every later block's
input), so its default plan compiles one graph for all blocks, as DTensor with the embedding
waited; the ``kit, embedding waited`` row is kept as the check that the wait costs nothing
more. (Until issue 29 the kit handed block 0 the embedding's reduce-scatter pending, an
``AsyncCollectiveTensor``: another input type to dynamo, so block 0 had a graph of its own.)
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
from typing import Any

from .. import _compat
from ._spawn import measure_on_ranks

__all__ = ["run", "flagship_rows", "layernorm_sp_rows"]

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
            row: dict[str, Any] = {"group": f"tp_llama {backend}", "name": case, "impl": _IMPLS[impl],
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


# ---- sequence parallelism over LayerNorm: torch's toy Transformer --------------------------
def _ln_transformer(dim: int = 64, n_layers: int = 2, n_heads: int = 4, vocab: int = 128, max_seq: int = 64):
    """torch's TP-test Transformer (its common_dtensor ``Transformer``, nanoGPT-like):
    token and position embeddings, blocks of LayerNorm / causal attention / LayerNorm / GELU
    MLP, a final LayerNorm and the output projection; dropout off (a benchmark)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.n_heads = n_heads
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = (w(x).view(b, s, self.n_heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(out.transpose(1, 2).reshape(b, s, -1))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x):
            return self.w2(F.gelu(self.w1(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.attention = nn.LayerNorm(dim), Attention()
            self.ffn_norm, self.feed_forward = nn.LayerNorm(dim), FeedForward()

        def forward(self, x):
            h = x + self.attention(self.attention_norm(x))
            return h + self.feed_forward(self.ffn_norm(h))

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings, self.pos_embeddings = nn.Embedding(vocab, dim), nn.Embedding(max_seq, dim)
            self.layers = nn.ModuleList(Block() for _ in range(n_layers))
            self.norm, self.output = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

        def forward(self, tokens):
            h = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(tokens.shape[1]))
            for layer in self.layers:
                h = layer(h)
            return self.output(self.norm(h))

    torch.manual_seed(0)
    return Transformer()


def _ln_plan(model, mesh, impl: str):
    """torch's Transformer.parallelize with sequence parallelism (the logits left
    vocab-sharded for loss_parallel), with the kit's styles or torch's. Attention runs on
    each rank's heads as local tensors (its ``local_output_for_attn``): DTensor has no rule
    for CPU attention (``_scaled_dot_product_flash_attention_for_cpu``) -- the kit has."""
    if impl == "kit":
        from ..sharded import (ColwiseParallel, PrepareModuleInput, Replicate, RowwiseParallel,
                               SequenceParallel, Shard, parallelize as apply)
    else:
        # torch's styles under the kit's names: the plan below is written once for both.
        from torch.distributed.tensor import Replicate, Shard  # type: ignore[assignment]
        from torch.distributed.tensor.parallel import (  # type: ignore[assignment]
            ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel, parallelize_module as apply,
        )
    apply(model, mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "pos_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    for block in model.layers:
        apply(block, mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward.w1": ColwiseParallel(input_layouts=Shard(1)),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        })
        block.attention.n_heads //= mesh.size()
    return model


def _ln_loss_parallel(impl: str):
    if impl == "kit":
        from ..sharded import loss_parallel
    elif impl == "dtensor":
        from torch.distributed.tensor.parallel import loss_parallel
    else:
        return None  # plain: no loss_parallel context
    return loss_parallel


def _ln_step(model, opt, loss_parallel, step: int, seqlen: int, vocab: int = 128) -> tuple[float, float]:
    """One training step on batch ``step``: ``(loss, seconds)``."""
    import contextlib

    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(step)
    tokens, labels = torch.randint(vocab, (2, seqlen), generator=g), torch.randint(vocab, (2, seqlen), generator=g)
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with loss_parallel() if loss_parallel is not None else contextlib.nullcontext():
        loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten())
        loss.backward()
    opt.step()
    value = float((loss.full_tensor() if hasattr(loss, "full_tensor") else loss).detach())
    return value, time.perf_counter() - t0


def _ln_train(model, impl: str, steps: int, seqlen: int) -> tuple[list, list]:
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lp = _ln_loss_parallel(impl)
    got = [_ln_step(model, opt, lp, step, seqlen) for step in range(steps)]
    return [loss for loss, _ in got], [t for _, t in got]


def _ln_world(quick: bool, backend: str):
    """``(mesh, steps, seqlen, dense losses)`` after a dense warm-up compile with
    ``backend`` (torch's one-time costs of a first compile and backward, paid by no impl)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    steps, seqlen = _sizes(quick)
    ref, _ = _ln_train(_ln_transformer(), "dense", steps, seqlen)
    warm = _ln_transformer()
    for block in warm.layers:
        block.compile(backend=backend, fullgraph=True)
    _ln_train(warm, "dense", 1, seqlen)
    _compat.dynamo_reset()
    return mesh, steps, seqlen, ref


def _measure_ln(quick: bool, backend: str, impl: str) -> dict:
    """One implementation's first step (compiling the blocks) on this world, with a cold
    inductor cache of its own (no kernel compiled by another world is reused): ``{"first",
    "graphs"}`` (or ``{"error"}``)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kit-bench-inductor-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        mesh, _, seqlen, _ = _ln_world(quick, backend)
        counter = _compat.compile_counter(backend)
        try:
            model = _ln_plan(_ln_transformer(), mesh, impl)
            for block in model.layers:
                block.compile(backend=counter, fullgraph=True)
            _, times = _ln_train(model, impl, 1, seqlen)
        except Exception as e:  # noqa: BLE001 - the row reports why
            return {"error": f"{type(e).__name__}: {e}".splitlines()[0][:200]}
        return {"first": times[0], "graphs": counter.frame_count}


def _measure_ln_pair(quick: bool, backend: str) -> dict:
    """Both implementations trained in this one world, their steps alternating (the order
    flips every step), so load from other processes hits them alike: per impl ``{"step"
    (median after the first two steps), "diff" (max loss difference to dense), "graphs"}``,
    or ``{"error"}``."""
    import torch

    mesh, steps, seqlen, ref = _ln_world(quick, backend)
    steps *= 2  # the steady-state step is the point here: more of them
    runs: dict = {}
    for impl in ("dtensor", "kit"):
        counter = _compat.compile_counter(backend)
        try:
            model = _ln_plan(_ln_transformer(), mesh, impl)
            for block in model.layers:
                block.compile(backend=counter, fullgraph=True)
        except Exception as e:  # noqa: BLE001 - the row reports why
            runs[impl] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:200]}
            continue
        runs[impl] = {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=1e-3),
                      "lp": _ln_loss_parallel(impl), "counter": counter, "losses": [], "times": []}
    for step in range(steps):
        for impl in ("dtensor", "kit") if step % 2 == 0 else ("kit", "dtensor"):
            r = runs[impl]
            if "error" in r:
                continue
            try:
                loss, t = _ln_step(r["model"], r["opt"], r["lp"], step % len(ref), seqlen)
            except Exception as e:  # noqa: BLE001 - the row reports why
                runs[impl] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:200]}
                continue
            r["losses"].append(loss)
            r["times"].append(t)
    out = {}
    for impl, r in runs.items():
        if "error" in r:
            out[impl] = r
            continue
        diff = max(abs(a - b) for a, b in zip(r["losses"], ref))  # the steps dense also took
        out[impl] = {"step": statistics.median(r["times"][2:]), "diff": diff, "graphs": r["counter"].frame_count}
    return out


def layernorm_sp_rows(quick: bool = False, size: int = 2, rounds: int | None = None,
                      backends: tuple | None = None) -> list[dict]:
    """Rows for a compiled TP step with sequence parallelism over LayerNorm (torch's toy
    Transformer, dim 64, 2 blocks, batch 2), the kit vs DTensor under the same plan.

    ``train step``: both implementations in one freshly spawned world (after a dense
    warm-up compile), their training steps alternating; each world's median step per impl,
    the ratio from the same world (the median over rounds; ``ratios`` lists each round's).
    ``first step (compile)``: each implementation in a world of its own with a cold inductor
    cache, alternating over rounds, the fastest round.

    Example:
        >>> rows = layernorm_sp_rows(quick=True)  # doctest: +SKIP
        >>> sorted({r["impl"] for r in rows})  # doctest: +SKIP
        ['DTensor', 'kit']
    """
    rounds = (1 if quick else 2) if rounds is None else rounds
    backends = backends or (("aot_eager",) if quick else ("aot_eager", "inductor"))
    old = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_CACHE_DIR")}
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
    labels = (("kit", "kit"), ("dtensor", "DTensor"))
    rows = []
    try:
        for backend in backends:
            what = f"tp layernorm-SP bench ({{}}, {backend}): the {size}-rank world"
            pairs = [measure_on_ranks(functools.partial(_measure_ln_pair, quick, backend), size, method="spawn",
                                      what=what.format("both impls"), pg_timeout=120.0, timeout=_TIMEOUT)
                     for _ in range(rounds)]
            firsts: dict = {"dtensor": [], "kit": []}
            for r in range(rounds):
                for impl in ("dtensor", "kit") if r % 2 == 0 else ("kit", "dtensor"):
                    firsts[impl].append(measure_on_ranks(
                        functools.partial(_measure_ln, quick, backend, impl), size, method="spawn",
                        what=what.format(impl), pg_timeout=120.0, timeout=_TIMEOUT))
            group = f"tp_layernorm_sp {backend}"
            step_ok = [p for p in pairs if all("error" not in p[k] for k in ("kit", "dtensor"))]
            ratios = [round(p["kit"]["step"] / p["dtensor"]["step"], 3) for p in step_ok]
            for impl, label in labels:
                row: dict[str, Any] = {"group": group, "name": "train step", "impl": label,
                                       "kind": "kit" if impl == "kit" else "torch", "world_size": size}
                ok = [p[impl] for p in pairs if "error" not in p[impl]]
                if ok:
                    row.update(median_us=round(min(o["step"] for o in ok) * 1e6, 1), graphs=max(o["graphs"] for o in ok),
                               max_loss_diff_vs_dense=float(f"{max(o['diff'] for o in ok):.2e}"))
                    if ratios:
                        row.update(ratio=round(statistics.median(ratios), 3) if impl == "kit" else 1.0, reference="DTensor",
                                   ratios=ratios if impl == "kit" else [1.0] * len(ratios))
                else:
                    row.update(median_us=float("nan"), error=next(p[impl]["error"] for p in pairs))
                rows.append(row)
            got = {k: _fastest_first(v) for k, v in firsts.items()}
            for impl, label in labels:
                row = {"group": group, "name": "first step (compile)", "impl": label,
                       "kind": "kit" if impl == "kit" else "torch", "world_size": size}
                if "error" not in got[impl]:
                    row.update(median_us=round(got[impl]["first"] * 1e6, 1), graphs=got[impl]["graphs"])
                    if "error" not in got["dtensor"]:
                        row.update(ratio=round(got[impl]["first"] / got["dtensor"]["first"], 3), reference="DTensor")
                else:
                    row.update(median_us=float("nan"), error=got[impl]["error"])
                rows.append(row)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return rows


def _fastest_first(runs: list) -> dict:
    bad = [r for r in runs if "error" in r]
    if bad:
        return bad[0]
    return {"first": min(r["first"] for r in runs), "graphs": max(r["graphs"] for r in runs)}


def run(quick: bool = False) -> list[dict]:
    """The suite entry point (``subclass_kit.bench.SUITES``): :func:`flagship_rows`, then
    :func:`layernorm_sp_rows`."""
    return flagship_rows(quick) + layernorm_sp_rows(quick)


if __name__ == "__main__":
    from . import markdown_table

    print(markdown_table(run(quick="--quick" in sys.argv)))
