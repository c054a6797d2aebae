"""``symbolic.FREE``: an inner dim that is no function of the outer size, the rest derived.

The subject is a packed variable-length batch, written here as a newcomer would: ``packed``
(total_tokens, D) and ``seq_offsets`` (B+1,) int64 under the padded outer size
(B, max_len, D). ``packed``'s dim 0 is FREE; its D is tied to the outer D.
"""

import pytest
import sympy
import torch

import symbolic
from subclass_kit import InnerShapeError, WrapperTensor, inner
from symbolic import FREE, size_symbol

aten = torch.ops.aten


class Packed(WrapperTensor):
    """Throwaway: a packed variable-length batch (outer size = the padded batch)."""

    packed: torch.Tensor = inner()
    seq_offsets: torch.Tensor = inner()

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        B, max_len, D = outer_size
        return {"packed": (FREE, D), "seq_offsets": (B + 1,)}

    def to_plain(self):
        B, L, D = self.shape
        out = self.packed.new_zeros(B, L, D)
        bounds = self.seq_offsets.tolist()
        for i in range(B):
            out[i, : bounds[i + 1] - bounds[i]] = self.packed[bounds[i]: bounds[i + 1]]
        return out


@Packed.implements(aten.mul.Tensor, aten.add.Tensor, aten.sin.default, aten.gelu.default)
def _pointwise(func, types, args, kwargs):
    # Padding is not stored: a pointwise op runs on the tokens only.
    x = next(a for a in args if isinstance(a, Packed))
    out = func(*[a.packed if isinstance(a, Packed) else a for a in args], **(kwargs or {}))
    return Packed(out, x.seq_offsets, size=x.shape)


def packed_batch(lengths, D=4, seed=0):
    """A Packed batch of sequences of these lengths, and the same as a padded dense tensor."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randn(n, D, generator=g) for n in lengths]
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    x = Packed(torch.cat(seqs), offsets, size=(len(lengths), max(lengths), D))
    return x, torch.nn.utils.rnn.pad_sequence(seqs, batch_first=True)


def test_free_dim_is_unchecked_and_the_others_are():
    x, dense = packed_batch([3, 5, 2])
    assert tuple(x.packed.shape) == (10, 4)
    torch.testing.assert_close(x.to_plain(), dense)
    with pytest.raises(InnerShapeError, match=r"expects \(FREE, 4\) for outer size \(3, 5, 4\) \(dim 1: expected 4, got 3\)"):
        Packed(torch.randn(10, 3), x.seq_offsets, size=(3, 5, 4))
    with pytest.raises(InnerShapeError, match="seq_offsets"):
        Packed(torch.randn(10, 4), torch.tensor([0, 10]), size=(3, 5, 4))


def test_relations_tie_the_derived_dims_only():
    x, _ = packed_batch([3, 5, 2])
    s0, s2 = size_symbol("", 0), size_symbol("", 2)
    want = [sympy.Eq(size_symbol("packed", 1), s2), sympy.Eq(size_symbol("seq_offsets", 0), s0 + 1)]
    assert symbolic.relations(x) == want
    assert symbolic.relations(Packed, ndim=3) == want
    assert [str(r.target) for r in symbolic.describe(x).relations()] == [
        "L['x'].packed.size()[1]", "L['x'].seq_offsets.size()[0]"]


def test_free_marker_is_one_value():
    import copy
    import pickle

    assert copy.deepcopy(FREE) is FREE and pickle.loads(pickle.dumps(FREE)) is FREE
    assert repr(FREE) == "FREE"
