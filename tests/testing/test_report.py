"""CheckReport / CheckRow / SubclassCheckError, sample resolution, the pytest decorators."""

from __future__ import annotations

import json

import pytest
import torch
from expecttest import assert_expected_inline

from subclass_kit import pytree
from subclass_kit.examples import TwoTensor
from subclass_kit.testing import (
    CheckReport,
    CheckRow,
    SamplesError,
    SubclassCheckError,
    check_subclass,
    parametrize_backends,
    parametrize_pytree_impls,
)
from subclass_kit.testing.report import format_row, format_summary


def _report():
    return CheckReport(
        "Demo",
        [
            CheckRow("ctx.hashable", "pass", 0.01, "", subject="Demo"),
            CheckRow("ctx.tensor_free", "fail", 0.02, "the ctx holds a tensor at ctx[2]. Fix: make it inner.", subject="Demo"),
            CheckRow("compile.meta_change[eager]", "skip", 0.0, "no meta", subject="Demo"),
            CheckRow("repr", "fail", 0.5, "repr raised KeyError. Fix: define __repr__.", subject="Demo"),
        ],
    )


def test_report_verdict_counts_and_row_lookup():
    r = _report()
    assert not r.ok
    assert r.counts() == {"pass": 1, "fail": 2, "skip": 1}
    assert [x.name for x in r.failures] == ["ctx.tensor_free", "repr"]
    assert r.row("repr").status == "fail"
    with pytest.raises(KeyError, match="has no row 'nope'"):
        r.row("nope")
    assert CheckReport("Empty").ok


def test_raise_if_failed_lists_every_failure():
    with pytest.raises(SubclassCheckError) as err:
        _report().raise_if_failed()
    assert_expected_inline(
        str(err.value),
        """\
Demo failed 2 of 4 checks:
  - ctx.tensor_free: the ctx holds a tensor at ctx[2]. Fix: make it inner.
  - repr: repr raised KeyError. Fix: define __repr__.""",
    )
    assert isinstance(err.value, AssertionError)


def test_rows_and_summary_render():
    r = _report()
    assert_expected_inline(
        "\n".join(format_row(x) for x in r.rows),
        """\
PASS    0.01s  Demo  ctx.hashable
FAIL    0.02s  Demo  ctx.tensor_free                    the ctx holds a tensor at ctx[2]. Fix: make it inner.
skip    0.00s  Demo  compile.meta_change[eager]         no meta
FAIL    0.50s  Demo  repr                               repr raised KeyError. Fix: define __repr__.""",
    )
    assert_expected_inline(
        format_summary([r]),
        """\
subject  pass  fail  skip    seconds
Demo        1     2     1       0.53
total       1     2     1       0.53""",
    )


def test_report_json_round_trips():
    doc = json.loads(json.dumps(_report().to_json()))
    assert doc["subject"] == "Demo" and doc["ok"] is False
    assert doc["counts"] == {"pass": 1, "fail": 2, "skip": 1}
    assert doc["rows"][1] == {
        "name": "ctx.tensor_free",
        "status": "fail",
        "seconds": 0.02,
        "message": "the ctx holds a tensor at ctx[2]. Fix: make it inner.",
        "subject": "Demo",
    }


def test_every_row_has_the_contract_attributes_and_on_row_streams():
    seen = []
    x = TwoTensor(torch.randn(3, 4), torch.randn(3, 4))
    report = check_subclass(x, backends=("eager",), only=["protocol", "ctx"], on_row=seen.append)
    assert seen == report.rows and len(seen) == 15
    for row in report.rows:
        assert row.status in ("pass", "fail", "skip")
        assert isinstance(row.seconds, float) and row.seconds >= 0
        assert isinstance(row.name, str) and isinstance(row.message, str)


