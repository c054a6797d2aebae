"""Dim and SubclassPolicy as plain data: constructors, normalization, equality, stable form."""

import json

import pytest
import torch
from expecttest import assert_expected_inline

import symbolic
from symbolic import Dim, PolicyError, PolicyTypeError, SubclassPolicy


def test_dim_kinds_and_repr():
    assert Dim.dynamic() == Dim("dynamic")
    assert Dim.dynamic(min=2, max=64) != Dim.dynamic(min=2)
    assert [Dim.dynamic().is_dynamic, Dim.auto().is_dynamic, Dim.static().is_dynamic] == [True, True, False]
    assert_expected_inline(
        repr([Dim.dynamic(), Dim.dynamic(max=8), Dim.dynamic(min=2, max=8), Dim.static(), Dim.auto()]),
        """[Dim.dynamic(), Dim.dynamic(max=8), Dim.dynamic(min=2, max=8), Dim.static(), Dim.auto()]""",
    )
    assert len({Dim.dynamic(), Dim.dynamic(), Dim.auto()}) == 2


@pytest.mark.parametrize(
    "make, exc",
    [
        (lambda: Dim.dynamic(min=10, max=5), PolicyError),
        (lambda: Dim.dynamic(min=-1), PolicyError),
        (lambda: Dim.dynamic(max=2.5), PolicyTypeError),
        (lambda: Dim.dynamic(min=True), PolicyTypeError),
        (lambda: Dim("sometimes"), PolicyError),
        (lambda: Dim("static", 1, 2), PolicyError),
    ],
    ids=["min>max", "negative", "float", "bool", "kind", "static-range"],
)
def test_dim_rejects(make, exc):
    with pytest.raises(exc):
        make()


def test_dim_min_gt_max_message():
    with pytest.raises(ValueError) as e:
        Dim.dynamic(min=10, max=5)
    assert_expected_inline(str(e.value), """Dim.dynamic(min=10, max=5): min > max; no size satisfies it. Swap or fix the bounds.""")


def test_policy_normalizes_shorthands():
    p = SubclassPolicy(outer=0, inner={"qdata": [0, 1], "scale": {1: Dim.static()}})
    assert dict(p.outer) == {0: Dim.dynamic()}
    assert dict(p.inner["qdata"]) == {0: Dim.dynamic(), 1: Dim.dynamic()}
    assert dict(p.inner["scale"]) == {1: Dim.static()}
    nested = SubclassPolicy(inner={"a": p})
    assert nested.inner["a"] is p


def test_policy_equality_hash_and_canonical_form():
    a = SubclassPolicy(outer={0: Dim.dynamic(max=8)}, inner={"x": [0], "y": SubclassPolicy(outer=[1])})
    b = SubclassPolicy(inner={"y": SubclassPolicy(outer={1: Dim.dynamic()}), "x": {0: Dim.dynamic()}}, outer={0: Dim.dynamic(max=8)})
    assert a == b and hash(a) == hash(b)
    assert a != SubclassPolicy(outer={0: Dim.dynamic(max=9)})
    # Canonical form is JSON and independent of insertion order (for stable keys in guards/).
    assert json.dumps(a.canonical(), sort_keys=True) == json.dumps(b.canonical(), sort_keys=True)
    assert_expected_inline(
        json.dumps(a.canonical()),
        """{"outer": [[0, ["dynamic", null, 8]]], "inner": [["x", {"dims": [[0, ["dynamic", null, null]]]}], ["y", {"policy": {"outer": [[1, ["dynamic", null, null]]], "inner": []}}]]}""",
    )


def test_policy_is_immutable():
    p = SubclassPolicy(outer=[0])
    with pytest.raises(AttributeError):
        p.outer = {}
    with pytest.raises(TypeError):
        p.outer[1] = Dim.static()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"outer": "0"},
        {"outer": {0: "dynamic"}},
        {"outer": [0.5]},
        {"inner": [("scale", [0])]},
        {"inner": {0: [0]}},
    ],
    ids=["str-dims", "non-Dim-value", "float-dim", "inner-not-mapping", "inner-name-not-str"],
)
def test_policy_rejects_malformed(kwargs):
    with pytest.raises(PolicyTypeError):
        SubclassPolicy(**kwargs)


def test_dim_kinds_are_one_enum():
    """One vocabulary of dim kinds (issue 22 item 4): ``symbolic.DimKind``, read back from
    policies, torch's marks and descriptions alike; no module spells a kind as a string."""
    import ast
    import pathlib

    from symbolic import DimKind

    assert Dim.dynamic().kind is DimKind.DYNAMIC and Dim.static().kind is DimKind.STATIC
    assert Dim("auto").kind is DimKind.AUTO  # text is accepted and normalized
    with pytest.raises(PolicyError, match="one of"):
        Dim("duck")  # how ShapeEnv allocates, not a policy a user can ask for
    x = torch.ones(4, 3)
    symbolic.mark_dynamic(x, 0)
    assert symbolic.describe(x)[symbolic.ROOT].kind(0) is DimKind.DYNAMIC
    assert symbolic.marks(x).outer[0].kind is DimKind.DYNAMIC

    repo = pathlib.Path(symbolic.__file__).resolve().parents[1]
    spelled = []
    for pkg in ("symbolic", "guards"):
        for path in sorted((repo / pkg).rglob("*.py")):
            if path.name == "dims.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in {k.value for k in DimKind}:
                    spelled.append(f"{path.relative_to(repo)}:{node.lineno} {node.value!r}")
    assert not spelled, spelled
