"""The models of the deploy matrix: one quantized-inference shape per exemplar.

``Linear(in, out)`` whose weight is the exemplar, ``F.linear`` in forward, the batch dim
dynamic; the forward returns ``to_plain()`` of a wrapped result (TwoTensor's linear gives a
TwoTensor), the documented way to a package-returnable output.
"""

from __future__ import annotations

import torch

from subclass_kit import WrapperTensor
from subclass_kit._compat import unwrap_tensor_subclass_parameters
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor

IN, OUT = 48, 40
BATCH = torch.export.Dim("batch", min=2, max=256)

MAKERS = {
    "TwoTensor": lambda w: TwoTensor(w.clone(), w * 2),
    "ScaledTensor": lambda w: ScaledTensor.from_float(w),
    "BlockScaled": lambda w: BlockScaled.from_float(w, block=32),  # 40 rows: a ragged last block
}


class QuantLinear(torch.nn.Module):
    def __init__(self, make, *, plain_output: bool = True):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.lin = torch.nn.Linear(IN, OUT)
        self.lin.weight = torch.nn.Parameter(make(torch.randn(OUT, IN, generator=g)), requires_grad=False)
        self.plain_output = plain_output

    def forward(self, x):
        y = self.lin(x)
        if self.plain_output and isinstance(y, WrapperTensor):
            return y.to_plain()
        return torch.relu(y)


def build(name: str, form: str, *, plain_output: bool = True) -> torch.nn.Module:
    """``form``: ``"as_is"`` (the wrapped parameter stays) or ``"parametrized"``
    (torch's ``unwrap_tensor_subclass_parameters``, torchao's path)."""
    m = QuantLinear(MAKERS[name], plain_output=plain_output).eval()
    if form == "parametrized":
        unwrap_tensor_subclass_parameters(m)
    return m


def export(m: torch.nn.Module, strict: bool, batch: int = 6):
    x = torch.randn(batch, IN, generator=torch.Generator().manual_seed(2))
    return torch.export.export(m, (x,), strict=strict, dynamic_shapes=({0: BATCH},))


def inputs(*batches: int) -> list:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(b, IN, generator=g) for b in batches]