@pytest.mark.parametrize(
    "samples, words",
    [
        (torch.ones(2), "not a tensor subclass instance"),
        ([], "got no samples"),
        (42, "got int"),
        (CheckRow, "has no __samples__() classmethod"),
    ],
    ids=["plain-tensor", "empty", "int", "class-without-samples"],
)
def test_bad_samples_are_refused_with_a_teaching_error(samples, words):
    with pytest.raises(SamplesError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_subclass(samples)
    assert issubclass(SamplesError, TypeError)


def test_samples_of_several_classes_report_each():
    from subclass_kit.examples import BlockScaled

    report = check_subclass([TwoTensor, BlockScaled], backends=("eager",), only=["ctx.hashable"])
    assert report.subject == "TwoTensor + BlockScaled"
    assert [(r.subject, r.name) for r in report.rows] == [("TwoTensor", "ctx.hashable"), ("BlockScaled", "ctx.hashable")]


def test_turned_off_families_are_reported_as_skips():
    report = check_subclass(TwoTensor, backends=("eager",), dynamic=False, backward=False, export=False,
                            serialization=False, only=["compile.dynamic", "backward", "export", "serialization"])
    assert {r.name: r.status for r in report.rows} == {
        "compile.dynamic_sweep[eager]": "skip",
        "backward.eager": "skip",
        "backward.compiled[eager]": "skip",
        "export.round_trip": "skip",
        "serialization.save_load": "skip",
    }
    assert all("turned off" in r.message for r in report.rows)


@parametrize_backends(backends=("eager", "aot_eager"))
def test_parametrize_backends_gives_each_backend(backend):
    from torch._dynamo.testing import CompileCounterWithBackend

    cnt = CompileCounterWithBackend(backend)
    f = torch.compile(lambda x: x * 2, backend=cnt, fullgraph=True)
    x = TwoTensor(torch.ones(2), torch.ones(2))
    assert torch.equal(f(x).a, torch.full((2,), 2.0))
    assert cnt.frame_count == 1


def test_parametrize_backends_marks_inductor_slow():
    def probe(backend):
        pass

    (mark,) = parametrize_backends(probe).pytestmark
    params = mark.args[1]
    assert [p.values[0] for p in params] == ["eager", "aot_eager", "inductor"]
    assert [p.id for p in params] == ["eager", "aot_eager", "inductor"]
    assert [m.name for m in params[2].marks] == ["slow"] and not params[0].marks


@parametrize_pytree_impls
def test_parametrize_pytree_impls_activates_each(pytree_impl):
    assert pytree.current() == pytree_impl
    leaves, spec = pytree.tree_flatten({"a": [1, (2, 3)]})
    assert pytree.tree_unflatten([x * 10 for x in leaves], spec) == {"a": [10, (20, 30)]}


_SEEN = []


@parametrize_pytree_impls
def test_parametrize_pytree_impls_without_the_argument():
    _SEEN.append(pytree.current())
    assert pytree.current() in ("optree", "python")


def test_parametrize_pytree_impls_restores_and_covered_both():
    assert pytree.current() == "optree"
    assert sorted(_SEEN) == ["optree", "python"]


class _NotAWrapper(torch.Tensor):
    """A tensor subclass without torch's wrapper protocol."""


def test_a_class_without_the_protocol_fails_once_and_skips_the_rest():
    x = torch.randn(2, 3).as_subclass(_NotAWrapper)
    report = check_subclass(x, backends=("eager",))
    assert [r.name for r in report.failures] == ["protocol.flatten"]
    assert "lacks __tensor_flatten__, __tensor_unflatten__" in report.failures[0].message
    skipped = [r for r in report.rows if r.status == "skip"]
    assert len(skipped) > 20 and all("protocol.flatten" in r.message and "did not pass" in r.message for r in skipped)


def test_no_backends_skips_the_compiled_checks_and_bad_names_are_refused():
    report = check_subclass(TwoTensor, backends=(), only=["compile", "backward"])
    assert {r.name: r.status for r in report.rows} == {
        "compile.dynamic_sweep[none]": "skip",
        "compile.meta_change[none]": "skip",
        "backward.eager": "pass",
        "backward.compiled[none]": "skip",
    }
    with pytest.raises(ValueError, match=r"unknown torch.compile backend\(s\) \['inductr'\]"):
        check_subclass(TwoTensor, backends=("inductr",))
