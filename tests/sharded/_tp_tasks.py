"""Tensor-parallel tasks run on every rank of a spawned gloo world: each style and
``loss_parallel`` against the dense module (values and gradients, eager and compiled), the
bad-input errors that need ranks, and the llama flagship (examples/tp_llama.py)."""

from __future__ import annotations

import copy
import importlib.util
import pathlib
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend

from subclass_kit.sharded import (
    ColwiseParallel,
    MeshRef,
    ParallelizeError,
    Partial,
    PlacementError,
    PrepareModuleInput,
    PrepareModuleOutput,
    Replicate,
    RowwiseParallel,
    SequenceParallel,
    Shard,
    ShardedTensor,
    distribute,
    loss_parallel,
    parallelize,
)

from sharded._tasks import _Record
from sharded._meshes import strides as _strides

close = torch.testing.assert_close
_EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "tp_llama.py"


def example():
    """examples/tp_llama.py as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("tp_llama_example", _EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


def _full(g):
    return g.full_tensor() if isinstance(g, ShardedTensor) else g


def _compare(dense: nn.Module, tp: nn.Module, make_inputs, loss_fn, *, compiled: bool, what: str, dense_inputs=None) -> int:
    """Forward + backward of ``tp`` (eager or compiled fullgraph) equal ``dense``'s; the
    number of compiled frames."""
    for m in (dense, tp):
        m.zero_grad(set_to_none=True)
    ref = loss_fn(dense(*(dense_inputs or make_inputs)()))
    ref.backward()
    cnt = CompileCounterWithBackend("aot_eager")
    # A function calling the module, as a compiled TransformerBlock calls its parallelized
    # children: their hooks are traced into the one graph.
    run = torch.compile(lambda *a: tp(*a), backend=cnt, fullgraph=True) if compiled else tp
    got = loss_fn(run(*make_inputs()))
    close(_full(got), ref, msg=f"{what}: loss")
    got.backward()
    for (n, p), (_, q) in zip(tp.named_parameters(), dense.named_parameters()):
        assert isinstance(p, ShardedTensor), f"{what}: {n} is not sharded"
        close(_full(p.grad), q.grad, msg=f"{what}: grad of {n}", atol=1e-6, rtol=1e-5)
    return cnt.frame_count


class _Seq(nn.Module):
    """A norm followed by a layer that gathers the sequence (as a llama block does)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(8)
        self.proj = nn.Linear(8, 6, bias=False)

    def forward(self, x):
        return self.proj(self.norm(x))


