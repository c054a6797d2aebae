"""The proof that check_subclass finds bugs: every class in tests/broken_subclasses.py is
flagged by the right check with a message naming its bug, and the correct GoodPair (the
same code without the bugs) passes the whole battery."""

from __future__ import annotations

import pytest
import torch

import broken_subclasses as bs
from subclass_kit.testing import SubclassCheckError, check_subclass

BACKENDS = ("eager", "aot_eager")


def _id(bug) -> str:
    return bug.resolve().__name__


def test_good_pair_passes_the_whole_battery():
    report = check_subclass(bs.GoodPair, backends=BACKENDS)
    report.raise_if_failed()
    statuses = {r.name: r.status for r in report.rows}
    # Every family ran for real on the raw-protocol class (nothing skipped).
    for name in (
        "protocol.round_trip_symbolic",
        "ctx.immutable",
        "identity.stable_hash",
        "eager[aten.t.default(x)]",
        "compile[aot_eager]",
        "compile.dynamic_sweep[aot_eager]",
        "compile.meta_change[aot_eager]",
        "backward.compiled[aot_eager]",
        "export.round_trip",
        "serialization.save_load",
        "copy.deepcopy",
    ):
        assert statuses[name] == "pass", name
    # Only the row about a hook the raw-protocol class does not have is a skip.
    assert [n for n, st in statuses.items() if st == "skip"] == ["protocol.inner_shapes_dynamic"]
    assert "has no __inner_shapes__" in report.row("protocol.inner_shapes_dynamic").message


def test_there_are_at_least_ten_distinct_bugs_each_a_distinct_class():
    assert len(bs.BUGS) >= 10
    classes = [b.resolve() for b in bs.BUGS]
    assert len({c.__name__ for c in classes}) == len(classes)
    assert all(issubclass(c, bs.GoodPair) and c is not bs.GoodPair for c in classes)


@pytest.mark.parametrize("bug", bs.BUGS, ids=_id)
def test_checker_flags_the_bug_with_the_right_check(bug):
    report = check_subclass(bug.resolve(), backends=BACKENDS, only=[bug.check])
    row = report.row(bug.check)
    assert row.status == "fail", f"{bug.check} did not flag {_id(bug)}: {row.status} {row.message}"
    for word in bug.words:
        assert word in row.message, f"{word!r} not in: {row.message}"
    assert not report.ok
    with pytest.raises(SubclassCheckError) as err:
        report.raise_if_failed()
    assert bug.check in str(err.value) and isinstance(err.value, AssertionError)


@pytest.mark.parametrize(
    "bug",
    [b for b in bs.BUGS if b.resolve() is bs.CtxEqIgnoresTag],
    ids=_id,
)
def test_full_battery_flags_the_bug_and_keeps_the_rest(bug):
    """Run everything (no `only=`): the bug's row fails and the unrelated families still pass."""
    report = check_subclass(bug.resolve(), backends=("aot_eager",))
    failed = {r.name for r in report.failures}
    assert bug.check in failed
    statuses = {r.name: r.status for r in report.rows}
    for name in ("protocol.round_trip_real", "ctx.hashable", "identity.stable_hash", "serialization.save_load", "repr"):
        assert statuses[name] == "pass", (name, statuses[name])


def test_every_failure_is_listed_by_raise_if_failed():
    report = check_subclass(bs.TensorInCtx, backends=("eager",), only=["ctx"])
    names = [r.name for r in report.failures]
    assert "ctx.tensor_free" in names
    with pytest.raises(SubclassCheckError) as err:
        report.raise_if_failed()
    text = str(err.value)
    assert text.startswith(f"TensorInCtx failed {len(names)} of 5 checks:")
    assert all(f"  - {n}: " in text for n in names)
    assert err.value.report is report


@pytest.mark.parametrize("cls", [bs.UnhashableCtx, bs.MutableCtx], ids=lambda c: c.__name__)
def test_a_ctx_torch_accepts_passes_the_ctx_rows(cls):
    """An unhashable or mutable ctx is what torchao ships (dicts): dynamo deep-copies it and
    compares with ==, so the checker must not fail it -- it notes it instead."""
    report = check_subclass(cls, backends=("eager",), only=["ctx"])
    assert report.ok, report.failures
    note = report.row("ctx.hashable").message + report.row("ctx.immutable").message
    assert "fine for torch" in note
    # and torch agrees: it compiles, and a different tag fails the ctx guard (recompiles)
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    cnt = CompileCounter()
    f = torch.compile(lambda t: t * 2, backend=cnt, fullgraph=True)
    a, _, other = cls.__samples__()  # samples 0 and 2: same shape, tags "pair" / "other"
    f(a), f(a)
    assert cnt.frame_count == 1
    f(other)
    assert cnt.frame_count == 2


def test_user_ops_are_required_and_unsupported_ones_fail():
    aten = torch.ops.aten
    report = check_subclass(bs.MissingClone, backends=("eager",), ops=[aten.neg.default, aten.clone.default], only=["eager"])
    assert report.row("eager[aten.neg.default(x)]").status == "pass"
    row = report.row("eager[aten.clone.default(x)]")
    assert row.status == "fail" and "passed in ops=" in row.message


def test_unsupported_optional_op_is_a_skip_not_a_failure():
    class NoNeg(bs.GoodPair):
        _missing = frozenset({torch.ops.aten.neg.default})

    report = check_subclass(NoNeg.__samples__(), backends=("eager",), only=["eager"])
    row = report.row("eager[aten.neg.default(x)]")
    assert row.status == "skip" and "NotImplementedError" in row.message
    assert report.ok


def test_a_fresh_process_failure_stays_in_its_own_subject():
    """One subject whose samples cannot be unpickled in the child fails its own hash row, with
    the cause; the other subject of the same run still passes (one pickle per subject)."""
    import sys
    import types

    from torch.testing._internal.two_tensor import TwoTensor

    mod = types.ModuleType("kit_only_in_this_process")
    exec("class Tag(str):\n    pass\n", mod.__dict__)
    mod.Tag.__module__ = mod.__name__
    sys.modules[mod.__name__] = mod  # importable here, not in a fresh process
    try:
        bad = bs.GoodPair(torch.randn(4, 6), torch.randn(4, 6), mod.Tag("pair"))
        good = TwoTensor(torch.randn(4, 6), torch.randn(4, 6))
        report = check_subclass([bad, good], backends=("eager",), only=["protocol.flatten", "ctx", "identity"])
    finally:
        del sys.modules[mod.__name__]
    rows = {(r.subject, r.name): r for r in report.rows}
    row = rows[("GoodPair", "identity.stable_hash")]
    assert row.status == "fail" and "could not unpickle" in row.message and "kit_only_in_this_process" in row.message, row.message
    assert rows[("TwoTensor", "identity.stable_hash")].status == "pass", rows[("TwoTensor", "identity.stable_hash")].message


def test_an_op_the_dense_tensor_refuses_too_is_not_judged():
    # det of a 2x3 matrix raises for the dense tensor as well: the class raising is right,
    # and the row says the sample judged nothing rather than failing the class.
    from subclass_kit.examples import TwoTensor

    aten = torch.ops.aten
    x = TwoTensor(torch.randn(2, 3), torch.randn(2, 3))
    report = check_subclass(x, backends=("eager",), ops=[aten._linalg_det.default, aten.neg.default], only=["eager"])
    row = report.row("eager[aten._linalg_det.default(x)]")
    assert row.status == "skip" and "dense tensor too" in row.message and "square" in row.message
    assert report.row("eager[aten.neg.default(x)]").status == "pass"
