"""Per-call cost of ``subclass_kit.compile`` beside ``torch.compile`` (inductor).

``compiled_call boundary``: ``x * y + x`` on 16x16 float32 TwoTensors, ratios to the
*flattened floor* (the same graph over the inner tensors passed as plain inputs): plain,
floor, the kit's TwoTensor through ``torch.compile`` and through the boundary.

``quantized model``: 29 ``nn.Linear`` layers whose weights are the kit's int8
``ScaledTensor`` (per-row scale), batch 1, ratios to the same model with plain weights:
the boundary, ``torch.compile`` on the same model, torchao's int8 weights (``Int8Tensor``,
per row) under ``torch.compile`` when torchao is installed, and the boundary's own body
called through ``torch.compile`` on its flat inputs (the weights' graph with dynamo's entry
and guards, none of the kit's per-call work; the boundary itself runs dynamo's artifact
without that entry, see ``_boundary_direct``). A row's
``overhead_us`` is its median minus the plain-weight model's. No ``dynamic=`` anywhere: in
torch 2.13 it re-applies a config patch on every call. Everything runs on one thread.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

__all__ = ["run", "quantized_model"]

_KINDS = {
    "plain": "plain", "floor": "floor", "kit torch.compile": "torch", "kit boundary": "kit",
    "plain weights": "plain", "kit weights body": "floor", "kit weights torch.compile": "torch",
    "kit weights boundary": "kit", "torchao int8 torch.compile": "native",
}
LAYERS, WIDTH = 29, 64


def quantized_model(layers: int = LAYERS, width: int = WIDTH, seed: int = 0) -> tuple:
    """(plain model, the same with the kit's int8 ``ScaledTensor`` weights), in eval mode.

    Example:
        >>> plain, kit = quantized_model(layers=2, width=8)
        >>> type(kit[0].weight).__name__, kit[0].weight.requires_grad
        ('ScaledTensor', False)
    """
    from ..examples import ScaledTensor

    torch.manual_seed(seed)
    plain = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).eval()
    kit = copy.deepcopy(plain)
    lin: Any
    for lin in kit:
        lin.weight = torch.nn.Parameter(ScaledTensor.from_float(lin.weight.detach()), requires_grad=False)
    return plain, kit


def _torchao_model(plain):
    try:
        from torchao.quantization import Int8Tensor  # type: ignore[import-untyped]
        from torchao.quantization.granularity import PerRow  # type: ignore[import-untyped]
    except Exception:  # torchao missing or incompatible: the row is left out
        return None
    m = copy.deepcopy(plain)
    lin: Any
    for lin in m:
        lin.weight = torch.nn.Parameter(Int8Tensor.from_hp(lin.weight.detach(), PerRow()), requires_grad=False)
    return m


def _compiled_call(rounds: int, number: int) -> list[dict]:
    import subclass_kit

    from ..examples import TwoTensor
    from . import interleaved, ratio_rows

    def f(x, y):
        return x * y + x

    def flat(a0, a1, b0, b1):
        return a0 * b0 + a0, a1 * b1 + a1

    g = torch.Generator().manual_seed(0)
    x = TwoTensor(torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g))
    y = TwoTensor(torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g))
    cp = torch.compile(f, backend="inductor", fullgraph=True)
    cf = torch.compile(flat, backend="inductor", fullgraph=True)
    ct = torch.compile(f, backend="inductor", fullgraph=True)
    cb = subclass_kit.compile(f, backend="inductor", fullgraph=True)
    xa, xb, ya, yb = x.a, x.b, y.a, y.b
    calls = {
        "plain": lambda: cp(xa, ya),
        "floor": lambda: cf(xa, xb, ya, yb),
        "kit torch.compile": lambda: ct(x, y),
        "kit boundary": lambda: cb(x, y),
    }
    with torch.no_grad():
        for fn in calls.values():
            fn()
        res, ratio = interleaved(calls, rounds=rounds, reference="floor", number=number)
    return _with_ratios(ratio_rows("compiled_call boundary", "x*y+x 16x16", res, reference="floor", kinds=_KINDS),
                        ratio)


def _with_ratios(rows: list[dict], ratio: dict) -> list[dict]:
    # The median of per-round ratios (times taken back to back), robust to a shared
    # machine's slow phases, in place of the ratio of the merged medians.
    for r in rows:
        r["ratio"] = round(ratio[r["impl"]], 3)
    return rows


def _quantized(rounds: int, number: int) -> list[dict]:
    import subclass_kit

    from . import interleaved, ratio_rows

    plain, kit = quantized_model()
    x = torch.randn(1, WIDTH)
    cp = torch.compile(plain, backend="inductor", fullgraph=True)
    ct = torch.compile(kit, backend="inductor", fullgraph=True)
    cb = subclass_kit.compile(kit, backend="inductor", fullgraph=True)
    calls = {"plain weights": lambda: cp(x), "kit weights torch.compile": lambda: ct(x),
             "kit weights boundary": lambda: cb(x)}
    ao = _torchao_model(plain)
    if ao is not None:
        ca = torch.compile(ao, backend="inductor", fullgraph=True)
        calls["torchao int8 torch.compile"] = lambda: ca(x)
    with torch.no_grad():
        for fn in calls.values():
            fn()
        body, inputs = cb._body_for(x)
        calls["kit weights body"] = lambda: body(*inputs)
        res, ratio = interleaved(calls, rounds=rounds, reference="plain weights", number=number)
    rows = _with_ratios(ratio_rows("quantized model boundary", f"{LAYERS} Linear int8 weights", res,
                                   reference="plain weights", kinds=_KINDS), ratio)
    base = res["plain weights"].median
    for r in rows:
        # Over the plain-weight model, in its time per call: ratio - 1, in microseconds.
        r["overhead_us"] = round((ratio[r["impl"]] - 1) * base * 1e6, 3)
    return rows


def run(quick: bool = False) -> list[dict]:
    """Rows (see ``subclass_kit.bench``): the compiled call (ratios to the flattened floor)
    and the quantized model (ratios to plain weights, with ``overhead_us``).

    Example:
        >>> rows = run(quick=True)  # doctest: +SKIP
    """
    # Many short rounds of a fixed call count: on a loaded machine the median of per-round
    # ratios settles where a few long rounds do not. One thread, compiles included (inductor
    # emits OpenMP loops for more): on a shared 2-core machine the fork and join of every
    # small kernel on busy cores swamped the rows (3x-16x of plain weights, run to run).
    rounds, number = (3, 50) if quick else (41, 200)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _compiled_call(rounds, number) + _quantized(rounds, max(number // 4, 10))
    finally:
        torch.set_num_threads(threads)
