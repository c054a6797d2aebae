"""PyTorch's DTensor unit tests ``test_init.py`` and ``test_random_ops.py`` (the 2-rank ports),
as _dtensor_unit_core_tasks: the same body on the kit and on torch's DTensor.

On a CPU mesh DTensor has no RNG tracker: each rank runs the random op on its own shard with
its own generator (upstream's ``not is_rng_supported_mesh`` branch). The kit's documented
random stream (docs/sharded.md, "Where it differs from DTensor") is the dense op's: each rank
draws the whole tensor under its generator and keeps its part, so under one seed on every
rank the global value is the dense draw. The ports assert upstream's CPU branch on DTensor
and the dense answer on the kit.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from sharded._dtensor_unit_core_tasks import _is_dt, _k, _mesh, _pl, _rank, close
from sharded._tp_upstream_tasks import Comms


# test_init.py's tests that _dtensor_api_tasks ports
ALREADY = ["test_ones", "test_empty", "test_full", "test_zeros", "test_zeros_full_mesh"]

SKIPPED = {  # test_random_ops.py
    "test_init_with_user_generator": "skip_if_lt_x_gpu(4): DTensor's RNG tracker on a cuda mesh",
    "test_tp_model_meta_init": "skip_unless_torch_gpu: DTensor's RNG tracker on a cuda mesh",
    "test_fsdp_tp_model_meta_init": "GPU only; FSDP2 fully_shard",
    "test_dtensor_init_helper_tensor_meta_strides": "GPU only; wraps DTensor's private RNG tracker",
    "test_rng_tracker_init": "GPU only; DTensor's private RNG tracker",
    "test_manual_seed": "GPU only; torch.distributed.tensor._random.manual_seed (the kit has no tracker)",
    "test_manual_seed_submesh": "GPU only; DTensor's private manual_seed",
    "test_pipeline_parallel_manual_seed": "GPU only; DTensor's private manual_seed",
    "test_deterministic_dropout_1d": "GPU only; per-rank seeds reconciled by DTensor's tracker",
    "test_deterministic_rand_1d": "GPU only; DTensor's offset-based RNG stream",
    "test_deterministic_uniform_2d": "GPU only; DTensor's private _calc_shard_linear_idx",
    "test_philox_state_seed_roundtrip": "DTensor's private _PhiloxState",
    "test_compile_*": "GPU only (9 tests): run_dtensor_rng_op in compiled graphs, cuda RNG state",
    "test_hsdp_tp_model_meta_init": "8 GPUs; FSDP2",
}


# ---- test_init.py: DTensorInitOpsTest ------------------------------------------------------------
def test_init_ops_constant(L):
    """test_init.py's test_init_ops: ``nn.init.constant_`` of a Shard(0) tensor."""
    local = torch.randn(8, 4)
    d = L.T.from_local(local, _mesh(), [L.Shard(0)])
    torch.manual_seed(_rank())
    ref = torch.nn.init.constant_(local.clone(), 2.4)
    torch.manual_seed(_rank())
    d = torch.nn.init.constant_(d, 2.4)
    close(ref, d.to_local())
    return "ok"


# ---- test_random_ops.py: DistTensorRandomInitTest ------------------------------------------------
_INIT_OPS = [
    ("kaiming_uniform_", torch.nn.init.kaiming_uniform_, {"a": 0, "mode": "fan_in", "nonlinearity": "leaky_relu"}),
    ("normal_", torch.nn.init.normal_, {"mean": 1.5, "std": 0.8}),
    ("uniform_", torch.nn.init.uniform_, {"a": 0, "b": 1.2}),
    ("log_normal_", torch.Tensor.log_normal_, {}),
    ("exponential_", torch.Tensor.exponential_, {}),
    ("geometric_", torch.Tensor.geometric_, {"p": 0.3}),
] + [
    (f"{f.__name__}[{dt}]", f, {**kw, "dtype": dt})
    for dt in (torch.float32, torch.float16)
    for f, kw in ((torch.rand_like, {}), (torch.randn_like, {}), (torch.randint_like, {"low": 0, "high": 100}))
]


def test_init_ops_random(L):
    """test_random_ops.py's test_init_ops. DTensor (cpu mesh): each rank's shard is the op on
    its local under its own seed. The kit: the global value is the op on the dense tensor
    under one seed (its documented random stream). Returns the ops that hold."""
    mesh = _mesh()
    out = {}
    for name, op, kw in _INIT_OPS:
        torch.manual_seed(0)
        whole = torch.randn(8, 4 * _k())
        if _is_dt(L):
            local = list(whole.chunk(_k(), 0))[_rank()]
            d = L.T.from_local(local, mesh, [L.Shard(0)])
            torch.manual_seed(_rank())
            ref = op(local.clone(), **kw)
            torch.manual_seed(_rank())
            got = op(d, **kw).to_local()
        else:
            d = L.distribute(whole, mesh, [L.Shard(1)])
            torch.manual_seed(1)
            ref = op(whole.clone(), **kw)
            torch.manual_seed(1)
            got = op(d, **kw).full_tensor()
        out[name] = bool(torch.equal(ref, got))
    return out


def test_multinomial_sharded(L):
    mesh = _mesh()
    torch.manual_seed(0)
    probs = torch.rand(8, 4)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    r = torch.multinomial(L.distribute(probs, mesh, [L.Shard(0)]), num_samples=2, replacement=True)
    assert r.shape == torch.Size([8, 2]) and isinstance(r, L.T)
    s0 = _pl(r)
    with Comms() as c:
        r1 = torch.multinomial(L.distribute(probs, mesh, [L.Shard(1)]), num_samples=2, replacement=True)
    assert c.total() > 0 and r1.shape == torch.Size([8, 2])
    return {"S0": s0, "S1": _pl(r1), "S1 comms": c.total()}


def test_meta_tensor_init(L):
    """Test 1 of test_meta_tensor_init (one seed on every rank): a Replicate meta tensor
    materialized and ``uniform_``-ed is equal on every rank. (Upstream's checks of the
    tracker's ``distribute_region_enabled`` flag, and its Test 2, are DTensor internals.)"""
    torch.manual_seed(0)
    meta = L.distribute(torch.empty(64, 32, device="meta"), _mesh(), [L.Replicate()])
    assert meta.is_meta
    d = torch.empty_like(meta, device="cpu")
    d.uniform_()
    g = [torch.empty(64, 32) for _ in range(_k())]
    dist.all_gather(g, d.to_local().contiguous())
    for other in g[1:]:
        close(g[0], other)
    return "ok"


PORTS = {
    "test_init.py": [test_init_ops_constant],
    "test_random_ops.py": [test_init_ops_random, test_multinomial_sharded, test_meta_tensor_init],
}