class _Prep(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(8, 8)

    def forward(self, x, scale):
        return self.inner(x) * scale


def styles() -> dict:
    """Every style on its module kind vs the dense module, eager then compiled (aot_eager,
    fullgraph): values and gradients. Returns the frame counts."""
    mesh = _mesh()
    k = dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    frames = {}

    def case(name, build, plan, make_inputs, loss_fn=lambda y: y.square().sum(), dense_inputs=None):
        # No dynamo reset between the cases: the compiled code is shared, so the later cases
        # recompile it with automatic dynamic shapes (symbolic global sizes in the backward).
        torch.manual_seed(0)
        dense = build()
        tp = parallelize(copy.deepcopy(dense), mesh, plan)
        _compare(dense, tp, make_inputs, loss_fn, compiled=False, what=f"{name} eager", dense_inputs=dense_inputs)
        frames[name] = _compare(dense, tp, make_inputs, loss_fn, compiled=True, what=f"{name} compiled", dense_inputs=dense_inputs)

    ids = torch.randint(0, 10, (2, 4 * k), generator=g)
    ids[0, 0] = 3  # a padding token
    # Vocab-parallel embedding, reduced to Replicate (all-reduce) and to Shard(1) (reduce-scatter).
    case("embedding rowwise", lambda: nn.Embedding(10, 6, padding_idx=3), RowwiseParallel(), lambda: (ids,))
    case(
        "embedding rowwise Shard(1)", lambda: nn.Embedding(10, 6),
        RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False),
        lambda: (ids,), lambda y: (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(5))).sum(),
    )
    case("embedding colwise", lambda: nn.Embedding(10, 6), ColwiseParallel(output_layouts=Replicate()), lambda: (ids,))
    x = torch.randn(2, 4 * k, 8, generator=g)
    # Colwise taking a sequence-sharded input (gathered) and handing out a replicated output.
    r = dist.get_rank()
    case(
        "linear colwise Shard(1) in", lambda: nn.Linear(8, 6),
        ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=False),
        lambda: (x.chunk(k, 1)[r],), dense_inputs=lambda: (x,),
    )
    case(
        "mlp rowwise Shard(1) out", lambda: nn.Sequential(nn.Linear(8, 4 * k), nn.ReLU(), nn.Linear(4 * k, 8)),
        {"0": ColwiseParallel(), "2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)},
        lambda: (x,),
    )
    # SequenceParallel norm, then a Colwise layer that gathers the sequence.
    case(
        "sequence parallel", _Seq,
        {"norm": SequenceParallel(), "proj": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())},
        lambda: (x.chunk(k, 1)[r],), dense_inputs=lambda: (x,),
    )
    # PrepareModuleInput/Output around a parallelized submodule: the input arrives sharded on
    # the sequence, the output leaves sharded on it.
    torch.manual_seed(0)
    dense = _Prep()
    tp = copy.deepcopy(dense)
    tp = parallelize(tp, mesh, {"inner": ColwiseParallel(output_layouts=Replicate(), use_local_output=False)})
    PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)).apply(tp, mesh, "prep")
    PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=True).apply(tp, mesh, "prep")
    for compiled in (False, True):
        dense.zero_grad(set_to_none=True)
        tp.zero_grad(set_to_none=True)
        ref = dense(x, 2.0)
        ref.square().sum().backward()
        cnt = CompileCounterWithBackend("aot_eager")
        run = torch.compile(lambda *a: tp(*a), backend=cnt, fullgraph=True) if compiled else tp
        out = run(x.chunk(k, 1)[r], 2.0)
        assert type(out) is torch.Tensor
        close(out, ref.chunk(k, 1)[r])
        # Each rank's loss covers its part of the sequence: the sum over ranks is the dense loss.
        out.square().sum().backward()
        for (n, p), (_, q) in zip(tp.named_parameters(), dense.named_parameters()):
            close(_full(p.grad), q.grad, msg=f"prepare {n} compiled={compiled}")
        if compiled:
            frames["prepare input/output"] = cnt.frame_count

    # loss_parallel: cross entropy of vocab-sharded logits, with an ignored target.
    logits = torch.randn(6, 10, generator=g)
    target = torch.randint(0, 10, (6,), generator=g)
    target[2] = -100

    def ce(lg, tg):
        return F.cross_entropy(lg, tg)

    for compiled in (False, True):
        dense_l = logits.clone().requires_grad_(True)
        ref = ce(dense_l, target)
        ref.backward()
        sharded = distribute(logits, mesh, [Shard(1)]).requires_grad_(True)
        cnt = CompileCounterWithBackend("aot_eager")
        fn = torch.compile(ce, backend=cnt, fullgraph=True) if compiled else ce
        with loss_parallel():
            loss = fn(sharded, target)
            loss.backward()
        close(loss, ref)
        assert sharded.grad.placements == (Shard(1),)
        close(sharded.grad.full_tensor(), dense_l.grad)
        if compiled:
            frames["loss_parallel"] = cnt.frame_count
    # Outside the context cross entropy is torch's own again.
    assert F.cross_entropy is torch.nn.functional.cross_entropy and F.cross_entropy.__module__ == "torch.nn.functional"
    return frames


def errors() -> dict:
    """Bad input that needs ranks: another mesh, input placements contradicting the layouts."""
    mesh = _mesh()
    out = {}
    torch.manual_seed(0)
    lin = parallelize(nn.Linear(4, 4), mesh, ColwiseParallel())
    other = distribute(torch.randn(2, 4), MeshRef.local(), [Replicate()])
    try:
        lin(other)
        out["mesh"] = "no error"
    except ParallelizeError as e:
        out["mesh"] = str(e)
    m = parallelize(_Prep(), mesh, {"inner": ColwiseParallel()})
    PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)).apply(m, mesh, "prep")
    try:
        m(distribute(torch.randn(2, 4, 8), mesh, [Shard(0)]), 1.0)
        out["contradicting layouts"] = "no error"
    except ParallelizeError as e:
        out["contradicting layouts"] = str(e)
    try:
        m(torch.randn(2, 4, 8))
        out["too few inputs"] = "no error"
    except ParallelizeError as e:
        out["too few inputs"] = str(e)
    try:
        with loss_parallel():
            F.cross_entropy(distribute(torch.randn(4, 6), mesh, [Shard(0)]), torch.zeros(4, dtype=torch.long))
        out["loss placements"] = "no error"
    except PlacementError as e:
        out["loss placements"] = str(e)
    return out


