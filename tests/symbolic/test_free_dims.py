"""``symbolic.FREE``: an inner dim that is no function of the outer size, the rest derived.

The subject is a packed variable-length batch, written here as a newcomer would: ``packed``
(total_tokens, D) and ``seq_offsets`` (B+1,) int64 under the padded outer size
(B, max_len, D). ``packed``'s dim 0 is FREE; its D is tied to the outer D.
"""

import sys

import pytest
import sympy
import torch

from expecttest import assert_expected_inline
from torch._dynamo.testing import CompileCounterWithBackend

import symbolic
from subclass_kit import InnerShapeError, WrapperTensor, inner
from symbolic import FREE, Dim, size_symbol

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


# ---- free dims under every marking style: one graph for a batch sweep ------------------------
# Eight batches of four sequences: the total token count (packed's FREE dim 0) and max_len
# change on every batch.
BATCHES = [[3 + i, 7 + 2 * i, 5, 9 + 3 * i] for i in range(8)]
STYLES = {
    "symbolic.mark_dynamic": lambda x: symbolic.mark_dynamic(x, [0, 1]),
    "torch.mark_dynamic": lambda x: torch._dynamo.mark_dynamic(x, [0, 1]),
    "maybe_mark_dynamic": lambda x: torch._dynamo.maybe_mark_dynamic(x, [0, 1]),
    "automatic": lambda x: None,
}


def _pointwise_model(x):
    return (x * 2 + 1).sin()


def _njt(lengths, D=4):
    g = torch.Generator().manual_seed(0)
    return torch.nested.nested_tensor([torch.randn(n, D, generator=g) for n in lengths], layout=torch.jagged)


def _sweep(make, style, backend="aot_eager", check=None):
    cnt = CompileCounterWithBackend(backend)
    f = torch.compile(_pointwise_model, backend=cnt)
    for lengths in BATCHES:
        x = make(lengths)
        STYLES[style](x)
        out = f(x)
        if check is not None:
            check(x, out)
    torch._dynamo.reset()
    return cnt.frame_count


def _check_vs_dense(x, out):
    # Values vs the padded dense model at the token positions (padding is not stored).
    mask = torch.zeros(x.shape[:2], dtype=torch.bool)
    for i, n in enumerate((x.seq_offsets[1:] - x.seq_offsets[:-1]).tolist()):
        mask[i, :n] = True
    torch.testing.assert_close(out.to_plain()[mask], _pointwise_model(x.to_plain())[mask])


@pytest.mark.parametrize("style", list(STYLES))
def test_one_graph_for_a_batch_sweep_under_every_marking_as_njt(style):
    kit = _sweep(lambda n: packed_batch(n)[0], style, check=_check_vs_dense)
    njt = _sweep(_njt, style)
    if style == "automatic":
        # Unmarked, the first batch compiles static; the second recompiles with the changed
        # sizes dynamic (the free dim among them), and no later batch recompiles. NJT marks
        # its ragged dim when it is built, so it needs no recompile.
        assert (kit, njt) == (2, 1)
    else:
        assert (kit, njt) == (1, 1)


def test_marks_on_free_dims_follow_the_outer_marks():
    x, _ = packed_batch([3, 5, 2])
    assert symbolic.plan(x, [0, 1]).inner["packed"] == {0: Dim.auto()}
    assert symbolic.plan(x, 2).inner["packed"] == {0: Dim.auto(), 1: Dim.dynamic()}
    assert "packed" not in symbolic.plan(x, {0: Dim.static()}).inner  # no outer dim may move
    assert symbolic.plan(x, 0, inner={"packed": [0]}).inner["packed"] == {0: Dim.dynamic()}  # named: as given
    torch._dynamo.mark_dynamic(x, [0, 1])  # torch's own function derives the same
    assert symbolic.marks(x) == symbolic.plan(x, [0, 1])


# ---- notes: every free dim left static is named ----------------------------------------------
def test_notes_name_a_free_dim_left_static():
    x, _ = packed_batch([3, 5, 2])
    assert_expected_inline("\n".join(symbolic.describe(x).notes()), """\
L['x'].packed.size()[0] is free (FREE in Packed.__inner_shapes__) and unmarked: the first graph specializes it, so a new size recompiles (automatic dynamic makes it dynamic then). Mark it dynamic: mark an outer dim of x dynamic (symbolic.mark_dynamic or torch._dynamo.mark_dynamic / maybe_mark_dynamic), which marks its free dims too, or name it: symbolic.mark_dynamic(x, dims, inner={'packed': [0]}).""")
    symbolic.mark_dynamic(x, [0, 1], inner={"packed": {0: Dim.static()}})
    (note,) = symbolic.describe(x).notes(name="batch")
    assert note.startswith("L['batch'].packed.size()[0] is free (FREE in Packed.__inner_shapes__) and "
                           "marked static: every new size recompiles."), note
    for style in ("symbolic.mark_dynamic", "torch.mark_dynamic", "maybe_mark_dynamic"):
        y, _ = packed_batch([3, 5, 2])
        STYLES[style](y)
        assert symbolic.describe(y).notes() == [], style


def test_explain_prints_the_free_dim_note(monkeypatch, capsys):
    import types

    from subclass_kit import cli

    prog = types.ModuleType("free_dims_prog")
    prog.f = _pointwise_model
    prog.INPUTS = [(packed_batch(n)[0],) for n in BATCHES[:2]]
    monkeypatch.setitem(sys.modules, "free_dims_prog", prog)
    assert cli.main(["explain", "free_dims_prog:f", "free_dims_prog:INPUTS", "--dynamic", "false"]) == 0
    out = capsys.readouterr().out
    assert "note: x: L['x'].packed.size()[0] is free (FREE in Packed.__inner_shapes__) and unmarked" in out, out


@pytest.mark.slow
def test_one_inductor_graph_for_a_batch_sweep():
    assert _sweep(lambda n: packed_batch(n)[0], "torch.mark_dynamic", backend="inductor", check=_check_vs_dense) == 1
