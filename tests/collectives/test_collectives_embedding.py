"""The real-world failure the in-graph wait prevents: an eager embedding feeding a compiled block.

torchtitan compiled each transformer block separately while the embedding ran in eager; the
embedding's output was a pending collective result, fed straight into the first compiled
block. When the graph did not wait on that input before reading it, the block read the
collective's output buffer while it was still being filled and the loss went NaN
(pytorch#125677).

Here the embedding is sequence-parallel: each rank embeds its half of the tokens and an
all-gather assembles the sequence, so until the collective completes half of the output
buffer is uninitialized memory. Rank 1 enters each all-gather late, so rank 0's compiled
block is guaranteed to run while its input is pending:

- reading the raw buffer (what a graph without the wait amounts to) gives a wrong loss;
- the kit's AsyncCollectiveTensor input gives, step after step, exactly eager's losses.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.testing import CompileCounterWithBackend

import subclass_kit.collectives as kit

from kit_helpers.harness import world

pytestmark = pytest.mark.dist

VOCAB, DIM, SEQ, STEPS, LATE = 32, 16, 8, 4, 0.5


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.up = torch.nn.Linear(DIM, 2 * DIM)
        self.down = torch.nn.Linear(2 * DIM, 1)

    def forward(self, h, target):
        y = self.down(torch.relu(self.up(self.norm(h)))).squeeze(-1)
        return torch.nn.functional.mse_loss(y, target)


def _model():
    torch.manual_seed(0)
    return torch.nn.Embedding(VOCAB, DIM), Block()


def _batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, VOCAB, (SEQ,), generator=g), torch.randn(SEQ, generator=g)


def _embed(emb, ids):
    """This rank's half of the sequence, embedded and all-gathered (pending in eager)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    local = emb(ids.chunk(n)[rank])
    # Leave NaNs where the allocator will put the gather's output buffer, as stale memory.
    torch.full((SEQ, DIM), float("nan")).add_(0)
    if rank == 1:
        time.sleep(LATE)  # enter the collective late: rank 0's result stays pending
    return kit.all_gather_tensor_autograd(local, 0)


def _train(block_fn, emb, block):
    opt = torch.optim.SGD(list(emb.parameters()) + list(block.parameters()), lr=0.1)
    losses = []
    for step in range(STEPS):
        ids, target = _batch(step)
        h = _embed(emb, ids)
        assert type(h) is kit.AsyncCollectiveTensor
        loss = block_fn(h, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _check_embedding_feeds_compiled_block(backend: str):
    rank = dist.get_rank()

    # 1. The hazard: the compiled block fed the raw, still-filling buffer.
    emb, block = _model()
    compiled = torch.compile(block, backend=backend, fullgraph=True)
    ids, target = _batch(0)
    compiled(torch.zeros(SEQ, DIM), target)  # compile now, so the next call runs at once
    # Start together: a rank that arrived early would sleep its LATE off before rank 0 even
    # issued the gather, and the gather could then finish before rank 0 reads the buffer.
    dist.barrier()
    h = _embed(emb, ids)
    raw_loss = compiled(h.elem.detach(), target).item()  # no wait: reads the buffer early
    waited = h.trigger_wait()
    right_loss = block(waited, target).item()

    # 2. Eager reference, then the same training with the block compiled.
    torch._dynamo.reset()
    emb, block = _model()
    eager = _train(block, emb, block)
    emb, block = _model()
    counter = CompileCounterWithBackend(backend)
    compiled = _train(torch.compile(block, backend=counter, fullgraph=True), emb, block)
    return dict(rank=rank, raw=raw_loss, right=right_loss, eager=eager, compiled=compiled,
                frames=counter.frame_count)


def _assert_results(results):
    r0 = results[0]
    # Rank 0 ran its block while rank 1 had not joined yet: the raw read is wrong (NaN or
    # rank 0's half only); the eager step-0 loss is what it should have been.
    assert not (r0["raw"] == pytest.approx(r0["right"], rel=1e-4)), r0
    for r in results:
        assert all(l == l and abs(l) != float("inf") for l in r["compiled"]), r  # no NaN/inf
        assert r["compiled"] == pytest.approx(r["eager"], rel=1e-5, abs=1e-6), r
        assert r["compiled"][0] == pytest.approx(r["right"], rel=1e-5)
        assert r["frames"] == 1
        assert r["eager"][-1] < r["eager"][0]  # it trains
    assert results[0]["eager"] == pytest.approx(results[1]["eager"])


def test_eager_embedding_into_compiled_block_aot_eager():
    _assert_results(world(2).run(_check_embedding_feeds_compiled_block, "aot_eager"))


@pytest.mark.slow
def test_eager_embedding_into_compiled_block_inductor():
    _assert_results(world(2).run(_check_embedding_feeds_compiled_block, "inductor", timeout=600))
