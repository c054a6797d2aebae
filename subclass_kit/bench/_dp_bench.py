"""Data parallelism compiled: the kit's ``data_parallel`` beside the same design (torchtitan's
SimpleFSDP) on torch's DTensor, per mode, on 4 gloo ranks.

The model: a token embedding, pre-norm GELU MLP blocks and an output projection; for FSDP+TP
the blocks' MLPs are also tensor parallel (Colwise then Rowwise) over the ``tp`` dim of a
(2, 2) mesh (the kit's ``parallelize`` / torch's ``parallelize_module``), data parallel over
its ``dp`` dim. Modes: ``fully_shard`` and ``replicate`` on a 1-D mesh of 4 ranks,
``hybrid_shard`` on (2, 2), ``fsdp+tp``. The whole model is compiled (fullgraph); cases: the
median of the training steps after the first (forward, backward with the gradient
reductions, AdamW) and the first step (dominated by the compile).

Each round runs in a fresh world (forked from a server that has imported torch) that first
compiles and trains the dense model once (torch's one-time costs are paid by no
implementation), then per mode compiles the kit's model and DTensor's (the first step of
each: its compile, from an empty fake-op cache and a collected heap; which goes first
alternates by mode and round), then alternates their
steps, so that load from other processes hits both alike. One world per round measures
every mode (quick: one world in all). A row's time is its fastest round; its ratio the
median over rounds of the round's median per-step ratio (kit / DTensor, steps taken back to
back), the robust figure on a shared machine; the first step's row also has ``cpu_ratio``,
the same in rank 0's CPU time (a compile is CPU work; the wall time of a one-off compile
swings with the machine's load). The inductor graph cache is off.
Every row carries the loss difference to the dense model (``max_loss_diff_vs_dense``).
"""

from __future__ import annotations

import functools
import gc
import os
import statistics
import sys
import time
from typing import Any

from .. import _compat
from ._spawn import measure_on_ranks
from ._tp_bench import _fastest

__all__ = ["run", "MODES", "dtensor_data_parallel"]

_TIMEOUT = 1200.0
_SIZE = 4
#: The modes measured: ``(data_parallel mode, mesh shape, tensor parallel too)``.
MODES = {
    "fully_shard": ("fully_shard", (4,), False),
    "replicate": ("replicate", (4,), False),
    "hybrid_shard": ("hybrid_shard", (2, 2), False),
    "fsdp+tp": ("fully_shard", (2, 2), True),
}
_IMPLS = {"kit": "kit data_parallel", "dtensor": "DTensor (SimpleFSDP)"}


def _model(dim: int, layers: int, vocab: int = 64):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.w1, self.w2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x):
            return x + self.w2(torch.nn.functional.gelu(self.w1(self.norm(x))))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, dim)
            self.layers = nn.ModuleList(Block() for _ in range(layers))
            self.norm = nn.LayerNorm(dim)
            self.out = nn.Linear(dim, vocab, bias=False)

        def forward(self, tokens):
            h = self.emb(tokens)
            for layer in self.layers:
                h = layer(h)
            return self.out(self.norm(h))

    torch.manual_seed(0)
    return Net()


# ---- SimpleFSDP over torch's DTensor (the anchor) ---------------------------------------------
_DT_CLASSES: dict = {}


def _dt_compute(module, name: str):
    from torch.distributed.tensor import DTensor

    p = module._parameters[name]
    mesh, compute, grad, mp, tp = module._dt_dp[name]
    full = p.redistribute(mesh, compute, forward_dtype=mp[0], backward_dtype=mp[1])
    local = full.to_local(grad_placements=grad)
    if tp is None:
        return local
    return DTensor.from_local(local, tp[0], tp[1], shape=tp[2], stride=tp[3])


def dtensor_data_parallel(model, mesh, mode: str, mp_policy=None):
    """torchtitan's SimpleFSDP ``data_parallel`` written with torch's public DTensor API: the
    anchor the kit's ``data_parallel`` is compared with (bench and tests). A parameter that
    is a DTensor on a TP mesh is held as its TP shard distributed over ``mesh``.

    Example:
        >>> m = dtensor_data_parallel(torch.nn.Linear(2, 2), mesh, "fully_shard")  # doctest: +SKIP
    """
    from torch import nn
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    layouts: dict[str, list[Any]] = {"fully_shard": [Shard(0)], "replicate": [Replicate()],
                                     "hybrid_shard": [Replicate(), Shard(0)]}
    placements = layouts[mode]
    compute, grad = [Replicate()] * mesh.ndim, [Partial("avg")] * mesh.ndim
    mp = (getattr(mp_policy, "param_dtype", None), getattr(mp_policy, "reduce_dtype", None))
    done: dict = {}
    for mod in list(model.modules()):
        names = tuple(n for n, p in mod._parameters.items() if p is not None)
        if not names:
            continue
        specs = {}
        for n in names:
            p = mod._parameters[n]
            if id(p) not in done:
                tp, local = None, p
                if isinstance(p, DTensor):
                    tp, local = (p.device_mesh, p.placements, p.shape, p.stride()), p.to_local()
                done[id(p)] = (nn.Parameter(distribute_tensor(local.detach(), mesh, placements)), tp)
            new, tp = done[id(p)]
            mod._parameters[n] = new
            specs[n] = (mesh, compute, grad, mp, tp)
        mod._dt_dp = specs
        key = (type(mod), names)
        if key not in _DT_CLASSES:
            props = {n: property(functools.partial(_dt_compute, name=n)) for n in names}
            _DT_CLASSES[key] = type(f"DTensorDP{type(mod).__name__}", (type(mod),), props)
        mod.__class__ = _DT_CLASSES[key]
    return model


