"""The kit's ``JaggedTensor`` beside torch's nested tensor (NJT, ``layout=torch.jagged``) and
a padded dense tensor with a mask, on one model: Linear -> GELU -> Linear -> mean over each
sequence. Eager and inductor, forward (ratios to NJT) and forward + backward (ratios to
dense: NJT's ``mean(dim=1)`` has no backward in torch 2.13, so NJT has no backward row).

The batch: B sequences of 5-200 tokens each; dense pads them to the longest and masks the
mean. Each implementation is checked against dense before it is timed.

Compiled, every implementation is marked dynamic as a batch sweep needs (the kit's with
``symbolic.mark_dynamic``, NJT's batch dim and offsets with torch's ``mark_dynamic``, the
padded batch's B and max_len) and must serve a second batch of other sizes without
recompiling before it is timed: each is timed on the graph a sweep runs. The kit has two
compiled rows: ``torch.compile`` and its own boundary, ``subclass_kit.compile``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["run"]

BOUNDARY = "kit JaggedTensor subclass_kit.compile"
_KINDS = {"torch NJT": "torch", "kit JaggedTensor": "kit", BOUNDARY: "kit", "padded dense": "plain"}
NJT_BACKWARD = "NJT: no backward (torch 2.13 has no derivative for mean(dim=1) on a jagged NestedTensor)"


class _Model(torch.nn.Module):
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.up = torch.nn.Linear(d, hidden)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(hidden, d)

    def forward(self, x):
        return self.down(self.act(self.up(x))).mean(dim=1)


class _Dense(torch.nn.Module):
    """The same model on the padded batch: the mean counts the meaningful rows only."""

    def __init__(self, model: _Model):
        super().__init__()
        self.model = model

    def forward(self, padded, mask):
        h = self.model.down(self.model.act(self.model.up(padded)))
        return (h * mask).sum(1) / mask.sum(1)


def _batch(b: int, d: int, seed: int):
    from ..examples import JaggedTensor

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 201, (b,), generator=g).tolist()
    parts = [torch.randn(n, d, generator=g) for n in lengths]
    kit = JaggedTensor.from_list(parts)
    njt = torch.nested.nested_tensor(parts, layout=torch.jagged)
    padded = torch.nn.utils.rnn.pad_sequence(parts, batch_first=True)
    mask = kit.__plain_mask__().to(padded.dtype)
    return kit, njt, padded, mask


def _mark(kit, njt, padded, mask) -> None:
    """Each batch marked as a sweep of batches needs it (docs/ragged.md, "Marking")."""
    import symbolic

    from .. import _compat

    symbolic.mark_dynamic(kit, [0, 1])
    _compat.mark_dynamic(njt, 0)
    _compat.mark_dynamic(njt._offsets, 0)  # NJT's batch dim follows its offsets
    _compat.mark_dynamic(padded, [0, 1])
    _compat.mark_dynamic(mask, [0, 1])


def _calls(model, dense, batches, *, compiled: bool):
    import subclass_kit

    from .. import _compat

    counters: list = []

    def comp(fn, compiler=torch.compile):
        if not compiled:
            return fn
        counters.append(_compat.compile_counter("inductor"))
        return compiler(fn, backend=counters[-1], fullgraph=True)

    fk, fn, fd = comp(model), comp(model), comp(dense)
    fb = comp(model, subclass_kit.compile) if compiled else None
    for kit, njt, padded, mask in batches if compiled else batches[:1]:
        if compiled:
            _mark(kit, njt, padded, mask)
        want = dense(padded, mask)
        with torch.no_grad():
            for got in (fk(kit), fn(njt), fd(padded, mask), *([fb(kit)] if fb is not None else ())):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    if any(c.frame_count != 1 for c in counters) or (fb is not None and fb.fallback_calls):
        raise RuntimeError(f"jagged bench: a compiled implementation recompiled or fell back over the sweep "
                           f"(compiles {[c.frame_count for c in counters]}); it would not be timed on one graph")
    kit, njt, padded, mask = batches[0]
    forward = {
        "torch NJT": lambda: fn(njt),
        "kit JaggedTensor": lambda: fk(kit),
        "padded dense": lambda: fd(padded, mask),
    }
    if fb is not None:
        forward[BOUNDARY] = lambda: fb(kit)
    params = list(model.parameters())

    def step(out):
        return torch.autograd.grad(out.sum(), params)

    backward = {"kit JaggedTensor": lambda: step(fk(kit)), "padded dense": lambda: step(fd(padded, mask))}
    if fb is not None:  # the weights require grad, the input does not: the boundary serves it
        backward[BOUNDARY] = lambda: step(fb(kit))
    for f in backward.values():
        f()  # compile the backward too before timing
    return forward, backward


def run(quick: bool = False) -> list[dict]:
    """Rows (see ``subclass_kit.bench``): forward ratios to NJT, forward + backward to dense.

    Timed with one intra-op thread: at these sizes the model is bound by per-op overhead,
    and on a shared machine a second thread only adds waits to whichever impl it hits.

    Example:
        >>> rows = run(quick=True)  # doctest: +SKIP
    """
    from . import interleaved, ratio_rows

    b, d, hidden = 8, 32, 64
    rounds, min_run_time = (3, 0.02) if quick else (9, 0.1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = _Model(d, hidden)
        dense = _Dense(model)
        case = f"B={b} D={d} H={hidden}, 5-200 tokens/seq"
        rows = []
        for compiled in ((False,) if quick else (False, True)):
            mode = "inductor" if compiled else "eager"
            # Timed on the first batch; compiled, the second (B - 1 sequences, other lengths)
            # checks that one graph serves both.
            batches = [_batch(b, d, seed=0), _batch(b - 1, d, seed=1)]
            forward, backward = _calls(model, dense, batches, compiled=compiled)
            with torch.no_grad():
                res, ratios = interleaved(forward, rounds=rounds, reference="torch NJT", min_run_time=min_run_time)
            rows += _with(ratio_rows(f"jagged {mode} forward", case, res, reference="torch NJT", kinds=_KINDS), ratios)
            res, ratios = interleaved(backward, rounds=rounds, reference="padded dense", min_run_time=min_run_time)
            rows += _with(ratio_rows(f"jagged {mode} forward+backward", case, res, reference="padded dense",
                                     kinds=_KINDS, note=NJT_BACKWARD), ratios)
        return rows
    finally:
        torch.set_num_threads(threads)


def _with(rows: list, ratios: dict) -> list:
    # The median of the per-round ratios (interleaved's): robust to the slow phases of a
    # shared machine, where the ratio of two merged medians is not.
    for r in rows:
        r["ratio"] = round(ratios[r["impl"]], 3)
    return rows
