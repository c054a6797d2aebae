"""Precompile cases for test_precompile.py: ``torch.compile(fn, fullgraph=True).aot_compile``,
``save_compiled_function``, and ``torch.compiler.load_compiled_function`` in another process.

Module-level (functions pickled and imported by name): the saving process, a fresh
interpreter and the ranks of a fresh gloo world all build the same inputs from the same seeds.
Each case is ``(fn, inputs, changed)``: ``changed`` differs from ``inputs`` in a wrapped
input's ctx (a meta field, the outer dtype or the placements) and nothing the function's
result depends on otherwise.
"""

from __future__ import annotations

import io
import json
import os
import tempfile

import torch


def mm(w, x):
    return torch.mm(x, w) * 2


def _exemplar(name):
    from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor

    g = torch.Generator().manual_seed(0)
    if name == "TwoTensor":
        w = TwoTensor.__samples__()[0]
        x = torch.randn(3, w.shape[0], generator=g)
        return mm, (w, x), (TwoTensor(w.a.double(), w.b.double()), x.double())
    if name == "ScaledTensor":
        w = ScaledTensor.__samples__()[0]
        x = torch.randn(3, w.shape[0], generator=g)
        return mm, (w, x), (ScaledTensor(w.qdata, w.scale, dtype=torch.bfloat16), x)
    if name == "BlockScaled":
        w, w16 = BlockScaled.__samples__()[:2]  # same shape, block 32 and 16
        x = torch.randn(3, w.shape[0], generator=g)
        return mm, (w, x), (w16, x)
    raise KeyError(name)


EXEMPLARS = ("TwoTensor", "ScaledTensor", "BlockScaled")


def plain(out):
    """A result as a dense tensor (TwoTensor's ops return TwoTensors)."""
    return out.to_plain() if hasattr(out, "to_plain") and type(out) is not torch.Tensor else out


def compile_and_save(fn, inputs, path: str, backend: str) -> None:
    compiled = torch.compile(fn, fullgraph=True, backend=backend).aot_compile((inputs, {}))
    compiled.save_compiled_function(path)


def load_and_call(fn, inputs, changed, path: str) -> dict:
    """Load ``path`` (in a process that has not compiled ``fn``), call it, compare with eager,
    then call it with ``changed``. Returns what happened, JSON-able."""
    with open(path, "rb") as f:
        loaded = torch.compiler.load_compiled_function(f)
    out = loaded(*inputs)
    expected = fn(*inputs)
    row = {
        "type_equal": type(out) is type(expected),
        "max_error": (plain(out) - plain(expected)).abs().max().item(),
    }
    try:
        loaded(*changed)
        row["changed"] = "ran"
    except Exception as e:  # noqa: BLE001 - reported verbatim to the test
        row["changed"] = f"{type(e).__name__}: {e}"
    return row


def fresh_process_report(folder: str) -> str:
    """Run in a fresh interpreter: load every exemplar's artifact from ``folder``; JSON."""
    report = {name: load_and_call(*_exemplar(name), os.path.join(folder, f"{name}.bin")) for name in EXEMPLARS}
    import sys

    report["dynamo_frames_compiled"] = _frames_compiled()
    report["kit_imported"] = "subclass_kit" in sys.modules
    return json.dumps(report)


def _frames_compiled() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["frames"].values()) if "frames" in counters else 0


# ---- on the ranks of a 2-rank gloo world --------------------------------------------------


def act_input(y, x):
    return y * 2 + x


def issues_all_reduce(x):
    from subclass_kit.collectives import all_reduce

    return all_reduce(x, "sum") * 2 + 1


def sharded_mm(w, x):
    return torch.mm(x, w).full_tensor()


DIST_CASES = ("ShardedTensor", "ACT input", "all_reduce inside")


def _dist_case(name):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from subclass_kit.collectives import all_reduce
    from subclass_kit.sharded import Replicate, Shard, ShardedTensor

    rank = dist.get_rank()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3, 4, generator=g)  # the same on every rank
    if name == "ShardedTensor":
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        full = torch.randn(4, 6, generator=g)
        w = ShardedTensor.from_local(full.chunk(2, dim=1)[rank].contiguous(), mesh, [Shard(1)])
        return sharded_mm, (w, x), (ShardedTensor.from_local(full, mesh, [Replicate()]), x)
    mine = torch.full((3, 4), float(rank + 1))
    if name == "ACT input":
        # A pending collective result per call: each build issues one on every rank.
        return act_input, (all_reduce(mine, "sum"), x), (all_reduce(mine.double(), "sum"), x)
    if name == "all_reduce inside":
        return issues_all_reduce, (mine,), (mine.double(),)
    raise KeyError(name)


def rank_save(folder: str, backend: str) -> list:
    """On every rank: compile and save each distributed case (one file per rank)."""
    import torch.distributed as dist

    for name in DIST_CASES:
        fn, inputs, _ = _dist_case(name)
        compile_and_save(fn, inputs, _rank_file(folder, name, dist.get_rank()), backend)
    dist.barrier()  # every rank's files are written
    return sorted(os.listdir(folder))


def rank_load(folder: str) -> dict:
    """On every rank of a fresh world, with an empty inductor cache: load, compare, change ctx."""
    import torch.distributed as dist

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="empty-inductor-cache-")
    report = {}
    for name in DIST_CASES:
        fn, inputs, changed = _dist_case(name)
        report[name] = load_and_call(fn, inputs, changed, _rank_file(folder, name, dist.get_rank()))
        dist.barrier()  # no rank's next collective meets another's leftover
    report["dynamo_frames_compiled"] = _frames_compiled()
    return report


def _rank_file(folder, name, rank):
    return os.path.join(folder, f"{name.replace(' ', '_')}-rank{rank}.bin")


def roundtrip_in_memory(fn, inputs) -> torch.Tensor:
    """Save to bytes and load back in this process (no file)."""
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager").aot_compile((inputs, {}))
    data = type(compiled).serialize(compiled).serialized_data
    return torch.compiler.load_compiled_function(io.BytesIO(data))(*inputs)
