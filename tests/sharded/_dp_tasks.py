"""Rank tasks for ``data_parallel`` on 4 gloo ranks: torch's TP-test Transformer trained a few
AdamW steps by the dense model (the whole batch on every rank), by the kit's
``data_parallel`` (each data-parallel rank its rows of the batch; eager and compiled) and by
the same SimpleFSDP design over torch's own DTensor
(``subclass_kit.bench._dp_bench.dtensor_data_parallel``, torch's public API only). Each task raises on a
value that differs from dense and returns what the tests compare: the functional
collectives (with the dtype each one carries) in the compiled forward and backward graphs,
kit beside DTensor."""

from __future__ import annotations

import copy
from collections import Counter

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.testing._internal.distributed._tensor.common_dtensor import ModelArgs, Transformer

from subclass_kit.sharded import MixedPrecisionPolicy, ShardedTensor, data_parallel

from subclass_kit.bench._dp_bench import dtensor_data_parallel

from sharded._tasks import _Record
from sharded._tp_upstream_tasks import parallelize_transformer

STEPS = 3
BATCH = 8
SEQ = 8
_MESHES: dict = {}


def _mesh(mode: str):
    """(the data-parallel mesh, the TP mesh or None), built once per rank process."""
    if mode not in _MESHES:
        from torch.distributed.device_mesh import init_device_mesh

        n = dist.get_world_size()
        if mode in ("fully_shard", "replicate"):
            _MESHES[mode] = (init_device_mesh("cpu", (n,)), None)
        elif mode == "hybrid_shard":
            _MESHES[mode] = (init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("rep", "shard")), None)
        else:  # fsdp+tp
            m = init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("dp", "tp"))
            _MESHES[mode] = (m["dp"], m["tp"])
    return _MESHES[mode]


def _dp_coord(dp_mesh) -> tuple[int, int]:
    """(this rank's index among the data-parallel ranks, their number)."""
    coord = dp_mesh.get_coordinate()
    idx = 0
    for c, k in zip(coord, dp_mesh.shape):
        idx = idx * k + c
    return idx, dp_mesh.size()


def _args() -> ModelArgs:
    return ModelArgs(n_layers=1, vocab_size=16, max_seq_len=SEQ, dim=16, n_heads=4, dropout_p=0.0)


def _dense() -> nn.Module:
    torch.manual_seed(0)
    return Transformer(_args())


def _batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(16, (BATCH, SEQ + 1), generator=g) for _ in range(STEPS)]


def _train(model, fn, dp: tuple[int, int]) -> list[float]:
    """STEPS AdamW steps on this rank's rows; the losses averaged over the world (= the
    dense model's losses on the whole batch: every data-parallel rank has as many rows)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    losses = []
    for tokens in _batches():
        rows = tokens.chunk(dp[1])[dp[0]]
        out = fn(rows[:, :-1])
        loss = F.cross_entropy(out.flatten(0, 1), rows[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / dist.get_world_size())
    return losses


# ---- the task --------------------------------------------------------------------------------
def _build(impl: str, mode: str, mp):
    dp_mesh, tp_mesh = _mesh(mode)
    model = _dense()
    dp_mode = "fully_shard" if mode == "fsdp+tp" else mode
    if impl == "kit":
        if tp_mesh is not None:
            parallelize_transformer(model, tp_mesh, seq_parallel=False, local_output_for_attn=True)
        return data_parallel(model, dp_mesh, mode=dp_mode, mp_policy=mp)
    if tp_mesh is not None:
        Transformer.parallelize(model, tp_mesh, use_seq_parallel=False, local_output_for_attn=True)
    return dtensor_data_parallel(model, dp_mesh, dp_mode, mp)


def full_params(model) -> dict:
    """The dense values of a data-parallel model's parameters, by name."""
    out = {}
    for mod_name, mod in model.named_modules():
        specs = getattr(mod, "_kit_dp", None) or getattr(mod, "_dt_dp", None)
        for n in specs or ():
            p = mod._parameters[n].full_tensor()
            tp = specs[n].tp if hasattr(specs[n], "tp") else specs[n][4]
            if tp is not None and getattr(specs[n], "dp", None) is None:  # a TP shard: gather it over tp
                if isinstance(mod._parameters[n], ShardedTensor):
                    p = ShardedTensor.from_local(p, tp[0], tp[1], shape=tp[2], stride=tp[3]).full_tensor()
                else:
                    from torch.distributed.tensor import DTensor

                    p = DTensor.from_local(p, tp[0], tp[1], shape=tp[2], stride=tp[3]).full_tensor()
            out[f"{mod_name}.{n}".lstrip(".")] = p
    return out