# ---- the flagship ---------------------------------------------------------------------------
def flagship(backend: str, seqlens: list, steps: int = 5, layers: int = 2) -> dict:
    """examples/tp_llama.py small: per-step losses vs the dense model over AdamW steps,
    per-block compile counts over the sequence lengths, and block 0's forward graph."""
    ex = example()
    mesh = _mesh()
    args = ex.ModelArgs(n_layers=layers)
    dense = ex.build(args)
    tp = ex.apply_tp(copy.deepcopy(dense), mesh)
    rec = _Record() if backend == "record" else None
    counters = []
    # apply_compile, with one counting backend per block.
    for layer_id, block in tp.layers.named_children():
        cnt = CompileCounterWithBackend(rec.backend if rec and layer_id == "0" else ("aot_eager" if rec else backend))
        counters.append(cnt)
        tp.layers.register_module(layer_id, torch.compile(block, backend=cnt, fullgraph=True))
    tp.mark_dynamic = len(set(seqlens)) > 1
    ref, _ = ex.train(dense, ex.batches(args, steps, 2, seqlens), parallel_loss=False)
    got, _ = ex.train(tp, ex.batches(args, steps, 2, seqlens), parallel_loss=True)
    diffs = [abs(a - b) for a, b in zip(got, ref)]
    assert max(diffs) <= 1e-5, (got, ref)
    out = {"steps": len(got), "frames": [c.frame_count for c in counters]}
    if rec is not None:
        fw = rec.graphs["fw"][0]
        calls = [n for n in fw.graph.nodes if n.op == "call_function"]
        out["first fw op"] = str(calls[0].target)
        out["fw waits"] = rec.count("fw", "wait_tensor")
    return out


def second_module_dynamic() -> list:
    """The same compiled function over a second parallelized module, then over other
    sequence lengths (an even one and one that shards unevenly): dynamo's automatic dynamic
    shapes recompile it with a symbolic sequence dim, whose backward gathers the gradient of
    a Shard(1) output. Values and gradients vs dense; the frame count of each run."""
    mesh = _mesh()
    k, r = dist.get_world_size(), dist.get_rank()
    torch._dynamo.reset()
    frames = []
    for seq in (4 * k, 4 * k, 6 * k, 6 * k + 1):
        g = torch.Generator().manual_seed(seq)
        x = torch.randn(2, seq, 8, generator=g)
        torch.manual_seed(0)
        if len(frames) == 0:
            # First module: a Colwise layer taking a sequence-sharded input.
            dense = nn.Linear(8, 6)
            plan = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=False)
            inputs, dense_inputs = (lambda: (x.chunk(k, 1)[r],)), (lambda: (x,))
        else:
            # Then an MLP whose Rowwise output is sequence-sharded (backward: a gather).
            dense = nn.Sequential(nn.Linear(8, 4 * k), nn.ReLU(), nn.Linear(4 * k, 8))
            plan = {"0": ColwiseParallel(), "2": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)}
            inputs, dense_inputs = (lambda: (x,)), None
        tp = parallelize(copy.deepcopy(dense), mesh, plan)
        frames.append(_compare(dense, tp, inputs, lambda y: y.square().sum(), compiled=True,
                               what=f"seq {seq}", dense_inputs=dense_inputs))
    return frames


def flagship_graphs(layers: int = 3, steps: int = 2) -> dict:
    """The flagship compiled as apply_compile does (one backend for every block, so the
    blocks share dynamo's cache), by the kit as is, the kit with the embedding's output
    waited, and torch's DTensor with it waited (the tp bench's variants): per variant the
    number of graphs compiled over ``steps`` steps and, per forward and backward graph, the
    functional collectives in it (``{op name: count}``)."""
    from collections import Counter

    from subclass_kit.bench import _tp_bench as tp_bench

    ex = example()
    mesh = _mesh()
    args = ex.ModelArgs(n_layers=layers)
    dense = ex.build(args)
    ref, _ = ex.train(dense, ex.batches(args, steps, 2, [16]), parallel_loss=False)
    out = {}
    for impl in ("kit", "kit_waited", "dtensor_waited"):
        torch._dynamo.reset()
        model = copy.deepcopy(ex.build(args))
        model = ex.apply_tp(model, mesh) if impl.startswith("kit") else tp_bench._dtensor_tp(ex, model, mesh)
        if impl == "kit_waited":
            model.tok_embeddings.register_forward_hook(tp_bench._wait_kit_output)
        elif impl == "dtensor_waited":
            model.tok_embeddings.register_forward_hook(tp_bench._wait_output)
        rec = _Record()
        cnt = CompileCounterWithBackend(rec.backend)
        ex.apply_compile(model, cnt)
        got, _ = tp_bench._train(ex, model, impl, steps, 16)
        assert max(abs(a - b) for a, b in zip(got, ref)) <= 1e-5, (impl, got, ref)

        def collectives(gm):
            return dict(Counter(str(n.target).split(".")[1] for n in gm.graph.nodes
                                if n.op == "call_function" and str(n.target).startswith("_c10d_functional.")))

        out[impl] = {"frames": cnt.frame_count, "fw": [collectives(g) for g in rec.graphs["fw"]],
                     "bw": [collectives(g) for g in rec.graphs["bw"]]}
    return out


