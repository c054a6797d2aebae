"""An outer size that is a multiple of an inner size reaches dynamo in torch's own form.

Ported from PyTorch's ``test_wrapper_subclass_guards_on_inner_tensor``
(test/dynamo/test_subclasses.py): torch's class computes its outer size as twice the inner
one, so dynamo records ``Eq(2*s50, s77)``. The kit's class declares the inverse
(``floor_div(outer, 2)`` in ``__inner_shapes__``) and honours the outer size it is given;
its unflatten states the relation as torch does, so the guards are torch's, word for word.
"""

import torch
from expecttest import assert_expected_inline

import guards
import symbolic
from guards import _compat as guards_compat
from subclass_kit import WrapperTensor, inner

aten = torch.ops.aten


class DoubleSize(WrapperTensor):
    """Throwaway: the outer dim 0 is twice the inner one; an op on more than 3 inner rows adds 2."""

    inner_elem: torch.Tensor = inner()

    @classmethod
    def __inner_shapes__(cls, outer_size, ctx):
        return {"inner_elem": (symbolic.floor_div(outer_size[0], 2), *outer_size[1:])}


@DoubleSize.implements(aten.mul.Tensor, aten.div.Tensor)
def _op(func, types, args, kwargs):
    inner_args = [a.inner_elem if isinstance(a, DoubleSize) else a for a in args]
    out = func(*inner_args, **(kwargs or {}))
    if inner_args[0].shape[0] > 3:  # a guard on the inner size, as in torch's test
        out = out + 2
    return DoubleSize(out, size=(2 * out.shape[0], *out.shape[1:]))


def double(rows, cols=4):
    return DoubleSize(torch.ones(rows, cols), size=(2 * rows, cols))


def _fn(x):
    if x.shape[0] < 13:
        return torch.mul(x, x)
    return torch.div(x, x)


def test_wrapper_subclass_guards_on_inner_tensor():
    seen = {}

    def backend(gm, args):
        env = torch._guards.TracingContext.get().fake_mode.shape_env
        seen["guards"] = [str(g.expr) for g in env.guards]
        seen["val"] = {str(k): v for k, v in env.backed_var_to_val.items()}
        seen["src"] = {str(k): v[0].name for k, v in env.var_to_sources.items()}
        return gm

    x = double(4)
    torch._dynamo.mark_dynamic(x, 0)
    torch.compile(_fn, backend=backend)(x)
    # The symbols and guards torch's own test expects for its class.
    assert seen["val"] == {"s50": 4, "s77": 8}
    assert seen["src"] == {"s50": "L['x'].inner_elem.size()[0]", "s77": "L['x'].size()[0]"}
    assert_expected_inline("\n".join(seen["guards"]), """\
Eq(2*s50, s77)
2*s50 < 13
s50 > 3""")


def test_guard_set_states_the_multiple_as_dynamo_does():
    x = double(4)
    symbolic.mark_dynamic(x, 0)
    f = torch.compile(lambda x: x.inner_elem * 2, backend="eager", dynamic=False)
    f(x)
    (entry,) = guards_compat.cache_entries(f._torchdynamo_orig_callable)
    gs = guards.build(x)
    assert "2*L['x'].inner_elem.size()[0] == L['x'].size()[0]" in gs.describe()
    # An outer size that is not twice the inner one (9 vs 4): floor(9/2) == 4 would pass,
    # torch's form (2*4 != 9) fails, in dynamo and in the kit's prediction alike.
    for v in (double(6), double(2), double(7)):
        assert gs.check(v) and entry.guard_manager.check({"x": v})
    bad = DoubleSize(torch.ones(4, 4), size=(9, 4))
    assert not gs.check(bad) and not entry.guard_manager.check({"x": bad})
    assert gs.explain(bad) == ["L['x'].inner_elem.size()[0]: expected (L['x'].size()[0])/2 = 9/2, got 4"]
