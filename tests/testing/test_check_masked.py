"""Issue 28 item 3: the checker on a class with don't-care positions.

A packed variable-length batch (``packed`` (total, D), ``seq_offsets`` (B+1,), outer the
padded (B, max_len, D), ``to_plain()`` zero-padded) whose handlers leave the padding of the
dense reference unmatched: ``F.linear``'s bias, a per-sequence mean, softmax and sum. With
``__plain_mask__`` the checker judges only real tokens (no false FAIL), a real bug at a real
token still FAILs and says where; the sweep builds sizes through ``__dynamic_samples__`` and
never by cycling offsets; row names are unique; backward rows name the ops they need.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import symbolic
from subclass_kit import WrapperTensor, inner
from subclass_kit.testing import check_subclass, sweep_ops

aten = torch.ops.aten


class Packed(WrapperTensor):
    """Sequences packed along dim 0 of ``packed``; outer (B, max_len, D)."""

    packed: torch.Tensor = inner()
    seq_offsets: torch.Tensor = inner(dtype=torch.int64)

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        return {"seq_offsets": (outer_size[0] + 1,)}  # packed (total tokens, D) left out: free

    @classmethod
    def build(cls, seqs):
        lengths = [s.shape[0] for s in seqs]
        packed = torch.cat(seqs)
        offsets = torch.tensor([0] + lengths).cumsum(0)
        return cls(packed, offsets, size=(len(seqs), max(lengths), packed.shape[1]))

    def _valid(self):
        lengths = self.seq_offsets[1:] - self.seq_offsets[:-1]
        pos = torch.arange(self.shape[1])
        idx = (self.seq_offsets[:-1, None] + pos).clamp(max=self.packed.shape[0] - 1)
        return idx, pos[None, :] < lengths[:, None]

    def to_plain(self):
        idx, valid = self._valid()
        return self.packed[idx] * valid[..., None].to(self.packed.dtype)

    def __plain_mask__(self):
        return self._valid()[1][..., None]  # (B, max_len, 1): a real token's every feature counts

    def like(self, packed):
        return type(self).from_parts((packed, self.seq_offsets), size=(*self.shape[:2], packed.shape[1]))

    @classmethod
    def __samples__(cls):
        g = torch.Generator().manual_seed(0)
        return [cls.build([torch.randn(n, 4, generator=g) for n in (3, 5, 2)])]

    @classmethod
    def __op_args__(cls, op, x):
        args = {F.linear: (x, _W, _B), torch.Tensor.mean: (x, 1), torch.mean: (x, 1), torch.sum: (x, 1),
                F.softmax: (x, 1)}
        return args.get(op)


class Unmasked(Packed):
    __plain_mask__ = None  # the same class, padding not declared


_W = torch.linspace(-1, 1, 24).reshape(6, 4)
_B = torch.linspace(0.5, 1.5, 6)


def _data(a):
    return a.packed if isinstance(a, Packed) else a


def _per_seq(x):
    lengths = x.seq_offsets[1:] - x.seq_offsets[:-1]
    seg = torch.repeat_interleave(torch.arange(x.shape[0]), lengths, output_size=x.packed.shape[0])
    return seg, lengths


def _seq_sum(x, values):
    seg, _ = _per_seq(x)
    return torch.zeros(x.shape[0], values.shape[1], dtype=values.dtype).index_add(0, seg, values)


@Packed.implements(aten.add.Tensor, aten.mul.Tensor, aten.neg.default, aten.gelu.default, aten.ones_like.default,
                    aten.rand_like.default)  # (random: compared by shape and dtype)
def _pointwise(func, types, args, kwargs):
    x = next(a for a in args if isinstance(a, Packed))
    return x.like(func(*[_data(a) for a in args], **kwargs))


@Packed.implements_torch_function(F.linear)
def _linear(func, types, args, kwargs):
    x, w = args[0], args[1]
    return x.like(F.linear(x.packed, w, args[2] if len(args) > 2 else kwargs.get("bias")))


@Packed.implements_torch_function(torch.Tensor.mean, torch.mean)
def _mean(func, types, args, kwargs):
    x = args[0]
    return _seq_sum(x, x.packed) / _per_seq(x)[1][:, None]


@Packed.implements_torch_function(torch.sum)
def _sum(func, types, args, kwargs):
    return _seq_sum(args[0], args[0].packed)


@Packed.implements_torch_function(F.softmax)
def _softmax(func, types, args, kwargs):
    x = args[0]
    e = (x.packed - x.packed.max()).exp()
    return x.like(e / _seq_sum(x, e)[_per_seq(x)[0]])


class BadLinear(Packed):
    """A real bug at a real token: the first token of the batch gets 1 added."""


@BadLinear.implements_torch_function(F.linear)
def _bad_linear(func, types, args, kwargs):
    x = args[0]
    y = F.linear(x.packed, args[1], args[2])
    return x.like(y + (torch.arange(y.shape[0]) == 0).to(y.dtype)[:, None])


class BadMean(Packed):
    """torch's dense formula on a packed batch: divides by max_len (the issue's silent bug)."""


@BadMean.implements_torch_function(torch.Tensor.mean, torch.mean)
def _bad_mean(func, types, args, kwargs):
    x = args[0]
    return _seq_sum(x, x.packed) / x.shape[1]


def _rows(cls, **kw):
    kw.setdefault("backends", ("aot_eager",))
    report = check_subclass(cls, **kw)
    return report, {r.name: r for r in report.rows}


_TF_ROWS = ("eager[torch.nn.functional.linear(*__op_args__)]", "eager[Tensor.mean(*__op_args__)]",
            "eager[torch.mean(*__op_args__)]", "eager[torch.sum(*__op_args__)]",
            "eager[torch.nn.functional.softmax(*__op_args__)]")


def test_class_handlers_are_right_per_sequence():
    # the class itself against torch per sequence: what the checker must not call wrong
    x = Packed.__samples__()[0]
    seqs = [x.packed[a:b] for a, b in zip(x.seq_offsets[:-1].tolist(), x.seq_offsets[1:].tolist())]
    torch.testing.assert_close(torch.mean(x, 1), torch.stack([s.mean(0) for s in seqs]))
    torch.testing.assert_close(F.softmax(x, 1).packed, torch.cat([s.softmax(0) for s in seqs]))
    torch.testing.assert_close(F.linear(x, _W, _B).packed, F.linear(x.packed, _W, _B))


def test_mask_gives_no_false_fails_and_without_it_the_advice_names_the_hook():
    report, rows = _rows(Packed, only=["protocol", "ctx", "eager", "compile", "backward", "copy"])
    assert report.ok, [r.message for r in report.failures]
    assert all(rows[n].status == "pass" for n in _TF_ROWS), {n: rows[n].message for n in _TF_ROWS}
    assert "torch.masked.mean" in rows["eager[torch.mean(*__op_args__)]"].message
    assert "torch.masked.softmax" in rows["eager[torch.nn.functional.softmax(*__op_args__)]"].message
    assert rows["backward.eager"].status == "pass" and "meaningful" in rows["backward.eager"].message
    assert rows["eager[aten.rand_like.default(x)]"].status == "pass"
    # the same class without the hook: linear's bias, mean and softmax differ at padding
    report, rows = _rows(Unmasked, backends=(), only=["eager[torch", "eager[Tensor"])
    failed = {r.name for r in report.failures}
    assert {"eager[torch.nn.functional.linear(*__op_args__)]", "eager[torch.mean(*__op_args__)]",
            "eager[torch.nn.functional.softmax(*__op_args__)]"} <= failed, failed
    assert all("__plain_mask__" in rows[n].message for n in failed)


def test_a_bug_at_a_meaningful_position_still_fails_and_names_it():
    _, rows = _rows(BadLinear, backends=(), only=["eager[torch.nn"])
    row = rows["eager[torch.nn.functional.linear(*__op_args__)]"]
    assert row.status == "fail"
    # token 0 of sequence 0: 6 output features at (0, 0, j); padding not compared
    assert "values differ at 6 of" in row.message and "at (0, 0, 0): got" in row.message, row.message
    assert "Fix: fix the handler for torch.nn.functional.linear" in row.message
    _, rows = _rows(BadMean, backends=(), only=["eager[torch.mean", "eager[Tensor.mean"])
    for name in ("eager[torch.mean(*__op_args__)]", "eager[Tensor.mean(*__op_args__)]"):
        assert rows[name].status == "fail" and "torch.masked.mean" in rows[name].message, rows[name].message


BUILT: list = []  # the instances __dynamic_samples__ yielded


class Swept(Packed):
    @classmethod
    def __dynamic_samples__(cls, sample):
        g = torch.Generator().manual_seed(1)
        for lengths in ((4, 9, 6), (2, 3, 11), (7, 5, 8)):  # total tokens 19, 16, 20; max_len 9, 11, 8
            x = cls.build([torch.randn(n, sample.shape[2], generator=g) for n in lengths])
            BUILT.append(x)
            yield x


def test_sweep_uses_dynamic_samples_and_varies_total_tokens_and_max_len():
    BUILT.clear()
    _, rows = _rows(Swept, only=["compile.dynamic_sweep"])
    row = rows["compile.dynamic_sweep[aot_eager]"]
    assert row.status == "pass", row.message
    shown = ", ".join(f"{'x'.join(map(str, x.shape))} (packed {x.packed.shape[0]}x{x.packed.shape[1]})"
                      for x in BUILT)
    assert row.message.startswith(f"sizes [{shown}] (from __dynamic_samples__): 1 frame"), row.message
    assert len({x.packed.shape[0] for x in BUILT}) == 3 and len({x.shape[1] for x in BUILT}) == 3
    assert "varied dim 1, packed.size(0)" in row.message


def test_sweep_without_the_hook_skips_and_builds_no_instance(monkeypatch):
    from subclass_kit.testing import _dynamic

    def refuse(*a, **k):
        raise AssertionError("the sweep resized a class with free inner dims")

    monkeypatch.setattr(_dynamic, "resized", refuse)
    _, rows = _rows(Packed, only=["compile.dynamic_sweep"])
    row = rows["compile.dynamic_sweep[aot_eager]"]
    assert row.status == "skip" and "__dynamic_samples__" in row.message and "packed.size(0)" in row.message


class Marked(Packed):
    """packed declared (FREE, D): its first dim free, D derived."""

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        return {"packed": (symbolic.FREE, outer_size[2]), "seq_offsets": (outer_size[0] + 1,)}


def test_a_free_marker_is_a_free_dim():
    from subclass_kit.testing._sweep_samples import free_dims

    g = torch.Generator().manual_seed(0)
    x = Marked.build([torch.randn(n, 4, generator=g) for n in (3, 5, 2)])
    assert free_dims(x) == [("packed", 0)]
    row = check_subclass(x, backends=("aot_eager",), only=["compile.dynamic_sweep"]).rows[0]
    assert row.status == "skip" and "packed.size(0)" in row.message and "__dynamic_samples__" in row.message


def test_row_names_are_unique():
    report = check_subclass(Packed, backends=(), only=["eager"])
    names = [r.name for r in report.rows]
    assert len(names) == len(set(names)) and "eager[Tensor.mean(*__op_args__)]" in names
    report = check_subclass(Packed, backends=(), ops=[lambda x: x * 2, lambda x: x + 1], only=["eager"])
    first, second = (r.name for r in report.rows)
    assert first.endswith("<lambda>(x)]") and second == first[:-1] + " #2]"


def test_backward_row_names_the_ops_it_needs():
    # gelu's backward runs aten.gelu_backward on the class, which registers no handler for it
    _, rows = _rows(Packed, ops=[F.gelu], only=["eager", "backward"])
    msg = rows["backward.eager"].message
    assert rows["backward.eager"].status == "fail"
    assert "runs these aten ops on Packed: " in msg and "Packed lacks: aten.gelu_backward.default" in msg, msg
    assert "Fix: register handlers for aten.gelu_backward.default" in msg


class BadGeluBackward(Packed):
    """gelu's backward handler forgets gelu's derivative: it passes the gradient through."""


@BadGeluBackward.implements(aten.gelu_backward.default)
def _gelu_backward(func, types, args, kwargs):
    return args[0].like(args[0].packed.clone())


def test_a_wrong_gradient_at_meaningful_positions_fails_naming_the_backward_ops():
    _, rows = _rows(BadGeluBackward, ops=[F.gelu], backends=(), only=["eager", "backward.eager"])
    row = rows["backward.eager"]
    assert row.status == "fail" and "values differ at 40 of 40 meaningful positions" in row.message, row.message
    assert "ops this backward runs on BadGeluBackward (aten.ones_like.default, aten.gelu_backward.default" \
        in row.message, row.message


class FromPlain(Packed):
    @classmethod
    def from_plain(cls, t):
        if t.dim() != 3 or t.shape[1] < 2:
            raise ValueError("3-D tensors with max_len >= 2 only")
        return cls.build([t[i] for i in range(t.shape[0] - 1)] + [t[-1, :-1]])  # last one a token shorter


class FromPlainUnmasked(FromPlain):
    __plain_mask__ = None


def test_opinfo_judges_meaningful_positions_only():
    # (backward off: the class's torch-function linear builds its result with the constructor,
    # which drops the graph -- issue 28 item 2)
    masked = sweep_ops(FromPlain, ops="nn.functional.linear", backward=False, max_samples=2)
    assert masked.by_outcome()["pass"] == ["nn.functional.linear"], masked.results
    plain = sweep_ops(FromPlainUnmasked, ops="nn.functional.linear", backward=False, max_samples=2)
    assert plain.by_outcome()["wrong"] == ["nn.functional.linear"], plain.results