def layernorm_sp_graphs(steps: int = 2) -> dict:
    """The tp bench's LayerNorm sequence-parallel Transformer (``layernorm_sp_rows``), each
    block compiled (aot_eager, fullgraph), by the kit and by DTensor under the same plan:
    per impl the graphs compiled over ``steps`` steps, the losses, and per forward and
    backward graph the functional collectives and the aten ops in it (``{name: count}``)."""
    from collections import Counter

    from subclass_kit.bench import _tp_bench as tp_bench

    mesh = _mesh()
    out = {}
    for impl in ("kit", "dtensor"):
        torch._dynamo.reset()
        model = tp_bench._ln_plan(tp_bench._ln_transformer(), mesh, impl)
        rec = _Record()
        cnt = CompileCounterWithBackend(rec.backend)
        for block in model.layers:
            block.compile(backend=cnt, fullgraph=True)
        losses, _ = tp_bench._ln_train(model, impl, steps, 16)

        def ops(gm, prefix):
            return dict(Counter(str(n.target).split(".")[1] for n in gm.graph.nodes
                                if n.op == "call_function" and str(n.target).startswith(prefix)))

        out[impl] = {"frames": cnt.frame_count, "losses": losses,
                     **{f"{k} collectives": [ops(g, "_c10d_functional.") for g in rec.graphs[k]] for k in ("fw", "bw")},
                     **{f"{k} aten": [ops(g, "aten.") for g in rec.graphs[k]] for k in ("fw", "bw")}}
    return out


# ---- the Transformer TP and SP training scenarios --------------------------------------------
def _scenario_model(seq_parallel: bool, dropout: float):
    from sharded._tp_upstream_tasks import ModelArgs, Transformer

    torch.manual_seed(0)
    model = Transformer(ModelArgs(dropout_p=dropout))
    for layer in model.layers:
        # Residual and embedding dropout stay on; attention-weight dropout is off (it would
        # take the math attention path, which views the head-sharded operands).
        layer.attention.dropout_p = 0.0
    return model


def _scenario_plan(model, mesh, seq_parallel: bool):
    """torch's Transformer.parallelize, with the residual stream kept as ShardedTensors
    (``use_local_output=False``) so that dropout draws the dense model's mask, and the logits
    left vocab-sharded for loss_parallel."""
    keep = dict(use_local_output=False)
    if seq_parallel:
        parallelize(model, mesh, {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), **keep),
            "pos_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0), **keep),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), **keep),
            "layers.*.attention_norm": SequenceParallel(),
            "layers.*.ffn_norm": SequenceParallel(),
            "layers.*.attention": PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate()),
            "layers.*.attention.w[qkv]": ColwiseParallel(**keep),
            "layers.*.attention.wo": RowwiseParallel(output_layouts=Shard(1), **keep),
            "layers.*.feed_forward.w1": ColwiseParallel(input_layouts=Shard(1)),
            "layers.*.feed_forward.w2": RowwiseParallel(output_layouts=Shard(1), **keep),
        })
    else:
        parallelize(model, mesh, {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "pos_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Shard(-1), **keep),
            "layers.*.attention.w[qkv]": ColwiseParallel(**keep),
            "layers.*.attention.wo": RowwiseParallel(),
            "layers.*.feed_forward.w1": ColwiseParallel(),
            "layers.*.feed_forward.w2": RowwiseParallel(),
        })
    model.output.weight = model.tok_embeddings.weight  # tied, both Shard(0)
    return model


