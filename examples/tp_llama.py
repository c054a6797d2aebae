"""Tensor-parallel llama training with subclass_kit's ShardedTensor, as torchtitan does it.

Run on 2 CPU ranks (gloo):

    torchrun --standalone --nproc-per-node 2 examples/tp_llama.py --backend aot_eager --steps 5

The model is a small copy of torchtitan's llama3 ``Transformer`` (token embedding,
TransformerBlocks of RMSNorm + attention with rotary embeddings + RMSNorm + SwiGLU
feed-forward, final RMSNorm, output projection), module names and forward code as in
torchtitan so its tensor-parallel plan applies unchanged. (torchtitan 0.3.0 itself is not
used: importing its llama3 model pulls in its MoE kernels, which need triton -- a GPU
compiler -- so it does not import on a CPU-only machine.)

It is parallelized exactly as torchtitan's ``parallelize_llama``/``apply_tp`` does:
vocab-parallel embedding reduce-scattered onto the sequence dim, sequence-parallel norms,
Colwise ``wq/wk/wv/w1/w3``, Rowwise ``wo/w2`` reduce-scattering back to the sequence,
Colwise output kept sharded on the vocabulary, and ``loss_parallel`` cross entropy; then
each TransformerBlock is compiled on its own (``apply_compile``). Every step prints the
loss next to the dense single-process model's loss on the same batch.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from subclass_kit.sharded import (
    ColwiseParallel,
    PrepareModuleInput,
    Replicate,
    RowwiseParallel,
    SequenceParallel,
    Shard,
    loss_parallel,
    parallelize,
)


# ---- the model (torchtitan llama3's structure and names) --------------------------------
@dataclass
class ModelArgs:
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = 2
    vocab_size: int = 128
    multiple_of: int = 32
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 64


def precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64


def reshape_for_broadcast(freqs_cis: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    ndim = x.ndim
    seqlen = x.shape[1]
    freqs_cis = freqs_cis[0:seqlen]
    shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
    return freqs_cis.view(*shape)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (
        torch.unsqueeze(x, dim=3)
        .expand(bs, slen, n_kv_heads, n_rep, head_dim)
        .reshape(bs, slen, n_kv_heads * n_rep, head_dim)
    )


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_heads if args.n_kv_heads is None else args.n_kv_heads
        self.n_rep = self.n_heads // self.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor):
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        # -1, not n_heads: under tensor parallelism each rank holds n_heads / tp of them.
        xq = xq.view(bs, seqlen, -1, self.head_dim)
        xk = xk.view(bs, seqlen, -1, self.head_dim)
        xv = xv.view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis=freqs_cis)
        keys = repeat_kv(xk, self.n_rep)
        values = repeat_kv(xv, self.n_rep)
        xq, xk, xv = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        output = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)
        output = output.transpose(1, 2).contiguous().view(bs, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, multiple_of: int, ffn_dim_multiplier: float | None):
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        if ffn_dim_multiplier is not None:
            hidden_dim = int(ffn_dim_multiplier * hidden_dim)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, 4 * args.dim, args.multiple_of, args.ffn_dim_multiplier)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.weight_init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.register_buffer(
            "freqs_cis", precompute_freqs_cis(args.dim // args.n_heads, args.max_seq_len * 2, args.rope_theta),
            persistent=False,
        )
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, args) for i in range(args.n_layers)})
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.mark_dynamic = False

    def forward(self, tokens: torch.Tensor):
        h = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis
        if self.mark_dynamic:
            # One compile per block over varying sequence lengths: the sequence dim of the
            # block input and of the rotary table (sliced to the length inside) are dynamic.
            import symbolic

            symbolic.mark_dynamic(h, [1])
        for layer in self.layers.values():
            h = layer(h, freqs_cis)
        h = self.norm(h)
        return self.output(h)


# ---- parallelism, as torchtitan's parallelize_llama / apply_tp / apply_compile ----------
def apply_tp(model: Transformer, tp_mesh, *, enable_loss_parallel: bool = True) -> Transformer:
    """torchtitan's tensor-parallel plan for llama, on subclass_kit.sharded."""
    parallelize(model, tp_mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if enable_loss_parallel else Replicate(),
            use_local_output=not enable_loss_parallel,
        ),
    })
    for block in model.layers.values():
        parallelize(block, tp_mesh, {
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


def apply_compile(model: Transformer, backend) -> Transformer:
    """Compile each TransformerBlock on its own, as torchtitan's apply_compile does."""
    for layer_id, block in model.layers.named_children():
        model.layers.register_module(layer_id, torch.compile(block, backend=backend, fullgraph=True))
    return model


def cross_entropy_loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """torchtitan's loss: mean cross entropy over all tokens."""
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))


def build(args: ModelArgs, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(args)
    # torchtitan initializes with small normals; any deterministic init serves here.
    for name, p in model.named_parameters():
        if p.dim() > 1:
            nn.init.normal_(p, std=0.02)
    return model


def batches(args: ModelArgs, steps: int, batch: int, seqlens, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    for i in range(steps):
        s = seqlens[i % len(seqlens)]
        tokens = torch.randint(0, args.vocab_size, (batch, s + 1), generator=g)
        yield tokens[:, :-1], tokens[:, 1:]


def train(model, batches_, *, lr: float = 1e-3, parallel_loss: bool) -> tuple[list, list]:
    """AdamW steps; the losses and the wall time of each step."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses, times = [], []
    for inputs, labels in batches_:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if parallel_loss:
            with loss_parallel():
                loss = cross_entropy_loss(model(inputs), labels)
                loss.backward()
        else:
            loss = cross_entropy_loss(model(inputs), labels)
            loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return losses, times


def main(argv=None) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="aot_eager", help="torch.compile backend per block ('none': eager)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seqlen", type=int, nargs="+", default=[16], help="sequence lengths, cycled per step")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args(argv)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    args = ModelArgs(dim=a.dim, n_layers=a.layers)
    dense = build(args)
    tp = apply_tp(copy.deepcopy(dense), mesh["tp"])
    if a.backend != "none":
        apply_compile(tp, a.backend)
    tp.mark_dynamic = len(set(a.seqlen)) > 1
    ref, _ = train(dense, batches(args, a.steps, a.batch, a.seqlen), parallel_loss=False)
    got, times = train(tp, batches(args, a.steps, a.batch, a.seqlen), parallel_loss=True)
    worst = 0.0
    for i, (x, y) in enumerate(zip(got, ref)):
        worst = max(worst, abs(x - y))
        if rank == 0:
            print(f"step {i}: loss {x:.6f}  dense {y:.6f}  |diff| {abs(x - y):.1e}  time {times[i] * 1e3:.0f} ms")
    if rank == 0:
        print(f"tp={world} backend={a.backend}: max |loss - dense| = {worst:.1e} over {a.steps} AdamW steps")
    dist.destroy_process_group()
    if not math.isfinite(worst) or worst > 1e-5:
        raise SystemExit(f"rank {rank}: the tensor-parallel losses differ from dense by {worst:.1e}")


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