# ---- one world ----------------------------------------------------------------------------------
def _build(impl: str, mode: str, dim: int, layers: int):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dp_mode, shape, tp = MODES[mode]
    names = ("dp", "tp") if tp else (("rep", "shard") if len(shape) == 2 else None)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    assert mesh.size() == dist.get_world_size()
    dp_mesh = mesh["dp"] if tp else mesh
    model = _model(dim, layers)
    if impl == "kit":
        from ..sharded import ColwiseParallel, RowwiseParallel, data_parallel, parallelize

        if tp:
            for block in model.layers:
                parallelize(block, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        return data_parallel(model, dp_mesh, mode=dp_mode), dp_mesh
    if tp:
        from torch.distributed.tensor.parallel import ColwiseParallel as TC
        from torch.distributed.tensor.parallel import RowwiseParallel as TR
        from torch.distributed.tensor.parallel import parallelize_module

        for block in model.layers:
            parallelize_module(block, mesh["tp"], {"w1": TC(), "w2": TR()})
    return dtensor_data_parallel(model, dp_mesh, dp_mode), dp_mesh


class _Trainer:
    """One implementation's compiled model and optimizer; ``step()`` times one training step
    on this rank's rows of the next batch and keeps the loss averaged over the world."""

    def __init__(self, model, dp_index: int, dp_size: int, batch: int, seq: int, backend: str):
        import torch

        self.counter = _compat.compile_counter(backend)
        self.model, self.fn = model, torch.compile(model, backend=self.counter, fullgraph=True)
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.g = torch.Generator().manual_seed(1)
        self.dp, self.batch, self.seq = (dp_index, dp_size), batch, seq
        self.times: list = []
        self.cpu: list = []  # this process's CPU seconds per step (load from others does not count)
        self.losses: list = []

    def step(self) -> None:
        import torch
        import torch.nn.functional as F

        tokens = torch.randint(64, (self.batch, self.seq + 1), generator=self.g)
        rows = tokens.chunk(self.dp[1])[self.dp[0]]
        t0, c0 = time.perf_counter(), time.process_time()
        loss = F.cross_entropy(self.fn(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten())
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.times.append(time.perf_counter() - t0)
        self.cpu.append(time.process_time() - c0)
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        self.losses.append(total.item() / torch.distributed.get_world_size())


def _sizes(quick: bool) -> dict:
    return dict(dim=32, layers=1, steps=7, batch=8, seq=16) if quick else dict(dim=64, layers=4, steps=30, batch=8, seq=32)


def _dense_losses(s: dict, backend: str | None) -> list:
    dense = _model(s["dim"], s["layers"])
    t = _Trainer(dense, 0, 1, s["batch"], s["seq"], backend or "eager")
    if backend is None:
        t.fn = dense
    for _ in range(s["steps"] if backend is None else 1):
        t.step()
    return t.losses


def _measure_mode(s: dict, backend: str, mode: str, order: tuple, ref: list) -> dict:
    """Each impl of ``order`` built and compiled (its first step), then their steps
    alternated (so load from other processes hits both alike): ``{impl: {"step", "first",
    "graphs", "diff"} or {"error"}, "ratios": {"step": [kit / DTensor per step], "first"}}``."""
    trainers: dict = {}
    out: dict[str, Any] = {}
    _compat.dynamo_reset()  # each mode compiles afresh (the dense warm-up's torch costs stay paid)
    for impl in order:
        # Neither compile reuses the other's cached fake ops (the same shapes), nor collects
        # the other's garbage mid-compile: no order bias. (The two compile different frames,
        # so the first's dynamo cache entries are not in the second's way.)
        _compat.clear_fake_tensor_cache()
        try:
            model, dp_mesh = _build(impl, mode, s["dim"], s["layers"])
            coord = dp_mesh.get_coordinate()
            idx = coord[0] * (dp_mesh.shape[1] if len(coord) == 2 else 1) + (coord[1] if len(coord) == 2 else 0)
            trainers[impl] = _Trainer(model, idx, dp_mesh.size(), s["batch"], s["seq"], backend)
            gc.collect()
            trainers[impl].step()
        except Exception as e:  # noqa: BLE001 - the row reports why
            out[impl] = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:200]}
            trainers.pop(impl, None)
    for _ in range(s["steps"] - 1):
        for t in trainers.values():
            t.step()
    for impl, t in trainers.items():
        out[impl] = {"step": statistics.median(t.times[1:]), "first": t.times[0], "graphs": t.counter.frame_count,
                     "diff": max(abs(a - b) for a, b in zip(t.losses, ref))}
    if len(trainers) == 2:
        kit, dt = trainers["kit"].times, trainers["dtensor"].times
        out["ratios"] = {"step": [a / b for a, b in zip(kit[1:], dt[1:])], "first": kit[0] / dt[0],
                         "first_cpu": trainers["kit"].cpu[0] / trainers["dtensor"].cpu[0]}
    return out