def transformer_scenario(seq_parallel: bool, backend: str, steps: int = 3, dropout: float = 0.1,
                         mesh_shape: tuple | None = None) -> dict:
    """The toy Transformer of torch's TP tests (LayerNorm, causal attention, GELU MLP,
    embedding and residual dropout, tied output) trained with tensor parallelism (and
    sequence parallelism) against the dense model: per step the weighted cross-entropy
    (loss_parallel on the vocab-sharded logits), every parameter's gradient and, after an
    Adam step, every parameter. ``backend``: "eager", or each TransformerBlock compiled
    (fullgraph) with that backend. ``mesh_shape``: a 2-D (dp, tp) mesh: the model is
    parallelized over "tp", the batch split over "dp", the loss computed by loss_parallel
    on the 2-D mesh (reduction="sum": Partial over dp) and the gradients summed over dp.
    Returns the compiled frame count and the largest loss difference."""
    from torch.distributed.device_mesh import init_device_mesh

    from sharded._tp_upstream_tasks import _check_module

    if mesh_shape is None:
        mesh2d, mesh = None, _mesh()
    else:
        mesh2d = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp", "tp"))
        mesh = mesh2d["tp"]
    dense = _scenario_model(seq_parallel, dropout)
    tp = _scenario_plan(copy.deepcopy(dense), mesh, seq_parallel)
    cnt = CompileCounterWithBackend(backend if backend != "eager" else "eager")
    if backend != "eager":
        for block in tp.layers:
            block.compile(backend=cnt, fullgraph=True)  # in place: parameter names unchanged
    opt, opt_tp = torch.optim.Adam(dense.parameters(), lr=0.01), torch.optim.Adam(tp.parameters(), lr=0.01)
    vocab = dense.model_args.vocab_size
    weight = torch.rand(vocab, generator=torch.Generator().manual_seed(1)) + 0.5
    diffs = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 + step)
        tokens, labels = torch.randint(vocab, (4, 8), generator=g), torch.randint(vocab, (4, 8), generator=g)
        labels[0, 0] = -100  # an ignored token
        if mesh2d is None:
            torch.manual_seed(step)
            ref = F.cross_entropy(dense(tokens).flatten(0, 1), labels.flatten(), weight)
            torch.manual_seed(step)
            logits = tp(tokens)
            assert isinstance(logits, ShardedTensor) and logits.placements == (Shard(2),), logits
            with loss_parallel():
                loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), weight)
                loss.backward()
            got = loss
        else:
            # The global loss: the weighted sum over every token, over the sum of the weights.
            total = (weight[labels.clamp(min=0)] * (labels != -100)).sum()
            ref = F.cross_entropy(dense(tokens).flatten(0, 1), labels.flatten(), weight, reduction="sum") / total
            dp = mesh2d["dp"]
            n_dp, r_dp = dp.size(), dp.get_local_rank()
            local_tokens, local_labels = tokens.chunk(n_dp)[r_dp], labels.chunk(n_dp)[r_dp]
            logits = tp(local_tokens)
            lifted = ShardedTensor.from_local(logits.to_local(), mesh2d, [Shard(0), Shard(2)],
                                              shape=(tokens.shape[0], *logits.shape[1:]), stride=_strides((tokens.shape[0], *logits.shape[1:])))
            target = ShardedTensor.from_local(local_labels.flatten(), mesh2d, [Shard(0), Replicate()],
                                              shape=(labels.numel(),), stride=_strides((labels.numel(),)))
            with loss_parallel():
                summed = F.cross_entropy(lifted.flatten(0, 1), target, weight, reduction="sum")
                assert summed.placements == (Partial("sum"), Replicate()), summed.placements
                (summed / total).backward()
            got = summed.full_tensor() / total
            # Data parallelism over "dp": each rank's gradients are of its part of the batch.
            for p in tp.parameters():
                if p.grad is not None:  # (norms outside sequence parallelism stay plain)
                    g = p.grad.to_local() if isinstance(p.grad, ShardedTensor) else p.grad
                    dist.all_reduce(g, group=dp.get_group())
        ref.backward()
        close(got, ref, atol=1e-5, rtol=1e-5, msg=f"loss at step {step}")
        diffs.append(abs(got.item() - ref.item()))
        _check_module(dense, tp, grad=True)
        opt.step()
        opt_tp.step()
        _check_module(dense, tp)
        opt.zero_grad()
        opt_tp.zero_grad()
    return {"frames": cnt.frame_count, "max diff": max(diffs)}


def transformer_scenarios(cases: list) -> list:
    """:func:`transformer_scenario` for each ``(seq_parallel, backend, steps, dropout,
    mesh_shape)`` in ``cases``, in one spawned world."""
    out = []
    for case in cases:
        torch._dynamo.reset()
        out.append(transformer_scenario(*case))
    return out
