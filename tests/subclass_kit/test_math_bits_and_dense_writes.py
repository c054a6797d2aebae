"""Two wrong-result roots found by the OpInfo sweep on TwoTensor.

The math-bit views (``conj()``, ``_neg_view``) must not leave the bit on an inner tensor the
wrapper does not show (hfftn gave the unconjugated transform), and an op that writes a plain
tensor from a wrapper operand must write it once, not once per inner (``addmm_`` accumulated
twice: linear_cross_entropy's chunked backward gave wrong gradients)."""

from __future__ import annotations

import torch

from subclass_kit.examples import TwoTensor


def _two(t):
    return TwoTensor(t.detach().clone(), t.detach().clone())


def test_conj_resolves_the_bit_and_matches_dense_forward_and_backward():
    torch.manual_seed(0)
    x = torch.randn(5, 6, 7)
    ref_leaf = x.clone().requires_grad_()
    ref = torch.fft.hfftn(ref_leaf, norm="ortho")
    ref.backward(torch.ones_like(ref))
    w = _two(x).requires_grad_()
    out = torch.fft.hfftn(w, norm="ortho")
    torch.testing.assert_close(out.a, ref.detach())
    torch.testing.assert_close(out.b, ref.detach())
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(w.grad.a, ref_leaf.grad)

    z = _two(torch.randn(4, dtype=torch.complex64))
    c = z.conj()
    assert not c.a.is_conj() and not c.b.is_conj()
    torch.testing.assert_close(torch.view_as_real(c.a), torch.view_as_real(z.a.conj().resolve_conj()))
    # _neg_view (the imaginary part of a conjugate view) likewise leaves no bit inside.
    n = torch.ops.aten._neg_view.default(z)
    assert not n.a.is_neg()
    torch.testing.assert_close(n.a, -z.a)


def test_a_plain_destination_is_written_once_not_once_per_inner():
    torch.manual_seed(0)
    acc = torch.randn(4, 3)
    a, b = torch.randn(4, 2), torch.randn(2, 3)
    ref = acc.clone().addmm_(a, b, alpha=-1)
    got = acc.clone().addmm_(a, _two(b), alpha=-1)
    assert type(got) is torch.Tensor
    torch.testing.assert_close(got, ref)
    m = torch.randn(4)
    torch.testing.assert_close(m.clone().mul_(_two(torch.full((4,), 3.0))), m * 3)
    out = torch.empty(4, 3)
    torch.mm(_two(a), b, out=out)
    torch.testing.assert_close(out, a @ b)


def test_chunked_linear_cross_entropy_gradients_match_dense():
    torch.manual_seed(0)
    x, wt, tgt = torch.randn(8, 3), torch.randn(4, 3), torch.randint(0, 4, (8,))
    opts = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=2)

    def grads(x, wt):
        x, wt = x.detach().clone().requires_grad_(), wt.detach().clone().requires_grad_()
        loss = torch.nn.functional.linear_cross_entropy(x, wt, tgt, reduction="none", options=opts)
        return torch.autograd.grad(loss, [x, wt], torch.ones_like(loss))

    ref = grads(x, wt)
    got = grads(_two(x), _two(wt))
    for g, r in zip(got, ref):
        torch.testing.assert_close(g.a if isinstance(g, TwoTensor) else g, r)