def _measure(quick: bool, backend: str, modes: tuple, rnd: int) -> dict:
    """One world: the dense reference and a warm-up compile (torch's one-time costs), then
    every mode of ``modes`` (which impl compiles first alternates by mode and round)."""
    s = _sizes(quick)
    ref = _dense_losses(s, None)
    _dense_losses(s, backend)
    return {mode: _measure_mode(s, backend, mode, tuple(_IMPLS)[::1 if (i + rnd) % 2 == 0 else -1], ref)
            for i, mode in enumerate(modes)}


def _combine(runs: list) -> dict:
    """The rounds of one mode: per impl the fastest round (the rows' times); the ratios are
    the median over rounds of each round's median per-step ratio (steps taken back to
    back), and the median of the rounds' first-step ratios."""
    got = {impl: _fastest([r[impl] for r in runs]) for impl in _IMPLS}
    ratios = [r["ratios"] for r in runs if "ratios" in r]
    if ratios and not any("error" in v for v in got.values()):
        got["ratio"] = {"step": statistics.median(statistics.median(r["step"]) for r in ratios),
                        "first": statistics.median(r["first"] for r in ratios),
                        "first_cpu": statistics.median(r["first_cpu"] for r in ratios)}
    return got


def _rows(backend: str, mode: str, got: dict) -> list:
    rows = []
    ratio = got.get("ratio")
    for case, key in (("train step", "step"), ("first step (compile)", "first")):
        for impl, label in _IMPLS.items():
            row: dict[str, Any] = {"group": f"data_parallel {mode} {backend}", "name": case, "impl": label,
                                   "kind": "kit" if impl == "kit" else "torch", "world_size": _SIZE}
            r = got.get(impl, {"error": "not run"})
            if "error" in r:
                row.update(median_us=float("nan"), error=r["error"])
            else:
                row.update(median_us=round(r[key] * 1e6, 1), graphs=r["graphs"],
                           max_loss_diff_vs_dense=float(f"{r['diff']:.2e}"))
                if ratio:
                    row.update(ratio=round(ratio[key], 3) if impl == "kit" else 1.0, reference=_IMPLS["dtensor"])
                    if key == "first":  # the compile is CPU work: its ratio in rank 0's CPU time too
                        row.update(cpu_ratio=round(ratio["first_cpu"], 3) if impl == "kit" else 1.0)
            rows.append(row)
    return rows


def run(quick: bool = False, modes: tuple = tuple(MODES), rounds: int | None = None) -> list[dict]:
    """The suite entry point: per backend (``aot_eager``; ``inductor`` unless quick) and mode,
    the kit's and DTensor's rows (ratio: kit / DTensor, medians of per-round ratios). One
    fresh world per backend and round measures every mode.

    Example:
        >>> rows = run(quick=True, modes=("replicate",))  # doctest: +SKIP
    """
    rounds = (1 if quick else 2) if rounds is None else rounds
    from unittest import mock

    rows = []
    with mock.patch.dict(os.environ, {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}):  # cold first compiles, for all
        for backend in ("aot_eager",) if quick else ("aot_eager", "inductor"):
            runs: dict = {mode: [] for mode in modes}
            for r in range(rounds):
                got = measure_on_ranks(
                    functools.partial(_measure, quick, backend, tuple(modes), r), _SIZE, method="forkserver",
                    preload=("torch", "torch.distributed", "torch._dynamo"),
                    what=f"dp bench ({backend}): the {_SIZE}-rank world", pg_timeout=300.0,
                    timeout=_TIMEOUT * len(modes))
                for mode in modes:
                    runs[mode].append(got[mode])
            for mode in modes:
                rows += _rows(backend, mode, _combine(runs[mode]))
    return rows


if __name__ == "__main__":
    from . import markdown_table

    print(markdown_table(run(quick="--quick" in sys.argv)))
