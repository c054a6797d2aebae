"""``torch.save`` / ``torch.load(weights_only=True)`` after ``serialization.allow``.

The refusal without ``allow`` is tested in a fresh interpreter (test_fresh_process.py):
safe globals are process-wide, and this module allows the exemplars.
"""

from __future__ import annotations

import io

import pytest
import torch

from subclass_kit import serialization
from subclass_kit.examples import BlockScaled, ScaledTensor, TwoTensor
from subclass_kit._flatten import rebuild


@pytest.fixture(scope="module", autouse=True)
def _allowed():
    serialization.allow(TwoTensor, ScaledTensor, BlockScaled)


def _save_load(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


@pytest.mark.parametrize(
    "t",
    [pytest.param(s, id=f"{c.__name__}{i}") for c in (TwoTensor, ScaledTensor, BlockScaled) for i, s in enumerate(c.__samples__())],
)
def test_weights_only_round_trip(t):
    u = _save_load(t)
    assert type(u) is type(t)
    assert u.__tensor_flatten__() == t.__tensor_flatten__()
    assert u.shape == t.shape and u.stride() == t.stride() and u.dtype == t.dtype
    torch.testing.assert_close(u.to_plain(), t.to_plain(), rtol=0, atol=0)


def test_weights_only_round_trip_in_a_state_dict_with_grad_and_strides():
    x = TwoTensor(torch.randn(3, 4), torch.randn(3, 4)).t().requires_grad_(True)
    state = {"w": x, "b": BlockScaled.__samples__()[1], "plain": torch.ones(2)}
    out = _save_load(state)
    assert set(out) == {"w", "b", "plain"}
    assert out["w"].requires_grad and out["w"].stride() == (1, 4) and torch.equal(out["w"].b, x.b)
    assert out["b"].block == 16 and torch.equal(out["plain"], torch.ones(2))


def test_inner_storages_shared_in_the_file_stay_shared():
    base = torch.randn(4, 4)
    x = TwoTensor(base, base[0:4])  # b is a view of a's storage
    u = _save_load(x)
    u.a.add_(1)
    assert torch.equal(u.a, u.b)


def test_required_globals_and_refusal_of_non_kit_classes():
    assert serialization.required_globals(BlockScaled)[:2] == [BlockScaled, rebuild]
    with pytest.raises(TypeError, match="WrapperTensor subclasses"):
        serialization.allow(torch.Tensor)
    with pytest.raises(TypeError, match="add_safe_globals"):
        serialization.allow(int)
