"""The export half of the deploy matrix: every exemplar x {strict, non-strict} x {as is,
parametrized}, each exported with a dynamic batch dim and run against eager at three batch
sizes. Cheap (no inductor), so it covers every combination; the AOTInductor half
(test_aoti.py) compiles a representative subset.
"""

from __future__ import annotations

import pytest
import torch

from subclass_kit import SubclassOutputError, WrapperTensor
from subclass_kit.deploy import aoti_package, check_plain_outputs, plain_outputs

from deploy._models import MAKERS, build, export, inputs

STRICT = [pytest.param(False, id="nonstrict"), pytest.param(True, id="strict")]
FORMS = ["as_is", "parametrized"]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("strict", STRICT)
@pytest.mark.parametrize("name", list(MAKERS))
def test_export_matches_eager(name, strict, form):
    m = build(name, form)
    wrapped = any(isinstance(p, WrapperTensor) for p in m.parameters())
    assert wrapped == (form == "as_is")
    ep = export(m, strict)
    check_plain_outputs(ep)  # the outputs are plain: ready for AOTInductor
    run = ep.module()
    for x in inputs(2, 7, 130):
        out = run(x)
        assert type(out) is torch.Tensor
        torch.testing.assert_close(out, m(x), rtol=0, atol=0)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("strict", STRICT)
def test_subclass_output_is_refused_with_the_fix(strict, form, tmp_path):
    m = build("TwoTensor", form, plain_output=False)  # returns relu(TwoTensor): a TwoTensor
    ep = export(m, strict)
    with pytest.raises(SubclassOutputError) as e:
        aoti_package(ep, str(tmp_path / "never.pt2"))  # refused before compiling
    msg = str(e.value)
    assert "output 0" in msg and "TwoTensor" in msg and "to_plain()" in msg and "plain_outputs" in msg
    assert not (tmp_path / "never.pt2").exists()
    # The way out it names works: the same model under plain_outputs exports plain.
    fixed = plain_outputs(m)
    ep2 = export(fixed, strict)
    check_plain_outputs(ep2)
    (x,) = inputs(9)
    torch.testing.assert_close(ep2.module()(x), m(x).to_plain(), rtol=0, atol=0)