def _collectives(rec: _Record) -> dict:
    """Per graph kind, the functional collectives as ``{"name dtype": [count, elements]}``
    (elements: the sum of their inputs' sizes)."""
    out = {}
    for kind in ("fw", "bw"):
        c: dict = {}
        for gm in rec.graphs[kind]:
            for node in gm.graph.nodes:
                t = str(node.target)
                if node.op == "call_function" and t.startswith("_c10d_functional.") and "wait_tensor" not in t:
                    val = node.args[0].meta.get("val") if hasattr(node.args[0], "meta") else None
                    key = f"{t.split('.')[1]} {str(getattr(val, 'dtype', '?')).replace('torch.', '')}"
                    got = c.setdefault(key, [0, 0])
                    got[0] += 1
                    got[1] += int(val.numel()) if val is not None else 0
        out[kind] = c
    return out


COPY_OPS = ("subclass_kit.dp_copy_in.default", "subclass_kit.dp_copy_out.default",
            "aten._chunk_cat.default", "aten.split_with_sizes_copy.default")


def _copy_ops(rec: _Record) -> dict:
    """Per graph kind, how many nodes call each of COPY_OPS (the buckets' copy-in and copy-out)."""
    return {kind: {op: sum(str(n.target) == op for gm in rec.graphs[kind] for n in gm.graph.nodes) for op in COPY_OPS}
            for kind in ("fw", "bw")}


def train_modes(mode: str, mixed: bool = False, backend: str = "aot_eager") -> dict:
    """Dense, kit eager, kit compiled and DTensor compiled (both SimpleFSDP-style), STEPS
    steps each: losses and parameters vs dense (exact to fp32 rounding; bf16 tolerance on
    the losses with ``mixed``), the kit's gradients Replicate/sharded as stored (never a
    pending Partial), and the collectives of the compiled graphs by impl."""
    dp_mesh, _ = _mesh(mode)
    dp = _dp_coord(dp_mesh)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed else None
    dense = _dense()
    ref = _train(dense, dense, (0, 1))
    ref_params = dict(dense.named_parameters(remove_duplicate=False))
    out: dict = {"collectives": {}}
    params = {}
    runs = [("kit", "eager"), ("kit", backend), ("dtensor", backend)] if backend != "inductor" else [("kit", backend)]
    for impl, how in runs:
        torch._dynamo.reset()
        model = _build(impl, mode, mp)
        if how == "eager":
            fn = model
        else:
            rec = _Record() if how == "aot_eager" else None
            fn = torch.compile(model, backend=rec.backend if rec else how, fullgraph=True)
        got = _train(model, fn, dp)
        tol = dict(rtol=3e-2, atol=3e-2) if mixed else dict(rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), **tol, msg=lambda m: f"{impl} {how} losses: {m}")
        params[impl, how] = full_params(model)
        if not mixed:
            for n, v in params[impl, how].items():
                torch.testing.assert_close(v, ref_params[n].detach(), rtol=1e-4, atol=1e-5,
                                           msg=lambda m, n=n: f"{impl} {how} {mode} {n}: {m}")
        if impl == "kit" and how == "eager":
            # One more backward: each gradient is reduced by then, in the stored layout.
            fn(_batches()[0][:2, :-1]).sum().backward()
            out["grad placements"] = sorted({repr(tuple(p.grad.placements)) for p in model.parameters()})
            out["stored placements"] = sorted({repr(tuple(p.placements)) for p in model.parameters()})
        if how == "aot_eager":
            out["collectives"][impl] = _collectives(rec)
            if impl == "kit":
                out["copy ops"] = _copy_ops(rec)
            out.setdefault("graphs", {})[impl] = [len(rec.graphs["fw"]), len(rec.graphs["bw"])]
    if mixed and ("dtensor", backend) in params:
        for n, v in params["kit", backend].items():
            torch.testing.assert_close(v, params["dtensor", backend][n], rtol=1e-3, atol=1e-3,
                                       msg=lambda m, n=n: f"kit vs DTensor {n}: {m}")
    return out


class _Uneven(nn.Module):
    """Sizes no 4-rank or 2-rank split divides (chunks of 5 rows: 2, 2, 1, 0), in blocks."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.LayerNorm(6), nn.Linear(6, 5), nn.GELU(), nn.Linear(5, 6))
                                    for _ in range(2))
        self.out = nn.Linear(6, 3)

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return self.out(x)


def uneven_shards(mode: str) -> None:
    """Two SGD steps of ``_Uneven`` eager: parameters and losses equal dense's (each unit's
    padded gather and reduce-scatter cut back to torch.chunk's sizes)."""
    dp_mesh, _ = _mesh(mode)
    dp = _dp_coord(dp_mesh)
    torch.manual_seed(0)
    dense = _Uneven()
    model = data_parallel(copy.deepcopy(dense), dp_mesh, mode=mode)
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(2))
    for net, inp in ((dense, x), (model, x.chunk(dp[1])[dp[0]])):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(2):
            net(inp).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    for (n, p), q in zip(model.named_parameters(), dense.parameters()):
        torch.testing.assert_close(p.full_tensor(), q.detach(), rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{mode} {n}: {m}")
